"""No function in rlcompare/ is longer than MAX_LINES lines (def to last line, docstring included) unless it is
listed below with the reason: a long function is one that cannot be read at once."""

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PKG = ROOT / "rlcompare"
MAX_LINES = 80

ALLOWED: dict[str, str] = {}  # "path:function" -> why it may be longer (none today; #49 split the last)


def _long_functions() -> dict[str, int]:
    out = {}
    for path in sorted(PKG.rglob("*.py")):
        rel = path.relative_to(PKG).as_posix()
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                n = node.end_lineno - node.lineno + 1
                if n > MAX_LINES:
                    out[f"{rel}:{node.name}"] = n
    return out


def _allowed(key: str) -> bool:
    path = key.split(":")[0]
    return key in ALLOWED or f"{path}:*" in ALLOWED


def test_no_function_is_longer_than_the_limit_without_a_reason():
    too_long = {k: n for k, n in _long_functions().items() if not _allowed(k)}
    assert too_long == {}, (
        f"functions over {MAX_LINES} lines: {too_long}; split them into named steps, or list "
        f"them in ALLOWED with the reason"
    )


def test_every_allowed_entry_has_a_reason():
    assert all(why.strip() for why in ALLOWED.values())


def test_every_allowed_entry_names_a_long_function():
    """An entry outlives its function's length: once under the limit (or gone), the entry goes too."""
    long = _long_functions()
    stale = [k for k in ALLOWED if not (k in long or (k.endswith(":*") and any(f.startswith(k[:-1]) for f in long)))]
    assert stale == [], f"ALLOWED entries for no function over {MAX_LINES} lines: {stale}"


# the front door and the scaling guide are read cold by newcomers (issue 43): past these, move detail into docs/
DOC_LINES = {"README.md": 250, "docs/scaling.md": 250}


@pytest.mark.parametrize("path", sorted(DOC_LINES))
def test_the_readme_and_the_scaling_guide_stay_short(path):
    lines = len((ROOT / path).read_text().splitlines())
    assert lines <= DOC_LINES[path], f"{path} has {lines} lines, over {DOC_LINES[path]}: move detail into docs/"


SCRIPTS_LINES = 1000  # scripts/ holds tools users and maintainers run; finished investigations leave it (#49)


def test_scripts_hold_tools_not_investigations():
    lines = {p.name: len(p.read_text().splitlines()) for p in sorted((ROOT / "scripts").iterdir()) if p.is_file()}
    assert sum(lines.values()) <= SCRIPTS_LINES, (
        f"scripts/ has {sum(lines.values())} lines, over {SCRIPTS_LINES} ({lines}): a finished investigation leaves "
        f"the product (its figures stay in docs/, the script in git history)"
    )
