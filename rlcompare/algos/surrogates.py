"""The policy surrogates: one registered pure function per per-token objective ``J`` (the loss is ``-J``).

Each surrogate reads the shared :class:`~rlcompare.algos.ratios.TokenRatios` (ratio, advantages, mask) and its own
typed settings, the settings class of its spec (``surrogate_specs.py``: the one declaration of its name, knobs,
checks, metrics and ratio levels); it returns ``(J [B, T], extra metrics)``, the extras being what it clips, masks
or gates (the spec's ``metrics``). ``losses.policy_loss`` applies the dual clip, the token weight and the
aggregation around it. Formulas and worked numbers: docs/algorithms.md §3 and §7.

Adding a surrogate: its spec and a function decorated with ``@register_surrogate(spec)``, in one file
(``examples/shifted_clip.py``; docs/api.md "Adding a surrogate").
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Mapping, Optional

import torch

from rlcompare import registry
from rlcompare.algos import surrogate_specs
from rlcompare.algos.ratios import TokenRatios, _masked_mean, _seq_mean, _zero_pad, log_ratio, token_ratios
from rlcompare.algos.surrogate_specs import (  # noqa: F401 (the settings classes, importable from here as before)
    COV_RATIO_DEFAULTS,
    ClipCovSettings,
    ClipSettings,
    CispoSettings,
    DppoSettings,
    GmpoSettings,
    KlCovSettings,
    SapoSettings,
    SurrogateSpec,
)

Objective = Callable[[TokenRatios, object], tuple[torch.Tensor, dict]]
# the tokens a selecting surrogate restricts (spec.selects_tokens), chosen over one optimizer step's rows
Selection = Callable[[TokenRatios, object, Optional[torch.Generator]], torch.Tensor]


@dataclass(frozen=True)
class Surrogate:
    """A registered surrogate: its objective, the dataclass of the settings it reads (its spec's) and, when its
    spec selects tokens, the selection."""

    name: str
    objective: Objective
    settings: type
    select: Optional[Selection] = None

    def build(self, knobs: Mapping) -> object:
        """Its settings from a flat mapping of config keys (absent keys take the dataclass defaults)."""
        return surrogate_specs.spec(self.name).build(knobs)


SURROGATE_REGISTRY: dict[str, Surrogate] = {}


def register_surrogate(
    spec: "str | SurrogateSpec", select: Optional[Selection] = None
) -> Callable[[Objective], Objective]:
    """Register ``fn(tokens, settings) -> (J, extra)`` as the math of ``spec`` (verl's ``@register_policy_loss``):
    a registered spec's name, or a :class:`SurrogateSpec`, registered here too (what the config accepts).
    ``select(tokens, settings, generator) -> bool [B, T]``: the tokens it restricts, when the spec selects tokens.
    A name another module registered is refused, naming both modules (``rlcompare.registry``)."""
    entry = surrogate_specs.spec(spec) if isinstance(spec, str) else spec
    if entry.selects_tokens != (select is not None):
        raise ValueError(f"surrogate {entry.name!r}: pass select=... exactly when its spec has selects_tokens=True")

    def wrap(fn: Objective) -> Objective:
        if isinstance(spec, SurrogateSpec):
            surrogate_specs.register_spec(spec, module=fn.__module__)
        registry.claim("surrogate function", entry.name, fn.__module__)
        SURROGATE_REGISTRY[entry.name] = Surrogate(entry.name, fn, entry.settings, select)
        return fn

    return wrap


def surrogate(name: str) -> Surrogate:
    if name not in SURROGATE_REGISTRY:
        opts = ", ".join(repr(a) for a in SURROGATE_REGISTRY)
        raise ValueError(f"surrogate must be one of {opts}, got {name!r}")
    return SURROGATE_REGISTRY[name]


def clipped_surrogate(ratio: torch.Tensor, adv: torch.Tensor, eps_low: float, eps_high: float) -> torch.Tensor:
    """``min(rho A, clip(rho, 1-eps_low, 1+eps_high) A)``, per token."""
    unclipped = ratio * adv
    clipped = ratio.clamp(1.0 - eps_low, 1.0 + eps_high) * adv
    # ties go to the unclipped branch so that the gradient flows (e.g. on-policy, rho = 1)
    return torch.where(clipped < unclipped, clipped, unclipped)


# ---------------------------------------------------------------- clip (PPO, DAPO, GSPO, DHPO)


@register_surrogate("clip")
def clip_objective(t: TokenRatios, s: ClipSettings) -> tuple[torch.Tensor, dict]:
    """PPO (arXiv 1707.06347 Eq. 7), DAPO's decoupled range (arXiv 2503.14476 Eq. 10), and GSPO through the
    ratio level: ``min(rho A, clip(rho, 1 - eps_low, 1 + eps_high) A)``.

    DHPO (``ratio="hybrid"``, arXiv 2601.05607 as read by rlcompare, docs/algorithms.md §6):
    ``w J_token + (1 - w) J_seq``, ``J_seq`` the same clip on GSPO's ``s_i`` with the sequence range."""
    obj = clipped_surrogate(t.rho, t.adv, s.eps_low, s.eps_high)
    if t.level != "hybrid":
        return obj, {}
    s_i = torch.exp(log_ratio(t.logp, t.old, t.real, level="sequence"))
    seq_obj = clipped_surrogate(s_i, t.adv, s.seq_eps_low, s.seq_eps_high)
    if s.mix == "mean":
        w = torch.full_like(t.rho, 0.5)
    else:
        w = _zero_pad(t.real, t.entropy.to(t.rho.dtype).clamp(0.0, 1.0))
    extra = {
        "seq_clip_frac_low": t.frac((s_i < 1.0 - s.seq_eps_low) & (t.adv < 0)),
        "seq_clip_frac_high": t.frac((s_i > 1.0 + s.seq_eps_high) & (t.adv > 0)),
        "mix_weight_mean": t.mean(w),
    }
    return w * obj + (1.0 - w) * seq_obj, extra


def _is_weighted_pg(t: TokenRatios, w: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    """``sg(w) A logp`` on the kept tokens: a policy gradient whose IS weight is a constant (CISPO, DPPO)."""
    return torch.where(keep & t.real, w.detach() * t.adv * t.logp, torch.zeros((), dtype=t.logp.dtype))


# ---------------------------------------------------------------- CISPO


@register_surrogate("cispo")
def cispo_objective(t: TokenRatios, s: CispoSettings) -> tuple[torch.Tensor, dict]:
    """CISPO (MiniMax-M1, arXiv 2506.13585 Eq. 4-5): ``sg(clip(r, w_min, w_max)) A logp``; no token dropped."""
    lo, hi = s.cispo_w_min, s.cispo_w_max
    rho = t.rho.detach()
    w = rho if lo is None and hi is None else rho.clamp(min=lo, max=hi)
    extra = {
        "is_weight_mean": t.mean(w),
        "is_clip_frac_low": t.frac(rho < lo) if lo is not None else 0.0,
        "is_clip_frac_high": t.frac(rho > hi) if hi is not None else 0.0,
    }
    return _is_weighted_pg(t, w, t.real), extra


# ---------------------------------------------------------------- SAPO


@register_surrogate("sapo")
def sapo_objective(t: TokenRatios, s: SapoSettings) -> tuple[torch.Tensor, dict]:
    """SAPO (arXiv 2511.20347): soft gate ``(4/tau) sigmoid(tau (r - 1)) A``, tau by the sign of A; its gradient
    ``4p(1-p) r A`` (no hard clip)."""
    tau = torch.where(t.adv > 0, torch.full_like(t.rho, s.sapo_tau_pos), torch.full_like(t.rho, s.sapo_tau_neg))
    p = torch.sigmoid(tau * (t.rho - 1.0))
    weight = 4.0 * p.detach() * (1.0 - p.detach())  # d gate / d r: 1 at r = 1, decays smoothly
    return p * (4.0 / tau) * t.adv, {"sapo_weight_mean": t.mean(weight)}


# ---------------------------------------------------------------- GMPO


@register_surrogate("gmpo")
def gmpo_objective(t: TokenRatios, s: GmpoSettings) -> tuple[torch.Tensor, dict]:
    """GMPO (arXiv 2507.20673): ``A_i exp(mean_t clip(log r))``, each token's log-ratio clipped one-sided by the
    sign of A_i *before* the geometric mean; the value is the response's, on each of its tokens."""
    a_i = _seq_mean(t.adv, t.real)  # the response's advantage (verl: sequence-level advantages only)
    pos, neg = (a_i > 0).unsqueeze(-1), (a_i < 0).unsqueeze(-1)
    d = t.log_rho
    d_clip = torch.where(pos, d.clamp(max=s.gmpo_eps_high), torch.where(neg, d.clamp(min=-s.gmpo_eps_low), d))
    ratio = torch.exp(_seq_mean(d_clip, t.real))  # [B]
    clipped = (pos & (d > s.gmpo_eps_high)) | (neg & (d < -s.gmpo_eps_low))
    rows = t.real.any(dim=-1)
    extra = {
        "gmpo_clip_frac": t.frac(clipped),
        "gmpo_ratio_mean": float(ratio.detach()[rows].mean()) if bool(rows.any()) else 1.0,
    }
    return _zero_pad(t.real, (a_i * ratio).unsqueeze(-1).expand_as(d)), extra


# ---------------------------------------------------------------- DPPO


def _binary_kl(mu: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
    """KL(Bernoulli(mu) || Bernoulli(p)); xlogy keeps 0 log 0 = 0."""
    return (torch.xlogy(mu, mu) - torch.xlogy(mu, p)) + (torch.xlogy(1 - mu, 1 - mu) - torch.xlogy(1 - mu, 1 - p))


def _dppo(t: TokenRatios, s: DppoSettings, up: torch.Tensor, down: torch.Tensor) -> tuple[torch.Tensor, dict]:
    """``sg(min(r, C)) A logp`` on the tokens inside the trust region (``up`` masks A > 0, ``down`` A <= 0)."""
    masked = torch.where(t.adv > 0, up, down) & t.real
    rho = t.rho.detach()
    w = rho.clamp(max=s.dppo_cap)
    extra = {
        "dppo_mask_frac": t.frac(masked),
        "is_weight_mean": t.mean(w),
        "is_clip_frac_high": t.frac(rho > s.dppo_cap),
    }
    return _is_weighted_pg(t, w, ~masked), extra


@register_surrogate("dppo-tv")
def dppo_tv_objective(t: TokenRatios, s: DppoSettings) -> tuple[torch.Tensor, dict]:
    """DPPO-TV (arXiv 2602.04879; Stable-RL / verl), on the sampled token's binary distribution ``p = pi(o_t)``
    around ``mu = pi_old(o_t)``: masked iff ``p - mu > delta_high`` (A > 0) or ``p - mu < -delta_low``."""
    p, mu = torch.exp(t.logp.detach()), torch.exp(t.old)
    return _dppo(t, s, (p - mu) > s.dppo_delta_high, (p - mu) < -s.dppo_delta_low)


@register_surrogate("dppo-kl")
def dppo_kl_objective(t: TokenRatios, s: DppoSettings) -> tuple[torch.Tensor, dict]:
    """DPPO-KL (arXiv 2602.04879): masked iff ``D = KL(Bern(mu) || Bern(p)) > delta_high`` and ``p > mu``
    (A > 0), or ``D > delta_low`` and ``p < mu`` (A <= 0)."""
    p, mu = torch.exp(t.logp.detach()), torch.exp(t.old)
    div = _binary_kl(mu, p)
    return _dppo(t, s, (div > s.dppo_delta_high) & (p > mu), (div > s.dppo_delta_low) & (p < mu))


# ---------------------------------------------------------------- Clip-Cov / KL-Cov


def token_covariance(logp: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``Cov[i, t] = (A - mean A)(logp - mean logp)``, both means over the real tokens passed (arXiv
    2505.22617; entropy falls in proportion to it). Detached; 0 at padding. ``advantages`` ``[B]`` or ``[B, T]``."""
    t = token_ratios(logp.detach(), logp.detach(), advantages, mask, "token")
    centred_adv = t.adv - _masked_mean(t.adv, t.real)
    centred_logp = t.logp - _masked_mean(t.logp, t.real)
    return _zero_pad(t.real, centred_adv * centred_logp)


def _cov_count(ratio: float, n_real: int) -> int:
    # verl / the authors: max(int(ratio * N), 1), N = real tokens passed
    return max(int(ratio * n_real), 1)


def select_kl_cov(t: TokenRatios, s: KlCovSettings, generator: Optional[torch.Generator] = None) -> torch.Tensor:
    """The tokens KL-Cov penalises: the ``n`` largest covariances, ``n = max(int(cov_ratio N), 1)``; bool ``[B, T]``."""
    ratio = COV_RATIO_DEFAULTS["kl-cov"] if s.cov_ratio is None else s.cov_ratio
    cov = token_covariance(t.logp, t.adv, t.real)
    n_real = int(t.real.sum())
    selected = torch.zeros_like(t.real)
    if n_real == 0:
        return selected
    n = _cov_count(ratio, n_real)
    # the n largest covariances (torch.topk, as verl)
    flat_idx = torch.nonzero(t.real.reshape(-1), as_tuple=True)[0]
    top = torch.topk(cov.reshape(-1)[flat_idx], min(n, n_real), largest=True).indices
    selected.reshape(-1)[flat_idx[top]] = True
    return selected


def select_clip_cov(t: TokenRatios, s: ClipCovSettings, generator: Optional[torch.Generator] = None) -> torch.Tensor:
    """The tokens Clip-Cov removes: ``n = max(int(cov_ratio N), 1)`` drawn uniformly among those PPO did not clip
    with ``lb < Cov < ub`` (all of them if fewer); bool ``[B, T]``."""
    ratio = COV_RATIO_DEFAULTS["clip-cov"] if s.cov_ratio is None else s.cov_ratio
    cov = token_covariance(t.logp, t.adv, t.real)
    n_real = int(t.real.sum())
    selected = torch.zeros_like(t.real)
    if n_real == 0:
        return selected
    n = _cov_count(ratio, n_real)
    # n drawn uniformly (torch.randperm, as verl) among tokens PPO did not clip with lb < Cov < ub
    clipped = t.rho.clamp(1.0 - s.eps_low, 1.0 + s.eps_high) * t.adv < t.rho * t.adv
    candidates = t.real & ~clipped & (cov > s.cov_lb) & (cov < s.cov_ub)
    idx = torch.nonzero(candidates)  # row-major, as verl
    if len(idx):
        gen_device = generator.device if generator is not None else "cpu"
        perm = torch.randperm(len(idx), generator=generator, device=gen_device).to(idx.device)
        chosen = idx[perm[: min(n, len(idx))]]
        selected[chosen[:, 0], chosen[:, 1]] = True
    return selected


@register_surrogate("clip-cov", select=select_clip_cov)
def clip_cov_objective(t: TokenRatios, s: ClipCovSettings) -> tuple[torch.Tensor, dict]:
    """Clip-Cov (arXiv 2505.22617): the PPO clip, with the selected high-covariance tokens removed (value and
    gradient)."""
    obj = clipped_surrogate(t.rho, t.adv, s.eps_low, s.eps_high)
    return torch.where(t.selected, torch.zeros((), dtype=obj.dtype), obj), {"cov_selected_frac": t.frac(t.selected)}


@register_surrogate("kl-cov", select=select_kl_cov)
def kl_cov_objective(t: TokenRatios, s: KlCovSettings) -> tuple[torch.Tensor, dict]:
    """KL-Cov (arXiv 2505.22617): ``r A`` on every token (no clip), minus ``beta |log r|`` on the selected
    high-covariance tokens."""
    penalty = s.kl_cov_coef * t.log_rho.abs()
    obj = t.rho * t.adv - torch.where(t.selected, penalty, torch.zeros((), dtype=penalty.dtype))
    return obj, {"cov_selected_frac": t.frac(t.selected)}


def select_tokens(t: TokenRatios, name: str, s: object, generator: Optional[torch.Generator]) -> torch.Tensor:
    """The tokens the surrogate ``name`` restricts (its spec selects tokens), bool ``[B, T]``."""
    entry = surrogate(name)
    if entry.select is None:
        selecting = ", ".join(repr(n) for n, e in SURROGATE_REGISTRY.items() if e.select is not None)
        raise ValueError(f"surrogate must be one of {selecting}, got {name!r}")
    return entry.select(t, s, generator)
