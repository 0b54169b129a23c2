"""Every name the documented library API lists (docs/api.md, linked from the README) imports from its path."""

import importlib
import re
from pathlib import Path

API = Path(__file__).resolve().parents[1] / "docs" / "api.md"


def documented_names() -> list[tuple[str, str]]:
    """(module, name) for each `- \\`name(...)\\`` entry under a `## \\`rlcompare.x\\`` heading, and each
    `from rlcompare.x import a, b` line of the examples."""
    out, module = [], None
    for line in API.read_text().splitlines():
        head = re.match(r"## `(rlcompare[\w.]*)`", line)
        if head:
            module = head.group(1)
            continue
        entry = re.match(r"- `(\w+)\(", line)
        if entry and module:
            out.append((module, entry.group(1)))
        imp = re.match(r"\s*from (rlcompare[\w.]*) import (.+)", line)
        if imp:
            out += [(imp.group(1), n.strip()) for n in imp.group(2).split("#")[0].split(",")]
    return out


def test_the_api_page_lists_the_core_functions():
    names = {n for _, n in documented_names()}
    assert {"policy_loss", "group_advantages", "aggregate", "build_verifier", "score_batch"} <= names


def test_every_documented_name_imports_from_its_documented_path():
    missing = [f"{m}.{n}" for m, n in documented_names() if not hasattr(importlib.import_module(m), n)]
    assert missing == []
