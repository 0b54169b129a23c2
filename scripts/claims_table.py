"""The claims table of docs/claims.md, from the claim sweeps' results (rlcompare report, one metric at a time).

    python scripts/claims_table.py [--results results] [--out docs/claims_table.md]

For every sweeps/claims/*.yaml and every row of its `claim.expect`, it runs `rlcompare report` on
results/<claim name> with that metric (written to results/<claim>/by_metric/<metric>/: report.md, CSVs, plots) and
reads the variant's difference from the base at equal generated tokens (the `final` quantity): the Welch 95%
interval, the probability of improvement and the seeds. The verdict follows from the interval and the claim's
predicted direction, fixed in the sweep file before it was run:

* higher / lower: "reproduced" when the interval excludes 0 on the predicted side, "opposite" when it excludes 0 on
  the other side, "inconclusive" when it holds 0;
* same: "consistent" when the interval holds 0 (no difference detected, which is not proof of none), "not
  reproduced" when it excludes 0;
* report: the numbers only;
* fewer than --min-seeds seeds per arm: "too few seeds: inconclusive".
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from rlcompare.report import ReportError, build_report  # noqa: E402
from rlcompare.results import read_jsonl  # noqa: E402


def verdict(direction: str, low: float, high: float, n_var: int, n_ref: int, min_seeds: int) -> str:
    if min(n_var, n_ref) < min_seeds:
        return "too few seeds: inconclusive"
    if direction == "report":
        return "(reported)"
    above, below = low > 0, high < 0
    if direction == "same":
        return "not reproduced" if (above or below) else "consistent"
    want_above = direction == "higher"
    if (above and want_above) or (below and not want_above):
        return "reproduced"
    if above or below:
        return "opposite"
    return "inconclusive"


def slug(metric: str) -> str:
    return metric.replace("/", "_")


def claim_rows(sweep_file: Path, results: Path, min_seeds: int) -> list[dict]:
    data = yaml.safe_load(sweep_file.read_text())
    claim, name, base = data["claim"], data["name"], data["base"]["label"]
    root = results / name
    rows = []
    for e in claim["expect"]:
        row = {
            "claim": name,
            "paper": claim["paper"],
            "variant": e["variant"],
            "reference": base,
            "metric": e["metric"],
            "direction": e["direction"],
        }
        try:
            res = build_report(
                root,
                metric=e["metric"],
                out_dir=root / "by_metric" / slug(e["metric"]),
                min_seeds=min_seeds,
                reference=base,
            )
        except ReportError as err:
            rows.append({**row, "verdict": f"not run ({err})"})
            continue
        d = res["differences"]
        d = d[(d["variant"] == e["variant"]) & (d["reference"] == base) & (d["quantity"] == "final")]
        if d.empty:
            rows.append({**row, "verdict": "no runs of this arm"})
            continue
        r = d.iloc[0]
        row["trend"] = "; ".join(f"{lb} {t}" for lb in (base, e["variant"]) if (t := trend(root, lb, e["metric"])))
        rows.append(
            {
                **row,
                "diff": r["diff"],
                "low": r["diff_low"],
                "high": r["diff_high"],
                "poi": r["poi"],
                "n": f"{int(r['n_variant'])}/{int(r['n_reference'])}",
                "verdict": verdict(
                    e["direction"], r["diff_low"], r["diff_high"], int(r["n_variant"]), int(r["n_reference"]), min_seeds
                ),
            }
        )
    return rows


def trend(root: Path, label: str, metric: str, k: int = 5) -> str:
    """'start -> end' of a metrics.jsonl column for one arm: the mean of its first and of its last k steps, averaged
    over seeds ('' for eval.jsonl columns or no runs)."""
    starts, ends = [], []
    for run in sorted(root.glob(f"{label}__s*")):
        f = run / "metrics.jsonl"
        if not f.is_file():
            continue
        vals = [r[metric] for r in read_jsonl(f) if isinstance(r.get(metric), (int, float))]
        if len(vals) >= 2 * k:
            starts.append(sum(vals[:k]) / k)
            ends.append(sum(vals[-k:]) / k)
    if not starts:
        return ""
    return f"{sum(starts) / len(starts):.3g} -> {sum(ends) / len(ends):.3g}"


def fmt(x: float) -> str:
    return f"{x:+.3g}" if abs(x) >= 1e-3 or x == 0 else f"{x:+.2e}"


def markdown(rows: list[dict]) -> str:
    out = [
        "| claim | variant vs base | metric (at equal tokens) | predicted | difference [95% CI] | P(variant > base) | "
        "seeds | verdict | first 5 -> last 5 steps (mean over seeds) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        if "diff" in r:
            cell = f"{fmt(r['diff'])} [{fmt(r['low'])}, {fmt(r['high'])}]"
            out.append(
                f"| {r['claim']} | {r['variant']} vs {r['reference']} | `{r['metric']}` | {r['direction']} | "
                f"{cell} | {r['poi']:.2f} | {r['n']} | {r['verdict']} | {r.get('trend', '')} |"
            )
        else:
            out.append(
                f"| {r['claim']} | {r['variant']} vs {r['reference']} | `{r['metric']}` | {r['direction']} | "
                f"– | – | – | {r['verdict']} | |"
            )
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--results", default="results")
    p.add_argument("--claims", default=str(REPO / "sweeps" / "claims"))
    p.add_argument("--min-seeds", type=int, default=5)
    p.add_argument("--out", default=None, help="write the table here (markdown); default: print it")
    args = p.parse_args(argv)
    rows = []
    for f in sorted(Path(args.claims).glob("*.yaml")):
        rows += claim_rows(f, Path(args.results), args.min_seeds)
    text = markdown(rows)
    if args.out:
        Path(args.out).write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
