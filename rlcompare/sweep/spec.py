"""A sweep file read and checked: its shape, labels, components, seeds and claim (`load_sweep` -> `SweepSpec`).

Also the rules every later step shares: the override syntax a member may use (`_check_overrides`,
`_merge_overrides`), the keys that never count as a change (`IGNORED_KEYS`) and how values are shown. Configs are
composed in `resolve.py`; nothing here imports Hydra at module level.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

import yaml
from rlcompare.config import operational

# one-word component -> the config key prefixes it covers: rlcompare.config.components (the report reads it too)
from rlcompare.config.components import COMPONENTS

# keys that never count as a change: the operational keys (names, places, display, speed; rlcompare.config.operational,
# each with its reason) and the seed (the replicate axis)
IGNORED_KEYS: tuple[str, ...] = operational.SWEEP_IGNORED

# set by the sweep for every member; a sweep file (or the command line) may not set them
_RESERVED = {
    "seed": "seeds come from the file's `seeds:` (or --seeds)",
    "experiment": "runs land in <results_dir>/<sweep name>/; set `name:` in the sweep file",
    "run_name": "run names are <label>__s<seed>",
    "resume": "use `rlcompare sweep --resume` to continue an interrupted sweep",
    "sweep": "sweep.* tags are set by `rlcompare sweep`",
}
# apply to the whole sweep: a member setting one would land its runs outside the sweep's folder (results_dir) or
# split the sweep's W&B comparison; the command line of `rlcompare sweep` sets them for every member
_SWEEP_WIDE = ("results_dir", "logger.project", "logger.entity", "logger.group")

_HYDRA_DIRS = {"hydra.sweep.dir", "hydra.sweep.subdir", "hydra.run.dir", "hydra.job.chdir"}
MODES = ("independent", "ladder")
# \Z, not $: `$` also matches before a final newline, which let "base\n" through as a label
_LABEL = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*\Z")
_TOP_KEYS = {"name", "question", "mode", "seeds", "base", "variants", "rungs", "description", "notes", "claim"}
# sweeps/claims/*.yaml: the published claim a sweep tests (docs/claims.md), written before it is run
_CLAIM_KEYS = ("paper", "statement", "metric", "knob")
_MEMBER_KEYS = {"label", "component", "overrides", "note", "description"}


class SweepError(Exception):
    """A sweep that cannot run as written; the message names the member and the fix (exit code 2)."""


@dataclass
class VariantSpec:
    label: str
    component: list[str]  # declared components (words from COMPONENTS, or config paths); [] for the base
    overrides: list[str]
    note: str = ""


@dataclass
class SweepSpec:
    name: str
    question: str
    mode: str
    seeds: list[int]
    base: VariantSpec
    variants: list[VariantSpec]
    path: Optional[Path] = None
    text: str = ""  # the file as given


# ----------------------------------------------------------------------------- helpers
def _covered(key: str, prefixes: list[str]) -> bool:
    return any(key == p or key.startswith(p + ".") for p in prefixes)


def _ignored(key: str) -> bool:
    return _covered(key, list(IGNORED_KEYS))


def _fmt(v: Any) -> str:
    if v is _MISSING:
        return "<absent>"
    if isinstance(v, str):
        return repr(v) if (v == "" or v.strip() != v or v.lower() in ("null", "none", "true", "false")) else v
    if v is None:
        return "null"
    return json.dumps(v) if isinstance(v, (list, dict, bool)) else str(v)


_MISSING = object()


def _is_interpolation(v: Any) -> bool:
    return isinstance(v, str) and "${" in v


def _override_parser():
    from hydra.core.override_parser.overrides_parser import OverridesParser

    return OverridesParser.create()


def _parse_overrides(overrides: list[str], where: str) -> list:
    from hydra.errors import HydraException

    try:
        return _override_parser().parse_overrides(list(overrides))
    except HydraException as e:
        raise SweepError(f"{where}: cannot parse the overrides {overrides}: {e}") from None


def _override_key(o) -> str:
    return o.get_key_element().lstrip("+~")


def _is_hydra_override(key: str) -> bool:
    return key == "hydra" or key.startswith("hydra.") or key.startswith("hydra/")


def _check_overrides(overrides: list[str], where: str, allow_hydra: bool = False) -> None:
    """allow_hydra: the command line's overrides (hydra.* and the sweep-wide keys go there), else a member's."""
    for raw, o in zip(overrides, _parse_overrides(overrides, where)):
        key = o.key_or_group
        head = key.split(".")[0].split("/")[0]
        if not allow_hydra and any(_covered(key, [k]) for k in _SWEEP_WIDE):
            raise SweepError(
                f"{where}: `{raw}` applies to the whole sweep (every run lands in <results_dir>/<sweep name>/ and "
                f"is mirrored to one W&B project); pass it on the command line of `rlcompare sweep` instead"
            )
        if o.is_sweep_override():
            raise SweepError(
                f"{where}: `{raw}` is a sweep over several values; give each value its own variant "
                f"(one member = one config, run over the seeds)"
            )
        if head in _RESERVED:
            raise SweepError(f"{where}: `{raw}` sets a key the sweep sets itself: {_RESERVED[head]}")
        if key in _HYDRA_DIRS:
            raise SweepError(
                f"{where}: `{raw}`: the sweep places runs in <results_dir>/<sweep name>/<label>__s<seed>/; "
                f"set results_dir=... instead"
            )
        if _is_hydra_override(key) and not allow_hydra:
            raise SweepError(
                f"{where}: `{raw}`: Hydra settings (launcher, sweeper, ...) apply to the whole sweep; "
                f"pass them on the command line of `rlcompare sweep`"
            )


def _merge_overrides(*lists: list[str]) -> list[str]:
    """Concatenate override lists; a later override of the same key replaces an earlier one (Hydra refuses
    a config group given twice, and a ladder rung may revisit a key)."""
    merged: dict[str, str] = {}
    for lst in lists:
        if not lst:
            continue
        for raw, o in zip(lst, _parse_overrides(list(lst), "overrides")):
            key = _override_key(o)
            merged.pop(key, None)
            merged[key] = raw
    return list(merged.values())


# ----------------------------------------------------------------------------- loading
def find_sweep_file(path: str | os.PathLike) -> Path:
    """A path, or a bare name looked up as sweeps/<name>.yaml (here, then next to the package)."""
    p = Path(path)
    if p.is_file():
        return p
    if p.suffix not in (".yaml", ".yml") and p.parent == Path("."):
        here = Path(__file__).resolve().parent.parent  # rlcompare/ (this file is rlcompare/sweep/spec.py)
        for cand in (Path("sweeps") / f"{p.name}.yaml", here.parent / "sweeps" / f"{p.name}.yaml"):
            if cand.is_file():
                return cand
    if p.exists():
        raise SweepError(f"{p} is not a file")
    raise SweepError(f"no sweep file at {p}" + ("" if p.suffix else " (nor sweeps/<name>.yaml)"))


def _as_list_of_str(value: Any, where: str) -> list[str]:
    if value is None:
        return []
    if isinstance(value, str):
        raise SweepError(
            f"{where}: overrides must be a YAML list, e.g. [algorithm.clip.eps_high=0.28, ...], "
            f"not the string {value!r}"
        )
    if not isinstance(value, list) or not all(isinstance(x, (str, int, float, bool)) for x in value):
        raise SweepError(f"{where}: overrides must be a list of key=value strings; got {value!r}")
    out = []
    for x in value:
        if not isinstance(x, str) or ("=" not in x and not x.startswith("~")):
            raise SweepError(f"{where}: override {x!r} is not key=value (quote it in YAML if it holds ':' or '#')")
        out.append(x)
    return out


def _components_of(value: Any, where: str) -> list[str]:
    if value is None or value == "" or value == []:
        raise SweepError(
            f"{where}: needs `component:` (one of: {', '.join(COMPONENTS)}; or a config path such as "
            f"trainer.prompts_per_step); see docs/components.md"
        )
    if isinstance(value, str):
        if re.search(r"[,\s]", value.strip()):
            raise SweepError(
                f"{where}: component {value!r} names several components; a variant changes one, unless "
                f"the file says so explicitly as a list: component: [a, b]"
            )
        comps = [value.strip()]
    elif isinstance(value, list) and value and all(isinstance(c, str) and c.strip() for c in value):
        comps = [c.strip() for c in value]
        if len(set(comps)) != len(comps):
            raise SweepError(f"{where}: component list {comps} repeats a component")
    else:
        raise SweepError(f"{where}: component must be a word or a list of words; got {value!r}")
    for c in comps:
        if c not in COMPONENTS and not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)+", c):
            raise SweepError(
                f"{where}: unknown component {c!r}; use one of: {', '.join(COMPONENTS)}, "
                f"or a dotted config path (e.g. trainer.prompts_per_step); see docs/components.md"
            )
    return comps


def _member_spec(d: Any, where: str, base: bool) -> VariantSpec:
    if not isinstance(d, dict):
        raise SweepError(f"{where}: expected a mapping with label/overrides" + ("" if base else "/component"))
    unknown = set(d) - _MEMBER_KEYS
    if unknown:
        raise SweepError(
            f"{where}: unknown key(s) {', '.join(sorted(map(str, unknown)))}; accepted: "
            f"{', '.join(sorted(_MEMBER_KEYS))}"
        )
    label = d.get("label", "base" if base else None)
    if not isinstance(label, str) or not _LABEL.match(label):
        raise SweepError(
            f"{where}: label {label!r} must be a word of letters, digits and . _ + - "
            f"(it names the run folders <label>__s<seed>)"
        )
    if "__" in label:
        raise SweepError(f"{where}: label {label!r} may not contain '__' (run folders are <label>__s<seed>)")
    where = f"{where} ({label})"
    if base:
        if d.get("component") not in (None, "", []):
            raise SweepError(f"{where}: the base has no component; components belong to variants")
        comps: list[str] = []
    else:
        comps = _components_of(d.get("component"), where)
    overrides = _as_list_of_str(d.get("overrides"), where)
    _check_overrides(overrides, where)
    return VariantSpec(
        label=label, component=comps, overrides=overrides, note=str(d.get("note") or d.get("description") or "")
    )


def parse_sweep(data: Any, text: str = "", path: Optional[Path] = None) -> SweepSpec:
    src = str(path) if path else "sweep"
    if not isinstance(data, dict):
        raise SweepError(f"{src}: a sweep file is a YAML mapping with name, mode, seeds, base and variants")
    unknown = set(data) - _TOP_KEYS
    if unknown:
        raise SweepError(
            f"{src}: unknown key(s) {', '.join(sorted(map(str, unknown)))}; accepted: {', '.join(sorted(_TOP_KEYS))}"
        )
    name = data.get("name") or (path.stem if path else None)
    if not isinstance(name, str) or not _LABEL.match(name):
        raise SweepError(f"{src}: name {name!r} must be a word of letters, digits and . _ - (results/<name>/)")
    mode = data.get("mode", "independent")
    if mode not in MODES:
        raise SweepError(
            f"{src}: mode {mode!r} is not accepted; use independent (each variant vs the base) or "
            f"ladder (each rung vs the previous rung, cumulative)"
        )
    seeds = data.get("seeds", [0])
    if isinstance(seeds, int) and not isinstance(seeds, bool):
        seeds = [seeds]
    if (
        not isinstance(seeds, list)
        or not seeds
        or not all(isinstance(s, int) and not isinstance(s, bool) for s in seeds)
        or len(set(seeds)) != len(seeds)
    ):
        raise SweepError(f"{src}: seeds must be a non-empty list of distinct integers, e.g. [0, 1, 2]; got {seeds!r}")
    if "base" not in data:
        raise SweepError(f"{src}: needs `base:` (label and overrides of the reference configuration)")
    base = _member_spec(data["base"], f"{src}: base", base=True)
    key = "variants" if "variants" in data else "rungs"
    if "variants" in data and "rungs" in data:
        raise SweepError(f"{src}: give `variants:` or `rungs:`, not both")
    vs = data.get(key)
    if not isinstance(vs, list) or not vs:
        raise SweepError(f"{src}: needs a non-empty list `variants:` (each with label, component, overrides)")
    kind = "rung" if mode == "ladder" else "variant"
    variants = [_member_spec(v, f"{src}: {kind} {i + 1}", base=False) for i, v in enumerate(vs)]
    labels = [base.label] + [v.label for v in variants]
    dup = sorted({lb for lb in labels if labels.count(lb) > 1})
    if dup:
        raise SweepError(f"{src}: labels must be unique; repeated: {', '.join(dup)}")
    question = data.get("question") or ""
    if not isinstance(question, str):
        raise SweepError(f"{src}: question must be a string")
    _check_claim(data.get("claim"), src, [v.label for v in variants])
    return SweepSpec(
        name=name,
        question=question.strip(),
        mode=mode,
        seeds=list(seeds),
        base=base,
        variants=variants,
        path=path,
        text=text,
    )


CLAIM_DIRECTIONS = ("higher", "lower", "same", "report")  # what the claim predicts for variant minus base


def _check_claim(claim: Any, src: str, labels: list[str]) -> None:
    """`claim:` (optional) names the paper, states the claim in one sentence, the metric and the knob; its
    `expect:` list says, per variant and metric, which way the claim predicts the difference from the base."""
    if claim is None:
        return
    missing = [
        k
        for k in _CLAIM_KEYS
        if not isinstance(claim, dict) or not isinstance(claim.get(k), str) or not claim[k].strip()
    ]
    if missing:
        raise SweepError(
            f"{src}: claim: needs the strings {', '.join(_CLAIM_KEYS)} (missing or empty: "
            f"{', '.join(missing)}); see sweeps/claims/"
        )
    for i, e in enumerate(claim.get("expect") or []):
        ok = (
            isinstance(e, dict)
            and e.get("variant") in labels
            and isinstance(e.get("metric"), str)
            and e.get("direction") in CLAIM_DIRECTIONS
        )
        if not ok:
            raise SweepError(
                f"{src}: claim.expect[{i}]={e!r}: needs variant (one of: {', '.join(labels)}), metric "
                f"(a metrics.jsonl or eval.jsonl column) and direction (one of: {', '.join(CLAIM_DIRECTIONS)})"
            )


def load_sweep(path: str | os.PathLike) -> SweepSpec:
    """Read and check a sweep file's shape (configs are resolved by resolve_members)."""
    p = find_sweep_file(path)
    try:
        text = p.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise SweepError(f"{p}: not UTF-8 text (byte {e.start}); save the sweep file as UTF-8") from None
    except OSError as e:
        raise SweepError(f"{p}: cannot be read ({e.strerror})") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise SweepError(f"{p}: not valid YAML: {e}") from None
    return parse_sweep(data, text=text, path=p)
