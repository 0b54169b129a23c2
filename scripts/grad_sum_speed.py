"""The gradient sum over CPU ranks on one machine: gloo's all-reduce (trainer.grad_sum=backend) against the sum
through shared memory (trainer.grad_sum=shared_memory, rlcompare/train/shared_sum.py). A measurement script, not a
test: the machine decides the figures. Ratios come from one run each, so a shared host's drift cancels.

    python scripts/grad_sum_speed.py [--ranks 2] [--sizes 4.2,25,100] [--repeats 7]   # the sum alone
    python scripts/grad_sum_speed.py --in-run [--steps 42]                              # inside training

The sum alone: `--ranks` gloo processes (1 thread each), each with a gradient of SIZE million floats in four
parameters; every repeat times `GradientSum.arm(); finish()` both ways, back to back, after a barrier; medians.

--in-run: one `torchrun --nproc_per_node=2` run of the benchmark's 4.2M model (scripts/dp_scaling.py's settings,
16 prompts) whose training steps alternate the two sums in pairs of steps (backend, backend, shared memory, shared
memory, ...): both sum to the same bits for 2 ranks, so the run is the same run either way, and each step's wall
time is compared with its neighbour's; the first pair is left out (warm-up).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def torchrun(ranks: int) -> list[str]:
    """This script under torchrun, `ranks` processes on this machine."""
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={ranks}", __file__]


def sum_alone(sizes: list[float], repeats: int) -> None:
    import torch
    import torch.distributed as dist

    from rlcompare.train.parallel import GradientSum, World

    dist.init_process_group("gloo")
    rank, size = dist.get_rank(), dist.get_world_size()
    torch.set_num_threads(1)
    for millions in sizes:
        n = int(millions * 1e6)
        params = [torch.nn.Parameter(torch.zeros(n // 4)) for _ in range(4)]
        sums = {shm: GradientSum(World(rank=rank, size=size, mode="ddp", shared_memory=shm), params) for shm in (0, 1)}
        ms = {0: [], 1: []}
        for _ in range(repeats + 1):  # the first round opens the window and warms the buffers: left out
            for shm, gs in sums.items():
                for p in params:
                    p.grad = torch.full_like(p, rank + 1.0)
                dist.barrier()
                t = time.perf_counter()
                gs.arm()
                gs.finish()
                ms[shm].append(1000 * (time.perf_counter() - t))
                assert float(params[0].grad[0]) == size * (size + 1) / 2  # 1 + 2 + ... + size
        if rank == 0:
            b, s = statistics.median(ms[0][1:]), statistics.median(ms[1][1:])
            print(
                f"{millions:g}M floats over {size} ranks: backend {b:.1f} ms, shared memory {s:.1f} ms, {b / s:.2f}x",
                flush=True,
            )
    dist.destroy_process_group()


def in_run_worker(args: list[str]) -> None:
    """One rank of the alternating run: rlcompare.cli's train, its Trainer's gradient sum swapped every 2 steps."""
    from rlcompare.train import parallel, trainer

    init, step = trainer.Trainer.__init__, trainer.Trainer.step
    times: dict[str, list[float]] = {"backend": [], "shared_memory": []}

    def patched_init(self, *a, **kw):
        init(self, *a, **kw)
        w, params = self.world, self._replicated_params()
        self._sums = {
            "backend": parallel.GradientSum(dataclasses.replace(w, shared_memory=False), params),
            "shared_memory": parallel.GradientSum(dataclasses.replace(w, shared_memory=True), params),
        }

    def patched_step(self):
        mode = ("backend", "shared_memory")[(self.state.step // 2) % 2]
        self.grad_sum = self._sums[mode]
        t = time.perf_counter()
        row = step(self)
        times[mode].append(time.perf_counter() - t)
        return row

    trainer.Trainer.__init__, trainer.Trainer.step = patched_init, patched_step
    from rlcompare.cli import main

    sys.argv = ["rlcompare", *args]
    try:
        main()
    finally:
        if os.environ.get("RANK") == "0":
            Path(os.environ["GRAD_SUM_SPEED_OUT"]).write_text(json.dumps(times))


def in_run(steps: int) -> None:
    sys.path.insert(0, str(REPO / "scripts"))
    from dp_scaling import overrides

    with tempfile.TemporaryDirectory(prefix="grad_sum_speed-") as tmp:
        out = Path(tmp) / "times.json"
        env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO), "GRAD_SUM_SPEED_OUT": str(out)}
        env.setdefault("RLCOMPARE_CACHE", str(Path(tmp) / "cache"))
        cmd = [
            *torchrun(2),
            "--worker",
            "train",
            "trainer.parallel=ddp",
            *overrides("4.2M", 16, steps, Path(tmp) / "results"),
        ]
        subprocess.run(cmd, env=env, check=True, stdout=subprocess.DEVNULL, cwd=REPO)
        times = json.loads(out.read_text())
    b, s = times["backend"][2:], times["shared_memory"][2:]  # the first pair of each: warm-up
    ratios = [x / y for x, y in zip(b, s)]
    print(
        f"4.2M model, 16 prompts, 2 ranks, {len(b)} + {len(s)} steps: median step backend {1000 * statistics.median(b):.0f} "
        f"ms, shared memory {1000 * statistics.median(s):.0f} ms; step by step (backend / shared memory) median "
        f"{statistics.median(ratios):.3f}, mean {statistics.mean(ratios):.3f}"
    )


def main() -> int:
    if sys.argv[1:2] == ["--worker"]:
        in_run_worker(sys.argv[2:])
        return 0
    if sys.argv[1:2] == ["--alone"]:
        a = json.loads(sys.argv[2])
        sum_alone(a["sizes"], a["repeats"])
        return 0
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--sizes", default="4.2,25,100", help="millions of floats, comma-separated")
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--in-run", action="store_true", help="inside a training run instead (see the module doc)")
    p.add_argument("--steps", type=int, default=42, help="--in-run: training steps (pairs of steps alternate)")
    a = p.parse_args()
    if a.in_run:
        in_run(a.steps)
        return 0
    spec = json.dumps({"sizes": [float(x) for x in a.sizes.split(",")], "repeats": a.repeats})
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    subprocess.run([*torchrun(a.ranks), "--alone", spec], env=env, check=True, cwd=REPO)
    return 0


if __name__ == "__main__":
    sys.exit(main())
