"""On-policy distillation (docs/algorithms.md §9): ``log pi_T - log pi_old`` per token from the teacher's and the
sampler's log-probs (``distill_discount`` over later tokens), plus ``reward_coef`` times the group advantage."""

import torch

from rlcompare.algos import advantages as adv_lib
from rlcompare.algos import distill as distill_lib
from rlcompare.algos.advantage import AdvantageInputs, AdvantageResult, register_estimator
from rlcompare.algos.estimator_specs import DistillSettings


@register_estimator("distill")
def distill(x: AdvantageInputs, s: DistillSettings) -> AdvantageResult:
    if x.teacher_logp is None or x.old_logp is None:
        raise ValueError("the distill estimator needs the teacher's and the sampler's log-probs")
    if x.kl is not None:
        raise ValueError("the distill estimator takes no KL in the reward (its term is a per-token KL already)")
    reward_adv = (
        adv_lib.group_advantages(x.rewards, x.group_size, scale=x.scale, std_ddof=x.std_ddof, eps=x.eps)
        if s.reward_coef
        else torch.zeros_like(x.rewards, dtype=torch.float32)
    )
    term = distill_lib.distill_advantages(x.teacher_logp, x.old_logp, x.mask, discount=s.distill_discount)
    advs, metrics = distill_lib.mixed_advantages(reward_adv, term.advantages, x.mask, coef=s.reward_coef)
    return AdvantageResult(advs, metrics={**metrics, "distill/teacher_nonfinite": term.nonfinite})
