"""How long `rlcompare train <bad config>` takes to fail: wall time per case over a few repeats, and what an empty
interpreter and `import torch, transformers` cost on this machine for comparison.

    python scripts/time_config_error.py                      # this checkout
    python scripts/time_config_error.py --repo /path/to/other/checkout --repeat 7

Every case must fail with `rlcompare: config error:` (exit code 2); a case that does not is reported as such.
Results go to a temporary folder (Hydra may create a run folder there), never into the checkout.
Not a test: wall times depend on the machine and its load; run it on a quiet machine and compare checkouts.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

# Bad configs that every version refuses (a typo'd value, a negative range, a misspelt verifier, a bad size).
CASES = [
    ["trainer.lr=-1"],
    ["algorithm.clip.eps_low=-0.1"],
    ["verifier.name=exact_mtach"],
    ["trainer.prompts_per_step=0"],
]


def wall(cmd: list[str], cwd: str, env: dict) -> tuple[float, subprocess.CompletedProcess]:
    t0 = time.perf_counter()
    out = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=600)
    return time.perf_counter() - t0, out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--repo", default=str(Path(__file__).resolve().parents[1]), help="checkout to time (default: this one)"
    )
    ap.add_argument("--repeat", type=int, default=5, help="runs per case (the median is reported)")
    args = ap.parse_args(argv)
    repo = os.path.abspath(args.repo)
    env = {**os.environ, "PYTHONPATH": repo, "WANDB_MODE": "offline"}
    print(f"checkout {repo}; python {sys.executable}; {os.cpu_count()} cpus; load average {os.getloadavg()[0]:.2f}")
    base = [wall([sys.executable, "-c", "pass"], repo, env)[0] for _ in range(args.repeat)]
    heavy = [wall([sys.executable, "-c", "import torch, transformers"], repo, env)[0] for _ in range(args.repeat)]
    for label, times in (("python -c pass", base), ("python -c 'import torch, transformers'", heavy)):
        print(f"{label:58s} median {statistics.median(times):5.2f} s")
    worst = 0.0
    with tempfile.TemporaryDirectory(prefix="rlc-time-") as tmp:
        for case in CASES:
            cmd = [sys.executable, "-m", "rlcompare.cli", "train", *case, f"results_dir={tmp}/results"]
            times, ok = [], True
            for _ in range(args.repeat):
                t, out = wall(cmd, repo, env)
                times.append(t)
                ok = ok and out.returncode == 2 and "rlcompare: config error:" in out.stderr
            med = statistics.median(times)
            worst = max(worst, med)
            print(
                f"{'rlcompare train ' + ' '.join(case):58s} median {med:5.2f} s  (min {min(times):.2f}, max "
                f"{max(times):.2f}){'' if ok else '  NOT REFUSED AS A CONFIG ERROR'}"
            )
    print(f"slowest case: median {worst:.2f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
