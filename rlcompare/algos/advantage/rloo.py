"""RLOO's leave-one-out baseline (arXiv 2402.14740; docs/algorithms.md §1): ``R_i - mean_{j != i} R_j``."""

from rlcompare.algos import advantages as adv_lib
from rlcompare.algos.advantage import AdvantageInputs, AdvantageResult, register_estimator


@register_estimator("rloo")
def rloo(x: AdvantageInputs, settings) -> AdvantageResult:
    return AdvantageResult(adv_lib.rloo_advantages(x.sequence_rewards(), x.group_size))
