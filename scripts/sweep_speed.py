"""Wall time of `rlcompare sweep` run serially against the same sweep under the joblib launcher (issue 21's target:
2 parallel jobs at least 1.45x faster than serial at the default threads, on a sweep of at least 8 runs of the
embedded default). A measurement script, not a test: the machine it runs on decides the figure.

    python scripts/sweep_speed.py [--presets grpo,drgrpo,rloo,gspo] [--seeds 0,1] [--jobs 2] [--repeats 1] [--out DIR]

Each repeat runs the serial sweep (Hydra's basic launcher, trainer.threads unset: torch's default) and the parallel
one (hydra/launcher=joblib hydra.launcher.n_jobs=JOBS, threads by the rule in rlcompare/train/placement.py), alternating
which goes first. The warm start is built once beforehand, so neither pays for it. It prints each wall time, the
speed-up (serial / parallel) and whether every run's metrics.jsonl rows (timing columns aside) are the same in both,
then what bounds the speed-up: each run's own time alone at the default threads against at 1 thread beside the other
jobs (on a host where torch's 2 threads are barely faster than 1, the bound nears 2x; where they are 1.23x, 1.6x),
then one JSON line.
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
import time
from pathlib import Path

TIMING_PREFIXES = (
    "time/",
    "perf/",
    "memory/",
)  # rlcompare.train.trainer.TIMING_PREFIXES (not imported: this script never loads torch)
REPO = Path(__file__).resolve().parents[1]


def sweep_file(path: Path, presets: list[str], seeds: list[int]) -> Path:
    base, *variants = presets
    lines = [
        "# sweep_speed: presets of the embedded default",
        "name: speed",
        f"seeds: [{', '.join(map(str, seeds))}]",
        f"base: {{label: {base}, overrides: [algorithm={base}]}}",
        "variants:",
    ]
    lines += [f"  - {{label: {v}, component: algorithm, overrides: [algorithm={v}]}}" for v in variants]
    path.write_text("\n".join(lines) + "\n")
    return path


def run(cmd: list[str], env: dict) -> float:
    t0 = time.perf_counter()
    res = subprocess.run(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    wall = time.perf_counter() - t0
    if res.returncode != 0:
        sys.exit(f"failed ({res.returncode}): {' '.join(cmd)}\n{res.stdout[-4000:]}")
    return wall


def rows(path: Path) -> list[dict]:
    return [
        {k: v for k, v in json.loads(line).items() if not k.startswith(TIMING_PREFIXES)}
        for line in path.read_text().splitlines()
    ]


def same_rows(a: Path, b: Path) -> list[str]:
    """Runs whose rows differ between two results folders of the sweep."""
    return sorted(
        d.name
        for d in a.iterdir()
        if (d / "metrics.jsonl").exists() and rows(d / "metrics.jsonl") != rows(b / d.name / "metrics.jsonl")
    )


def run_seconds(root: Path) -> list[float]:
    """Each run's own wall time (summary.json's wall_time_s: from its start to its end, the imports aside)."""
    return [
        json.loads((d / "summary.json").read_text())["wall_time_s"]
        for d in sorted(root.iterdir())
        if (d / "summary.json").exists()
    ]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--presets", default="grpo,drgrpo,rloo,gspo", help="the base first, then the variants")
    ap.add_argument("--seeds", default="0,1")
    ap.add_argument("--jobs", type=int, default=2, help="hydra.launcher.n_jobs of the parallel sweep")
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--out", default=None, help="keep the results here (default: a temporary folder, removed)")
    ap.add_argument("overrides", nargs="*", help="extra overrides for both sweeps (e.g. budget.max_steps=20)")
    args = ap.parse_args(argv)
    presets, seeds = args.presets.split(","), [int(s) for s in args.seeds.split(",")]
    work = Path(args.out) if args.out else Path(tempfile.mkdtemp(prefix="sweep_speed-"))
    work.mkdir(parents=True, exist_ok=True)
    env = {
        **os.environ,
        "WANDB_MODE": "offline",
        "RLCOMPARE_CACHE": os.environ.get("RLCOMPARE_CACHE", str(work / "cache")),
    }
    env.pop("RLCOMPARE_LAUNCH_JOBS", None)
    py = [sys.executable, "-m", "rlcompare.cli"]
    common = ["logger=none", "trainer.progress=false", *args.overrides]
    n_runs = len(presets) * len(seeds)
    print(
        f"{n_runs} runs ({','.join(presets)} x seeds {args.seeds}); parallel: joblib, {args.jobs} jobs; "
        f"{os.cpu_count()} CPUs; results in {work}",
        flush=True,
    )
    run(py + ["train", *common, "budget.max_steps=1", f"results_dir={work / 'warm'}"], env)  # builds the warm start
    spec = sweep_file(work / "speed.yaml", presets, seeds)
    times: dict[str, list[float]] = {"serial": [], "parallel": []}
    per_run: dict[str, list[float]] = {"serial": [], "parallel": []}
    differing: list[str] = []
    for rep in range(args.repeats):
        order = ("serial", "parallel") if rep % 2 == 0 else ("parallel", "serial")
        for mode in order:
            dest = work / f"{mode}{rep}"
            shutil.rmtree(dest, ignore_errors=True)
            launcher = [] if mode == "serial" else ["hydra/launcher=joblib", f"hydra.launcher.n_jobs={args.jobs}"]
            wall = run(py + ["sweep", str(spec), *common, f"results_dir={dest}", *launcher], env)
            times[mode].append(wall)
            per_run[mode] += run_seconds(dest / "speed")
            print(f"  repeat {rep} {mode:8s} {wall:7.1f} s", flush=True)
        differing += same_rows(work / f"serial{rep}" / "speed", work / f"parallel{rep}" / "speed")
    serial, parallel = min(times["serial"]), min(times["parallel"])
    speedup = serial / parallel
    print(
        f"serial {serial:.1f} s, parallel {parallel:.1f} s (fastest of {args.repeats}): {speedup:.2f}x; "
        f"metrics rows equal in every run: {not differing}"
        + (f" (differ: {', '.join(differing)})" if differing else "")
    )
    # what bounds the speed-up: a run at 1 thread beside another against a run alone at the default threads
    alone, beside = statistics.median(per_run["serial"]), statistics.median(per_run["parallel"])
    bound = args.jobs * alone / beside
    print(
        f"a run took {alone:.1f} s alone at the default threads and {beside:.1f} s at 1 thread beside "
        f"{args.jobs - 1} other(s) (medians; a worker's first run also pays its imports): with no cost outside the runs the speed-up could reach {bound:.2f}x"
    )
    print(
        json.dumps(
            {
                "runs": n_runs,
                "run_s_serial_median": round(alone, 2),
                "run_s_parallel_median": round(beside, 2),
                "bound": round(bound, 3),
                "jobs": args.jobs,
                "serial_s": times["serial"],
                "parallel_s": times["parallel"],
                "speedup": round(speedup, 3),
                "rows_equal": not differing,
                "cpus": os.cpu_count(),
            }
        )
    )
    if not args.out:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
