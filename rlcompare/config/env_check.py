"""The `env` group's names and settings, checked against the environments' specs (rlcompare/env_specs.py) before
anything heavy: `env.module` imported first (it registers `env.name`, as `algorithm.module` does a surrogate),
`env.name` one of `env_specs.names()`, `env.settings` a registered environment's knobs (an unknown key or a value of
the wrong type named, then its settings' `check()`), `env.target` for env.name=custom only, the stop strings the
environment needs in `env.stop`. Each check raises a ValueError naming the key and the fix (the schema turns it
into a ConfigError). Torch-free; no environment's code is imported but a custom target's module and a factory's
`check` (the verifiers adapter loads its environment there, as it did as a custom target).
"""

from __future__ import annotations

from typing import Any

from omegaconf import OmegaConf

from rlcompare import env_specs
from rlcompare.config import user_modules

KEY = "env.module"


def import_env_module(module: Any) -> None:
    """Import `env.module` (null: nothing): the user's module that registers env.name (@register_environment)."""
    user_modules.import_setting_module(
        KEY, module, "the environment (@register_environment; e.g. examples.retry_env)", "examples.retry_env"
    )


def check_name(name: Any, module: Any) -> None:
    if name not in env_specs.names():
        hint = "" if module else f"; or an environment of your own: {KEY}=<the module that registers {name!r}>"
        raise ValueError(f"env.name={name!r} must be one of {', '.join(env_specs.names())}{hint}")


def check_environment(e: Any) -> None:
    """A registered environment's settings and needs, or a custom target (env.name is neither none nor unknown)."""
    settings = plain(e.settings)
    if not isinstance(settings, dict):
        raise ValueError(f"env.settings={settings!r} must be a mapping of the environment's keys (or {{}})")
    if e.name == env_specs.CUSTOM:
        if not isinstance(e.target, str) or ":" not in e.target:
            raise ValueError(
                f"env.target={e.target!r}: env.name=custom needs env.target='module:attribute' (the environment's class)"
            )
        check_factory(e.target, settings, "env.target")
        return
    if e.target is not None:
        raise ValueError(f"env.target={e.target!r} applies to env.name=custom only; set env.target=null")
    spec = env_specs.spec(e.name)
    kwargs = spec.factory_kwargs(spec.settings_of(settings))
    stops = list(e.stop or ())
    for stop in spec.needs.stop:
        if stop not in stops:
            raise ValueError(
                f"env.stop={stops!r}: env={e.name} reads a tool call at the end of a turn, so the turn must end at "
                f"{stop!r}; add it (env.stop=['{stop}'])"
            )
    check_factory(spec.factory, kwargs, f"env.name={e.name}'s factory")


def multi_turn(name: str) -> bool:
    """Whether env.name's episodes interleave environment tokens (a custom target's are taken to)."""
    s = env_specs.SPECS.get(name)
    return s.needs.multi_turn if s is not None else name != env_specs.NONE


def check_factory(target: str, settings: dict, key: str) -> None:
    """The factory loads and is callable; one with a `check(settings)` (the verifiers adapter's) refuses bad
    `env.settings` here, before anything heavy, instead of in every episode's worker."""
    try:
        obj = env_specs.resolve_factory(target)
    except Exception as err:  # noqa: BLE001 - any failure of the user's module, named
        raise ValueError(
            f"{key}={target!r} cannot be loaded ({type(err).__name__}: {err}); give an importable "
            f"'module:attribute' (the module on PYTHONPATH)"
        ) from None
    if not callable(obj):
        raise ValueError(f"{key}={target!r} is not callable; name the environment's class or factory")
    check = getattr(obj, "check", None)
    if callable(check):
        try:
            check(settings)
        except ValueError as err:  # the factory's own one-line message names the env.settings key
            raise ValueError(str(err).splitlines()[0]) from None


def plain(settings: Any) -> Any:
    return OmegaConf.to_container(settings, resolve=True) if OmegaConf.is_config(settings) else (settings or {})
