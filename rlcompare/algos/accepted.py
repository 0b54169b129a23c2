"""The math layer's accepted names, knob defaults and knob checks, in plain Python (no torch).

`rlcompare.config` validates a run's settings against these before anything heavy is imported (a typo fails in
about a second), and `rlcompare.algos.losses` / `rlcompare.algos.advantages` re-export them: one place for each name.
"""

from __future__ import annotations

from typing import Optional

RATIO_LEVELS = ("token", "sequence", "sequence-token", "hybrid")
AGGREGATIONS = (
    "token-mean",
    "token-sum",
    "seq-mean-token-mean",
    "seq-mean-token-sum",
    "seq-mean-token-sum-norm",
    "prompt-mean-token-mean",
)
KL_ESTIMATORS = ("k1", "k2", "k3", "k3+")
MIXES = ("mean", "entropy")
# the per-token surrogate of policy_loss (docs/algorithms.md §3 and §7)
SURROGATES = ("clip", "cispo", "sapo", "gmpo", "dppo-tv", "dppo-kl", "clip-cov", "kl-cov")
# the surrogates' own knobs: the config keys under algorithm.clip, and the fields of their settings (surrogates.py)
SURROGATE_KNOBS = (
    "cispo_w_min",
    "cispo_w_max",
    "sapo_tau_pos",
    "sapo_tau_neg",
    "gmpo_eps_low",
    "gmpo_eps_high",
    "dppo_delta_low",
    "dppo_delta_high",
    "dppo_cap",
    "cov_ratio",
    "cov_lb",
    "cov_ub",
    "kl_cov_coef",
)
# what each surrogate adds to the metrics dict (what it clips, masks or gates), besides the common keys
SURROGATE_METRICS = {
    "clip": (),
    "cispo": ("is_weight_mean", "is_clip_frac_low", "is_clip_frac_high"),
    "sapo": ("sapo_weight_mean",),
    "gmpo": ("gmpo_clip_frac", "gmpo_ratio_mean"),
    "dppo-tv": ("dppo_mask_frac", "is_weight_mean", "is_clip_frac_high"),
    "dppo-kl": ("dppo_mask_frac", "is_weight_mean", "is_clip_frac_high"),
    "clip-cov": ("cov_selected_frac",),
    "kl-cov": ("cov_selected_frac",),
}
# ratio levels each surrogate accepts: the variants build on the token ratio (GMPO makes its own sequence
# ratio); SAPO's gate also takes GSPO's sequence ratio (TRL's importance_sampling_level="sequence")
SURROGATE_RATIOS = {name: ("token",) for name in SURROGATES}
SURROGATE_RATIOS.update({"clip": RATIO_LEVELS, "sapo": ("token", "sequence", "sequence-token")})
COV_SURROGATES = ("clip-cov", "kl-cov")
# share of the batch's real tokens Clip-Cov / KL-Cov restrict, when cov_ratio=None (the authors' 7B scripts,
# arXiv 2505.22617; verl's kl_cov_ratio default is 2e-4)
COV_RATIO_DEFAULTS = {"clip-cov": 2e-4, "kl-cov": 2e-3}
# rollout/trainer mismatch weights: TRL's four modes and IcePop (docs/algorithms.md §7.8)
MISMATCH_MODES = ("token-truncate", "token-mask", "sequence-truncate", "sequence-mask", "icepop")
# (c_min, c_max) when mismatch_weights gets None: C = 2 for TRL's modes (TIS, verl PR #2953; TRL's own
# default is 3), [0.5, 5] for IcePop (arXiv 2510.18855)
MISMATCH_DEFAULTS = {mode: (None, 2.0) for mode in MISMATCH_MODES}
MISMATCH_DEFAULTS["icepop"] = (0.5, 5.0)
# corrections for stale rollouts (rollout.staleness; docs/algorithms.md §8): the proximal policy (recomputed old
# log-probs) against the behaviour policy (the sampler's), algos/offpolicy.py
OFF_POLICY_CORRECTIONS = ("decoupled", "geo-mask", "m2po")
# decoupled PPO's cap on pi_prox / pi_behav: mask (AReaL's behav_imp_weight_cap) | truncate (AReaL's action=clamp)
DECOUPLED_CAP_MODES = ("mask", "truncate")
# which tokens M2PO's second moment is over: trust-region (the paper's: A > 0 and r > 1, or A < 0 and r < 1) | all
# (AReaL's _apply_m2po_masking)
M2PO_TOKENS = ("trust-region", "all")
# the knobs' defaults: AReaL's (no cap), SkyRL's geo_mask_low/high = 1 -+ 0.01, M2PO's tau_M2 = 0.04 (arXiv 2510.01161)
OFF_POLICY_DEFAULTS = {
    "decoupled_cap": None,
    "decoupled_cap_mode": "mask",
    "geo_delta": 0.01,
    "m2po_threshold": 0.04,
    "m2po_tokens": "trust-region",
}

# the surrogates' knobs' defaults: policy_loss's keyword defaults (tests/algos/test_accepted.py keeps the two equal)
SURROGATE_DEFAULTS = {
    "cispo_w_min": None,
    "cispo_w_max": 5.0,
    "sapo_tau_pos": 1.0,
    "sapo_tau_neg": 1.05,
    "gmpo_eps_low": 0.4,
    "gmpo_eps_high": 0.4,
    "dppo_delta_low": 0.15,
    "dppo_delta_high": 0.15,
    "dppo_cap": 20.0,
    "cov_ratio": None,
    "cov_lb": 1.0,
    "cov_ub": 5.0,
    "kl_cov_coef": 1.0,
}
# group_advantages(scale=...): group (GRPO), batch (Lite PPO), batch-centered (ScaleRL), none (Dr. GRPO)
GROUP_SCALES = ("group", "batch", "batch-centered", "none")
# the advantage estimators (trainer dispatch; docs/algorithms.md §2) and the scales each accepts:
# group_advantages' GROUP_SCALES; rloo: none; gae: PPO's batch whitening or none; reinforce_pp: whitened always;
# distill (on-policy distillation, §9): the teacher's per-token term plus the reward's group advantage, scaled as group's
ADVANTAGE_ESTIMATORS = ("group", "rloo", "gae", "reinforce_pp", "distill")
ESTIMATOR_SCALES = {
    "group": GROUP_SCALES,
    "rloo": ("none",),
    "gae": ("whiten", "none"),
    "reinforce_pp": ("whiten",),
    "distill": GROUP_SCALES,
}
# where the KL penalty enters: a loss term, or subtracted from the reward before the advantages
KL_PLACEMENTS = ("in_loss", "in_reward")
# reinforce_pp_advantages(baseline=...): none (REINFORCE++, k = 1), group (REINFORCE++-baseline, k > 1)
REINFORCE_PP_BASELINES = ("none", "group")


def _one_of(name: str, value, accepted) -> None:
    if value not in accepted:
        opts = ", ".join(repr(a) for a in accepted)
        raise ValueError(f"{name} must be one of {opts}, got {value!r}")


def _check_nonneg(name: str, value) -> None:
    if value is None or not (value >= 0):
        raise ValueError(f"{name} must be a number >= 0, got {value!r}")


def _check_positive(name: str, value, *, allow_none: bool = False) -> None:
    if value is None and allow_none:
        return
    if value is None or isinstance(value, bool) or not (value > 0):
        raise ValueError(f"{name} must be a number > 0{' or None' if allow_none else ''}, got {value!r}")


def _check_cov_knobs(k: dict) -> None:
    ratio = k["cov_ratio"]
    if ratio is not None and not (0 < ratio <= 1):
        raise ValueError(f"cov_ratio must be in (0, 1] (the share of tokens restricted) or None, got {ratio!r}")
    if not (k["cov_lb"] < k["cov_ub"]):
        raise ValueError(f"cov_lb must be < cov_ub (the covariance window), got {k['cov_lb']!r} and {k['cov_ub']!r}")


def check_surrogate_knobs(surrogate: str, k: dict) -> None:
    """Every knob the chosen surrogate reads (``k``: :data:`SURROGATE_KNOBS` -> value); a ValueError whose
    message starts with the knob's name and says what it accepts."""
    if surrogate == "cispo":
        lo, hi = k["cispo_w_min"], k["cispo_w_max"]
        if lo is not None:
            _check_nonneg("cispo_w_min", lo)
        _check_positive("cispo_w_max", hi, allow_none=True)
        if lo is not None and hi is not None and lo > hi:
            raise ValueError(f"cispo_w_min must be <= cispo_w_max, got {lo!r} > {hi!r}")
    elif surrogate == "sapo":
        _check_positive("sapo_tau_pos", k["sapo_tau_pos"])
        _check_positive("sapo_tau_neg", k["sapo_tau_neg"])
    elif surrogate == "gmpo":
        _check_nonneg("gmpo_eps_low", k["gmpo_eps_low"])
        _check_nonneg("gmpo_eps_high", k["gmpo_eps_high"])
    elif surrogate in ("dppo-tv", "dppo-kl"):
        _check_nonneg("dppo_delta_low", k["dppo_delta_low"])
        _check_nonneg("dppo_delta_high", k["dppo_delta_high"])
        _check_positive("dppo_cap", k["dppo_cap"])
    elif surrogate in COV_SURROGATES:
        _check_cov_knobs(k)
        if surrogate == "kl-cov":
            _check_nonneg("kl_cov_coef", k["kl_cov_coef"])


def _mismatch_bounds(mode: str, c_min, c_max) -> tuple[Optional[float], float]:
    lo_default, hi_default = MISMATCH_DEFAULTS[mode]
    lo = lo_default if c_min is None else c_min
    hi = hi_default if c_max is None else c_max
    if isinstance(hi, bool) or not (0 < hi < float("inf")):
        raise ValueError(f"c_max must be a finite number > 0 (the weight's upper bound), got {c_max!r}")
    if lo is not None and (isinstance(lo, bool) or not (0 <= lo <= hi)):
        raise ValueError(f"c_min must be a number in [0, c_max={hi}] or None (no lower bound), got {c_min!r}")
    return lo, hi


def check_mismatch_bounds(mode: str, c_min=None, c_max=None) -> None:
    """ValueError naming ``mode``, ``c_min`` or ``c_max`` when :func:`mismatch_weights` would refuse them."""
    _one_of("mode", mode, MISMATCH_MODES)
    _mismatch_bounds(mode, c_min, c_max)


def check_off_policy_knobs(k: dict) -> None:
    """The off-policy corrections' knobs (``k``: :data:`OFF_POLICY_DEFAULTS`'s names -> value, plus ``correction``);
    a ValueError whose message starts with the knob's name and says what it accepts."""
    if k["correction"] is not None:
        _one_of("correction", k["correction"], OFF_POLICY_CORRECTIONS)
    cap = k["decoupled_cap"]
    if cap is not None and (isinstance(cap, bool) or not (0 < cap < float("inf"))):
        raise ValueError(
            f"decoupled_cap must be a finite number > 0 (AReaL recommends 5) or None (no cap), got {cap!r}"
        )
    _one_of("decoupled_cap_mode", k["decoupled_cap_mode"], DECOUPLED_CAP_MODES)
    delta = k["geo_delta"]
    if isinstance(delta, bool) or delta is None or not (0 < delta < 1):
        raise ValueError(f"geo_delta must be in (0, 1) (SkyRL's 0.01 keeps [0.99, 1.01]), got {delta!r}")
    _check_positive("m2po_threshold", k["m2po_threshold"])
    _one_of("m2po_tokens", k["m2po_tokens"], M2PO_TOKENS)
