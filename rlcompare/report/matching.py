"""Which runs may be compared: the fields of two fingerprint.json files that differ outside the components a
sweep variant declares and outside the operational keys."""

from __future__ import annotations

import json
from typing import Any

from rlcompare.config import operational
from rlcompare.config.flat import flatten
from .text import _isnan, _short


# config paths whose change shows up under another name in fingerprint.json
_COMPONENT_ALIASES = {
    "trainer.group_size": ["sampling.group_size"],
    "trainer.prompts_per_step": ["sampling.prompts_per_step"],
    "rollout": ["sampling"],
    "rollout.temperature": ["sampling.temperature"],
    "rollout.top_p": ["sampling.top_p"],
    "model": ["model", "init_weights_hash", "warm_start_key"],
    # the tiny model's warm start is trained on the prompts: its weights follow the prompt settings
    "prompts": ["prompts", "init_weights_hash", "warm_start_key"],
    # fingerprint.sampling.dynamic_sampling comes from the algorithm preset
    "algorithm": ["sampling.dynamic_sampling"],
}


def _flatten(d: Any) -> dict:
    """Dotted keys; list values JSON-encoded so they compare as one value."""
    return {k: json.dumps(v, sort_keys=True) if isinstance(v, (list, dict)) else v for k, v in flatten(d).items()}


def _allowed(key: str, components: list[str]) -> bool:
    for comp in components:
        head = comp.split(".")[0]
        targets = [comp] + _COMPONENT_ALIASES.get(comp, [])
        if comp != head:
            targets += _COMPONENT_ALIASES.get(head, []) if head in ("model", "prompts") else []
        if comp.startswith("rollout."):
            targets.append("sampling." + comp[len("rollout.") :])
        if comp in ("algorithm", "algorithm.dynamic_sampling"):
            targets.append("sampling.dynamic_sampling")
        for t in targets:
            if key == t or key.startswith(t + "."):
                return True
        if "." not in comp and key.split(".")[-1] == comp:
            return True
    return False


def _operational(key: str) -> bool:
    """A fingerprint field that is an operational config key (rlcompare.config.operational): fingerprint.json files
    written before those were left out hold e.g. verifier.probe and sampling.kv_cache (= rollout.kv_cache)."""
    head, _, rest = key.partition(".")
    return operational.is_operational(f"rollout.{rest}" if head == "sampling" else key)


def fingerprint_diff(a: dict, b: dict, allowed: list[str] = (), ignore: tuple = ()) -> list[str]:
    """Fields that differ between two fingerprints, as 'key: a vs b', skipping allowed components."""
    fa, fb = _flatten(a), _flatten(b)
    out = []
    for key in sorted(set(fa) | set(fb)):
        if key in ignore or _allowed(key, list(allowed)) or _operational(key):
            continue
        va, vb = fa.get(key, "<missing>"), fb.get(key, "<missing>")
        if va != vb and not (_isnan(va) and _isnan(vb)):
            out.append(f"{key}: {_short(va)} vs {_short(vb)}")
    return out
