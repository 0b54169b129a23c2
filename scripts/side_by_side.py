"""Whether ranks in lock-step slow each other more than independent processes do (issue 21). A measurement script,
not a test.

    python scripts/side_by_side.py [--prompts 8] [--size 4.2M] [--steps 14] [--warmup 3] [--repeats 3]

Each repeat runs `scripts/dp_scaling.py`'s training run (1 thread per process) three ways: one process alone; 2
independent processes side by side ("free"); and the same 2 processes made to start every step together
("lock-step": a gloo barrier before each `Trainer.step`, outside its clock, and nothing else shared). The two
side-by-side processes train with seeds 0 and 1, as two ranks sample different groups. Data-parallel ranks
synchronise several times a step, so their phases coincide (both decoding, both in the optimizer at once) more
than free processes' do. Prints each run's median `time/step_s` (rollout and update too): lock-step against free
is what coinciding phases cost, with no data exchanged.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "scripts"))
from dp_scaling import launch, overrides, phases  # noqa: E402

# In each side-by-side process: with a store path, join a 2-process gloo group of its own (no torchrun, so rlcompare
# itself trains as one process) and wait for the other at the start of every step; then run the CLI.
_WRAPPER = r"""
import runpy, sys
rank, store = int(sys.argv[1]), sys.argv[2]
if store != "-":
    import torch.distributed as dist
    import rlcompare.train.trainer as trainer_mod
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=2)
    step = trainer_mod.Trainer.step
    def together(self):
        dist.barrier()
        return step(self)
    trainer_mod.Trainer.step = together
sys.argv = ["rlcompare", *sys.argv[3:]]
runpy.run_module("rlcompare.cli", run_name="__main__")
"""


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--prompts", type=int, default=8, help="each process's trainer.prompts_per_step (a rank's share)")
    p.add_argument("--size", default="4.2M")
    p.add_argument("--steps", type=int, default=14)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--repeats", type=int, default=3)
    a = p.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="side_by_side-"))
    wrapper = tmp / "wrapper.py"
    wrapper.write_text(_WRAPPER)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    env.setdefault("RLCOMPARE_CACHE", str(tmp / "cache"))

    def cmd(store: str, rank: int, results: Path) -> list[str]:
        train = ["train", "trainer.threads=1", f"seed={rank}", *overrides(a.size, a.prompts, a.steps, results)]
        return [sys.executable, str(wrapper), str(rank), store, *train]

    try:
        steps: dict[str, list[float]] = {"alone": [], "free": [], "lock-step": []}
        for r in range(a.repeats):
            for way in ("alone", "free", "lock-step") if r % 2 == 0 else ("lock-step", "free", "alone"):
                n = 1 if way == "alone" else 2
                store = str(tmp / f"store{r}") if way == "lock-step" else "-"
                dirs = [tmp / f"{way}{r}_{k}" for k in range(n)]
                launch(*(cmd(store, k, d) for k, d in enumerate(dirs)), env=env)
                got = [
                    {k: v for k, v in phases(d, a.warmup).items() if k in ("rollout", "update", "step")} for d in dirs
                ]
                steps[way] += [g["step"] for g in got]
                cols = "; ".join(", ".join(f"{k} {v:.0f}" for k, v in g.items()) for g in got)
                print(f"repeat {r + 1} {way:9s} ms a step (median): {cols}")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    free, lock, alone = (statistics.median(steps[w]) for w in ("free", "lock-step", "alone"))
    print(
        f"medians over repeats and processes: alone {alone:.0f} ms, free {free:.0f} ms ({free / alone:.2f}x), "
        f"lock-step {lock:.0f} ms ({lock / alone:.2f}x; {lock / free:.2f}x free)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
