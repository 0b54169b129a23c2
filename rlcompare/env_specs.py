"""One declaration per environment, torch-free: its name (`env.name`), its own knobs (a settings dataclass of
``knob(default, help)`` fields with a ``check()``: the keys of ``env.settings``), what it needs from the run (the
stop strings its policy turns must end at, the room its shortest tool call takes), the metric names it reports
and how it is built: a ``"module:attribute"`` factory, imported only where an episode is stepped (the reward
worker pool), so that checking a config imports no environment's code.

Everything that asks about an environment derives from :data:`SPECS`: the accepted ``env.name`` values
(:func:`names`: ``none``, the registered ones, ``custom``), the check of ``env.settings`` (unknown keys, types, the
settings' ``check()``), the tool room check (``train/env_room.py``), the worker's factory (``envs/runner.py``).
Nobody tests an environment's name as a string.

The environments' code lives in ``rlcompare/envs/`` (``feedback.py``, ``calc.py``, ``verifiers_adapter.py``);
this module is beside that package rather than in it because the config check (``rlcompare.config``) reads it and
``rlcompare.envs`` imports ``rlcompare.data``, which imports ``rlcompare.config`` (docs/internals.md's layers).

Adding an environment: its spec and its class in one file, ``@register_environment(spec)`` on the class
(``examples/retry_env.py``; docs/api.md "Adding an environment"), named with ``env.module=<that module>``.
"""

from __future__ import annotations

import math
import re
import sys
import typing
from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields
from typing import Any, Callable, Optional

from rlcompare import registry
from rlcompare.specs_common import knob  # one way to declare a knob, every extension point's
from rlcompare.plugins import import_by_name

__all__ = ["EnvNeeds", "EnvSpec", "NoSettings", "knob", "register_environment", "register_spec", "spec", "names"]
__all__ += ["of_config", "resolve_factory", "unregister"]

NONE, CUSTOM = "none", "custom"  # env.name's other two values: single-turn, and env.target's own class
# the row's own env/ entries (rollout/episodes.py's `metrics`): an environment of one of these names would write
# its metrics over them (env/errors/<metric>), so none may take it
ROW_KEYS = ("ends", "errors", "turns_mean")
METRIC_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}")  # one path segment: env/<name>/<metric>


@dataclass(frozen=True)
class EnvNeeds:
    """What an environment needs from the run; every such question about a run is answered from here."""

    # its episodes interleave environment tokens with the policy's: an estimator that cannot take them (distill:
    # the teacher would score the environment's tokens) is refused
    multi_turn: bool = True
    # strings a policy turn must end at (env.stop must hold each): where it reads a tool call (calc: </calc>)
    stop: tuple = ()
    # its shortest tool call: a policy turn, and an episode with the tool's answer, must have room for it
    shortest_call: str = ""
    # the env.settings key naming an installed package that plays the episodes (verifiers: `module`, the taskset):
    # its name, version and source are an input of the run (rlcompare.train.inputs), which a resume checks
    package_setting: str = ""


@dataclass(frozen=True)
class NoSettings:
    """No knob: ``env.settings`` must be empty."""

    def check(self) -> None:
        pass


@dataclass(frozen=True)
class EnvSpec:
    """An environment's declaration. ``settings``: a frozen dataclass whose fields are its knobs (keys under
    ``env.settings``, :func:`knob`) and whose ``check()`` raises a ValueError naming ``env.settings.<key>`` and
    the fix (cheap: no environment is loaded); ``factory``: ``"module:attribute"``, the class or function called
    with the settings' fields as keyword arguments to make one episode's environment (set by
    :func:`register_environment` from the class it decorates); ``needs``: :class:`EnvNeeds`; ``metrics``: the
    names its steps may report (``StepResult.info["metrics"]``, a mapping name -> number), each logged as
    ``env/<name>/<metric>`` (the mean over the step's episodes that reported it; docs/metrics.md); ``doc``: one
    line with what it is."""

    name: str
    settings: type = NoSettings
    factory: str = ""
    needs: EnvNeeds = EnvNeeds()
    metrics: tuple = ()
    doc: str = ""

    def knobs(self) -> tuple:
        return tuple(f.name for f in fields(self.settings))

    def settings_of(self, values: Optional[Mapping]) -> Any:
        """The settings from ``env.settings`` (plain containers), checked: a key it does not declare, a value of
        another type than the knob's, then its own ``check()``; a ValueError naming ``env.settings.<key>``."""
        values = dict(values or {})
        unknown = sorted(set(values) - set(self.knobs()))
        if unknown:
            accepted = ", ".join(self.knobs()) or "none (it has no knob)"
            raise ValueError(
                f"env.settings.{unknown[0]} is not a setting of env.name={self.name}; accepted: {accepted}"
            )
        hints = typing.get_type_hints(self.settings)
        for key, value in values.items():
            if not _is_a(value, hints.get(key, Any)):
                raise ValueError(
                    f"env.settings.{key}={value!r} must be {_type_name(hints[key])} (env.name={self.name}'s "
                    f"knob; its default is {getattr(self.settings, key, None)!r})"
                )
        settings = self.settings(**values)
        settings.check()
        return settings

    def factory_kwargs(self, settings: Any) -> dict:
        """The factory's keyword arguments: every knob, the defaults filled in (plain data, sent to workers)."""
        return asdict(settings)


SPECS: dict[str, EnvSpec] = {}  # name -> spec, in registration order


def register_spec(spec: EnvSpec, module: Optional[str] = None) -> EnvSpec:
    """Register ``spec`` for ``module`` (default: the caller's). A name another module registered is refused,
    naming both (``rlcompare.registry.claim``); the same module registering it again replaces it."""
    module = module or registry.caller_module()
    if not isinstance(spec.name, str) or not METRIC_NAME.fullmatch(spec.name) or spec.name in (NONE, CUSTOM, *ROW_KEYS):
        raise ValueError(
            f"environment {spec.name!r}: pick a name of letters, digits, _ . - other than {NONE!r}, {CUSTOM!r} and "
            f"{', '.join(repr(k) for k in ROW_KEYS)} (the row's own env/ entries)"
        )
    module_part, _, attr = spec.factory.partition(":")
    if not module_part or not attr:
        raise ValueError(f"environment {spec.name!r}: factory {spec.factory!r} must be 'module:attribute'")
    for f in fields(spec.settings):
        if not f.metadata.get("help"):
            raise ValueError(f"environment {spec.name!r}: declare knob {f.name} as knob(default, help)")
    if not callable(getattr(spec.settings, "check", None)):
        raise ValueError(f"environment {spec.name!r}: {spec.settings.__name__} needs a check() method")
    bad = [m for m in spec.metrics if not isinstance(m, str) or not METRIC_NAME.fullmatch(m)]
    if bad or isinstance(spec.metrics, str):
        raise ValueError(
            f"environment {spec.name!r}: metric {(bad or [spec.metrics])[0]!r} is not a usable name: declare a "
            f"tuple of names of letters, digits, _ . - (at most 64; no '/'), each logged as env/{spec.name}/<name>"
        )
    if len(set(spec.metrics)) != len(spec.metrics):
        raise ValueError(f"environment {spec.name!r}: its metrics {tuple(spec.metrics)} name one twice")
    registry.claim("environment", spec.name, module)
    SPECS[spec.name] = spec
    return spec


def register_environment(spec: EnvSpec) -> Callable:
    """Class (or function) decorator: register ``spec`` with the decorated object as its factory, for the module
    that defines it. ``@register_environment(EnvSpec("guess", GuessSettings))`` above ``class GuessEnv``."""

    def decorate(obj):
        factory = spec.factory or f"{obj.__module__}:{obj.__qualname__}"
        register_spec(_with_factory(spec, factory), obj.__module__)
        return obj

    return decorate


def _with_factory(s: EnvSpec, factory: str) -> EnvSpec:
    from dataclasses import replace

    return replace(s, factory=factory)


def unregister(name: str) -> None:
    """Take a registered spec out again (a test's or a plug-in's own environment)."""
    SPECS.pop(name, None)
    registry.release("environment", name)


def names() -> tuple:
    """The accepted ``env.name`` values: none (single-turn), every registered environment, custom (env.target)."""
    return (NONE, *SPECS, CUSTOM)


def builtin_specs() -> list:
    """The specs rlcompare's own modules registered (a plug-in's, registered in this process, left out)."""
    return [s for s in SPECS.values() if (registry.owner("environment", s.name) or "").startswith("rlcompare.")]


def spec(name: str) -> EnvSpec:
    if name not in SPECS:
        raise ValueError(f"env.name must be one of {', '.join(repr(n) for n in names())}, got {name!r}")
    return SPECS[name]


def of_config(name: Any, target: Any = None) -> Optional[EnvSpec]:
    """The spec a run's `env` section names: by `env.name`, or for `env.name=custom` (and runs from before an
    environment was registered) the spec whose factory is `env.target`; None for none."""
    if name in SPECS:
        return SPECS[name]
    return next((s for s in SPECS.values() if target and s.factory == target), None)


def resolve_factory(target: str) -> Any:
    """The object "module:attribute" names (ImportError / AttributeError when it does not exist): a registered
    environment's factory, or env.target. The module is imported as a config-named module is
    (`plugins.import_by_name`: the working directory the last place looked; never while a foreign folder is read)."""
    module, _, attr = str(target).partition(":")
    import_by_name(module)
    obj = sys.modules[module]
    for part in attr.split("."):
        obj = getattr(obj, part)
    return obj


# ---------------------------------------------------------------- the types a knob's value may have
def _is_a(value: Any, hint: Any) -> bool:
    """Whether ``value`` (plain YAML data) fits the annotation ``hint``; an annotation it cannot read passes."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if hint is Any:
        return True
    if origin is typing.Union:
        return any(_is_a(value, a) for a in args)
    if hint is type(None):
        return value is None
    if hint is bool:
        return isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if hint is float:  # an integer is a float's value too (YAML writes 60 for 60.0)
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if hint is str:
        return isinstance(value, str)
    if hint is dict or origin in (dict, Mapping):
        return isinstance(value, Mapping)
    if hint in (list, tuple) or origin in (list, tuple):
        return isinstance(value, (list, tuple))
    return True


def _type_name(hint: Any) -> str:
    if typing.get_origin(hint) is typing.Union:
        return " or ".join(_type_name(a) for a in typing.get_args(hint))
    if hint is type(None):
        return "null"
    names_ = {bool: "true or false", int: "an integer", float: "a number", str: "a string"}
    if hint in names_:
        return names_[hint]
    origin = typing.get_origin(hint) or hint
    return "a mapping" if origin in (dict, Mapping) else "a list" if origin in (list, tuple) else str(hint)


# ---------------------------------------------------------------- the built-in environments (rlcompare/envs/)
VERIFIERS_ID = re.compile(r"([\w-]+/)?[A-Za-z_][\w-]*(@[\w.+-]+)?")  # verifiers' taskset ids: [owner/]name[@version]


@dataclass(frozen=True)
class VerifiersSettings:
    """env=verifiers' keys, the one declaration of them: the config check reads them here, and the adapter
    (`envs/verifiers_adapter.settings_from`) builds its settings with this class in the worker."""

    module: str = knob("", "verifiers: the taskset's import name (verifiers' --env.taskset.id), installed")
    env_id: str = knob("", "verifiers: verifiers' --env.id; '' = the taskset's own Env, else SingleAgentEnv")
    env_args: Optional[dict] = knob(None, "verifiers: the taskset config's fields (--env.taskset.<field>); null: none")
    role: str = knob("", "verifiers: the env's agent seat the policy plays; '' = its only one")
    turn_timeout_s: float = knob(60.0, "verifiers: the longest the env may take on one turn (then env/errors/raised)")

    def check(self) -> None:
        if not self.module.strip():
            raise ValueError(
                "env.settings.module: set it to the verifiers taskset's import name (env.settings.module=my_taskset)"
            )
        if not VERIFIERS_ID.fullmatch(self.module.strip()):
            raise ValueError(
                f"env.settings.module={self.module!r}: verifiers loads a taskset by a top-level import name (an "
                "installed package, e.g. my_taskset, or a hub id owner/my-taskset@0.1); a dotted path is not found "
                "by its loader"
            )
        if not (math.isfinite(self.turn_timeout_s) and self.turn_timeout_s > 0):
            raise ValueError(f"env.settings.turn_timeout_s={self.turn_timeout_s}: must be a positive number of seconds")


for _spec in (
    EnvSpec(
        "feedback",
        factory="rlcompare.envs.feedback:FeedbackEnv",
        doc="guess with feedback on the default task: 'lower' / 'higher' and the question again",
    ),
    EnvSpec(
        "calc",
        factory="rlcompare.envs.calc:CalcEnv",
        needs=EnvNeeds(stop=("</calc>",), shortest_call="<calc>1+1</calc>"),
        doc="tool use on the lab task: <calc>expr</calc> answered with its value",
    ),
    EnvSpec(
        "verifiers",
        VerifiersSettings,
        factory="rlcompare.envs.verifiers_adapter:VerifiersEnv",
        needs=EnvNeeds(package_setting="module"),
        doc="a verifiers (PrimeIntellect, 0.4) environment driven through the adapter",
    ),
):
    register_spec(_spec)
