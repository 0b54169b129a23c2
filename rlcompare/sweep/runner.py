"""`rlcompare sweep`: one-change-at-a-time ablation sweeps over seeds.

A sweep file (YAML, see sweeps/ and docs/components.md) names a base and its variants. Every member's
config is composed with Hydra's compose API and validated; each variant is diffed against its reference
(the base in ``mode: independent``, the previous rung in ``mode: ladder``) and the whole sweep is refused
before anything trains when a variant changes a key outside the component it declares, or changes nothing.
Then every member x seed is one job of a single Hydra multirun (``rlcompare train -m
hydra/sweeper=rlcompare_jobs ...``, in a subprocess; the jobs are listed in ``<results_dir>/<sweep name>/.jobs.yaml``),
so that the chosen launcher (``hydra/launcher=joblib``, ``submitit_slurm``, ``ray``, ...) runs as many at once as it
has workers, and a failing run never stops the others (`run_jobs`). Runs land in
``<results_dir>/<sweep name>/<label>__s<seed>/`` with ``sweep.{name,variant,reference,component}`` set
for the report. docs/scaling.md has the launchers and the device rule.

    rlcompare sweep sweeps/one_knob.yaml [overrides...] [--dry-run] [--seeds 0,1] [--resume]

Exit codes: 0 all runs completed (or a clean dry run), 1 some runs failed, 2 the sweep was refused, 130 interrupted
(Ctrl-C: the runs completed before it are recorded). The results folder is locked for the sweep's life.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import re
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

import yaml
from rlcompare.config import operational
from rlcompare.config.components import COMPONENTS, component_prefixes  # noqa: F401 - public here too
from rlcompare.config.flat import flatten

__all__ = [
    "COMPONENTS",
    "IGNORED_KEYS",
    "SweepError",
    "SweepSpec",
    "VariantSpec",
    "Member",
    "Job",
    "load_sweep",
    "resolve_members",
    "check_one_change",
    "component_prefixes",
    "run_jobs",
    "run_sweep",
    "main",
]

# ----------------------------------------------------------------------------- components
# one-word component -> the config key prefixes it covers: rlcompare.config.components (the report reads it too)

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


@dataclass
class Member:
    name: str  # the label: results/<sweep>/<name>__s<seed>/
    reference: Optional[str]  # label of the member it is compared with (None for the base)
    component: list[str]  # declared components ([] for the base)
    overrides: list[str]  # every override that makes this member (cumulative in a ladder), extras included
    config: dict  # resolved, validated config as a plain dict
    own_overrides: list[str] = field(default_factory=list)  # what the file lists for this member
    raw_config: dict = field(default_factory=dict)  # the same config unresolved (interpolations kept)
    diff: list[tuple[str, Any, Any]] = field(default_factory=list)  # (key, reference value, own value)
    kind: str = "variant"  # base | variant | rung

    @property
    def is_base(self) -> bool:
        return self.reference is None


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
        here = Path(__file__).resolve().parent.parent  # rlcompare/ (this file is rlcompare/sweep/runner.py)
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


# ----------------------------------------------------------------------------- resolving
def split_extra(extra: list[str]) -> tuple[list[str], list[str]]:
    """Command-line overrides -> (config overrides for every member, hydra.* settings for the launch only)."""
    extra = list(extra or [])
    _check_overrides(extra, "command-line overrides", allow_hydra=True)
    cfg, hyd = [], []
    for raw, o in zip(extra, _parse_overrides(extra, "command-line overrides")):
        (hyd if _is_hydra_override(o.key_or_group) else cfg).append(raw)
    return cfg, hyd


def _compose(overrides: list[str]):
    from hydra import compose, initialize_config_dir

    from rlcompare.train.app import conf_dir, register_resolvers

    register_resolvers()
    with initialize_config_dir(config_dir=conf_dir(), version_base=None):
        return compose(config_name="config", overrides=list(overrides))


def resolve_members(spec: SweepSpec, extra_overrides: Optional[list[str]] = None) -> list[Member]:
    """Compose and validate every member's config (base first). extra_overrides apply to all members and win."""
    from hydra.errors import HydraException
    from omegaconf import OmegaConf

    from rlcompare.config import ConfigError, validate

    extra_cfg, _ = split_extra(list(extra_overrides or []))
    plan: list[tuple[VariantSpec, Optional[str], list[str]]] = [(spec.base, None, list(spec.base.overrides))]
    acc = list(spec.base.overrides)
    prev = spec.base.label
    for v in spec.variants:
        if spec.mode == "ladder":
            acc = _merge_overrides(acc, v.overrides)
            plan.append((v, prev, list(acc)))
            prev = v.label
        else:
            plan.append((v, spec.base.label, _merge_overrides(spec.base.overrides, v.overrides)))

    members: list[Member] = []
    kind = "rung" if spec.mode == "ladder" else "variant"
    for v, ref, ovs in plan:
        who = "base" if ref is None else kind
        overrides = _merge_overrides(ovs, extra_cfg)
        tags = [f"seed={spec.seeds[0]}", f"experiment={spec.name}", f"run_name={v.label}__s{spec.seeds[0]}"]
        try:
            cfg = _compose(_merge_overrides(overrides, tags))
        except HydraException as e:
            msg = str(e).splitlines()[0] if str(e) else type(e).__name__
            raise SweepError(
                f"{who} {v.label!r}: Hydra could not compose its config ({msg}); "
                f"overrides: {' '.join(overrides) or '(none)'}"
            ) from None
        raw = OmegaConf.to_container(cfg, resolve=False)  # before validate(), which resolves in place
        if ref is None:
            _check_seeds(spec, raw)
        try:
            typed = validate(cfg)
        except ConfigError as e:
            raise SweepError(f"{who} {v.label!r}: config error: {e}") from None
        resolved = OmegaConf.to_container(typed, resolve=True)
        members.append(
            Member(
                name=v.label,
                reference=ref,
                component=list(v.component),
                overrides=overrides,
                config=resolved,
                own_overrides=list(v.overrides),
                raw_config=raw,
                kind=who,
            )
        )
    _check_component_paths(members)
    return members


def _check_seeds(spec: SweepSpec, raw: dict) -> None:
    """Every seed of the sweep through the train config's own check of `seed` (`validate`, which holds the rule),
    not only the first seed, which composed the members: a seed `rlcompare train` would refuse refuses the sweep."""
    from rlcompare.config import ConfigError, validate

    for s in spec.seeds:
        try:
            validate({**raw, "seed": s, "run_name": f"{spec.base.label}__s{s}"})
        except ConfigError as e:
            raise SweepError(f"seeds: seed {s} is refused ({e}); list seeds `rlcompare train` accepts") from None


def _check_component_paths(members: list[Member]) -> None:
    if not members:
        return
    keys = set(flatten(members[0].config))
    for m in members:
        keys |= set(flatten(m.config))
    for m in members:
        for c in m.component:
            if c in COMPONENTS:
                continue
            if not any(_covered(k, [c]) for k in keys):
                raise SweepError(
                    f"{m.name!r}: component {c!r} is neither a component ({', '.join(COMPONENTS)}) nor a config key"
                )


def _diff(ref: Member, m: Member) -> list[tuple[str, Any, Any]]:
    fa, fb = flatten(ref.config), flatten(m.config)
    ra, rb = flatten(ref.raw_config), flatten(m.raw_config)
    out = []
    for key in sorted(set(fa) | set(fb)):
        if _ignored(key):
            continue
        va, vb = fa.get(key, _MISSING), fb.get(key, _MISSING)
        if va == vb and type(va) is type(vb):
            continue
        if (
            va == vb
            and isinstance(va, (int, float))
            and isinstance(vb, (int, float))
            and not isinstance(va, bool)
            and not isinstance(vb, bool)
        ):
            continue  # 1 vs 1.0
        # the same interpolation on both sides (e.g. horizon: ${budget.max_new_tokens}) follows the key it
        # points to, whose own change is checked on its own
        if _is_interpolation(ra.get(key)) and ra.get(key) == rb.get(key):
            continue
        out.append((key, va, vb))
    return out


def check_one_change(members: list[Member]) -> None:
    """Raise SweepError when a variant changes a key outside its declared component, or changes nothing.

    Fills each member's ``diff`` (against its reference) on the way; reports every offending member at once.
    """
    by_name = {m.name: m for m in members}
    problems: list[str] = []
    for m in members:
        if m.reference is None:
            m.diff = []
            continue
        ref = by_name.get(m.reference)
        if ref is None:
            problems.append(f"{m.name!r}: reference {m.reference!r} is not a member of this sweep")
            continue
        m.diff = _diff(ref, m)
        kind = m.kind if m.kind in ("variant", "rung") else "variant"
        if not m.diff:
            problems.append(
                f"{kind} {m.name!r} changes nothing relative to {ref.name!r} (after all overrides, "
                f"command-line ones included; names, seeds, logger and placement settings never count)"
            )
            continue
        prefixes = component_prefixes(m.component)
        stray = [(k, a, b) for k, a, b in m.diff if not _covered(k, prefixes)]
        if stray:
            comp = m.component[0] if len(m.component) == 1 else "[" + ", ".join(m.component) + "]"
            keys = set(flatten(m.config))
            covers = ", ".join(p + ".*" if any(k.startswith(p + ".") for k in keys) else p for p in prefixes)
            lines = "\n".join(f"      {k}: {_fmt(a)} ({ref.name}) -> {_fmt(b)} ({m.name})" for k, a, b in stray)
            more = list(dict.fromkeys(_guess_component(k) for k, _, _ in stray))
            problems.append(
                f"{kind} {m.name!r} declares component {comp} (covers {covers}) "
                f"but also changes, relative to {ref.name!r}:\n{lines}\n"
                f"    move that change into the base (every member gets it), give it its own {kind}, "
                f"or declare every component it touches: component: [{', '.join(m.component + more)}]"
            )
    if problems:
        raise SweepError(
            "sweep refused before training anything (one change at a time):\n  - " + "\n  - ".join(problems)
        )


def _guess_component(key: str) -> str:
    """The narrowest component covering key (longest prefix, then fewest prefixes), else the key itself."""
    best = None
    for name, prefixes in COMPONENTS.items():
        for p in prefixes:
            rank = (len(p), -len(prefixes))
            if _covered(key, [p]) and (best is None or rank > best[1]):
                best = (name, rank)
    return best[0] if best else key


# ----------------------------------------------------------------------------- reporting helpers
def _comp_text(m: Member) -> str:
    return "-" if not m.component else ",".join(m.component)


def member_table(spec: SweepSpec, members: list[Member]) -> str:
    """label, component, reference, the member's own overrides (one a line) and the keys that differ."""
    header = ["label", "component", "reference", "overrides", "differs from reference"]
    rows = []
    for m in members:
        own = list(m.own_overrides) or ["(none)"]
        if spec.mode == "ladder" and m.reference not in (None, spec.base.label):
            own = ["+ " + o for o in own]
        diffs = [f"{k}: {_fmt(a)} -> {_fmt(b)}" for k, a, b in m.diff] or ["-"]
        rows.append(([m.name], [_comp_text(m)], [m.reference or "-"], own, diffs))
    widths = [max([len(header[i])] + [len(x) for r in rows for x in r[i]]) for i in range(4)]
    out = [
        "  ".join(h.ljust(widths[i]) for i, h in enumerate(header[:4])) + "  " + header[4],
        "  ".join("-" * w for w in widths) + "  " + "-" * len(header[4]),
    ]
    for r in rows:
        for j in range(max(len(c) for c in r)):
            cells = [c[j] if j < len(c) else "" for c in r]
            out.append(("  ".join(cells[i].ljust(widths[i]) for i in range(4)) + "  " + cells[4]).rstrip())
    return "\n".join(out)


def _results_root(members: list[Member], spec: SweepSpec) -> Path:
    return Path(str(members[0].config["results_dir"])) / spec.name


def run_dir(root: Path, label: str, seed: int) -> Path:
    return root / f"{label}__s{seed}"


def _summary(path: Path) -> Optional[dict]:
    try:
        return json.loads((path / "summary.json").read_text())
    except (OSError, ValueError):
        return None


def _has_metrics(path: Path) -> bool:
    f = path / "metrics.jsonl"
    try:
        return f.is_file() and f.stat().st_size > 0
    except OSError:
        return False


def _member_tags(spec: SweepSpec, m: Member, seed: str) -> list[str]:
    """The keys the sweep sets on each run of a member (seed: one seed, or a comma list for a multirun)."""
    comp = ",".join(component_prefixes(m.component)) if m.component else "null"
    if "," in comp:
        comp = _quote(comp)  # a quoted string, not a Hydra sweep over values
    return [
        f"seed={seed}",
        f"experiment={spec.name}",
        f"sweep.name={spec.name}",
        f"sweep.variant={m.name}",
        f"sweep.reference={m.reference or 'null'}",
        f"sweep.component={comp}",
        "run_name=" + m.name + "__s${seed}",
    ]


def train_command(
    spec: SweepSpec, m: Member, seeds: list[int], hydra_extra: list[str], resume: bool = False
) -> list[str]:
    """`python -m rlcompare.cli train -m ...` for one member over seeds (the sweep's tags last but hydra.*): what
    the sweep's jobs of that member are, as one multirun one can type."""
    tags = _member_tags(spec, m, ",".join(str(s) for s in seeds))
    if resume:
        tags.append("resume=true")
    return [sys.executable, "-m", "rlcompare.cli", "train", "-m", *m.overrides, *tags, *hydra_extra]


@dataclass
class Job:
    """One run of a sweep: a member at a seed (resume: its folder already holds a run to continue)."""

    member: Member
    seed: int
    resume: bool = False

    @property
    def key(self) -> tuple[str, int]:
        return (self.member.name, self.seed)

    def overrides(self, spec: SweepSpec) -> list[str]:
        return [*self.member.overrides, *_member_tags(spec, self.member, str(self.seed))] + (
            ["resume=true"] if self.resume else []
        )


JOBS_FILE = ".jobs.yaml"  # in <results_dir>/<sweep name>/: the job list of the latest launch


def launch_command(spec: SweepSpec, root: Path, jobs_file: Path, hydra_extra: list[str]) -> list[str]:
    """One Hydra multirun whose jobs are those listed in jobs_file (hydra_plugins.rlcompare_sweeper); results_dir
    and experiment on the command line place Hydra's own sweep files (multirun.yaml) in <results_dir>/<name>/."""
    return [
        sys.executable,
        "-m",
        "rlcompare.cli",
        "train",
        "-m",
        "hydra/sweeper=rlcompare_jobs",
        f"hydra.sweeper.jobs_file={_quote(str(jobs_file.resolve()))}",
        f"results_dir={_quote(str(root.parent))}",
        f"experiment={spec.name}",
        *hydra_extra,
    ]


def read_jobs_file(path: Optional[str]) -> list[list[str]]:
    """The job list of hydra/sweeper=rlcompare_jobs: `jobs: [[override, ...], ...]` (plain YAML, safe-loaded)."""
    from hydra.errors import HydraException

    if not path:
        raise HydraException(
            "hydra.sweeper.jobs_file is not set: hydra/sweeper=rlcompare_jobs launches the jobs "
            "listed in that file (`jobs: [[key=value, ...], ...]`, as `rlcompare sweep` writes it)"
        )
    try:
        data = yaml.safe_load(Path(path).read_text())
    except (OSError, yaml.YAMLError) as e:
        raise HydraException(f"hydra.sweeper.jobs_file={path}: cannot be read ({e})") from None
    jobs = data.get("jobs") if isinstance(data, dict) else None
    if (
        not isinstance(jobs, list)
        or not jobs
        or not all(isinstance(j, list) and all(isinstance(o, str) for o in j) for j in jobs)
    ):
        raise HydraException(
            f"hydra.sweeper.jobs_file={path}: expected `jobs:` holding a non-empty list of override "
            f"lists, e.g. jobs: [[algorithm=grpo, seed=0], [algorithm=dapo, seed=0]]"
        )
    return jobs


def job_batch(arguments: list[str], jobs: list[list[str]]) -> list[list[str]]:
    """Each job's overrides after the command line's (a job's own value of a key wins); the command line may not
    sweep over values here (the job list is the sweep)."""
    from hydra.errors import HydraException

    for raw, o in zip(arguments, _override_parser().parse_overrides(list(arguments))):
        if o.is_sweep_override():
            raise HydraException(
                f"`{raw}`: hydra/sweeper=rlcompare_jobs launches the jobs of hydra.sweeper.jobs_file; "
                f"list each value as its own job there instead of sweeping on the command line"
            )
    return [_merge_overrides(list(arguments), job) for job in jobs]


def _quote(s: str) -> str:
    return "'" + s.replace("\\", "\\\\").replace("'", "\\'") + "'"


def _shell(cmd: list[str]) -> str:
    """The command as one would type it in a POSIX shell."""
    import shlex

    def q(a: str) -> str:
        if re.fullmatch(r"[A-Za-z0-9_./=,:+@%-]+", a):
            return a
        if "'" not in a:
            return "'" + a + "'"
        if not re.search(r'[$"`\\!]', a):
            return '"' + a + '"'
        return shlex.quote(a)

    shown = ["rlcompare"] + cmd[3:] if cmd[1:3] == ["-m", "rlcompare.cli"] else cmd
    return " ".join(q(c) for c in shown)


def _literal_str(dumper, data):
    if "\n" in data:
        return dumper.represent_scalar("tag:yaml.org,2002:str", data, style="|")
    return dumper.represent_scalar("tag:yaml.org,2002:str", data)


class _Dumper(yaml.SafeDumper):
    pass


_Dumper.add_representer(str, _literal_str)


def write_record(
    root: Path,
    spec: SweepSpec,
    members: list[Member],
    extra: list[str],
    argv: list[str],
    runs: Optional[dict] = None,
    created: Optional[str] = None,
) -> Path:
    """<root>/sweep.yaml: the file as given, resolved member overrides and diffs, extra overrides, timestamps,
    and (at the end) each run's status."""
    rec = {
        "name": spec.name,
        "question": spec.question,
        "mode": spec.mode,
        "seeds": spec.seeds,
        "source": str(spec.path) if spec.path else None,
        "created": created or _now(),
        "command": "rlcompare sweep " + " ".join(argv),
        "extra_overrides": list(extra),
        "members": [
            {
                "label": m.name,
                "reference": m.reference,
                "component": m.component,
                "component_keys": component_prefixes(m.component) if m.component else [],
                "own_overrides": m.own_overrides,
                "overrides": m.overrides,
                "differs": [{"key": k, "reference": _plain(a), "value": _plain(b)} for k, a, b in m.diff],
            }
            for m in members
        ],
        "file": spec.text,
    }
    if runs is not None:
        rec["finished"] = _now()
        rec["runs"] = runs
    root.mkdir(parents=True, exist_ok=True)
    out = root / "sweep.yaml"
    tmp = root / ".sweep.yaml.tmp"
    tmp.write_text(yaml.dump(rec, Dumper=_Dumper, sort_keys=False, allow_unicode=True, width=120))
    os.replace(tmp, out)
    return out


def _now() -> str:
    return _dt.datetime.now().astimezone().isoformat(timespec="seconds")


def _plain(v: Any) -> Any:
    return "<absent>" if v is _MISSING else v


# ----------------------------------------------------------------------------- running
STOP_FILE = ".interrupted"  # in <results_dir>/<sweep name>/: the sweep was interrupted; start no further job
STOP_GRACE_S = 60.0  # after Ctrl-C, how long the launch's runs have to record their state before SIGTERM


@dataclass
class UnlessInterrupted:
    """The task function of a sweep's multirun (hydra_plugins.rlcompare_sweeper wraps it): a job a launcher's worker
    takes up after the sweep was interrupted (STOP_FILE exists) is not started. A joblib worker whose run had
    stopped on the Ctrl-C once went on to the next queued job. A plain class here (not in the plugin module, which
    Hydra imports under another name) so that launchers can pickle it by reference."""

    task: Any
    stop_file: str

    def __call__(self, cfg):
        if os.path.exists(self.stop_file):
            print("[rlcompare sweep] the sweep was interrupted: this queued job is not started", file=sys.stderr)
            return None
        return self.task(cfg)


def _launch(cmd: list[str], stop_file: Optional[Path] = None) -> int:
    """Run the launch in a process group of its own and wait; on Ctrl-C stop the whole group (`_stop_launch`)."""
    try:
        proc = subprocess.Popen(cmd, start_new_session=True)
    except OSError as e:
        print(f"rlcompare sweep: could not start {cmd[0]}: {e}", file=sys.stderr)
        return 127
    try:
        return proc.wait()
    except KeyboardInterrupt:
        if stop_file is not None:
            stop_file.touch()  # before the signal: a worker freed by it must not start a queued job
        _stop_launch(proc)
        raise


def _signal_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _group_alive(pgid: int) -> bool:
    """Does a live (not zombie) process remain in the process group? On Linux from /proc, since an orphaned worker
    may stay a zombie where nothing reaps it; elsewhere whether the group can be signalled."""
    if not os.path.isdir("/proc/self"):
        try:
            os.killpg(pgid, 0)
            return True
        except (ProcessLookupError, PermissionError):
            return False
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()  # after "pid (comm)": state, ppid, pgrp, ...
        except (OSError, IndexError):
            continue
        if len(fields) > 2 and int(fields[2]) == pgid and fields[0] not in (b"Z", b"X"):
            return True
    return False


def _wait_group(proc: subprocess.Popen, pgid: int, seconds: float) -> bool:
    """Wait until no process of the group is left (the launcher's own one reaped); False on timeout."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        proc.poll()
        if not _group_alive(pgid):
            return True
        time.sleep(0.2)
    return False


def _stop_launch(proc: subprocess.Popen) -> None:
    """Ctrl-C during a launch. The launch runs in its own process group, so that a Ctrl-C (or a SIGINT sent to the
    sweep alone) reaches every process of its launcher, workers included: subprocess.call used to SIGKILL the
    launcher's process alone, orphaning joblib's workers. The group gets SIGINT (runs record their state and stop);
    what is left after STOP_GRACE_S gets SIGTERM, then SIGKILL. A second Ctrl-C kills the group at once."""
    import signal

    pgid = proc.pid
    try:
        _signal_group(pgid, signal.SIGINT)
        if not _wait_group(proc, pgid, STOP_GRACE_S):
            _signal_group(pgid, signal.SIGTERM)
            _wait_group(proc, pgid, 10.0)
    except KeyboardInterrupt:
        pass
    finally:
        _signal_group(pgid, signal.SIGKILL)
        proc.wait()


def launch_jobs(spec: SweepSpec, root: Path, jobs: list[Job], hydra_extra: list[str]) -> int:
    """Every job in one Hydra multirun (its launcher runs as many at once as it has workers); the exit code."""
    jobs_file = root / JOBS_FILE
    (root / STOP_FILE).unlink(missing_ok=True)
    tmp = root / f".{JOBS_FILE}.tmp"
    tmp.write_text(yaml.safe_dump({"jobs": [j.overrides(spec) for j in jobs]}, sort_keys=False, width=1000))
    os.replace(tmp, jobs_file)
    cmd = launch_command(spec, root, jobs_file, hydra_extra)
    names = ", ".join(f"{j.member.name}__s{j.seed}" + (" (resume)" if j.resume else "") for j in jobs)
    print(f"[rlcompare sweep] launching {len(jobs)} job(s): {names}\n  {_shell(cmd)}", file=sys.stderr, flush=True)
    return _launch(cmd, root / STOP_FILE)


def _fresh_summary(d: Path, since: float) -> Optional[dict]:
    """summary.json written by this launch (an older one, e.g. of a run being resumed, does not count)."""
    try:
        if (d / "summary.json").stat().st_mtime < since - 1.0:
            return None
    except OSError:
        return None
    return _summary(d)


def _started(d: Path, since: float) -> bool:
    """Did this launch start the job? Hydra writes the job's .hydra/ before it calls rlcompare, which writes
    summary.json ("running") before anything heavy."""
    for f in (d / ".hydra" / "overrides.yaml", d / "summary.json"):
        try:
            if f.stat().st_mtime >= since - 1.0:
                return True
        except OSError:
            pass
    return False


def run_jobs(jobs: list[Job], root: Path, launch, results: Optional[dict] = None) -> dict[tuple[str, int], dict]:
    """Run jobs through `launch(jobs) -> exit code` until each is settled; returns {(label, seed): {status, error,
    dir}} (filled into `results` as jobs settle, so an interrupted sweep still records them).

    A job that raises is recorded as failed by its own summary and never stops the others (every launcher finishes
    the other jobs). A job whose process dies (an exit, a crash, a kill) can stop the launch: Hydra's basic launcher
    skips the jobs after it, joblib's stops every worker. After each launch: jobs with a summary of their own are
    settled; a job that started but left no final summary died: when it is the only one, it is the cause and
    failed; when several died at once (a parallel launcher stopped them together), each is relaunched alone, with
    resume=true, to tell the cause from the bystanders; jobs that never started are relaunched together. A launch
    that started no job at all failed as a whole (a bad launcher setting): its jobs are failed with its exit code.
    Every launch settles at least one job or moves one to a launch of its own, so this ends.
    """
    results = {} if results is None else results
    todo, alone = list(jobs), []
    while todo or alone:
        batch = [alone.pop(0)] if alone else todo
        t0 = time.time()
        try:
            rc = launch(batch)
        except KeyboardInterrupt:  # the runs that completed before the Ctrl-C are recorded (run_sweep re-raises)
            done: dict = {}
            _settle(batch, root, t0, done)
            results.update((k, r) for k, r in done.items() if r["status"] == "completed")
            raise
        died, waiting, progressed = _settle(batch, root, t0, results)
        if len(died) == 1:
            results[died[0].key] = _died(root, died[0], rc)
        elif died:
            alone += [Job(j.member, j.seed, resume=True) for j in died]
        if waiting and (rc == 0 or not (progressed or died)):
            why = (
                "the multirun ended (exit code 0) without this run's summary.json"
                if rc == 0
                else f"the launch failed before this job started (exit code {rc}); see the launcher's messages above"
            )
            for j in waiting:
                results[j.key] = {"status": "failed", "error": why, "dir": str(run_dir(root, *j.key))}
            waiting = []
        if rc != 0 and not (died or waiting) and all(results[j.key]["status"] == "completed" for j in batch):
            print(
                f"[rlcompare sweep] warning: `rlcompare train` exited with code {rc} although every run it launched "
                f"completed; their results are kept",
                file=sys.stderr,
            )
        if batch is todo:
            todo = waiting
        else:
            todo += waiting
    return results


def _settle(batch: list[Job], root: Path, t0: float, results: dict) -> tuple[list[Job], list[Job], bool]:
    """After one launch (started at t0): jobs with a summary of their own go into results; returns (jobs that
    started but left no final summary, jobs that never started, whether any job settled)."""
    died, waiting, progressed = [], [], False
    for j in batch:
        d = run_dir(root, *j.key)
        status = (_fresh_summary(d, t0) or {}).get("status")
        not_ours = _not_this_members_run(d, j, status) if status in ("completed", "failed") else None
        if not_ours:
            results[j.key] = {"status": "failed", "error": not_ours, "dir": str(d)}
            progressed = True
        elif status in ("completed", "failed"):
            results[j.key] = {
                "status": status,
                "error": (_summary(d) or {}).get("error") if status == "failed" else None,
                "dir": str(d),
            }
            progressed = True
        elif _started(d, t0):
            died.append(j)
        else:
            waiting.append(j)
    return died, waiting, progressed


def _not_this_members_run(d: Path, j: Job, status: str) -> Optional[str]:
    """Why the run in d is not this job's (another config or seed: another sweep or command wrote the folder), or
    None when its config.yaml is the member's at this seed (or it failed before writing one: its own error)."""
    cfg = _run_config(d)
    if cfg is None:
        if status == "failed":
            return None
        return f"{d} holds a summary but no readable config.yaml; the sweep cannot tell that it ran this member"
    seed = cfg.get("seed")
    changes = _config_changes(j.member.config, cfg)
    if seed != j.seed or changes:
        what = changes or f"seed: {_fmt(seed)} -> {j.seed}"
        return (
            f"{d} holds a run made with another config than this member's ({what}): another command wrote the "
            f"folder; not counted as this member's run"
        )
    return None


def _died(root: Path, j: Job, rc: int) -> dict:
    d = run_dir(root, *j.key)
    summ = _summary(d) or {}
    if summ.get("status") == "running":
        err = summ.get("error") or f"the training process died mid-run (exit code {rc})"
    else:
        err = f"`rlcompare train` exited with code {rc} before this run wrote a summary"
    return {"status": "failed", "error": err, "dir": str(d)}


def _existing(root: Path, members: list[Member], seeds: list[int]) -> dict[tuple[str, int], str]:
    """(label, seed) -> completed | failed | partial, for run folders that already hold a run."""
    out = {}
    for m in members:
        for s in seeds:
            d = run_dir(root, m.name, s)
            summ = _summary(d)
            if summ is None and not _has_metrics(d):
                continue
            st = (summ or {}).get("status")
            out[(m.name, s)] = st if st in ("completed", "failed") else "partial"
    return out


def _run_config(d: Path) -> Optional[dict]:
    """The config.yaml a run wrote (safe-loaded), or None when missing or unreadable."""
    try:
        cfg = yaml.safe_load((d / "config.yaml").read_text(encoding="utf-8"))
    except (OSError, ValueError, yaml.YAMLError):
        return None
    return cfg if isinstance(cfg, dict) else None


def _config_changes(member_config: dict, run_config: dict) -> str:
    """How a run's config differs from its member's, outside the keys a sweep never counts ("" when it does not):
    `key: run's value -> member's value`, the first four."""
    now, then = flatten(member_config), flatten(run_config)
    keys = [
        k for k in sorted(set(now) | set(then)) if not _ignored(k) and now.get(k, _MISSING) != then.get(k, _MISSING)
    ]
    shown = ", ".join(f"{k}: {_fmt(then.get(k, _MISSING))} -> {_fmt(now.get(k, _MISSING))}" for k in keys[:4])
    return shown + (", ..." if len(keys) > 4 else "")


def _check_kept_runs(root: Path, members: list[Member], existing: dict) -> None:
    """--resume keeps earlier runs: refuse when one was made with another config than its member's now."""
    by_name = {m.name: m for m in members}
    bad = []
    for (label, seed), _status in sorted(existing.items()):
        old = _run_config(run_dir(root, label, seed))
        if old is None:
            continue
        changes = _config_changes(by_name[label].config, old)
        if changes:
            bad.append(f"{label}__s{seed} ({changes})")
    if bad:
        raise SweepError(
            f"--resume: runs in {root} were made with another config than the sweep now gives them: "
            f"{'; '.join(bad)}. Keep the same file and overrides, or use another results_dir / sweep name"
        )


def _runs_record(
    root: Path, members: list[Member], seeds: list[int], settled: dict, existing: dict, interrupted: bool = False
) -> dict[str, dict]:
    """{label: {seed: result}} for sweep.yaml: this launch's results, and runs kept from an earlier one (an
    interrupted sweep records only the runs it settled)."""
    runs: dict[str, dict] = {}
    for m in members:
        for s in seeds:
            if (m.name, s) in settled:
                res = settled[(m.name, s)]
            elif existing.get((m.name, s)) == "completed":
                res = {
                    "status": "completed",
                    "error": None,
                    "dir": str(run_dir(root, m.name, s)),
                    "note": "kept from an earlier launch",
                }
            elif interrupted:
                continue
            else:  # run_jobs settles every job it is given
                raise AssertionError(f"{m.name}__s{s} was neither run nor kept")
            runs.setdefault(m.name, {})[str(s)] = res
    return runs


def check_launch_settings(hydra_extra: list[str]) -> str:
    """Compose the launch's Hydra settings (launcher and its options) before anything runs; returns the launcher's
    name. A launcher that is not installed or an unknown option refuses the sweep, naming the fix."""
    from hydra import compose, initialize_config_dir
    from hydra.errors import HydraException

    from rlcompare.train.app import conf_dir, register_resolvers

    for raw in hydra_extra:
        if raw.lstrip("+~").startswith(("hydra/sweeper", "hydra.sweeper")):
            raise SweepError(
                f"`{raw}`: a sweep launches its members x seeds through its own sweeper "
                f"(hydra/sweeper=rlcompare_jobs); choose the launcher instead, e.g. hydra/launcher=joblib"
            )
    register_resolvers()
    try:
        with initialize_config_dir(config_dir=conf_dir(), version_base=None):
            cfg = compose(
                config_name="config", overrides=["hydra/sweeper=rlcompare_jobs", *hydra_extra], return_hydra_config=True
            )
    except HydraException as e:
        msg = str(e).strip()
        if "hydra/sweeper/rlcompare_jobs" in msg:
            raise SweepError(
                "Hydra cannot find rlcompare's sweeper (hydra_plugins/rlcompare_sweeper, shipped with "
                "rlcompare). From Python, call hydra_plugins.rlcompare_sweeper.register() first, as "
                "`rlcompare sweep` does; if it cannot be imported, reinstall with `pip install -e .` from the "
                "repository"
            ) from None
        raise SweepError(
            f"the Hydra settings {' '.join(hydra_extra)} do not compose: {msg}\n"
            f"(launchers: hydra/launcher=joblib is in the base install; "
            f'pip install -e ".[launchers]" adds submitit_local and submitit_slurm; docs/scaling.md)'
        ) from None
    target = str(cfg.hydra.launcher.get("_target_", ""))
    return target.rsplit(".", 1)[-1] or "basic launcher"


def prepare(path, extra: list[str], seeds: Optional[list[int]] = None) -> tuple[SweepSpec, list[Member]]:
    spec = load_sweep(path)
    if seeds:
        spec.seeds = list(seeds)
    members = resolve_members(spec, extra)
    check_one_change(members)
    return spec, members


def run_sweep(
    path,
    extra: Optional[list[str]] = None,
    seeds: Optional[list[int]] = None,
    dry_run: bool = False,
    resume: bool = False,
    argv: Optional[list[str]] = None,
    out=None,
) -> int:
    """Resolve, check and (unless dry_run) run a sweep; returns the exit code. Raises SweepError when refused."""
    out = out or sys.stdout
    extra = list(extra or [])
    spec, members = prepare(path, extra, seeds)
    _, hydra_extra = split_extra(extra)
    root = _results_root(members, spec)
    n_runs = len(members) * len(spec.seeds)
    _print_plan(spec, members, extra, root, n_runs, out)
    launcher = check_launch_settings(hydra_extra)
    if dry_run:
        _print_dry_run(spec, members, hydra_extra, launcher, n_runs, out)
        return 0
    with _sweep_lock(root):
        return _run_locked(spec, members, extra, hydra_extra, root, n_runs, resume, argv, out)


def _sweep_lock(root: Path):
    """The sweep's results folder, locked for the sweep's life (rlcompare.train.run_lock's lock, dropped by the
    kernel however the sweep ends): a second sweep of the same name and results_dir would take the first one's
    runs as its own and mix their configs in one comparison."""
    from rlcompare.config import ConfigError
    from rlcompare.train import run_lock

    try:
        return run_lock.acquire(root)
    except run_lock.RunFolderBusy:
        pid = run_lock.holder(root)
        raise SweepError(
            f"{root} is in use by another sweep ({f'pid {pid}' if pid else 'a live process'}); wait for it to end, "
            f"or give this one another name (`name:` in the sweep file) or results_dir"
        ) from None
    except ConfigError as e:
        raise SweepError(str(e)) from None


def _run_locked(
    spec: SweepSpec,
    members: list[Member],
    extra: list[str],
    hydra_extra: list[str],
    root: Path,
    n_runs: int,
    resume: bool,
    argv: Optional[list[str]],
    out,
) -> int:
    """run_sweep's part under the lock on root: the runs kept, the launches, the record."""
    existing = _runs_to_keep(root, spec, members, resume)
    record_argv = list(argv if argv is not None else [str(spec.path)] + extra)
    created = _now()
    write_record(root, spec, members, extra, record_argv, created=created)
    print("", file=out)
    jobs = [
        Job(m, s, resume=(m.name, s) in existing)
        for m in members
        for s in spec.seeds
        if existing.get((m.name, s)) != "completed"
    ]
    settled: dict[tuple[str, int], dict] = {}
    try:
        run_jobs(jobs, root, lambda batch: launch_jobs(spec, root, batch, hydra_extra), results=settled)
    except KeyboardInterrupt:
        runs = _runs_record(root, members, spec.seeds, settled, existing, interrupted=True)
        print(
            "\nrlcompare sweep: interrupted; finished runs: "
            + (", ".join(f"{lb}__s{s}" for lb, s in settled) or "none")
            + ". Continue with --resume.",
            file=sys.stderr,
        )
        write_record(root, spec, members, extra, record_argv, runs=runs, created=created)
        return 130
    runs = _runs_record(root, members, spec.seeds, settled, existing)
    write_record(root, spec, members, extra, record_argv, runs=runs, created=created)
    return _print_outcome(spec, root, runs, n_runs, out)


def _print_plan(spec: SweepSpec, members: list[Member], extra: list[str], root: Path, n_runs: int, out) -> None:
    """The sweep's size, question, extra overrides, results folder and member table."""
    print(
        f"sweep {spec.name} ({spec.mode}, {len(members)} members x {len(spec.seeds)} seeds = {n_runs} runs; "
        f"seeds {', '.join(map(str, spec.seeds))})" + (f"\nquestion: {spec.question}" if spec.question else ""),
        file=out,
    )
    if extra:
        print(f"extra overrides (all members): {' '.join(extra)}", file=out)
    print(f"results: {root}/<label>__s<seed>/\n", file=out)
    print(member_table(spec, members), file=out)


def _print_dry_run(
    spec: SweepSpec, members: list[Member], hydra_extra: list[str], launcher: str, n_runs: int, out
) -> None:
    print(f"\nthe {n_runs} runs are the jobs of one Hydra multirun ({launcher}); member by member they are:", file=out)
    for m in members:
        print("  " + _shell(train_command(spec, m, spec.seeds, hydra_extra)), file=out)
    print("\none-change check passed; nothing was run (--dry-run)", file=out)


def _runs_to_keep(root: Path, spec: SweepSpec, members: list[Member], resume: bool) -> dict[tuple[str, int], str]:
    """Runs of this sweep already in root ((label, seed) -> status): refused without --resume, and with it checked
    to have been made with the config their member has now."""
    existing = _existing(root, members, spec.seeds)
    if existing and not resume:
        listing = ", ".join(f"{lb}__s{s} ({st})" for (lb, s), st in sorted(existing.items()))
        raise SweepError(
            f"{root} already holds runs of this sweep: {listing}. Continue it with "
            f"`rlcompare sweep {spec.path or spec.name} --resume ...` (completed runs are kept, the others "
            f"resumed), or choose another results_dir / sweep name"
        )
    if existing:
        _check_kept_runs(root, members, existing)
    return existing


def _print_outcome(spec: SweepSpec, root: Path, runs: dict[str, dict], n_runs: int, out) -> int:
    """How many runs completed, the failed ones with their errors, the report command; the exit code."""
    failed = [(lb, int(s), r["error"]) for lb, rs in runs.items() for s, r in rs.items() if r["status"] != "completed"]
    done = sum(1 for rs in runs.values() for r in rs.values() if r["status"] == "completed")
    print(f"\nsweep {spec.name}: {done} of {n_runs} runs completed; definition in {root / 'sweep.yaml'}", file=out)
    if failed:
        print(f"failed members ({len({f[0] for f in failed})}):", file=out)
        for lb, s, err in failed:
            print(f"  - {lb} (seed {s}): {err}", file=out)
    print(f"build the report with:\n  rlcompare report {root}", file=out)
    return 1 if failed else 0


# ----------------------------------------------------------------------------- CLI
def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="rlcompare sweep",
        description="Run a one-change-at-a-time ablation sweep (a base and its variants, over seeds). Every member's "
        "config is resolved and checked before anything trains: a variant that changes a key outside its "
        "declared component, or nothing at all, refuses the sweep (exit code 2). See docs/components.md.",
        epilog="overrides (key=value, Hydra syntax) apply to every member, e.g. budget=medium logger=none "
        "results_dir=/tmp/results; hydra.* / hydra/launcher=... settings go to the launcher.",
    )
    p.add_argument("sweep_file", help="a sweep YAML file (or the name of one in sweeps/)")
    p.add_argument("overrides", nargs="*", help="config overrides applied to every member")
    p.add_argument("--dry-run", action="store_true", help="resolve and check only; print the member table")
    p.add_argument("--seeds", default=None, metavar="0,1,2", help="seeds to run instead of the file's")
    p.add_argument(
        "--resume",
        action="store_true",
        help="continue a sweep whose results folder already holds runs: completed runs are kept, "
        "failed or interrupted ones resumed",
    )
    return p


def main(argv: Optional[list[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = _parser().parse_intermixed_args(argv)
    seeds = None
    if args.seeds is not None:
        try:
            seeds = [int(s) for s in args.seeds.split(",") if s.strip() != ""]
        except ValueError:
            print(
                f"rlcompare sweep: --seeds takes integers separated by commas, e.g. 0,1,2; got {args.seeds!r}",
                file=sys.stderr,
            )
            return 2
        if not seeds or len(set(seeds)) != len(seeds):
            print("rlcompare sweep: --seeds needs distinct integers, e.g. 0,1,2", file=sys.stderr)
            return 2
    try:
        return run_sweep(
            args.sweep_file, args.overrides, seeds=seeds, dry_run=args.dry_run, resume=args.resume, argv=argv
        )
    except SweepError as e:
        print(f"rlcompare sweep: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
