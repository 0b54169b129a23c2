"""Corrections for stale rollouts (rollout.staleness, docs/algorithms.md §8): constant per-token weights or masks for
:func:`rlcompare.algos.losses.policy_loss`'s ``token_weight``, from the proximal policy's log-probs (the current
weights before the update, recomputed) and the behaviour policy's (the sampler's, with the stale weights).

Pure tensor math. Shapes: ``B`` completions, ``T`` completion tokens; ``mask`` ``[B, T]`` real tokens. Every weight
is 0 at padding and carries no gradient; the loss's normaliser is not changed by a mask (AReaL, SkyRL and the M2PO
paper divide by every token, masked or not).
"""

from __future__ import annotations

from typing import Optional

import torch

from rlcompare.algos.accepted import (
    DECOUPLED_CAP_MODES,
    M2PO_TOKENS,
    OFF_POLICY_CORRECTIONS,
    OFF_POLICY_DEFAULTS,
    _one_of,
    check_off_policy_knobs,
)
from rlcompare.algos.losses import mismatch_weights
from rlcompare.algos.ratios import LOG_RATIO_CLAMP, _dtype, _real, _seq_mean, _zero_pad

__all__ = [
    "OFF_POLICY_CORRECTIONS",
    "OFF_POLICY_DEFAULTS",
    "behaviour_log_ratio",
    "behaviour_gap",
    "decoupled_weights",
    "geo_sequence_mask",
    "m2po_mask",
    "correction_weights",
]


def behaviour_log_ratio(logp: torch.Tensor, behaviour_logp: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``[B, T]`` ``log(pi / pi_behav) = logp - behaviour_logp``, detached, clamped to ±20 (as every ratio here), 0 at
    padding. ``logp`` is the proximal policy's for the corrections, the updated policy's for the logged gap."""
    if logp.shape != behaviour_logp.shape or logp.dim() != 2:
        raise ValueError(
            f"logp and behaviour_logp must both be [B, T], got {tuple(logp.shape)} and {tuple(behaviour_logp.shape)}"
        )
    real = _real(mask, logp.shape)
    dt = _dtype(logp, behaviour_logp)
    d = logp.detach().to(dt) - behaviour_logp.detach().to(dt)
    return _zero_pad(real, d.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP))


def behaviour_gap(logp: torch.Tensor, behaviour_logp: torch.Tensor, mask: torch.Tensor) -> dict:
    """Mean and max ``|log(pi / pi_behav)|`` over the real tokens (``log_ratio_abs_mean`` / ``_max``; 0 without any)."""
    real = _real(mask, logp.shape)
    gap = behaviour_log_ratio(logp, behaviour_logp, real).abs()
    if not bool(real.any()):
        return {"log_ratio_abs_mean": 0.0, "log_ratio_abs_max": 0.0}
    return {"log_ratio_abs_mean": float(gap[real].mean()), "log_ratio_abs_max": float(gap[real].max())}


def decoupled_weights(
    prox_logp: torch.Tensor,
    behaviour_logp: torch.Tensor,
    mask: torch.Tensor,
    *,
    cap: Optional[float] = None,
    cap_mode: str = "mask",
) -> tuple[torch.Tensor, dict]:
    """Decoupled PPO's behaviour weight (AReaL, arXiv 2505.24298 Eq. 5; ``ppo_actor_loss_fn``): with the surrogate's
    ratio taken against the proximal policy (``old_logp`` = the recomputed log-probs), every token's clipped
    objective is multiplied by ``w = pi_prox / pi_behav``:

    - ``cap=None``: ``w`` itself (AReaL's default, ``behav_imp_weight_cap: null``);
    - ``cap_mode="mask"``: ``w * 1[w <= cap]`` (AReaL's ``behav_imp_weight_cap``; = ``mismatch_weights``'
      ``token-mask`` with ``c_max=cap``, no lower bound);
    - ``cap_mode="truncate"``: ``min(w, cap)`` (AReaL's ``rejection_sampling.action=clamp``; = ``token-truncate``).

    Returns ``(weights [B, T], metrics)``: ``weight_mean``, ``masked_frac`` (weight set to 0), ``truncated_frac``
    (weight capped), over real tokens (all 0 with no real token). ``log w`` is clamped to ±20 before ``exp`` with or
    without a cap, as every ratio here (so a cap above ``e^20`` cuts nothing that the clamp has not)."""
    _one_of("cap_mode", cap_mode, DECOUPLED_CAP_MODES)
    real = _real(mask, prox_logp.shape)
    d = behaviour_log_ratio(prox_logp, behaviour_logp, real)  # clamped to ±20 on both paths
    if cap is not None:
        mode = "token-mask" if cap_mode == "mask" else "token-truncate"
        w, mm = mismatch_weights(d, torch.zeros_like(d), real, mode=mode, c_min=None, c_max=cap)
        return w, {k: mm["mismatch_" + k] for k in ("weight_mean", "masked_frac", "truncated_frac")}
    w = _zero_pad(real, torch.exp(d))
    # with no real token every mean here is 0 (as the capped path's mismatch_weights and TokenRatios.mean)
    return w, {
        "weight_mean": float(w[real].mean()) if bool(real.any()) else 0.0,
        "masked_frac": 0.0,
        "truncated_frac": 0.0,
    }


def geo_sequence_mask(
    prox_logp: torch.Tensor, behaviour_logp: torch.Tensor, mask: torch.Tensor, *, delta: float = 0.01
) -> tuple[torch.Tensor, dict]:
    """SkyRL's geometric sequence mask (``off_policy_correction_utils.compute_sequence_mask``, ``"geometric"``):
    ``g_i = exp( (1/|o_i|) sum_t d_t )``, ``d_t = log(pi_prox / pi_behav)``, and every token of row ``i`` is kept iff
    ``1 - delta <= g_i <= 1 + delta`` (SkyRL's ``geo_mask_low/high`` = 0.99 / 1.01). Each ``d_t`` is clamped to ±20
    before the mean (as every log ratio here); SkyRL clamps the mean instead. They differ only where a token's gap
    passes 20: ``d = [25, -20]`` gives mean 0, ``g = 1`` (kept) here, mean 2.5, ``g = 12.18`` (dropped) in SkyRL
    (docs/algorithms.md §8.2).

    Returns ``(keep [B, T] float 0/1, metrics)``: ``masked_seq_frac`` (rows with a real token that are dropped),
    ``over_high_frac`` / ``under_low_frac`` (of those rows), ``masked_token_frac`` (real tokens dropped)."""
    if not (0 < delta < 1):
        raise ValueError(f"delta must be in (0, 1), got {delta!r}")
    real = _real(mask, prox_logp.shape)
    d = behaviour_log_ratio(prox_logp, behaviour_logp, real)
    g = torch.exp(_seq_mean(d, real))  # [B], |mean| <= 20 as each d_t is; an empty row: 1 (kept)
    over, under = g > 1.0 + delta, g < 1.0 - delta
    keep_row = ~(over | under)
    keep = real & keep_row.unsqueeze(-1)
    rows = real.any(dim=-1)
    n_rows = rows.sum().clamp(min=1)
    metrics = {
        "masked_seq_frac": float((rows & ~keep_row).sum() / n_rows),
        "over_high_frac": float((rows & over).sum() / n_rows),
        "under_low_frac": float((rows & under).sum() / n_rows),
        "masked_token_frac": float((real & ~keep).sum() / real.sum().clamp(min=1)),
    }
    return keep.to(d.dtype), metrics


def m2po_mask(
    prox_logp: torch.Tensor,
    behaviour_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    threshold: float = 0.04,
    tokens: str = "trust-region",
) -> tuple[torch.Tensor, dict]:
    """M2PO's second-moment mask (arXiv 2510.01161, Algorithm 1): ``M2_t = (log r_t)^2``, ``r = pi_prox / pi_behav``;
    over the candidate tokens ``T`` (``tokens="trust-region"``, the paper's: ``A > 0 and r > 1`` or ``A < 0 and
    r < 1``; ``"all"``: every real token, as AReaL's ``_apply_m2po_masking``), the token with the largest ``M2`` is
    masked while ``mean_{t in T} M2_t > threshold`` (the paper's tau_M2 = 0.04), then removed from ``T``. When even one
    candidate is over the threshold every candidate goes (the paper's loop; AReaL keeps one). Ties: the first in row
    order goes first. The batch is the tokens passed (pass the whole rollout batch).

    advantages: ``[B]`` or ``[B, T]``. Returns ``(keep [B, T] float 0/1, metrics)``: ``masked_frac`` (real tokens
    masked), ``candidate_frac`` (real tokens in ``T``), ``m2`` / ``m2_after`` (the candidates' mean ``M2`` before and
    after, 0 for none)."""
    if isinstance(threshold, bool) or not (threshold > 0):
        raise ValueError(f"threshold must be > 0 (tau_M2; the paper's 0.04), got {threshold!r}")
    _one_of("tokens", tokens, M2PO_TOKENS)
    real = _real(mask, prox_logp.shape)
    d = behaviour_log_ratio(prox_logp, behaviour_logp, real)
    adv = advantages.detach().to(d.dtype)
    adv = adv.unsqueeze(-1).expand_as(d) if adv.dim() == 1 else adv
    if tuple(adv.shape) != tuple(d.shape):
        raise ValueError(f"advantages must be [B] or [B, T] = {tuple(d.shape)}, got {tuple(advantages.shape)}")
    cand = real if tokens == "all" else real & (((adv > 0) & (d > 0)) | ((adv < 0) & (d < 0)))
    m2 = (d * d)[cand]  # row order
    order = torch.sort(m2, descending=True, stable=True).indices
    srt = m2[order]
    n = srt.numel()
    # mean of the candidates left after masking the i largest, i = 0..n (the empty set's mean is 0)
    suffix = torch.cat([srt.flip(0).cumsum(0).flip(0), srt.new_zeros(1)])
    left = suffix / torch.arange(n, -1, -1, dtype=srt.dtype, device=srt.device).clamp(min=1)
    n_masked = int(torch.nonzero(left <= threshold)[0, 0]) if n else 0
    dropped = torch.zeros(n, dtype=torch.bool, device=d.device)
    dropped[order[:n_masked]] = True
    keep = real.clone()
    keep[cand] = ~dropped
    n_real = real.sum().clamp(min=1)
    metrics = {
        "masked_frac": float(n_masked / n_real),
        "candidate_frac": float(n / n_real),
        "m2": float(left[0]),
        "m2_after": float(left[n_masked]),
    }
    return keep.to(d.dtype), metrics


def correction_weights(
    correction: str,
    prox_logp: torch.Tensor,
    behaviour_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    **knobs,
) -> tuple[torch.Tensor, dict]:
    """The chosen correction's ``token_weight`` and metrics; ``knobs``: :data:`OFF_POLICY_DEFAULTS`'s names (config
    ``algorithm.off_policy.*``), the defaults where absent."""
    k = {**OFF_POLICY_DEFAULTS, **knobs, "correction": correction}
    check_off_policy_knobs(k)
    if correction == "decoupled":
        return decoupled_weights(
            prox_logp, behaviour_logp, mask, cap=k["decoupled_cap"], cap_mode=k["decoupled_cap_mode"]
        )
    if correction == "geo-mask":
        return geo_sequence_mask(prox_logp, behaviour_logp, mask, delta=k["geo_delta"])
    _one_of("correction", correction, OFF_POLICY_CORRECTIONS)
    return m2po_mask(
        prox_logp, behaviour_logp, advantages, mask, threshold=k["m2po_threshold"], tokens=k["m2po_tokens"]
    )
