"""Print the measured coverage of every interval `rlcompare report` uses (rlcompare/report/coverage.py).

    python scripts/coverage.py [--trials 10000] [--seed 0]

One row per interval x shape, one column per seed count: the share of simulated seed sets whose
nominal 95% interval holds the true value, and the floor it must reach (tests/report/test_stats_coverage.py
uses 2,000 trials). The last rows are the known limits (not held to a floor).
"""

from __future__ import annotations

import argparse
import sys
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from rlcompare.report import coverage as C  # noqa: E402


def _table(cells, floors: bool) -> list[str]:
    rows: dict[tuple[str, str, str], dict[int, float]] = defaultdict(dict)
    for c in cells:
        rows[(c.interval, c.shape, c.family)][c.seeds] = c.coverage
    counts = sorted({c.seeds for c in cells})
    head = ["interval", "seed scores"] + [f"n={n}" for n in counts] + (["floor"] if floors else [])
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for (interval, shape, family), by_n in rows.items():
        cells_n = [f"{by_n[n]:.3f}" if n in by_n else "" for n in counts]
        tail = [f"{C.FLOORS[family]:.2f}"] if floors else []
        out.append("| " + " | ".join([interval, shape] + cells_n + tail) + " |")
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=10_000, help="simulated seed sets per cell (default 10000)")
    ap.add_argument("--seed", type=int, default=0, help="random seed of the simulation (default 0)")
    args = ap.parse_args(argv)
    if args.trials < 100:
        ap.error(f"--trials={args.trials}: use at least 100 (coverage is a share of trials)")
    cells = C.all_cells(trials=args.trials, seed=args.seed)
    print(f"Coverage of nominal {C.NOMINAL:.0%} intervals, {args.trials} trials per cell, seed {args.seed}\n")
    print("\n".join(_table(cells, floors=True)))
    below = [c for c in cells if c.coverage < c.floor]
    print(
        f"\n{len(below)} cell(s) below their floor"
        + (
            ""
            if not below
            else ": " + "; ".join(f"{c.interval} / {c.shape} / n={c.seeds}: {c.coverage:.3f}" for c in below)
        )
    )
    print("\nKnown limits (no floor):\n")
    print(
        "\n".join(_table(list(C.one_sample_cells(shapes=C.LIMITS, trials=args.trials, seed=args.seed)), floors=False))
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
