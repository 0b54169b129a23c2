"""The advantage estimators' math: one short module per built-in, each a function registered for its spec's name
(``estimator_specs.py``: the torch-free declaration of its knobs, needs and metrics), verl's ``@register_adv_est``
without its silent overwrite.

A function takes :class:`AdvantageInputs` (what the run hands every estimator; the fields its spec's needs ask
for are set) and its spec's settings, and returns an :class:`AdvantageResult`. ``estimate`` dispatches by name.

Adding one: a spec and a function decorated with ``@register_estimator(spec)``, in one file
(``examples/centred_max.py``; docs/api.md "Adding an advantage estimator").
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

import torch

from rlcompare import registry
from rlcompare.algos import estimator_specs
from rlcompare.algos.estimator_specs import EstimatorSpec


@dataclass
class AdvantageInputs:
    """What the run hands an estimator (docs/algorithms.md §1 notation; groups of ``group_size`` contiguous)."""

    rewards: torch.Tensor  # (B,) the verifier's (or the episode's) reward per completion
    mask: torch.Tensor  # (B, T) real completion tokens
    group_size: int
    scale: str = "group"  # algorithm.advantage.scale, one of the spec's scales
    std_ddof: int = 1
    eps: float = 1e-6
    kl: Optional[torch.Tensor] = None  # (B, T) per-token KL in the reward (constant), or None
    beta: float = 0.0  # its coefficient
    values: Optional[torch.Tensor] = None  # (B, T) the critic's values at rollout time (needs.critic)
    critic_gamma: float = 1.0  # algorithm.critic.gamma / lam (needs.critic)
    critic_lam: float = 1.0
    teacher_logp: Optional[torch.Tensor] = None  # (B, T) the teacher's log-probs (needs.teacher)
    old_logp: Optional[torch.Tensor] = None  # (B, T) the sampler's log-probs (needs.sampler_logp)
    components: Optional[torch.Tensor] = None  # (B, K) named reward components (needs.reward_components)
    component_weights: Optional[tuple] = None  # (K,) their weights in the verifier's reward

    def sequence_rewards(self) -> torch.Tensor:
        """(B,) the reward with KL in the reward summed in, ``R - beta * sum_t kl_t`` (verl's
        ``token_level_rewards.sum(-1)``): what group estimators centre."""
        from rlcompare.algos import advantages as adv_lib

        if self.kl is None:
            return self.rewards
        return adv_lib.outcome_token_rewards(self.rewards, self.mask, kl=self.kl, beta=self.beta).sum(-1)


@dataclass
class AdvantageResult:
    advantages: torch.Tensor  # (B,) per response or (B, T) per token
    returns: Optional[torch.Tensor] = None  # (B, T) with a critic only
    old_values: Optional[torch.Tensor] = None  # (B, T) with a critic only: the values it was computed from
    metrics: dict = field(default_factory=dict)  # under the spec's declared metric names


Estimate = Callable[[AdvantageInputs, Any], AdvantageResult]
ESTIMATOR_REGISTRY: dict[str, Estimate] = {}
BUILTIN_MODULES = ("group", "rloo", "gae", "reinforce_pp", "distill", "gdpo")


def register_estimator(spec: "str | EstimatorSpec") -> Callable[[Estimate], Estimate]:
    """Register ``fn(inputs, settings) -> AdvantageResult`` as the math of ``spec`` (a registered spec's name, or
    an :class:`EstimatorSpec`, registered here too). A name another module holds is refused, naming both."""

    def wrap(fn: Estimate) -> Estimate:
        if isinstance(spec, EstimatorSpec):
            estimator_specs.register_estimator_spec(spec, module=fn.__module__)
        name = spec.name if isinstance(spec, EstimatorSpec) else estimator_specs.spec(spec).name
        registry.claim("advantage estimator function", name, fn.__module__)
        ESTIMATOR_REGISTRY[name] = fn
        return fn

    return wrap


def _load_builtins() -> None:
    for name in BUILTIN_MODULES:
        importlib.import_module(f"{__name__}.{name}")


def estimate(name: str, inputs: AdvantageInputs, knobs: Any = None) -> AdvantageResult:
    """The advantages of estimator ``name`` with its settings built from ``knobs`` (``algorithm.advantage``'s keys,
    absent ones at their defaults); the metrics it reports are checked against its spec's declared names."""
    spec = estimator_specs.spec(name)
    if name not in ESTIMATOR_REGISTRY:
        raise ValueError(f"advantage estimator {name!r} has a spec but no registered function (@register_estimator)")
    settings = spec.build(knobs or {})
    out = ESTIMATOR_REGISTRY[name](inputs, settings)
    undeclared = set(out.metrics) - set(spec.metrics)
    if undeclared:
        raise ValueError(f"advantage estimator {name!r} reports {sorted(undeclared)} not among its spec's metrics")
    return out


_load_builtins()
