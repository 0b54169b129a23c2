"""The claims table of docs/claims.md, generated from the per-seed values in docs/claims_seeds.csv.

    python scripts/claims_table.py --collect [--results results]   # add reruns' per-seed values to the CSV
    python scripts/claims_table.py [--out docs/claims_table.md]       # the table, from the CSV alone

--collect runs `rlcompare report` on results/<claim> for every sweeps/claims/*.yaml with results, one metric of
its `claim.expect` at a time (written to results/<claim>/by_metric/<metric>/), and replaces that claim's rows of
the CSV with the per-seed values behind each comparison: every estimand (window: the mean of the last 3 evals
up to the pair's comparison point, the verdict's; final: the value there; auc), each arm, each seed. A rerun can
then be compared with the committed values seed by seed.

The table reads only the CSV. Per row: the difference variant - base, with the paired 95% t interval of the
per-seed differences where both arms hold the same seeds (the claim sweeps share warm start, data order and
sampling streams per seed), else Welch's; its p-value Holm-adjusted over the family the report uses (every
variant compared with the same base on the same metric within one claim); the minimum detectable effect at 80%
power; the probability of improvement. The verdict follows from the Holm-adjusted test and the direction fixed
in the sweep file before it was run:

* higher / lower: "reproduced" when the adjusted test rejects on the predicted side, "opposite" on the other
  side, "inconclusive" otherwise (with the MDE: no effect larger than it was missed);
* same: "consistent (none larger than MDE)" when it does not reject, "not reproduced" when it does;
* report: the numbers only;
* a claim whose `claim.kind` is "mechanism identity" (c4) is labelled so: its test is claim_same_rows.py, the
  row is not a statistical result;
* fewer than --min-seeds seeds per arm: "too few seeds: inconclusive"; no rows in the CSV: "not in the CSV";
* an arm whose seeds look bimodal (stats.looks_bimodal) with fewer than stats.BIMODAL_MIN_SEEDS seeds: "inconclusive
  (bimodal seeds)", out of Holm's family, as in the report;
* a verdict that one seed decides (leave one seed out, the seed's pair for paired rows, the family adjusted again:
  rlcompare.report.fragile) gets "; fragile (seed s of `arm` decides it)".
"""

from __future__ import annotations

import argparse
import csv
import subprocess
import sys
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from rlcompare.report import ReportError, build_report  # noqa: E402
from rlcompare.report.claims_table import (  # noqa: E402, F401 (the table's names, for the tests and readers)
    ALPHA,
    ESTIMAND,
    IDENTITY,
    MARKER,
    TITLES,
    claim_rows,
    compare,
    eval_draws,
    markdown,
    readme_table,
    replace_table,
    verdict,
)

SEEDS_CSV = REPO / "docs" / "claims_seeds.csv"
FIELDS = ["claim", "variant", "reference", "metric", "quantity", "arm", "seed", "value", "comparison_tokens", "source"]


def slug(metric: str) -> str:
    return metric.replace("/", "_")


def _claim_number(path: Path) -> tuple[int, str]:
    """c2 before c10: the claims in the order docs/claims.md numbers them."""
    digits = "".join(ch for ch in path.stem.split("_")[0] if ch.isdigit())
    return (int(digits) if digits else 10**9, path.stem)


def _claims(claims_dir: Path) -> list[dict]:
    return [yaml.safe_load(f.read_text()) for f in sorted(Path(claims_dir).glob("*.yaml"), key=_claim_number)]


def _source() -> str:
    try:
        head = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
        return f"collected at {head.stdout.strip() or 'unknown commit'}"  # the runs' own commit: --source
    except OSError:
        return "collected"


def collect(data: dict, results: Path, min_seeds: int, source: str) -> list[dict]:
    """One claim's per-seed rows from its results folder ([] when it has none)."""
    name, base, root = data["name"], data["base"]["label"], results / data["name"]
    if not root.is_dir():
        return []
    rows = []
    for metric in dict.fromkeys(e["metric"] for e in data["claim"]["expect"]):
        try:
            res = build_report(
                root, metric=metric, out_dir=root / "by_metric" / slug(metric), min_seeds=min_seeds, reference=base
            )
        except ReportError as err:
            print(f"{name} / {metric}: not collected ({err})", file=sys.stderr)
            continue
        for r in res["differences"].itertuples():
            for arm, seeds, values in (
                ("variant", r.seeds_variant, r.values_variant),
                ("reference", r.seeds_reference, r.values_reference),
            ):
                for seed, value in zip(seeds.split(), values.split()):
                    rows.append(
                        dict(claim=name, variant=r.variant, reference=base, metric=metric, quantity=r.quantity, arm=arm,
                             seed=int(seed), value=float(value), comparison_tokens=r.comparison_tokens, source=source)
                    )  # fmt: skip
    return rows


def read_seeds(path: Path) -> list[dict]:
    if not path.is_file():
        return []
    with path.open(newline="") as f:
        return [dict(r, seed=int(r["seed"]), value=float(r["value"])) for r in csv.DictReader(f)]


def write_seeds(path: Path, rows: list[dict]) -> None:
    rows = sorted(rows, key=lambda r: (r["claim"], r["metric"], r["variant"], r["quantity"], r["arm"], r["seed"]))
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=FIELDS, lineterminator="\n")
        w.writeheader()
        w.writerows({k: r[k] for k in FIELDS} for r in rows)


README = REPO / "README.md"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--results", default="results")
    p.add_argument("--claims", default=str(REPO / "sweeps" / "claims"))
    p.add_argument("--seeds-csv", default=str(SEEDS_CSV), help="the per-seed values (default docs/claims_seeds.csv)")
    p.add_argument("--collect", action="store_true", help="replace the CSV rows of every claim with results here")
    p.add_argument("--source", default=None, help="what --collect writes in the CSV's source column (default: HEAD)")
    p.add_argument("--min-seeds", type=int, default=5)
    p.add_argument("--out", default=None, help="write the table here (markdown); default: print it")
    p.add_argument("--rerun-only", action="store_true", help="only the rows with per-seed values (docs/claims.md)")
    p.add_argument("--readme", action="store_true", help="rewrite README.md's claims block from the CSV")
    p.add_argument("--check", action="store_true", help="with --readme: exit 1 if README.md's block differs")
    args = p.parse_args(argv)
    claims, csv_path = _claims(Path(args.claims)), Path(args.seeds_csv)
    seeds = read_seeds(csv_path)
    if args.readme:
        text = README.read_text()
        new = replace_table(text, readme_table(claims, seeds, args.min_seeds))
        if args.check:
            print("README.md's claims table " + ("agrees with" if new == text else "differs from") + " the CSV")
            return 0 if new == text else 1
        README.write_text(new)
        return 0
    if args.collect:
        source = args.source or _source()
        for data in claims:
            new = collect(data, Path(args.results), args.min_seeds, source)
            if new:
                seeds = [r for r in seeds if r["claim"] != data["name"]] + new
        write_seeds(csv_path, seeds)
    rows = [r for data in claims for r in claim_rows(data, seeds, args.min_seeds)]
    if args.rerun_only:
        rows = [r for r in rows if "p" in r]
    text = markdown(rows)
    if args.out:
        Path(args.out).write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
