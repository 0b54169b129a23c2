"""What a comparison compares: smoothed per-run quantities at a pair's own comparison point, and the pairing of
seeds.

* ``window`` (the verdict's default): the mean of the curve over a window ending at the comparison point T —
  the last ``WINDOW_EVALS`` eval rows (the value at T, interpolated when no row sits there, counts as the
  last), or, for a per-step column of metrics.jsonl (lengths, clip fractions, entropy), the steps in the last
  ``WINDOW_TOKEN_SHARE`` of the tokens up to T. One interpolated eval point carries the eval-to-eval jitter of
  a run (0.018-0.035 accuracy on the lab task), as large as the effects being judged.
* ``auc``: the mean over tokens of the whole curve up to T (trapezoids).
* ``final``: the single value at T.

``--estimand window|final|auc`` picks the one the verdicts, their intervals, Holm's adjustment and the headline's
order use; differences.csv holds all three either way.

Each variant-vs-reference pair is compared at the smaller of the two arms' final token counts, not at the
folder's shortest run, so adding an unrelated arm to a folder cannot move a pair's result.

Seeds are paired when both arms hold the same seeds, one run each: seed s of every arm of a sweep shares its
warm start, its data order and its sampling streams (common random numbers), so the per-seed difference
removes what the seeds share and the paired t interval of those differences is the valid, narrower one.
"""

from __future__ import annotations

import math
from typing import Optional

import numpy as np
import pandas as pd

from .curves import _auc, _curve, _le, _segment

WINDOW_EVALS = 3
WINDOW_TOKEN_SHARE = 0.2
ESTIMANDS = ("window", "final", "auc")
DEFAULT_ESTIMAND = "window"


def estimand_label(estimand: str, per_step: bool = False) -> str:
    """What one estimand is, in words (report.md's headers and its "verdicts on" line)."""
    if estimand == "window":
        if per_step:
            return f"mean over the steps in the last {WINDOW_TOKEN_SHARE:.0%} of the tokens"
        return f"mean of the last {WINDOW_EVALS} evals"
    return {"final": "final point", "auc": "AUC (mean over tokens)"}[estimand]


def window_mean(st: np.ndarray, sy: np.ndarray, per_step: bool) -> float:
    """Mean of a curve segment ending at the comparison point: its last WINDOW_EVALS points, or (per-step
    columns) its points in the last WINDOW_TOKEN_SHARE of the tokens up to the end."""
    if st.size == 0:
        return float("nan")
    if per_step:
        return float(np.mean(sy[st >= st[-1] * (1.0 - WINDOW_TOKEN_SHARE)]))
    return float(np.mean(sy[-WINDOW_EVALS:]))


def window_step_mean(df: pd.DataFrame, col: str, T: float) -> float:
    """A metrics.jsonl column's mean over the steps in the last WINDOW_TOKEN_SHARE of the tokens up to T (the last
    step up to T when none falls inside)."""
    t, y = _curve(df, col)
    if t.size == 0:
        return float("nan")
    upto = _le(t, T)
    keep = upto & (t >= T * (1.0 - WINDOW_TOKEN_SHARE))
    if not keep.any():  # no step inside the window (a run that logs rarely, or ends early): its last step
        return float(y[upto][-1]) if upto.any() else float("nan")
    return float(np.mean(y[keep]))


def values_at(t: np.ndarray, y: np.ndarray, T: float, per_step: bool) -> dict[str, float]:
    """One run's window, final and auc at T."""
    st, sy = _segment(t, y, T)
    if st.size == 0:
        return {q: float("nan") for q in ESTIMANDS}
    return {"window": window_mean(st, sy, per_step), "final": float(sy[-1]), "auc": _auc(st, sy)}


def pair_point(final_tokens: list[float], fixed: Optional[float]) -> float:
    """A pair's comparison point: --at-tokens when given, else the smaller of the arms' final token counts."""
    if fixed is not None:
        return float(fixed)
    finite = [x for x in final_tokens if not math.isnan(x)]
    return min(finite) if finite else float("nan")


def paired_seeds(seeds_a: list, seeds_b: list) -> bool:
    """Both arms hold the same known seeds, one run each."""
    return (
        None not in seeds_a
        and len(set(seeds_a)) == len(seeds_a)
        and len(set(seeds_b)) == len(seeds_b)
        and set(seeds_a) == set(seeds_b)
    )
