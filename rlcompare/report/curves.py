"""One run's curves against generated tokens: a column as (tokens, values), cut or interpolated at the
comparison point, its AUC, the tokens to reach a threshold, step means and wall time there."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from .load import TOKENS, Run


def _curve(df: pd.DataFrame, col: str) -> tuple[np.ndarray, np.ndarray]:
    """(tokens, values) sorted by tokens, NaNs dropped, duplicate token counts keep the last row."""
    if df.empty or col not in df.columns or TOKENS not in df.columns:
        return np.array([]), np.array([])
    sub = df[[TOKENS, col]].apply(pd.to_numeric, errors="coerce").dropna()
    if sub.empty:
        return np.array([]), np.array([])
    sub = sub.drop_duplicates(subset=TOKENS, keep="last").sort_values(TOKENS, kind="stable")
    return sub[TOKENS].to_numpy(float), sub[col].to_numpy(float)


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
            col = pd.to_numeric(df[TOKENS], errors="coerce").dropna()
            if not col.empty:
                vals.append(float(col.max()))
    if not vals and run.summary and isinstance(run.summary.get(TOKENS), (int, float)):
        vals.append(float(run.summary[TOKENS]))
    return max(vals) if vals else float("nan")


def _step_mean(df: pd.DataFrame, col: str, T: float) -> float:
    if df.empty or col not in df.columns:
        return float("nan")
    sub = df
    if TOKENS in df.columns:
        sub = df[_le(pd.to_numeric(df[TOKENS], errors="coerce").to_numpy(float), T)]
    vals = pd.to_numeric(sub[col], errors="coerce").dropna()
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
