"""How the report writes numbers and table cells (markdown, CSV), shared by its tables, notes and plots."""

from __future__ import annotations

import math
from typing import Any


def _isnan(v: Any) -> bool:
    return isinstance(v, float) and math.isnan(v)


def _short(v: Any) -> str:
    s = str(v)
    return s if len(s) <= 24 else s[:10] + "…" + s[-8:]


def _fmt_tokens(x: float) -> str:
    if x is None or _isnan(x):
        return "—"
    x = float(x)
    if abs(x) >= 1e9:
        return f"{x / 1e9:.3g}B"
    if abs(x) >= 1e6:
        return f"{x / 1e6:.3g}M"
    if abs(x) >= 1e4:
        return f"{x / 1e3:.3g}k"
    return f"{x:,.0f}"


def _fmt(x: float, kind: str) -> str:
    if x is None or _isnan(x):
        return "—"
    if kind == "tokens":
        return _fmt_tokens(x)
    if kind in ("length", "seconds", "rate"):
        return f"{x:,.1f}"
    return f"{x:.3f}"


def _md_table(header: list[str], rows: list[list[str]]) -> str:
    esc = lambda s: str(s).replace("|", "\\|")
    lines = ["| " + " | ".join(map(esc, header)) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(map(esc, r)) + " |" for r in rows]
    return "\n".join(lines)


def _seedset(s: set) -> str:
    return "{" + ", ".join(str(x) for x in sorted(s, key=lambda v: (v is None, v if v is not None else 0))) + "}"
