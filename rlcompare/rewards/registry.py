"""The verifier registry: one declaration per verifier, shaped like a surrogate's (algos/surrogate_specs.py): its
name, its settings (a frozen dataclass whose fields are `knob(default, help)`, with a `check()`), the metrics it
reports, and how it is built. The builder, the config check and docs/config.md read it from here.

    @dataclass(frozen=True)
    class NearMissSettings:
        partial: float = knob(0.5, "reward for an answer one off")
        max_chars: int = DEFAULT_MAX_CHARS      # a run key (RUN_KEYS): no help of its own, passed to the constructor

        def check(self, where="verifier"):  # a ValueError naming f"{where}.<key>" and the fix
            ...

    @register_verifier("near_miss", settings=NearMissSettings, metrics=("off_by_one",))
    class NearMiss(Verifier): ...           # built as NearMiss(partial=..., max_chars=...)

A key left out or null in the config takes its field's default. The run keys of `RUN_KEYS` (`verifier.timeout_s`,
`isolation`, `workers`, ...) are accepted by every verifier and reach its constructor only when they are fields of
its settings. Any other key is refused naming `verifier.<key>` and the accepted ones, a value of another type than
its default's too; then the settings' `check(where)` runs (`where`: `verifier`, or `verifier.components[i]` inside
a weighted mix). `check_config(d)` imports nothing heavy: the config check runs it before torch loads.

`metrics`: the names the verifier may report per scoring (`Score.metrics`, a mapping name -> number), or a function
of its config dict returning them (weighted: one per component). Each becomes `verifier/<name>` in the metrics row,
averaged over the step's trained completions that report it (docs/metrics.md); a score reporting a name the
verifier did not declare stops the run naming it (`metric_table`), so a row's keys are known from the config.
`build(d, where)` replaces the default builder (the class called with its settings); `accepts(d)` names keys
accepted beyond the settings (weighted: its components').

A verifier outside this package registers when its module is imported: `verifier.module` names that module
(imported before the name is looked up), or the caller imports it first. Scoring workers import it by themselves
(`pool.pickle_with_modules`). Standard library only.
"""

from __future__ import annotations

import importlib
import inspect
import math
import re
import sys
from dataclasses import MISSING, dataclass, fields, is_dataclass
from typing import Any, Callable

from rlcompare.plugins import import_registering
from rlcompare.registry import claim
from rlcompare.rewards.pool import _MAX_DEFAULT_WORKERS, DEFAULT_BATCH_TIMEOUT_S, MIN_TIMEOUT_S
from rlcompare.specs_common import knob  # noqa: F401 - the verifiers' settings fields are declared with it

# Keys every verifier accepts: how a run scores (time, isolation, workers), not what (= the fields of
# rlcompare.config.schema.VerifierConfig, tests/rewards/test_registry.py).
RUN_KEYS = ("name", "module", "timeout_s", "batch_timeout_s", "max_chars", "isolation", "workers", "probe", "extra")
ISOLATIONS = ("auto", "process", "inline")
BUILTIN_MODULES = ("rlcompare.rewards.verifiers", "rlcompare.rewards.gym_verifier")  # they register the built-ins
# a metric's name: the row key is verifier/<name>; `errors` is the row's own (verifier/errors)
METRIC_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_./-]{0,63}")
RESERVED_METRICS = ("errors",)
_HOW = (
    "declare its settings as a frozen dataclass whose fields are knob(default, help) (rlcompare.specs_common), "
    "with a check(self, where) method, and pass settings=ThatClass (docs/api.md, 'Adding a verifier')"
)


@dataclass(frozen=True)
class NoSettings:
    """The settings of a verifier without knobs of its own."""

    def check(self, where: str = "verifier") -> None:
        pass


@dataclass(frozen=True)
class VerifierSpec:
    name: str
    settings: type  # frozen dataclass: its fields are the verifier's keys (knob(default, help)), check(where)
    build: Callable[[dict, str], Any]  # (the config dict, its key prefix) -> Verifier
    module: str  # where it was registered (the file too: a module loaded from a path re-registers)
    file: str | None
    metrics: tuple | Callable[[dict], tuple] = ()  # names it reports (verifier/<name>), or a function of its config
    accepts: Callable[[dict], set] | None = None  # keys accepted beyond settings (weighted: its components')

    def knobs(self) -> tuple:
        return tuple(f.name for f in fields(self.settings))

    def defaults(self) -> dict:
        return {f.name: f.default for f in fields(self.settings)}

    def settings_from(self, d: dict) -> Any:
        return settings_from(self.settings, d)

    def check(self, settings: Any, where: str) -> None:
        check = settings.check
        check(where) if len(inspect.signature(check).parameters) else check()

    def metric_names(self, d: dict) -> tuple:
        names = tuple(self.metrics(d) if callable(self.metrics) else self.metrics)
        _check_metric_names(self.name, names)
        return names


REGISTRY: dict[str, VerifierSpec] = {}


def register_verifier(
    name: str,
    *,
    settings: type | None = None,
    metrics: tuple | Callable[[dict], tuple] = (),
    build: Callable[[dict, str], Any] | None = None,
    accepts: Callable[[dict], set] | None = None,
    **former: Any,
):
    """Class decorator: register `cls` as `verifier.name=<name>` (see the module doc)."""
    if former or isinstance(settings, dict):
        what = ", ".join(f"{k}=" for k in former) or "settings={...} (a dict)"
        raise TypeError(f"register_verifier({name!r}): {what} is the former declaration; {_HOW}")
    own = settings or NoSettings
    _check_settings(name, own)
    if not callable(metrics):
        _check_metric_names(name, tuple(metrics))

    def decorate(cls):
        module = sys.modules.get(cls.__module__)
        file = getattr(module, "__file__", None)
        claim("verifier", name, cls.__module__)  # another module's name is refused, naming both
        cls.name = name
        made = build or _call_with_settings(cls, own)
        REGISTRY[name] = VerifierSpec(name, own, made, cls.__module__, file, metrics, accepts)
        return cls

    return decorate


def _check_settings(name: str, settings: Any) -> None:
    if not (isinstance(settings, type) and is_dataclass(settings)):
        raise TypeError(f"register_verifier({name!r}): settings={settings!r} is not a dataclass; {_HOW}")
    for f in fields(settings):
        if f.name in ("name", "module"):
            raise ValueError(f"verifier {name!r}: {f.name} names the verifier, not one of its settings")
        if f.default is MISSING or (f.name not in RUN_KEYS and not f.metadata.get("help")):
            raise ValueError(
                f"verifier {name!r}: declare setting {f.name} as knob(default, help) (docs/config.md shows both)"
            )
    if not callable(getattr(settings, "check", None)):
        raise ValueError(f"verifier {name!r}: {settings.__name__} needs a check(self, where) method")


def _check_metric_names(name: str, names: tuple) -> None:
    for m in names:
        if not isinstance(m, str) or not METRIC_NAME.fullmatch(m) or m in RESERVED_METRICS:
            raise ValueError(
                f"verifier {name!r}: metric {m!r} is not a usable name (letters, digits, _ . / -, at most 64; "
                f"not {', '.join(RESERVED_METRICS)}): it becomes the row key verifier/<name>"
            )
    if len(set(names)) != len(names):
        raise ValueError(f"verifier {name!r}: its metrics {names} name one twice")


def _call_with_settings(cls, settings: type):
    def build(d: dict, where: str):
        s = settings_from(settings, d)
        return cls(**{f.name: getattr(s, f.name) for f in fields(s)})

    return build


def settings_from(settings: type, d: dict) -> Any:
    """`settings` from a config dict: each field from d, its default where d lacks it or holds null."""
    return settings(**{f.name: d[f.name] for f in fields(settings) if d.get(f.name) is not None})


def metric_table(scores, names: tuple, verifier: str) -> list[list[float]]:
    """Each score's reported metrics in the order of `names` (nan where it reported none: an error, or a verifier
    that reports a name only sometimes). A name the verifier did not declare is refused: the row's keys are the
    declared ones (`register_verifier(..., metrics=...)`)."""
    index = {n: j for j, n in enumerate(names)}
    table = []
    for s in scores:
        row = [math.nan] * len(names)
        for k, v in (getattr(s, "metrics", None) or {}).items():
            if k not in index:
                raise ValueError(
                    f"verifier {verifier!r} reported metric {k!r}, which it does not declare "
                    f"(declared: {', '.join(names) or 'none'}); add it to @register_verifier(..., metrics=(...))"
                )
            row[index[k]] = float(v)
        table.append(row)
    return table


# ----------------------------------------------------------------------------- look-ups
def _load(module: str | None, where: str = "verifier") -> None:
    for m in BUILTIN_MODULES:
        importlib.import_module(m)
    if module:
        import_registering(f"{where}.module", module, "the verifier (@register_verifier)")


def names(module: str | None = None) -> tuple[str, ...]:
    """The accepted `verifier.name`s (the built-ins, and those `module` registers)."""
    _load(module)
    return tuple(REGISTRY)


def spec(name: Any, where: str = "verifier", module: str | None = None) -> VerifierSpec:
    _load(module, where)
    if name not in REGISTRY:
        raise ValueError(f"{where}.name={name!r} is not a known verifier; use one of: {', '.join(REGISTRY)}")
    return REGISTRY[name]


def builtin_settings() -> list[tuple[str, Any, str]]:
    """(key, default, 'verifier: help') for each built-in verifier's own settings (run keys aside), in
    registration order: docs/config.md's rows for them."""
    _load(None)
    out = []
    for s in REGISTRY.values():
        if s.module in BUILTIN_MODULES:
            out += [
                (f.name, f.default, f"{s.name}: {f.metadata['help']}")
                for f in fields(s.settings)
                if f.name not in RUN_KEYS
            ]
    return out


def metric_names(cfg: Any) -> tuple:
    """The names the configured verifier declares (its row keys are verifier/<name>)."""
    d = as_dict(cfg)
    return spec(d.get("name"), "verifier", d.get("module")).metric_names(d)


def accepted_keys(s: VerifierSpec, d: dict) -> set:
    return set(RUN_KEYS) | set(s.knobs()) | (s.accepts(d) if s.accepts else set())


def check_keys(s: VerifierSpec, d: dict, where: str = "verifier") -> None:
    """Refuse a key the verifier does not accept, and a value of another type than its default's."""
    ok = accepted_keys(s, d)
    for key in d:
        if key not in ok:
            raise ValueError(
                f"{where}.{key} is not a setting of verifier {s.name!r}; accepted keys: {', '.join(sorted(ok))}"
            )
    for key, default in s.defaults().items():
        value = d.get(key)
        if value is not None and default is not None and not _same_kind(value, default):
            raise ValueError(
                f"{where}.{key}={value!r} is not accepted; verifier {s.name!r} takes a {type(default).__name__} "
                f"(default {default!r})"
            )


def _same_kind(value: Any, default: Any) -> bool:
    if isinstance(default, bool) or isinstance(value, bool):
        return isinstance(value, bool) and isinstance(default, bool)
    if isinstance(default, float):
        return isinstance(value, (int, float))
    return isinstance(value, type(default))


def check_config(d: dict, where: str = "verifier") -> VerifierSpec:
    """The cheap check of a verifier config (no verifier built, nothing heavy imported): its name is registered,
    every key is one it accepts, each setting has its default's type; raises ValueError naming the key."""
    s = spec(d.get("name"), where, d.get("module"))
    check_keys(s, d, where)
    s.check(s.settings_from(d), where)
    return s


# ----------------------------------------------------------------------------- building
def build_one(d: dict, where: str = "verifier"):
    """One verifier from its config dict (a component of a weighted mix too: `where` is its key prefix)."""
    return check_config(d, where).build(d, where)


def build_verifier(cfg: Any):
    """Build from the `verifier` config group (DictConfig, dict or any object with attributes)."""
    d = as_dict(cfg)
    v = build_one(d)
    iso = opt(d, "isolation", "auto")
    if iso not in ISOLATIONS:
        raise ValueError(f"verifier.isolation={iso!r} is not accepted; use one of: {', '.join(ISOLATIONS)}")
    v.isolation = iso
    v.workers = workers_setting(d.get("workers"))
    v.batch_timeout_s = seconds_setting("verifier.batch_timeout_s", opt(d, "batch_timeout_s", DEFAULT_BATCH_TIMEOUT_S))
    v.declared_metrics = spec(d.get("name"), "verifier", d.get("module")).metric_names(d)  # its row keys
    return v


def as_dict(cfg: Any) -> dict:
    """A verifier config (DictConfig, dict, or an object with attributes) as a plain, picklable dict."""
    if cfg is None:
        return {}
    if isinstance(cfg, dict):
        return dict(cfg)
    try:
        from omegaconf import DictConfig, OmegaConf

        if isinstance(cfg, DictConfig):
            return OmegaConf.to_container(cfg, resolve=True)
    except ImportError:  # pragma: no cover
        pass
    return {k: v for k, v in vars(cfg).items() if not k.startswith("_")}


def opt(d: dict, key: str, default: Any) -> Any:
    v = d.get(key)
    return default if v is None else v


def workers_setting(workers: Any) -> int | None:
    if workers is None:
        return None
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise ValueError(
            f"verifier.workers={workers!r} is not accepted; use an integer >= 1, or null for "
            f"min({_MAX_DEFAULT_WORKERS}, usable CPU cores)"
        )
    return workers


def seconds_setting(key: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise ValueError(
            f"{key}={value!r} is not accepted; use a finite number of seconds > 0 "
            f"(values under {MIN_TIMEOUT_S} count as {MIN_TIMEOUT_S})"
        )
    return float(value)
