"""REINFORCE++ and REINFORCE++-baseline (arXiv 2501.03262; docs/algorithms.md §7): returns to go per token (or
the group-centred sequence reward), whitened over the batch's tokens."""

from rlcompare.algos import advantages as adv_lib
from rlcompare.algos.advantage import AdvantageInputs, AdvantageResult, register_estimator
from rlcompare.algos.estimator_specs import ReinforcePPSettings


@register_estimator("reinforce_pp")
def reinforce_pp(x: AdvantageInputs, s: ReinforcePPSettings) -> AdvantageResult:
    adv = adv_lib.reinforce_pp_advantages(
        x.rewards,
        x.mask,
        kl=x.kl,
        beta=x.beta,
        gamma=s.gamma,
        baseline=s.baseline,
        group_size=x.group_size,
        std_ddof=x.std_ddof,
        eps=x.eps,
    )
    return AdvantageResult(adv)
