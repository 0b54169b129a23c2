"""Reading a results folder: which folders are runs (`find_run_dirs`), each run's files read tolerantly
(`load_run` -> `Run`), its seed and variant name from the folder name (`strip_seed`). Never imports torch."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

import pandas as pd

from rlcompare.results import parse_json, scan_jsonl
from .block_yaml import read_block_yaml
from .frames import finite_frame, read_jsonl_frame, set_aside_infinite  # noqa: F401 - the last two public here too


RUN_MARKERS = ("config.yaml", "metrics.jsonl")
SKIP_DIRS = {"wandb", "checkpoints", "__pycache__", "node_modules"}
TOKENS = "tokens/generated"


class ReportError(Exception):
    """A user-facing problem (bad folder, unknown metric): one line, exit code 2."""


read_jsonl = read_jsonl_frame  # its name before tracking.read_jsonl (rows as dicts) became the one reader's face


def _read_json(path: Path) -> tuple[Optional[dict], bool]:
    """(content, corrupt). Missing file -> (None, False)."""
    try:
        obj = parse_json(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None, False
    except (ValueError, OSError):
        return None, True
    return (obj if isinstance(obj, dict) else None), not isinstance(obj, dict)


def _read_yaml(path: Path) -> dict:
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (FileNotFoundError, OSError):
        return {}
    fast = read_block_yaml(text)  # the block YAML `rlcompare train` writes, without PyYAML's Python constructor
    if fast is not None:
        return fast
    try:
        import yaml  # PyYAML (omegaconf depends on it)

        # libyaml's loader where PyYAML was built with it: config.yaml is most of the reading over thousands of runs
        obj = yaml.load(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
        return obj if isinstance(obj, dict) else {}
    except ImportError:  # pragma: no cover - PyYAML is normally present
        return _mini_yaml(text)
    except Exception:
        return _mini_yaml(text)


def _mini_yaml(text: str) -> dict:
    """Fallback for simple `key: scalar` mappings nested by indentation."""
    root: dict = {}
    stack: list[tuple[int, dict]] = [(-1, root)]
    for raw in text.splitlines():
        line = raw.split(" #", 1)[0].rstrip()
        if not line.strip() or line.lstrip().startswith(("#", "-")) or ":" not in line:
            continue
        indent = len(line) - len(line.lstrip())
        key, _, val = line.strip().partition(":")
        while stack and indent <= stack[-1][0]:
            stack.pop()
        parent = stack[-1][1] if stack else root
        val = val.strip()
        if not val:
            child: dict = {}
            parent[key] = child
            stack.append((indent, child))
        else:
            parent[key] = _scalar(val)
    return root


def _scalar(val: str) -> Any:
    v = val.strip().strip("'\"")
    if v in ("null", "~", "None"):
        return None
    if v in ("true", "True"):
        return True
    if v in ("false", "False"):
        return False
    try:
        return int(v)
    except ValueError:
        pass
    try:
        return float(v)
    except ValueError:
        return v


def find_run_dirs(root: Path, skip: Optional[set] = None) -> list[Path]:
    """Folders under root (root included) holding config.yaml or metrics.jsonl.

    Does not descend into a run folder, hidden folders (.hydra), wandb/ or checkpoints/.
    """
    root = Path(root)
    skip = {Path(p).resolve() for p in (skip or set())}
    found: list[Path] = []
    for dirpath, dirnames, filenames in os.walk(root):
        if any(m in filenames for m in RUN_MARKERS):
            found.append(Path(dirpath))
            dirnames[:] = []
            continue
        dirnames[:] = sorted(
            d
            for d in dirnames
            if not d.startswith(".") and d not in SKIP_DIRS and (Path(dirpath) / d).resolve() not in skip
        )
    return sorted(found)


_SEED_PART = re.compile(r"^(?:s|seed)[=_-]?\d+(?:[_-]\d+)?$")  # s0, seed=1, s0_1 (a re-used name's suffix)
_SEED_SUFFIX = re.compile(r"^(.*?)[_-]+(?:s|seed)[=_-]?(\d+)$")
_SEED_IN_NAME = re.compile(r"(?:^|__|[_-])(?:s|seed)[=_-]?(\d+)$")


def strip_seed(name: str) -> str:
    """`grpo__lr=1e-5__s1` -> `grpo__lr=1e-5`; `ppo_s0` -> `ppo`."""
    parts = name.split("__")
    kept = [p for p in parts if not _SEED_PART.match(p)]
    if len(kept) == len(parts):
        m = _SEED_SUFFIX.match(name)
        if m and m.group(1):
            return m.group(1)
        return name
    return "__".join(kept)


def _seed_from_name(name: str) -> Optional[int]:
    for part in reversed(name.split("__")):
        if _SEED_PART.match(part):
            return int(re.search(r"\d+", part).group(0))
    m = _SEED_IN_NAME.search(name)
    return int(m.group(1)) if m else None


def _get(d: Any, dotted: str) -> Any:
    cur = d
    for k in dotted.split("."):
        if not isinstance(cur, dict) or k not in cur:
            return None
        cur = cur[k]
    return cur


def _components(value: Any) -> list[str]:
    if value is None:
        return []
    if isinstance(value, (list, tuple)):
        out: list[str] = []
        for v in value:
            out += _components(v)
        return out
    # "trainer.group_size", "rollout.temperature,rollout.top_p", "trainer.group_size=16", "+algorithm.x"
    return [p.split("=", 1)[0].lstrip("+~") for p in re.split(r"[,\s]+", str(value)) if p.split("=", 1)[0].lstrip("+~")]


@dataclass
class Run:
    path: Path
    name: str
    experiment: str
    seed: Optional[int]
    algorithm: Optional[str]
    status: str  # completed | partial | failed
    error: Optional[str]
    sweep: dict
    fingerprint: Optional[dict]
    config: dict
    summary: Optional[dict]
    metrics: pd.DataFrame
    evals: pd.DataFrame
    notes: list[str] = field(default_factory=list)
    variant: str = ""
    reference: Optional[str] = None
    component: list[str] = field(default_factory=list)
    included: bool = False
    exclude_reason: str = ""
    values: dict = field(default_factory=dict)
    final_tokens: float = float("nan")
    infinite: dict = field(default_factory=dict)  # "file: column" -> infinite values set aside (never compared)
    warnings: list[str] = field(default_factory=list)  # summary.json's `warnings` (e.g. no update was applied)
    flat_config: Optional[dict] = None  # config as dotted keys, filled when first compared (matching.config_diff)
    eval_counts: Optional[list] = None  # eval_counts.jsonl's rows, read when first needed (passk_section.counts_of)
    degenerate: list[str] = field(default_factory=list)  # run-health invariants it broke (report.degenerate)


def _looks_like_run(d: Path, config: dict) -> bool:
    if any((d / f).is_file() for f in ("metrics.jsonl", "eval.jsonl", "summary.json", "fingerprint.json")):
        return True
    return any(k in config for k in ("algorithm", "trainer", "budget", "prompts"))


def _run_status(summary: Optional[dict], notes: list[str]) -> str:
    """completed | failed | partial (with a note saying why) from a run's summary.json (None: missing)."""
    if summary is None:
        notes.append("no summary.json (killed before finishing?)")
        return "partial"
    raw = summary.get("status")
    if raw in ("completed", "failed"):
        return raw
    if raw == "interrupted":
        notes.append("interrupted (Ctrl-C): `rlcompare train resume=<run dir>` continues it")
        return "partial"
    if raw == "running":
        pid = summary.get("pid")
        if isinstance(pid, int) and _pid_alive(pid):
            notes.append(f"status 'running' and pid {pid} is alive here: still training?")
        else:
            notes.append("status 'running' with no live process: killed midway")
        return "partial"
    notes.append(f"unknown status {raw!r}")
    return "partial"


def load_run(d: Path, root: Path) -> Optional[Run]:
    config = _read_yaml(d / "config.yaml")
    if not _looks_like_run(d, config):
        return None
    notes: list[str] = []
    summary, summary_corrupt = _read_json(d / "summary.json")
    if summary_corrupt:
        notes.append("summary.json unreadable")
    fingerprint, fp_corrupt = _read_json(d / "fingerprint.json")
    if fp_corrupt:
        notes.append("fingerprint.json unreadable")
    (metrics, evals), infinite = _read_rows(d, notes)

    s = summary or {}
    name = str(s.get("run_name") or config.get("run_name") or d.name)
    if d != root:
        rel_parent = d.parent.relative_to(root).as_posix() if d.parent != root else ""
    else:
        rel_parent = ""
    experiment = str(s.get("experiment") or config.get("experiment") or rel_parent or d.parent.name)
    algorithm = s.get("algorithm")
    if isinstance(algorithm, dict):
        algorithm = algorithm.get("name")
    if algorithm is None:
        algorithm = _get(config, "algorithm.name")
    sweep = s.get("sweep") if isinstance(s.get("sweep"), dict) else None
    if not sweep or all(v is None for v in sweep.values()):
        cs = config.get("sweep")
        sweep = cs if isinstance(cs, dict) else {}

    status = _run_status(summary, notes)
    error = s.get("error")
    return Run(
        path=d,
        name=name,
        experiment=experiment,
        seed=_seed_of(s, config, name),
        algorithm=str(algorithm) if algorithm is not None else None,
        status=status,
        error=str(error) if error else None,
        sweep=sweep,
        fingerprint=fingerprint,
        config=config,
        summary=summary,
        metrics=metrics,
        evals=evals,
        notes=notes,
        infinite=infinite,
        warnings=_run_warnings(s),
    )


def _run_warnings(summary: dict) -> list[str]:
    """summary.json's `warnings` (e.g. a completed run that applied no update); the file is untrusted: only
    strings, each cut to one line of at most 300 characters."""
    raw = summary.get("warnings")
    if not isinstance(raw, list):
        return []
    return [" ".join(w.split())[:300] for w in raw if isinstance(w, str) and w.strip()]


def _read_rows(d: Path, notes: list[str]) -> tuple[tuple[pd.DataFrame, pd.DataFrame], dict[str, int]]:
    """((metrics, eval) frames, "file: column" -> infinite values set aside), noting lines dropped and row files
    that are folders."""
    frames, infinite = [], {}
    for fname in ("metrics.jsonl", "eval.jsonl"):
        if not (d / fname).is_file() and (d / fname).exists():
            notes.append(f"{fname} is not a file (a folder of that name?): read as empty")
        rows, bad, only_last = scan_jsonl(d / fname)
        if bad:
            notes.append(
                f"{fname}: dropped {'a torn last line' if only_last and bad == 1 else f'{bad} unreadable line(s)'}"
            )
        df, set_aside = finite_frame(rows)
        infinite.update({f"{fname}: {col}": n for col, n in set_aside.items()})
        frames.append(df)
    return (frames[0], frames[1]), infinite


def _seed_of(summary: dict, config: dict, name: str) -> Optional[int]:
    """The run's seed: summary.json's, else config.yaml's, else the one in its name; None when none is an integer
    (a seed written as Infinity, NaN or text is not one)."""
    seed = summary.get("seed", None)
    if seed is None:
        seed = config.get("seed")
    if seed is None:
        seed = _seed_from_name(name)
    if isinstance(seed, bool) or not isinstance(seed, (int, float, str)):
        return None
    try:
        return int(seed)
    except (ValueError, OverflowError):
        return None


def _pid_alive(pid: int) -> bool:
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except (ProcessLookupError, OverflowError):  # OverflowError: no process has a pid beyond a C int (2**70)
        return False
    except (PermissionError, OSError):
        return True
    return True
