"""report.md (how runs were compared, the headline, statistics, comparability, differences, the compute fit,
plots, runs) and writing every output file (`_write_report`)."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from . import stats
from .compare import BETTER, BIMODAL_INCONCLUSIVE, DIFF_QUANTITIES, NO_DIFFERENCE, TOO_FEW_SEEDS, WORSE
from .estimands import WINDOW_EVALS, estimand_label
from .figures import vector_copy
from .fit_section import _compute_fit_section, _write_compute_fit_csvs
from .fragile import words as fragile_words
from .load import ReportError, Run
from . import passk_section
from .plots import _plots
from .text import _fmt, _fmt_tokens, _isnan, _md_table, csv_safe, one_line


def _write_report(result: dict, variants: dict[str, list[Run]], out: Path) -> None:
    """report.md, the CSVs and the plots into `out`; result gains their paths. A folder that cannot be written
    (read-only, full, a file in the way) is a ReportError naming --out."""
    try:
        _write_files(result, variants, out)
    except OSError as e:
        raise ReportError(
            f"cannot write the report into {out} ({e.strerror or e}); pass --out DIR to write it to another folder"
        ) from None


def _write_files(result: dict, variants: dict[str, list[Run]], out: Path) -> None:
    headline, fit_report = result["headline"], result["compute_fit"]
    out.mkdir(parents=True, exist_ok=True)
    csv_safe(headline).to_csv(out / "report.csv", index=False)
    csv_safe(result["differences"]).to_csv(out / "differences.csv", index=False)
    csv_safe(result["runs"]).to_csv(out / "runs.csv", index=False)
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
        result.get("passk"),
        result.get("figure_format", "png"),
    )
    report_path = out / "report.md"
    report_path.write_text(_markdown(result), encoding="utf-8")
    result["report_path"] = str(report_path)


def _cell(row: pd.Series, key: str, kind: str) -> str:
    m = row.get(key)
    if m is None or _isnan(m):
        return "—"
    lo, hi = row.get(f"{key}_low"), row.get(f"{key}_high")
    s = _fmt(m, kind)
    if lo is not None and not _isnan(lo):
        s += f" [{_fmt(lo, kind)}, {_fmt(hi, kind)}]"
    if row.get(f"{key}_clipped") is True:
        s += " ✂"  # an interval cut at the quantity's physical range
    return s


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
        f"- What is compared (`rlcompare.report.estimands`): the verdicts judge `--estimand {res['estimand']}`; "
        f"`window` (the default) is the mean of each run's last {WINDOW_EVALS} evals up to the comparison point "
        "(per-step columns: the steps in the last 20% of its tokens), `final` the single value there and `auc` the "
        "mean over tokens up to it; the other two are printed beside it. Each pair is compared at the smaller of "
        "its two arms' final token counts, not at the folder's shortest run.",
        "- Differences: mean(variant) − mean(reference). Where both arms hold the same seeds (one run each), the "
        "paired 95% t interval of the per-seed differences, mean(d) ± t(0.975, n−1)·s_d/√n, and its paired "
        "t-test: seed s of every arm shares its warm start, data order and sampling streams (common random "
        "numbers), so the differences remove what the seeds share. Otherwise Welch's 95% interval "
        "(Welch–Satterthwaite degrees of freedom) and its t-test; Welch's interval is printed beside the paired "
        "one. p < 0.05 exactly when the interval excludes 0.",
        "- MDE: the smallest true difference the test detects with 80% power at these seeds and this spread, "
        '(t(0.975, df) + t(0.80, df))·SE (Bloom 1995): *no detectable difference* reads "none larger than '
        'the MDE".',
        "- Bimodal: an arm whose seeds split at one gap much wider than their spread inside the two groups (the "
        "gap rule, `stats.looks_bimodal`, with two seeds or more on each side: under 5% false alarms on normal "
        "seeds) — runs that learned and runs that collapsed. Below "
        f"{stats.BIMODAL_MIN_SEEDS} seeds in that arm its verdicts read *{BIMODAL_INCONCLUSIVE}*: the coverage "
        "simulation (`scripts/coverage.py --bimodal`) shows the difference's interval covering less than 95% there "
        "(0.80 at 5 seeds with one collapse in 10 against one in 5).",
        "- Fragile: each verdict is judged again with one seed left out in turn (from either arm; for a paired "
        "row the seed's pair; for Holm's, the family recomputed without that run, the seed-count rule aside). "
        "Where a reduced set decides otherwise the verdict reads *fragile (seed s of `arm` decides it)*.",
        "- Probability of improvement (rliable): P(variant seed > reference seed) + ½ P(tie) over all seed "
        "pairs, with Newcombe's (2006) Method 5 score interval and a continuity correction of 1/(2nm).",
        f"- Verdict: *{BETTER}* / *{WORSE}* where the difference's interval excludes 0, else *{NO_DIFFERENCE}*; "
        f"a comparison with fewer than {n_min} seeds on either side reads *{TOO_FEW_SEEDS}* whatever its "
        "interval says (`--min-seeds N`). Higher values count as better.",
        "- Holm: the same decision with Holm–Bonferroni adjusted p-values; the family is every comparison "
        "against the same reference on the same quantity that gets a verdict (family-wise error 5% across "
        "those k variants).",
        "- Coverage of these intervals is measured by simulation (`scripts/coverage.py`, "
        "`tests/report/test_stats_coverage.py`): at least 93.5% on normal seed scores at 3, 5 and 10 seeds, "
        "less by a documented shortfall on skewed, discrete, heavy-tailed and bimodal ones "
        "(`rlcompare.report.coverage.SHORTFALLS`). Per-variant intervals are cut to the quantity's physical "
        "range (accuracy in [0, 1], times and rates ≥ 0) and marked ✂. They hold less where a third or more of the seeds "
        "sit on a bound (all-equal seeds give zero width) or a rare gross outlier moves the mean more than a "
        "few seeds can show (read the IQM then). No bootstrap is used (`--reps` is ignored); rliable's "
        "stratified bootstrap stays in `rlcompare.report.stats` for many runs × tasks.",
        "",
    ]


SHORT_NAMES = {"window": "window mean", "final": "final", "auc": "AUC"}  # the side columns


def _other_estimands(estimand: str) -> list[str]:
    """The estimands printed beside the verdicts' one, in differences.csv's order."""
    return [q for q in DIFF_QUANTITIES if q != estimand]


def _label(res: dict, estimand: str) -> str:
    return estimand_label(estimand, per_step=res["metric_source"] == "metrics")


def _verdicts_on(res: dict) -> list[str]:
    """The line naming what the verdicts judge and where: one token count when every pair shares it; nothing
    without a comparison."""
    points = sorted(set(res["differences"]["comparison_tokens"].dropna()))
    if not points:
        return []
    where = f"at {_fmt_tokens(points[0])} tokens" if len(points) == 1 else "at each pair's comparison point"
    others = " and ".join(f"`{q}`" for q in _other_estimands(res["estimand"]))
    return [
        f"**Verdicts on: {_label(res, res['estimand'])} {where}** (`--estimand {res['estimand']}`; {others} are "
        "printed beside it and in differences.csv).",
        "",
    ]


def _difference_cell(x: pd.Series) -> str:
    s = f"{x['diff']:+.3f}"
    if not _isnan(x["diff_low"]):
        s += f" [{x['diff_low']:+.3f}, {x['diff_high']:+.3f}]"
    return s


def _poi_cell(x: pd.Series) -> str:
    return f"{x['poi']:.2f} [{x['poi_low']:.2f}, {x['poi_high']:.2f}]"


def _mde_cell(x: pd.Series) -> str:
    if _isnan(x["mde"]):
        return "—"
    return f"none larger than {x['mde']:.3g}" if x["verdict"] == NO_DIFFERENCE else f"{x['mde']:.3g}"


def _verdict_cell(x: pd.Series, holm: bool = False) -> str:
    """The verdict, and "fragile (seed s of `arm` decides it)" where leaving that seed out changes it."""
    word, seed = (x["verdict_holm"], x.get("fragile_holm", "")) if holm else (x["verdict"], x.get("fragile", ""))
    return f"{word}; {fragile_words(seed)}" if isinstance(seed, str) and seed else word


def _bimodal_cell(x: pd.Series) -> str:
    if not x["bimodal"]:
        return ""
    if x["verdict"] == BIMODAL_INCONCLUSIVE:
        return f"⚠ bimodal seeds ({x['bimodal']}): no verdict below {stats.BIMODAL_MIN_SEEDS} seeds, run more"
    return f"⚠ bimodal seeds ({x['bimodal']})"


def _differences_row(v: str, ref: str, g: pd.DataFrame, estimand: str) -> list[str]:
    g = g.set_index("quantity")
    first = g.iloc[0]
    row = [
        v + ("" if bool(first["matched"]) else " ⚠ unmatched"),
        ref,
        f"{int(first['n_variant'])} vs {int(first['n_reference'])}",
        _fmt_tokens(first["comparison_tokens"]),
    ]
    x = g.loc[estimand]
    welch = "" if x["method"] == "welch" else f"{x['welch_low']:+.3f}, {x['welch_high']:+.3f}"
    row += [_difference_cell(x), x["method"], welch, _verdict_cell(x), _verdict_cell(x, holm=True), _mde_cell(x)]
    row += [_bimodal_cell(x), _poi_cell(x)]
    for q in _other_estimands(estimand):
        row += [f"{_difference_cell(g.loc[q])} {_verdict_cell(g.loc[q], holm=True)}" if q in g.index else "—"]
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
    e = res["estimand"]
    rows = [_differences_row(v, ref, g, e) for (v, ref), g in d.groupby(["variant", "reference"], sort=False)]
    header = ["variant", "reference", "seeds", "at tokens", f"Δ {res['metric']} ({_label(res, e)})"]
    header += ["interval", "Welch's interval", "verdict", "Holm", "MDE (80% power)", "seeds look", "P(improvement)"]
    header += [f"Δ {SHORT_NAMES[q]} (Holm)" for q in _other_estimands(e)]
    L.append(_md_table(header, rows))
    L.append("")
    L.append(
        "Δ = variant − reference, mean over seeds [95% interval: paired where the arms share their seeds, else "
        "Welch]. Verdict: the interval's decision; Holm: the decision adjusted over the family of every "
        "comparison against the same reference on the same quantity (see Statistics method). MDE: the smallest "
        "difference these seeds could have found."
    )
    fragile = d[(d["fragile"] != "") | (d["fragile_holm"] != "")] if "fragile" in d else d.iloc[0:0]
    if not fragile.empty:
        L.append("")
        L.append(
            f"{len(fragile)} verdict row(s) are *fragile*: leaving out the seed named changes the verdict; one "
            "seed decides it, so read it as a lead for more seeds, not a result."
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
    L += passk_section.section(res)
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
    L += _verdicts_on(res)
    L.append(
        f"Metric: `{metric}` (from {res.get('metric_file') or res['metric_source'] + '.jsonl'}). "
        + (f"{res['metric_note'][0].upper()}{res['metric_note'][1:]}. " if res.get("metric_note") else "")
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
            L.append(f"> - {one_line(f)}")
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
    L = [f"## Headline (sorted by {_label(res, res['estimand'])}, the verdicts' estimand)", ""]
    header = [
        "variant",
        "algorithm",
        "seeds",
        f"final {res['metric']}",
        _label(res, "window"),
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
        "Cells: mean over seeds [95% Student t interval, ✂ = cut at the quantity's physical range]; "
        "IQM [95% Tukey–McLaughlin interval]; "
        "— = not available (one seed gives no interval). "
        "AUC = area under the metric-vs-generated-tokens curve divided by the token span (a mean value). "
        "Tokens/s = generated tokens / wall time at the comparison point."
        + (" ⚠ = unmatched (see Attention)." if not h["matched"].all() else "")
    )
    L.append("")
    L += [
        "### Training diagnostics (means over the steps in the last 20% of the tokens up to the comparison point)",
        "",
    ]
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
        _cell(r, "window", "score"),
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
        L.append(f"- {one_line(n)}")
    if res["flags"]:
        L.append("- See **Attention** at the top for unmatched, partial and failed runs.")
    elif not res["notes"]:
        L.append("- All compared runs are matched.")
    L.append("")
    return L


def _md_plots(res: dict) -> list[str]:
    L = ["## Plots", ""]
    if res["plots"]:
        fmt = res.get("figure_format", "png")
        for p in res["plots"]:
            name = Path(p).name
            vector = vector_copy(name, fmt).name
            L.append(f"- [{name}]({name})" + (f" ([{fmt}]({vector}))" if fmt != "png" else ""))
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
