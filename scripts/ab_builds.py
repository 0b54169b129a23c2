"""Time two builds of rlcompare in one process, steps alternated, on the benchmark's work (`rlcompare bench`).

On a shared machine two processes run minutes apart can differ by 20%; two trainers in one process, stepping
in turn, see the same disturbances, so their per-step ratio is what a change is decided by.

    python scripts/ab_builds.py REV [--size 0.5M] [--pairs 20] [-- extra.override=value ...]

REV (any git revision) is exported to a temporary folder, with its own `conf/`, and imported as `rlcompare_<rev>`
next to the working tree's `rlcompare`. Both train from the benchmark's saved initial weights (`results/bench/weights_<size>`,
written by `rlcompare bench` or on first use here). Prints the median seconds per step, rollout and update of
each build and the median of the per-pair ratio REV / working tree (above 1: the working tree is faster).
"""

from __future__ import annotations

import argparse
import importlib
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def export_build(rev: str, into: Path) -> str:
    """Export `rev`'s package as `rlcompare_<sha>` under `into`; returns the module name."""
    sha = subprocess.check_output(["git", "-C", str(ROOT), "rev-parse", "--short", rev], text=True).strip()
    name = f"rlcompare_{sha}"
    archive = subprocess.check_output(["git", "-C", str(ROOT), "archive", sha, "rlcompare", "conf"])
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    (into / "rlcompare").rename(into / name)
    (into / "conf").rename(into / name / "conf")  # its own config tree, found next to its modules (cli.conf_dir)
    for f in (into / name).rglob("*.py"):  # its own modules import each other under the new name
        src = f.read_text()
        src = re.sub(r"\brlcompare\.", f"{name}.", src)
        src = re.sub(r"\bfrom rlcompare import\b", f"from {name} import", src)
        f.write_text(src)
    return name


def make_trainer(pkg: str, size: str, out: Path, extra: list[str]):
    bench = importlib.import_module(f"{pkg}.bench")
    config = importlib.import_module(f"{pkg}.config")
    try:  # rlcompare/train/trainer.py; before the subpackages, rlcompare/trainer.py
        trainer = importlib.import_module(f"{pkg}.train.trainer")
    except ModuleNotFoundError:
        trainer = importlib.import_module(f"{pkg}.trainer")
    spec = bench.model_spec(size)
    weights = ROOT / "results" / "bench" / f"weights_{size}"
    bench.ensure_weights(weights, size)
    cfg = bench.compose_config(
        bench.rlcompare_overrides(
            str(weights), max_new_tokens=spec["max_new_tokens"], device="cpu", threads=None, out=str(out)
        )
        + extra
    )
    return trainer.Trainer(config.validate(cfg), out / "run")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("rev")
    p.add_argument("--size", default="0.5M")
    p.add_argument("--pairs", type=int, default=20)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("overrides", nargs="*", help="extra rlcompare overrides for both builds")
    a = p.parse_args()
    os.environ.pop("RLCOMPARE_CONF", None)  # each build reads its own config tree (keys may differ between them)
    sys.path.insert(0, str(ROOT))
    with tempfile.TemporaryDirectory() as tmp:
        sys.path.insert(0, tmp)
        old = export_build(a.rev, Path(tmp))
        trainers = {
            a.rev: make_trainer(old, a.size, Path(tmp) / "old", a.overrides),
            "working tree": make_trainer("rlcompare", a.size, Path(tmp) / "new", a.overrides),
        }
        for t in trainers.values():
            for _ in range(a.warmup):
                t.step()
        times = {k: {"step": [], "rollout": [], "update": []} for k in trainers}
        for i in range(a.pairs):
            for k in list(trainers) if i % 2 == 0 else list(trainers)[::-1]:
                t0 = time.perf_counter()
                row = trainers[k].step()
                times[k]["step"].append(time.perf_counter() - t0)
                times[k]["rollout"].append(row["time/rollout_s"])
                times[k]["update"].append(row["time/update_s"])
    for k, v in times.items():
        print(f"{k:>14}: " + "  ".join(f"{n} {statistics.median(x) * 1e3:.1f} ms" for n, x in v.items()))
    old_t, new_t = times[a.rev]["step"], times["working tree"]["step"]
    ratios = sorted(o / n for o, n in zip(old_t, new_t))
    q = len(ratios) // 4
    print(
        f"per-pair step ratio {a.rev} / working tree: median {statistics.median(ratios):.3f} "
        f"(quartiles {ratios[q]:.3f}-{ratios[-1 - q]:.3f}, {len(ratios)} pairs, size {a.size})"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
