"""The one reader of results/ files (metrics/eval/samples.jsonl): resume and the W&B read-back
(`rlcompare.train`) and the report (`rlcompare.report`) read rows through it. Standard library only.
"""

from __future__ import annotations

import itertools
import json
from pathlib import Path

from rlcompare.passk import MAX_SAMPLES  # plain Python: what eval.samples allows, the most a counts row may hold


def read_jsonl(path: str | Path) -> list[dict]:
    """Rows of a jsonl file; a torn last line (a kill mid-write, no newline) is dropped, as is any line that
    does not parse as a JSON object. (What resume and the W&B read-back trust; the report reads `scan_jsonl`.)"""
    whole = itertools.takewhile(lambda line: line.endswith("\n"), _lines(path))  # stop at a torn last line
    return json_objects(whole)


def scan_jsonl(path: str | Path) -> tuple[list[dict], int, bool]:
    """Every non-empty line of a jsonl file that parses as a JSON object, tolerantly (the report's reader):
    (rows, number of non-empty lines that do not, whether that is only the last one, e.g. a torn write).
    A missing file reads as ([], 0, True)."""
    lines = [line for line in _lines(path) if line.strip()]
    rows, bad = [], []
    for i, line in enumerate(lines):
        obj = _json_object(line)
        if obj is None:
            bad.append(i)
        else:
            rows.append(obj)
    return rows, len(bad), bad == [len(lines) - 1] if bad else True


def _lines(path: str | Path) -> list[str]:
    """The lines of a results file (undecodable bytes replaced); none when it does not exist or is not a file
    (a folder named like one)."""
    p = Path(path)
    if not p.is_file():
        return []
    with open(p, encoding="utf-8", errors="replace") as f:
        return list(f)


def parse_json(text: str):
    """json.loads, with JSON nested too deeply for the parser (RecursionError) refused as ValueError like any other
    malformed text, so that every reader's `except ValueError` covers it."""
    try:
        return json.loads(text)
    except RecursionError:
        raise ValueError("JSON nested too deeply") from None


def _json_object(line: str) -> dict | None:
    try:
        obj = parse_json(line)
    except ValueError:
        return None
    return obj if isinstance(obj, dict) else None


def json_objects(lines) -> list[dict]:
    """The lines that parse as JSON objects, parsed; any other line is skipped."""
    return [obj for obj in map(_json_object, lines) if obj is not None]


# one row per sampled eval: {"step", "tokens/generated", "n": [n_i], "c": [c_i], "k": [k], "maj": [[m_ik] per k]}
EVAL_COUNTS = "eval_counts.jsonl"


def read_eval_counts(path: str | Path) -> tuple[list[dict], list[str]]:
    """The rows of an eval_counts.jsonl file whose shapes hold (an integer step; `n` and `c` lists of one integer
    per held-out prompt each, the same length, 0 <= c_i <= n_i, 1 <= n_i <= passk.MAX_SAMPLES: a crafted n of
    10**12 would keep pass@k's product busy for hours), and a note per row set aside (a torn or unreadable line, a
    bad shape). A file that is absent reads as no rows and no notes."""
    rows, bad, _ = scan_jsonl(path)
    notes = [f"{Path(path).name}: {bad} unreadable line(s) dropped"] if bad else []
    kept = []
    for i, row in enumerate(rows):
        why = _counts_problem(row)
        if why:
            notes.append(f"{Path(path).name}: row {i + 1} set aside ({why})")
            continue
        why = _majority_problem(row)
        if why:  # the counts stand; only maj@k cannot be recomputed from this row
            notes.append(f"{Path(path).name}: row {i + 1}'s majority votes set aside ({why})")
            row = {key: v for key, v in row.items() if key not in ("k", "maj")}
        kept.append(row)
    return kept, notes


def _is_int(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _majority_problem(row: dict) -> str | None:
    """Why a row's optional majority votes ("k": the reported k, "maj": per k one 0/1 per prompt) do not hold."""
    if "k" not in row and "maj" not in row:
        return None
    ks, maj = row.get("k"), row.get("maj")
    if not isinstance(ks, list) or not all(_is_int(k) and k >= 1 for k in ks) or len(set(ks)) != len(ks):
        return "k must be a list of distinct integers >= 1"
    if not isinstance(maj, list) or len(maj) != len(ks):
        return f"maj must hold one list per k ({len(ks)})"
    width = len(row["n"])
    if not all(isinstance(m, list) and len(m) == width and all(v in (0, 1) and _is_int(v) for v in m) for m in maj):
        return f"each maj list must hold one 0 or 1 per prompt ({width})"
    return None


def _counts_problem(row: dict) -> str | None:
    """Why an eval_counts row's shape does not hold, or None."""
    if not _is_int(row.get("step")):
        return "no integer step"
    n, c = row.get("n"), row.get("c")
    if not isinstance(n, list) or not isinstance(c, list) or not n:
        return "n and c must be non-empty lists"
    if len(n) != len(c):
        return f"{len(n)} sample counts but {len(c)} correct counts"
    if not all(_is_int(a) and _is_int(b) and 1 <= a <= MAX_SAMPLES and 0 <= b <= a for a, b in zip(n, c)):
        return f"every n_i must be an integer in 1..{MAX_SAMPLES} (eval.samples' maximum) and c_i in 0..n_i"
    return None
