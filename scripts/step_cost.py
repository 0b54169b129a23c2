"""What a training step costs one process by batch size: the part that does not shrink with the batch bounds
data-parallel efficiency (each rank pays it in full; docs/scaling.md). A measurement script, not a test.

    python scripts/step_cost.py [--prompts 1,2,4,8,16] [--size 4.2M] [--rounds 5]

One trainer per batch size (scripts/dp_scaling.py's run: the benchmark's model size, 1 thread, group streams),
each warmed up by one step; then `--rounds` rounds in which every size runs one rollout (`Trainer.collect`) and
one whole step (`Trainer.step`), so the host's drift hits every size alike. Prints the median milliseconds and
the milliseconds per prompt of each, and the efficiency bound 1 / (2 x step(P/2) / step(P)) for each pair P/2, P.

`--profile` then runs `--rounds` more steps of each size under torch.profiler and prints, per step, the ops' own
(self) CPU time and call count at each size, and the ops whose time shrinks least with the batch (2 x ms(P/2) -
ms(P), largest first). What the wall-clock step's fixed part holds beyond the ops' fixed part is per-call overhead
outside the ops (Python, the dispatcher, autograd's bookkeeping), paid per call whatever the batch.
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
    p.add_argument("--profile", action="store_true", help="and where the ops' time goes (torch.profiler)")
    p.add_argument("--top", type=int, default=12, help="ops listed by --profile")
    a = p.parse_args()
    sizes = [int(x) for x in a.prompts.split(",")]
    tmp = Path(tempfile.mkdtemp(prefix="step_cost-"))
    try:
        return measure(a.size, sizes, a.rounds, tmp, a.top if a.profile else 0)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def measure(size: str, sizes: list[int], rounds: int, tmp: Path, top: int) -> int:
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
    if top:
        profile_ops(trainers, rounds, top)
    return 0


def profile_ops(trainers: dict, rounds: int, top: int) -> None:
    """Each op's self CPU time and calls a step at every size (`rounds` profiled steps each, interleaved), and the
    ops whose time shrinks least with the batch."""
    import collections

    from torch.profiler import ProfilerActivity, profile

    ms = {n: collections.Counter() for n in trainers}
    calls = {n: collections.Counter() for n in trainers}
    for _ in range(rounds):
        for n, tr in trainers.items():
            with profile(activities=[ProfilerActivity.CPU]) as prof:
                tr.step()
            for e in prof.key_averages():
                ms[n][e.key] += e.self_cpu_time_total / 1000 / rounds
                calls[n][e.key] += e.count / rounds
    for n in trainers:
        print(
            f"{n:3d} prompts under the profiler: ops' own time {sum(ms[n].values()):7.1f} ms a step, "
            f"{sum(calls[n].values()):8.0f} op calls"
        )
    for n in trainers:
        if n % 2 or n // 2 not in trainers:
            continue
        h = n // 2
        fixed = 2 * sum(ms[h].values()) - sum(ms[n].values())
        print(f"ops' fixed part, 2 x {h} - {n} prompts: {fixed:.1f} ms a step; the ops that shrink least:")
        print(f"  {'op':52s}{f'ms at {h}':>10s}{f'ms at {n}':>10s}{'fixed':>8s}{f'calls at {h}':>12s}{f'at {n}':>8s}")
        for k in sorted(set(ms[h]) | set(ms[n]), key=lambda k: ms[n][k] - 2 * ms[h][k])[:top]:
            print(
                f"  {k[:52]:52s}{ms[h][k]:10.1f}{ms[n][k]:10.1f}{2 * ms[h][k] - ms[n][k]:8.1f}"
                f"{calls[h][k]:12.0f}{calls[n][k]:8.0f}"
            )


if __name__ == "__main__":
    sys.exit(main())
