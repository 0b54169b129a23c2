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
from typing import Any, Optional, Union

import torch

from rlcompare.algos.advantages import informative_groups  # listed under losses in the issue
from rlcompare.algos.accepted import (  # the accepted names and knob defaults, torch-free (config imports them)
    RATIO_LEVELS,
    AGGREGATIONS,
    KL_ESTIMATORS,
    MIXES,
    COV_RATIO_DEFAULTS,
    MISMATCH_MODES,
    MISMATCH_DEFAULTS,
    check_surrogate_knobs,
    check_mismatch_bounds,
    _one_of,
    _check_nonneg,
    _mismatch_bounds,
)
from rlcompare.algos import accepted, surrogate_specs, surrogates
from rlcompare.algos.ratios import (  # the masked helpers and the ratio (losses.log_ratio stays public)
    LOG_RATIO_CLAMP,
    TokenRatios,
    _dtype,
    _masked_mean,
    _real,
    _seq_mean,
    _zero_pad,
    constant_like,
    log_ratio,
    token_ratios,
)
from rlcompare.algos.surrogates import SURROGATE_REGISTRY, register_surrogate, token_covariance

# (and accepted.DERIVED_NAMES, SURROGATES ... COV_SURROGATES, through __getattr__: derived from the specs on access)
__all__ = [
    "RATIO_LEVELS",
    "AGGREGATIONS",
    "KL_ESTIMATORS",
    "MIXES",
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
    "PolicySettings",
    "Normalizers",
    "SURROGATE_REGISTRY",
    "register_surrogate",
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


def __getattr__(name: str):
    # the surrogates' names derive from their specs on access (a surrogate registered later is included)
    if name in accepted.DERIVED_NAMES:
        return getattr(accepted, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# verl's low_var_kl (core_algos.kl_penalty_forward): ref - logp clamped to +-20 before exp, the k3 value to
# [-10, 10] after
KL_LOG_CLAMP = 20.0
KL_VALUE_CLAMP = 10.0

Number = Union[int, float, torch.Tensor]


# ---------------------------------------------------------------- KL


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


def _check_total(name: str, value) -> None:
    if value is not None and not (value >= 0):
        raise ValueError(f"{name} must be >= 0 (the whole rollout batch's count) or None, got {value!r}")


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


@dataclass(frozen=True)
class Normalizers:
    """The totals an aggregation divides by: the whole rollout batch's, never one micro-batch's (TRL #5619,
    verl #3741); None takes the rows passed (see :func:`aggregate`)."""

    total_tokens: Optional[float] = None  # sum of the loss mask over the whole rollout batch
    total_seqs: Optional[int] = None  # B
    group_size: Optional[int] = None  # G
    horizon: Optional[float] = None  # the generation budget H (seq-mean-token-sum-norm)
    group_tokens: Optional[torch.Tensor] = None  # (b,) each row's group token count (prompt-mean-token-mean)

    def kwargs(self) -> dict:
        out: dict = dict(
            horizon=self.horizon, total_tokens=self.total_tokens, total_seqs=self.total_seqs, group_size=self.group_size
        )
        if self.group_tokens is not None:
            out["group_tokens"] = self.group_tokens
        return out


@dataclass(frozen=True)
class PolicySettings:
    """What :func:`policy_loss` computes: the surrogate, the ratio level, PPO's range (every surrogate reports its
    clip fractions, so that surrogates compare), the dual clip, and the surrogate's own typed settings
    (``surrogates.<Name>Settings``; None takes its defaults). Checked when built."""

    surrogate: str = "clip"
    ratio: str = "token"
    eps_low: float = 0.2
    eps_high: float = 0.2
    dual_clip: Optional[float] = None  # c > 1 (arXiv 1912.09729), clip only
    own: Any = None

    def __post_init__(self) -> None:
        entry = surrogates.surrogate(self.surrogate)
        if self.own is None:
            object.__setattr__(self, "own", entry.build({"eps_low": self.eps_low, "eps_high": self.eps_high}))
        elif not isinstance(self.own, entry.settings):
            raise ValueError(f"surrogate={self.surrogate!r} takes {entry.settings.__name__}, got {self.own!r}")
        for name in ("eps_low", "eps_high"):  # PPO's range is one fact: the surrogate's copy must agree
            if getattr(self.own, name, getattr(self, name)) != getattr(self, name):
                raise ValueError(
                    f"{name} is {getattr(self, name)!r} but the surrogate's settings say "
                    f"{getattr(self.own, name)!r}; build both with PolicySettings.from_knobs"
                )
        _check_policy_settings(self)

    @classmethod
    def from_knobs(
        cls, surrogate: str = "clip", ratio: str = "token", eps_low=0.2, eps_high=0.2, dual_clip=None, **own
    ):
        """From flat config keys (``algorithm.clip``'s names); the surrogate keeps the keys it reads."""
        known = accepted.SURROGATE_KNOBS  # every registered spec's knobs
        unknown = sorted(set(own) - set(known))
        if unknown:
            raise ValueError(f"unknown surrogate setting(s) {', '.join(unknown)}; known: {', '.join(known)}")
        knobs = dict(own, eps_low=eps_low, eps_high=eps_high)
        return cls(surrogate, ratio, eps_low, eps_high, dual_clip, surrogates.surrogate(surrogate).build(knobs))


def _check_policy_settings(s: PolicySettings) -> None:
    """Name the knob and what it accepts."""
    _one_of("ratio", s.ratio, RATIO_LEVELS)
    _check_nonneg("eps_low", s.eps_low)
    _check_nonneg("eps_high", s.eps_high)
    levels = surrogate_specs.spec(s.surrogate).ratio_levels
    if s.ratio not in levels:
        opts = ", ".join(repr(r) for r in levels)
        raise ValueError(f"surrogate={s.surrogate!r} takes ratio in {opts}, got {s.ratio!r}")
    if s.dual_clip is not None and s.surrogate != "clip":
        raise ValueError(
            f"dual_clip applies to surrogate='clip' only, got surrogate={s.surrogate!r}; pass dual_clip=None"
        )
    if s.dual_clip is not None and not (s.dual_clip > 1):
        raise ValueError(f"dual_clip must be > 1 (or None to disable), got {s.dual_clip!r}")
    s.own.check()  # the surrogate's own knobs, by its spec
    if s.ratio == "hybrid":
        lo, hi = s.own.seq_eps_low, s.own.seq_eps_high
        if lo is None or hi is None:
            raise ValueError(
                "ratio='hybrid' needs seq_eps_low and seq_eps_high (the sequence ratio's clip "
                f"range, e.g. 3e-4 / 4e-4), got {lo!r} / {hi!r}"
            )
        _check_nonneg("seq_eps_low", lo)
        _check_nonneg("seq_eps_high", hi)


DEFAULT_POLICY = PolicySettings()


def policy_loss(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    settings: PolicySettings = DEFAULT_POLICY,
    *,
    aggregation: str = "token-mean",
    norm: Normalizers = Normalizers(),
    entropy: Optional[torch.Tensor] = None,
    token_weight: Optional[torch.Tensor] = None,
    cov_selected: Optional[torch.Tensor] = None,
    generator: Optional[torch.Generator] = None,
) -> tuple[torch.Tensor, dict]:
    """The policy-gradient loss of one (micro-)batch: ratio -> surrogate -> dual clip -> token weight ->
    aggregation (docs/algorithms.md §3-§7; each surrogate's formula is in its docstring, ``surrogates.py``).

    logp (B, T): current log-probs, with the graph; old_logp (B, T): the rollout policy's (constant);
    advantages (B,) or (B, T); mask (B, T): the tokens the loss counts. settings: :class:`PolicySettings`.
    aggregation, norm: :func:`aggregate`'s mode and totals. entropy (B, T): H / log|V|, DHPO's ``mix="entropy"``
    weight. token_weight (B, T): constant per-token factor (mismatch weights, top-entropy mask), the normaliser
    unchanged. cov_selected (B, T): Clip-Cov / KL-Cov's tokens selected on the whole batch
    (:func:`cov_selection`; None selects on these rows with ``generator``).

    Returns ``(loss, metrics)``: metrics are floats on *these* rows: PPO's clip fractions ``clip_frac_low``
    (``rho < 1-eps_low``, A < 0) / ``clip_frac_high`` (``rho > 1+eps_high``, A > 0) for every surrogate,
    ``dual_clip_frac``, ``ratio_*`` (the token ratio), ``seq_ratio_*`` (GSPO's ``s_i``), ``approx_kl``,
    ``objective_per_token`` / ``objective_per_response``, the surrogate's own (``SURROGATE_METRICS``) and
    ``token_weight_mean``. With no real tokens: fractions, KL and objectives 0, ratios 1."""
    _one_of("aggregation", aggregation, AGGREGATIONS)
    tok = token_ratios(logp, old_logp, advantages, mask, settings.ratio)
    if settings.ratio == "hybrid" and settings.own.mix == "entropy":
        if entropy is None:
            raise ValueError("mix='entropy' needs entropy ([B, T] H / log|V|); pass entropy=... or use mix='mean'")
        tok.entropy = constant_like(entropy, tok, "entropy")
    if surrogate_specs.spec(settings.surrogate).selects_tokens:
        if cov_selected is None:
            with torch.no_grad():
                tok.selected = surrogates.select_tokens(tok, settings.surrogate, settings.own, generator)
        else:
            tok.selected = constant_like(cov_selected, tok, "cov_selected").bool() & tok.real
    objective, extra = surrogates.surrogate(settings.surrogate).objective(tok, settings.own)
    loss_mat = -objective
    dual_active = torch.zeros_like(tok.real)
    if settings.dual_clip is not None:  # A < 0 only: l = min(l, -c A), a constant there (zero gradient)
        bound = -settings.dual_clip * tok.adv
        dual_active = (tok.adv < 0) & (loss_mat > bound) & tok.real
        loss_mat = torch.where(dual_active, bound, loss_mat)
    weight = None if token_weight is None else constant_like(token_weight, tok, "token_weight")
    if weight is not None:
        loss_mat = loss_mat * weight
    loss_mat = _zero_pad(tok.real, loss_mat)
    loss = aggregate(loss_mat, tok.real, aggregation, **norm.kwargs())
    with torch.no_grad():
        metrics = _policy_metrics(tok, loss_mat, dual_active, settings.eps_low, settings.eps_high)
        metrics.update(extra)
        if weight is not None:
            metrics["token_weight_mean"] = tok.mean(weight)
    return loss, metrics


def cov_selection(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    settings: PolicySettings,
    *,
    generator: Optional[torch.Generator] = None,
) -> torch.Tensor:
    """The tokens Clip-Cov removes or KL-Cov penalises (arXiv 2505.22617; verl ``clip_cov`` / ``kl_cov``), bool
    ``[B, T]`` (False at padding), over the real tokens passed (``N``): ``n = max(int(cov_ratio N), 1)`` tokens;
    ``kl-cov`` the ``n`` largest :func:`token_covariance`; ``clip-cov`` ``n`` drawn uniformly
    (``torch.randperm`` with ``generator``) among the tokens PPO did not clip whose covariance lies in
    ``(cov_lb, cov_ub)`` (all of them if fewer). ``cov_ratio=None`` takes :data:`COV_RATIO_DEFAULTS`. Compute it
    on the whole (mini-)batch of one optimizer step and pass slices as ``policy_loss(cov_selected=...)`` to make
    micro-batches exact (verl and the authors select per micro-batch)."""
    with torch.no_grad():  # select_tokens names the selecting surrogates when this one is none of them
        t = token_ratios(logp.detach(), old_logp, advantages, mask, "token")
        return surrogates.select_tokens(t, settings.surrogate, settings.own, generator)


# the row names of the metrics every surrogate reports (docs/metrics.md); a surrogate's own metrics (its spec's) and
# any other name policy_loss reports reach the row as policy/<name>, a name with a "/" as itself
ROW_NAMES = {
    "objective_per_token": "objective/per_token",
    "objective_per_response": "objective/per_response",
    "clip_frac_low": "clip/frac_low",
    "clip_frac_high": "clip/frac_high",
    "dual_clip_frac": "clip/dual_frac",
    "ratio_mean": "ratio/mean",
    "ratio_min": "ratio/min",
    "ratio_max": "ratio/max",
    "approx_kl": "kl/rollout",
}
SEQ_RATIO_NAMES = {
    "seq_ratio_mean": "ratio/seq_mean",
    "seq_ratio_min": "ratio/seq_min",
    "seq_ratio_max": "ratio/seq_max",
}


def _policy_metrics(t: TokenRatios, loss_mat, dual_active, eps_low: float, eps_high: float) -> dict:
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
        t = TokenRatios(logp=gap, old=gap, adv=gap, real=real, log_rho=gap, rho=rho)  # for frac/mean only
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
