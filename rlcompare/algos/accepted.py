"""The math layer's accepted names, knob defaults and knob checks, in plain Python (no torch).

`rlcompare.config` validates a run's settings against these before anything heavy is imported (a typo fails in
about a second), and `rlcompare.algos.losses` / `rlcompare.algos.advantages` re-export them: one place for each name.
The surrogates' names (SURROGATES, SURROGATE_KNOBS, ...) are derived from their specs (`surrogate_specs.py`), the
advantage estimators' (ADVANTAGE_ESTIMATORS, ESTIMATOR_SCALES) from theirs (`estimator_specs.py`).
"""

from __future__ import annotations

from typing import Optional

from rlcompare.algos import estimator_specs, surrogate_specs
from rlcompare.algos.estimator_specs import GROUP_SCALES, REINFORCE_PP_BASELINES  # noqa: F401 (re-exported)
from rlcompare.algos.surrogate_specs import COV_RATIO_DEFAULTS, MIXES, RATIO_LEVELS  # noqa: F401 (re-exported)

AGGREGATIONS = (
    "token-mean",
    "token-sum",
    "seq-mean-token-mean",
    "seq-mean-token-sum",
    "seq-mean-token-sum-norm",
    "prompt-mean-token-mean",
)
KL_ESTIMATORS = ("k1", "k2", "k3", "k3+")
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

# where the KL penalty enters: a loss term, or subtracted from the reward before the advantages
KL_PLACEMENTS = ("in_loss", "in_reward")


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


# ---------------------------------------------------------------- the surrogates' names, derived from their specs
# (algos/surrogate_specs.py, the one declaration per surrogate); computed on access so that a surrogate registered
# after this module was imported is accepted, and cached per registry state (the same objects while it is unchanged)
_DERIVED_CACHE: dict = {}


def _derive() -> dict:
    key = (surrogate_specs.registry_key(), tuple(estimator_specs.SPECS.values()))
    if key not in _DERIVED_CACHE:
        specs = surrogate_specs.SPECS
        knobs = surrogate_specs.all_knob_fields()
        _DERIVED_CACHE[key] = {
            # the per-token surrogates of policy_loss (docs/algorithms.md §3 and §7)
            "SURROGATES": tuple(specs),
            # their own knobs: the config keys under algorithm.clip besides the common ones (eps_low, eps_high,
            # dual_clip), and the fields of their settings
            "SURROGATE_KNOBS": tuple(knobs),
            "SURROGATE_DEFAULTS": {k: f.default for k, f in knobs.items()},
            # what each adds to the metrics dict (what it clips, masks or gates), besides the common keys
            "SURROGATE_METRICS": {n: s.metrics for n, s in specs.items()},
            "SURROGATE_RATIOS": {n: s.ratio_levels for n, s in specs.items()},
            # the surrogates that restrict tokens selected over the whole optimizer step (Clip-Cov, KL-Cov)
            "COV_SURROGATES": tuple(n for n, s in specs.items() if s.selects_tokens),
            # the advantage estimators (docs/algorithms.md §1) and the scales each accepts
            "ADVANTAGE_ESTIMATORS": tuple(estimator_specs.SPECS),
            "ESTIMATOR_SCALES": {n: s.scales for n, s in estimator_specs.SPECS.items()},
        }
    return _DERIVED_CACHE[key]


DERIVED_NAMES = (
    "SURROGATES",
    "SURROGATE_KNOBS",
    "SURROGATE_DEFAULTS",
    "SURROGATE_METRICS",
    "SURROGATE_RATIOS",
    "COV_SURROGATES",
    "ADVANTAGE_ESTIMATORS",
    "ESTIMATOR_SCALES",
)


def __getattr__(name: str):
    if name in DERIVED_NAMES:
        return _derive()[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def check_surrogate_knobs(surrogate: str, k: dict) -> None:
    """Every knob the chosen surrogate reads (``k``: config key -> value; absent keys take the defaults), by its
    settings' ``check()``: a ValueError naming ``algorithm.clip.<key>``, what it accepts and the fix."""
    surrogate_specs.spec(surrogate).build(k).check()
