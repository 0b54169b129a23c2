"""`rlcompare report`: compare finished runs from a results/ folder.

Reads only the files described in docs/internals.md (config.yaml, fingerprint.json,
metrics.jsonl, eval.jsonl, summary.json) and writes report.md, report.csv,
differences.csv, runs.csv and PNG plots. Never imports torch.

    rlcompare report RESULTS_DIR [--metric eval/accuracy] [--at-tokens N]
                     [--estimand window|final|auc] [--threshold X] [--out DIR] [--allow-unmatched]
                     [--reference VARIANT] [--min-seeds 5]
                     [--compute tokens|seconds] [--format png|svg|pdf]

    python -m rlcompare.report RESULTS_DIR ...

Runs are compared at equal generated tokens T: by default T is the smallest
common final `tokens/generated` (every run cut there); with --at-tokens N,
T = N and runs that end before N are left out. Values at T are linearly
interpolated between the eval rows around T when no row sits exactly there.
Verdicts judge --estimand (rlcompare.report.estimands): by default the mean of
the last 3 evals up to T, else the single value there (final) or the AUC.

Per variant it also fits ScaleRL's compute-performance curve to held-out accuracy
(rlcompare.report.compute_fit; --compute picks generated tokens or wall seconds) and writes
compute_fit.csv and compute_fit_differences.csv (docs/compute_fit.md).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Optional

from . import compute_fit  # noqa: F401 - `build.compute_fit` was public
from . import passk_section
from .compare import (
    ALPHA,  # noqa: F401 - public names of the module before it was split
    DEFAULT_METRIC,
    DEFAULT_MIN_SEEDS,
    DEFAULT_REPS,
    DIFF_QUANTITIES,  # noqa: F401
    NO_DIFFERENCE,  # noqa: F401
    QUANTITIES,  # noqa: F401
    STEP_MEANS,  # noqa: F401
    TOO_FEW_SEEDS,
    _apply_threshold,
    _assign_variants,
    _check_min_seeds,
    _check_within_variants,
    _comparison_point,
    _differences,
    _group_variants,
    _mark_included,
    _metric_source,
    _per_run_values,
    _runs_table,
    _status_flags,
    _variant_tables,
    SAMPLED_METRIC,
    default_metric,
    unreferenced_flag,
    verdict,  # noqa: F401
)
from .curves import tokens_to_reach  # noqa: F401
from .estimands import DEFAULT_ESTIMAND, ESTIMANDS
from .fit_section import (
    FIT_BOOT_SHARE_SHOWN,  # noqa: F401
    FIT_CURVE_POINTS,  # noqa: F401
    FIT_METRIC,  # noqa: F401
    FIT_SECONDS,  # noqa: F401
    ComputeFitReport,  # noqa: F401
    _check_compute,
    _compute_fit,
)
from .load import (
    RUN_MARKERS,  # noqa: F401
    SKIP_DIRS,  # noqa: F401
    TOKENS,  # noqa: F401
    ReportError,
    Run,
    find_run_dirs,
    load_run,
    read_jsonl,  # noqa: F401
    read_jsonl_frame,  # noqa: F401
    strip_seed,  # noqa: F401
)
from .degenerate import degenerate_flag, mark_degenerate
from .markdown import _write_report
from .plots import FIGURE_FORMATS
from .matching import fingerprint_diff, provenance_flag  # noqa: F401


__all__ = ["build_report", "main", "ReportError", "read_jsonl_frame", "find_run_dirs"]


def build_report(
    results_dir,
    metric: Optional[str] = None,
    at_tokens: Optional[float] = None,
    out_dir=None,
    allow_unmatched: bool = False,
    threshold: Optional[float] = None,
    reference: Optional[str] = None,
    reps: int = DEFAULT_REPS,
    write: bool = True,
    min_seeds: int = DEFAULT_MIN_SEEDS,
    compute: str = "tokens",
    estimand: str = DEFAULT_ESTIMAND,
    figure_format: str = "png",
) -> dict:
    """Build the comparison and (by default) write report.md, CSVs and PNGs (``figure_format`` svg or pdf: and a
    vector copy of each). ``metric`` None: what the runs call accuracy (compare.default_metric).

    Returns a dict with DataFrames ``headline`` (one row per variant, sorted by final metric), ``summary`` (long:
    variant x quantity), ``differences``, ``runs`` (one row per run folder), plus ``flags`` and ``notes`` (lists of
    str), ``mode`` ('cut' | 'interpolate'), ``at_tokens``, ``threshold``, ``plots`` (paths) and ``report_path``,
    ``estimand`` (what the verdicts judge; ``differences`` holds every estimand's rows, each with its verdicts), and
    ``compute_fit`` (a ComputeFitReport: ScaleRL's fit per variant against ``compute``, tokens or seconds). Raises
    ReportError for folders without runs, an unknown metric or compute axis."""
    root = Path(results_dir)
    out = Path(out_dir) if out_dir is not None else root
    _check_report_arguments(root, at_tokens, reps, min_seeds, compute, estimand, figure_format)
    runs = _load_runs(root, out)
    flags: list[str] = []  # shown at the top of report.md
    notes: list[str] = []  # comparability notes

    _assign_variants(runs, reference)
    metric, metric_note, metric_file, source = _judged_metric(runs, metric)
    _mark_included(runs, metric, source)
    mode, T, shortest = _comparison_point(runs, at_tokens, metric, source)
    included = [r for r in runs if r.included]
    _per_run_values(included, metric, source, T, notes)
    thr, threshold_how = _apply_threshold(included, threshold)

    variants = _group_variants(included, notes)
    unmatched_variants = _check_within_variants(variants, flags, notes)
    differences, pair_problems = _differences(
        runs, variants, unmatched_variants, metric, allow_unmatched, min_seeds, flags, notes, (mode, T)
    )
    headline, summary = _variant_tables(variants, unmatched_variants, pair_problems, reps, metric, estimand)
    runs_df = _runs_table(runs)
    fit_report = _compute_fit(variants, list(headline.get("variant", [])), differences, compute, metric, source)
    _attention_flags(runs, included, variants, flags, notes)

    result = {
        "headline": headline,
        "summary": summary,
        "differences": differences,
        "runs": runs_df,
        "flags": flags,
        "notes": notes,
        "mode": mode,
        "at_tokens": T,
        "estimand": estimand,
        "threshold": thr,
        "threshold_how": threshold_how,
        "metric": metric,
        "metric_source": source,
        "metric_file": metric_file,
        "metric_note": metric_note,  # why the default metric is not eval/accuracy
        "figure_format": figure_format,
        "shortest_run": shortest.name if mode == "cut" and shortest is not None else None,
        "reps": reps,
        "min_seeds": min_seeds,
        "allow_unmatched": allow_unmatched,
        "results_dir": str(root),
        "out_dir": str(out),
        "plots": [],
        "report_path": None,
        "compute_fit": fit_report,
        "passk": passk_section.curves(variants, T),  # pass@k against k (sampled evals' counts)
    }
    if write:
        _write_report(result, variants, out)
    return result


def _attention_flags(runs: list[Run], included: list[Run], variants: dict, flags: list[str], notes: list[str]) -> None:
    """The run-level flags at the top of report.md: failed or unfinished runs, runs that broke a run-health
    invariant, compared runs made in different
    setups (provenance), variants no reference ties together (a folder of runs from outside a sweep)."""
    _status_flags(runs, flags, notes)
    flags += [f for f in [degenerate_flag(runs), provenance_flag(included)] if f]  # run health; setups
    flags += [f for f in [unreferenced_flag(variants)] if f]


def _judged_metric(runs: list[Run], metric: Optional[str]) -> tuple[str, Optional[str], str, str]:
    """(metric, why it is the default or None, where report.md says its values come from, 'eval' | 'metrics'):
    --metric or the runs' accuracy; eval/pass@K, pass^K, maj@K recomputed from the stored counts for any K (a
    recomputed K is eval_counts.jsonl's, not eval.jsonl's)."""
    metric, note = default_metric(runs) if metric is None else (metric, None)
    recomputed = passk_section.recompute_from_counts(runs, metric)
    source = _metric_source(runs, metric)
    with_evals = sum(1 for r in runs if r.status == "completed" and not r.evals.empty)
    if not recomputed:
        where = f"{source}.jsonl"
    elif recomputed >= with_evals:
        where = "eval_counts.jsonl, recomputed from the per-prompt counts"
    else:
        where = (
            f"eval_counts.jsonl, recomputed from the per-prompt counts for {recomputed} run(s); eval.jsonl for the "
            "others"
        )
    return metric, note, where, source


def _check_report_arguments(root: Path, at_tokens, reps: int, min_seeds, compute: str, estimand: str, fmt) -> None:
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
    if fmt not in FIGURE_FORMATS:
        raise ReportError(f"--format {fmt!r}: must be one of {', '.join(FIGURE_FORMATS)} (default png)")
    if estimand not in ESTIMANDS:
        raise ReportError(
            f"--estimand {estimand!r}: must be one of {', '.join(ESTIMANDS)} (default {DEFAULT_ESTIMAND})"
        )


def _load_runs(root: Path, out: Path) -> list[Run]:
    """Every run folder under root (the output folder aside), read; ReportError when there is none."""
    dirs = find_run_dirs(root, skip={out} if out != root else None)
    runs = [r for r in (load_run(d, root) for d in dirs) if r is not None]
    mark_degenerate(runs)  # runs that broke a run-health invariant: never compared, flagged by arm
    if not runs:
        what = "is empty" if not any(root.iterdir()) else "has no run folders"
        raise ReportError(
            f"{root} {what}: no rlcompare runs found (a run folder holds config.yaml or metrics.jsonl, "
            f"as written by `rlcompare train`)"
        )
    return runs


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="rlcompare report",
        description="Compare runs in a results folder at equal generated tokens, with seed confidence intervals.",
    )
    p.add_argument("results_dir", help="results folder (e.g. results/<experiment>); searched recursively for runs")
    p.add_argument(
        "--metric",
        default=None,
        help=f"metric to compare (default: what the runs call accuracy: {DEFAULT_METRIC}, or {SAMPLED_METRIC} "
        "for sampled evals without a greedy one)",
    )
    p.add_argument(
        "--at-tokens",
        type=float,
        default=None,
        metavar="N",
        help="compare at N generated tokens (linear interpolation) instead of cutting every run "
        "to the smallest common final tokens/generated",
    )
    p.add_argument(
        "--estimand",
        choices=ESTIMANDS,
        default=DEFAULT_ESTIMAND,
        help="the quantity verdicts, their intervals, Holm's adjustment and the headline's order use: the mean of "
        "the last 3 evals up to the comparison point (window), the single value there (final), or the mean over "
        "tokens up to it (auc) (default: window; differences.csv holds all three)",
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
    p.add_argument(
        "--format",
        choices=FIGURE_FORMATS,
        default="png",
        help="figures: PNG only (png), or also a vector copy of each beside it (svg, pdf)",
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
            estimand=args.estimand,
            figure_format=args.format,
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
