"""What a training step costs one process by batch size: the part that does not shrink with the batch bounds
data-parallel efficiency (each rank pays it in full; docs/scaling.md). A measurement script, not a test.

    python scripts/step_cost.py [--prompts 1,2,4,8,16] [--size 4.2M] [--rounds 5]

One trainer per batch size (scripts/dp_scaling.py's run: the benchmark's model size, 1 thread, group streams),
each warmed up by one step; then `--rounds` rounds in which every size runs one rollout (`Trainer.collect`) and
one whole step (`Trainer.step`), so the host's drift hits every size alike. Prints the median milliseconds and
the milliseconds per prompt of each, and the efficiency bound 1 / (2 x step(P/2) / step(P)) for each pair P/2, P.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--prompts", default="1,2,4,8,16", help="trainer.prompts_per_step values, comma-separated")
    p.add_argument("--size", default="4.2M")
    p.add_argument("--rounds", type=int, default=5)
    a = p.parse_args()
    sizes = [int(x) for x in a.prompts.split(",")]
    tmp = Path(tempfile.mkdtemp(prefix="step_cost-"))
    try:
        return measure(a.size, sizes, a.rounds, tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def measure(size: str, sizes: list[int], rounds: int, tmp: Path) -> int:
    sys.path[:0] = [str(REPO), str(REPO / "scripts")]
    import torch

    from dp_scaling import overrides
    from rlcompare.bench.against_trl import compose_config
    from rlcompare.config import validate
    from rlcompare.train.trainer import Trainer

    torch.set_num_threads(1)
    trainers = {}
    for n in sizes:
        cfg = validate(compose_config([*overrides(size, n, 10**6, tmp / "results"), "trainer.threads=1"]))
        trainers[n] = Trainer(cfg, tmp / f"run{n}")
        trainers[n].step()
    ms: dict[int, dict[str, list[float]]] = {n: {"collect": [], "step": []} for n in sizes}
    for _ in range(rounds):
        for n, tr in trainers.items():
            for what, call in (("collect", tr.collect), ("step", tr.step)):
                t = time.perf_counter()
                call()
                ms[n][what].append(1000 * (time.perf_counter() - t))
    step = {}
    for n in sizes:
        c, step[n] = statistics.median(ms[n]["collect"]), statistics.median(ms[n]["step"])
        print(
            f"{n:3d} prompts: rollout {c:7.1f} ms ({c / n:6.1f} a prompt), step {step[n]:7.1f} ms ({step[n] / n:6.1f})"
        )
    for n in sizes:
        if n % 2 == 0 and n // 2 in step:
            share = step[n // 2] / step[n]
            print(
                f"{n // 2} of {n} prompts cost {share:.2f} of the step: 2 ranks at {n} reach at most {1 / (2 * share):.2f}"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
