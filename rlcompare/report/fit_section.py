"""The report's wiring of ScaleRL's compute-performance fit (the math is in compute_fit.py, docs/compute_fit.md):
which runs it reads, the fit per variant, its CSVs, its lines in the plots and its report.md section."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

import numpy as np
import pandas as pd

from . import compute_fit, figures
from .compare import metric_bounds
from .curves import _curve
from .load import TOKENS, ReportError
from .text import _fmt_tokens, _md_table, csv_safe, plain_label


# ScaleRL's curve is fitted to the report's --metric when it is a held-out share in [0, 1] read from eval.jsonl
# (eval/accuracy, the default; eval/avg@n, pass@k, ...); another metric is not fitted (the curve lives in [0, 1])
FIT_METRIC = "eval/accuracy"
FIT_SECONDS = "time/elapsed_s"
FIT_CURVE_POINTS = 200  # points of each dashed fitted curve in the plots

# below this share of identifiable bootstrap refits, the fit's intervals mix edge-of-grid fits: say so
FIT_BOOT_SHARE_SHOWN = 0.95


@dataclass
class ComputeFitReport:
    """What the report fitted: ``fit`` is None when no run had a curve the fit can read."""

    compute: str
    fit: Optional[compute_fit.ArmFits]
    curves: dict  # variant -> [compute_fit.SeedCurve], the runs the fit read
    notes: list[str]
    metric: str = FIT_METRIC  # the held-out metric the fit read (the report's --metric)


def _check_compute(compute: Any) -> None:
    if compute not in compute_fit.COMPUTE_AXES:
        raise ReportError(
            f"--compute={compute}: accepted values are {' or '.join(compute_fit.COMPUTE_AXES)} "
            "(the compute axis of the ScaleRL fit: generated tokens or wall seconds; default tokens)"
        )


def _fit_seed_curve(
    evals: pd.DataFrame, compute: str, metric: str = FIT_METRIC
) -> tuple[Optional[compute_fit.SeedCurve], str]:
    """One run's eval rows as the fit's SeedCurve, rows kept as `_curve` keeps them; or (None, why not)."""
    tokens, accuracy = _curve(evals, metric)
    if tokens.size < 2:
        return None, f"fewer than 2 eval.jsonl rows with {metric} and {TOKENS}"
    step_tokens, steps = _curve(evals, "step")
    if not (step_tokens.size and step_tokens[0] == tokens[0] and steps[0] == 0):
        return None, "its first eval row is not the step-0 eval (R0 is read there)"
    if np.any((accuracy < 0) | (accuracy > 1)):
        return None, f"{metric} outside [0, 1]"
    seconds_tokens, seconds = _curve(evals, FIT_SECONDS)
    has_seconds = np.array_equal(seconds_tokens, tokens)
    if compute == "seconds" and not has_seconds:
        return None, f"{FIT_SECONDS} missing on some eval rows"
    if compute == "seconds" and not np.all(np.isfinite(seconds)):
        return None, f"{FIT_SECONDS} not finite"
    if compute == "seconds" and np.any(np.diff(seconds) <= 0):
        return None, f"{FIT_SECONDS} does not increase from eval row to eval row"
    return compute_fit.SeedCurve(accuracy, tokens, seconds if has_seconds else None), ""


def _fit_curves(variants: dict, order: list[str], compute: str, metric: str = FIT_METRIC) -> tuple[dict, list[str]]:
    """variant -> the SeedCurves of its included runs the fit can read; one note per reason for the rest."""
    curves: dict = {}
    left_out: dict[str, list[str]] = {}
    for v in order:
        for r in variants[v]:
            curve, why = _fit_seed_curve(r.evals, compute, metric)
            if curve is None and compute == "seconds" and f"eval.jsonl: {FIT_SECONDS}" in r.infinite:
                why = f"{FIT_SECONDS} not finite"  # set aside when read (frames.finite_frame), not missing
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


def _compute_fit(
    variants: dict,
    order: list[str],
    differences: pd.DataFrame,
    compute: str,
    metric: str = FIT_METRIC,
    source: str = "eval",
) -> ComputeFitReport:
    """ScaleRL's fit per variant over its seeds to --metric, and the differences for the differences table's
    pairs; not fitted (a note says why) when --metric is not a held-out share in [0, 1]."""
    if source != "eval" or metric_bounds(metric) != (0.0, 1.0):
        why = f"`{metric}` is not a held-out share in [0, 1] read from eval.jsonl, and ScaleRL's curve lives in [0, 1]"
        return ComputeFitReport(compute, None, {}, [f"not fitted: {why}"], metric)
    curves, notes = _fit_curves(variants, order, compute, metric)
    if not curves:
        return ComputeFitReport(compute, None, curves, notes, metric)
    try:
        fit = compute_fit.fit_arms(
            curves,
            compute=compute,
            reps=compute_fit.DEFAULT_REPS,
            seed=0,
            reference=_fit_reference_pairs(differences, curves),
        )
    except ValueError as e:  # a curve shape the checks above let through: the rest of the report stands
        return ComputeFitReport(compute, None, curves, notes + [f"fit not computed: {e}"], metric)
    return ComputeFitReport(compute, fit, curves, notes, metric)


def _write_compute_fit_csvs(fr: ComputeFitReport, out: Path) -> None:
    """compute_fit.csv (one row per variant) and compute_fit_differences.csv; empty when nothing was fitted."""
    arms = compute_fit.fit_rows(fr.fit) if fr.fit else []
    diffs = compute_fit.difference_rows(fr.fit) if fr.fit else []
    csv_safe(pd.DataFrame(arms)).to_csv(out / "compute_fit.csv", index=False)
    csv_safe(pd.DataFrame(diffs)).to_csv(out / "compute_fit_differences.csv", index=False)


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
        ax.plot(x, y, "--", color=color[v], linewidth=1.2, label=plain_label(f"{v} ScaleRL fit"))


def _fit_axis(fr: ComputeFitReport, curve: compute_fit.SeedCurve) -> np.ndarray:
    raw = curve.tokens if fr.compute == "tokens" else curve.seconds
    return np.asarray(raw, float) - float(raw[0])  # counted from step 0, as the fit counts it


def _compute_fit_plot(fr: ComputeFitReport, color: dict, out: Path, plt, figure_format: str = "png") -> Optional[str]:
    """compute_fit.png: per variant the mean curve the fit read (its 95% t interval over seeds as a band), the fit
    dashed."""
    if fr.fit is None:
        return None
    fig, ax = plt.subplots(figsize=(7.5, 4.5))
    for v, arm in fr.fit.arms.items():
        seeds = np.vstack([np.interp(arm.grid, _fit_axis(fr, cv), cv.accuracy) for cv in fr.curves[v]])
        ax.plot(arm.grid, arm.mean_curve, "-", color=color[v], label=plain_label(f"{v} (n={arm.n_seeds})"))
        if arm.n_seeds > 1:
            _, low, high = figures.seed_band(seeds, 0.0, 1.0)
            ax.fill_between(arm.grid, low, high, color=color[v], alpha=0.15, linewidth=0)
    _draw_fit_lines(ax, _fit_lines(fr, on_token_axis=False), color)
    ax.set_xlabel(("generated tokens" if fr.compute == "tokens" else "wall seconds") + " from the step-0 eval")
    ax.set_title(f"Held-out {fr.metric}, ScaleRL fit dashed — {figures.BAND_LABEL}")
    ax.grid(alpha=0.3)
    ax.legend(fontsize="small", loc="best")
    fig.tight_layout()
    path = figures.save(fig, out / "compute_fit.png", figure_format)
    plt.close(fig)
    return path


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
            f"Not fitted: no included run has an eval.jsonl curve of `{fr.metric}` from its step-0 eval."
            if not fr.curves and not fr.notes
            else "Not fitted (see the note below)."
        )
        return L + [""] + [f"- {n}" for n in fr.notes] + ([""] if fr.notes else [])
    axis = "generated tokens" if fr.compute == "tokens" else "wall seconds"
    L.append(
        f"R(C) = R0 + (A − R0) / (1 + (C_mid / C)^B) fitted as ScaleRL App. A.5 does to held-out "
        f"`{fr.metric}` against {axis} C counted from the step-0 eval (`--compute {fr.compute}`), on each "
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
