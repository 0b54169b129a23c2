"""The claims table's rows and verdicts from per-seed values (docs/claims_seeds.csv; scripts/claims_table.py is
the command that reads and writes the files): per (claim, variant, metric) the paired (else Welch) interval, Holm
over the report's family, the MDE, and the verdict with every qualifier the report gives (fragile with every
deciding seed, bimodal, one outlier, untestable at a bound, the final point holding 0, mechanism identity), and
README's one-row-per-claim table (issue 65: one source for the headline)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import yaml

from rlcompare.config.sections.prompts import PromptsConfig

from . import stats
from .fragile import fragility
from .fragile import words as fragile_words

CONF = Path(__file__).resolve().parents[2] / "conf"  # the shipped presets (a source checkout: the claims' home)
ESTIMAND = "window"
ALPHA = 0.05
IDENTITY = "mechanism identity"


def compare(
    rows: list[dict], claim: str, variant: str, metric: str, quantity: str = ESTIMAND, draws: int = 0
) -> dict | None:
    """The statistics of one (claim, variant, metric) from its per-seed rows; None without rows. `draws`: the 0/1
    outcomes one eval of a sampled metric averages (its sampling error floors the gap rule's spread), 0: none."""
    mine = [
        r for r in rows if (r["claim"], r["variant"], r["metric"], r["quantity"]) == (claim, variant, metric, quantity)
    ]
    if not mine:
        return None
    va = {r["seed"]: r["value"] for r in mine if r["arm"] == "variant"}
    vb = {r["seed"]: r["value"] for r in mine if r["arm"] == "reference"}
    paired = set(va) == set(vb)
    xa = np.array([va[s] for s in sorted(va)])
    xb = np.array([vb[s] for s in (sorted(va) if paired else sorted(vb))])
    noise = stats.eval_sampling_error(np.concatenate([xa, xb]), draws) if draws else 0.0
    if paired:
        d, p, mde = stats.paired_difference_ci(xa, xb), stats.paired_p_value(xa, xb), stats.paired_mde(xa, xb)
    else:
        d, p, mde = stats.difference_ci(xa, xb), stats.welch_p_value(xa, xb), stats.welch_mde(xa, xb)
    return {
        "diff": d.point, "low": d.low, "high": d.high, "p": p, "mde": mde, "method": "paired" if paired else "Welch",
        "poi": stats.probability_of_improvement(xa, xb), "n_var": xa.size, "n_ref": xb.size,
        "tokens": float(mine[0]["comparison_tokens"]), "source": mine[0]["source"],
        "bimodal": ", ".join(lb for lb, x in ((variant, xa), ("base", xb)) if stats.looks_bimodal(x, noise)),
        "bimodal_n": min([n for n, x in ((xa.size, xa), (xb.size, xb)) if stats.looks_bimodal(x, noise)], default=0),
        "outliers": _outliers(((variant, sorted(va), xa), ("base", sorted(va) if paired else sorted(vb), xb)), noise),
        "ceiling": _ceiling(metric, xa, xb),
        "seeds_variant": " ".join(map(str, sorted(va))), "values_variant": " ".join(repr(float(x)) for x in xa),
        "seeds_reference": " ".join(map(str, sorted(va) if paired else sorted(vb))),
        "values_reference": " ".join(repr(float(x)) for x in xb),
    }  # fmt: skip


def _outliers(arms, noise: float) -> str:
    """'seed 3 of `g4`' for each arm whose seeds the gap rule splits one seed from the rest (stats.lone_outlier)."""
    found = []
    for label, seeds, x in arms:
        i = stats.lone_outlier(x, noise)
        if i is not None:
            found.append(f"seed {seeds[i]} of `{label}`")
    return ", ".join(found)


BOUNDED = ("eval/", "clip/frac", "sampling/zero_variance")  # metrics that live in [0, 1]


def _ceiling(metric: str, xa: np.ndarray, xb: np.ndarray) -> str:
    """'' or why the row cannot test its prediction: every seed of both arms at one bound of a [0, 1] metric (c13's
    pass@64 = 1: the warm start already solves every prompt at 64 samples; c2's clip at 0: it never binds)."""
    values = np.concatenate([xa, xb])
    if not metric.startswith(BOUNDED) or values.size == 0 or np.ptp(values) != 0 or values[0] not in (0.0, 1.0):
        return ""
    return f"untestable at this {'ceiling' if values[0] == 1.0 else 'floor'}: every seed of both arms at {values[0]:g}"


def eval_draws(data: dict, metric: str, conf: Path = CONF) -> int:
    """The 0/1 outcomes one eval of a sampled pass@1 averages: held-out prompts x eval.samples, read from the sweep's
    base overrides and its prompts preset (conf/prompts/<name>.yaml); 0 for any other metric or a greedy eval."""
    keys = dict(o.split("=", 1) for o in data["base"].get("overrides", []) if "=" in o)
    samples = int(keys.get("eval.samples", 0))
    if metric != "eval/pass@1" or not samples:
        return 0
    preset = conf / "prompts" / f"{keys.get('prompts', '')}.yaml"
    shipped = (yaml.safe_load(preset.read_text()) or {}) if preset.is_file() else {}
    return samples * int(keys.get("prompts.n_eval") or shipped.get("n_eval") or PromptsConfig().n_eval)


def verdict(direction: str, diff: float, p_holm: float, mde: float, n_var: int, n_ref: int, min_seeds: int) -> str:
    if min(n_var, n_ref) < min_seeds:
        return "too few seeds: inconclusive"
    if direction == "report":
        return "(reported)"
    rejected = p_holm <= ALPHA
    if direction == "same":
        return "not reproduced" if rejected else f"consistent (none larger than {fmt(mde)})"
    if not rejected:
        return f"inconclusive (none larger than {fmt(mde)})"
    return "reproduced" if (diff > 0) == (direction == "higher") else "opposite"


# a row the CSV lacks: the claim's sweep never ran (pre-registered), or ran without this metric
NO_ROWS = {
    True: "pre-registered, not yet run: no seed in the CSV",
    False: "not in the CSV: rerun the sweep and --collect",
}


def claim_rows(data: dict, seeds: list[dict], min_seeds: int, quantity: str = ESTIMAND) -> list[dict]:
    name, base, claim = data["name"], data["base"]["label"], data["claim"]
    rows = []
    for e in claim["expect"]:
        row = {
            "claim": name,
            "variant": e["variant"],
            "reference": base,
            "metric": e["metric"],
            "direction": e["direction"],
        }
        draws = eval_draws(data, e["metric"])
        got = compare(seeds, name, e["variant"], e["metric"], quantity, draws=draws)
        # the single final point is read beside the verdict's estimand only (an exploratory one stands alone)
        final = compare(seeds, name, e["variant"], e["metric"], "final", draws=draws) if quantity == ESTIMAND else None
        rows.append({**row, **(got or {}), "final": final, "kind": claim.get("kind", "")})
    _holm(rows, min_seeds)
    fragile = _fragile(rows, name, base)
    never_run = not any(s.get("claim") == name for s in seeds)  # a claim pre-registered but not yet run
    for i, r in enumerate(rows):
        if "p" not in r:
            # a claim never run has no row at all, whatever its direction; a run one lacks a "report" metric's base
            r["verdict"] = (
                NO_ROWS[True] if never_run else NOT_A_DIFFERENCE if r["direction"] == "report" else NO_ROWS[False]
            )
            continue
        if _bimodal_too_few(r, min_seeds):
            r["verdict"] = f"{BIMODAL_INCONCLUSIVE}; {r['bimodal']}: fewer than {stats.BIMODAL_MIN_SEEDS} seeds"
        else:
            r["verdict"] = verdict(r["direction"], r["diff"], r["p_holm"], r["mde"], r["n_var"], r["n_ref"], min_seeds)
        if r["ceiling"]:
            r["verdict"] = r["ceiling"]  # no seed could have moved: the row tests nothing (issue 65)
        if r["outliers"]:
            r["verdict"] += f"; one outlier ({r['outliers']})"
        if _final_holds_zero(r):
            r["verdict"] += "; the single final point's interval holds 0"
        if r["kind"] == IDENTITY:
            r["verdict"] = f"{IDENTITY} (claim_same_rows.py), not a statistical result; {r['verdict']}"
        if fragile.get(i):
            r["verdict"] += f"; {fragile_words(fragile[i])}"
    return rows


DECIDED = ("reproduced", "opposite", "not reproduced")


def _final_holds_zero(r: dict) -> bool:
    """A verdict the window's test decides while the single final point's interval holds 0 (c11, issue 65)."""
    f = r["final"]
    return bool(f) and r["verdict"].startswith(DECIDED) and f["low"] <= 0 <= f["high"]


BIMODAL_INCONCLUSIVE = "inconclusive (bimodal seeds)"
# a "report" row with no per-seed values: the base arm has no such column (c14's distill/reverse_kl: GRPO reads no
# teacher), so there is no difference to tabulate; docs/claims.md reports the variant's own values
NOT_A_DIFFERENCE = "no difference: the base arm has no such metric (docs/claims.md reports the variant's values)"


def _bimodal_too_few(r: dict, min_seeds: int) -> bool:
    """A bimodal arm below stats.BIMODAL_MIN_SEEDS seeds (a row with too few seeds says that first)."""
    return bool(r["bimodal"]) and r["bimodal_n"] < stats.BIMODAL_MIN_SEEDS and min(r["n_var"], r["n_ref"]) >= min_seeds


def _decided(r: dict, min_seeds: int) -> bool:
    return "p" in r and min(r["n_var"], r["n_ref"]) >= min_seeds and not _bimodal_too_few(r, min_seeds)


def _holm(rows: list[dict], min_seeds: int) -> None:
    """Holm over the report's family: the variants compared with the base on one metric, within this claim, that get
    a verdict (a bimodal arm below stats.BIMODAL_MIN_SEEDS, or too few seeds, spends no alpha, as in the report)."""
    for metric in {r["metric"] for r in rows}:
        family = [r for r in rows if r["metric"] == metric and _decided(r, min_seeds)]
        for r, ph in zip(family, stats.holm_adjusted([r["p"] for r in family])):
            r["p_holm"], r["family"] = float(ph), len(family)
        for r in rows:
            if r["metric"] == metric and "p" in r and not _decided(r, min_seeds):
                r["p_holm"], r["family"] = float("nan"), len(family)


def _fragile(rows: list[dict], claim: str, base: str) -> dict[int, str]:
    """Row index -> the seed that decides its Holm verdict (rlcompare.report.fragile, leaving one seed out), over
    the decided rows ("report" rows decide nothing but sit in the family, as in the report)."""
    decided = [i for i, r in enumerate(rows) if "p" in r and not np.isnan(r["p_holm"])]
    if not decided:
        return {}
    frame = pd.DataFrame(
        [
            {**{k: rows[i][k] for k in ("variant", "diff", "p_holm", "seeds_variant", "values_variant")},
             "seeds_reference": rows[i]["seeds_reference"], "values_reference": rows[i]["values_reference"],
             "reference": base, "quantity": f"{claim}/{rows[i]['metric']}", "diff_low": rows[i]["low"],
             "diff_high": rows[i]["high"], "method": rows[i]["method"].lower()}
            for i in decided
        ],
        index=decided,
    )  # fmt: skip
    _, holm = fragility(frame, pd.Series(True, index=frame.index), ALPHA)
    return {i: who for i, who in holm.items() if who and rows[i]["direction"] != "report"}


def fmt(x: float) -> str:
    return f"{x:+.3g}" if abs(x) >= 1e-3 or x == 0 else f"{x:+.2e}"


def _p(p: float) -> str:
    return "–" if np.isnan(p) else f"{p:.3f}"  # a row out of Holm's family (bimodal seeds)


HEADER = (
    "| claim | variant vs base | metric | predicted | Δ, window mean [95% CI] | interval | p (Holm, family) "
    "| MDE (80% power) | P(variant > base) | seeds | verdict (Holm) | Δ at the single final point [95% CI] |\n"
    "|---|---|---|---|---|---|---|---|---|---|---|---|"
)


def markdown(rows: list[dict]) -> str:
    out = [HEADER]
    for r in rows:
        lead = f"| {r['claim']} | {r['variant']} vs {r['reference']} | `{r['metric']}` | {r['direction']} |"
        if "p" not in r:
            out.append(f"{lead} – | – | – | – | – | – | {r['verdict']} | – |")
            continue
        f = r["final"]
        final = f"{fmt(f['diff'])} [{fmt(f['low'])}, {fmt(f['high'])}]" if f else "–"
        out.append(
            f"{lead} {fmt(r['diff'])} [{fmt(r['low'])}, {fmt(r['high'])}] | {r['method']} | "
            f"{r['p']:.3f} ({_p(r['p_holm'])}, {r['family']}) | {abs(r['mde']):.3g} | {r['poi']:.2f} | "
            f"{r['n_var']}/{r['n_ref']} | {r['verdict']} | {final} |"
        )
    return "\n".join(out) + "\n"


# Ends the line before README's claims table (an HTML comment: invisible); the table runs to the next blank line.
MARKER = "<!-- claims-table: scripts/claims_table.py --readme writes it from docs/claims_seeds.csv -->"
# The README's short name of each claim (the full statement is in its sweep file and docs/claims.md).
TITLES = {
    "c1_drgrpo_length": "c1 Dr. GRPO keeps incorrect answers shorter",
    "c2_clip_higher": "c2 Clip-higher keeps entropy higher, clips less",
    "c3_gspo_clipping": "c3 GSPO clips far more (2 updates), same accuracy",
    "c4_gspo_on_policy": "c4 GSPO = GRPO on-policy",
    "c5_dynamic_sampling": "c5 Dynamic sampling: drops groups, costs tokens; helps?",
    "c6_std_normalization": "c6 No std / batch std beat the group std",
    "c7_group_size": "c7 Group 16 beats 8, 4 loses to 8",
    "c8_kl_estimator": "c8 k2 in the loss / k1 in the reward beat k3",
    "c9_staleness": "c9 Stale rollouts (no correction) lose accuracy",
    "c10_decoupled_ppo": "c10 Decoupled PPO: stale 4/8 = on-policy",
    "c11_geo_mask_m2po": "c11 Geo mask / M2PO beat no correction (staleness 4)",
    "c12_one_step_off": "c12 One step off-policy = on-policy",
    "c13_passk_base_catches_up": "c13 RL lifts pass@1; the warm start catches up at k = 64",
    "c14_on_policy_distillation": "c14 On-policy distillation beats GRPO at equal tokens",
    "c15_real_length_aggregation": "c15 Real model: a constant 1/H keeps incorrect answers shorter",
}
# An estimand read after the results were seen: shown beside the pre-registered one, labelled, never the verdict.
EXPLORATORY = {"c14_on_policy_distillation": ("auc", "AUC")}
# A claim read against something the CSV does not hold (c13: each arm against the warm start's step-0 eval).
READ_ELSEWHERE = {
    "c13_passk_base_catches_up": (
        "each arm's pass@1 vs the warm start's (docs/claims.md, 13): higher in every seed of both",
        "that half reproduced (the large-k half: the pass@64 row)",
    ),
}


def _cell(r: dict, label: str = "") -> str:
    name = f"{r['variant']} `{r['metric']}`{label}"
    if "p" not in r:
        return f"{name}: –"
    return f"{name}: {fmt(r['diff'])} [{fmt(r['low'])}, {fmt(r['high'])}]"


def readme_rows(claims: list[dict], seeds: list[dict], min_seeds: int) -> list[str]:
    """One README row per claim: its pre-registered rows (all rows where it predicts none), then any exploratory
    estimand, each 'variant `metric`: Δ [95% CI]' beside its verdict with every qualifier."""
    out = []
    for data in claims:
        name = data["name"]
        rows = claim_rows(data, seeds, min_seeds)
        shown = [r for r in rows if r["direction"] != "report"] or rows
        cells = [(_cell(r), r["verdict"]) for r in shown]
        if name in EXPLORATORY:
            quantity, label = EXPLORATORY[name]
            for r in claim_rows(data, seeds, min_seeds, quantity):
                if r["direction"] != "report" and "p" in r:
                    said = r["verdict"].replace("reproduced", f"{r['direction']}, as predicted", 1)
                    cells.append((_cell(r, f", {label}"), f"exploratory estimand (not pre-registered): {said}"))
        cells = ([READ_ELSEWHERE[name]] if name in READ_ELSEWHERE else []) + cells
        result, verdicts = "<br>".join(c for c, _ in cells), "<br>".join(v for _, v in cells)
        out.append(f"| {TITLES.get(name, name)} | {result} | {verdicts} |")
    return out


def readme_table(claims: list[dict], seeds: list[dict], min_seeds: int) -> str:
    head = ["| claim | variant `metric`: Δ vs base, last 3 evals [95% CI] | verdict (Holm, with every qualifier) |",
            "|---|---|---|"]  # fmt: skip
    return "\n".join([*head, *readme_rows(claims, seeds, min_seeds)]) + "\n"


def replace_table(text: str, table: str) -> str:
    """text with the lines after the line ending in MARKER, up to the next blank line, replaced by table."""
    at = text.find(MARKER + "\n")
    if at < 0:
        raise SystemExit(f"README.md has no line ending in {MARKER!r} before the claims table")
    start = at + len(MARKER) + 1
    end = text.find("\n\n", start)
    return text[:start] + table + text[(len(text) if end < 0 else end + 1) :]
