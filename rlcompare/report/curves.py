"""One run's curves against generated tokens: a column as (tokens, values), cut or interpolated at the
comparison point, its AUC, the tokens to reach a threshold, step means and wall time there."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from .frames import column_floats, frame_memo, frozen
from .load import TOKENS, Run


# frame id -> column -> its curve: the report reads each run's curves many times (values at the comparison point,
# its wall time, the compute fit, the plots); a frame's entry goes with the frame. Frames are not changed once read.
_CURVES: dict[int, dict[str, tuple[np.ndarray, np.ndarray]]] = {}


def _curve(df: pd.DataFrame, col: str) -> tuple[np.ndarray, np.ndarray]:
    """(tokens, values) sorted by tokens, rows with a missing or non-finite value dropped, duplicate token counts
    keep the last row. Read once per frame and column; the arrays are read-only (shared by every caller)."""
    memo = frame_memo(_CURVES, df)
    if col not in memo:
        memo[col] = _read_curve(df, col)
    return memo[col]


def _read_curve(df: pd.DataFrame, col: str) -> tuple[np.ndarray, np.ndarray]:
    if df.empty or col not in df.columns or TOKENS not in df.columns:
        return frozen(np.array([]), np.array([]))
    t = column_floats(df, TOKENS)
    y = column_floats(df, col)
    keep = np.isfinite(t) & np.isfinite(y)
    order = np.argsort(t[keep], kind="stable")  # rows of one token count stay in file order: the last one is kept
    t, y = t[keep][order], y[keep][order]
    last = np.append(t[1:] != t[:-1], True) if t.size else np.zeros(0, bool)
    return frozen(t[last], y[last])


def _le(t: np.ndarray, T: float) -> np.ndarray:
    return t <= T + 1e-9 * max(1.0, abs(T))


def _segment(t: np.ndarray, y: np.ndarray, T: float) -> tuple[np.ndarray, np.ndarray]:
    """Curve cut at T tokens: rows <= T, ending exactly at T with a value linearly interpolated
    between the rows around T when no row sits there. A curve that ends before T is returned
    whole (it ends early); one that starts after T gives empty arrays."""
    if t.size == 0 or T < t[0] - 1e-9 * max(1.0, abs(T)):
        return np.array([]), np.array([])
    mask = _le(t, T)
    st, sy = t[mask], y[mask]
    if T <= t[-1] and not math.isclose(st[-1], T, rel_tol=1e-9, abs_tol=1e-9):
        st = np.append(st, T)
        sy = np.append(sy, np.interp(T, t, y))
    return st, sy


def _value_at(t: np.ndarray, y: np.ndarray, T: float) -> tuple[float, float]:
    """(value, tokens) at the comparison point (interpolated; the last row if the curve ends before T)."""
    st, sy = _segment(t, y, T)
    if st.size == 0:
        return float("nan"), float("nan")
    return float(sy[-1]), float(st[-1])


def _auc(t: np.ndarray, y: np.ndarray) -> float:
    """Trapezoid area under y(t) divided by the token span: a mean value over tokens."""
    if t.size == 0:
        return float("nan")
    span = t[-1] - t[0]
    if t.size == 1 or span <= 0:
        return float(y[-1])
    return float(np.sum((y[1:] + y[:-1]) / 2.0 * np.diff(t)) / span)


def tokens_to_reach(t: np.ndarray, y: np.ndarray, threshold: float) -> float:
    """Generated tokens at which y first reaches threshold (linear between eval rows); nan if never."""
    hits = np.nonzero(y >= threshold)[0]
    if hits.size == 0:
        return float("nan")
    i = int(hits[0])
    if i == 0:
        return float(t[0])
    t0, t1, y0, y1 = t[i - 1], t[i], y[i - 1], y[i]
    if y1 == y0:
        return float(t1)
    return float(t0 + (threshold - y0) / (y1 - y0) * (t1 - t0))


def _final_tokens(run: Run) -> float:
    vals = []
    for df in (run.metrics, run.evals):
        if not df.empty and TOKENS in df.columns:
            col = column_floats(df, TOKENS)
            col = col[~np.isnan(col)]
            if col.size:
                vals.append(float(col.max()))
    if not vals and run.summary and isinstance(run.summary.get(TOKENS), (int, float)):
        vals.append(float(run.summary[TOKENS]))
    return max(vals) if vals else float("nan")


def _step_mean(df: pd.DataFrame, col: str, T: float) -> float:
    if df.empty or col not in df.columns:
        return float("nan")
    vals = column_floats(df, col)
    if TOKENS in df.columns:
        vals = vals[_le(column_floats(df, TOKENS), T)]
    vals = vals[~np.isnan(vals)]
    return float(vals.mean()) if len(vals) else float("nan")


def _wall_time(run: Run, T: float) -> tuple[float, float]:
    """(elapsed seconds, tokens/s) at the comparison point."""
    for df in (run.metrics, run.evals):
        t, y = _curve(df, "time/elapsed_s")
        if t.size:
            wall, at = _value_at(t, y, T)
            if not math.isnan(wall):
                rate = at / wall if wall > 0 else float("nan")
                return wall, rate
    return float("nan"), float("nan")
