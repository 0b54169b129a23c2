"""pass@k from the per-prompt counts sampled evals store (eval_counts.jsonl, issue 50): the column a `--metric
eval/pass@K` or `eval/pass^K` is judged on, recomputed for any K up to the samples per prompt; and the pass@k
against k curves of every variant at the comparison point beside the warm start's (the step-0 eval), with the k at
which a variant's curve falls to the warm start's (arXiv 2504.13837). Intervals are over seeds (one run = one
replication), never over prompts or samples (docs/reports.md)."""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Optional

import numpy as np

from rlcompare import passk
from rlcompare.results import EVAL_COUNTS, read_eval_counts

from . import figures
from .load import TOKENS, Run
from .stats import Interval, clip_interval, mean_ci
from .curves import _value_at
from .text import _fmt, _md_table, plain_label

COUNTS_METRIC = re.compile(r"eval/(pass@|pass\^|maj@)([1-9][0-9]*)")
_ESTIMATORS = {"pass@": passk.mean_pass_at_k, "pass^": passk.mean_pass_hat_k}


def counts_of(r: Run) -> list[dict]:
    """The run's eval_counts.jsonl rows (shapes checked; notes on the run for rows set aside), read once."""
    if r.eval_counts is None:
        r.eval_counts, notes = read_eval_counts(Path(r.path) / EVAL_COUNTS)
        r.notes.extend(notes)
    return r.eval_counts


def recompute_from_counts(runs: list[Run], metric: str) -> int:
    """For `--metric eval/pass@K` (or pass^K, maj@K): every run's eval rows get the metric recomputed from its
    stored counts (nan where an eval sampled fewer than K per prompt, or, for maj@K, did not report K); runs without
    counts keep what eval.jsonl logged.
    Called before any curve is read (frames are not changed afterwards). Returns how many runs were recomputed
    (0 for another metric: report.md names eval_counts.jsonl as the source when any was)."""
    m = COUNTS_METRIC.fullmatch(metric)
    if m is None:
        return 0
    estimator, k = _ESTIMATORS.get(m.group(1), _majority), int(m.group(2))
    recomputed = 0
    for r in runs:
        rows = counts_of(r)
        if not rows or r.evals.empty or "step" not in r.evals.columns:
            continue
        by_step = {row["step"]: row for row in rows}
        values = [_value(by_step.get(s), estimator, k) for s in r.evals["step"].tolist()]
        evals = r.evals.copy()
        evals[metric] = np.asarray(values, dtype=float)
        r.evals = evals
        recomputed += 1
    return recomputed


def _value(row: Optional[dict], estimator, k: int) -> float:
    if row is None or k > min(row["n"]):
        return float("nan")
    if estimator is _majority:
        return _majority(row, k)
    return estimator(row["n"], row["c"], k)


def _majority(row: dict, k: int) -> float:
    """maj@k over prompts from a row's stored votes (the trainer's first-k-samples rule, rlcompare.passk); nan
    when the eval did not report k (maj@k needs the answers, so only the reported k are stored)."""
    if k not in row.get("k", []):
        return float("nan")
    votes = row["maj"][row["k"].index(k)]
    return sum(votes) / len(votes)


def _timed(rows: list[dict]) -> list[dict]:
    """Counts rows that carry a token count, in token order (rows without one cannot be placed on the axis)."""
    kept = [r for r in rows if isinstance(r.get(TOKENS), (int, float)) and math.isfinite(r[TOKENS])]
    return sorted(kept, key=lambda r: (r[TOKENS], r["step"]))


def _curve_at(rows: list[dict], T: float, ks: list[int]) -> Optional[list[float]]:
    """pass@k for each k at T generated tokens, read the way the verdicts read a metric (curves._segment):
    linear in tokens between the evals around T, the last eval when the run ends before T, None when its first
    eval lies after T. A run evaluated only at its start and end is thus read between the two, never at step 0
    because its final eval landed a few tokens past the shortest run's end."""
    if not rows:
        return None
    t = np.array([r[TOKENS] for r in rows], dtype=float)
    per_row = np.array([[passk.mean_pass_at_k(r["n"], r["c"], k) for k in ks] for r in rows])  # (evals, ks)
    values = [_value_at(t, per_row[:, j], T)[0] for j in range(len(ks))]
    return None if any(math.isnan(v) for v in values) else values


def curves(variants: dict[str, list[Run]], T: float) -> dict:
    """{"ks", "base": warm-start pass@k (mean over runs' step-0 counts), "arms": {variant: {"mean", "low", "high",
    "seeds", "crosses_at"}}} at the comparison point T; empty when no run stored counts."""
    timed = {v: [_timed(counts_of(r)) for r in vr] for v, vr in variants.items()}
    base = [rows[0] for per_run in timed.values() for rows in per_run if rows and rows[0]["step"] == 0]
    every = [row for per_run in timed.values() for rows in per_run for row in rows]
    if not every:
        return {}
    ks = passk.default_ks(min(min(row["n"]) for row in every))
    base_curve = (
        np.mean([[passk.mean_pass_at_k(row["n"], row["c"], k) for k in ks] for row in base], axis=0).tolist()
        if base
        else [math.nan] * len(ks)
    )
    arms = {}
    for v, per_run in timed.items():
        at_T = [c for c in (_curve_at(rows, T, ks) for rows in per_run) if c is not None]
        if not at_T:
            continue
        per_seed = np.array(at_T)  # (seeds, ks): the seed is the unit of replication
        cis = [mean_ci(per_seed[:, j]) for j in range(len(ks))]
        mean = [c.point for c in cis]
        arms[v] = {
            "mean": mean,
            "low": [c.low for c in cis],
            "high": [c.high for c in cis],
            "seeds": len(at_T),
            "crosses_at": passk.crossing_k(ks, mean, base_curve) if base else None,
        }
    return {"ks": ks, "base": base_curve, "arms": arms}


def plot(pk: dict, color: dict, out: Path, plt, figure_format: str = "png") -> Optional[str]:
    """passk.png: pass@k against k (log2 axis) per variant, its seed interval as a band, the warm start dashed."""
    if not pk or not pk["arms"]:
        return None
    fig, ax = plt.subplots(figsize=(7.5, 4.5))
    ks = pk["ks"]
    for v, arm in pk["arms"].items():
        c = color.get(v, "C0")
        ax.plot(ks, arm["mean"], "-o", color=c, markersize=3, label=plain_label(f"{v} (n={arm['seeds']})"))
        if arm["seeds"] > 1:
            low, high = np.clip(arm["low"], 0, 1), np.clip(arm["high"], 0, 1)  # pass@k lives in [0, 1]
            ax.fill_between(ks, low, high, color=c, alpha=0.15, linewidth=0)
    if not all(math.isnan(b) for b in pk["base"]):
        ax.plot(ks, pk["base"], "--", color="black", label="warm start (step 0)")
    ax.set_xscale("log", base=2)
    ax.set_xticks(ks, [str(k) for k in ks])
    ax.set_xlabel("k (samples per prompt)")
    ax.set_ylabel("pass@k")
    ax.set_title("Held-out pass@k at the comparison point\nmean over seeds, band = 95% t interval over seeds")
    ax.grid(alpha=0.3)
    ax.legend(fontsize="small", loc="best")
    fig.tight_layout()
    path = figures.save(fig, out / "passk.png", figure_format)
    plt.close(fig)
    return path


def _cell(mean: float, low: float, high: float) -> str:
    """mean [low, high] with the interval cut to [0, 1], pass@k's range, and marked ✂ where it was cut."""
    (_, low, high), cut = clip_interval(Interval(mean, low, high), 0.0, 1.0)
    return f"{_fmt(mean, 'metric')} [{_fmt(low, 'metric')}, {_fmt(high, 'metric')}]" + (" ✂" if cut else "")


def section(res: dict) -> list[str]:
    """report.md's pass@k section (nothing when no run stored sampled-eval counts)."""
    pk = res.get("passk") or {}
    if not pk or not pk["arms"]:
        return []
    ks = pk["ks"]
    head = ["variant", "seeds"] + [f"pass@{k}" for k in ks] + ["falls to the warm start at k"]
    rows = [["warm start (step 0)", "—"] + [_fmt(b, "metric") for b in pk["base"]] + ["—"]]
    for v, arm in pk["arms"].items():
        cells = [_cell(m, lo, hi) for m, lo, hi in zip(arm["mean"], arm["low"], arm["high"])]
        crosses = arm["crosses_at"]
        rows.append([v, str(arm["seeds"])] + cells + ["never" if crosses is None else f"{crosses:.3g}"])
    return [
        "## pass@k against k",
        "",
        "From the per-prompt correct counts of the sampled evals (eval_counts.jsonl), read at the comparison point "
        "as the verdicts read a metric (linear in generated tokens between the evals around it), "
        "with the unbiased estimator 1 − C(n−c, k)/C(n, k) averaged over held-out prompts; mean over seeds with a "
        "95% Student t interval over seeds, cut to [0, 1] where it runs past (✂) (the seed is the unit of replication: a prompt's samples are not "
        "replications of training). The warm start's curve is the step-0 eval. *Falls to the warm start at k*: "
        "the k (interpolated in log2 k) where the variant's mean curve, above the warm start's at small k, "
        "meets it (the base model catching up at large k, arXiv 2504.13837); never: it stays above, or starts "
        "below.",
        "",
        _md_table(head, rows),
        "",
    ]
