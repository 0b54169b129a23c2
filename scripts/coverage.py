"""Print the measured coverage of every interval `rlcompare report` uses (rlcompare/report/coverage.py).

    python scripts/coverage.py [--trials 10000] [--seed 0] [--shape 'bimodal(0.45, 0.28, 0.005, 0.2)' ...]
    python scripts/coverage.py --bimodal [--trials 40000]   # the seed count behind stats.BIMODAL_MIN_SEEDS, the
        # coverage of the seed sets that still get a verdict, and how the gap rule reads outliers and two modes

One row per interval x shape, one column per seed count: the share of simulated seed sets whose nominal 95%
interval holds the true value, with the floor it must reach (nominal less three Monte Carlo standard errors
and the shape's documented shortfall; tests/report/test_stats_coverage.py uses 2,000 trials). The last rows are
the known limits (not held to a floor). With --shape, only the shapes given are measured (mean, IQM, and
Welch's and the paired interval with both arms drawn from the shape); forms: normal(mean, sd),
beta(mean, sd), clipped(mean, sd), accuracy(mean, sd, items), t(df[, scale]), lognormal(sigma),
bimodal(learned mean, collapsed mean, sd, collapse rate).
"""

from __future__ import annotations

import argparse
import sys
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from rlcompare.report import coverage as C  # noqa: E402


def _table(cells, floors: bool) -> list[str]:
    rows: dict[tuple[str, str], dict[int, object]] = defaultdict(dict)
    for c in cells:
        rows[(c.interval, c.shape)][c.seeds] = c
    counts = sorted({c.seeds for c in cells})
    head = ["interval", "seed scores"] + [f"n={n}" + (" (floor)" if floors else "") for n in counts]
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for (interval, shape), by_n in rows.items():
        cells_n = [
            (f"{by_n[n].coverage:.3f}" + (f" ({by_n[n].floor:.3f})" if floors else "")) if n in by_n else ""
            for n in counts
        ]
        out.append("| " + " | ".join([interval, shape] + cells_n) + " |")
    return out


def _below(cells) -> str:
    below = [c for c in cells if c.coverage < c.floor]
    listed = "; ".join(f"{c.interval} / {c.shape} / n={c.seeds}: {c.coverage:.3f}" for c in below)
    return f"\n{len(below)} cell(s) below their floor" + (f": {listed}" if below else "")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=10_000, help="simulated seed sets per cell (default 10000)")
    ap.add_argument("--seed", type=int, default=0, help="random seed of the simulation (default 0)")
    ap.add_argument("--shape", action="append", default=[], help="a seed distribution of your own (repeatable)")
    ap.add_argument(
        "--bimodal",
        action="store_true",
        help="only the bimodal shapes' intervals (mean, Welch, paired) at 5-20 seeds, over all sets, the sets the gap "
        "rule withholds, the sets that still get a verdict and those with one outlier; the gap rule's reading of "
        "outliers and two modes; the seed count from which they cover (stats.BIMODAL_MIN_SEEDS)",
    )
    args = ap.parse_args(argv)
    if args.trials < 100:
        ap.error(f"--trials={args.trials}: use at least 100 (coverage is a share of trials)")
    try:
        shapes = [C.parse_shape(s) for s in args.shape]
    except ValueError as err:
        ap.error(str(err))
    print(f"Coverage of nominal {C.NOMINAL:.0%} intervals, {args.trials} trials per cell, seed {args.seed}\n")
    if args.bimodal:
        cells = C.bimodal_cells(trials=args.trials, seed=args.seed)
        print("\n".join(_table(cells, floors=False)))
        print("\nHow the gap rule reads seed sets of known kind (share of sets):\n")
        print("| process | seeds | two modes (verdict withheld) | one outlier (verdict given, seed named) |")
        print("|---|---|---|---|")
        for name, n, modes, outlier in C.gap_rule_rates(trials=args.trials, seed=args.seed):
            print(f"| {name} | {n} | {modes:.3f} | {outlier:.3f} |")
        count = C.bimodal_seed_count(cells)
        print(
            f"\nEvery bimodal shape covers {C.NOMINAL - C.BIMODAL_TOLERANCE:.2f} (less Monte Carlo error) from "
            + (f"{count} seeds on" if count else "no measured seed count")
            + f"; stats.BIMODAL_MIN_SEEDS = {C.stats.BIMODAL_MIN_SEEDS}"
        )
        return 0
    if shapes:
        cells = [c for s in shapes for c in C.custom_cells(s, trials=args.trials, seed=args.seed)]
        print("\n".join(_table(cells, floors=False)))
        return 0
    cells = C.all_cells(trials=args.trials, seed=args.seed)
    print("\n".join(_table(cells, floors=True)))
    print(_below(cells))
    print("\nKnown limits (no floor):\n")
    print(
        "\n".join(_table(list(C.one_sample_cells(shapes=C.LIMITS, trials=args.trials, seed=args.seed)), floors=False))
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
