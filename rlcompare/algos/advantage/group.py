"""GRPO's group-relative advantage (DeepSeekMath, arXiv 2402.03300; docs/algorithms.md §1): per response,
``(R - mean_g R) / (std_g R + eps)`` with ``scale`` group | batch | batch-centered | none (Dr. GRPO)."""

from rlcompare.algos import advantages as adv_lib
from rlcompare.algos.advantage import AdvantageInputs, AdvantageResult, register_estimator


@register_estimator("group")
def group(x: AdvantageInputs, settings) -> AdvantageResult:
    r = x.sequence_rewards()
    return AdvantageResult(adv_lib.group_advantages(r, x.group_size, scale=x.scale, std_ddof=x.std_ddof, eps=x.eps))
