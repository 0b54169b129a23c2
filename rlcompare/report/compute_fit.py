"""ScaleRL's compute–performance curve and its App. A.5 fit, per arm with seed intervals (pure numpy).

The curve (ScaleRL, arXiv 2510.13786, Eq. 1)::

    R(C) = R0 + (A - R0) / (1 + (C_mid / C)^B)

R0 the step-0 accuracy (not fitted), A the asymptote, B > 0 the efficiency (the steepness in log C),
C_mid the compute at which half of the gain A - R0 is reached. The fit follows App. A.5: a grid over
A and C_mid, B fitted for each pair, the minimum sum of squared residuals kept, early points left out.
How our grids and exclusion rule map ScaleRL's onto rlcompare's units, and what "not identifiable"
means, is in ``fit_scalerl``'s docstring and docs/compute_fit.md.

No I/O and no plotting: the report reads the runs and draws; this module only computes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Mapping, NamedTuple, Optional, Sequence, Union

import numpy as np

from rlcompare.report.stats import Interval

__all__ = [
    "COMPUTE_AXES",
    "ArmDifference",
    "ArmFit",
    "ArmFits",
    "Fit",
    "SeedCurve",
    "difference_rows",
    "fit_arms",
    "fit_rows",
    "fit_scalerl",
    "scalerl_curve",
]

COMPUTE_AXES = ("tokens", "seconds")

# A grid: ScaleRL's step (App. A.5: A in {0.450, 0.455, ..., 0.800}), widened to all of [R0, 1] because
# our accuracies start anywhere in [0, 1].
A_STEP = 0.005
A_MAX = 1.0
# C_mid grid: as many values as ScaleRL's (100), log-spaced over the observed compute (see fit_scalerl).
C_MID_POINTS = 100
# B is fitted on B > 0: a log-spaced grid (ratio ~1.1 between neighbours), then golden-section search
# between the neighbours of the best grid value. B is unit-free (an exponent on a compute ratio): B = 0.05
# needs a factor 1e38 in compute to go from 10% to 90% of the gain, B = 20 a factor 1.25.
B_MIN, B_MAX, B_POINTS = 0.05, 20.0, 61
GOLDEN_ITERATIONS = 40  # bracket shrinks by 0.618^40 ~ 4e-9 of a grid step
REFINED_CANDIDATES = 8  # (A, C_mid, B) grid cells with the lowest SSE whose B is refined
# Early points: ScaleRL leaves out points below 1.5k GPU-hours, ~1.5-3% of its 50-100k GPU-hour runs
# ("about one epoch, where reward rises almost linearly"). Our runs are shorter than an epoch, so the
# rule is a fraction of the curve's own compute, the same for tokens and seconds.
EARLY_FRACTION = 0.05
MIN_POINTS = 5  # three parameters (A, B, C_mid) and at least two residual degrees of freedom
# "Flat": the fitted gain reached at the last point is below one accuracy point or within twice the
# residual noise of the fit.
FLAT_GAIN_FLOOR = 0.01
FLAT_NOISE_MULTIPLE = 2.0
ALPHA = 0.05
DEFAULT_REPS = 200
BATCH_ROWS = 256  # curves fitted at once: bounds memory to ~25 MB per (curves x C_mid x B) array

_GOLDEN = (math.sqrt(5.0) - 1.0) / 2.0


# --------------------------------------------------------------------------
# the curve


def _sigmoid(log_c, log_c_mid, B):
    """1 / (1 + (C_mid / C)^B) written in logs so that C = 0 (log -inf) gives 0 without a warning."""
    with np.errstate(over="ignore"):
        return 1.0 / (1.0 + np.exp(B * (log_c_mid - log_c)))


def _log(c):
    with np.errstate(divide="ignore"):
        return np.log(np.asarray(c, dtype=float))


def scalerl_curve(C, R0: float, A: float, B: float, C_mid: float):
    """ScaleRL's R(C) = R0 + (A - R0) / (1 + (C_mid / C)^B); R(0) = R0. Scalar in, float out."""
    if not B > 0:
        raise ValueError(f"scalerl_curve: B={B} must be > 0 (the efficiency exponent)")
    if not C_mid > 0:
        raise ValueError(f"scalerl_curve: C_mid={C_mid} must be > 0 (a compute amount)")
    c = np.asarray(C, dtype=float)
    if np.any(c < 0):
        raise ValueError("scalerl_curve: compute C must be >= 0")
    out = R0 + (A - R0) * _sigmoid(_log(c), math.log(C_mid), B)
    return float(out) if np.ndim(out) == 0 else out


# --------------------------------------------------------------------------
# one fit


@dataclass(frozen=True)
class Fit:
    """One fitted curve. ``identifiable=False`` comes with ``reason``; A, B, C_mid are nan when
    there were too few points to fit at all."""

    A: float
    B: float
    C_mid: float
    R0: float
    sse: float
    n_points: int
    identifiable: bool
    reason: Optional[str] = None

    def curve(self, C):
        """The fitted R(C), for drawing over the measured curve."""
        return scalerl_curve(C, self.R0, self.A, self.B, self.C_mid)


def _default_a_grid() -> np.ndarray:
    return np.round(np.arange(0.0, A_MAX + A_STEP / 2, A_STEP), 10)


def _default_b_grid() -> np.ndarray:
    return np.geomspace(B_MIN, B_MAX, B_POINTS)


def _default_c_mid_grid(c_positive: np.ndarray) -> np.ndarray:
    """Log-spaced between the smallest and largest observed compute (early points included, as ScaleRL's
    grid starts at 100 GPU-h below its 1.5k cut)."""
    return np.geomspace(c_positive.min(), c_positive.max(), C_MID_POINTS)


def _checked_grid(values, name: str, low: float, high: float) -> np.ndarray:
    g = np.unique(np.asarray(values, dtype=float).ravel())
    if g.size == 0 or not np.all(np.isfinite(g)) or g[0] < low or g[-1] > high:
        raise ValueError(f"{name} must be a non-empty list of finite values in [{low:g}, {high:g}]")
    return g


def _allowed_a_lows(a_grid: np.ndarray, R0: np.ndarray) -> np.ndarray:
    """The smallest A on the grid that is >= R0, per curve: A < R0 would be a falling curve."""
    i = np.searchsorted(a_grid, R0 - 1e-12, side="left")
    if np.any(i >= a_grid.size):
        raise ValueError(f"A_grid: no value >= R0={float(np.max(R0)):g}; the asymptote cannot lie below the start")
    return a_grid[i]


def _nearest_on_grid(grid: np.ndarray, x: np.ndarray, lows: np.ndarray) -> np.ndarray:
    """Grid value nearest to x among those >= lows (broadcast over the leading axis)."""
    xc = np.clip(x, lows[:, None], grid[-1])
    if grid.size == 1:
        return np.full_like(xc, grid[0])
    step = (grid[-1] - grid[0]) / (grid.size - 1)
    if np.allclose(np.diff(grid), step, rtol=1e-9, atol=0.0):  # evenly spaced (the default): round
        return grid[np.rint((xc - grid[0]) / step).astype(np.intp)]
    i = np.clip(np.searchsorted(grid, xc, side="left"), 1, grid.size - 1)
    left, right = grid[i - 1], grid[i]
    return np.where((xc - left < right - xc) & (left >= lows[:, None]), left, right)


def _sse(y, gain, log_c, log_c_mid, B):
    """Sum of squared residuals of y (gain over R0) against gain * sigmoid; broadcasts over leading axes."""
    s = _sigmoid(log_c, log_c_mid[..., None], B[..., None])
    return np.sum((y - gain[..., None] * s) ** 2, axis=-1)


def _fit_batch(C, R, R0, a_grid, c_mid_grid, b_grid):
    """Fit m curves sharing compute points C (n,): R (m, n), R0 (m,). Returns A, B, C_mid, sse and the
    grid indices (j of C_mid, k of B) of the winners, each (m,).

    For fixed (C_mid, B) the SSE is a parabola in A, so the best A on the grid is the grid value nearest
    its vertex: the (A, C_mid, B) grid is searched exactly from three sums per (C_mid, B) cell.
    """
    log_c = np.log(C)
    y = R - R0[:, None]  # gain over the start
    log_cm = np.log(c_mid_grid)
    S = _sigmoid(log_c[None, None, :], log_cm[:, None, None], b_grid[None, :, None])  # (J, K, n)
    J, K, n = S.shape
    S = S.reshape(J * K, n)
    s_ss = np.maximum(np.sum(S * S, axis=1), np.finfo(float).tiny)  # (JK,); > 0 if exp overflowed
    s_ys = y @ S.T  # (m, JK)
    s_yy = np.sum(y * y, axis=1)[:, None]
    lows = _allowed_a_lows(a_grid, R0)
    A = _nearest_on_grid(a_grid, R0[:, None] + s_ys / s_ss, lows)
    g = A - R0[:, None]
    sse = s_yy - 2.0 * g * s_ys + g * g * s_ss

    m = R.shape[0]
    top = min(REFINED_CANDIDATES, J * K)
    cells = np.argpartition(sse, top - 1, axis=1)[:, :top]  # (m, top)
    rows = np.arange(m)[:, None]
    A_c, sse_c = A[rows, cells], sse[rows, cells]
    j, k = np.divmod(cells, K)
    B_c = _refine_b(y, log_c, A_c - R0[:, None], log_cm[j], b_grid, k)
    sse_ref = _sse(y[:, None, :], A_c - R0[:, None], log_c, log_cm[j], B_c)
    better = sse_ref < sse_c
    B_c = np.where(better, B_c, b_grid[k])
    sse_c = np.where(better, sse_ref, sse_c)
    best = np.argmin(sse_c, axis=1)
    r = np.arange(m)
    return A_c[r, best], B_c[r, best], c_mid_grid[j[r, best]], sse_c[r, best], j[r, best], k[r, best]


def _refine_b(y, log_c, gain, log_cm, b_grid, k):
    """Golden-section search for B in log space between the grid neighbours of b_grid[k], with A and
    C_mid fixed (ScaleRL fits B for each (A, C_mid)). Shapes: y (m, n); gain, log_cm, k (m, top)."""
    lo = np.log(b_grid[np.maximum(k - 1, 0)])
    hi = np.log(b_grid[np.minimum(k + 1, b_grid.size - 1)])
    yy = y[:, None, :]
    x1 = hi - _GOLDEN * (hi - lo)
    x2 = lo + _GOLDEN * (hi - lo)
    f1 = _sse(yy, gain, log_c, log_cm, np.exp(x1))
    f2 = _sse(yy, gain, log_c, log_cm, np.exp(x2))
    for _ in range(GOLDEN_ITERATIONS):
        left = f1 < f2  # minimum in [lo, x2]: keep x1 as the new x2
        lo, hi = np.where(left, lo, x1), np.where(left, x2, hi)
        x1_new = np.where(left, hi - _GOLDEN * (hi - lo), x2)
        x2_new = np.where(left, x1, lo + _GOLDEN * (hi - lo))
        f_new = _sse(yy, gain, log_c, log_cm, np.exp(np.where(left, x1_new, x2_new)))
        f1, f2 = np.where(left, f_new, f2), np.where(left, f1, f_new)
        x1, x2 = x1_new, x2_new
    return np.exp((lo + hi) / 2.0)


def _not_identifiable_reason(A, B, C_mid, R0, sse, n, C_last, a_grid, a_low, c_mid_grid, j, k, b_grid):
    """Why a fit's parameters cannot be read, or None. Checked in this order: flat, C_mid, A, B at an edge."""
    gain_seen = (A - R0) * float(_sigmoid(math.log(C_last), math.log(C_mid), B))
    noise = math.sqrt(max(sse, 0.0) / max(n - 3, 1))
    if gain_seen < max(FLAT_GAIN_FLOOR, FLAT_NOISE_MULTIPLE * noise):
        return (
            f"flat: fitted gain {gain_seen:+.4f} by the last point is below max({FLAT_GAIN_FLOOR:g}, "
            f"{FLAT_NOISE_MULTIPLE:g} x residual noise {noise:.4f})"
        )
    if j == c_mid_grid.size - 1:
        return (
            f"C_mid at the top of its grid ({C_mid:.4g}; by default the largest compute observed): the "
            "midpoint lies at or beyond it, only the rising part of the curve was seen"
        )
    if j == 0:
        return (
            f"C_mid at the bottom of its grid ({C_mid:.4g}; by default the smallest compute observed): "
            "the rise happened before the points fitted"
        )
    if math.isclose(A, a_grid[-1]) or math.isclose(A, a_low):
        return f"A at the edge of its grid ({A:.3f}, grid [{a_low:.3f}, {a_grid[-1]:.3f}])"
    if k in (0, b_grid.size - 1):
        return f"B at the edge of its range ({B:.3g}, range [{b_grid[0]:g}, {b_grid[-1]:g}])"
    return None


def _prepare_points(C, R, R0, min_compute):
    c = np.asarray(C, dtype=float).ravel()
    r = np.asarray(R, dtype=float).ravel()
    if c.shape != r.shape:
        raise ValueError(f"fit_scalerl: C has {c.size} values and R {r.size}; give one accuracy per compute point")
    if not (np.all(np.isfinite(c)) and np.all(np.isfinite(r))):
        raise ValueError("fit_scalerl: C and R must be finite (drop rows with a missing eval first)")
    if np.any(c < 0):
        raise ValueError("fit_scalerl: compute C must be >= 0")
    if np.any((r < 0) | (r > 1)):
        raise ValueError("fit_scalerl: R must be an accuracy in [0, 1]")
    if not (math.isfinite(R0) and 0.0 <= R0 <= 1.0):
        raise ValueError(f"fit_scalerl: R0={R0} must be the step-0 accuracy, in [0, 1]")
    if min_compute is not None and not (math.isfinite(min_compute) and min_compute >= 0):
        raise ValueError(f"fit_scalerl: min_compute={min_compute} must be a compute amount >= 0 (or None)")
    order = np.argsort(c, kind="stable")  # the flat rule reads the last point as the largest compute
    c, r = c[order], r[order]
    keep = _kept(c, min_compute)
    return c[c > 0], c[keep], r[keep]


def _kept(c: np.ndarray, min_compute: Optional[float]) -> np.ndarray:
    """The exclusion rule: C > 0 and C >= min_compute (default: EARLY_FRACTION of the largest C)."""
    cut = EARLY_FRACTION * c.max() if (min_compute is None and c.size) else (min_compute or 0.0)
    return (c > 0) & (c >= cut)


def _grids(c_positive, A_grid, C_mid_grid):
    a_grid = _default_a_grid() if A_grid is None else _checked_grid(A_grid, "A_grid", 0.0, 1.0)
    if C_mid_grid is None:
        c_mid_grid = _default_c_mid_grid(c_positive)
    else:
        c_mid_grid = _checked_grid(C_mid_grid, "C_mid_grid", np.finfo(float).tiny, np.inf)
    return a_grid, c_mid_grid, _default_b_grid()


def fit_scalerl(C, R, *, R0: float, min_compute: Optional[float] = None, A_grid=None, C_mid_grid=None) -> Fit:
    """Fit ScaleRL's curve to accuracies R at compute C (tokens or seconds), R0 fixed.

    As ScaleRL App. A.5: every (A, C_mid) on a grid, B > 0 fitted for each, the least sum of squared
    residuals kept. In our units:

    * **exclusion**: points with C <= 0 (step 0: R(0) = R0 by construction) and points below
      ``min_compute`` are left out. ``min_compute=None`` means 5% of the largest C given
      (``EARLY_FRACTION``), our stand-in for ScaleRL's 1.5k GPU-hour cut (~1.5-3% of its runs,
      "about one epoch"). Pass an absolute amount, in C's unit, to pin it (an eval that sits near 5%
      may fall either side from run to run).
    * **A**: ``{0, 0.005, ..., 1.0}`` restricted to A >= R0 (ScaleRL's step of 0.005).
    * **C_mid**: 100 values log-spaced between the smallest and the largest positive C given. Log, not
      linear as ScaleRL: R depends on C_mid only through B * (log C_mid - log C), so equal log steps move
      the curve equally; a linear grid over [min, max] C wastes most of its values at the top and is
      coarse near the start, where our short runs usually have their midpoint.
    * **B**: 61 values log-spaced in [0.05, 20], then golden-section search between the neighbours of
      the best (the search is exact on the A and C_mid grids: see ``_fit_batch``).

    ``identifiable=False`` (with ``reason``) when fewer than 5 points remain, when the curve is flat
    (fitted gain by the last point below 0.01 or below twice the residual noise), or when the optimum
    sits on the edge of a grid: C_mid at the largest compute (the midpoint lies at or beyond the data,
    only the rising part was seen), C_mid at the smallest, A at R0 or 1.0, B at 0.05 or 20.
    """
    c_positive, c, r = _prepare_points(C, R, R0, min_compute)
    n = int(c.size)
    if n < MIN_POINTS:
        return Fit(
            math.nan,
            math.nan,
            math.nan,
            float(R0),
            math.nan,
            n,
            False,
            f"too few points: {n} after excluding early ones (need >= {MIN_POINTS})",
        )
    a_grid, c_mid_grid, b_grid = _grids(c_positive, A_grid, C_mid_grid)
    return _fit_from_batch(c, r[None, :], np.array([float(R0)]), a_grid, c_mid_grid, b_grid)[0]


def _fit_from_batch(c, R, R0, a_grid, c_mid_grid, b_grid) -> list[Fit]:
    parts = [
        _fit_batch(c, R[i : i + BATCH_ROWS], R0[i : i + BATCH_ROWS], a_grid, c_mid_grid, b_grid)
        for i in range(0, R.shape[0], BATCH_ROWS)
    ]
    A, B, C_mid, sse, j, k = (np.concatenate(p) for p in zip(*parts))
    a_low = _allowed_a_lows(a_grid, R0)
    fits = []
    for i in range(R.shape[0]):
        reason = _not_identifiable_reason(
            float(A[i]),
            float(B[i]),
            float(C_mid[i]),
            float(R0[i]),
            float(sse[i]),
            c.size,
            float(c[-1]),
            a_grid,
            float(a_low[i]),
            c_mid_grid,
            int(j[i]),
            int(k[i]),
            b_grid,
        )
        fits.append(
            Fit(
                float(A[i]),
                float(B[i]),
                float(C_mid[i]),
                float(R0[i]),
                float(sse[i]),
                int(c.size),
                reason is None,
                reason,
            )
        )
    return fits


# --------------------------------------------------------------------------
# arms over seeds


class SeedCurve(NamedTuple):
    """One seed's held-out curve, rows in eval order; row 0 is the step-0 eval (its accuracy is R0).

    Compute is counted from row 0 (C - C[0]): a no-op for tokens, and for seconds it leaves out the
    time before the first eval.
    """

    accuracy: Sequence[float]
    tokens: Sequence[float]
    seconds: Optional[Sequence[float]] = None


@dataclass(frozen=True)
class ArmFit:
    """An arm's fit on its mean curve over seeds, with percentile bootstrap intervals over seeds
    (nan bounds with a single seed). ``boot_identifiable`` is the share of bootstrap refits that were
    identifiable."""

    arm: str
    compute: str
    n_seeds: int
    fit: Fit
    A: Interval
    B: Interval
    C_mid: Interval
    boot_identifiable: float
    grid: np.ndarray = field(repr=False)  # the common compute grid of the mean curve
    mean_curve: np.ndarray = field(repr=False)
    _boot: dict = field(repr=False, default_factory=dict)  # "A", "B", "C_mid" -> (reps,) refits


@dataclass(frozen=True)
class ArmDifference:
    """arm minus reference in A and in B; intervals from independent resamples of each arm's seeds."""

    arm: str
    reference: str
    dA: Interval
    dB: Interval
    identifiable: bool
    reason: Optional[str] = None


@dataclass(frozen=True)
class ArmFits:
    compute: str
    reps: int
    arms: dict
    differences: dict


def _seed_axis(curve: SeedCurve, compute: str, arm: str, i: int) -> tuple[np.ndarray, np.ndarray]:
    acc = np.asarray(curve.accuracy, dtype=float).ravel()
    raw = curve.tokens if compute == "tokens" else curve.seconds
    if raw is None:
        raise ValueError(f"fit_arms: arm {arm!r} seed {i} has no {compute} column; use compute='tokens'")
    c = np.asarray(raw, dtype=float).ravel()
    if c.shape != acc.shape or c.size < 2:
        raise ValueError(
            f"fit_arms: arm {arm!r} seed {i}: {c.size} {compute} values for {acc.size} accuracies "
            "(need one per eval row, at least 2 rows)"
        )
    if not (np.all(np.isfinite(c)) and np.all(np.isfinite(acc))):
        raise ValueError(f"fit_arms: arm {arm!r} seed {i}: {compute} and accuracy must be finite")
    c = c - c[0]
    if np.any(np.diff(c) <= 0):
        raise ValueError(
            f"fit_arms: arm {arm!r} seed {i}: {compute} must strictly increase from row to row "
            "(row 0 being the step-0 eval)"
        )
    return c, acc


def _common_grid(seeds: list[tuple[np.ndarray, np.ndarray]]) -> np.ndarray:
    """Where every seed has data after step 0, with the median seed's number of eval rows there."""
    lo = max(c[1] for c, _ in seeds)
    hi = min(c[-1] for c, _ in seeds)
    if hi < lo:
        return np.array([lo])
    n = int(np.median([np.count_nonzero((c >= lo) & (c <= hi)) for c, _ in seeds]))
    return np.linspace(lo, hi, max(n, 1))


def _percentile(point: float, boots: np.ndarray) -> Interval:
    if boots.size == 0 or not math.isfinite(point):
        return Interval(point, math.nan, math.nan)
    lo, hi = np.percentile(boots, [100 * ALPHA / 2, 100 * (1 - ALPHA / 2)])
    return Interval(point, float(lo), float(hi))


def _fit_arm(arm, curves, compute, reps, rng, min_compute, A_grid, C_mid_grid) -> ArmFit:
    seeds = [_seed_axis(cv, compute, arm, i) for i, cv in enumerate(curves)]
    grid = _common_grid(seeds)
    Y = np.vstack([np.interp(grid, c, a) for c, a in seeds])  # (seeds, grid)
    r0 = np.array([a[0] for _, a in seeds])
    mean_curve = Y.mean(axis=0)
    fit = fit_scalerl(
        grid, mean_curve, R0=float(r0.mean()), min_compute=min_compute, A_grid=A_grid, C_mid_grid=C_mid_grid
    )
    n_seeds = len(seeds)
    boot = {"A": np.array([]), "B": np.array([]), "C_mid": np.array([])}
    share = math.nan
    if n_seeds >= 2 and math.isfinite(fit.A):
        keep = _kept(grid, min_compute)
        c_positive, c = grid[grid > 0], grid[keep]
        a_grid, c_mid_grid, b_grid = _grids(c_positive, A_grid, C_mid_grid)
        draw = rng.integers(0, n_seeds, size=(reps, n_seeds))  # resample seeds with replacement
        fits = _fit_from_batch(c, Y[draw].mean(axis=1)[:, keep], r0[draw].mean(axis=1), a_grid, c_mid_grid, b_grid)
        boot = {p: np.array([getattr(f, p) for f in fits]) for p in ("A", "B", "C_mid")}
        share = float(np.mean([f.identifiable for f in fits]))
    return ArmFit(
        arm,
        compute,
        n_seeds,
        fit,
        _percentile(fit.A, boot["A"]),
        _percentile(fit.B, boot["B"]),
        _percentile(fit.C_mid, boot["C_mid"]),
        share,
        grid,
        mean_curve,
        boot,
    )


def _difference(a: ArmFit, ref: ArmFit) -> ArmDifference:
    reasons = [f"{x.arm}: {x.fit.reason}" for x in (a, ref) if not x.fit.identifiable]
    out = {}
    for p in ("A", "B"):
        point = getattr(a.fit, p) - getattr(ref.fit, p)
        both = a._boot[p].size and ref._boot[p].size
        out[p] = _percentile(point, a._boot[p] - ref._boot[p]) if both else Interval(point, math.nan, math.nan)
    return ArmDifference(a.arm, ref.arm, out["A"], out["B"], not reasons, "; ".join(reasons) or None)


def _references(reference, arms: list[str]) -> dict:
    if reference is None:
        reference = arms[0]
    pairs = dict(reference) if isinstance(reference, Mapping) else {a: reference for a in arms}
    for arm, ref in pairs.items():
        if arm not in arms or ref not in arms:
            raise ValueError(
                f"fit_arms: reference {arm!r} -> {ref!r} names an arm that is not here; arms: {', '.join(arms)}"
            )
    return {arm: ref for arm, ref in pairs.items() if arm != ref}


def fit_arms(
    curves_by_arm: Mapping[str, Sequence[SeedCurve]],
    *,
    compute: str = "tokens",
    reps: int = DEFAULT_REPS,
    seed: int = 0,
    reference: Union[str, Mapping[str, str], None] = None,
    min_compute: Optional[float] = None,
    A_grid=None,
    C_mid_grid=None,
) -> ArmFits:
    """Per arm: ``fit_scalerl`` on the mean over seeds, and a percentile bootstrap over seeds for A, B
    and C_mid; then arm - reference differences in A and B with intervals.

    The mean curve: each seed's accuracy interpolated linearly onto a common compute grid (where every
    seed has data after step 0, as many points as the median seed has there), averaged; R0 = the mean
    step-0 accuracy. A bootstrap replicate resamples the seeds with replacement and refits (R0 included).
    Differences pair replicate r of one arm with replicate r of the other (independent resamples, as
    ``stats.difference_ci``). ``reference``: one arm for all (default: the first arm), or arm -> reference.

    Limits: with ~5 seeds a seed bootstrap sees at most a few distinct resamples' worth of spread and
    tends to be too narrow; the percentile interval's coverage is not claimed here. Near-degenerate fits
    trade A against B (a higher asymptote with a lower efficiency fits the same points), so read B
    differences where A is shared or both fits are identifiable.
    """
    if compute not in COMPUTE_AXES:
        raise ValueError(f"fit_arms: compute={compute!r}; accepted values are {', '.join(map(repr, COMPUTE_AXES))}")
    if not (isinstance(reps, (int, np.integer)) and reps >= 1):
        raise ValueError(f"fit_arms: reps={reps!r} must be an integer >= 1 (bootstrap replicates)")
    arms = list(curves_by_arm)
    if not arms or any(len(curves_by_arm[a]) == 0 for a in arms):
        raise ValueError("fit_arms: give at least one arm, each with at least one seed's curve")
    refs = _references(reference, arms)
    streams = np.random.SeedSequence(seed).spawn(len(arms))
    fitted = {
        a: _fit_arm(a, curves_by_arm[a], compute, int(reps), np.random.default_rng(s), min_compute, A_grid, C_mid_grid)
        for a, s in zip(arms, streams)
    }
    diffs = {a: _difference(fitted[a], fitted[r]) for a, r in refs.items()}
    return ArmFits(compute, int(reps), fitted, diffs)


# --------------------------------------------------------------------------
# table rows (the report formats and writes them)


def fit_rows(result: ArmFits) -> list[dict]:
    """One flat dict per arm, for the report's CSV and markdown table."""
    rows = []
    for a in result.arms.values():
        rows.append(
            {
                "variant": a.arm,
                "compute": a.compute,
                "seeds": a.n_seeds,
                "R0": a.fit.R0,
                "A": a.A.point,
                "A_low": a.A.low,
                "A_high": a.A.high,
                "B": a.B.point,
                "B_low": a.B.low,
                "B_high": a.B.high,
                "C_mid": a.C_mid.point,
                "C_mid_low": a.C_mid.low,
                "C_mid_high": a.C_mid.high,
                "sse": a.fit.sse,
                "n_points": a.fit.n_points,
                "identifiable": a.fit.identifiable,
                "boot_identifiable": a.boot_identifiable,
                "reason": a.fit.reason or "",
            }
        )
    return rows


def difference_rows(result: ArmFits) -> list[dict]:
    """One flat dict per (arm, reference) pair: differences in A and B with their intervals."""
    return [
        {
            "variant": d.arm,
            "reference": d.reference,
            "compute": result.compute,
            "dA": d.dA.point,
            "dA_low": d.dA.low,
            "dA_high": d.dA.high,
            "dB": d.dB.point,
            "dB_low": d.dB.low,
            "dB_high": d.dB.high,
            "identifiable": d.identifiable,
            "reason": d.reason or "",
        }
        for d in result.differences.values()
    ]
