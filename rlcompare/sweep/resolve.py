"""A sweep's members: each one's config composed with Hydra and validated (`resolve_members`), then diffed
against its reference for the one-change check (`check_one_change`); `prepare` does the three steps in order."""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any, Optional

from rlcompare.config.components import COMPONENTS, component_prefixes
from rlcompare.config.flat import flatten
from rlcompare.sweep.spec import (
    _MISSING,
    SweepError,
    SweepSpec,
    VariantSpec,
    _check_overrides,
    _covered,
    _fmt,
    _ignored,
    _is_hydra_override,
    _is_interpolation,
    _merge_overrides,
    _parse_overrides,
    load_sweep,
)


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

    def config_at(self, seed: int) -> dict:
        """This member's resolved config at `seed`. `config` is resolved at the sweep's first seed; a value that
        interpolates (c14's `teacher.path=results/c14_teachers/teacher_s10${seed}/export`: a teacher per seed) is
        resolved again with this seed, so a run is checked against the config it was launched with."""
        interpolated = [k for k, v in flatten(self.raw_config).items() if isinstance(v, str) and "${" in v]
        if not interpolated or seed == self.config.get("seed"):
            return self.config
        from omegaconf import OmegaConf

        raw = OmegaConf.create({**self.raw_config, "seed": seed})
        out = copy.deepcopy(self.config)
        for key in interpolated:
            *parents, leaf = key.split(".")
            node = out
            for p in parents:
                node = node.setdefault(p, {})
            node[leaf] = OmegaConf.select(raw, key)
        out["seed"] = seed
        return out


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

    from rlcompare.config import ConfigError, user_modules, validate
    from rlcompare.train.teacher_check import check_hub_revision

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
        try:  # a plug-in surrogate's knobs compose once its module is imported
            user_modules.import_modules_in_overrides(overrides)
        except ValueError as e:
            raise SweepError(f"{who} {v.label!r}: config error: {e}") from None
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
            if typed.teacher.path is not None:  # a hub teacher pinned, checked before any launch downloads it
                check_hub_revision(str(typed.teacher.path), typed.teacher.get("revision"))
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


def prepare(path, extra: list[str], seeds: Optional[list[int]] = None) -> tuple[SweepSpec, list[Member]]:
    spec = load_sweep(path)
    if seeds:
        spec.seeds = list(seeds)
    members = resolve_members(spec, extra)
    check_one_change(members)
    return spec, members
