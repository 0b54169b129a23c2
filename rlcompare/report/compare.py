"""The comparison: each run's variant and reference, the comparison point, per-run values there, the checks that
runs are matched, per-variant summaries, the variant-vs-reference differences and their verdicts (Holm)."""

from __future__ import annotations

import math
from typing import Optional

import numpy as np
import pandas as pd

from . import stats
from .fragile import fragility
from .curves import _auc, _curve, _final_tokens, _segment, _wall_time, tokens_to_reach
from .estimands import (
    DEFAULT_ESTIMAND,
    ESTIMANDS,
    WINDOW_EVALS,
    pair_point,
    paired_seeds,
    values_at,
    window_mean,
    window_step_mean,
)
from .load import _SEED_PART, TOKENS, ReportError, Run, _components, strip_seed
from .matching import config_diff, fingerprint_diff, per_seed_keys
from .passk_section import COUNTS_METRIC, counts_of
from .text import _fmt_tokens, _isnan, _seedset


DEFAULT_METRIC = "eval/accuracy"
# a sampled eval (eval.samples > 0) logs no greedy eval/accuracy unless eval.greedy: its accuracy is avg@n, the
# number summary.json's eval/accuracy_* hold (rlcompare.train.run.headline), and the report's default then
SAMPLED_METRIC = "eval/avg@n"
DEFAULT_REPS = 2000  # only for the old --reps option: the report's intervals are closed-form
ALPHA = 0.05
DEFAULT_MIN_SEEDS = 5  # seeds per arm before a comparison gets a verdict (issue 16)

# the verdict of a variant-vs-reference comparison (higher metric = better, as for accuracy)
BETTER, WORSE = "better", "worse"
NO_DIFFERENCE = "no detectable difference"
TOO_FEW_SEEDS = "too few seeds: inconclusive"
BIMODAL_INCONCLUSIVE = "inconclusive (bimodal seeds)"  # an arm looks bimodal below stats.BIMODAL_MIN_SEEDS seeds
UNDECIDED = (TOO_FEW_SEEDS, BIMODAL_INCONCLUSIVE)

# per-run quantities: key -> (label, kind); kind picks the number format
QUANTITIES: list[tuple[str, str, str]] = [
    ("final", "final", "score"),
    ("window", f"mean of the last {WINDOW_EVALS} evals", "score"),
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
STEP_MEANS = {  # quantity -> metrics.jsonl column, averaged over the steps of the window ending at the point
    "length_correct": "length/correct_mean",
    "length_incorrect": "length/incorrect_mean",
    "clip_low": "clip/frac_low",
    "clip_high": "clip/frac_high",
    "zero_variance_frac": "groups/zero_variance_frac",
}
DIFF_QUANTITIES = ESTIMANDS  # window (the verdict's default), final, auc
# physical range of each kind of quantity: a summary interval is cut there and marked (issue 41, item 10)
KIND_BOUNDS = {
    "frac": (0.0, 1.0),
    "length": (0.0, math.inf),
    "tokens": (0.0, math.inf),
    "seconds": (0.0, math.inf),
    "rate": (0.0, math.inf),
}
BOUNDED_METRIC_WORDS = ("accuracy", "frac", "correct")  # a metric named so is a share in [0, 1]
# the sampled eval's estimators (rlcompare.passk): each a mean over prompts of a probability, in [0, 1]
PROPORTION_PREFIXES = ("eval/pass@", "eval/pass^", "eval/maj@", "eval/avg@")


def metric_bounds(metric: str) -> tuple[float, float]:
    """The range of a --metric: [0, 1] for accuracies, fractions and the sampled eval's pass@k, pass^k, maj@k and
    avg@n; lengths and tokens >= 0; else unbounded."""
    if metric.startswith(PROPORTION_PREFIXES):
        return 0.0, 1.0
    if any(w in metric for w in BOUNDED_METRIC_WORDS) and not metric.startswith(("length/", "eval/mean_length")):
        return 0.0, 1.0
    if metric.startswith(("length/", "tokens/", "time/", "eval/mean_length")):
        return 0.0, math.inf
    return -math.inf, math.inf


def _summarise(values: list[float], reps: int, bounds: tuple[float, float] = (-math.inf, math.inf)) -> dict:
    """Mean (t interval) and IQM (Tukey-McLaughlin) of one quantity over seeds, the intervals cut to ``bounds``
    (``clipped`` says one was)."""
    v = np.asarray([x for x in values if not _isnan(x)], dtype=float)
    ci, clipped = stats.clip_interval(stats.mean_ci(v, reps=reps, alpha=ALPHA, seed=0), *bounds)
    out = {
        "n": int(v.size),
        "mean": ci.point,
        "low": ci.low,
        "high": ci.high,
        "clipped": clipped,
        "iqm": float("nan"),
        "iqm_low": float("nan"),
        "iqm_high": float("nan"),
    }
    if v.size >= 4:
        q, cut = stats.clip_interval(stats.iqm_ci(v, reps=reps, alpha=ALPHA, seed=0), *bounds)
        out.update(iqm=q.point, iqm_low=q.low, iqm_high=q.high, clipped=clipped or cut)
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
    """Holm-adjusted p-values (the row's test: paired or Welch); a family = the comparisons against one reference on one quantity
    that get a verdict (enough seeds). The others keep nan: they decide nothing, so they spend no alpha."""
    adjusted = pd.Series(np.nan, index=differences.index)
    for _, family in differences[decided].groupby(["reference", "quantity"], sort=False):
        adjusted[family.index] = stats.holm_adjusted(family["p_value"].to_numpy(float))
    return adjusted


def _bimodal_too_few(r) -> bool:
    """An arm of the row looks bimodal and holds fewer than stats.BIMODAL_MIN_SEEDS seeds."""
    flagged = set(str(r.bimodal).split(", ")) if r.bimodal else set()
    counts = [n for arm, n in ((r.variant, r.n_variant), (r.reference, r.n_reference)) if arm in flagged]
    return bool(counts) and min(counts) < stats.BIMODAL_MIN_SEEDS


def _with_verdicts(differences: pd.DataFrame, min_seeds: int) -> pd.DataFrame:
    """Add `verdict` (the 95% interval's decision), `p_holm` and `verdict_holm` (Holm-Bonferroni,
    family-wise 5% over the variants compared with the same reference), and `fragile` / `fragile_holm` (the seed
    that decides each, leaving one seed out: rlcompare.report.fragile). Too few seeds, or a bimodal arm below
    stats.BIMODAL_MIN_SEEDS seeds: no verdict, and no alpha spent in Holm's family."""
    d = differences.copy()
    words = [verdict(r.diff_low, r.diff_high, r.n_variant, r.n_reference, min_seeds) for r in d.itertuples()]
    d["verdict"] = [
        BIMODAL_INCONCLUSIVE if w != TOO_FEW_SEEDS and _bimodal_too_few(r) else w for r, w in zip(d.itertuples(), words)
    ]
    decided = ~d["verdict"].isin(UNDECIDED)
    d["p_holm"] = _holm_family_adjusted(d, decided)
    d["verdict_holm"] = [
        v if v in UNDECIDED else NO_DIFFERENCE if not ph <= ALPHA else (BETTER if diff > 0 else WORSE)
        for v, ph, diff in zip(d["verdict"], d["p_holm"], d["diff"])
    ]
    d["fragile"], d["fragile_holm"] = fragility(d, decided, ALPHA)
    return d


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


def default_metric(runs: list[Run]) -> tuple[str, Optional[str]]:
    """(metric, note) for a report without --metric: the metric the runs' summary.json calls accuracy. That is
    the greedy eval/accuracy where a completed run logged it, else the sampled eval's eval/avg@n; the note says
    so in the second case (None in the first)."""
    completed = [r for r in runs if r.status == "completed"]
    if any(_has_values(r.evals, DEFAULT_METRIC) for r in completed):
        return DEFAULT_METRIC, None
    if any(_has_values(r.evals, SAMPLED_METRIC) for r in completed):
        return SAMPLED_METRIC, (
            f"no `--metric`: the runs' sampled evals (eval.samples > 0) logged no greedy `{DEFAULT_METRIC}`, so "
            f"`{SAMPLED_METRIC}` is compared (the mean share of correct samples, what their summary.json calls "
            "accuracy); pass `--metric` for another, e.g. eval/pass@K"
        )
    return DEFAULT_METRIC, None


def _metric_source(runs: list[Run], metric: str) -> str:
    """'eval' or 'metrics': the file the metric is read from (eval.jsonl first), judged on completed runs."""
    completed = [r for r in runs if r.status == "completed"]
    if any(_has_values(r.evals, metric) for r in completed):
        return "eval"
    if any(_has_values(r.metrics, metric) for r in completed):
        return "metrics"
    if completed:
        # only keys with values: a --metric eval/pass@K beyond the samples is a column of nan by now
        keys = sorted(
            {c for r in completed for c in r.evals.columns if c not in ("step", TOKENS) and _has_values(r.evals, c)}
        )
        raise ReportError(
            f"metric {metric!r} is in neither eval.jsonl nor metrics.jsonl of any completed run"
            + _beyond_samples(completed, metric)
            + (f"; eval.jsonl keys: {', '.join(keys)}" if keys else "")
        )
    return "eval"


def _beyond_samples(completed: list[Run], metric: str) -> str:
    """'; <why>' when metric is eval/pass@K (pass^K, maj@K) with K above every run's samples per prompt."""
    m = COUNTS_METRIC.fullmatch(metric)
    samples = [min(row["n"]) for r in completed for row in counts_of(r) if row.get("n")]
    if m is None or not samples or int(m.group(2)) <= max(samples):
        return ""
    return (
        f" (K = {m.group(2)} needs at least {m.group(2)} samples per prompt; these runs sampled at most "
        f"{max(samples)}: eval.samples)"
    )


def unreferenced_flag(variants: dict[str, list[Run]]) -> Optional[str]:
    """The Attention line for a folder of variants no reference ties together (runs trained outside a sweep, no
    --reference): the headline lists them side by side, but nothing checked that they differ in one setting only,
    so the line names what their first runs' fingerprints and configs differ in. None when every variant is a
    reference or has one, or there is only one."""
    tied = {r.reference for vr in variants.values() for r in vr if r.reference} | {
        v for v, vr in variants.items() if any(r.reference for r in vr)
    }
    loose = [v for v in variants if v not in tied]
    if len(variants) < 2 or not loose:
        return None
    first = variants[loose[0]][0]
    found: list[str] = []
    for v in loose[1:]:
        r = variants[v][0]
        fp = (
            fingerprint_diff(r.fingerprint, first.fingerprint, ignore=("init_weights_hash",))
            if r.fingerprint is not None and first.fingerprint is not None
            else []
        )
        diff = (fp + config_diff(r, first))[:4]
        found += [f"`{v}` vs `{loose[0]}`: " + "; ".join(diff)] if diff else []
    differ = " They differ in: " + " | ".join(found) + "." if found else ""
    return (
        f"**No reference for {', '.join(f'`{v}`' for v in loose)}** (no sweep.reference, no `--reference`): "
        "the headline lists these variants side by side, but they are not checked to be matched nor compared."
        + differ
        + " Pass `--reference VARIANT` to check and compare them against one."
    )


def _source_frame(r: Run, source: str) -> pd.DataFrame:
    return r.evals if source == "eval" else r.metrics


def _mark_included(runs: list[Run], metric: str, source: str) -> None:
    """Completed runs with the metric count; the others get their reason."""
    for r in runs:
        r.final_tokens = _final_tokens(r)
        if r.status != "completed":
            r.exclude_reason = r.status
            continue
        infinite = [k for k in (f"{source}.jsonl: {metric}", f"{source}.jsonl: {TOKENS}") if k in r.infinite]
        if infinite:  # a value set aside would move its comparison point: the run is not compared
            r.exclude_reason = "infinite values in " + ", ".join(infinite)
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
        r.values["window"] = window_mean(st, sy, per_step=source == "metrics")
        r.values["_seg"] = (st, sy)
        r.values["_curve"] = (t, y, source == "metrics")  # for each pair's own comparison point
        for key, col in STEP_MEANS.items():
            r.values[key] = window_step_mean(r.metrics, col, T)
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


def _group_variants(included: list[Run], notes: Optional[list[str]] = None) -> dict[str, list[Run]]:
    """variant -> its included runs, by seed, one run per seed: a second run of a seed (a rerun after a name
    collision, `..._s0-2`) is the same seed, not another one, and counting it would shrink the interval. The
    first by folder name is kept; the others are left out, named in the runs table and in ``notes``."""
    variants: dict[str, list[Run]] = {}
    for r in included:
        variants.setdefault(r.variant, []).append(r)
    for name, v in variants.items():
        v.sort(key=lambda r: (r.seed is None, r.seed if r.seed is not None else 0, r.name))
        kept: dict[int, Run] = {}
        for r in list(v):
            if r.seed is None or kept.setdefault(r.seed, r) is r:
                continue
            v.remove(r)
            r.included = False
            r.exclude_reason = f"seed {r.seed} again: `{kept[r.seed].name}` is used (one run per seed)"
            if notes is not None:
                notes.append(f"variant `{name}`: `{r.name}` repeats seed {r.seed} of `{kept[r.seed].name}`; left out")
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
    per_seed = list(per_seed_keys(vr[0]))  # set per seed by the sweep (a teacher per seed): differ by design
    if per_seed:
        notes.append(
            f"variant `{name}`: {', '.join(f'`{k}`' for k in per_seed)} set per seed by its sweep (`${{seed}}` in "
            "sweep.yaml): its runs differ there by design, and the interval over seeds includes that variation"
        )
    for r in vr[1:]:
        diff = config_diff(r, vr[0], per_seed)
        if diff:
            problems.append(f"`{r.name}` vs `{vr[0].name}`: config.yaml " + "; config.yaml ".join(diff))
    missing = [r for r in vr if r.fingerprint is None]
    if missing:
        problems.append("fingerprint.json missing in " + ", ".join(f"`{r.name}`" for r in missing))
    with_fp = [r for r in vr if r.fingerprint is not None]
    if with_fp:
        first = with_fp[0]
        init_differs = False
        for r in with_fp[1:]:
            diff = fingerprint_diff(r.fingerprint, first.fingerprint, per_seed, ignore=("init_weights_hash",))
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
    "comparison_tokens",
    "method",
    "welch_low",
    "welch_high",
    "welch_p",
    "mde",
    "bimodal",
    "seeds_variant",  # the per-seed values behind the row, space-separated, in seed order
    "values_variant",
    "seeds_reference",
    "values_reference",
]


def _differences(
    runs, variants, unmatched_variants, metric, allow_unmatched, min_seeds, flags, notes, point=("cut", 0)
):
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
        fixed_T = point[1] if point[0] == "interpolate" else None  # --at-tokens: every pair there
        diffs_rows += _difference_rows(v, ref, a, b, metric, matched, fixed_T)
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
        diff = [f"config.yaml {d}" for d in config_diff(r, other, allowed)]  # trainer.*, algorithm.*: not fingerprinted
        if r.fingerprint is not None and other.fingerprint is not None:
            ignore = () if r.seed in by_seed_b else ("init_weights_hash",)
            diff = fingerprint_diff(r.fingerprint, other.fingerprint, allowed=allowed, ignore=ignore) + diff
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


def _pair_values(a: list[Run], b: list[Run], fixed_T) -> tuple[float, dict, dict]:
    """(the pair's comparison point, quantity -> values of a, of b): each run's estimands at the smaller of the
    two arms' final token counts (or --at-tokens), so no other arm in the folder moves them."""
    T = pair_point([r.final_tokens for r in a + b], fixed_T)
    va = [values_at(*r.values["_curve"][:2], T, r.values["_curve"][2]) for r in a]
    vb = [values_at(*r.values["_curve"][:2], T, r.values["_curve"][2]) for r in b]
    return (
        T,
        {q: np.array([x[q] for x in va]) for q in DIFF_QUANTITIES},
        {q: np.array([x[q] for x in vb]) for q in DIFF_QUANTITIES},
    )


def eval_draws(runs: list[Run], metric: str) -> int:
    """The 0/1 outcomes one sampled eval averages for `metric`: prompts.n_eval x eval.samples for eval/pass@1 of a
    sampled eval (its sampling error floors the gap rule's spread, issue 65); 0 otherwise."""
    if metric != "eval/pass@1" or not runs:
        return 0
    config = runs[0].config
    samples, n_eval = (config.get("eval") or {}).get("samples"), (config.get("prompts") or {}).get("n_eval")
    return int(samples) * int(n_eval) if isinstance(samples, int) and isinstance(n_eval, int) else 0


def _bimodal_arms(pairs: list[tuple[str, np.ndarray]], draws: int = 0) -> str:
    """The arms whose seeds have two modes; `draws`: the sampled eval's outcomes behind each value (0: greedy)."""
    values = np.concatenate([x for _, x in pairs])
    noise = stats.eval_sampling_error(values, draws) if draws and values.size else 0.0
    return ", ".join(name for name, x in pairs if stats.looks_bimodal(x, noise))


def _difference_rows(v: str, ref: str, a: list[Run], b: list[Run], metric: str, matched: bool, fixed_T=None):
    """One row per estimand: Welch's interval always; where the arms hold the same seeds (one run each) the paired
    interval of the per-seed differences, which the verdict then uses (common random numbers, see estimands)."""
    T, va, vb = _pair_values(a, b, fixed_T)
    paired = paired_seeds([r.seed for r in a], [r.seed for r in b])
    order_b = {r.seed: i for i, r in enumerate(b)}
    rows = []
    for q in DIFF_QUANTITIES:
        xa, xb = va[q], vb[q]
        welch = stats.difference_ci(xa, xb, alpha=ALPHA)
        welch_p = stats.welch_p_value(xa, xb)
        if paired:
            xb_by_seed = xb[[order_b[r.seed] for r in a]]
            d = stats.paired_difference_ci(xa, xb_by_seed, alpha=ALPHA)
            p_value, mde = stats.paired_p_value(xa, xb_by_seed), stats.paired_mde(xa, xb_by_seed, alpha=ALPHA)
        else:
            d, p_value, mde = welch, welch_p, stats.welch_mde(xa, xb, alpha=ALPHA)
        poi = stats.probability_of_improvement(xa, xb, ci=True, alpha=ALPHA)
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
                "p_value": p_value,
                "poi": poi.point,
                "poi_low": poi.low,
                "poi_high": poi.high,
                "matched": matched,
                "comparison_tokens": T,
                "method": "paired" if paired else "welch",
                "welch_low": welch.low,
                "welch_high": welch.high,
                "welch_p": welch_p,
                "mde": mde,
                "bimodal": _bimodal_arms([(v, xa), (ref, xb)], eval_draws(a, metric)),
                "seeds_variant": " ".join(str(r.seed) for r in a),
                "values_variant": " ".join(repr(float(x)) for x in xa),
                "seeds_reference": " ".join(str(r.seed) for r in b),
                "values_reference": " ".join(repr(float(x)) for x in xb),
            }
        )
    return rows


def _variant_tables(
    variants, unmatched_variants, pair_problems, reps: int, metric: str = DEFAULT_METRIC, sort_by=DEFAULT_ESTIMAND
):
    """(headline: one row per variant, the best mean of `sort_by` (the verdicts' estimand) first; summary: variant x
    quantity, long)."""
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
        for key, _, kind in QUANTITIES:
            vals = [r.values.get(key, float("nan")) for r in vr]
            s = _summarise(vals, reps, metric_bounds(metric) if kind == "score" else KIND_BOUNDS[kind])
            long_rows.append({"variant": v, "quantity": key, "n_total": len(vr), **s})
            row[key] = s["mean"]
            row[f"{key}_low"] = s["low"]
            row[f"{key}_high"] = s["high"]
            row[f"{key}_iqm"] = s["iqm"]
            row[f"{key}_iqm_low"] = s["iqm_low"]
            row[f"{key}_iqm_high"] = s["iqm_high"]
            row[f"{key}_clipped"] = s["clipped"]
            if key == "tokens_to_threshold":
                row["tokens_to_threshold_reached"] = s["n"]
        head_rows.append(row)
    headline = pd.DataFrame(head_rows)
    if not headline.empty:
        headline = headline.sort_values(
            [sort_by, "variant"], ascending=[False, True], na_position="last", kind="stable"
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
            "notes": "; ".join(r.notes + [f"run warning: {w}" for w in r.warnings]),
        }
        for key in ["initial", "final", "final_at_tokens"] + [k for k, _, _ in QUANTITIES if k != "final"]:
            rr[key] = r.values.get(key, float("nan"))
        runs_rows.append(rr)
    return pd.DataFrame(runs_rows)


def _status_flags(runs: list[Run], flags: list[str], notes: list[str]) -> None:
    """Flags for partial, failed and left-out runs; notes for rows dropped or files unreadable."""
    partial = [r for r in runs if r.status == "partial"]
    failed = [r for r in runs if r.status == "failed" and not r.degenerate]  # degenerate: flagged by arm
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
    warned = [(r, w) for r in runs for w in r.warnings]
    if warned:
        flags.append(
            f"**{len(warned)} warning(s) recorded by the runs**: " + "; ".join(f"`{r.name}`: {w}" for r, w in warned)
        )
    infinite = [r for r in runs if r.infinite]
    if infinite:
        flags.append(
            f"**{len(infinite)} run(s) with infinite values** (set aside, never compared): "
            + "; ".join(f"`{r.name}`: " + ", ".join(f"{k} ×{n}" for k, n in r.infinite.items()) for r in infinite)
        )
    for r in runs:
        for n in r.notes:
            if "dropped" in n or "unreadable" in n or "not a file" in n:
                notes.append(f"`{r.name}`: {n}")
