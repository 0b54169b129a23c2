"""The layer table of docs/internals.md holds: every import of every module (read with `ast`, imports inside
functions included) goes where the table allows, no fast/ internals are reached from outside, no import cycles."""

from __future__ import annotations

import ast
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DOC = REPO / "docs" / "internals.md"
HEADER = "| package | job | may import | third-party |"
ROOTS = ("rlcompare", "hydra_plugins")  # the installed code: what the table rules
STDLIB = set(sys.stdlib_module_names)


@dataclass
class Rule:
    may_import: set[str]  # rlcompare packages (besides its own)
    only: set[str] | None = None  # third-party allowlist (direct imports)
    never: set[str] = field(default_factory=set)  # third-party never loaded (directly or through rlcompare modules)


@dataclass
class Import:
    target: str  # the module it loads (an rlcompare module name, or a third-party dotted name)
    line: int
    names: tuple[str, ...] = ()  # `from target import names` (only names that are not submodules)


# ----------------------------------------------------------------------------- the table
def _names(cell: str) -> set[str]:
    cell = cell.replace("`", "").strip()
    return set() if cell in ("—", "-", "") else {n.strip() for n in cell.split(",") if n.strip()}


def parse_table(text: str) -> dict[str, Rule]:
    """Rows of the layer table, keyed by `algos`, `train/precheck.py`, `cli.py`, `__init__.py`, `hydra_plugins/...`."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.strip() == HEADER)
    rules = {}
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            break
        key, _job, may, third = [c.strip() for c in line.strip().strip("|").split("|")]
        third = third.replace("`", "")
        rule = Rule(_names(may))
        if third.startswith("only "):
            rule.only = _names(third[5:])
        elif third.startswith("not "):
            rule.never = _names(third[4:])
        else:
            assert third == "any", f"third-party cell {third!r}: `only a, b`, `not a, b` or `any`"
        rules[key.strip("`")] = rule
    return rules


def package_of(module: str) -> str:
    """`rlcompare.train.run` -> `train`; `rlcompare.cli` -> `cli.py`; `rlcompare` -> `__init__.py`."""
    parts = module.split(".")
    if parts[0] == "hydra_plugins":
        return "hydra_plugins/" + parts[1]
    if len(parts) == 1:
        return "__init__.py"
    return parts[1] if len(parts) > 2 or f"{module}.__init__" in _PACKAGES else parts[1] + ".py"


_PACKAGES: set[str] = set()  # `x.__init__` markers of modules that are packages (filled by module_sources)


def rule_of(module: str, rules: dict[str, Rule]) -> Rule:
    parts = module.split(".")
    if len(parts) == 3 and f"{parts[1]}/{parts[2]}.py" in rules:  # a module's own row (train/precheck.py)
        return rules[f"{parts[1]}/{parts[2]}.py"]
    return rules[package_of(module)]


# ----------------------------------------------------------------------------- reading imports
def module_sources(root: Path = REPO) -> dict[str, str]:
    out = {}
    for top in ROOTS:
        for path in sorted((root / top).rglob("*.py")):
            rel = path.relative_to(root).with_suffix("").parts
            name = ".".join(rel[:-1] if rel[-1] == "__init__" else rel)
            if rel[-1] == "__init__":
                _PACKAGES.add(f"{name}.__init__")
            out[name] = path.read_text()
    return out


def imports_of(module: str, source: str, known: set[str], is_package: bool) -> list[Import]:
    """Every import statement of `module` (anywhere in it), resolved against the known rlcompare modules."""
    out = []
    package = module if is_package else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            for a in node.names:
                out.append(Import(a.name, node.lineno))
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module
            names = []
            for a in node.names:
                if f"{target}.{a.name}" in known:  # `from pkg import submodule`: loads that module
                    out.append(Import(f"{target}.{a.name}", node.lineno))
                else:
                    names.append(a.name)
            if names:
                out.append(Import(target, node.lineno, tuple(names)))
    return out


def internal(name: str) -> bool:
    return name.split(".")[0] in ROOTS


def parents(name: str) -> list[str]:
    parts = name.split(".")
    return [".".join(parts[:i]) for i in range(1, len(parts))]


# ----------------------------------------------------------------------------- the checks
def fast_public(sources: dict[str, str]) -> set[str]:
    tree = ast.parse(sources.get("rlcompare.fast", ""))
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "__all__" for t in node.targets):
            return set(ast.literal_eval(node.value))
    return set()


def moved_paths(sources: dict[str, str]) -> set[str]:
    for node in ast.parse(sources.get("rlcompare", "")).body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "MOVED" for t in node.targets):
            return set(ast.literal_eval(node.value))
    return set()


def graph(sources: dict[str, str]) -> dict[str, list[Import]]:
    known = set(sources)
    return {m: imports_of(m, src, known, f"{m}.__init__" in _PACKAGES) for m, src in sources.items()}


def violations(sources: dict[str, str], rules: dict[str, Rule]) -> list[str]:
    known, imports = set(sources), graph(sources)
    public, moved = fast_public(sources), moved_paths(sources)
    out = []
    for m, imps in imports.items():
        rule, pkg = rule_of(m, rules), package_of(m)
        in_fast = m == "rlcompare.fast" or m.startswith("rlcompare.fast.")
        for imp in imps:
            where = f"{m}:{imp.line} imports {imp.target}"
            if internal(imp.target):
                if imp.target in moved:
                    out.append(f"{where}: an old path kept for users; import {imp.target} from its new place")
                    continue
                if imp.target not in known:
                    out.append(f"{where}: no such module")
                    continue
                other = package_of(imp.target)
                if other not in (pkg, "__init__.py") and other not in rule.may_import:
                    out.append(
                        f"{where}: {pkg} may import {sorted(rule.may_import) or 'no other package'}, not {other}"
                    )
                if not in_fast and imp.target.startswith("rlcompare.fast."):
                    out.append(f"{where}: a fast/ internal; import its public names from rlcompare.fast")
                if not in_fast and imp.target == "rlcompare.fast":
                    for n in set(imp.names) - public:
                        out.append(f"{where}: {n} is not in rlcompare.fast.__all__")
            else:
                top = imp.target.split(".")[0]
                if top not in STDLIB and rule.only is not None and top not in rule.only:
                    out.append(f"{where}: {pkg} imports only {sorted(rule.only) or 'the standard library'}")
        # third-party never loaded, directly or through what it imports
        if rule.never:
            for top, path in third_party_reached(m, imports, known).items():
                if top in rule.never:
                    out.append(f"{m} loads {top} (through {' -> '.join(path)}): never in {pkg}")
    return out


def third_party_reached(start: str, imports: dict[str, list[Import]], known: set[str]) -> dict[str, list[str]]:
    """Third-party top-level names `start` can load, each with one import path to it."""
    seen, stack, out = {start: [start]}, [start], {}
    while stack:
        m = stack.pop()
        for imp in imports.get(m, []):
            if internal(imp.target):
                for t in parents(imp.target) + [imp.target]:  # importing a.b.c runs a and a.b first
                    if t in known and t not in seen:
                        seen[t] = seen[m] + [t]
                        stack.append(t)
            else:
                top = imp.target.split(".")[0]
                if top not in STDLIB and top not in out:
                    out[top] = seen[m] + [imp.target]
    return out


def find_cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one node (or a self-loop), Tarjan's algorithm."""
    index, low, on, stack, comps, counter = {}, {}, set(), [], [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in edges.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1 or v in edges.get(v, ()):
                comps.append(sorted(comp))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return comps


def module_edges(sources: dict[str, str]) -> dict[str, set[str]]:
    known = set(sources)
    return {m: {i.target for i in imps if i.target in known and i.target != m} for m, imps in graph(sources).items()}


def package_edges(sources: dict[str, str]) -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for m, targets in module_edges(sources).items():
        src = package_of(m)
        out.setdefault(src, set())
        out[src] |= {package_of(t) for t in targets if package_of(t) not in (src, "__init__.py")}
    return out


# ----------------------------------------------------------------------------- the tests
SOURCES = module_sources()
RULES = parse_table(DOC.read_text())


def test_the_table_has_a_row_for_every_package_and_module_beside_them():
    have = {package_of(m) for m in SOURCES}
    assert have - set(RULES) == set(), (
        "add a row to docs/internals.md's layer table (or move the module into a package)"
    )
    assert {
        "algos",
        "config",
        "data",
        "rewards",
        "models",
        "rollout",
        "fast",
        "train",
        "sweep",
        "report",
        "bench",
        "cli.py",
    } <= set(RULES)
    assert set(RULES) - have - {k for k in RULES if k.endswith(".py") and "/" in k} == set(), "a row names no package"


def test_the_table_says_what_the_design_says():
    # the math imports no other package; only registry.py and specs_common.py, the stdlib-only rules every extension
    # registry follows (a taken name refused; a knob declared with its default and help)
    assert RULES["algos"].may_import <= {"registry.py", "specs_common.py"} and RULES["algos"].only == {"torch"}
    assert "torch" in RULES["report"].never and not RULES["report"].may_import & {"train", "models", "algos"}
    assert not RULES["train"].may_import & {"report", "sweep", "bench", "cli.py"}
    assert all("cli.py" not in r.may_import for r in RULES.values())


def test_every_import_follows_the_layer_table():
    assert violations(SOURCES, RULES) == []


def test_no_import_cycle_between_packages_or_modules():
    assert find_cycles(package_edges(SOURCES)) == []
    assert find_cycles(module_edges(SOURCES)) == []


def test_every_rlcompare_import_in_the_repo_names_a_module_here():
    """Tests and scripts too: an old flat path (`rlcompare.trainer`) would otherwise still import from another
    install of rlcompare on the path. Old paths of rlcompare.MOVED (the documented ones) are fine outside."""
    known, moved = set(SOURCES), moved_paths(SOURCES)
    bad = []
    for path in sorted(p for d in ("tests", "scripts") for p in (REPO / d).rglob("*.py")):
        for imp in imports_of("tests.x", path.read_text(), known, False):
            if imp.target.split(".")[0] == "rlcompare" and imp.target not in known | moved:
                bad.append(f"{path.relative_to(REPO)}:{imp.line} {imp.target}")
    assert bad == []


def test_every_name_imported_from_an_rlcompare_module_is_there():
    """`from rlcompare.x import name` everywhere (imports inside functions too, which a run may never reach):
    the name is in that module, e.g. still re-exported where it moved from."""
    import importlib

    known, moved = set(SOURCES), moved_paths(SOURCES)
    found = [(m, imports_of(m, src, known, f"{m}.__init__" in _PACKAGES)) for m, src in SOURCES.items()]
    for path in sorted(p for d in ("tests", "scripts") for p in (REPO / d).rglob("*.py")):
        found.append((str(path.relative_to(REPO)), imports_of("tests.x", path.read_text(), known, False)))
    missing = []
    for where, imps in found:
        for imp in imps:
            if imp.target.split(".")[0] in ROOTS and imp.target in known | moved and imp.names:
                module = importlib.import_module(imp.target)
                missing += [
                    f"{where}:{imp.line} {imp.target}.{n}" for n in imp.names if n != "*" and not hasattr(module, n)
                ]
    assert missing == []


# ----------------------------------------------------------------------------- the checks can fail
def _check(extra: dict[str, str]) -> list[str]:
    return violations({**SOURCES, **extra}, RULES)


def test_the_checks_catch_a_forbidden_import():
    found = _check(
        {
            "rlcompare.algos.bad": "import transformers\nfrom rlcompare.train import trainer\n",
            "rlcompare.report.bad": "def f():\n    import torch\n",
            "rlcompare.report.bad2": "from rlcompare.models import load_policy\n",
            "rlcompare.train.bad": "def f():\n    from rlcompare.report import build_report\n    from rlcompare import cli\n"
            "    from rlcompare.sweep import launch\n",
            "rlcompare.rollout.bad": "from rlcompare.fast.static_decode import supports\n",
            "rlcompare.bench.bad": "from rlcompare.fast import static_decode\nfrom rlcompare.fast import _replay\n",
            "rlcompare.data.bad": "from rlcompare.losses import policy_loss\nimport rlcompare.trainer\n",
            "rlcompare.sweep.bad": "from rlcompare.train import trainer\n",  # allowed package, but it loads torch
        }
    )
    text = "\n".join(found)
    for expected in (
        "rlcompare.algos.bad:1 imports transformers",
        "rlcompare.algos.bad:2 imports rlcompare.train.trainer",
        "rlcompare.report.bad loads torch",
        "rlcompare.report.bad2:1 imports rlcompare.models",
        "rlcompare.train.bad:2 imports rlcompare.report",
        "rlcompare.train.bad:3 imports rlcompare.cli",
        "rlcompare.train.bad:4 imports rlcompare.sweep.launch",
        "rlcompare.rollout.bad:1 imports rlcompare.fast.static_decode: a fast/ internal",
        "rlcompare.bench.bad:1 imports rlcompare.fast.static_decode: a fast/ internal",
        "_replay is not in rlcompare.fast.__all__",
        "rlcompare.data.bad:1 imports rlcompare.losses: an old path",
        "rlcompare.data.bad:2 imports rlcompare.trainer: no such module",
        "rlcompare.sweep.bad loads torch",
    ):
        assert expected in text, f"{expected!r} not found in:\n{text}"


def test_the_checks_catch_a_cycle():
    src = {**SOURCES, "rlcompare.config.bad": "def f():\n    from rlcompare.train import run\n"}
    assert any({"config", "train"} <= set(c) for c in find_cycles(package_edges(src)))
    assert find_cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    src = {
        **SOURCES,
        "rlcompare.data.a": "from rlcompare.data import b\n",
        "rlcompare.data.b": "import rlcompare.data.a\n",
    }
    assert ["rlcompare.data.a", "rlcompare.data.b"] in find_cycles(module_edges(src))


def test_the_table_is_read_from_the_doc():
    text = DOC.read_text()
    assert HEADER in text
    changed = re.sub(r"(\| `algos` \|[^\n]*\| )only torch \|", r"\1only torch, transformers |", text)
    assert changed != text and parse_table(changed)["algos"].only == {"torch", "transformers"}
