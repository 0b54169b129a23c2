"""Rows of a local prompt file (.jsonl / .json / .csv / .parquet), each with the line it starts on.

A file on disk is untrusted input. Every problem is one ValueError naming the setting, the file and the line (the
row for .json and .parquet): bytes that are not UTF-8, invalid JSON, JSON nested deeper than `MAX_JSON_DEPTH`, an
integer too long to read, a CSV record with more or fewer fields than its header (pandas took a record with one
field more as an index and shifted every column). Nothing is unpickled or run.
"""

from __future__ import annotations

import csv
import io
import json
import os
import re
import sys
from dataclasses import dataclass
from typing import Any

FILE_TYPES = (".jsonl", ".json", ".csv", ".parquet")
MAX_JSON_DEPTH = 100  # a prompt row is flat; deeper JSON is refused before Python's reader runs out of stack
_MAX_INT_DIGITS = sys.get_int_max_str_digits() if hasattr(sys, "get_int_max_str_digits") else 4300


@dataclass
class Rows:
    """The rows of a prompt set and where each one is (`at(i)`: 'line 7' in a line-based file, else 'row 6')."""

    rows: list[dict]
    lines: list[int] | None = None  # the file line each row starts on (.jsonl, .csv); None: counted rows

    def at(self, i: int) -> str:
        return f"line {self.lines[i]}" if self.lines is not None else f"row {i}"


def read_rows(path: str, key: str = "prompts.path") -> Rows:
    """The rows of a local .jsonl / .json / .csv / .parquet file; a ValueError naming the file (and line) on any
    problem."""
    where = f"{key}={path!r}"
    if not path:
        raise ValueError(f"{key} is not set; give a .jsonl, .json, .csv or .parquet file")
    if not os.path.isfile(path):
        raise ValueError(f"{where}: file not found (working directory {os.getcwd()})")
    ext = os.path.splitext(path)[1].lower()
    if ext not in FILE_TYPES:
        raise ValueError(f"{where}: unknown file type {ext!r}; use one of: {', '.join(FILE_TYPES)}")
    if ext == ".parquet":
        return _parquet_rows(path, where)
    with open(path, "rb") as f:
        text = _decode(f.read(), where)
    if ext == ".csv":
        return _csv_rows(text, where)
    if ext == ".json":
        data = json_value(text, where, 1)
        if isinstance(data, dict) and isinstance(data.get("data"), list):
            data = data["data"]
        if not isinstance(data, list) or not all(isinstance(r, dict) for r in data):
            raise ValueError(f'{where}: expected a JSON list of objects (or {{"data": [...]}})')
        return Rows(data)
    rows, lines = [], []
    for n, line in enumerate(text.split("\n"), 1):
        if line.strip():
            row = json_value(line, where, n)
            if not isinstance(row, dict):
                raise ValueError(f"{where}: line {n} is not a JSON object")
            rows.append(row)
            lines.append(n)
    return Rows(rows, lines)


def _decode(data: bytes, where: str) -> str:
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        line = data.count(b"\n", 0, e.start) + 1
        raise ValueError(
            f"{where}: line {line} is not UTF-8 text (byte {data[e.start]:#04x}); save the file as UTF-8"
        ) from None


def json_value(text: str, where: str, line: int) -> Any:
    """`text` (starting on file line `line`) as JSON; a ValueError naming the line when it is not valid, nests
    deeper than MAX_JSON_DEPTH or holds an integer longer than Python reads."""
    deep = _too_deep(text)
    if deep is not None:
        raise ValueError(f"{where}: line {line + deep}: JSON nested more than {MAX_JSON_DEPTH} levels deep")
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"{where}: line {line + e.lineno - 1} is not valid JSON ({e.msg})") from None
    except ValueError:  # an integer literal past Python's int-to-str limit
        m = re.search(rf"[0-9]{{{_MAX_INT_DIGITS + 1},}}", text)
        at = line + (text.count("\n", 0, m.start()) if m else 0)
        raise ValueError(f"{where}: line {at} holds an integer longer than {_MAX_INT_DIGITS} digits") from None


_BRACKETS = re.compile(r'"(?:[^"\\]|\\.)*"|[\[{]|[\]}]', re.S)


def _too_deep(text: str) -> int | None:
    """The line offset (0: the first) where `text` first nests deeper than MAX_JSON_DEPTH, or None. Quick exit:
    text with at most MAX_JSON_DEPTH opening brackets cannot."""
    if text.count("[") + text.count("{") <= MAX_JSON_DEPTH:
        return None
    depth = 0
    for m in _BRACKETS.finditer(text):
        ch = m.group()
        if ch in "[{":
            depth += 1
            if depth > MAX_JSON_DEPTH:
                return text.count("\n", 0, m.start())
        elif ch in "]}":
            depth -= 1
    return None


def _csv_rows(text: str, where: str) -> Rows:
    """Rows keyed by the header's names, every field a string (as pandas' `dtype=str, keep_default_na=False`)."""
    reader = csv.reader(io.StringIO(text, newline=""))
    header: list[str] | None = None
    rows, lines, end = [], [], 0
    try:
        for record in reader:
            start, end = end + 1, reader.line_num
            if not record:
                continue  # a blank line
            if header is None:
                header, header_line = record, start
                twice = sorted({h for h in header if header.count(h) > 1})
                if twice:
                    raise ValueError(f"{where}: line {start}: the header names column {twice[0]!r} twice")
                continue
            if len(record) != len(header):
                raise ValueError(
                    f"{where}: line {start} has {len(record)} fields but the header (line {header_line}) has "
                    f"{len(header)} ({', '.join(header)[:200]}); quote a field that holds a comma"
                )
            rows.append(dict(zip(header, record)))
            lines.append(start)
    except csv.Error as e:
        raise ValueError(f"{where}: line {reader.line_num} is not valid CSV ({e})") from None
    return Rows(rows, lines)


def _parquet_rows(path: str, where: str) -> Rows:
    import pandas as pd

    try:
        df = pd.read_parquet(path)
    except Exception as e:
        raise ValueError(f"{where}: could not read the file ({type(e).__name__}: {e})") from None
    return Rows(df.to_dict("records"))
