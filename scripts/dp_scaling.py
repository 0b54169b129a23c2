"""Scaling efficiency of data-parallel training (issue 21): one run over N torchrun ranks against one process.

    python scripts/dp_scaling.py [--ranks 2] [--parallel ddp|fsdp] [--size 4.2M] [--prompts 16] [--steps 12]
                                 [--warmup 2] [--repeats 1] [--ceiling] [--bound]

Both sides train the same run (`rollout.streams=group`, the benchmark's model size from
`rlcompare.bench.against_trl.SIZES`, a 1-step warm start, no evals) with 1 CPU thread per process:

- one process: `rlcompare train trainer.threads=1`;
- N ranks: `torchrun --standalone --nproc_per_node=N -m rlcompare.cli train trainer.parallel=<--parallel>` (each
  rank 1 thread).

Throughput is generated tokens per second of training step (rows after `--warmup` steps, from metrics.jsonl:
`tokens/step` / `time/step_s`, rank 0's clock: it waits for the slowest rank at every collective). Scaling
efficiency = throughput(N ranks) / (N x throughput(one process)). It also reports through which step the two runs
sampled the same number of tokens (`tokens/step` row by row). Two options split the efficiency into three factors:

- `--bound` also runs one process on a rank's share of the batch (prompts / N): the share's step time over the whole
  batch's bounds the efficiency that free communication on idle cores would reach (a step's fixed costs are paid
  in full by each rank); the `time/*` phases of the runs show where a rank's step goes;
- `--ceiling` (implies `--bound`) also runs N such share-sized runs side by side, as independent processes: the
  fraction of the lone share-sized run's throughput each keeps is what sharing the machine (caches, memory
  bandwidth) costs a rank, with no communication at all;
- what the N ranks lose beyond bound x ceiling is the collectives and the waits for the slowest rank.

A measurement script, not a test: the machine decides the figure. What it measured on the project's 2-core host,
and the findings of the tools it replaced (kept in git), are in docs/perf-log.md.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SIZES = {"0.5M": (128, 2), "4.2M": (256, 4), "25M": (512, 6)}  # rlcompare.bench.against_trl.SIZES (hidden, layers)


def overrides(size: str, prompts: int, steps: int, results: Path) -> list[str]:
    hidden, layers = SIZES[size]
    return [
        f"model.hidden_size={hidden}",
        f"model.num_layers={layers}",
        f"model.num_heads={hidden // 32}",
        f"model.intermediate_size={4 * hidden}",
        "model.warm_start.steps=1",
        "budget.max_new_tokens=16",
        f"budget.max_steps={steps}",
        "budget.total_tokens=100000000",
        f"trainer.prompts_per_step={prompts}",
        "rollout.streams=group",
        "trainer.eval_every=100000",
        "trainer.progress=false",
        "logger=none",
        f"results_dir={results}",
        "run_name=run",
    ]


def add_run_options(p: argparse.ArgumentParser, steps: int) -> None:
    """The options of the measured run."""
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--size", default="4.2M", choices=sorted(SIZES))
    p.add_argument("--prompts", type=int, default=16, help="trainer.prompts_per_step: the global batch, in groups of 8")
    p.add_argument("--steps", type=int, default=steps)
    p.add_argument("--warmup", type=int, default=2, help="first steps left out of the throughput")


def run_rows(results: Path) -> list[dict]:
    """The metrics.jsonl rows of the run `overrides` writes under `results`."""
    return [json.loads(line) for line in (results / "default" / "run" / "metrics.jsonl").read_text().splitlines()]


def same_through(a: list, b: list) -> int:
    """Through which step two runs' `tokens/step` columns agree (the first step where they differ, 0-based)."""
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), len(a))


def tokens_per_s(tokens: list[int], seconds: list[float], warmup: int) -> float:
    """A run's throughput: its generated tokens over its steps' time, the first `warmup` steps left out."""
    return sum(tokens[warmup:]) / sum(seconds[warmup:])


def throughput(results: Path, warmup: int) -> tuple[float, list[int]]:
    rows = run_rows(results)
    tokens = [r["tokens/step"] for r in rows]
    return tokens_per_s(tokens, [r["time/step_s"] for r in rows], warmup), tokens


def phases(results: Path, warmup: int) -> dict[str, float]:
    """Median milliseconds of each `time/*` column of a run's rows after `warmup` (rollout, update, step, ...)."""
    kept = run_rows(results)[warmup:]
    keys = [k for k in kept[0] if k.startswith("time/") and k.endswith("_s") and k != "time/elapsed_s"]
    return {k[len("time/") : -len("_s")]: 1000 * statistics.median(r[k] for r in kept) for k in keys}


def launch(*cmds: list[str], env: dict) -> None:
    """Run the commands side by side and wait for all."""
    procs = [
        subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, cwd=REPO)
        for cmd in cmds
    ]
    for cmd, proc in zip(cmds, procs):
        err = proc.communicate()[1]
        if proc.returncode != 0:  # every rank's stderr kept: the summary at the end names a rank, not its error
            log = Path(tempfile.mkstemp(prefix="dp_scaling-failed-", suffix=".log")[1])
            log.write_text(err)
            sys.exit(f"failed ({proc.returncode}): {' '.join(cmd)}\n{err[-3000:]}\nwhole stderr: {log}")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_run_options(p, steps=12)
    p.add_argument("--parallel", default="ddp", choices=["ddp", "fsdp"], help="trainer.parallel of the N-rank run")
    p.add_argument("--repeats", type=int, default=1, help="alternated pairs (the machine is shared and noisy)")
    p.add_argument(
        "--ceiling",
        action="store_true",
        help="also run N independent one-process runs on prompts / ranks side by side (implies --bound): the "
        "throughput each keeps, against one such run alone, is what sharing the machine costs a rank",
    )
    p.add_argument(
        "--bound",
        action="store_true",
        help="also run one process on prompts / ranks: the step time of the part against the whole batch's bounds "
        "the efficiency free communication on idle cores would reach (fixed costs per step)",
    )
    a = p.parse_args()
    a.bound = a.bound or a.ceiling
    if a.bound and a.prompts % a.ranks:
        p.error(f"--bound and --ceiling need --prompts divisible by --ranks ({a.prompts} by {a.ranks})")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    tmp = Path(tempfile.mkdtemp(prefix="dp_scaling-"))
    env.setdefault("RLCOMPARE_CACHE", str(tmp / "cache"))
    single, multi, side, same, part, timed = [], [], [], [], [], {"one": [], "part": [], "ranks": []}

    def one_cmd(results: Path, prompts: int = a.prompts) -> list[str]:
        return [
            sys.executable,
            "-m",
            "rlcompare.cli",
            "train",
            "trainer.threads=1",
            *overrides(a.size, prompts, a.steps, results),
        ]

    try:
        for r in range(a.repeats):
            one, many = tmp / f"one{r}", tmp / f"many{r}"
            apart = [tmp / f"side{r}_{k}" for k in range(a.ranks)]
            ranks_cmd = [
                sys.executable,
                "-m",
                "torch.distributed.run",
                "--standalone",
                f"--nproc_per_node={a.ranks}",
                "-m",
                "rlcompare.cli",
                "train",
                f"trainer.parallel={a.parallel}",
                *overrides(a.size, a.prompts, a.steps, many),
            ]
            # (commands run side by side, their results, where their mean throughput goes)
            runs = [([one_cmd(one)], [one], single), ([ranks_cmd], [many], multi)]
            if a.ceiling:
                runs.append(([one_cmd(d, a.prompts // a.ranks) for d in apart], apart, side))
            if a.bound:
                runs.append(([one_cmd(tmp / f"part{r}", a.prompts // a.ranks)], [tmp / f"part{r}"], part))
            for cmds, results, into in runs if r % 2 == 0 else runs[::-1]:
                launch(*cmds, env=env)
                got = [throughput(d, a.warmup) for d in results]
                into.append((sum(x for x, _ in got) / len(got), got[0][1]))
            if a.bound:
                for name, d in (("one", one), ("part", tmp / f"part{r}"), ("ranks", many)):
                    timed[name].append(phases(d, a.warmup))
            a_tok, b_tok = single[-1][1], multi[-1][1]
            same.append(same_through(a_tok, b_tok))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    t1 = statistics.median(x for x, _ in single)
    tn = statistics.median(x for x, _ in multi)
    eff = tn / (a.ranks * t1)
    print(
        f"size {a.size}, {a.prompts} prompts x 8 per step, {a.steps} steps ({a.warmup} left out), 1 thread per process"
    )
    print(f"one process:  {t1:8.0f} tokens/s   (each repeat: {', '.join(f'{x:.0f}' for x, _ in single)})")
    print(
        f"{a.ranks} ranks {a.parallel}: {tn:8.0f} tokens/s   (each repeat: {', '.join(f'{x:.0f}' for x, _ in multi)})"
    )
    print(f"speed-up {tn / t1:.2f}x, scaling efficiency {eff:.2f}")
    # the host's speed drifts between runs: a repeat's own pair (run back to back) is the steadier comparison
    pairs = [m / (a.ranks * o) for (o, _), (m, _) in zip(single, multi)]
    print(
        f"each repeat's own efficiency: {', '.join(f'{e:.2f}' for e in pairs)} (median {statistics.median(pairs):.2f})"
    )
    bound = None
    if a.bound:
        for name, label in (
            ("one", f"one process, {a.prompts} prompts"),
            ("part", f"one process, {a.prompts // a.ranks} prompts"),
            ("ranks", f"{a.ranks} ranks, {a.prompts} prompts"),
        ):
            per = timed[name]
            cols = ", ".join(f"{k} {'/'.join(f'{t[k]:.0f}' for t in per)}" for k in per[0])
            print(f"ms a step (median of its rows, each repeat) for {label}: {cols}")
        shares = [p_["step"] / o["step"] for p_, o in zip(timed["part"], timed["one"])]
        bound = 1 / (a.ranks * statistics.median(shares))
        print(
            f"1/{a.ranks} of the batch costs one process {', '.join(f'{x:.2f}' for x in shares)} of the "
            f"whole batch's step: with free communication on idle cores the efficiency is at most {bound:.2f}"
        )
    ceiling = rest = None
    if a.ceiling:
        kept = [s_ / p_ for (s_, _), (p_, _) in zip(side, part)]  # each repeat's side by side over its lone run
        ceiling = statistics.median(kept)
        rest = statistics.median(pairs) / (bound * ceiling)
        print(
            f"{a.ranks} independent processes on {a.prompts // a.ranks} prompts side by side keep "
            f"{', '.join(f'{x:.2f}' for x in kept)} of one alone's throughput (median {ceiling:.2f}): what sharing "
            f"the machine costs a rank"
        )
        print(
            f"efficiency {statistics.median(pairs):.2f} = bound {bound:.2f} x side by side {ceiling:.2f} x "
            f"{rest:.2f} (the collectives and the waits for the slowest rank)"
        )
    # a near-tie between two tokens, broken the other way by another summation order, makes the runs part for good
    print(f"the same tokens per step through step {min(same)} of {a.steps} (each repeat: {same})")
    print(
        json.dumps(
            {
                "size": a.size,
                "prompts": a.prompts,
                "ranks": a.ranks,
                "parallel": a.parallel,
                "one_tokens_per_s": t1,
                "ranks_tokens_per_s": tn,
                "efficiency": eff,
                "efficiency_by_repeat": pairs,
                "same_tokens_through_step": min(same),
                "bound": bound,
                "side_by_side": ceiling,
                "collectives_and_waits": rest,
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
