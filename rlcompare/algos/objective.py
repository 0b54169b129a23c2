"""The whole RL objective in one place: advantages from rewards, then the loss one optimizer step minimizes.

Pure tensor math (torch, `rlcompare.algos.losses`, `rlcompare.algos.advantages`; no model, no config object): the trainer
reads its knobs out of the config and passes plain values. Notation as docs/algorithms.md: `B` completions in
groups of `G`, `T` completion positions, `m` (B, T) the real-token mask.

Per optimizer step, the loss is (`total_loss`, term by term):

    L = agg(-J(ratio, A), m')                   policy surrogate (clip, CISPO, SAPO, ...; losses.policy_loss)
      + beta * agg(kl(logp, ref_logp), m')      KL to the reference, only with kl.placement=in_loss (GRPO, k3)
      - c_H * agg(H, m')                        entropy bonus (seed 000's PPO lists it; 0 in every preset)
      + c_V * value_loss(V, V_old, R, m')       the critic's clipped regression to the GAE returns (PPO)

with `agg` the preset's aggregation (`losses.aggregate`: token-mean, seq-mean-token-mean, ...), normalized by
the whole rollout batch's totals so that mini- and micro-batching do not change it, and `m'` the loss mask: `m`
with DAPO's overlong filter applied. With kl.placement=in_reward (PPO) the KL term is not in the loss but in
the reward, before the advantages: `r_t -= beta * kl_t` (`reward_kl`, `advantages`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

import torch

from rlcompare.algos import estimator_specs, losses
from rlcompare.algos.advantage import AdvantageInputs, AdvantageResult, estimate  # noqa: F401 (re-exported)


# ----------------------------------------------------------------------------- before the update: advantages
def loss_mask(mask: torch.Tensor, truncated: torch.Tensor, *, overlong_filter: bool) -> torch.Tensor:
    """The tokens the loss counts: the completion mask (B, T), with every token of a truncated row (no EOS within
    the budget, `truncated` (B,) bool) set to 0 under DAPO's overlong filtering (arXiv 2503.14476 §3.4)."""
    out = mask.clone()
    if overlong_filter:
        out[truncated] = 0
    return out


def reward_kl(
    sampler_logp: torch.Tensor, ref_logp: torch.Tensor, mask: torch.Tensor, *, estimator: str
) -> torch.Tensor:
    """Per-token KL of the sampling policy to the reference (B, T), detached, 0 on padding: the penalty KL in the
    reward subtracts (`r_t -= beta * kl_t`, PPO/InstructGPT; usually k1 = log pi_old - log pi_ref)."""
    return losses.kl_divergence(sampler_logp, ref_logp, estimator=estimator, mask=mask).detach()


def advantages(
    estimator: str,
    rewards: torch.Tensor,
    mask: torch.Tensor,
    *,
    group_size: int,
    scale: str = "group",
    std_ddof: int = 1,
    eps: float = 1e-6,
    kl: Optional[torch.Tensor] = None,
    beta: float = 0.0,
    values: Optional[torch.Tensor] = None,
    gae_gamma: float = 1.0,
    gae_lam: float = 1.0,
    teacher_logp: Optional[torch.Tensor] = None,
    old_logp: Optional[torch.Tensor] = None,
    components: Optional[torch.Tensor] = None,
    component_weights: Optional[tuple] = None,
    **knobs,
) -> AdvantageResult:
    """The advantage estimator `estimator` (docs/algorithms.md §1; one module each in `algos/advantage/`) for
    rewards (B,) on device: group (GRPO, Dr. GRPO, DAPO, GSPO), rloo, reinforce_pp, gae (PPO, over the critic's
    `values` (B, T) with `gae_gamma` / `gae_lam`), distill (`teacher_logp`, `old_logp`), gdpo (`components` (B, K)
    with their weights), or a registered plug-in. `knobs`: the estimator's own (`baseline`, `gamma`,
    `reward_coef`, `distill_discount`, ...). KL in the reward (`kl` (B, T) from `reward_kl`, coefficient `beta`):
    the group estimators centre `R - beta * sum_t kl_t` (verl's token_level_rewards.sum(-1)), the per-token ones
    take `-beta * kl_t` on each token."""
    if estimator not in estimator_specs.SPECS:
        raise ValueError(f"unknown advantage estimator {estimator!r}; one of {', '.join(estimator_specs.SPECS)}")
    inputs = AdvantageInputs(
        rewards,
        mask,
        group_size,
        scale=scale,
        std_ddof=std_ddof,
        eps=eps,
        kl=kl,
        beta=beta if kl is not None else 0.0,
        values=values,
        critic_gamma=gae_gamma,
        critic_lam=gae_lam,
        teacher_logp=teacher_logp,
        old_logp=old_logp,
        components=components,
        component_weights=component_weights,
    )
    return estimate(estimator, inputs, knobs)


# ----------------------------------------------------------------------------- the loss
@dataclass
class LossParts:
    """`total_loss`'s terms, each the scalar added to the loss (None when off), and the surrogate's diagnostics."""

    policy: torch.Tensor  # the policy surrogate, aggregated
    kl: Optional[torch.Tensor] = None  # beta * agg(kl): only with KL in the loss
    entropy_bonus: Optional[torch.Tensor] = None  # - c_H * agg(H)
    value: Optional[torch.Tensor] = None  # the critic's loss, before c_V
    kl_ref: Optional[float] = None  # diagnostic: mean KL to the reference over real tokens (whatever its placement)
    policy_metrics: dict = field(default_factory=dict)  # losses.policy_loss's (clip fractions, ratios, ...)


def total_loss(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    loss_mask: torch.Tensor,
    *,
    aggregation: str,
    norm: losses.Normalizers,
    policy: losses.PolicySettings,
    token_weight: Optional[torch.Tensor] = None,
    cov_selected: Optional[torch.Tensor] = None,
    mix_entropy: Optional[torch.Tensor] = None,
    ref_logp: Optional[torch.Tensor] = None,
    kl_coef: float = 0.0,
    kl_estimator: str = "k3",
    kl_in_loss: bool = False,
    entropy: Optional[torch.Tensor] = None,
    entropy_coef: float = 0.0,
    values: Optional[torch.Tensor] = None,
    old_values: Optional[torch.Tensor] = None,
    returns: Optional[torch.Tensor] = None,
    value_coef: float = 0.0,
    value_clip: Optional[float] = None,
) -> tuple[torch.Tensor, LossParts]:
    """The loss of one micro-batch of `b` rows (the module docstring's formula) and its named parts.

    logp (b, T): the policy's log-probs of the sampled tokens, with the graph; old_logp (b, T): the sampling
    policy's (detached; the current ones when the update is on-policy); advantages (b,) or (b, T);
    mask (b, T): real completion tokens; loss_mask (b, T): the tokens the loss counts (`loss_mask`).
    policy: the surrogate's knobs for `losses.policy_loss` (surrogate, ratio, eps_low/high, dual_clip, seq
    ranges, mix, the variants' knobs); token_weight (b, T): mismatch weights times the top-entropy mask;
    cov_selected (b, T): Clip-Cov / KL-Cov's tokens; mix_entropy (b, T): H / log|V|, DHPO's entropy mix weight.
    ref_logp (b, T): the reference's log-probs (None: no reference); entropy (b, T): with its graph when
    entropy_coef > 0; values (b, T): the critic's, with its graph, and old_values / returns (PPO).
    """
    agg = norm.kwargs()
    # 1. the policy surrogate: -J per token, aggregated (clip-higher, dual clip, GSPO's sequence ratio, ...)
    policy_term, metrics = losses.policy_loss(
        logp,
        old_logp,
        advantages,
        loss_mask,
        policy,
        aggregation=aggregation,
        norm=norm,
        entropy=mix_entropy,
        token_weight=token_weight,
        cov_selected=cov_selected,
    )
    parts = LossParts(policy=policy_term, policy_metrics=metrics)
    loss = policy_term
    # 2. KL to the frozen reference: a diagnostic always, a loss term with placement in_loss (GRPO: +beta k3)
    if ref_logp is not None:
        kl = losses.kl_divergence(logp, ref_logp, estimator=kl_estimator)
        parts.kl_ref = float((kl.detach() * mask).sum() / mask.sum().clamp(min=1))
        if kl_in_loss:
            parts.kl = kl_coef * losses.aggregate(kl, loss_mask, aggregation, **agg)
            loss = loss + parts.kl
    # 3. entropy bonus: maximizing H keeps exploration up, so it enters with a minus sign
    if entropy_coef > 0:
        parts.entropy_bonus = -entropy_coef * losses.aggregate(entropy, loss_mask, aggregation, **agg)
        loss = loss + parts.entropy_bonus
    # 4. the critic's clipped value loss (token-mean over the batch's loss tokens), PPO only
    if values is not None:
        parts.value, _ = losses.value_loss(
            values,
            old_values,
            returns,
            loss_mask,
            clip=value_clip,
            aggregation="token-mean",
            total_tokens=norm.total_tokens,
        )
        loss = loss + value_coef * parts.value
    return loss, parts
