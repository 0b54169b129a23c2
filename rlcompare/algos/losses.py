"""Policy-gradient losses: ratios, clipping, aggregation, KL, value loss.

Pure tensor math (torch only, no I/O, no config objects). Definitions follow
docs/algorithms.md sections 2-6.

Shapes: ``B`` completions (rows), ``T`` completion tokens, ``mask`` ``[B, T]`` with
1/True on real completion tokens (bool or 0/1 accepted). Per-token outputs are 0 at
padded positions, and padded inputs (even inf/NaN there) never reach a real result
or a gradient. Computation runs in float32 (float64 if the inputs are float64).

The variants of 2025-26 (CISPO, SAPO, GMPO, DPPO, Clip-Cov / KL-Cov, rollout-mismatch
weights, top-entropy masking, k3+, prompt-level aggregation) follow docs/algorithms.md §7.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional, Union

import torch

from rlcompare.algos.advantages import informative_groups  # listed under losses in the issue
from rlcompare.algos.accepted import (  # the accepted names and knob defaults, torch-free (config imports them)
    RATIO_LEVELS,
    AGGREGATIONS,
    KL_ESTIMATORS,
    MIXES,
    SURROGATES,
    SURROGATE_KNOBS,
    SURROGATE_DEFAULTS,
    SURROGATE_RATIOS,
    SURROGATE_METRICS,
    COV_SURROGATES,
    COV_RATIO_DEFAULTS,
    MISMATCH_MODES,
    MISMATCH_DEFAULTS,
    check_surrogate_knobs,
    check_mismatch_bounds,
    _one_of,
    _check_nonneg,
    _check_cov_knobs,
    _mismatch_bounds,
)

__all__ = [
    "RATIO_LEVELS",
    "AGGREGATIONS",
    "KL_ESTIMATORS",
    "MIXES",
    "SURROGATES",
    "SURROGATE_KNOBS",
    "SURROGATE_DEFAULTS",
    "SURROGATE_RATIOS",
    "SURROGATE_METRICS",
    "COV_SURROGATES",
    "COV_RATIO_DEFAULTS",
    "MISMATCH_MODES",
    "MISMATCH_DEFAULTS",
    "LOG_RATIO_CLAMP",
    "log_ratio",
    "kl_divergence",
    "aggregation_weights",
    "aggregate",
    "group_token_counts",
    "policy_loss",
    "token_covariance",
    "cov_selection",
    "check_surrogate_knobs",
    "check_mismatch_bounds",
    "mismatch_weights",
    "entropy_threshold",
    "entropy_mask",
    "value_loss",
    "overlong_penalty",
    "entropy_from_logits",
    "informative_groups",
]

# exp(20) ~ 4.9e8: keeps exp() finite in float32/bf16 after a wild update (verl clamps at 20 too).
LOG_RATIO_CLAMP = 20.0
# verl's low_var_kl (core_algos.kl_penalty_forward): ref - logp clamped to +-20 before exp, the k3 value to
# [-10, 10] after
KL_LOG_CLAMP = 20.0
KL_VALUE_CLAMP = 10.0

Number = Union[int, float, torch.Tensor]


# ---------------------------------------------------------------- helpers


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
    Eq. 4), clamped as verl's ``low_var_kl``: ``x`` to ±20 before ``exp``, the k3 value
    to [-10, 10] after (a clamped position has zero gradient).
    ``k3+`` (verl ``k3+``): the value of k3 with the gradient of k2,
    ``k2 - sg(k2) + sg(k3)``; as a loss, k3's gradient ``1 - pi_ref/pi`` is the *forward*
    KL's and k2's ``logp - ref_logp`` the reverse KL's (arXiv 2510.01555, 2512.21852).

    Args:
        logp: ``[B, T]`` current policy log-probs (carries the gradient).
        ref_logp: ``[B, T]`` frozen reference log-probs (treated as constant).
        estimator: one of :data:`KL_ESTIMATORS`.
        mask: optional ``[B, T]``; if given, padded positions output 0.

    Returns:
        ``[B, T]`` per-token KL estimate (aggregate it with :func:`aggregate`).
    """
    _one_of("estimator", estimator, KL_ESTIMATORS)
    if logp.shape != ref_logp.shape:
        raise ValueError(
            f"logp and ref_logp must have the same shape, got {tuple(logp.shape)} and {tuple(ref_logp.shape)}"
        )
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
        xc = x.clamp(-KL_LOG_CLAMP, KL_LOG_CLAMP)
        kl = (torch.exp(xc) - xc - 1).clamp(-KL_VALUE_CLAMP, KL_VALUE_CLAMP)
        if estimator == "k3+":
            k2 = 0.5 * x * x
            kl = k2 - k2.detach() + kl.detach()
    return kl if real is None else _zero_pad(real, kl)


# ---------------------------------------------------------------- aggregation


def _denominator(value: Optional[Number], local: torch.Tensor) -> torch.Tensor:
    d = local if value is None else torch.as_tensor(value, dtype=local.dtype, device=local.device)
    return d.clamp(min=1)  # an empty batch gives 0, never 0/0


def _check_group_size(group_size) -> int:
    if isinstance(group_size, bool) or not isinstance(group_size, int) or group_size < 1:
        raise ValueError(
            f"group_size must be a positive int (completions per prompt, groups contiguous) for aggregation "
            f"'prompt-mean-token-mean', got {group_size!r}"
        )
    return group_size


def group_token_counts(mask: torch.Tensor, group_size: int) -> torch.Tensor:
    """``[B]``: the real-token count of each row's group, ``sum_{j in g(i)} |o_j|`` (groups contiguous).

    Computed on the whole batch and sliced, it makes ``prompt-mean-token-mean`` exact for
    micro-batches that split groups (pass it as ``group_tokens``).
    """
    G = _check_group_size(group_size)
    if mask.dim() != 2:
        raise ValueError(f"mask must be [B, T], got shape {tuple(mask.shape)}")
    B, T = mask.shape
    if B % G:
        raise ValueError(
            f"{B} rows are not whole groups of group_size={G}; pass group_tokens computed on the whole batch "
            "(group_token_counts) when a micro-batch splits a group"
        )
    per_group = mask.bool().reshape(B // G, G * T).sum(dim=1)
    return per_group.repeat_interleave(G)


def aggregation_weights(
    mask: torch.Tensor,
    mode: str,
    *,
    horizon: Optional[Number] = None,
    total_tokens: Optional[Number] = None,
    total_seqs: Optional[Number] = None,
    group_size: Optional[int] = None,
    group_tokens: Optional[torch.Tensor] = None,
    dtype: torch.dtype = torch.float32,
) -> torch.Tensor:
    """Per-token weight ``w[i, t]`` that an aggregation mode implies; ``aggregate = sum(l * w)``.

    ``token-mean`` 1/N, ``token-sum`` 1, ``seq-mean-token-mean`` 1/(B |o_i|),
    ``seq-mean-token-sum`` 1/B, ``seq-mean-token-sum-norm`` 1/(B H),
    ``prompt-mean-token-mean`` 1/(n_prompts sum_{j in g(i)} |o_j|); 0 at padding.
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
    if mode == "prompt-mean-token-mean":
        return m / _prompt_denominator(real, total_seqs, group_size, group_tokens, dtype)
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


def _prompt_denominator(real, total_seqs, group_size, group_tokens, dtype) -> torch.Tensor:
    """``[B, 1]``: ``n_prompts * sum_{j in g(i)} |o_j|`` (ScaleRL, arXiv 2510.13786 Sec. 4)."""
    G = _check_group_size(group_size)
    n_seqs = float(real.shape[0] if total_seqs is None else total_seqs)
    if n_seqs % G:
        raise ValueError(f"total_seqs={n_seqs:g} is not a whole number of groups of group_size={G}")
    if group_tokens is None:
        counts = group_token_counts(real, G)
    else:
        counts = torch.as_tensor(group_tokens, device=real.device)
        if tuple(counts.shape) != (real.shape[0],):
            raise ValueError(f"group_tokens must be [B] = ({real.shape[0]},), got {tuple(counts.shape)}")
    n_prompts = max(n_seqs / G, 1.0)
    return (n_prompts * counts.to(dtype).clamp(min=1)).unsqueeze(-1)


def aggregate(
    loss_mat: torch.Tensor,
    mask: torch.Tensor,
    mode: str,
    *,
    horizon: Optional[Number] = None,
    total_tokens: Optional[Number] = None,
    total_seqs: Optional[Number] = None,
    group_size: Optional[int] = None,
    group_tokens: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """Reduce a per-token loss ``[B, T]`` to a scalar (docs/algorithms.md §4).

    Modes (``l`` = loss, ``m`` = mask, ``|o_i| = sum_t m``):

    - ``token-mean`` (DAPO, arXiv 2503.14476 Eq. 12): ``sum l m / N``, ``N = sum m``.
    - ``token-sum``: ``sum l m``.
    - ``seq-mean-token-mean`` (GRPO, GSPO): ``(1/B) sum_i sum_t l m / |o_i|``.
    - ``seq-mean-token-sum``: ``(1/B) sum_i sum_t l m``.
    - ``seq-mean-token-sum-norm`` (Dr. GRPO, arXiv 2503.20783): ``(1/B) sum l m / H``.
    - ``prompt-mean-token-mean`` (ScaleRL, arXiv 2510.13786 Sec. 4): token-mean inside each
      prompt's group of ``group_size`` contiguous rows, then mean over the ``B / G`` prompts.

    ``B`` is the number of rows (sequences), *including* rows whose mask is all zero
    (e.g. overlong-filtered completions): they add 0 to the numerator but still count
    in ``B``, so filtering a completion does not up-weight the others.

    Micro-batching: pass the whole rollout batch's counts as ``total_tokens`` (``N``)
    and ``total_seqs`` (``B``; the prompt count is ``total_seqs / group_size``); then the
    losses of the micro-batches *sum* to the full batch's loss (verl #3741, TRL #5619).
    ``prompt-mean-token-mean`` reads each group's token count from the rows passed, so
    micro-batches must hold whole groups, unless ``group_tokens`` (``[B]``, from
    :func:`group_token_counts` on the whole batch) is given. Without totals the local counts
    are used. Denominators are clamped to >= 1, so an empty batch gives 0, not NaN.

    Args:
        loss_mat: ``[B, T]`` per-token loss.
        mask: ``[B, T]`` real-token mask.
        mode: one of :data:`AGGREGATIONS`.
        horizon: ``H`` for ``seq-mean-token-sum-norm`` (the generation budget,
            max_new_tokens); required (> 0) there, ignored elsewhere.
        total_tokens: rollout batch token count (``token-mean`` only).
        total_seqs: rollout batch sequence count (``seq-*`` and ``prompt-*`` modes).
        group_size: ``G``, required for ``prompt-mean-token-mean``, ignored elsewhere.
        group_tokens: ``[B]`` each row's group token count (``prompt-mean-token-mean`` only).

    Returns:
        0-d tensor.
    """
    real = _real(mask, loss_mat.shape)
    dt = _dtype(loss_mat)
    w = aggregation_weights(
        real,
        mode,
        horizon=horizon,
        total_tokens=total_tokens,
        total_seqs=total_seqs,
        group_size=group_size,
        group_tokens=group_tokens,
        dtype=dt,
    )
    return (_zero_pad(real, loss_mat.to(dt)) * w).sum()


# ---------------------------------------------------------------- policy loss


def _clipped_surrogate(ratio: torch.Tensor, adv: torch.Tensor, eps_low: float, eps_high: float) -> torch.Tensor:
    """``min(rho A, clip(rho, 1-eps_low, 1+eps_high) A)``, per token."""
    unclipped = ratio * adv
    clipped = ratio.clamp(1.0 - eps_low, 1.0 + eps_high) * adv
    # ties go to the unclipped branch so that the gradient flows (e.g. on-policy, rho = 1)
    return torch.where(clipped < unclipped, clipped, unclipped)


@dataclass
class _Tokens:
    """One (micro-)batch's per-token quantities, shared by every surrogate (all ``[B, T]``, 0 at padding)."""

    logp: torch.Tensor  # current policy, carries the gradient
    old: torch.Tensor  # rollout policy, constant
    adv: torch.Tensor  # constant
    real: torch.Tensor  # bool
    log_rho: torch.Tensor  # at the requested ratio level (token for hybrid), clamped to +-LOG_RATIO_CLAMP
    rho: torch.Tensor

    def frac(self, b: torch.Tensor) -> float:
        """Share of real tokens where ``b`` holds."""
        return float((b & self.real).sum() / self.real.sum().clamp(min=1))

    def mean(self, x: torch.Tensor) -> float:
        return float(_masked_mean(x.detach(), self.real))


def _tokens(logp, old_logp, advantages, mask, level: str) -> _Tokens:
    """Shapes checked, dtype promoted, padding zeroed; the ratio at ``level``."""
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
    log_rho = log_ratio(logp, old_logp, real, level=level)
    return _Tokens(
        logp=_zero_pad(real, logp.to(dt)),
        old=_zero_pad(real, old_logp.detach().to(dt)),
        adv=_zero_pad(real, adv),
        real=real,
        log_rho=log_rho,
        rho=torch.exp(log_rho),
    )


# Each surrogate is a per-token objective J[i, t] (the loss is -J, then token_weight, then aggregate) built
# from the shared _Tokens and the knobs; it returns (J, what it clips/masks/gates for the metrics).


def _clip_objective(t: _Tokens, k: dict) -> tuple[torch.Tensor, dict]:
    """PPO/DAPO (and GSPO/DHPO through the ratio level): ``min(rho A, clip(rho) A)``."""
    obj = _clipped_surrogate(t.rho, t.adv, k["eps_low"], k["eps_high"])
    if k["ratio"] != "hybrid":
        return obj, {}
    s = torch.exp(log_ratio(t.logp, t.old, t.real, level="sequence"))
    seq_obj = _clipped_surrogate(s, t.adv, k["seq_eps_low"], k["seq_eps_high"])
    if k["mix"] == "mean":
        w = torch.full_like(t.rho, 0.5)
    else:
        entropy = k["entropy"]
        if tuple(entropy.shape) != tuple(t.rho.shape):
            raise ValueError(f"entropy must be [B, T] = {tuple(t.rho.shape)}, got {tuple(entropy.shape)}")
        w = _zero_pad(t.real, entropy.detach().to(t.rho.dtype).clamp(0.0, 1.0))
    extra = {
        "seq_clip_frac_low": t.frac((s < 1.0 - k["seq_eps_low"]) & (t.adv < 0)),
        "seq_clip_frac_high": t.frac((s > 1.0 + k["seq_eps_high"]) & (t.adv > 0)),
        "mix_weight_mean": t.mean(w),
    }
    return w * obj + (1.0 - w) * seq_obj, extra


def _is_weighted_pg(t: _Tokens, w: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    """``sg(w) A logp`` on the kept tokens: a policy gradient whose IS weight is a constant (CISPO, DPPO)."""
    return torch.where(keep & t.real, w.detach() * t.adv * t.logp, torch.zeros((), dtype=t.logp.dtype))


def _cispo_objective(t: _Tokens, k: dict) -> tuple[torch.Tensor, dict]:
    """CISPO (MiniMax-M1, arXiv 2506.13585 Eq. 4-5): ``sg(clip(r, w_min, w_max)) A logp``, no token dropped."""
    lo, hi = k["cispo_w_min"], k["cispo_w_max"]
    rho = t.rho.detach()
    w = rho if lo is None and hi is None else rho.clamp(min=lo, max=hi)
    extra = {
        "is_weight_mean": t.mean(w),
        "is_clip_frac_low": t.frac(rho < lo) if lo is not None else 0.0,
        "is_clip_frac_high": t.frac(rho > hi) if hi is not None else 0.0,
    }
    return _is_weighted_pg(t, w, t.real), extra


def _sapo_objective(t: _Tokens, k: dict) -> tuple[torch.Tensor, dict]:
    """SAPO (arXiv 2511.20347): soft gate ``(4/tau) sigmoid(tau (r - 1)) A``, tau by the sign of A."""
    tau = torch.where(t.adv > 0, torch.full_like(t.rho, k["sapo_tau_pos"]), torch.full_like(t.rho, k["sapo_tau_neg"]))
    p = torch.sigmoid(tau * (t.rho - 1.0))
    weight = 4.0 * p.detach() * (1.0 - p.detach())  # d gate / d r: 1 at r = 1, decays smoothly
    return p * (4.0 / tau) * t.adv, {"sapo_weight_mean": t.mean(weight)}


def _gmpo_objective(t: _Tokens, k: dict) -> tuple[torch.Tensor, dict]:
    """GMPO (arXiv 2507.20673): ``A_i exp(mean_t clip(log r))``, each token's log-ratio clipped one-sided by
    the sign of A_i *before* the geometric mean; the value is the response's, on each of its tokens."""
    a_i = _seq_mean(t.adv, t.real)  # the response's advantage (verl: sequence-level advantages only)
    pos, neg = (a_i > 0).unsqueeze(-1), (a_i < 0).unsqueeze(-1)
    d = t.log_rho
    d_clip = torch.where(pos, d.clamp(max=k["gmpo_eps_high"]), torch.where(neg, d.clamp(min=-k["gmpo_eps_low"]), d))
    ratio = torch.exp(_seq_mean(d_clip, t.real))  # [B]
    clipped = (pos & (d > k["gmpo_eps_high"])) | (neg & (d < -k["gmpo_eps_low"]))
    rows = t.real.any(dim=-1)
    extra = {
        "gmpo_clip_frac": t.frac(clipped),
        "gmpo_ratio_mean": float(ratio.detach()[rows].mean()) if bool(rows.any()) else 1.0,
    }
    return _zero_pad(t.real, (a_i * ratio).unsqueeze(-1).expand_as(d)), extra


def _binary_kl(mu: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
    """KL(Bernoulli(mu) || Bernoulli(p)); xlogy keeps 0 log 0 = 0."""
    return (torch.xlogy(mu, mu) - torch.xlogy(mu, p)) + (torch.xlogy(1 - mu, 1 - mu) - torch.xlogy(1 - mu, 1 - p))


def _dppo_objective(t: _Tokens, k: dict) -> tuple[torch.Tensor, dict]:
    """DPPO (arXiv 2602.04879; Stable-RL / verl): ``sg(min(r, C)) A logp`` outside a divergence trust region on
    the sampled token's binary distribution (p = pi(o_t), mu = pi_old(o_t)); masked tokens get no gradient."""
    p, mu = torch.exp(t.logp.detach()), torch.exp(t.old)
    lo, hi = k["dppo_delta_low"], k["dppo_delta_high"]
    if k["surrogate"] == "dppo-tv":
        up, down = (p - mu) > hi, (p - mu) < -lo
    else:
        div = _binary_kl(mu, p)
        up, down = (div > hi) & (p > mu), (div > lo) & (p < mu)
    masked = torch.where(t.adv > 0, up, down) & t.real
    rho = t.rho.detach()
    w = rho.clamp(max=k["dppo_cap"])
    extra = {
        "dppo_mask_frac": t.frac(masked),
        "is_weight_mean": t.mean(w),
        "is_clip_frac_high": t.frac(rho > k["dppo_cap"]),
    }
    return _is_weighted_pg(t, w, ~masked), extra


def _clip_cov_objective(t: _Tokens, k: dict) -> tuple[torch.Tensor, dict]:
    """Clip-Cov (arXiv 2505.22617): the PPO clip, with the selected high-covariance tokens removed (value and
    gradient)."""
    selected = k["cov_selected"]
    obj = _clipped_surrogate(t.rho, t.adv, k["eps_low"], k["eps_high"])
    return torch.where(selected, torch.zeros((), dtype=obj.dtype), obj), {"cov_selected_frac": t.frac(selected)}


def _kl_cov_objective(t: _Tokens, k: dict) -> tuple[torch.Tensor, dict]:
    """KL-Cov (arXiv 2505.22617): ``r A`` on every token (no clip), minus ``beta |log r|`` on the selected
    high-covariance tokens."""
    selected = k["cov_selected"]
    penalty = k["kl_cov_coef"] * t.log_rho.abs()
    obj = t.rho * t.adv - torch.where(selected, penalty, torch.zeros((), dtype=penalty.dtype))
    return obj, {"cov_selected_frac": t.frac(selected)}


_OBJECTIVES = {
    "clip": _clip_objective,
    "cispo": _cispo_objective,
    "sapo": _sapo_objective,
    "gmpo": _gmpo_objective,
    "dppo-tv": _dppo_objective,
    "dppo-kl": _dppo_objective,
    "clip-cov": _clip_cov_objective,
    "kl-cov": _kl_cov_objective,
}


def token_covariance(logp: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``Cov[i, t] = (A - mean A)(logp - mean logp)``, both means over the real tokens passed (arXiv
    2505.22617; entropy falls in proportion to it). Detached; 0 at padding. ``advantages`` ``[B]`` or ``[B, T]``."""
    t = _tokens(logp.detach(), logp.detach(), advantages, mask, "token")
    centred_adv = t.adv - _masked_mean(t.adv, t.real)
    centred_logp = t.logp - _masked_mean(t.logp, t.real)
    return _zero_pad(t.real, centred_adv * centred_logp)


def _cov_count(ratio: float, n_real: int) -> int:
    # verl / the authors: max(int(ratio * N), 1), N = real tokens passed
    return max(int(ratio * n_real), 1)


def _cov_select(t: _Tokens, surrogate: str, k: dict, generator: Optional[torch.Generator]) -> torch.Tensor:
    ratio = COV_RATIO_DEFAULTS[surrogate] if k["cov_ratio"] is None else k["cov_ratio"]
    cov = token_covariance(t.logp, t.adv, t.real)
    n_real = int(t.real.sum())
    selected = torch.zeros_like(t.real)
    if n_real == 0:
        return selected
    n = _cov_count(ratio, n_real)
    if surrogate == "kl-cov":  # the n largest covariances (torch.topk, as verl)
        flat_idx = torch.nonzero(t.real.reshape(-1), as_tuple=True)[0]
        top = torch.topk(cov.reshape(-1)[flat_idx], min(n, n_real), largest=True).indices
        selected.reshape(-1)[flat_idx[top]] = True
        return selected
    # clip-cov: n drawn uniformly (torch.randperm, as verl) among tokens PPO did not clip with lb < Cov < ub
    clipped = t.rho.clamp(1.0 - k["eps_low"], 1.0 + k["eps_high"]) * t.adv < t.rho * t.adv
    candidates = t.real & ~clipped & (cov > k["cov_lb"]) & (cov < k["cov_ub"])
    idx = torch.nonzero(candidates)  # row-major, as verl
    if len(idx):
        gen_device = generator.device if generator is not None else "cpu"
        perm = torch.randperm(len(idx), generator=generator, device=gen_device).to(idx.device)
        chosen = idx[perm[: min(n, len(idx))]]
        selected[chosen[:, 0], chosen[:, 1]] = True
    return selected


def cov_selection(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    surrogate: str,
    eps_low: float = 0.2,
    eps_high: float = 0.2,
    cov_ratio: Optional[float] = None,
    cov_lb: float = 1.0,
    cov_ub: float = 5.0,
    generator: Optional[torch.Generator] = None,
) -> torch.Tensor:
    """The tokens Clip-Cov removes or KL-Cov penalises (arXiv 2505.22617; verl ``clip_cov`` / ``kl_cov``).

    Over the real tokens passed (``N``), ``n = max(int(cov_ratio N), 1)`` tokens:
    ``kl-cov`` the ``n`` largest :func:`token_covariance`; ``clip-cov`` ``n`` drawn uniformly
    (``torch.randperm`` with ``generator``) among the tokens PPO did not clip
    (``eps_low``/``eps_high``) whose covariance lies in ``(cov_lb, cov_ub)`` (all of them if fewer).
    ``cov_ratio=None`` takes :data:`COV_RATIO_DEFAULTS`. Compute it on the whole (mini-)batch of one
    optimizer step and pass slices as ``policy_loss(cov_selected=...)`` to make micro-batches exact
    (verl and the authors select per micro-batch).

    Returns:
        bool ``[B, T]`` (False at padding).
    """
    _one_of("surrogate", surrogate, COV_SURROGATES)
    knobs = dict(eps_low=eps_low, eps_high=eps_high, cov_ratio=cov_ratio, cov_lb=cov_lb, cov_ub=cov_ub)
    _check_cov_knobs(knobs)
    _check_nonneg("eps_low", eps_low)
    _check_nonneg("eps_high", eps_high)
    with torch.no_grad():
        return _cov_select(_tokens(logp.detach(), old_logp, advantages, mask, "token"), surrogate, knobs, generator)


def _check_surrogate(surrogate: str, ratio: str, dual_clip, k: dict) -> None:
    """The surrogate, the ratio level and dual clip it goes with, and its knobs."""
    _one_of("surrogate", surrogate, SURROGATES)
    if ratio not in SURROGATE_RATIOS[surrogate]:
        opts = ", ".join(repr(r) for r in SURROGATE_RATIOS[surrogate])
        raise ValueError(f"surrogate={surrogate!r} takes ratio in {opts}, got {ratio!r}")
    if dual_clip is not None and surrogate != "clip":
        raise ValueError(
            f"dual_clip applies to surrogate='clip' only, got surrogate={surrogate!r}; pass dual_clip=None"
        )
    check_surrogate_knobs(surrogate, k)


def policy_loss(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    surrogate: str = "clip",
    ratio: str = "token",
    eps_low: float = 0.2,
    eps_high: float = 0.2,
    dual_clip: Optional[float] = None,
    aggregation: str = "token-mean",
    horizon: Optional[Number] = None,
    total_tokens: Optional[Number] = None,
    total_seqs: Optional[Number] = None,
    group_size: Optional[int] = None,
    group_tokens: Optional[torch.Tensor] = None,
    seq_eps_low: Optional[float] = None,
    seq_eps_high: Optional[float] = None,
    mix: str = "mean",
    entropy: Optional[torch.Tensor] = None,
    token_weight: Optional[torch.Tensor] = None,
    cispo_w_min: Optional[float] = None,
    cispo_w_max: Optional[float] = 5.0,
    sapo_tau_pos: float = 1.0,
    sapo_tau_neg: float = 1.05,
    gmpo_eps_low: float = 0.4,
    gmpo_eps_high: float = 0.4,
    dppo_delta_low: float = 0.15,
    dppo_delta_high: float = 0.15,
    dppo_cap: float = 20.0,
    cov_ratio: Optional[float] = None,
    cov_lb: float = 1.0,
    cov_ub: float = 5.0,
    kl_cov_coef: float = 1.0,
    generator: Optional[torch.Generator] = None,
    cov_selected: Optional[torch.Tensor] = None,
) -> tuple[torch.Tensor, dict]:
    """Policy-gradient surrogate: one parametric per-token objective, every ratio level x every aggregation.

    ``surrogate`` picks the per-token objective ``J`` (the loss is ``l = -J``; docs/algorithms.md §3, §7):

    - ``clip`` (PPO, arXiv 1707.06347 Eq. 7): ``min(rho A, clip(rho, 1 - eps_low, 1 + eps_high) A)``.
      Decoupled ranges are DAPO's clip-higher (arXiv 2503.14476 Eq. 10). Dual clip (arXiv
      1912.09729), for ``A < 0`` only: ``l = min(l, -c A)``, applied to the final ``l``.
    - ``cispo`` (arXiv 2506.13585): ``sg(w) A logp``, ``w = clamp(r, cispo_w_min, cispo_w_max)``
      (absolute bounds on the IS weight; None = no bound): no token is dropped.
    - ``sapo`` (arXiv 2511.20347): ``(4/tau) sigmoid(tau (r - 1)) A``, ``tau = sapo_tau_pos`` if
      ``A > 0`` else ``sapo_tau_neg``; gradient ``4p(1-p) r A`` (no hard clip).
    - ``gmpo`` (arXiv 2507.20673): ``A_i exp((1/|o_i|) sum_t d~_t)`` on each token of response i,
      ``d = log r`` clipped in log space before the mean: ``min(d, gmpo_eps_high)`` if ``A_i > 0``,
      ``max(d, -gmpo_eps_low)`` if ``A_i < 0`` (``A_i`` = the row's mean advantage).
    - ``dppo-tv`` / ``dppo-kl`` (arXiv 2602.04879): ``sg(min(r, dppo_cap)) A logp`` on tokens inside
      the binary-TV / binary-KL trust region of ``p = pi(o_t)`` around ``mu = pi_old(o_t)``
      (``A > 0``: masked iff ``p - mu > delta_high`` / ``D > delta_high and p > mu``; ``A <= 0``:
      iff ``p - mu < -delta_low`` / ``D > delta_low and p < mu``).
    - ``clip-cov`` / ``kl-cov`` (arXiv 2505.22617): the clip with the :func:`cov_selection` tokens
      removed; ``r A`` (no clip) minus ``kl_cov_coef |log r|`` on the selected tokens.

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
        ``clip`` takes every level, ``sapo`` the first three, the others ``token``.

    ``token_weight`` (``[B, T]``, constant) multiplies the per-token loss before aggregation (the
    normaliser is unchanged): the rollout-mismatch weights of :func:`mismatch_weights`, the
    :func:`entropy_mask`, or their product. A KL term added by the caller is not weighted.
    The aggregation mode is honoured by every surrogate (the loss is always built per token,
    then reduced by :func:`aggregate`); GMPO's and GSPO's per-response value is repeated on
    each token, so ``seq-mean-token-mean`` gives their mean over responses.

    Args:
        logp: ``[B, T]`` current log-probs (carries the gradient).
        old_logp: ``[B, T]`` rollout log-probs (constant).
        advantages: ``[B]`` per response or ``[B, T]`` per token (constant).
        mask: ``[B, T]`` real-token mask.
        surrogate: one of :data:`SURROGATES`.
        ratio: one of :data:`RATIO_LEVELS`.
        eps_low, eps_high: clip range of ``rho`` (token branch for hybrid; Clip-Cov's PPO range); >= 0.
        dual_clip: ``c > 1`` or None (off); ``clip`` only.
        aggregation, horizon, total_tokens, total_seqs, group_size, group_tokens: see :func:`aggregate`.
        seq_eps_low, seq_eps_high: the sequence branch's range; required for hybrid,
            ignored for the other levels.
        mix: ``"mean"`` or ``"entropy"`` (hybrid only).
        entropy: ``[B, T]`` per-token entropy divided by ``log|V|``; required for
            ``mix="entropy"`` with hybrid.
        token_weight: ``[B, T]`` constant weight, or None.
        cispo_*, sapo_*, gmpo_*, dppo_*, cov_*, kl_cov_coef: the surrogates' knobs (defaults:
            docs/algorithms.md §7); ``cov_ratio=None`` takes :data:`COV_RATIO_DEFAULTS`.
        generator: Clip-Cov's random draw.
        cov_selected: bool ``[B, T]`` from :func:`cov_selection` on the whole batch (micro-batching);
            None selects on the rows passed.

    Returns:
        ``(loss, metrics)``: 0-d loss tensor; metrics are python floats computed on
        *this* (micro-)batch: ``clip_frac_low`` (``rho < 1-eps_low`` and ``A < 0``),
        ``clip_frac_high`` (``rho > 1+eps_high`` and ``A > 0``) (PPO's region for every surrogate,
        so that surrogates compare), ``dual_clip_frac`` (dual bound active), all over real
        tokens; ``ratio_mean/min/max`` of ``rho`` over real tokens (the token ratio for
        hybrid); ``seq_ratio_mean/min/max`` of ``s_i`` over non-empty responses; ``approx_kl``
        masked mean of ``-(logp - old_logp)`` per token; ``objective_per_token`` token-mean of
        ``-l``; ``objective_per_response`` seq-mean-token-mean of ``-l`` (local counts, not
        total_*). For hybrid also ``seq_clip_frac_low/high`` and ``mix_weight_mean``; each
        surrogate adds :data:`SURROGATE_METRICS`; with ``token_weight``, ``token_weight_mean``.
        With no real tokens: fractions/KL/objectives 0, ratios 1.
    """
    knobs = dict(
        surrogate=surrogate,
        ratio=ratio,
        eps_low=eps_low,
        eps_high=eps_high,
        seq_eps_low=seq_eps_low,
        seq_eps_high=seq_eps_high,
        mix=mix,
        entropy=entropy,
        cispo_w_min=cispo_w_min,
        cispo_w_max=cispo_w_max,
        sapo_tau_pos=sapo_tau_pos,
        sapo_tau_neg=sapo_tau_neg,
        gmpo_eps_low=gmpo_eps_low,
        gmpo_eps_high=gmpo_eps_high,
        dppo_delta_low=dppo_delta_low,
        dppo_delta_high=dppo_delta_high,
        dppo_cap=dppo_cap,
        cov_ratio=cov_ratio,
        cov_lb=cov_lb,
        cov_ub=cov_ub,
        kl_cov_coef=kl_cov_coef,
        cov_selected=cov_selected,
    )
    # ---- validation: name the knob and what it accepts
    _one_of("ratio", ratio, RATIO_LEVELS)
    _one_of("aggregation", aggregation, AGGREGATIONS)
    _one_of("mix", mix, MIXES)
    _check_nonneg("eps_low", eps_low)
    _check_nonneg("eps_high", eps_high)
    if dual_clip is not None and not (dual_clip > 1):
        raise ValueError(f"dual_clip must be > 1 (or None to disable), got {dual_clip!r}")
    _check_surrogate(surrogate, ratio, dual_clip, knobs)
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
    tok = _tokens(logp, old_logp, advantages, mask, "token" if ratio == "hybrid" else ratio)
    real = tok.real
    weight = None if token_weight is None else _constant_like(token_weight, tok, "token_weight")
    if surrogate in COV_SURROGATES:
        if cov_selected is None:
            with torch.no_grad():
                knobs["cov_selected"] = _cov_select(tok, surrogate, knobs, generator)
        else:
            knobs["cov_selected"] = _constant_like(cov_selected, tok, "cov_selected").bool() & real

    # ---- the per-token surrogate
    objective, extra = _OBJECTIVES[surrogate](tok, knobs)
    loss_mat = -objective
    dual_active = torch.zeros_like(real)
    if dual_clip is not None:
        bound = -dual_clip * tok.adv
        dual_active = (tok.adv < 0) & (loss_mat > bound)
        loss_mat = torch.where(dual_active, bound, loss_mat)  # constant: zero gradient there
    if weight is not None:
        loss_mat = loss_mat * weight
    loss_mat = _zero_pad(real, loss_mat)
    dual_active = dual_active & real

    loss = aggregate(
        loss_mat,
        real,
        aggregation,
        horizon=horizon,
        total_tokens=total_tokens,
        total_seqs=total_seqs,
        group_size=group_size,
        group_tokens=group_tokens,
    )

    # ---- metrics (local batch, python floats)
    with torch.no_grad():
        metrics = _policy_metrics(tok, loss_mat, dual_active, eps_low, eps_high)
        metrics.update(extra)
        if weight is not None:
            metrics["token_weight_mean"] = tok.mean(weight)
    return loss, metrics


def _constant_like(x: torch.Tensor, t: _Tokens, name: str) -> torch.Tensor:
    """A constant per-token input (weight, selection): shape-checked, detached, 0 at padding."""
    if tuple(x.shape) != tuple(t.real.shape):
        raise ValueError(f"{name} must be [B, T] = {tuple(t.real.shape)} (like the log-probs), got {tuple(x.shape)}")
    x = x.detach()
    if x.dtype == torch.bool:
        return x & t.real
    return _zero_pad(t.real, x.to(t.logp.dtype))


def _policy_metrics(t: _Tokens, loss_mat, dual_active, eps_low: float, eps_high: float) -> dict:
    """The metrics every surrogate reports (see :func:`policy_loss`)."""
    real, rho, adv = t.real, t.rho, t.adv
    log_r = t.logp.detach() - t.old
    metrics = {
        "clip_frac_low": t.frac((rho < 1.0 - eps_low) & (adv < 0)),
        "clip_frac_high": t.frac((rho > 1.0 + eps_high) & (adv > 0)),
        "dual_clip_frac": t.frac(dual_active),
        "approx_kl": float(_masked_mean(-log_r, real)),
        "objective_per_token": float(aggregate(-loss_mat.detach(), real, "token-mean")),
        "objective_per_response": float(aggregate(-loss_mat.detach(), real, "seq-mean-token-mean")),
    }
    metrics.update(_ratio_stats("ratio", rho, real))
    log_s_i = _seq_mean(log_r, real).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    metrics.update(_ratio_stats("seq_ratio", torch.exp(log_s_i), real.any(dim=-1)))
    return metrics


def _ratio_stats(prefix: str, x: torch.Tensor, real: torch.Tensor) -> dict:
    if not bool(real.any()):
        return {f"{prefix}_mean": 1.0, f"{prefix}_min": 1.0, f"{prefix}_max": 1.0}
    vals = x[real]
    return {
        f"{prefix}_mean": float(vals.mean()),
        f"{prefix}_min": float(vals.min()),
        f"{prefix}_max": float(vals.max()),
    }


# ---------------------------------------------------------------- token weights: rollout mismatch, top-entropy mask


def mismatch_weights(
    old_logp: torch.Tensor,
    sampler_logp: torch.Tensor,
    mask: torch.Tensor,
    *,
    mode: str,
    c_min: Optional[float] = None,
    c_max: Optional[float] = None,
) -> tuple[torch.Tensor, dict]:
    """Rollout/trainer mismatch correction: a constant per-token weight for :func:`policy_loss`'s ``token_weight``.

    ``rho_t = exp(old_logp - sampler_logp)``: the trainer's recomputed log-prob of the sampled token over the
    sampler's, same weights, two engines (TIS / IcePop / TRL ``vllm_importance_sampling``):

    - ``token-truncate``: ``clamp(rho_t, c_min, c_max)`` (verl's TIS ``min(rho, C)`` when ``c_min=None``).
    - ``token-mask``: ``rho_t * 1[c_min <= rho_t <= c_max]``.
    - ``sequence-truncate``: ``clamp(prod_t rho_t, c_min, c_max)`` on every token of the row.
    - ``sequence-mask``: ``prod_t rho_t * 1[c_min <= prod_t rho_t <= c_max]`` on every token (TRL's
      default mode; the product over tokens, not GSPO's geometric mean, so long rows are masked first).
    - ``icepop`` (arXiv 2510.18855): ``rho_t * 1[c_min <= rho_t <= c_max]``, default ``[0.5, 5]``.

    ``c_min=None`` / ``c_max=None`` take the mode's default (:data:`MISMATCH_DEFAULTS`: no lower bound and
    ``C = 2`` for TRL's four, ``[0.5, 5]`` for IcePop); for TRL's four ``c_min=None`` means no lower bound.

    Args:
        old_logp: ``[B, T]`` log-probs recomputed by the trainer (constant).
        sampler_logp: ``[B, T]`` the sampler's log-probs of the same tokens (constant).
        mask: ``[B, T]`` real-token mask.

    Returns:
        ``(weights, metrics)``: weights ``[B, T]`` (0 at padding, no gradient); metrics
        ``mismatch_weight_mean``, ``mismatch_masked_frac`` (weight set to 0 by a mask),
        ``mismatch_truncated_frac`` (weight clamped), ``mismatch_logp_gap_mean`` / ``_max``
        (mean and max ``|old_logp - sampler_logp|``), over real tokens.
    """
    _one_of("mode", mode, MISMATCH_MODES)
    lo, hi = _mismatch_bounds(mode, c_min, c_max)
    if old_logp.shape != sampler_logp.shape or old_logp.dim() != 2:
        raise ValueError(
            f"old_logp and sampler_logp must both be [B, T], got {tuple(old_logp.shape)} and {tuple(sampler_logp.shape)}"
        )
    real = _real(mask, old_logp.shape)
    dt = _dtype(old_logp, sampler_logp)
    with torch.no_grad():
        gap = _zero_pad(real, old_logp.detach().to(dt) - sampler_logp.detach().to(dt))
        if mode.startswith("sequence"):
            gap_used = gap.sum(dim=-1, keepdim=True).expand_as(gap)  # log prod_t rho_t
        else:
            gap_used = gap
        rho = torch.exp(gap_used)  # may be inf for a huge product: clamped or masked below, never multiplied
        inside = (rho <= hi) & (rho >= (lo if lo is not None else 0.0))
        zero = torch.zeros((), dtype=dt, device=rho.device)
        if mode.endswith("truncate"):
            w = rho.clamp(min=lo, max=hi)
            masked = torch.zeros_like(real)
            truncated = ~inside
        else:
            w = torch.where(inside, rho, zero)
            masked = ~inside
            truncated = torch.zeros_like(real)
        w = _zero_pad(real, w)
        t = _Tokens(logp=gap, old=gap, adv=gap, real=real, log_rho=gap, rho=rho)  # for frac/mean only
        abs_gap = gap.abs()
        metrics = {
            "mismatch_weight_mean": t.mean(w),
            "mismatch_masked_frac": t.frac(masked),
            "mismatch_truncated_frac": t.frac(truncated),
            "mismatch_logp_gap_mean": t.mean(abs_gap),
            "mismatch_logp_gap_max": float(abs_gap[real].max()) if bool(real.any()) else 0.0,
        }
    return w, metrics


def _check_quantile(quantile) -> float:
    if isinstance(quantile, bool) or quantile is None or not (0 <= quantile <= 1):
        raise ValueError(
            f"quantile must be in [0, 1] (the share of highest-entropy tokens kept; 1 keeps all), got {quantile!r}"
        )
    return float(quantile)


def entropy_threshold(entropy: torch.Tensor, mask: torch.Tensor, *, quantile: float = 0.2) -> torch.Tensor:
    """The ``(1 - quantile)`` quantile of the real tokens' entropies (linear interpolation, as ``torch.quantile``;
    sorted here, so any batch size works). 0-d; ``+inf`` with no real token (nothing kept)."""
    q = _check_quantile(quantile)
    real = _real(mask, entropy.shape, "mask")
    vals = entropy.detach().to(_dtype(entropy))[real]
    if vals.numel() == 0:
        return torch.tensor(float("inf"), dtype=vals.dtype, device=vals.device)
    srt = torch.sort(vals).values
    pos = (1.0 - q) * (srt.numel() - 1)
    lo = int(math.floor(pos))
    hi = min(lo + 1, srt.numel() - 1)
    return srt[lo] + (pos - lo) * (srt[hi] - srt[lo])


def entropy_mask(entropy: torch.Tensor, mask: torch.Tensor, *, quantile: float = 0.2) -> torch.Tensor:
    """Top-entropy tokens (arXiv 2506.01939, the "80/20" rule; TRL ``top_entropy_quantile``).

    Keeps the real tokens whose entropy is at or above :func:`entropy_threshold` of all real tokens
    passed (ties kept, so more than ``quantile * N`` may pass); ``quantile=1`` keeps every real token,
    ``0`` only those tied with the maximum. Pass the tokens of one optimizer step (the paper's batch;
    TRL's micro-batch only without gradient accumulation) and use the result as ``token_weight``:
    the loss's normaliser is unchanged. Constant (no gradient).

    Returns:
        bool ``[B, T]``.
    """
    real = _real(mask, entropy.shape, "mask")
    thr = entropy_threshold(entropy, real, quantile=quantile)
    return (entropy.detach().to(thr.dtype) >= thr) & real


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
    group_size: Optional[int] = None,
    group_tokens: Optional[torch.Tensor] = None,
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
        aggregation, horizon, total_tokens, total_seqs, group_size, group_tokens: see :func:`aggregate`.

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
    loss = aggregate(
        loss_mat,
        real,
        aggregation,
        horizon=horizon,
        total_tokens=total_tokens,
        total_seqs=total_seqs,
        group_size=group_size,
        group_tokens=group_tokens,
    )
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
