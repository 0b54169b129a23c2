"""The report's plots: per variant the mean curve over seeds with its 95% t interval as a band (figures.seed_band),
against generated tokens; PNG, and an svg or pdf copy with --format."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Optional

import numpy as np

from . import figures
from .compare import metric_bounds
from .curves import _curve
from .figures import FIGURE_FORMATS  # noqa: F401 - build's --format choices
from .fit_section import ComputeFitReport, _compute_fit_plot, _draw_fit_lines, _fit_lines
from .load import Run
from . import passk_section
from .text import plain_label


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
    mean, low, high = figures.seed_band(ys, *metric_bounds(col))
    return grid, mean, low, high, len(curves)


def _plots(
    variants: dict,
    order: list[str],
    metric: str,
    source: str,
    T: float,
    out: Path,
    notes: list[str],
    fit_report: Optional[ComputeFitReport] = None,
    passk_curves: Optional[dict] = None,
    figure_format: str = "png",
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
    overlay = fit_report is not None and fit_report.compute == "tokens" and metric == fit_report.metric
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
                ax.plot(grid, mean, style, color=color[v], label=plain_label(f"{v}{suffix} (n={n})"))
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
        ax.set_title(plain_label(title) + f" — mean over seeds, {figures.BAND_LABEL}")
        ax.grid(alpha=0.3)
        ax.legend(fontsize="small", loc="best")
        fig.tight_layout()
        written.append(figures.save(fig, out / fname, figure_format))
        plt.close(fig)
    fit_plot = _compute_fit_plot(fit_report, color, out, plt, figure_format) if fit_report and not overlay else None
    passk_plot = passk_section.plot(passk_curves, color, out, plt, figure_format) if passk_curves else None
    return written + [p for p in (fit_plot, passk_plot) if p]
