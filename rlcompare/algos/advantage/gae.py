"""PPO's GAE over the critic's values (arXiv 1506.02438; docs/algorithms.md §1): the outcome reward on the last
real token (``-beta kl_t`` on each with KL in the reward), whitened over the batch's tokens with ``scale=whiten``.
Reports the critic's explained variance at rollout time, ``1 - Var(returns - V) / Var(returns)`` over real
tokens (CleanRL's ``losses/explained_variance``): 1 a perfect critic, <= 0 no better than a constant."""

import torch

from rlcompare.algos import advantages as adv_lib
from rlcompare.algos.advantage import AdvantageInputs, AdvantageResult, register_estimator


def explained_variance(values: torch.Tensor, returns: torch.Tensor, mask: torch.Tensor) -> float:
    """``1 - Var(returns - values) / Var(returns)`` over the real tokens (population variances); nan when the
    returns do not vary."""
    real = mask.bool()
    y, v = returns[real].double(), values[real].double()
    var_y = y.var(correction=0) if y.numel() else torch.tensor(float("nan"))
    if not var_y > 0:
        return float("nan")
    return float(1.0 - (y - v).var(correction=0) / var_y)


@register_estimator("gae")
def gae(x: AdvantageInputs, settings) -> AdvantageResult:
    if x.values is None:
        raise ValueError("the gae estimator needs the critic's values")
    token_rewards = adv_lib.outcome_token_rewards(x.rewards, x.mask, kl=x.kl, beta=x.beta if x.kl is not None else 0)
    advs, returns = adv_lib.gae_advantages(token_rewards, x.values, x.mask, gamma=x.critic_gamma, lam=x.critic_lam)
    if x.scale == "whiten":
        advs = adv_lib.whiten(advs, x.mask)
    ev = explained_variance(x.values, returns, x.mask)
    return AdvantageResult(advs, returns=returns, old_values=x.values, metrics={"critic/explained_var": ev})
