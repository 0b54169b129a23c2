"""The verifier registry: `@register_verifier(name, settings={...})` declares a verifier once, and the builder, the
config check and the docs read it from here.

    @register_verifier("near_miss", settings={"partial": 0.5, "max_chars": DEFAULT_MAX_CHARS})
    class NearMiss(Verifier): ...           # built as NearMiss(partial=..., max_chars=...)

A registration declares the name, the settings the verifier accepts (key -> default; a key left out or null in
the config takes its default), and how it is built from its config dict (`build(d, where)`; default: the class
called with its settings). The run keys of `RUN_KEYS` (`verifier.timeout_s`, `isolation`, `workers`, ...) are
accepted by every verifier and reach its constructor only when it lists them among its settings. Any other key is
refused naming `verifier.<key>` and the accepted ones. `check_config(d)` (names, keys, the types the defaults
imply) imports nothing heavy: the config check runs it before torch loads. Values are checked where the verifier
is built (its constructor; preflight builds it before the model loads).

A verifier outside this package registers when its module is imported: `verifier.module` names that module
(imported before the name is looked up), or the caller imports it first. Scoring workers import it by themselves
(`pool.pickle_with_modules`). Standard library only.
"""

from __future__ import annotations

import importlib
import math
import sys
from dataclasses import dataclass
from typing import Any, Callable

from rlcompare.plugins import import_registering
from rlcompare.registry import claim
from rlcompare.rewards.pool import _MAX_DEFAULT_WORKERS, DEFAULT_BATCH_TIMEOUT_S, MIN_TIMEOUT_S

# Keys every verifier accepts: how a run scores (time, isolation, workers), not what (= the fields of
# rlcompare.config.schema.VerifierConfig, tests/rewards/test_registry.py).
RUN_KEYS = ("name", "module", "timeout_s", "batch_timeout_s", "max_chars", "isolation", "workers", "probe", "extra")
ISOLATIONS = ("auto", "process", "inline")
BUILTIN_MODULES = ("rlcompare.rewards.verifiers", "rlcompare.rewards.gym_verifier")  # they register the built-ins


@dataclass(frozen=True)
class VerifierSpec:
    name: str
    settings: dict  # key -> default (None: any value, the constructor checks it)
    build: Callable[[dict, str], Any]  # (the config dict, its key prefix) -> Verifier
    module: str  # where it was registered (the file too: a module loaded from a path re-registers)
    file: str | None
    check: Callable[[dict, str], None] | None = None  # extra cheap checks (weighted: its components)
    accepts: Callable[[dict], set] | None = None  # keys accepted beyond settings (weighted: its components')
    help: dict | None = None  # key -> one line (docs/config.md lists the built-ins' settings with it)


REGISTRY: dict[str, VerifierSpec] = {}


def register_verifier(
    name: str,
    *,
    settings: dict | None = None,
    build: Callable[[dict, str], Any] | None = None,
    check: Callable[[dict, str], None] | None = None,
    accepts: Callable[[dict], set] | None = None,
    help: dict | None = None,
):
    """Class decorator: register `cls` as `verifier.name=<name>` (see the module doc)."""
    own = dict(settings or {})
    clash = sorted(set(own) & {"name", "module"})
    if clash:
        raise ValueError(f"verifier {name!r}: {', '.join(clash)} name the verifier, not one of its settings")

    def decorate(cls):
        module = sys.modules.get(cls.__module__)
        file = getattr(module, "__file__", None)
        claim("verifier", name, cls.__module__)  # another module's name is refused, naming both
        cls.name = name
        REGISTRY[name] = VerifierSpec(
            name, own, build or _call_with_settings(cls, own), cls.__module__, file, check, accepts, dict(help or {})
        )
        return cls

    return decorate


def _call_with_settings(cls, settings: dict):
    def build(d: dict, where: str):
        return cls(**settings_of(settings, d))

    return build


def settings_of(settings: dict, d: dict) -> dict:
    """The constructor's keyword arguments: each setting from d, its default where d lacks it or holds null."""
    return {k: default if d.get(k) is None else d[k] for k, default in settings.items()}


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
                (k, d, f"{s.name}: {(s.help or {}).get(k, '')}") for k, d in s.settings.items() if k not in RUN_KEYS
            ]
    return out


def accepted_keys(s: VerifierSpec, d: dict) -> set:
    return set(RUN_KEYS) | set(s.settings) | (s.accepts(d) if s.accepts else set())


def check_keys(s: VerifierSpec, d: dict, where: str = "verifier") -> None:
    """Refuse a key the verifier does not accept, and a value of another type than its default's."""
    ok = accepted_keys(s, d)
    for key in d:
        if key not in ok:
            raise ValueError(
                f"{where}.{key} is not a setting of verifier {s.name!r}; accepted keys: {', '.join(sorted(ok))}"
            )
    for key, default in s.settings.items():
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
    if s.check is not None:
        s.check(d, where)
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
