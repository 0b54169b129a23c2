"""`rlcompare report`: compare finished runs from a results/ folder.

Reads only the files described in docs/internals.md (config.yaml, fingerprint.json,
metrics.jsonl, eval.jsonl, summary.json) and writes report.md, report.csv,
differences.csv, runs.csv and PNG plots. Never imports torch.

    rlcompare report RESULTS_DIR [--metric eval/accuracy] [--at-tokens N]
                     [--threshold X] [--out DIR] [--allow-unmatched]
                     [--reference VARIANT] [--min-seeds 5]
                     [--compute tokens|seconds]

    python -m rlcompare.report RESULTS_DIR ...

Runs are compared at equal generated tokens T: by default T is the smallest
common final `tokens/generated` (every run cut there); with --at-tokens N,
T = N and runs that end before N are left out. Values at T are linearly
interpolated between the eval rows around T when no row sits exactly there.

Per variant it also fits ScaleRL's compute-performance curve to held-out accuracy
(rlcompare.report.compute_fit; --compute picks generated tokens or wall seconds) and writes
compute_fit.csv and compute_fit_differences.csv (docs/compute_fit.md).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

import numpy as np
import pandas as pd

from . import compute_fit, stats
from rlcompare.config import operational
from rlcompare.config.flat import flatten
from rlcompare.results import scan_jsonl

__all__ = ["build_report", "main", "ReportError", "read_jsonl_frame", "find_run_dirs"]

RUN_MARKERS = ("config.yaml", "metrics.jsonl")
SKIP_DIRS = {"wandb", "checkpoints", "__pycache__", "node_modules"}
TOKENS = "tokens/generated"
DEFAULT_METRIC = "eval/accuracy"
DEFAULT_REPS = 2000  # only for the old --reps option: the report's intervals are closed-form
ALPHA = 0.05
DEFAULT_MIN_SEEDS = 5  # seeds per arm before a comparison gets a verdict (issue 16)
# ScaleRL's curve is fitted to held-out accuracy (a value in [0, 1]) whatever --metric says
FIT_METRIC = "eval/accuracy"
FIT_SECONDS = "time/elapsed_s"
FIT_CURVE_POINTS = 200  # points of each dashed fitted curve in the plots
# below this share of identifiable bootstrap refits, the fit's intervals mix edge-of-grid fits: say so
FIT_BOOT_SHARE_SHOWN = 0.95

# the verdict of a variant-vs-reference comparison (higher metric = better, as for accuracy)
BETTER, WORSE = "better", "worse"
NO_DIFFERENCE = "no detectable difference"
TOO_FEW_SEEDS = "too few seeds: inconclusive"

# per-run quantities: key -> (label, kind); kind picks the number format
QUANTITIES: list[tuple[str, str, str]] = [
    ("final", "final", "score"),
    ("best", "best", "score"),
    ("auc", "AUC (mean over tokens)", "score"),
    ("tokens_to_threshold", "tokens to threshold", "tokens"),
    ("length_correct", "length of correct responses", "length"),
    ("length_incorrect", "length of incorrect responses", "length"),
    ("clip_low", "clip/frac_low", "frac"),
    ("clip_high", "clip/frac_high", "frac"),
    ("zero_variance_frac", "groups/zero_variance_frac", "frac"),
    ("wall_time_s", "wall time (s)", "seconds"),
    ("tokens_per_s", "generated tokens/s", "rate"),
]
STEP_MEANS = {  # quantity -> metrics.jsonl column, averaged over steps up to the comparison point
    "length_correct": "length/correct_mean",
    "length_incorrect": "length/incorrect_mean",
    "clip_low": "clip/frac_low",
    "clip_high": "clip/frac_high",
    "zero_variance_frac": "groups/zero_variance_frac",
}
DIFF_QUANTITIES = ("final", "auc")

# config paths whose change shows up under another name in fingerprint.json
_COMPONENT_ALIASES = {
    "trainer.group_size": ["sampling.group_size"],
    "trainer.prompts_per_step": ["sampling.prompts_per_step"],
    "rollout": ["sampling"],
    "rollout.temperature": ["sampling.temperature"],
    "rollout.top_p": ["sampling.top_p"],
    "model": ["model", "init_weights_hash", "warm_start_key"],
    # the tiny model's warm start is trained on the prompts: its weights follow the prompt settings
    "prompts": ["prompts", "init_weights_hash", "warm_start_key"],
    # fingerprint.sampling.dynamic_sampling comes from the algorithm preset
    "algorithm": ["sampling.dynamic_sampling"],
}


class ReportError(Exception):
    """A user-facing problem (bad folder, unknown metric): one line, exit code 2."""


# --------------------------------------------------------------------------
# tolerant readers


def read_jsonl_frame(path: Path) -> tuple[pd.DataFrame, int, bool]:
    """A jsonl file as a frame, read by the one results reader (`tracking.scan_jsonl`: lines that do not parse,
    e.g. a torn last line, are skipped); numeric-looking object columns become numbers.

    Returns (frame, number of bad lines, whether the bad lines were only the last one).
    """
    rows, n_bad, only_last = scan_jsonl(path)
    df = pd.DataFrame(rows)
    for col in df.columns:
        if df[col].dtype == object:
            conv = pd.to_numeric(df[col], errors="coerce")
            if conv.notna().sum() == df[col].notna().sum():
                df[col] = conv
    return df, n_bad, only_last


read_jsonl = read_jsonl_frame  # its name before tracking.read_jsonl (rows as dicts) became the one reader's face


def _read_json(path: Path) -> tuple[Optional[dict], bool]:
    """(content, corrupt). Missing file -> (None, False)."""
    try:
        obj = json.loads(Path(path).read_text(encoding="utf-8"))
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
    try:
        import yaml  # PyYAML (omegaconf depends on it)

        obj = yaml.safe_load(text)
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


# --------------------------------------------------------------------------
# run discovery and loading


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
    metrics, bad_m, last_m = read_jsonl_frame(d / "metrics.jsonl")
    evals, bad_e, last_e = read_jsonl_frame(d / "eval.jsonl")
    for fname, bad, only_last in (("metrics.jsonl", bad_m, last_m), ("eval.jsonl", bad_e, last_e)):
        if bad:
            notes.append(
                f"{fname}: dropped {'a torn last line' if only_last and bad == 1 else f'{bad} unreadable line(s)'}"
            )

    s = summary or {}
    name = str(s.get("run_name") or config.get("run_name") or d.name)
    if d != root:
        rel_parent = d.parent.relative_to(root).as_posix() if d.parent != root else ""
    else:
        rel_parent = ""
    experiment = str(s.get("experiment") or config.get("experiment") or rel_parent or d.parent.name)
    seed = s.get("seed", None)
    if seed is None:
        seed = config.get("seed")
    if seed is None:
        seed = _seed_from_name(name)
    try:
        seed = int(seed) if seed is not None else None
    except (TypeError, ValueError):
        seed = None
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
        seed=seed,
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
    )


def _pid_alive(pid: int) -> bool:
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OSError):
        return True
    return True


# --------------------------------------------------------------------------
# fingerprints


def _flatten(d: Any) -> dict:
    """Dotted keys; list values JSON-encoded so they compare as one value."""
    return {k: json.dumps(v, sort_keys=True) if isinstance(v, (list, dict)) else v for k, v in flatten(d).items()}


def _allowed(key: str, components: list[str]) -> bool:
    for comp in components:
        head = comp.split(".")[0]
        targets = [comp] + _COMPONENT_ALIASES.get(comp, [])
        if comp != head:
            targets += _COMPONENT_ALIASES.get(head, []) if head in ("model", "prompts") else []
        if comp.startswith("rollout."):
            targets.append("sampling." + comp[len("rollout.") :])
        if comp in ("algorithm", "algorithm.dynamic_sampling"):
            targets.append("sampling.dynamic_sampling")
        for t in targets:
            if key == t or key.startswith(t + "."):
                return True
        if "." not in comp and key.split(".")[-1] == comp:
            return True
    return False


def _operational(key: str) -> bool:
    """A fingerprint field that is an operational config key (rlcompare.config.operational): fingerprint.json files
    written before those were left out hold e.g. verifier.probe and sampling.kv_cache (= rollout.kv_cache)."""
    head, _, rest = key.partition(".")
    return operational.is_operational(f"rollout.{rest}" if head == "sampling" else key)


def fingerprint_diff(a: dict, b: dict, allowed: list[str] = (), ignore: tuple = ()) -> list[str]:
    """Fields that differ between two fingerprints, as 'key: a vs b', skipping allowed components."""
    fa, fb = _flatten(a), _flatten(b)
    out = []
    for key in sorted(set(fa) | set(fb)):
        if key in ignore or _allowed(key, list(allowed)) or _operational(key):
            continue
        va, vb = fa.get(key, "<missing>"), fb.get(key, "<missing>")
        if va != vb and not (_isnan(va) and _isnan(vb)):
            out.append(f"{key}: {_short(va)} vs {_short(vb)}")
    return out


def _isnan(v: Any) -> bool:
    return isinstance(v, float) and math.isnan(v)


def _short(v: Any) -> str:
    s = str(v)
    return s if len(s) <= 24 else s[:10] + "…" + s[-8:]


# --------------------------------------------------------------------------
# per-run numbers


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


# --------------------------------------------------------------------------
# the report


def _summarise(values: list[float], reps: int) -> dict:
    v = np.asarray([x for x in values if not _isnan(x)], dtype=float)
    ci = stats.mean_ci(v, reps=reps, alpha=ALPHA, seed=0)
    out = {
        "n": int(v.size),
        "mean": ci.point,
        "low": ci.low,
        "high": ci.high,
        "iqm": float("nan"),
        "iqm_low": float("nan"),
        "iqm_high": float("nan"),
    }
    if v.size >= 4:
        q = stats.iqm_ci(v, reps=reps, alpha=ALPHA, seed=0)
        out.update(iqm=q.point, iqm_low=q.low, iqm_high=q.high)
    return out


def _check_min_seeds(min_seeds) -> None:
    if isinstance(min_seeds, bool) or not isinstance(min_seeds, (int, np.integer)) or min_seeds < 2:
        raise ReportError(
            f"--min-seeds={min_seeds}: must be an integer >= 2 (the seeds each side of a comparison "
            f"needs before it gets a verdict; default {DEFAULT_MIN_SEEDS})"
        )


def verdict(low: float, high: float, n_variant: int, n_reference: int, min_seeds: int = DEFAULT_MIN_SEEDS) -> str:
    """The word for one comparison: too few seeds on either side first, whatever the interval says;
    then better / worse where the interval of variant - reference excludes 0."""
    if min(n_variant, n_reference) < min_seeds:
        return TOO_FEW_SEEDS
    if low > 0:
        return BETTER
    if high < 0:
        return WORSE
    return NO_DIFFERENCE


def _holm_family_adjusted(differences: pd.DataFrame, decided: pd.Series) -> pd.Series:
    """Holm-adjusted Welch p-values; a family = the comparisons against one reference on one quantity
    that get a verdict (enough seeds). The others keep nan: they decide nothing, so they spend no alpha."""
    adjusted = pd.Series(np.nan, index=differences.index)
    for _, family in differences[decided].groupby(["reference", "quantity"], sort=False):
        adjusted[family.index] = stats.holm_adjusted(family["p_value"].to_numpy(float))
    return adjusted


def _with_verdicts(differences: pd.DataFrame, min_seeds: int) -> pd.DataFrame:
    """Add `verdict` (the 95% interval's decision), `p_holm` and `verdict_holm` (Holm-Bonferroni,
    family-wise 5% over the variants compared with the same reference)."""
    d = differences.copy()
    d["verdict"] = [verdict(r.diff_low, r.diff_high, r.n_variant, r.n_reference, min_seeds) for r in d.itertuples()]
    d["p_holm"] = _holm_family_adjusted(d, d["verdict"] != TOO_FEW_SEEDS)
    d["verdict_holm"] = [
        TOO_FEW_SEEDS if v == TOO_FEW_SEEDS else NO_DIFFERENCE if not ph <= ALPHA else (BETTER if diff > 0 else WORSE)
        for v, ph, diff in zip(d["verdict"], d["p_holm"], d["diff"])
    ]
    return d


def build_report(
    results_dir,
    metric: str = DEFAULT_METRIC,
    at_tokens: Optional[float] = None,
    out_dir=None,
    allow_unmatched: bool = False,
    threshold: Optional[float] = None,
    reference: Optional[str] = None,
    reps: int = DEFAULT_REPS,
    write: bool = True,
    min_seeds: int = DEFAULT_MIN_SEEDS,
    compute: str = "tokens",
) -> dict:
    """Build the comparison and (by default) write report.md, CSVs and PNGs.

    Returns a dict with DataFrames ``headline`` (one row per variant, sorted by
    final metric), ``summary`` (long: variant x quantity), ``differences``,
    ``runs`` (one row per run folder), plus ``flags`` and ``notes`` (lists of
    str), ``mode`` ('cut' | 'interpolate'), ``at_tokens``, ``threshold``,
    ``plots`` (paths) and ``report_path``, and ``compute_fit`` (a ComputeFitReport:
    ScaleRL's fit per variant against ``compute``, tokens or seconds). Raises
    ReportError for folders without runs, an unknown metric or compute axis.
    """
    root = Path(results_dir)
    out = Path(out_dir) if out_dir is not None else root
    _check_report_arguments(root, at_tokens, reps, min_seeds, compute)
    runs = _load_runs(root, out)
    flags: list[str] = []  # shown at the top of report.md
    notes: list[str] = []  # comparability notes

    _assign_variants(runs, reference)
    source = _metric_source(runs, metric)
    _mark_included(runs, metric, source)
    mode, T, shortest = _comparison_point(runs, at_tokens, metric, source)
    included = [r for r in runs if r.included]
    _per_run_values(included, metric, source, T, notes)
    thr, threshold_how = _apply_threshold(included, threshold)

    variants = _group_variants(included)
    unmatched_variants = _check_within_variants(variants, flags, notes)
    differences, pair_problems = _differences(
        runs, variants, unmatched_variants, metric, allow_unmatched, min_seeds, flags, notes
    )
    headline, summary = _variant_tables(variants, unmatched_variants, pair_problems, reps)
    runs_df = _runs_table(runs)
    fit_report = _compute_fit(variants, list(headline["variant"]) if not headline.empty else [], differences, compute)
    _status_flags(runs, flags, notes)

    result = {
        "headline": headline,
        "summary": summary,
        "differences": differences,
        "runs": runs_df,
        "flags": flags,
        "notes": notes,
        "mode": mode,
        "at_tokens": T,
        "threshold": thr,
        "threshold_how": threshold_how,
        "metric": metric,
        "metric_source": source,
        "shortest_run": shortest.name if mode == "cut" and shortest is not None else None,
        "reps": reps,
        "min_seeds": min_seeds,
        "allow_unmatched": allow_unmatched,
        "results_dir": str(root),
        "out_dir": str(out),
        "plots": [],
        "report_path": None,
        "compute_fit": fit_report,
    }
    if write:
        _write_report(result, variants, out)
    return result


def _check_report_arguments(root: Path, at_tokens, reps: int, min_seeds, compute: str) -> None:
    if not root.exists():
        raise ReportError(f"{root} does not exist")
    if not root.is_dir():
        raise ReportError(f"{root} is not a folder")
    if at_tokens is not None and not at_tokens > 0:
        raise ReportError("--at-tokens must be a positive number of generated tokens")
    if reps < 1:
        raise ReportError("--reps must be at least 1")
    _check_min_seeds(min_seeds)
    _check_compute(compute)


def _load_runs(root: Path, out: Path) -> list[Run]:
    """Every run folder under root (the output folder aside), read; ReportError when there is none."""
    dirs = find_run_dirs(root, skip={out} if out != root else None)
    runs = [r for r in (load_run(d, root) for d in dirs) if r is not None]
    if not runs:
        what = "is empty" if not any(root.iterdir()) else "has no run folders"
        raise ReportError(
            f"{root} {what}: no rlcompare runs found (a run folder holds config.yaml or metrics.jsonl, "
            f"as written by `rlcompare train`)"
        )
    return runs


def _assign_variants(runs: list[Run], reference: Optional[str]) -> None:
    """Each run's variant (its sweep tag, else its name without the seed), reference and components."""
    experiments = sorted({r.experiment for r in runs})
    multi = len(experiments) > 1
    for r in runs:
        v = r.sweep.get("variant") if r.sweep else None
        base = str(v) if v not in (None, "") else strip_seed(r.name)
        if base in ("", r.name) and r.seed is not None and _SEED_PART.match(r.name):
            base = r.algorithm or "run"
        ref = r.sweep.get("reference") if r.sweep else None
        r.variant = f"{r.experiment}/{base}" if multi else base
        r.reference = (f"{r.experiment}/{ref}" if multi else str(ref)) if ref not in (None, "") else None
        r.component = _components(r.sweep.get("component") if r.sweep else None)
    if reference is not None:
        known = {r.variant for r in runs}
        if reference not in known:
            raise ReportError(f"--reference {reference!r} is not a variant here; variants: {', '.join(sorted(known))}")
        for r in runs:
            if r.reference is None and r.variant != reference:
                r.reference = reference


def _has_values(df: pd.DataFrame, col: str) -> bool:
    return not df.empty and col in df.columns and pd.to_numeric(df[col], errors="coerce").notna().any()


def _metric_source(runs: list[Run], metric: str) -> str:
    """'eval' or 'metrics': the file the metric is read from (eval.jsonl first), judged on completed runs."""
    completed = [r for r in runs if r.status == "completed"]
    if any(_has_values(r.evals, metric) for r in completed):
        return "eval"
    if any(_has_values(r.metrics, metric) for r in completed):
        return "metrics"
    if completed:
        keys = sorted({c for r in completed for c in r.evals.columns if c not in ("step", TOKENS)})
        raise ReportError(
            f"metric {metric!r} is in neither eval.jsonl nor metrics.jsonl of any completed run"
            + (f"; eval.jsonl keys: {', '.join(keys)}" if keys else "")
        )
    return "eval"


def _source_frame(r: Run, source: str) -> pd.DataFrame:
    return r.evals if source == "eval" else r.metrics


def _mark_included(runs: list[Run], metric: str, source: str) -> None:
    """Completed runs with the metric count; the others get their reason."""
    for r in runs:
        r.final_tokens = _final_tokens(r)
        if r.status != "completed":
            r.exclude_reason = r.status
            continue
        t, _ = _curve(_source_frame(r, source), metric)
        if t.size == 0:
            r.exclude_reason = f"no {metric} rows with {TOKENS} in {source}.jsonl"
            continue
        r.included = True


def _comparison_point(runs: list[Run], at_tokens, metric: str, source: str):
    """(mode, T, shortest run or None): the token count runs are compared at. --at-tokens interpolates there (runs
    whose curve does not cover it are left out); else the shortest included run's end ('cut')."""
    included = [r for r in runs if r.included]
    if at_tokens is not None:
        T = float(at_tokens)
        for r in included:
            t, _ = _curve(_source_frame(r, source), metric)
            if T > t[-1] * (1 + 1e-9) or T < t[0]:
                r.included = False
                r.exclude_reason = (
                    f"its {source}.jsonl covers {_fmt_tokens(t[0])}–{_fmt_tokens(t[-1])} tokens, not {_fmt_tokens(T)}"
                )
        return "interpolate", T, None
    if not included:
        return "cut", float("nan"), None
    shortest = min(included, key=lambda r: r.final_tokens)
    T = shortest.final_tokens
    if all(math.isclose(r.final_tokens, T) for r in included):
        shortest = None  # every run ends at the same token count
    return "cut", T, shortest


def _per_run_values(included: list[Run], metric: str, source: str, T: float, notes: list[str]) -> None:
    """Each included run's quantities at T (r.values), noting runs that end early or are interpolated."""
    interpolated: list[tuple[float, str, float, float]] = []  # (gap, run, before, after)
    for r in included:
        t, y = _curve(_source_frame(r, source), metric)
        st, sy = _segment(t, y, T)
        if st.size >= 2 and not np.any(np.isclose(t, T, rtol=1e-9, atol=1e-9)) and T <= t[-1]:
            before, after = float(st[-2]), float(t[t > T][0])
            interpolated.append((after - before, r.name, before, after))
        if t[-1] < T * (1 - 1e-9):
            notes.append(
                f"`{r.name}`: its {source}.jsonl ends at {_fmt_tokens(t[-1])} tokens, before the "
                f"comparison point; its last row is used"
            )
        r.values["initial"] = float(y[0])
        r.values["final"] = float(sy[-1])
        r.values["final_at_tokens"] = float(st[-1])
        r.values["best"] = float(np.max(sy))
        r.values["auc"] = _auc(st, sy)
        r.values["_seg"] = (st, sy)
        for key, col in STEP_MEANS.items():
            r.values[key] = _step_mean(r.metrics, col, T)
        r.values["wall_time_s"], r.values["tokens_per_s"] = _wall_time(r, T)
    if interpolated:
        gap, name, before, after = max(interpolated)
        notes.append(
            f"{len(interpolated)} run(s) have no {source}.jsonl row at exactly {_fmt_tokens(T)} tokens: their values "
            f"there are interpolated linearly between the rows around it (widest gap: `{name}`, "
            f"{_fmt_tokens(before)}–{_fmt_tokens(after)} tokens)"
        )


def _apply_threshold(included: list[Run], threshold: Optional[float]):
    """(threshold, how it was chosen), and each included run's tokens_to_threshold."""
    if threshold is None and included:
        thr = (np.mean([r.values["initial"] for r in included]) + np.mean([r.values["best"] for r in included])) / 2
        threshold_how = "midway between the mean initial and the mean best value over included runs"
    else:
        thr = threshold
        threshold_how = "set with --threshold" if threshold is not None else ""
    for r in included:
        st, sy = r.values.pop("_seg")
        r.values["tokens_to_threshold"] = tokens_to_reach(st, sy, thr) if thr is not None else float("nan")
    return thr, threshold_how


def _group_variants(included: list[Run]) -> dict[str, list[Run]]:
    """variant -> its included runs, by seed."""
    variants: dict[str, list[Run]] = {}
    for r in included:
        variants.setdefault(r.variant, []).append(r)
    for v in variants.values():
        v.sort(key=lambda r: (r.seed is None, r.seed if r.seed is not None else 0, r.name))
    return variants


def _check_within_variants(variants: dict[str, list[Run]], flags: list[str], notes: list[str]) -> dict[str, list[str]]:
    """variant -> why its own runs are not matched (seeds, fingerprints); flagged."""
    unmatched_variants: dict[str, list[str]] = {}
    for name, vr in variants.items():
        problems = _problems_within(name, vr, notes)
        if problems:
            unmatched_variants[name] = problems
            flags.append(f"**Unmatched runs within `{name}`**: " + " | ".join(problems))
    return unmatched_variants


def _problems_within(name: str, vr: list[Run], notes: list[str]) -> list[str]:
    problems: list[str] = []
    seeds = [r.seed for r in vr]
    if any(s is None for s in seeds):
        problems.append("seed unknown for " + ", ".join(f"`{r.name}`" for r in vr if r.seed is None))
    dup = sorted({s for s in seeds if s is not None and seeds.count(s) > 1})
    if dup:
        notes.append(f"variant `{name}` has several runs with seed(s) {dup}; all are counted")
    missing = [r for r in vr if r.fingerprint is None]
    if missing:
        problems.append("fingerprint.json missing in " + ", ".join(f"`{r.name}`" for r in missing))
    with_fp = [r for r in vr if r.fingerprint is not None]
    if with_fp:
        first = with_fp[0]
        init_differs = False
        for r in with_fp[1:]:
            diff = fingerprint_diff(r.fingerprint, first.fingerprint, ignore=("init_weights_hash",))
            if diff:
                problems.append(f"`{r.name}` vs `{first.name}`: " + "; ".join(diff))
            if first.fingerprint.get("init_weights_hash") != r.fingerprint.get("init_weights_hash"):
                init_differs = True
        if init_differs:
            notes.append(
                f"variant `{name}`: initial weights differ across seeds (seed-dependent init); "
                "variant-vs-reference checks compare weights seed by seed"
            )
    return problems


DIFFERENCE_COLUMNS = [
    "variant",
    "reference",
    "quantity",
    "metric",
    "n_variant",
    "n_reference",
    "diff",
    "diff_low",
    "diff_high",
    "p_value",
    "poi",
    "poi_low",
    "poi_high",
    "matched",
]


def _differences(runs, variants, unmatched_variants, metric, allow_unmatched, min_seeds, flags, notes):
    """(differences frame with verdicts, (variant, reference) -> why unmatched): each variant against its
    reference, where both are here and matched (or --allow-unmatched)."""
    diffs_rows: list[dict] = []
    pair_problems: dict[tuple[str, str], list[str]] = {}
    refs = sorted({(v, vr[0].reference) for v, vr in variants.items() if vr[0].reference})
    for v, ref in refs:
        refs_here = {r.reference for r in variants[v]}
        if len(refs_here) > 1:
            notes.append(f"variant `{v}` runs name different references {sorted(map(str, refs_here))}; using `{ref}`")
        if ref not in variants:
            listed = {r.variant for r in runs}
            why = "has no completed runs" if ref in listed else "is not in this folder"
            notes.append(f"`{v}`: reference `{ref}` {why}; no difference computed")
            continue
        a, b = variants[v], variants[ref]
        problems, allowed, inferred = _pair_problems(v, ref, a, b, unmatched_variants)
        matched = not problems
        if matched and inferred:
            notes.append(
                f"`{v}` vs `{ref}`: no `sweep.component`; algorithm settings in fingerprint.json "
                "(e.g. dynamic sampling) were allowed to differ because the algorithms differ"
            )
        if problems:
            pair_problems[(v, ref)] = problems
            allowed_txt = f" (allowed to differ: {', '.join(allowed)}{inferred})" if allowed else ""
            tail = "" if allow_unmatched else " — left out of differences (use --allow-unmatched to include)"
            flags.append(f"**Unmatched: `{v}` vs reference `{ref}`**{allowed_txt}: " + " | ".join(problems) + tail)
            if not allow_unmatched:
                continue
        diffs_rows += _difference_rows(v, ref, a, b, metric, matched)
    differences = _with_verdicts(pd.DataFrame(diffs_rows, columns=DIFFERENCE_COLUMNS), min_seeds)
    return differences, pair_problems


def _pair_problems(v: str, ref: str, a: list[Run], b: list[Run], unmatched_variants: dict):
    """(problems, components allowed to differ, ' (inferred: ...)' or ''): how variant `v`'s runs `a` fail to
    match its reference's `b`, seed by seed, outside the components it declares."""
    problems = []
    sa, sb = {r.seed for r in a}, {r.seed for r in b}
    if sa != sb:
        problems.append(f"seeds differ: {_seedset(sa)} vs {_seedset(sb)}")
    allowed = sorted({c for r in a for c in r.component})
    inferred = ""
    algos_a, algos_b = {r.algorithm for r in a}, {r.algorithm for r in b}
    if not allowed and None not in algos_a | algos_b and algos_a.isdisjoint(algos_b):
        # no sweep.component (e.g. --reference): different algorithms may differ in their own settings
        allowed, inferred = ["algorithm"], " (inferred: the algorithms differ)"
    by_seed_b = {r.seed: r for r in b}
    found: dict[str, list[tuple[Run, Run]]] = {}
    for r in a:
        other = by_seed_b.get(r.seed) or b[0]
        if r.fingerprint is None or other.fingerprint is None:
            continue
        ignore = () if r.seed in by_seed_b else ("init_weights_hash",)
        diff = fingerprint_diff(r.fingerprint, other.fingerprint, allowed=allowed, ignore=ignore)
        if diff:
            found.setdefault("; ".join(diff), []).append((r, other))
    for text, pairs in found.items():
        if len(pairs) == 1:
            problems.append(f"`{pairs[0][0].name}` vs `{pairs[0][1].name}`: {text}")
        else:
            problems.append(f"{len(pairs)} seed pairs ({', '.join(f'`{x.name}`' for x, _ in pairs)}): {text}")
    for side in (v, ref):
        if side in unmatched_variants:
            problems.append(f"`{side}` is not matched within itself")
    return list(dict.fromkeys(problems)), allowed, inferred


def _difference_rows(v: str, ref: str, a: list[Run], b: list[Run], metric: str, matched: bool) -> list[dict]:
    rows = []
    for q in DIFF_QUANTITIES:
        xa = np.array([r.values[q] for r in a], float)
        xb = np.array([r.values[q] for r in b], float)
        d = stats.difference_ci(xa, xb, alpha=ALPHA)
        p = stats.probability_of_improvement(xa, xb, ci=True, alpha=ALPHA)
        rows.append(
            {
                "variant": v,
                "reference": ref,
                "quantity": q,
                "metric": metric,
                "n_variant": len(xa),
                "n_reference": len(xb),
                "diff": d.point,
                "diff_low": d.low,
                "diff_high": d.high,
                "p_value": stats.welch_p_value(xa, xb),
                "poi": p.point,
                "poi_low": p.low,
                "poi_high": p.high,
                "matched": matched,
            }
        )
    return rows


def _variant_tables(variants, unmatched_variants, pair_problems, reps: int):
    """(headline: one row per variant, best final first; summary: variant x quantity, long)."""
    long_rows: list[dict] = []
    head_rows: list[dict] = []
    for v, vr in variants.items():
        algos = sorted({r.algorithm for r in vr if r.algorithm})
        row: dict = {
            "variant": v,
            "algorithm": ", ".join(algos),
            "reference": vr[0].reference or "",
            "n_seeds": len(vr),
            "seeds": " ".join(str(r.seed) for r in vr),
            "matched": v not in unmatched_variants and not any(k[0] == v for k in pair_problems),
        }
        for key, _, _ in QUANTITIES:
            vals = [r.values.get(key, float("nan")) for r in vr]
            s = _summarise(vals, reps)
            long_rows.append({"variant": v, "quantity": key, "n_total": len(vr), **s})
            row[key] = s["mean"]
            row[f"{key}_low"] = s["low"]
            row[f"{key}_high"] = s["high"]
            row[f"{key}_iqm"] = s["iqm"]
            row[f"{key}_iqm_low"] = s["iqm_low"]
            row[f"{key}_iqm_high"] = s["iqm_high"]
            if key == "tokens_to_threshold":
                row["tokens_to_threshold_reached"] = s["n"]
        head_rows.append(row)
    headline = pd.DataFrame(head_rows)
    if not headline.empty:
        headline = headline.sort_values(
            ["final", "variant"], ascending=[False, True], na_position="last", kind="stable"
        ).reset_index(drop=True)
    return headline, pd.DataFrame(long_rows)


def _runs_table(runs: list[Run]) -> pd.DataFrame:
    """One row per run folder, included or not, with why not."""
    runs_rows = []
    for r in sorted(runs, key=lambda r: (r.variant, r.seed if r.seed is not None else -1, r.name)):
        rr = {
            "run": r.name,
            "path": str(r.path),
            "experiment": r.experiment,
            "variant": r.variant,
            "seed": r.seed,
            "algorithm": r.algorithm,
            "status": r.status,
            "included": r.included,
            "excluded_because": r.exclude_reason,
            "error": r.error or "",
            "final_tokens": r.final_tokens,
            "notes": "; ".join(r.notes),
        }
        for key in ["initial", "final", "final_at_tokens"] + [k for k, _, _ in QUANTITIES if k != "final"]:
            rr[key] = r.values.get(key, float("nan"))
        runs_rows.append(rr)
    return pd.DataFrame(runs_rows)


def _status_flags(runs: list[Run], flags: list[str], notes: list[str]) -> None:
    """Flags for partial, failed and left-out runs; notes for rows dropped or files unreadable."""
    partial = [r for r in runs if r.status == "partial"]
    failed = [r for r in runs if r.status == "failed"]
    other_excluded = [r for r in runs if r.status == "completed" and not r.included]
    if partial:
        flags.append(
            f"**{len(partial)} partial run(s)** (excluded from statistics): "
            + ", ".join(f"`{r.name}`" for r in partial)
        )
    if failed:
        flags.append(
            f"**{len(failed)} failed run(s)** (excluded from statistics): "
            + "; ".join(f"`{r.name}`: {r.error or 'no error recorded'}" for r in failed)
        )
    if other_excluded:
        flags.append(
            f"**{len(other_excluded)} completed run(s) left out**: "
            + "; ".join(f"`{r.name}`: {r.exclude_reason}" for r in other_excluded)
        )
    for r in runs:
        for n in r.notes:
            if "dropped" in n or "unreadable" in n:
                notes.append(f"`{r.name}`: {n}")


def _write_report(result: dict, variants: dict[str, list[Run]], out: Path) -> None:
    """report.md, the CSVs and the plots into `out`; result gains their paths."""
    headline, fit_report = result["headline"], result["compute_fit"]
    out.mkdir(parents=True, exist_ok=True)
    headline.to_csv(out / "report.csv", index=False)
    result["differences"].to_csv(out / "differences.csv", index=False)
    result["runs"].to_csv(out / "runs.csv", index=False)
    _write_compute_fit_csvs(fit_report, out)
    result["plots"] = _plots(
        variants,
        list(headline["variant"]) if not headline.empty else [],
        result["metric"],
        result["metric_source"],
        result["at_tokens"],
        out,
        result["notes"],
        fit_report,
    )
    report_path = out / "report.md"
    report_path.write_text(_markdown(result), encoding="utf-8")
    result["report_path"] = str(report_path)


# --------------------------------------------------------------------------
# the compute-performance fit (ScaleRL; the math is in compute_fit.py, docs/compute_fit.md)


@dataclass
class ComputeFitReport:
    """What the report fitted: ``fit`` is None when no run had a curve the fit can read."""

    compute: str
    fit: Optional[compute_fit.ArmFits]
    curves: dict  # variant -> [compute_fit.SeedCurve], the runs the fit read
    notes: list[str]


def _check_compute(compute: Any) -> None:
    if compute not in compute_fit.COMPUTE_AXES:
        raise ReportError(
            f"--compute={compute}: accepted values are {' or '.join(compute_fit.COMPUTE_AXES)} "
            "(the compute axis of the ScaleRL fit: generated tokens or wall seconds; default tokens)"
        )


def _fit_seed_curve(evals: pd.DataFrame, compute: str) -> tuple[Optional[compute_fit.SeedCurve], str]:
    """One run's eval rows as the fit's SeedCurve, rows kept as `_curve` keeps them; or (None, why not)."""
    tokens, accuracy = _curve(evals, FIT_METRIC)
    if tokens.size < 2:
        return None, f"fewer than 2 eval.jsonl rows with {FIT_METRIC} and {TOKENS}"
    step_tokens, steps = _curve(evals, "step")
    if not (step_tokens.size and step_tokens[0] == tokens[0] and steps[0] == 0):
        return None, "its first eval row is not the step-0 eval (R0 is read there)"
    if np.any((accuracy < 0) | (accuracy > 1)):
        return None, f"{FIT_METRIC} outside [0, 1]"
    seconds_tokens, seconds = _curve(evals, FIT_SECONDS)
    has_seconds = np.array_equal(seconds_tokens, tokens)
    if compute == "seconds" and not has_seconds:
        return None, f"{FIT_SECONDS} missing on some eval rows"
    if compute == "seconds" and not np.all(np.isfinite(seconds)):
        return None, f"{FIT_SECONDS} not finite"
    if compute == "seconds" and np.any(np.diff(seconds) <= 0):
        return None, f"{FIT_SECONDS} does not increase from eval row to eval row"
    return compute_fit.SeedCurve(accuracy, tokens, seconds if has_seconds else None), ""


def _fit_curves(variants: dict, order: list[str], compute: str) -> tuple[dict, list[str]]:
    """variant -> the SeedCurves of its included runs the fit can read; one note per reason for the rest."""
    curves: dict = {}
    left_out: dict[str, list[str]] = {}
    for v in order:
        for r in variants[v]:
            curve, why = _fit_seed_curve(r.evals, compute)
            if curve is None:
                left_out.setdefault(why, []).append(f"`{r.name}`")
            else:
                curves.setdefault(v, []).append(curve)
    notes = [f"left out of the fit ({why}): {', '.join(names)}" for why, names in left_out.items()]
    return curves, notes


def _fit_reference_pairs(differences: pd.DataFrame, arms) -> dict:
    """variant -> reference: the pairs of the differences table whose both sides have a fit."""
    pairs = differences[["variant", "reference"]].drop_duplicates().itertuples(index=False)
    return {v: ref for v, ref in pairs if v in arms and ref in arms}


def _compute_fit(variants: dict, order: list[str], differences: pd.DataFrame, compute: str) -> ComputeFitReport:
    """ScaleRL's fit per variant over its seeds, and the differences for the differences table's pairs."""
    curves, notes = _fit_curves(variants, order, compute)
    if not curves:
        return ComputeFitReport(compute, None, curves, notes)
    try:
        fit = compute_fit.fit_arms(
            curves,
            compute=compute,
            reps=compute_fit.DEFAULT_REPS,
            seed=0,
            reference=_fit_reference_pairs(differences, curves),
        )
    except ValueError as e:  # a curve shape the checks above let through: the rest of the report stands
        return ComputeFitReport(compute, None, curves, notes + [f"fit not computed: {e}"])
    return ComputeFitReport(compute, fit, curves, notes)


def _write_compute_fit_csvs(fr: ComputeFitReport, out: Path) -> None:
    """compute_fit.csv (one row per variant) and compute_fit_differences.csv; empty when nothing was fitted."""
    arms = compute_fit.fit_rows(fr.fit) if fr.fit else []
    diffs = compute_fit.difference_rows(fr.fit) if fr.fit else []
    pd.DataFrame(arms).to_csv(out / "compute_fit.csv", index=False)
    pd.DataFrame(diffs).to_csv(out / "compute_fit_differences.csv", index=False)


def _fit_lines(fr: ComputeFitReport, on_token_axis: bool) -> dict:
    """variant -> (x, fitted R) of each identifiable fit, from step 0 to the fit's last compute point.

    x is compute from step 0; ``on_token_axis`` shifts it to the plot's raw ``tokens/generated`` axis by
    the variant's mean step-0 token count (0 for runs that count from the start)."""
    lines = {}
    for v, arm in fr.fit.arms.items() if fr.fit else ():
        if not arm.fit.identifiable:
            continue
        c = np.linspace(0.0, float(arm.grid[-1]), FIT_CURVE_POINTS)
        shift = float(np.mean([cv.tokens[0] for cv in fr.curves[v]])) if on_token_axis else 0.0
        lines[v] = (c + shift, arm.fit.curve(c))
    return lines


def _draw_fit_lines(ax, lines: dict, color: dict) -> None:
    for v, (x, y) in lines.items():
        ax.plot(x, y, "--", color=color[v], linewidth=1.2, label=f"{v} ScaleRL fit")


def _fit_axis(fr: ComputeFitReport, curve: compute_fit.SeedCurve) -> np.ndarray:
    raw = curve.tokens if fr.compute == "tokens" else curve.seconds
    return np.asarray(raw, float) - float(raw[0])  # counted from step 0, as the fit counts it


def _compute_fit_plot(fr: ComputeFitReport, color: dict, out: Path, plt) -> Optional[str]:
    """compute_fit.png: per variant the mean curve the fit read (band = min/max over seeds), the fit dashed."""
    if fr.fit is None:
        return None
    fig, ax = plt.subplots(figsize=(7.5, 4.5))
    for v, arm in fr.fit.arms.items():
        seeds = np.vstack([np.interp(arm.grid, _fit_axis(fr, cv), cv.accuracy) for cv in fr.curves[v]])
        ax.plot(arm.grid, arm.mean_curve, "-", color=color[v], label=f"{v} (n={arm.n_seeds})")
        if arm.n_seeds > 1:
            ax.fill_between(arm.grid, seeds.min(axis=0), seeds.max(axis=0), color=color[v], alpha=0.15, linewidth=0)
    _draw_fit_lines(ax, _fit_lines(fr, on_token_axis=False), color)
    ax.set_xlabel(("generated tokens" if fr.compute == "tokens" else "wall seconds") + " from the step-0 eval")
    ax.set_title(f"Held-out {FIT_METRIC}, ScaleRL fit dashed — band = min/max over seeds")
    ax.grid(alpha=0.3)
    ax.legend(fontsize="small", loc="best")
    fig.tight_layout()
    fig.savefig(out / "compute_fit.png", dpi=100)
    plt.close(fig)
    return str(out / "compute_fit.png")


def _fit_cell(iv, fmt) -> str:
    """point [low, high] of a compute_fit interval; the point alone without bounds; — when not fitted."""
    if not math.isfinite(iv.point):
        return "—"
    if not (math.isfinite(iv.low) and math.isfinite(iv.high)):
        return fmt(iv.point)
    return f"{fmt(iv.point)} [{fmt(iv.low)}, {fmt(iv.high)}]"


def _fit_verdict(arm: compute_fit.ArmFit) -> str:
    if not arm.fit.identifiable:
        return f"not identifiable: {arm.fit.reason}"
    if arm.boot_identifiable < FIT_BOOT_SHARE_SHOWN:
        return f"✓ (only {arm.boot_identifiable:.0%} of bootstrap refits identifiable)"
    return "✓"


def _fit_arms_table(fr: ComputeFitReport) -> str:
    fmt_c = _fmt_tokens if fr.compute == "tokens" else (lambda x: f"{x:,.1f}")
    unit = "tokens" if fr.compute == "tokens" else "s"
    rows = [
        [
            v,
            str(a.n_seeds),
            f"{a.fit.R0:.3f}",
            _fit_cell(a.A, lambda x: f"{x:.3f}"),
            _fit_cell(a.B, lambda x: f"{x:.2f}"),
            _fit_cell(a.C_mid, fmt_c),
            _fit_verdict(a),
        ]
        for v, a in fr.fit.arms.items()
    ]
    return _md_table(
        ["variant", "seeds", "R0", "A [95% interval]", "B [interval]", f"C_mid ({unit}) [interval]", "fit"], rows
    )


def _fit_differences_table(fr: ComputeFitReport, differences: pd.DataFrame) -> str:
    unmatched = {
        (v, ref)
        for v, ref, m in differences[["variant", "reference", "matched"]].itertuples(index=False)
        if not bool(m)
    }
    rows = []
    for d in fr.fit.differences.values():
        note = [f"not identifiable: {d.reason}"] if not d.identifiable else []
        note += ["⚠ unmatched (see Attention)"] if (d.arm, d.reference) in unmatched else []
        rows.append(
            [
                f"{d.arm} vs {d.reference}",
                _fit_cell(d.dA, lambda x: f"{x:+.3f}"),
                _fit_cell(d.dB, lambda x: f"{x:+.2f}"),
                "; ".join(note),
            ]
        )
    return _md_table(["variant vs reference", "ΔA [interval]", "ΔB [interval]", "note"], rows)


def _compute_fit_section(res: dict) -> list[str]:
    fr: ComputeFitReport = res["compute_fit"]
    L = ["## Compute–performance fit (ScaleRL)", ""]
    if fr.fit is None:
        L.append(
            f"Not fitted: no included run has an eval.jsonl curve of `{FIT_METRIC}` from its step-0 eval."
            if not fr.curves
            else "Not fitted (see the note below)."
        )
        return L + [""] + [f"- {n}" for n in fr.notes] + ([""] if fr.notes else [])
    axis = "generated tokens" if fr.compute == "tokens" else "wall seconds"
    L.append(
        f"R(C) = R0 + (A − R0) / (1 + (C_mid / C)^B) fitted as ScaleRL App. A.5 does to held-out "
        f"`{FIT_METRIC}` against {axis} C counted from the step-0 eval (`--compute {fr.compute}`), on each "
        "variant's mean curve over seeds; R0 = mean step-0 accuracy, A = asymptote, B = efficiency, "
        f"C_mid = compute at half the gain. Intervals: percentile bootstrap over seeds, "
        f"{fr.fit.reps} refits."
    )
    L += ["", _fit_arms_table(fr), ""]
    if fr.fit.differences:
        L += [
            _fit_differences_table(fr, res["differences"]),
            "",
            "Δ = variant − reference, the same pairs as the differences table.",
            "",
        ]
    L.append(
        'Method, exclusion rule and what "not identifiable" means: `docs/compute_fit.md` in the rlcompare '
        "repository. These bootstrap intervals are rough (a few seeds give few distinct resamples; their "
        "coverage is not claimed, see that doc). Files: `compute_fit.csv`, `compute_fit_differences.csv`."
    )
    L.append("")
    return L + [f"- {n}" for n in fr.notes] + ([""] if fr.notes else [])


# --------------------------------------------------------------------------
# plots


_PLOTS = [
    # file, title, [(column, source, line style, label suffix)]
    ("reward.png", "Training reward (reward/mean)", [("reward/mean", "metrics", "-", "")]),
    (
        "objective.png",
        "Objective: per-token vs per-response",
        [
            ("objective/per_token", "metrics", "-", " per-token"),
            ("objective/per_response", "metrics", "--", " per-response"),
        ],
    ),
    (
        "length.png",
        "Response length: correct vs incorrect",
        [("length/correct_mean", "metrics", "-", " correct"), ("length/incorrect_mean", "metrics", "--", " incorrect")],
    ),
    (
        "clip.png",
        "Clip fractions",
        [("clip/frac_low", "metrics", "-", " low"), ("clip/frac_high", "metrics", "--", " high")],
    ),
    ("entropy.png", "Policy entropy (policy/entropy)", [("policy/entropy", "metrics", "-", "")]),
]


def _band(vr: list[Run], col: str, source: str):
    curves = []
    for r in vr:
        t, y = _curve(r.evals if source == "eval" else r.metrics, col)
        if t.size:
            curves.append((t, y))
    if not curves:
        return None
    lo = max(c[0][0] for c in curves)
    hi = min(c[0][-1] for c in curves)
    if len(curves) == 1 or hi <= lo:
        t, y = curves[0] if len(curves) == 1 else max(curves, key=lambda c: c[0].size)
        return t, y, y, y, len(curves)
    n_points = min(200, max(c[0].size for c in curves))
    grid = np.linspace(lo, hi, max(n_points, 2))
    ys = np.vstack([np.interp(grid, t, y) for t, y in curves])
    return grid, ys.mean(axis=0), ys.min(axis=0), ys.max(axis=0), len(curves)


def _plots(
    variants: dict,
    order: list[str],
    metric: str,
    source: str,
    T: float,
    out: Path,
    notes: list[str],
    fit_report: Optional[ComputeFitReport] = None,
) -> list[str]:
    if not variants:
        return []
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colors = plt.rcParams["axes.prop_cycle"].by_key().get("color", ["C0"])
    color = {v: colors[i % len(colors)] for i, v in enumerate(order)}
    specs = [("accuracy.png", f"Held-out {metric}" if source == "eval" else metric, [(metric, source, "-", "")])]
    specs += _PLOTS
    # the fit is drawn over the accuracy band where that plot shows the fit's metric against tokens,
    # else (--compute seconds, another --metric) on a plot of its own, compute_fit.png
    overlay = fit_report is not None and fit_report.compute == "tokens" and metric == FIT_METRIC and source == "eval"
    fit_over_accuracy = _fit_lines(fit_report, on_token_axis=True) if overlay else {}
    written: list[str] = []
    for fname, title, series in specs:
        fig, ax = plt.subplots(figsize=(7.5, 4.5))
        drawn = False
        for v in order:
            for col, src, style, suffix in series:
                b = _band(variants[v], col, src)
                if b is None:
                    continue
                grid, mean, lo, hi, n = b
                ax.plot(grid, mean, style, color=color[v], label=f"{v}{suffix} (n={n})")
                if n > 1:
                    ax.fill_between(grid, lo, hi, color=color[v], alpha=0.15, linewidth=0)
                drawn = True
        if fname == "accuracy.png":
            _draw_fit_lines(ax, fit_over_accuracy, color)
        if not drawn:
            plt.close(fig)
            cols = ", ".join(c for c, _, _, _ in series)
            notes.append(f"no data for {cols}: {fname} not drawn")
            continue
        if not math.isnan(T):
            ax.axvline(T, color="grey", linestyle=":", linewidth=1, label="comparison point")
        ax.set_xlabel("generated tokens")
        ax.set_title(title + " — mean over seeds, band = min/max")
        ax.grid(alpha=0.3)
        ax.legend(fontsize="small", loc="best")
        fig.tight_layout()
        fig.savefig(out / fname, dpi=100)
        plt.close(fig)
        written.append(str(out / fname))
    fit_plot = _compute_fit_plot(fit_report, color, out, plt) if fit_report and not overlay else None
    return written + ([fit_plot] if fit_plot else [])


# --------------------------------------------------------------------------
# markdown


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


def _cell(row: pd.Series, key: str, kind: str) -> str:
    m = row.get(key)
    if m is None or _isnan(m):
        return "—"
    lo, hi = row.get(f"{key}_low"), row.get(f"{key}_high")
    s = _fmt(m, kind)
    if lo is not None and not _isnan(lo):
        s += f" [{_fmt(lo, kind)}, {_fmt(hi, kind)}]"
    return s


def _md_table(header: list[str], rows: list[list[str]]) -> str:
    esc = lambda s: str(s).replace("|", "\\|")
    lines = ["| " + " | ".join(map(esc, header)) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(map(esc, r)) + " |" for r in rows]
    return "\n".join(lines)


def _seedset(s: set) -> str:
    return "{" + ", ".join(str(x) for x in sorted(s, key=lambda v: (v is None, v if v is not None else 0))) + "}"


def _statistics_method(res: dict) -> list[str]:
    """The "Statistics method" section: exactly the methods behind every interval and verdict."""
    n_min = res["min_seeds"]
    return [
        "## Statistics method",
        "",
        "- Per-variant cells: mean over seeds with a 95% Student t interval, mean ± t(0.975, n−1)·s/√n. "
        "Seeds that are all equal give a zero-width interval (they show no spread); one seed gives none.",
        "- Interquartile mean (IQM, rliable; mean of the middle 50% as in `scipy.stats.trim_mean(x, 0.25)`) "
        "for variants with at least 4 seeds, final value in the headline, every quantity in report.csv: "
        "Tukey–McLaughlin interval, IQM ± t(0.975, h−1)·√((n−1)·s_w²/(h(h−1))), s_w² the variance of the "
        "winsorized seeds, h the number of seeds kept (s²/n instead when the kept values tie).",
        "- Differences: mean(variant) − mean(reference) with Welch's 95% interval (Welch–Satterthwaite degrees "
        "of freedom); its p-value is the matching two-sided Welch t-test (p < 0.05 exactly when the interval "
        "excludes 0).",
        "- Probability of improvement (rliable): P(variant seed > reference seed) + ½ P(tie) over all seed "
        "pairs, with Newcombe's (2006) Method 5 score interval and a continuity correction of 1/(2nm).",
        f"- Verdict: *{BETTER}* / *{WORSE}* where the difference's interval excludes 0, else *{NO_DIFFERENCE}*; "
        f"a comparison with fewer than {n_min} seeds on either side reads *{TOO_FEW_SEEDS}* whatever its "
        "interval says (`--min-seeds N`). Higher values count as better.",
        "- Holm: the same decision with Holm–Bonferroni adjusted p-values over the comparisons against the "
        "same reference on the same quantity that get a verdict (family-wise error 5% across the k variants).",
        "- Coverage of these intervals is measured by simulation (`scripts/coverage.py`, "
        "`tests/report/test_stats_coverage.py`): at least 93% on normal seed scores and 90% on skewed, bounded ones "
        "like accuracies near 0 or 1, at 3, 5 and 10 seeds. They hold less where a third or more of the seeds "
        "sit on a bound (all-equal seeds give zero width) or a rare gross outlier moves the mean more than a "
        "few seeds can show (read the IQM then). No bootstrap is used (`--reps` is ignored); rliable's "
        "stratified bootstrap stays in `rlcompare.report.stats` for many runs × tasks.",
        "",
    ]


def _difference_cell(x: pd.Series) -> str:
    s = f"{x['diff']:+.3f}"
    if not _isnan(x["diff_low"]):
        s += f" [{x['diff_low']:+.3f}, {x['diff_high']:+.3f}]"
    return s


def _poi_cell(x: pd.Series) -> str:
    return f"{x['poi']:.2f} [{x['poi_low']:.2f}, {x['poi_high']:.2f}]"


def _differences_row(v: str, ref: str, g: pd.DataFrame) -> list[str]:
    g = g.set_index("quantity")
    first = g.iloc[0]
    row = [
        v + ("" if bool(first["matched"]) else " ⚠ unmatched"),
        ref,
        f"{int(first['n_variant'])} vs {int(first['n_reference'])}",
    ]
    for q in DIFF_QUANTITIES:
        if q not in g.index:
            row += ["—"] * 4
            continue
        x = g.loc[q]
        row += [_difference_cell(x), x["verdict"], x["verdict_holm"], _poi_cell(x)]
    return row


def _differences_section(res: dict) -> list[str]:
    d: pd.DataFrame = res["differences"]
    L = ["## Differences against reference", ""]
    if d.empty:
        L.append(
            "No variant has a (matched) reference to compare against. References come from "
            "`sweep.reference` (set by `rlcompare sweep`); use `--reference VARIANT` to compare every "
            "variant against one of them."
        )
        return L + [""]
    rows = [_differences_row(v, ref, g) for (v, ref), g in d.groupby(["variant", "reference"], sort=False)]
    header = ["variant", "reference", "seeds"]
    for q, short, label in (("final", "final", f"final {res['metric']}"), ("auc", "AUC", "AUC")):
        header += [f"Δ {label}", f"verdict ({short})", f"Holm ({short})", f"P(improvement) {short}"]
    L.append(_md_table(header, rows))
    L.append("")
    L.append(
        "Δ = variant − reference, mean over seeds [95% Welch interval]. Verdict: the interval's decision; "
        "Holm: the decision adjusted for comparing several variants with one reference (see Statistics "
        "method)."
    )
    few = d[d["verdict"] == TOO_FEW_SEEDS].drop_duplicates(["variant", "reference"])
    if not few.empty:
        L.append("")
        L.append(
            f"{len(few)} comparison(s) have fewer than {res['min_seeds']} seeds on a side: "
            f"*{TOO_FEW_SEEDS}*, whatever the interval says; run more seeds (or `--min-seeds N`)."
        )
    return L + [""]


def _markdown(res: dict) -> str:
    """report.md: how runs were compared, attention flags, the headline, statistics, comparability,
    differences, the compute fit, plots and the run list."""
    L: list[str] = [f"# rlcompare report: `{res['results_dir']}`", ""]
    L += _md_comparison_point(res)
    L += _md_headline(res)
    L += _statistics_method(res)
    L += _md_comparability(res)
    L += _differences_section(res)
    L += _compute_fit_section(res)
    L += _md_plots(res)
    L += _md_runs(res)
    return "\n".join(L)


def _md_comparison_point(res: dict) -> list[str]:
    """Where runs are compared, the metric and threshold, the Attention flags and how many runs count."""
    metric, T, runs = res["metric"], res["at_tokens"], res["runs"]
    L: list[str] = []
    if res["mode"] == "interpolate":
        L.append(
            f"**Compared at equal generated tokens: {_fmt_tokens(T)}** (`--at-tokens {T:g}`): "
            f"values linearly interpolated between {res['metric_source']}.jsonl rows at that point."
        )
    elif not _isnan(T):
        which = (
            f"shortest run: `{res['shortest_run']}`; later rows are ignored and values at the cut are "
            "interpolated between the rows around it"
            if res["shortest_run"]
            else "all included runs end there"
        )
        L.append(
            f"**Compared at equal generated tokens: {_fmt_tokens(T)}** — every run cut to the smallest "
            f"common final `tokens/generated` ({which}). Use `--at-tokens N` to compare at another point."
        )
    else:
        L.append("**No completed runs to compare.**")
    L.append("")
    L.append(
        f"Metric: `{metric}` (from {res['metric_source']}.jsonl). "
        + (
            f"Threshold for *tokens to threshold*: {res['threshold']:.3f} ({res['threshold_how']})."
            if res["threshold"] is not None and not _isnan(res["threshold"])
            else ""
        )
    )
    L.append("")
    if res["flags"]:
        L.append("> **Attention**")
        for f in res["flags"]:
            L.append(f"> - {f}")
        L.append("")
    n_runs = len(runs)
    n_inc = int(runs["included"].sum()) if n_runs else 0
    L.append(f"{n_inc} of {n_runs} run folder(s) included in the statistics.")
    L.append("")
    return L


def _md_headline(res: dict) -> list[str]:
    """The headline table (one row per variant) and the training diagnostics; nothing without variants."""
    h: pd.DataFrame = res["headline"]
    if h.empty:
        return []
    any_iqm = (h["n_seeds"] >= 4).any()
    L = ["## Headline (sorted by final value)", ""]
    header = [
        "variant",
        "algorithm",
        "seeds",
        f"final {res['metric']}",
        "best",
        "AUC",
        "tokens to threshold",
        "wall time (s)",
        "tokens/s",
    ]
    if any_iqm:
        header.insert(4, "final IQM")
    L.append(_md_table(header, [_md_headline_row(r, any_iqm) for _, r in h.iterrows()]))
    L.append("")
    L.append(
        "Cells: mean over seeds [95% Student t interval]; IQM [95% Tukey–McLaughlin interval]; "
        "— = not available (one seed gives no interval). "
        "AUC = area under the metric-vs-generated-tokens curve divided by the token span (a mean value). "
        "Tokens/s = generated tokens / wall time at the comparison point."
        + (" ⚠ = unmatched (see Attention)." if not h["matched"].all() else "")
    )
    L.append("")
    L += ["### Training diagnostics (means over steps up to the comparison point)", ""]
    rows = []
    for _, r in h.iterrows():
        rows.append(
            [
                r["variant"],
                _cell(r, "length_correct", "length"),
                _cell(r, "length_incorrect", "length"),
                _cell(r, "clip_low", "frac"),
                _cell(r, "clip_high", "frac"),
                _cell(r, "zero_variance_frac", "frac"),
            ]
        )
    L.append(
        _md_table(
            ["variant", "length correct", "length incorrect", "clip low", "clip high", "zero-variance groups"], rows
        )
    )
    L.append("")
    return L


def _md_headline_row(r, any_iqm: bool) -> list[str]:
    reached = int(r.get("tokens_to_threshold_reached", 0))
    ttt = _cell(r, "tokens_to_threshold", "tokens")
    if reached < r["n_seeds"]:
        ttt = f"{ttt} ({reached}/{r['n_seeds']} reached)" if reached else "not reached"
    cells = [
        r["variant"] + ("" if r["matched"] else " ⚠"),
        r["algorithm"] or "—",
        str(r["n_seeds"]),
        _cell(r, "final", "score"),
        _cell(r, "best", "score"),
        _cell(r, "auc", "score"),
        ttt,
        _cell(r, "wall_time_s", "seconds"),
        _cell(r, "tokens_per_s", "rate"),
    ]
    if any_iqm:
        iq = r["final_iqm"]
        cells.insert(
            4,
            "—"
            if _isnan(iq)
            else f"{_fmt(iq, 'score')} [{_fmt(r['final_iqm_low'], 'score')}, {_fmt(r['final_iqm_high'], 'score')}]",
        )
    return cells


def _md_comparability(res: dict) -> list[str]:
    L = ["## Comparability", ""]
    L.append(
        "Runs compared must share `fingerprint.json` (initial weights, prompts and split, verifier, budget, "
        "sampling), except the fields of the component a sweep variant changes (`sweep.component`); "
        "a variant and its reference must use the same seeds."
    )
    L.append("")
    for n in res["notes"]:
        L.append(f"- {n}")
    if res["flags"]:
        L.append("- See **Attention** at the top for unmatched, partial and failed runs.")
    elif not res["notes"]:
        L.append("- All compared runs are matched.")
    L.append("")
    return L


def _md_plots(res: dict) -> list[str]:
    L = ["## Plots", ""]
    if res["plots"]:
        for p in res["plots"]:
            name = Path(p).name
            L.append(f"- [{name}]({name})")
        L.append("")
        for p in res["plots"]:
            name = Path(p).name
            L.append(f"![{name}]({name})")
        L.append("")
    else:
        L.append("No plots (no included runs).")
        L.append("")
    return L


def _md_runs(res: dict) -> list[str]:
    """Every run folder: status, final tokens, its value at the comparison point and why it is left out."""
    runs: pd.DataFrame = res["runs"]
    L = ["## Runs", ""]
    rows = []
    for _, r in runs.iterrows():
        status = r["status"] if r["included"] or r["status"] != "completed" else "completed (left out)"
        if r["status"] == "failed":
            why = r["error"] or "no error recorded"
        elif r["status"] == "partial":
            why = r["notes"]
        elif not r["included"]:
            why = r["excluded_because"]
        else:
            why = r["notes"]
        rows.append(
            [
                r["run"],
                r["variant"],
                "—" if pd.isna(r["seed"]) else str(int(r["seed"])),
                status,
                _fmt_tokens(r["final_tokens"]),
                _fmt(r["final"], "score"),
                why or "",
            ]
        )
    L.append(
        _md_table(
            ["run", "variant", "seed", "status", "final tokens", f"{res['metric']} at comparison point", "note"], rows
        )
    )
    L.append("")
    L.append(
        "Files: `report.csv` (headline, all quantities with intervals and IQM), `differences.csv`, "
        "`runs.csv` (one row per run)."
    )
    L.append("")
    return L


# --------------------------------------------------------------------------
# CLI


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="rlcompare report",
        description="Compare runs in a results folder at equal generated tokens, with seed confidence intervals.",
    )
    p.add_argument("results_dir", help="results folder (e.g. results/<experiment>); searched recursively for runs")
    p.add_argument("--metric", default=DEFAULT_METRIC, help="metric to compare (default: eval/accuracy)")
    p.add_argument(
        "--at-tokens",
        type=float,
        default=None,
        metavar="N",
        help="compare at N generated tokens (linear interpolation) instead of cutting every run "
        "to the smallest common final tokens/generated",
    )
    p.add_argument(
        "--threshold",
        type=float,
        default=None,
        metavar="X",
        help="value for 'tokens to threshold' (default: midway between mean initial and mean best)",
    )
    p.add_argument(
        "--out", default=None, metavar="DIR", help="where to write report.md, CSVs, plots (default: the results folder)"
    )
    p.add_argument(
        "--allow-unmatched",
        action="store_true",
        help="compute differences for unmatched variant/reference pairs too (flagged)",
    )
    p.add_argument(
        "--reference", default=None, metavar="VARIANT", help="reference for variants without sweep.reference"
    )
    p.add_argument(
        "--reps",
        type=int,
        default=DEFAULT_REPS,
        help="ignored: the report's intervals are closed-form (kept so older command lines run)",
    )
    p.add_argument(
        "--min-seeds",
        type=int,
        default=DEFAULT_MIN_SEEDS,
        metavar="N",
        help="seeds each side of a comparison needs before it gets a verdict; fewer reads "
        f"'{TOO_FEW_SEEDS}' whatever the interval says (default: {DEFAULT_MIN_SEEDS})",
    )
    p.add_argument(
        "--compute",
        default="tokens",
        metavar="tokens|seconds",
        help="compute axis of ScaleRL's compute-performance fit: generated tokens or wall seconds "
        "(default: tokens; docs/compute_fit.md)",
    )
    return p


def main(argv: Optional[list] = None) -> int:
    args = _parser().parse_args(list(sys.argv[1:] if argv is None else argv))
    try:
        res = build_report(
            args.results_dir,
            metric=args.metric,
            at_tokens=args.at_tokens,
            out_dir=args.out,
            allow_unmatched=args.allow_unmatched,
            threshold=args.threshold,
            reference=args.reference,
            reps=args.reps,
            min_seeds=args.min_seeds,
            compute=args.compute,
        )
    except ReportError as e:
        print(f"rlcompare report: {e}", file=sys.stderr)
        return 2
    n = len(res["runs"])
    inc = int(res["runs"]["included"].sum())
    print(
        f"wrote {res['report_path']} ({inc} of {n} runs compared, {len(res['headline'])} variants"
        + (f", {len(res['flags'])} warning(s) at the top" if res["flags"] else "")
        + ")"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
