"""GDPO, group reward-decoupled normalisation (arXiv 2601.05242; docs/algorithms.md §1): where GRPO normalises
the summed reward within the group, GDPO normalises each reward component within the group first, so that a
component of large spread does not drown the others, then combines them with the verifier's weights and (with
``scale=whiten``) whitens the sum over the batch's real tokens::

    A_k,i = (r_k,i - mean_g r_k) / (std_g r_k + eps)      each component k, within each group (GRPO's)
    A_i   = sum_k w_k A_k,i                                 the verifier's weights
    A_i,t = whiten(A_i over the batch's real tokens)        scale=whiten (the paper's batch normalisation, verl's)

As verl's ``compute_gdpo_outcome_advantage``. A verifier without components (anything but ``weighted``) is
one component of weight 1: group advantages, whitened.
"""

import torch

from rlcompare.algos import advantages as adv_lib
from rlcompare.algos.advantage import AdvantageInputs, AdvantageResult, register_estimator


def gdpo_advantages(
    components: torch.Tensor,
    weights,
    mask: torch.Tensor,
    group_size: int,
    *,
    whiten: bool = True,
    std_ddof: int = 1,
    eps: float = 1e-6,
) -> torch.Tensor:
    """``components`` (B, K) reward components, groups of ``group_size`` contiguous; ``weights`` (K,);
    ``mask`` (B, T). Returns (B, T) advantages, 0 at padding (the module docstring's formula)."""
    if components.dim() != 2 or len(weights) != components.shape[1]:
        raise ValueError(
            f"gdpo: components must be (B, K) with K weights, got {tuple(components.shape)} and {len(weights)}"
        )
    combined = torch.zeros(components.shape[0], dtype=torch.float32, device=components.device)
    for k, w in enumerate(weights):
        a_k = adv_lib.group_advantages(components[:, k], group_size, scale="group", std_ddof=std_ddof, eps=eps)
        combined = combined + float(w) * a_k
    per_token = torch.where(mask.bool(), combined[:, None], torch.zeros((), dtype=combined.dtype))
    return adv_lib.whiten(per_token, mask) if whiten else per_token


@register_estimator("gdpo")
def gdpo(x: AdvantageInputs, settings) -> AdvantageResult:
    if x.kl is not None:
        raise ValueError("the gdpo estimator takes no KL in the reward: which component would carry it?")
    comps = x.components if x.components is not None else x.rewards.reshape(-1, 1)
    weights = x.component_weights if x.components is not None else (1.0,)
    adv = gdpo_advantages(
        comps, weights, x.mask, x.group_size, whiten=x.scale == "whiten", std_ddof=x.std_ddof, eps=x.eps
    )
    return AdvantageResult(adv)
