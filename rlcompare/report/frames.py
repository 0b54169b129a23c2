"""A results file's rows as a pandas frame (`read_jsonl_frame`, `finite_frame`), its columns as floats
(`column_floats`), and infinite values set aside (`set_aside_infinite`). Rows that `rlcompare train` writes (the
same keys on every row, numbers or null) become columns without pandas' inference over dicts, and their float
columns are kept for `column_floats`: over thousands of runs, building frames and reading columns back out of
them was most of what remained of a report's time once YAML was fast (issue 41 item 19)."""

from __future__ import annotations

import itertools
import math
import weakref
from pathlib import Path
from typing import Any, Optional

import numpy as np
import pandas as pd

from rlcompare.results import scan_jsonl


def read_jsonl_frame(path: Path) -> tuple[pd.DataFrame, int, bool]:
    """A jsonl file as a frame, read by the one results reader (`tracking.scan_jsonl`: lines that do not parse,
    e.g. a torn last line, are skipped); numeric-looking object columns become numbers.

    Returns (frame, number of bad lines, whether the bad lines were only the last one).
    """
    rows, n_bad, only_last = scan_jsonl(path)
    table = _number_table(rows)
    return (_rows_frame(rows) if table is None else pd.DataFrame(_columns(*table))), n_bad, only_last


def _rows_frame(rows: list[dict]) -> pd.DataFrame:
    """pandas' frame of the rows, object columns that hold only numbers (as text too) made numeric."""
    df = pd.DataFrame(rows)
    for col in [c for c, dtype in zip(df.columns, df.dtypes) if dtype == object]:  # not df[c] per column: slow
        conv = _numeric(df[col])
        if conv.notna().sum() == df[col].notna().sum():
            df[col] = conv
    return df


def _number_table(rows: list[dict]) -> Optional[tuple[list[str], np.ndarray, dict[int, np.ndarray]]]:
    """Rows that all hold the same keys in the same order, each value a number or null (what `rlcompare train`
    writes), as (keys, every column as floats (null: nan), column index -> int64 column where every value is an
    int): the arrays pandas would make of them, made several times faster than pandas' inference over dicts, which
    the report did for every file of thousands of runs. None for any other rows (booleans, text, keys that differ
    from row to row, an int beyond int64): pandas reads those."""
    keys = list(rows[0]) if rows else []
    if not keys or any(list(r) != keys for r in rows):
        return None
    table = [list(r.values()) for r in rows]
    if not set(map(type, itertools.chain.from_iterable(table))) <= _NUMBER_KINDS:
        return None
    try:
        floats = np.array(table, dtype=float)  # null -> nan
        all_int = np.array([[type(v) is int for v in row] for row in table]).all(axis=0)
        ints = {j: np.array([row[j] for row in table], dtype=np.int64) for j in np.flatnonzero(all_int)}
    except OverflowError:
        return None
    return keys, floats, ints


def _columns(keys: list[str], floats: np.ndarray, ints: dict[int, np.ndarray]) -> dict[str, np.ndarray]:
    return {key: ints[j] if j in ints else floats[:, j] for j, key in enumerate(keys)}


_NUMBER_KINDS = frozenset({int, float, type(None)})


def _numeric(col: pd.Series) -> pd.Series:
    """pd.to_numeric(errors="coerce"), except that an integer beyond a float's range (a 400-digit number) reads as
    ±inf instead of raising: `set_aside_infinite` then removes and counts it like any other infinite value."""
    if col.dtype.kind in "fiu":
        return col  # already numbers (to_numeric would return them as they are, slower)
    try:
        return pd.to_numeric(col, errors="coerce")
    except OverflowError:
        return pd.Series([_as_float(v) for v in col], index=col.index, dtype=float)


def _as_float(v: Any) -> float:
    if isinstance(v, int) and not isinstance(v, bool):
        try:
            return float(v)
        except OverflowError:
            return math.inf if v > 0 else -math.inf
    try:
        return float(v)
    except (TypeError, ValueError):
        return math.nan


def set_aside_infinite(df: pd.DataFrame) -> dict[str, int]:
    """Infinite values in the numeric columns become missing (nan), in place; returns column -> how many.

    `rlcompare train` writes non-finite figures as null, so an infinite value was written by something else: it is
    never compared (it would make every mean and interval of its variant inf), and the report flags it."""
    floats = df.select_dtypes(include="floating")
    if floats.empty or not np.isinf(floats.to_numpy()).any():  # the usual case, checked in one pass
        return {}
    counts = {}
    for col in floats.columns:
        bad = np.isinf(df[col].to_numpy())
        if bad.any():
            df.loc[bad, col] = np.nan
            counts[col] = int(bad.sum())
    return counts


def finite_frame(rows: list[dict]) -> tuple[pd.DataFrame, dict[str, int]]:
    """The rows' frame with infinite values set aside (`set_aside_infinite`), and column -> how many."""
    table = _number_table(rows)
    if table is None:
        df = _rows_frame(rows)
        return df, set_aside_infinite(df)
    keys, floats, ints = table
    infinite = np.isinf(floats)  # never in an int column: an int beyond a float's range is not read here
    set_aside = {keys[j]: int(infinite[:, j].sum()) for j in np.flatnonzero(infinite.any(axis=0))}
    floats[infinite] = np.nan
    floats.flags.writeable = False
    df = pd.DataFrame(_columns(keys, floats, ints))  # its own copy of the arrays
    _floats_of(df).update({key: floats[:, j] for j, key in enumerate(keys)})
    return df, set_aside


# frame id -> column -> the column as floats, read-only: every curve of a run reads its frame's tokens column, and a
# report reads a run's curves several times. A frame's entry goes with the frame. Frames are not changed once read.
_FLOATS: dict[int, dict[str, np.ndarray]] = {}


def frame_memo(store: dict[int, dict], df: pd.DataFrame) -> dict:
    """`store`'s entry for this frame (a new dict the first time), dropped with the frame."""
    memo = store.get(id(df))
    if memo is None:
        memo = store[id(df)] = {}
        weakref.finalize(df, store.pop, id(df), None)
    return memo


def _floats_of(df: pd.DataFrame) -> dict[str, np.ndarray]:
    return frame_memo(_FLOATS, df)


def column_floats(df: pd.DataFrame, col: str) -> np.ndarray:
    """A column of the frame as floats (`_numeric`: text that is not a number is nan); read-only, read once."""
    floats = _floats_of(df)
    if col not in floats:
        (floats[col],) = frozen(_numeric(df[col]).to_numpy(float, copy=True))
    return floats[col]


def frozen(*arrays: np.ndarray) -> tuple[np.ndarray, ...]:
    """The arrays, made read-only: memoised and shared by every caller."""
    for a in arrays:
        a.flags.writeable = False
    return arrays
