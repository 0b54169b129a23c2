"""One declaration per advantage estimator, torch-free: its name, its knobs (a settings dataclass of
``knob(default, help)`` fields with a ``check()``), the scales it accepts, what it needs from the run and the
metrics it reports. The math is a function registered for the name (``algos/advantage/<name>.py``,
``@register_estimator``).

Everything that asks "does this run need X" derives from the declared :class:`Needs`: the config check (a group
estimator with ``trainer.group_size=1``, a critic's settings, ``teacher.path``, KL in the reward, an environment),
the trainer (a critic built, the teacher's and the sampler's log-probs, the reward components) and the accepted
names in ``accepted.py`` (``ADVANTAGE_ESTIMATORS``, ``ESTIMATOR_SCALES``). Nobody tests an estimator's name.

Adding an estimator: its spec and its function in one file (``examples/centred_max.py``; docs/api.md "Adding an
advantage estimator").
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any, Optional

from rlcompare import registry
from rlcompare.algos.surrogate_specs import knob

# the keys under algorithm.advantage that are every estimator's (the schema's AdvantageConfig): which one, how its
# advantages are scaled (spec.scales), and the std's ddof and eps where a std divides
COMMON_KEYS = ("estimator", "scale", "std_ddof", "eps")
# group_advantages(scale=...): group (GRPO), batch (Lite PPO), batch-centered (ScaleRL), none (Dr. GRPO)
GROUP_SCALES = ("group", "batch", "batch-centered", "none")
# reinforce_pp_advantages(baseline=...): none (REINFORCE++, k = 1), group (REINFORCE++-baseline, k > 1)
REINFORCE_PP_BASELINES = ("none", "group")


@dataclass(frozen=True)
class Needs:
    """What an estimator needs from the run; every such question about a run is answered from here."""

    groups: bool = False  # compares the completions of one prompt: trainer.group_size >= 2 (settings may refine)
    critic: bool = False  # a value model (algorithm.critic.*): its values at rollout time
    teacher: bool = False  # teacher.path: the teacher's log-probs of the sampled tokens
    sampler_logp: bool = False  # the sampler's log-probs of the sampled tokens
    reward_components: bool = False  # the verifier's named reward components (verifier.name=weighted)
    multi_turn: bool = True  # works on an environment's episodes (False: env=none only)
    reward_kl: bool = True  # takes KL in the reward (algorithm.kl.placement=in_reward)


@dataclass(frozen=True)
class EstimatorSpec:
    """An advantage estimator's declaration. ``settings``: a frozen dataclass of its own knobs (keys under
    ``algorithm.advantage``, :func:`knob`) whose ``check()`` raises a ValueError naming
    ``algorithm.advantage.<key>`` and the fix, and whose optional ``uses_groups()`` refines ``needs.groups`` (the
    group baseline of REINFORCE++, the reward term of distillation); ``scales``: the ``algorithm.advantage.scale``
    values it accepts; ``metrics``: the names it reports (each in the row under its own name);
    ``doc``: one line with its source."""

    name: str
    settings: type
    scales: tuple
    needs: Needs = Needs()
    metrics: tuple = ()
    doc: str = ""

    def knobs(self) -> tuple:
        return tuple(f.name for f in fields(self.settings))

    def build(self, values: Any) -> Any:
        """Its settings from a mapping of ``algorithm.advantage``'s keys (absent keys take the defaults)."""
        return self.settings(**{k: values[k] for k in self.knobs() if k in values})

    def uses_groups(self, settings: Any) -> bool:
        refine = getattr(settings, "uses_groups", None)
        return bool(refine()) if callable(refine) else self.needs.groups


SPECS: dict[str, EstimatorSpec] = {}  # name -> spec, in registration order


def register_estimator_spec(spec: EstimatorSpec, module: Optional[str] = None) -> EstimatorSpec:
    """Register ``spec`` for ``module`` (default: the caller's); a name another module holds is refused, naming
    both (``rlcompare.registry``)."""
    module = module or registry.caller_module()
    for f in fields(spec.settings):
        if not f.metadata.get("help"):
            raise ValueError(f"advantage estimator {spec.name!r}: declare knob {f.name} as knob(default, help)")
        if f.name in COMMON_KEYS:
            raise ValueError(f"advantage estimator {spec.name!r}: {f.name} is every estimator's key, not a knob")
    if not callable(getattr(spec.settings, "check", None)):
        raise ValueError(f"advantage estimator {spec.name!r}: {spec.settings.__name__} needs a check() method")
    if not spec.scales:
        raise ValueError(f"advantage estimator {spec.name!r}: declare the scales it accepts")
    registry.claim("advantage estimator", spec.name, module)
    SPECS[spec.name] = spec
    return spec


def unregister(name: str) -> None:
    SPECS.pop(name, None)
    registry.release("advantage estimator", name)


def spec(name: str) -> EstimatorSpec:
    if name not in SPECS:
        raise ValueError(f"advantage estimator must be one of {', '.join(repr(n) for n in SPECS)}, got {name!r}")
    return SPECS[name]


def refuse(key: str, value: Any, what: str, fix: str) -> ValueError:
    return ValueError(f"algorithm.advantage.{key}={value!r} must be {what}; {fix}")


# ---------------------------------------------------------------- the built-in estimators' knobs
@dataclass(frozen=True)
class NoKnobs:
    def check(self) -> None:
        pass


@dataclass(frozen=True)
class ReinforcePPSettings:
    baseline: str = knob("none", "reinforce_pp: none (REINFORCE++) | group (REINFORCE++-baseline)")
    gamma: float = knob(1.0, "reinforce_pp: discount of the return to go")

    def check(self) -> None:
        if self.baseline not in REINFORCE_PP_BASELINES:
            raise ValueError(
                f"algorithm.advantage.baseline={self.baseline!r} is not accepted; use one of: "
                f"{', '.join(REINFORCE_PP_BASELINES)}"
            )
        if isinstance(self.gamma, bool) or not (0 <= self.gamma <= 1):
            raise refuse("gamma", self.gamma, "in [0, 1]", "e.g. 1.0")
        if self.baseline == "group" and self.gamma != 1:
            raise refuse(
                "gamma",
                self.gamma,
                "1 with algorithm.advantage.baseline=group (every token carries the centred sequence reward, as "
                "OpenRLHF)",
                "set algorithm.advantage.gamma=1.0",
            )

    def uses_groups(self) -> bool:
        return self.baseline == "group"


@dataclass(frozen=True)
class DistillSettings:
    reward_coef: float = knob(0.0, "distill: weight of the reward's group advantage beside the teacher's term")
    distill_discount: float = knob(0.0, "distill: discount over later tokens' teacher terms, in [0, 1]")

    def check(self) -> None:
        pass  # their ranges: the schema's (config/sections/algorithm.py's RANGES)

    def uses_groups(self) -> bool:
        return self.reward_coef > 0


_on_policy = Needs(groups=True)
for _spec in (
    EstimatorSpec(
        "group", NoKnobs, GROUP_SCALES, _on_policy, doc="GRPO (arXiv 2402.03300), Dr. GRPO, DAPO, GSPO, Lite PPO"
    ),
    EstimatorSpec("rloo", NoKnobs, ("none",), _on_policy, doc="RLOO (arXiv 2402.14740)"),
    EstimatorSpec("gae", NoKnobs, ("whiten", "none"), Needs(critic=True), ("critic/explained_var",), doc="PPO's GAE"),
    EstimatorSpec("reinforce_pp", ReinforcePPSettings, ("whiten",), doc="REINFORCE++ (arXiv 2501.03262)"),
    EstimatorSpec(
        "distill",
        DistillSettings,
        GROUP_SCALES,
        Needs(teacher=True, sampler_logp=True, multi_turn=False, reward_kl=False),
        (
            "distill/reward_term_abs_per_token",
            "distill/distill_term_abs_per_token",
            "distill/reward_term_abs_per_response",
            "distill/distill_term_abs_per_response",
            "distill/reverse_kl",
            "distill/teacher_nonfinite",
        ),
        doc="on-policy distillation (docs/algorithms.md §9)",
    ),
    EstimatorSpec(
        "gdpo",
        NoKnobs,
        ("whiten", "none"),
        Needs(groups=True, reward_components=True, reward_kl=False),
        doc="GDPO (arXiv 2601.05242): each reward component normalised within its group, then combined",
    ),
):
    register_estimator_spec(_spec)
