"""Do two arms of a sweep take the same steps? Compare their metrics.jsonl rows, seed by seed (claim 4, docs/claims.md).

    python scripts/claim_same_rows.py results/c4_gspo_on_policy --a grpo --b gspo --steps 10 [--rtol 1e-4]

For each seed with runs `<a>__s<seed>` and `<b>__s<seed>`, every numeric column of the first --steps rows (timing
columns, the machine-dependent trainer.TIMING_PREFIXES, aside) is compared: |x_a - x_b| <= atol + rtol * |x_a|. Prints the largest difference
per seed and the first column and step that break the tolerance, if any; exits 1 if any seed differs.
Reads JSON only (rlcompare.results' reader); nothing is executed.
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from rlcompare.results import read_jsonl  # noqa: E402
from rlcompare.train.trainer import TIMING_PREFIXES as TIMING  # noqa: E402  (time/, perf/, memory/: the machine's)


def rows(run: Path, steps: int) -> list[dict]:
    return [r for r in read_jsonl(run / "metrics.jsonl") if isinstance(r.get("step"), int) and r["step"] <= steps]


def compare(a: list[dict], b: list[dict], rtol: float, atol: float) -> tuple[float, str | None]:
    """(largest relative difference, first breach 'step N column: x vs y' or None)."""
    if len(a) != len(b):
        return math.inf, f"{len(a)} rows vs {len(b)}"
    worst, breach = 0.0, None
    for ra, rb in zip(a, b):
        for key in sorted(set(ra) | set(rb)):
            if key.startswith(TIMING):
                continue
            xa, xb = ra.get(key), rb.get(key)
            if not all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in (xa, xb)):
                if xa != xb and breach is None:
                    breach = f"step {ra.get('step')} {key}: {xa!r} vs {xb!r}"
                continue
            if math.isnan(xa) and math.isnan(xb):
                continue
            diff = abs(xa - xb)
            worst = max(worst, diff / max(abs(xa), 1e-12) if diff > atol else 0.0)
            if diff > atol + rtol * abs(xa) and breach is None:
                breach = f"step {ra['step']} {key}: {xa!r} vs {xb!r}"
    return worst, breach


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("sweep_dir")
    p.add_argument("--a", required=True, help="label of one arm (runs <a>__s<seed>)")
    p.add_argument("--b", required=True, help="label of the other arm")
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--rtol", type=float, default=1e-4)
    p.add_argument("--atol", type=float, default=1e-6)
    args = p.parse_args(argv)
    root = Path(args.sweep_dir)
    seeds = sorted(
        int(d.name.rsplit("__s", 1)[1]) for d in root.glob(f"{args.a}__s*") if (d / "metrics.jsonl").is_file()
    )
    if not seeds:
        print(f"no runs {args.a}__s<seed> with metrics.jsonl under {root}", file=sys.stderr)
        return 2
    bad = 0
    for s in seeds:
        run_b = root / f"{args.b}__s{s}"
        if not (run_b / "metrics.jsonl").is_file():
            print(f"seed {s}: no {run_b.name}")
            bad += 1
            continue
        worst, breach = compare(
            rows(root / f"{args.a}__s{s}", args.steps), rows(run_b, args.steps), args.rtol, args.atol
        )
        print(
            f"seed {s}: largest relative difference over steps 1-{args.steps}: {worst:.2e}"
            + (f"; first beyond rtol={args.rtol:g}: {breach}" if breach else f"; all within rtol={args.rtol:g}")
        )
        bad += breach is not None
    print(f"{len(seeds) - bad} of {len(seeds)} seeds agree over the first {args.steps} steps")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
