"""Seed statistics for comparing RL runs (pure numpy; rliable definitions).

Everything here works on small arrays of per-seed scores. Definitions follow
Agarwal et al., "Deep RL at the Edge of the Statistical Precipice" (rliable):

* ``iqm``: interquartile mean = ``scipy.stats.trim_mean(x, 0.25)``: sort, cut
  ``int(0.25 * n)`` values from *each* end, average the rest. No fractional
  weights: for n not divisible by 4 the cut rounds down (n = 5, 6, 7 cut one
  value each side; n < 4 cuts nothing, so IQM == mean).
* ``stratified_bootstrap_ci``: percentile bootstrap; each stratum (task, run
  group, or column of a runs x tasks matrix) is resampled with replacement
  independently, keeping its size, then the statistic is computed on the
  resample.
* ``probability_of_improvement``: P(X > Y) + 0.5 P(X = Y) over all pairs, i.e.
  the Mann-Whitney U statistic / (n * m); with tasks (2-D input) it is the
  average of the per-task values.

All bootstrap functions are deterministic for a given ``seed``.
"""

from __future__ import annotations

from typing import Callable, Mapping, NamedTuple, Union

import numpy as np

__all__ = [
    "Interval",
    "iqm",
    "stratified_bootstrap_ci",
    "mean_ci",
    "iqm_ci",
    "difference_ci",
    "probability_of_improvement",
]

DEFAULT_REPS = 2000
DEFAULT_ALPHA = 0.05


class Interval(NamedTuple):
    """A point estimate with a (1 - alpha) percentile bootstrap interval."""

    point: float
    low: float
    high: float

    @property
    def width(self) -> float:
        return float(self.high - self.low)


# --------------------------------------------------------------------------
# point statistics


def iqm(x, axis=None) -> Union[float, np.ndarray]:
    """Interquartile mean with ``scipy.stats.trim_mean(x, 0.25)`` semantics.

    ``axis=None`` (default) pools all values, as rliable does for a runs x tasks
    matrix. With an integer ``axis`` the trimmed mean is taken along it.
    """
    a = np.asarray(x, dtype=float)
    if axis is None:
        a = a.ravel()
        axis = 0
    n = a.shape[axis]
    if n == 0:
        raise ValueError("iqm of an empty array")
    cut = int(0.25 * n)
    a = np.sort(a, axis=axis)
    kept = np.take(a, np.arange(cut, n - cut), axis=axis)
    out = np.mean(kept, axis=axis)
    return float(out) if np.ndim(out) == 0 else out


def _mean(x, axis=None):
    out = np.mean(np.asarray(x, dtype=float), axis=axis)
    return float(out) if np.ndim(out) == 0 else out


def _median(x, axis=None):
    out = np.median(np.asarray(x, dtype=float), axis=axis)
    return float(out) if np.ndim(out) == 0 else out


# statistics that are order-invariant on the pooled values and accept axis=:
# they are evaluated on all bootstrap replicates at once.
_NAMED = {"mean": _mean, "iqm": iqm, "median": _median}
_VECTORISED = {_mean: _mean, iqm: iqm, _median: _median, np.mean: _mean, np.median: _median}


def _resolve(statistic) -> Callable:
    if isinstance(statistic, str):
        try:
            return _NAMED[statistic]
        except KeyError:
            raise ValueError(f"unknown statistic {statistic!r}; use one of {sorted(_NAMED)} or a callable") from None
    if not callable(statistic):
        raise TypeError("statistic must be a callable or one of 'mean', 'iqm', 'median'")
    return statistic


def _strata(scores) -> tuple[list[np.ndarray], bool]:
    """Split input into 1-D strata. Returns (strata, is_matrix)."""
    if isinstance(scores, Mapping):
        strata = [np.asarray(v, dtype=float).ravel() for v in scores.values()]
        matrix = False
    elif isinstance(scores, np.ndarray) and scores.ndim == 2:
        strata = [scores[:, j].astype(float) for j in range(scores.shape[1])]
        matrix = True
    elif isinstance(scores, np.ndarray) and scores.ndim <= 1:
        strata = [np.atleast_1d(scores).astype(float)]
        matrix = False
    else:
        seq = list(scores)
        if seq and all(np.ndim(s) == 0 for s in seq):  # a flat list of numbers: one stratum
            strata = [np.asarray(seq, dtype=float)]
        else:
            strata = [np.asarray(s, dtype=float).ravel() for s in seq]
        matrix = False
    if not strata:
        raise ValueError("no scores given")
    for s in strata:
        if s.size == 0:
            raise ValueError("a stratum has no scores")
    return strata, matrix


def _percentile_interval(point: float, boots: np.ndarray, alpha: float) -> Interval:
    if not 0 < alpha < 1:
        raise ValueError("alpha must be in (0, 1)")
    lo, hi = np.percentile(boots, [100 * alpha / 2, 100 * (1 - alpha / 2)])
    return Interval(float(point), float(lo), float(hi))


# --------------------------------------------------------------------------
# bootstrap intervals


def stratified_bootstrap_ci(
    scores_by_task_or_group,
    statistic: Union[str, Callable] = "mean",
    reps: int = DEFAULT_REPS,
    alpha: float = DEFAULT_ALPHA,
    seed: int = 0,
) -> Interval:
    """Percentile stratified-bootstrap interval of ``statistic``.

    ``scores_by_task_or_group`` is one of

    * a 1-D array / flat list: one stratum (an ordinary bootstrap over seeds);
    * a dict or list of 1-D arrays: one stratum each (sizes may differ); the
      statistic receives the pooled (concatenated) resample;
    * a 2-D array shaped (n_runs, n_tasks) (rliable layout): each column is a
      stratum; the statistic receives the resampled (n_runs, n_tasks) matrix.

    ``statistic`` is a callable or 'mean' / 'iqm' / 'median' (evaluated on the
    pooled values, vectorised over replicates). Returns
    ``Interval(point, low, high)`` with point = statistic on the data.
    """
    if reps < 1:
        raise ValueError("reps must be >= 1")
    stat = _resolve(statistic)
    strata, matrix = _strata(scores_by_task_or_group)
    rng = np.random.default_rng(seed)

    if matrix:
        original = np.column_stack(strata)
    else:
        original = np.concatenate(strata)
    point = stat(original)

    # resample each stratum independently: index arrays (reps, n_k)
    resampled = [s[rng.integers(0, s.size, size=(reps, s.size))] for s in strata]

    vec = _VECTORISED.get(stat)
    if vec is not None:
        pooled = np.concatenate(resampled, axis=1)  # (reps, N)
        boots = np.asarray(vec(pooled, axis=1), dtype=float)
    elif matrix:
        stacked = np.stack(resampled, axis=2)  # (reps, n_runs, n_tasks)
        boots = np.array([stat(stacked[r]) for r in range(reps)], dtype=float)
    else:
        pooled = np.concatenate(resampled, axis=1)
        boots = np.array([stat(pooled[r]) for r in range(reps)], dtype=float)
    return _percentile_interval(point, boots, alpha)


def mean_ci(values, reps: int = DEFAULT_REPS, alpha: float = DEFAULT_ALPHA, seed: int = 0) -> Interval:
    """Mean over seeds with a percentile bootstrap interval.

    With fewer than 2 values the interval is undefined: ``(mean, nan, nan)``
    (``(nan, nan, nan)`` for no values), rather than a misleading zero width.
    """
    v = np.asarray(values, dtype=float).ravel()
    if v.size == 0:
        return Interval(float("nan"), float("nan"), float("nan"))
    if v.size == 1:
        return Interval(float(v[0]), float("nan"), float("nan"))
    return stratified_bootstrap_ci(v, "mean", reps=reps, alpha=alpha, seed=seed)


def iqm_ci(values, reps: int = DEFAULT_REPS, alpha: float = DEFAULT_ALPHA, seed: int = 0) -> Interval:
    """IQM over seeds with a percentile bootstrap interval (same n < 2 rule as ``mean_ci``)."""
    v = np.asarray(values, dtype=float).ravel()
    if v.size == 0:
        return Interval(float("nan"), float("nan"), float("nan"))
    if v.size == 1:
        return Interval(float(v[0]), float("nan"), float("nan"))
    return stratified_bootstrap_ci(v, "iqm", reps=reps, alpha=alpha, seed=seed)


def difference_ci(
    a,
    b,
    reps: int = DEFAULT_REPS,
    alpha: float = DEFAULT_ALPHA,
    seed: int = 0,
    statistic: Union[str, Callable] = "mean",
) -> Interval:
    """Interval of ``statistic(a) - statistic(b)``; a and b resampled independently.

    If either side has fewer than 2 values the bounds are nan.
    """
    stat = _resolve(statistic)
    a = np.asarray(a, dtype=float).ravel()
    b = np.asarray(b, dtype=float).ravel()
    if a.size == 0 or b.size == 0:
        return Interval(float("nan"), float("nan"), float("nan"))
    point = float(stat(a) - stat(b))
    if a.size < 2 or b.size < 2:
        return Interval(point, float("nan"), float("nan"))
    rng = np.random.default_rng(seed)
    ra = a[rng.integers(0, a.size, size=(reps, a.size))]
    rb = b[rng.integers(0, b.size, size=(reps, b.size))]
    vec = _VECTORISED.get(stat)
    if vec is not None:
        boots = np.asarray(vec(ra, axis=1), dtype=float) - np.asarray(vec(rb, axis=1), dtype=float)
    else:
        boots = np.array([stat(ra[r]) - stat(rb[r]) for r in range(reps)], dtype=float)
    return _percentile_interval(point, boots, alpha)


def _pairwise_wins(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """C[i, j] = 1 if x_i > y_j, 0.5 if equal, 0 otherwise."""
    return (x[:, None] > y[None, :]).astype(float) + 0.5 * (x[:, None] == y[None, :])


def _counts(idx: np.ndarray, n: int) -> np.ndarray:
    """Row-wise bincount of an index matrix (reps, k) -> (reps, n)."""
    reps = idx.shape[0]
    flat = (idx + n * np.arange(reps)[:, None]).ravel()
    return np.bincount(flat, minlength=reps * n).reshape(reps, n).astype(float)


def probability_of_improvement(
    a,
    b,
    ci: bool = False,
    reps: int = DEFAULT_REPS,
    alpha: float = DEFAULT_ALPHA,
    seed: int = 0,
) -> Union[float, Interval]:
    """P(X > Y) + 0.5 P(X = Y), X drawn from ``a`` and Y from ``b`` (rliable).

    1-D inputs: the Mann-Whitney U / (n * m). 2-D inputs shaped (n_runs, n_tasks)
    with the same number of tasks: average over tasks of the per-task value.
    With ``ci=True`` returns an ``Interval`` from a stratified bootstrap that
    resamples the runs of ``a`` and of ``b`` independently (per task).
    """
    a = np.asarray(a, dtype=float)
    b = np.asarray(b, dtype=float)
    if a.ndim <= 1:
        a = a.reshape(-1, 1)
    if b.ndim <= 1:
        b = b.reshape(-1, 1)
    if a.shape[1] != b.shape[1]:
        raise ValueError("a and b must have the same number of tasks (columns)")
    if a.shape[0] == 0 or b.shape[0] == 0:
        raise ValueError("probability_of_improvement needs at least one score on each side")
    n, m, tasks = a.shape[0], b.shape[0], a.shape[1]
    wins = [_pairwise_wins(a[:, t], b[:, t]) for t in range(tasks)]
    point = float(np.mean([w.mean() for w in wins]))
    if not ci:
        return point
    rng = np.random.default_rng(seed)
    boots = np.zeros(reps)
    for t in range(tasks):
        # a resample is fully described by how often each index is drawn;
        # PoI of the resample = wa^T C wb / (n m)
        ia = rng.integers(0, n, size=(reps, n))
        ib = rng.integers(0, m, size=(reps, m))
        wa = _counts(ia, n)
        wb = _counts(ib, m)
        boots += np.einsum("rn,nm,rm->r", wa, wins[t], wb) / (n * m)
    boots /= tasks
    return _percentile_interval(point, boots, alpha)
