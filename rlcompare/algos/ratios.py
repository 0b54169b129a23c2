"""Masked per-token helpers and the importance ratio that every surrogate reads (docs/algorithms.md §3).

Pure tensor math. ``mask`` ``[B, T]`` is 1/True on real completion tokens; per-token outputs are 0 at padding,
and padded inputs (even inf/NaN there) never reach a real result or a gradient.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

from rlcompare.algos.accepted import _one_of

# exp(20) ~ 4.9e8: keeps exp() finite in float32/bf16 after a wild update (verl clamps at 20 too).
LOG_RATIO_CLAMP = 20.0


def _dtype(*xs: torch.Tensor) -> torch.dtype:
    dt = torch.float32
    for x in xs:
        dt = torch.promote_types(dt, x.dtype)
    return dt


def _real(mask: torch.Tensor, shape, name: str = "mask") -> torch.Tensor:
    if tuple(mask.shape) != tuple(shape):
        raise ValueError(f"{name} must have shape {tuple(shape)} (like the log-probs), got {tuple(mask.shape)}")
    return mask.bool()


def _zero_pad(real: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    # where, not x*mask: a NaN/inf at a padded position must not survive (NaN*0 = NaN).
    return torch.where(real, x, torch.zeros((), dtype=x.dtype, device=x.device))


def _masked_mean(x: torch.Tensor, real: torch.Tensor) -> torch.Tensor:
    return _zero_pad(real, x).sum() / real.sum().clamp(min=1)


def _seq_mean(x: torch.Tensor, real: torch.Tensor) -> torch.Tensor:
    """``[B, T] -> [B]`` mean over each row's real tokens (0 for an empty row)."""
    return _zero_pad(real, x).sum(dim=-1) / real.sum(dim=-1).clamp(min=1).to(x.dtype)


def log_ratio(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    mask: torch.Tensor,
    *,
    level: str = "token",
) -> torch.Tensor:
    """Log importance ratio between the policy being updated and the rollout policy.

    Args:
        logp: ``[B, T]`` log-probs under the current policy (carries the gradient).
        old_logp: ``[B, T]`` log-probs under the rollout policy (treated as constant).
        mask: ``[B, T]`` real-token mask.
        level:
            ``"token"`` (PPO/GRPO/DAPO): ``logp - old_logp``.
            ``"sequence"`` (GSPO, arXiv 2507.18071 Eq. 7): every token of response i
            carries ``log s_i = (1/|o_i|) sum_t (logp - old_logp)`` (0 for an empty
            response); its gradient spreads evenly over the response's tokens.
            ``"sequence-token"`` (GSPO-token, arXiv 2507.18071 Eq. 13):
            ``logp - sg(logp) + sg(log s_i)``: value ``log s_i``, gradient per token.

    Returns:
        ``[B, T]`` log-ratio, clamped to ``±LOG_RATIO_CLAMP`` (20, as verl) so that
        ``exp`` stays finite; a clamped position has zero gradient. For the sequence
        levels the clamp applies to ``log s_i`` (after averaging). 0 at padding.
    """
    _one_of("level", level, ("token", "sequence", "sequence-token"))
    if logp.shape != old_logp.shape or logp.dim() != 2:
        raise ValueError(f"logp and old_logp must both be [B, T], got {tuple(logp.shape)} and {tuple(old_logp.shape)}")
    real = _real(mask, logp.shape)
    dt = _dtype(logp, old_logp)
    logp = logp.to(dt)
    diff = _zero_pad(real, logp - old_logp.to(dt).detach())
    if level == "token":
        out = diff
    else:
        log_s = _seq_mean(diff, real).unsqueeze(-1)  # [B, 1]
        if level == "sequence":
            out = log_s.expand_as(diff)
        else:
            out = logp - logp.detach() + log_s.detach()
    return _zero_pad(real, out.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP))


@dataclass
class TokenRatios:
    """One (micro-)batch's per-token quantities, shared by every surrogate (all ``[B, T]``, 0 at padding)."""

    logp: torch.Tensor  # current policy, carries the gradient
    old: torch.Tensor  # rollout policy, constant
    adv: torch.Tensor  # constant
    real: torch.Tensor  # bool
    log_rho: torch.Tensor  # at the requested ratio level (token for hybrid), clamped to +-LOG_RATIO_CLAMP
    rho: torch.Tensor
    level: str = "token"  # the ratio level asked for (``hybrid`` builds its sequence branch from ``token``)
    entropy: Optional[torch.Tensor] = None  # H / log|V| (DHPO's entropy mix), constant
    selected: Optional[torch.Tensor] = None  # bool: Clip-Cov / KL-Cov's tokens

    def frac(self, b: torch.Tensor) -> float:
        """Share of real tokens where ``b`` holds."""
        return float((b & self.real).sum() / self.real.sum().clamp(min=1))

    def mean(self, x: torch.Tensor) -> float:
        return float(_masked_mean(x.detach(), self.real))


def token_ratios(logp, old_logp, advantages, mask, level: str) -> TokenRatios:
    """Shapes checked, dtype promoted, padding zeroed; the ratio at ``level`` (``hybrid``: the token ratio)."""
    if logp.dim() != 2:
        raise ValueError(f"logp must be [B, T], got shape {tuple(logp.shape)}")
    real = _real(mask, logp.shape)
    dt = _dtype(logp, old_logp)
    if advantages.dim() == 1 and advantages.shape[0] == logp.shape[0]:
        adv = advantages.detach().to(dt).unsqueeze(-1).expand_as(logp)
    elif tuple(advantages.shape) == tuple(logp.shape):
        adv = advantages.detach().to(dt)
    else:
        raise ValueError(f"advantages must be [B] or [B, T] = {tuple(logp.shape)}, got {tuple(advantages.shape)}")
    log_rho = log_ratio(logp, old_logp, real, level="token" if level == "hybrid" else level)
    return TokenRatios(
        logp=_zero_pad(real, logp.to(dt)),
        old=_zero_pad(real, old_logp.detach().to(dt)),
        adv=_zero_pad(real, adv),
        real=real,
        log_rho=log_rho,
        rho=torch.exp(log_rho),
        level=level,
    )


def constant_like(x: torch.Tensor, t: TokenRatios, name: str) -> torch.Tensor:
    """A constant per-token input (weight, selection): shape-checked, detached, 0 at padding."""
    if tuple(x.shape) != tuple(t.real.shape):
        raise ValueError(f"{name} must be [B, T] = {tuple(t.real.shape)} (like the log-probs), got {tuple(x.shape)}")
    x = x.detach()
    if x.dtype == torch.bool:
        return x & t.real
    return _zero_pad(t.real, x.to(t.logp.dtype))
