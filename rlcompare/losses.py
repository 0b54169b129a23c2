"""Policy-gradient losses: ratios, clipping, aggregation, KL, value loss.

Pure tensor math (torch only, no I/O, no config objects). Definitions follow
docs/algorithms.md sections 2-6.

Shapes: ``B`` completions (rows), ``T`` completion tokens, ``mask`` ``[B, T]`` with
1/True on real completion tokens (bool or 0/1 accepted). Per-token outputs are 0 at
padded positions, and padded inputs (even inf/NaN there) never reach a real result
or a gradient. Computation runs in float32 (float64 if the inputs are float64).
"""

from __future__ import annotations

from typing import Optional, Union

import torch

from rlcompare.advantages import informative_groups  # listed under losses in the issue

__all__ = [
    "RATIO_LEVELS",
    "AGGREGATIONS",
    "KL_ESTIMATORS",
    "LOG_RATIO_CLAMP",
    "log_ratio",
    "kl_divergence",
    "aggregation_weights",
    "aggregate",
    "policy_loss",
    "value_loss",
    "overlong_penalty",
    "entropy_from_logits",
    "informative_groups",
]

RATIO_LEVELS = ("token", "sequence", "sequence-token", "hybrid")
AGGREGATIONS = (
    "token-mean",
    "token-sum",
    "seq-mean-token-mean",
    "seq-mean-token-sum",
    "seq-mean-token-sum-norm",
)
KL_ESTIMATORS = ("k1", "k2", "k3")
MIXES = ("mean", "entropy")

# exp(20) ~ 4.9e8: keeps exp() finite in float32/bf16 after a wild update (verl clamps at 20 too).
LOG_RATIO_CLAMP = 20.0
# verl's low_var_kl clamp: k3 is exponential in x, so bound x before exp.
KL_CLAMP = 10.0

Number = Union[int, float, torch.Tensor]


# ---------------------------------------------------------------- helpers


def _one_of(name: str, value, accepted) -> None:
    if value not in accepted:
        opts = ", ".join(repr(a) for a in accepted)
        raise ValueError(f"{name} must be one of {opts}, got {value!r}")


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


def _check_nonneg(name: str, value) -> None:
    if value is None or not (value >= 0):
        raise ValueError(f"{name} must be a number >= 0, got {value!r}")


def _check_total(name: str, value) -> None:
    if value is not None and not (value >= 0):
        raise ValueError(f"{name} must be >= 0 (the whole rollout batch's count) or None, got {value!r}")


# ---------------------------------------------------------------- ratios


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
        raise ValueError(
            f"logp and old_logp must both be [B, T], got {tuple(logp.shape)} and {tuple(old_logp.shape)}"
        )
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


def kl_divergence(
    logp: torch.Tensor,
    ref_logp: torch.Tensor,
    *,
    estimator: str = "k3",
    mask: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """Per-token estimate of KL(policy || reference) (Schulman 2020, "Approximating KL").

    With ``x = ref_logp - logp``: ``k1 = -x``; ``k2 = x**2 / 2``;
    ``k3 = exp(x) - x - 1`` (>= 0, unbiased, low variance; GRPO's choice, DeepSeekMath
    Eq. 4), with ``x`` clamped to ±10 first as verl does.

    Args:
        logp: ``[B, T]`` current policy log-probs (carries the gradient).
        ref_logp: ``[B, T]`` frozen reference log-probs (treated as constant).
        estimator: ``"k1"``, ``"k2"`` or ``"k3"``.
        mask: optional ``[B, T]``; if given, padded positions output 0.

    Returns:
        ``[B, T]`` per-token KL estimate (aggregate it with :func:`aggregate`).
    """
    _one_of("estimator", estimator, KL_ESTIMATORS)
    if logp.shape != ref_logp.shape:
        raise ValueError(f"logp and ref_logp must have the same shape, got {tuple(logp.shape)} and {tuple(ref_logp.shape)}")
    dt = _dtype(logp, ref_logp)
    x = ref_logp.to(dt).detach() - logp.to(dt)
    real = None
    if mask is not None:
        real = _real(mask, logp.shape)
        x = _zero_pad(real, x)
    if estimator == "k1":
        kl = -x
    elif estimator == "k2":
        kl = 0.5 * x * x
    else:
        x = x.clamp(-KL_CLAMP, KL_CLAMP)
        kl = torch.exp(x) - x - 1
    return kl if real is None else _zero_pad(real, kl)


# ---------------------------------------------------------------- aggregation


def _denominator(value: Optional[Number], local: torch.Tensor) -> torch.Tensor:
    d = local if value is None else torch.as_tensor(value, dtype=local.dtype, device=local.device)
    return d.clamp(min=1)  # an empty batch gives 0, never 0/0


def aggregation_weights(
    mask: torch.Tensor,
    mode: str,
    *,
    horizon: Optional[Number] = None,
    total_tokens: Optional[Number] = None,
    total_seqs: Optional[Number] = None,
    dtype: torch.dtype = torch.float32,
) -> torch.Tensor:
    """Per-token weight ``w[i, t]`` that an aggregation mode implies; ``aggregate = sum(l * w)``.

    ``token-mean`` 1/N, ``token-sum`` 1, ``seq-mean-token-mean`` 1/(B |o_i|),
    ``seq-mean-token-sum`` 1/B, ``seq-mean-token-sum-norm`` 1/(B H); 0 at padding.
    Use it to log which responses dominate the update (length bias, docs/algorithms.md §4).
    See :func:`aggregate` for the arguments.
    """
    _one_of("aggregation mode", mode, AGGREGATIONS)
    if mask.dim() != 2:
        raise ValueError(f"mask must be [B, T], got shape {tuple(mask.shape)}")
    _check_total("total_tokens", total_tokens)
    _check_total("total_seqs", total_seqs)
    real = mask.bool()
    m = real.to(dtype)
    if mode == "token-mean":
        return m / _denominator(total_tokens, m.sum())
    if mode == "token-sum":
        return m
    # seq modes: B = rows passed (or total_seqs), empty rows included.
    n_seqs = _denominator(total_seqs, torch.tensor(float(m.shape[0]), dtype=dtype, device=m.device))
    if mode == "seq-mean-token-mean":
        return m / m.sum(dim=-1, keepdim=True).clamp(min=1) / n_seqs
    if mode == "seq-mean-token-sum":
        return m / n_seqs
    # seq-mean-token-sum-norm (Dr. GRPO): H is a constant budget, never the padded width.
    if horizon is None or isinstance(horizon, bool) or not (horizon > 0):
        raise ValueError(
            f"horizon must be > 0 for aggregation 'seq-mean-token-sum-norm', got {horizon!r}; "
            "pass horizon=max_new_tokens (the generation budget, not the padded width)"
        )
    return m / (n_seqs * horizon)


def aggregate(
    loss_mat: torch.Tensor,
    mask: torch.Tensor,
    mode: str,
    *,
    horizon: Optional[Number] = None,
    total_tokens: Optional[Number] = None,
    total_seqs: Optional[Number] = None,
) -> torch.Tensor:
    """Reduce a per-token loss ``[B, T]`` to a scalar (docs/algorithms.md §4).

    Modes (``l`` = loss, ``m`` = mask, ``|o_i| = sum_t m``):

    - ``token-mean`` (DAPO, arXiv 2503.14476 Eq. 12): ``sum l m / N``, ``N = sum m``.
    - ``token-sum``: ``sum l m``.
    - ``seq-mean-token-mean`` (GRPO, GSPO): ``(1/B) sum_i sum_t l m / |o_i|``.
    - ``seq-mean-token-sum``: ``(1/B) sum_i sum_t l m``.
    - ``seq-mean-token-sum-norm`` (Dr. GRPO, arXiv 2503.20783): ``(1/B) sum l m / H``.

    ``B`` is the number of rows (sequences), *including* rows whose mask is all zero
    (e.g. overlong-filtered completions): they add 0 to the numerator but still count
    in ``B``, so filtering a completion does not up-weight the others.

    Micro-batching: pass the whole rollout batch's counts as ``total_tokens`` (``N``)
    and ``total_seqs`` (``B``); then the losses of the micro-batches *sum* to the
    full batch's loss (verl #3741, TRL #5619). Without them the local counts are used.
    Denominators are clamped to >= 1, so an empty batch gives 0, not NaN.

    Args:
        loss_mat: ``[B, T]`` per-token loss.
        mask: ``[B, T]`` real-token mask.
        mode: one of :data:`AGGREGATIONS`.
        horizon: ``H`` for ``seq-mean-token-sum-norm`` (the generation budget,
            max_new_tokens); required (> 0) there, ignored elsewhere.
        total_tokens: rollout batch token count (``token-mean`` only).
        total_seqs: rollout batch sequence count (``seq-*`` modes only).

    Returns:
        0-d tensor.
    """
    real = _real(mask, loss_mat.shape)
    dt = _dtype(loss_mat)
    w = aggregation_weights(
        real, mode, horizon=horizon, total_tokens=total_tokens, total_seqs=total_seqs, dtype=dt
    )
    return (_zero_pad(real, loss_mat.to(dt)) * w).sum()


# ---------------------------------------------------------------- policy loss


def _clipped_surrogate(ratio: torch.Tensor, adv: torch.Tensor, eps_low: float, eps_high: float) -> torch.Tensor:
    """``min(rho A, clip(rho, 1-eps_low, 1+eps_high) A)``, per token."""
    unclipped = ratio * adv
    clipped = ratio.clamp(1.0 - eps_low, 1.0 + eps_high) * adv
    # ties go to the unclipped branch so that the gradient flows (e.g. on-policy, rho = 1)
    return torch.where(clipped < unclipped, clipped, unclipped)


def policy_loss(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    ratio: str = "token",
    eps_low: float = 0.2,
    eps_high: float = 0.2,
    dual_clip: Optional[float] = None,
    aggregation: str = "token-mean",
    horizon: Optional[Number] = None,
    total_tokens: Optional[Number] = None,
    total_seqs: Optional[Number] = None,
    seq_eps_low: Optional[float] = None,
    seq_eps_high: Optional[float] = None,
    mix: str = "mean",
    entropy: Optional[torch.Tensor] = None,
) -> tuple[torch.Tensor, dict]:
    """Clipped policy-gradient surrogate, every ratio level x every aggregation mode.

    Per token, with ratio ``rho`` and advantage ``A`` (PPO, arXiv 1707.06347 Eq. 7):
    ``l = -min(rho A, clip(rho, 1 - eps_low, 1 + eps_high) A)``. Decoupled ranges are
    DAPO's clip-higher (arXiv 2503.14476 Eq. 10). Dual clip (arXiv 1912.09729), for
    ``A < 0`` only: ``l = min(l, -c A)``, applied to the final ``l``.

    ``ratio``:
        ``token``: ``r = exp(logp - old_logp)``; ``sequence``: GSPO's ``s_i``;
        ``sequence-token``: GSPO-token (see :func:`log_ratio`); ``hybrid``: DHPO
        (arXiv 2601.05607) as read by rlcompare (docs/algorithms.md §6; the exact
        formula is not public):
        ``l = -[w min(r A, clip(r, 1-eps_low, 1+eps_high) A)
               + (1-w) min(s A, clip(s, 1-seq_eps_low, 1+seq_eps_high) A)]``
        with ``w = 0.5`` (``mix="mean"``) or ``w = sg(entropy)`` (``mix="entropy"``,
        clamped to [0, 1]). The sequence branch uses GSPO's ``s_i``, whose gradient
        spreads evenly over the response, so with ``mix="entropy"`` the on-policy
        gradient is redistributed within a response (the loss value is unchanged).

    The aggregation mode is honoured for every ratio level (the loss is always built
    per token, then reduced by :func:`aggregate`).

    Args:
        logp: ``[B, T]`` current log-probs (carries the gradient).
        old_logp: ``[B, T]`` rollout log-probs (constant).
        advantages: ``[B]`` per response or ``[B, T]`` per token (constant).
        mask: ``[B, T]`` real-token mask.
        ratio: one of :data:`RATIO_LEVELS`.
        eps_low, eps_high: clip range of ``rho`` (token branch for hybrid); >= 0.
        dual_clip: ``c > 1`` or None (off).
        aggregation, horizon, total_tokens, total_seqs: see :func:`aggregate`.
        seq_eps_low, seq_eps_high: the sequence branch's range; required for hybrid,
            ignored for the other levels.
        mix: ``"mean"`` or ``"entropy"`` (hybrid only).
        entropy: ``[B, T]`` per-token entropy divided by ``log|V|``; required for
            ``mix="entropy"`` with hybrid.

    Returns:
        ``(loss, metrics)``: 0-d loss tensor; metrics are python floats computed on
        *this* (micro-)batch: ``clip_frac_low`` (``rho < 1-eps_low`` and ``A < 0``),
        ``clip_frac_high`` (``rho > 1+eps_high`` and ``A > 0``), ``dual_clip_frac``
        (dual bound active), all over real tokens; ``ratio_mean/min/max`` of ``rho``
        over real tokens (the token ratio for hybrid); ``seq_ratio_mean/min/max`` of
        ``s_i`` over non-empty responses; ``approx_kl`` masked mean of
        ``-(logp - old_logp)`` per token; ``objective_per_token`` token-mean of
        ``-l``; ``objective_per_response`` seq-mean-token-mean of ``-l`` (local
        counts, not total_*). For hybrid also ``seq_clip_frac_low/high`` and
        ``mix_weight_mean``. With no real tokens: fractions/KL/objectives 0, ratios 1.
    """
    # ---- validation: name the knob and what it accepts
    _one_of("ratio", ratio, RATIO_LEVELS)
    _one_of("aggregation", aggregation, AGGREGATIONS)
    _one_of("mix", mix, MIXES)
    _check_nonneg("eps_low", eps_low)
    _check_nonneg("eps_high", eps_high)
    if dual_clip is not None and not (dual_clip > 1):
        raise ValueError(f"dual_clip must be > 1 (or None to disable), got {dual_clip!r}")
    if ratio == "hybrid":
        if seq_eps_low is None or seq_eps_high is None:
            raise ValueError(
                "ratio='hybrid' needs seq_eps_low and seq_eps_high (the sequence ratio's clip "
                f"range, e.g. 3e-4 / 4e-4), got {seq_eps_low!r} / {seq_eps_high!r}"
            )
        _check_nonneg("seq_eps_low", seq_eps_low)
        _check_nonneg("seq_eps_high", seq_eps_high)
        if mix == "entropy" and entropy is None:
            raise ValueError(
                "mix='entropy' needs entropy ([B, T] per-token entropy divided by log|V|); "
                "pass entropy=... or use mix='mean'"
            )
    if logp.dim() != 2:
        raise ValueError(f"logp must be [B, T], got shape {tuple(logp.shape)}")
    real = _real(mask, logp.shape)
    dt = _dtype(logp, old_logp)
    if advantages.dim() == 1 and advantages.shape[0] == logp.shape[0]:
        adv = advantages.detach().to(dt).unsqueeze(-1).expand_as(logp)
    elif tuple(advantages.shape) == tuple(logp.shape):
        adv = advantages.detach().to(dt)
    else:
        raise ValueError(
            f"advantages must be [B] or [B, T] = {tuple(logp.shape)}, got {tuple(advantages.shape)}"
        )
    adv = _zero_pad(real, adv)

    # ---- ratios and the per-token surrogate
    tok_level = "token" if ratio == "hybrid" else ratio
    log_rho = log_ratio(logp, old_logp, real, level=tok_level)
    rho = torch.exp(log_rho)
    surrogate = _clipped_surrogate(rho, adv, eps_low, eps_high)
    w = None
    if ratio == "hybrid":
        s = torch.exp(log_ratio(logp, old_logp, real, level="sequence"))
        seq_surrogate = _clipped_surrogate(s, adv, seq_eps_low, seq_eps_high)
        if mix == "mean":
            w = torch.full_like(rho, 0.5)
        else:
            if tuple(entropy.shape) != tuple(logp.shape):
                raise ValueError(f"entropy must be [B, T] = {tuple(logp.shape)}, got {tuple(entropy.shape)}")
            w = _zero_pad(real, entropy.detach().to(dt).clamp(0.0, 1.0))
        surrogate = w * surrogate + (1.0 - w) * seq_surrogate
    loss_mat = -surrogate
    dual_active = torch.zeros_like(real)
    if dual_clip is not None:
        bound = -dual_clip * adv
        dual_active = (adv < 0) & (loss_mat > bound)
        loss_mat = torch.where(dual_active, bound, loss_mat)  # constant: zero gradient there
    loss_mat = _zero_pad(real, loss_mat)
    dual_active = dual_active & real

    loss = aggregate(
        loss_mat, real, aggregation, horizon=horizon, total_tokens=total_tokens, total_seqs=total_seqs
    )

    # ---- metrics (local batch, python floats)
    with torch.no_grad():
        n = real.sum().clamp(min=1)

        def frac(b: torch.Tensor) -> float:
            return float((b & real).sum() / n)

        metrics = {
            "clip_frac_low": frac((rho < 1.0 - eps_low) & (adv < 0)),
            "clip_frac_high": frac((rho > 1.0 + eps_high) & (adv > 0)),
            "dual_clip_frac": frac(dual_active),
            "approx_kl": float(_masked_mean(-(logp.detach().to(dt) - old_logp.detach().to(dt)), real)),
            "objective_per_token": float(aggregate(-loss_mat.detach(), real, "token-mean")),
            "objective_per_response": float(aggregate(-loss_mat.detach(), real, "seq-mean-token-mean")),
        }
        metrics.update(_ratio_stats("ratio", rho, real))
        log_s_i = _seq_mean(logp.detach().to(dt) - old_logp.detach().to(dt), real)
        log_s_i = log_s_i.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
        metrics.update(_ratio_stats("seq_ratio", torch.exp(log_s_i), real.any(dim=-1)))
        if ratio == "hybrid":
            metrics["seq_clip_frac_low"] = frac((s < 1.0 - seq_eps_low) & (adv < 0))
            metrics["seq_clip_frac_high"] = frac((s > 1.0 + seq_eps_high) & (adv > 0))
            metrics["mix_weight_mean"] = float(_masked_mean(w, real))
    return loss, metrics


def _ratio_stats(prefix: str, x: torch.Tensor, real: torch.Tensor) -> dict:
    if not bool(real.any()):
        return {f"{prefix}_mean": 1.0, f"{prefix}_min": 1.0, f"{prefix}_max": 1.0}
    vals = x[real]
    return {
        f"{prefix}_mean": float(vals.mean()),
        f"{prefix}_min": float(vals.min()),
        f"{prefix}_max": float(vals.max()),
    }


# ---------------------------------------------------------------- value loss, penalties, entropy


def value_loss(
    values: torch.Tensor,
    old_values: torch.Tensor,
    returns: torch.Tensor,
    mask: torch.Tensor,
    *,
    clip: Optional[float] = 0.2,
    aggregation: str = "token-mean",
    horizon: Optional[Number] = None,
    total_tokens: Optional[Number] = None,
    total_seqs: Optional[Number] = None,
) -> tuple[torch.Tensor, dict]:
    """Clipped critic loss (PPO; as in OpenAI baselines / verl ``compute_value_loss``).

    ``l = 1/2 max((V - R)^2, (clip(V, V_old - c, V_old + c) - R)^2)`` per token, then
    :func:`aggregate`. ``clip=None`` disables clipping: ``l = 1/2 (V - R)^2``.

    Args:
        values: ``[B, T]`` current critic values (carry the gradient).
        old_values: ``[B, T]`` critic values at rollout time (constant).
        returns: ``[B, T]`` GAE returns (constant).
        mask: ``[B, T]`` real-token mask.
        clip: ``c >= 0`` or None.
        aggregation, horizon, total_tokens, total_seqs: see :func:`aggregate`.

    Returns:
        ``(loss, metrics)`` with ``value_clip_frac`` (share of real tokens where the
        clipped term is the larger one), ``value_mean``, ``return_mean`` (masked means).
    """
    _one_of("aggregation", aggregation, AGGREGATIONS)
    if clip is not None and not (clip >= 0):
        raise ValueError(f"clip must be >= 0 (or None to disable value clipping), got {clip!r}")
    if values.shape != old_values.shape or values.shape != returns.shape or values.dim() != 2:
        raise ValueError(
            "values, old_values and returns must all be [B, T]; got "
            f"{tuple(values.shape)}, {tuple(old_values.shape)}, {tuple(returns.shape)}"
        )
    real = _real(mask, values.shape)
    dt = _dtype(values, old_values, returns)
    v = _zero_pad(real, values.to(dt))
    v_old = _zero_pad(real, old_values.detach().to(dt))
    ret = _zero_pad(real, returns.detach().to(dt))
    unclipped = (v - ret) ** 2
    if clip is None:
        per_tok = unclipped
        clipped_wins = torch.zeros_like(real)
    else:
        v_clipped = v_old + (v - v_old).clamp(-clip, clip)
        clipped = (v_clipped - ret) ** 2
        clipped_wins = clipped > unclipped
        per_tok = torch.where(clipped_wins, clipped, unclipped)
    loss_mat = _zero_pad(real, 0.5 * per_tok)
    loss = aggregate(loss_mat, real, aggregation, horizon=horizon, total_tokens=total_tokens, total_seqs=total_seqs)
    with torch.no_grad():
        metrics = {
            "value_clip_frac": float(_masked_mean(clipped_wins.to(dt), real)),
            "value_mean": float(_masked_mean(v.detach(), real)),
            "return_mean": float(_masked_mean(ret, real)),
        }
    return loss, metrics


def overlong_penalty(
    lengths: torch.Tensor,
    *,
    max_len: int,
    cache_len: int,
    factor: float = 1.0,
) -> torch.Tensor:
    """Soft overlong punishment (DAPO, arXiv 2503.14476 Eq. 13), added to the reward.

    With ``L_max = max_len`` (generation budget) and ``L_cache = cache_len``:
    ``0`` if ``|o| <= L_max - L_cache``; ``((L_max - L_cache) - |o|) / L_cache`` if
    ``L_max - L_cache < |o| <= L_max`` (linear from 0 down to -1); ``-1`` beyond.
    Multiplied by ``factor``.

    Args:
        lengths: ``[B]`` completion lengths in tokens.

    Returns:
        ``[B]`` float penalties (<= 0 for factor >= 0).
    """
    if not (max_len > 0):
        raise ValueError(f"max_len must be > 0 (the generation budget), got {max_len!r}")
    if not (0 < cache_len <= max_len):
        raise ValueError(f"cache_len must be in (0, max_len={max_len}], got {cache_len!r}")
    lengths = torch.as_tensor(lengths)
    lengths = lengths.to(torch.promote_types(lengths.dtype, torch.float32))
    expected = max_len - cache_len
    ramp = (expected - lengths) / cache_len
    out = torch.where(lengths <= expected, torch.zeros_like(ramp), ramp)
    out = torch.where(lengths > max_len, torch.full_like(ramp, -1.0), out)
    return out * factor


def entropy_from_logits(logits: torch.Tensor, *, chunk_size: Optional[int] = None) -> torch.Tensor:
    """Entropy of ``softmax(logits)`` over the last (vocabulary) axis.

    ``H = logsumexp(z) - sum softmax(z) z``: stable for large logits (no log of 0).
    Computed in float32 (float64 if given). ``chunk_size`` processes that many rows
    (positions) at a time to bound the ``[*, V]`` temporaries for big vocabularies.
    Divide by ``math.log(V)`` for the normalised entropy the hybrid ratio's
    ``mix="entropy"`` expects.

    Args:
        logits: ``[..., V]``, e.g. ``[B, T, V]``.

    Returns:
        ``logits.shape[:-1]`` entropies in nats.
    """
    if chunk_size is not None and not (isinstance(chunk_size, int) and chunk_size > 0):
        raise ValueError(f"chunk_size must be a positive int or None, got {chunk_size!r}")
    dt = _dtype(logits)
    lead = logits.shape[:-1]
    flat = logits.reshape(-1, logits.shape[-1])

    def _h(z: torch.Tensor) -> torch.Tensor:
        z = z.to(dt)
        p = torch.softmax(z, dim=-1)
        # p*z is 0*(-inf) = NaN for filtered (-inf) logits; those terms are 0
        pz = torch.where(p > 0, p * z, torch.zeros((), dtype=dt, device=z.device))
        return torch.logsumexp(z, dim=-1) - pz.sum(dim=-1)

    if chunk_size is None or flat.shape[0] <= chunk_size:
        out = _h(flat)
    else:
        out = torch.cat([_h(c) for c in flat.split(chunk_size, dim=0)])
    return out.reshape(lead)

