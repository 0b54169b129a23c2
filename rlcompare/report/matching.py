"""Which runs may be compared: the fields of two fingerprint.json files, and the keys of two config.yaml files, that
differ outside the components a sweep variant declares and outside the operational keys."""

from __future__ import annotations

import json
from dataclasses import asdict
from typing import Any, Optional

import yaml

from rlcompare.config import operational
from rlcompare.config.components import component_prefixes
from rlcompare.config.flat import flatten
from rlcompare.config.legacy import with_missing_defaults
from rlcompare.config.schema import flat_defaults
from rlcompare.config.sections.evaluation import EvalConfig
from .load import Run
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
    # the multi-turn environment (issue 51): fingerprint.json's `env`, present only when one is set
    "environment": ["env"],
}


def _flatten(d: Any) -> dict:
    """Dotted keys; list values JSON-encoded so they compare as one value."""
    return {k: _encode(v) for k, v in flatten(d).items()}


def _encode(v: Any) -> Any:
    return json.dumps(v, sort_keys=True) if isinstance(v, (list, dict)) else v


def _allowed_input(key: str, components: list[str]) -> bool:
    """fingerprint.json's `inputs.<config key>.<field>` (rlcompare.train.inputs: a teacher's or plug-in's identity)
    may differ when the component covers the config key naming it (`distillation` covers teacher.path); where an
    input lies (operational.INPUT_LOCATIONS) is never compared, its content is."""
    rest = key[len("inputs.") :]
    if rest.rpartition(".")[2] in operational.INPUT_LOCATIONS:
        return True
    return any(rest == p or rest.startswith(p + ".") for p in component_prefixes(list(components)))


def _allowed(key: str, components: list[str]) -> bool:
    if key.startswith("inputs."):
        return _allowed_input(key, components)
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


def per_seed_keys(r: Run) -> tuple[str, ...]:
    """Config keys the sweep that made `r` sets per seed for its member: an override in the `sweep.yaml` beside
    the run (the record `rlcompare sweep` writes, read as data) whose value interpolates the seed, c14's
    `teacher.path=results/c14_teachers/teacher_s10${seed}/export` (a teacher per seed, whose variance the interval
    over seeds then carries). Its runs differ there by design, seed to seed; () without such a record."""
    record = r.path.parent / "sweep.yaml"
    try:
        data = yaml.safe_load(record.read_text(encoding="utf-8")) if record.is_file() else None
    except (OSError, ValueError, yaml.YAMLError):
        return ()
    members = data.get("members") if isinstance(data, dict) else None
    label = (r.sweep or {}).get("variant") or r.variant
    for m in members if isinstance(members, list) else []:
        if isinstance(m, dict) and m.get("label") == label:
            overrides = [o for o in m.get("overrides") or [] if isinstance(o, str)]
            return tuple(o.split("=", 1)[0].lstrip("+~") for o in overrides if "=" in o and "${seed}" in o)
    return ()


def _operational(key: str) -> bool:
    """A fingerprint field that is an operational config key (rlcompare.config.operational): fingerprint.json files
    written before those were left out hold e.g. verifier.probe and sampling.kv_cache (= rollout.kv_cache)."""
    head, _, rest = key.partition(".")
    return operational.is_operational(f"rollout.{rest}" if head == "sampling" else key)


def fingerprint_diff(a: dict, b: dict, allowed: list[str] = (), ignore: tuple = ()) -> list[str]:
    """Fields that differ between two fingerprints, as 'key: a vs b', skipping allowed components."""

    def skip(key: str) -> bool:
        return key in ignore or _allowed(key, list(allowed)) or _operational(key)

    return _differing_keys(_flatten(_with_eval(a)), _flatten(_with_eval(b)), skip)


def _with_eval(fp: dict) -> dict:
    """A fingerprint.json written before the eval group existed (issue 50) evaluated greedily: its `eval` is the
    schema's default, so it still matches a greedy run written since."""
    if not isinstance(fp, dict) or "eval" in fp:
        return fp
    return {**fp, "eval": asdict(EvalConfig())}


def _differing_keys(fa: dict, fb: dict, skip) -> list[str]:
    """'key: a vs b' for the keys of two flat dicts whose values differ (both nan counts as equal), sorted, except
    those `skip` names. The differing keys first: a few of a config's hundreds, then which of them count."""
    out = []
    for key in sorted(k for k in fa.keys() | fb.keys() if fa.get(k, "<missing>") != fb.get(k, "<missing>")):
        va, vb = fa.get(key, "<missing>"), fb.get(key, "<missing>")
        if not skip(key) and not (_isnan(va) and _isnan(vb)):
            out.append(f"{key}: {_short(va)} vs {_short(vb)}")
    return out


# config.yaml keys that differ between compared runs by design: the seed (the replicate axis, checked on its own)
# and Hydra's own settings; the operational keys are skipped too (rlcompare.config.operational)
CONFIG_IGNORED = ("seed", "hydra")


def config_diff(a: Run, b: Run, components: list[str] = ()) -> list[str]:
    """Keys of two runs' config.yaml that differ, as 'key: a vs b', outside the declared components (words of
    rlcompare.config.components or config paths), the operational keys and CONFIG_IGNORED. fingerprint.json leaves
    out trainer.* and algorithm.*: this is the check that sees them. Empty when either run has no config.yaml."""
    if not a.config or not b.config:
        return []
    prefixes = component_prefixes(list(components)) + list(CONFIG_IGNORED)

    def skip(key: str) -> bool:
        return any(key == p or key.startswith(p + ".") for p in prefixes) or operational.is_operational(key)

    return _differing_keys(*with_missing_defaults(_flat_config(a), _flat_config(b), flat_defaults(), _encode), skip)


def _flat_config(r: Run) -> dict:
    """The run's config.yaml as dotted keys, flattened once per run (a report compares each run more than once)."""
    if r.flat_config is None:
        r.flat_config = _flatten(r.config)
    return r.flat_config


def provenance_flag(runs: list[Run]) -> Optional[str]:
    """An Attention line naming each provenance field (summary.json's `provenance`: code commit, libraries, device,
    threads, launcher) in which the given runs differ, with each value's run count; None when they agree. Runs
    that record none (written before it existed) are counted, not compared."""
    records = {r.name: flatten(r.summary["provenance"]) for r in runs if _provenance_of(r)}
    if not records:
        return None
    fields = []
    for key in sorted({k for rec in records.values() for k in rec}):
        counts: dict[str, int] = {}
        for rec in records.values():
            value = _short(rec.get(key, "<missing>"))
            counts[value] = counts.get(value, 0) + 1
        if len(counts) > 1:
            fields.append(f"{key}: " + " vs ".join(f"{v} ({n} run{'s' if n > 1 else ''})" for v, n in counts.items()))
    missing = len(runs) - len(records)
    if missing:
        fields.append(f"{missing} of {len(runs)} runs record no provenance")
    if not fields:
        return None
    return "**Runs computed in different setups** (provenance in summary.json; not part of the fingerprint): " + (
        "; ".join(fields)
    )


def _provenance_of(r: Run) -> bool:
    return isinstance(r.summary, dict) and isinstance(r.summary.get("provenance"), dict)
