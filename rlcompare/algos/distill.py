"""On-policy distillation's advantage: pure tensor math (torch only, no I/O, no config objects).

The student samples, a frozen teacher scores every sampled token, and the per-token advantage is the negative
reverse KL estimated on the sample (Thinking Machines, "On-Policy Distillation", 2025-10; Tinker's cookbook
`discount_factor=0`; Agarwal et al. 2024, GKD, arXiv 2306.13649 for on-policy distillation as RL):

    A_t = log pi_T(y_t | y_<t) - log pi_old(y_t | y_<t)

`pi_old` is the policy that sampled (the ratio's denominator), so at ratio 1 the surrogate's gradient is
E[A_t grad log pi], the gradient of -KL(pi || pi_T) per token. With a discount gamma > 0 each token also
takes the later tokens' terms, `sum_{s>=t} gamma^(s-t) (log pi_T - log pi_old)_s` (the return of the per-token
reward; 0 keeps the per-token form, the default everywhere cited above). Mixed with the verifier's reward
(`mixed_advantages`): `coef * A_reward + A_distill`, the reward's advantage broadcast over its response's
tokens. Shapes as in `rlcompare.algos.advantages`: [B, T] with `mask` 1 on real completion tokens.
docs/algorithms.md section 9 works an example by hand (tests/algos/test_distill.py checks it).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from rlcompare.algos.advantages import _returns_to_go

__all__ = ["DistillAdvantages", "distill_advantages", "mixed_advantages"]


@dataclass(frozen=True)
class DistillAdvantages:
    """`advantages` [B, T] (0 off the mask and where the teacher's log-prob is not finite), and `nonfinite`, the
    count of real tokens whose teacher log-prob was NaN or infinite (their contribution ended, counted)."""

    advantages: torch.Tensor
    nonfinite: int


def distill_advantages(
    teacher_logp: torch.Tensor, old_logp: torch.Tensor, mask: torch.Tensor, *, discount: float = 0.0
) -> DistillAdvantages:
    """A_t = log pi_T(y_t) - log pi_old(y_t) on real tokens (module docstring), with the optional discount over
    later tokens. A real token whose teacher log-prob is not finite contributes 0 and is counted."""
    if teacher_logp.shape != old_logp.shape or teacher_logp.shape != mask.shape or teacher_logp.dim() != 2:
        raise ValueError(
            f"distill_advantages: teacher_logp {tuple(teacher_logp.shape)}, old_logp {tuple(old_logp.shape)} and "
            f"mask {tuple(mask.shape)} must be one [B, T] shape"
        )
    if not 0.0 <= discount <= 1.0:
        raise ValueError(f"distill_advantages: discount={discount} must be in [0, 1] (0: per token)")
    real = mask.bool()
    finite = torch.isfinite(teacher_logp)
    nonfinite = int((real & ~finite).sum())
    gap = torch.where(real & finite, teacher_logp.float() - old_logp.float(), torch.zeros((), dtype=torch.float32))
    if discount == 0.0:
        return DistillAdvantages(gap, nonfinite)
    return DistillAdvantages(_returns_to_go(gap, real, discount), nonfinite)


def mixed_advantages(
    reward_advantages: torch.Tensor, distill: torch.Tensor, mask: torch.Tensor, *, coef: float
) -> tuple[torch.Tensor, dict[str, float]]:
    """`coef * A_reward + A_distill` per token; `reward_advantages` [B] (one per response) or [B, T]. Returns the
    advantages and how much signal each term carried: the mean of |term| over real tokens (`abs_per_token`) and
    over responses of each response's token mean (`abs_per_response`); magnitudes, since a group advantage
    averages to 0 over its group whatever it carries. Beside them `distill/reverse_kl`, the mean over real tokens
    of -A_distill: the sample's estimate of KL(pi_old || pi_T) per token when the discount is 0."""
    if reward_advantages.dim() == 1:
        reward_advantages = reward_advantages[:, None].expand_as(distill)
    if reward_advantages.shape != distill.shape or distill.shape != mask.shape:
        raise ValueError(
            f"mixed_advantages: reward {tuple(reward_advantages.shape)}, distill {tuple(distill.shape)} and mask "
            f"{tuple(mask.shape)} must be one [B, T] shape (or the reward [B])"
        )
    real = mask.float()
    reward_term = (coef * reward_advantages.float() * real).abs()
    distill_term = distill.float() * real
    n_tokens = real.sum().clamp(min=1.0)
    lengths = real.sum(-1)
    has = lengths > 0
    n_responses = has.sum().clamp(min=1)

    def per_response(term: torch.Tensor) -> float:
        return float((term.sum(-1)[has] / lengths[has]).sum() / n_responses)

    metrics = {
        "distill/reward_term_abs_per_token": float(reward_term.sum() / n_tokens),
        "distill/distill_term_abs_per_token": float(distill_term.abs().sum() / n_tokens),
        "distill/reward_term_abs_per_response": per_response(reward_term),
        "distill/distill_term_abs_per_response": per_response(distill_term.abs()),
        "distill/reverse_kl": float(-distill_term.sum() / n_tokens),
    }
    return coef * reward_advantages.float() * real + distill_term, metrics
