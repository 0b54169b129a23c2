"""Where a data-parallel rank's step goes (issue 21): each rank's phases and collectives, against one process on a
rank's share of the batch. A measurement script, not a test.

    python scripts/rank_time.py [--ranks 2] [--size 4.2M] [--prompts 16] [--steps 12] [--warmup 3] [--per-step]

Runs `scripts/dp_scaling.py`'s training run twice, 1 thread per process: under `torchrun --nproc_per_node=N` on
`--prompts`, and as one process on `--prompts / N` (what each rank samples and trains on). In both, every process
times the trainer's phases (`collect`, `advantages`, `update` and, inside it, the gradient sum's `finish` and
the optimizer step) and, on the ranks, every collective (`rlcompare.train.parallel._collective`, named by the
function that called it), from step `--warmup` + 1 on. Prints milliseconds a step for each, one process against
every rank: what the ranks spend beyond the lone share-sized process is data parallelism's cost on this host
(the collectives, including the waits for the slowest rank, and the compute two processes slow each other by).
Each line has a `cpu` line under it: the calling thread's CPU time in the same calls (`time.thread_time`). Wall
time beyond it is time off the core (a collective waiting for the other rank, or the process preempted); CPU time
beyond the lone process's in the same phase is work the rank does and it does not, or the same work made slower
by the other rank beside it (shared caches and memory bandwidth). `--per-step` adds every step's CPU time of each
phase on every rank, and the mean spread between the ranks by phase: the work that the waits come from.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "scripts"))
from dp_scaling import launch, overrides, phases  # noqa: E402

# Run in every process in place of `python -m rlcompare.cli`: wraps the timed functions, then runs the CLI; at exit
# writes {name: [seconds, calls, CPU seconds]} to $RANK_TIME_OUT/rank<RANK>.json.
_WRAPPER = r"""
import atexit, collections, json, os, runpy, sys, time, traceback
import rlcompare.train.parallel as par
import rlcompare.train.trainer as trainer_mod

spent = collections.defaultdict(lambda: [0.0, 0, 0.0])
per_step = collections.defaultdict(list)  # phase -> CPU seconds of each call, from step warmup + 1 on
warmup = int(os.environ["RANK_TIME_WARMUP"])

def timed(name, fn):
    def run(*a, **k):
        t, cpu = time.perf_counter(), time.thread_time()
        try:
            return fn(*a, **k)
        finally:
            s, used = spent[name], time.thread_time() - cpu
            s[0] += time.perf_counter() - t
            s[1] += 1
            s[2] += used
            if name.startswith("phase"):
                per_step[name].append(used)
    return run

collective = par._collective
def named_collective(fn, *a, **k):
    caller = traceback.extract_stack(limit=3)[0].name  # the World method that called _collective
    return timed(f"collective: {fn.__name__} in {caller}", collective)(fn, *a, **k)
par._collective = named_collective
for name in ("step", "collect", "advantages", "update", "_optimizer_step"):
    setattr(trainer_mod.Trainer, name, timed(f"phase: {name.strip('_')}", getattr(trainer_mod.Trainer, name)))
par.GradientSum.finish = timed("phase: gradient sum (finish)", par.GradientSum.finish)
step = trainer_mod.Trainer.step
def counted_step(self):
    if self.state.step == warmup:
        spent.clear()
        per_step.clear()
    return step(self)
trainer_mod.Trainer.step = counted_step

def dump():
    out = os.path.join(os.environ["RANK_TIME_OUT"], f"rank{os.environ.get('RANK', '0')}.json")
    with open(out, "w") as f:
        json.dump({"spent": dict(spent), "per_step": dict(per_step)}, f)
atexit.register(dump)
sys.argv = ["rlcompare", *sys.argv[1:]]
runpy.run_module("rlcompare.cli", run_name="__main__")
"""


def run(cmd_prefix: list[str], args: list[str], out: Path, warmup: int) -> list[dict]:
    out.mkdir(parents=True)
    wrapper = out / "wrapper.py"
    wrapper.write_text(_WRAPPER)
    env = {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "PYTHONPATH": str(REPO),
        "RANK_TIME_OUT": str(out),
        "RANK_TIME_WARMUP": str(warmup),
    }
    launch([*cmd_prefix, str(wrapper), *args], env=env)
    return [json.loads(p.read_text()) for p in sorted(out.glob("rank*.json"))]  # {"spent": ..., "per_step": ...}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--size", default="4.2M")
    p.add_argument("--prompts", type=int, default=16)
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--warmup", type=int, default=3, help="steps left out")
    p.add_argument(
        "--per-step",
        action="store_true",
        help="and each step's CPU time of each phase on every rank: how far the ranks' work differs step by step",
    )
    a = p.parse_args()
    if a.prompts % a.ranks:
        p.error(f"--prompts must be divisible by --ranks ({a.prompts} by {a.ranks})")
    tmp = Path(tempfile.mkdtemp(prefix="rank_time-"))
    os.environ.setdefault("RLCOMPARE_CACHE", str(tmp / "cache"))
    steps = a.steps - a.warmup

    def train_args(prompts: int, results: Path) -> list[str]:
        return ["train", "trainer.threads=1", *overrides(a.size, prompts, a.steps, results)]

    part = a.prompts // a.ranks
    try:
        return report(a, tmp, part, steps, train_args)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def report(a, tmp: Path, part: int, steps: int, train_args) -> int:
    one = run([sys.executable], train_args(part, tmp / "one_results"), tmp / "one", a.warmup)[0]["spent"]
    by_rank = run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={a.ranks}"],
        train_args(a.prompts, tmp / "ranks_results"),
        tmp / "ranks",
        a.warmup,
    )
    ranks = [r["spent"] for r in by_rank]
    names = sorted(set(one).union(*ranks), key=lambda k: (not k.startswith("phase"), -ranks[0].get(k, [0])[0]))
    print(f"size {a.size}, 1 thread per process; {a.ranks} ranks on {a.prompts} prompts against one process on {part}")
    print(
        f"{f'ms a step (steps {a.warmup + 1}-{a.steps})':44s}{'one process':>14s}"
        + "".join(f"{f'rank {r}':>10s}" for r in range(a.ranks))
        + f"{'calls a step':>14s}"
    )

    def line(name: str, values: list[float], calls: str = "") -> None:
        print(f"{name:44s}{values[0]:14.1f}" + "".join(f"{v:10.1f}" for v in values[1:]) + f"{calls:>14s}")

    for name in names:
        cols = [one.get(name, [0, 0, 0]), *(r.get(name, [0, 0, 0]) for r in ranks)]
        line(name, [1000 * c[0] / steps for c in cols], f"{max(c[1] for c in cols[1:]) / steps:.1f}")
        line("  cpu", [1000 * c[2] / steps for c in cols])
    line(
        "collectives, all",
        [0.0, *(1000 * sum(v[0] for k, v in r.items() if k.startswith("collective")) / steps for r in ranks)],
    )
    whole = [one.get("phase: step", [0, 0, 0]), *(r.get("phase: step", [0, 0, 0]) for r in ranks)]
    line("step: wall - cpu (off the core)", [1000 * (c[0] - c[2]) / steps for c in whole])
    line("step (time/step_s, median)", [phases(tmp / d, a.warmup)["step"] for d in ("one_results", "ranks_results")])
    if a.per_step:
        per_step_table([r["per_step"] for r in by_rank], a.warmup)
    return 0


PHASES = ("collect", "advantages", "update", "step")


def per_step_table(per_step: list[dict], warmup: int) -> None:
    """Each step's CPU milliseconds of each phase on every rank, then the mean over steps of the spread between the
    ranks (slowest - fastest) by phase. A rank that finishes a phase first waits for the slowest at the next
    collective, so the phases' spreads bound what the waits cost; the whole step's spread is what they would cost
    if the ranks met once a step (differences of opposite sign in two phases cancel)."""
    cols = {ph: [r.get(f"phase: {ph}", []) for r in per_step] for ph in PHASES}
    n = min(len(c) for ph in PHASES for c in cols[ph])
    print(f"\nCPU ms of each phase, rank by rank (steps {warmup + 1}-{warmup + n})")
    print("step " + "".join(f"{ph:>{9 * len(per_step) + 2}s}" for ph in PHASES))
    spread = {ph: 0.0 for ph in PHASES}
    for i in range(n):
        cells = ""
        for ph in PHASES:
            ms = [1000 * c[i] for c in cols[ph]]
            spread[ph] += (max(ms) - min(ms)) / n
            cells += "  " + "".join(f"{v:9.0f}" for v in ms)
        print(f"{warmup + 1 + i:4d} {cells}")
    parts = sum(spread[ph] for ph in PHASES[:-1])
    print(
        "mean spread between the ranks, ms: "
        + ", ".join(f"{ph} {spread[ph]:.0f}" for ph in PHASES)
        + f" (the three phases' sum {parts:.0f})"
    )


if __name__ == "__main__":
    sys.exit(main())
