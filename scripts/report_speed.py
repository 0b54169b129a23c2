"""Time `rlcompare report` over a generated results folder of many small runs (issue 41 item 19).

    python scripts/report_speed.py [--runs 10000] [--variants 20] [--steps 20] [--evals 5] [--keep DIR] [--code DIR]

Each run folder is shaped like one `rlcompare train` writes: the whole resolved config.yaml (the default's groups,
read from conf/), fingerprint.json, summary.json, metrics.jsonl (one row per step, the default's columns) and
eval.jsonl. Variants are sweep members against one reference; seeds 0.. fill each variant. Prints the seconds
`build_report` takes (writing report.md, the CSVs and the plots) and the runs per second. --code times the
rlcompare of another checkout (e.g. `git worktree add --detach /tmp/base <commit>`) over the same folder: keep the
folder and alternate the two, since a loaded machine's timings drift.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parent.parent

GROUPS = {"algorithm": "grpo", "model": "tiny", "budget": "smoke", "verifier": "exact_match", "prompts": "arithmetic"}
METRIC_COLUMNS = [
    "reward/mean",
    "reward/std",
    "objective/per_token",
    "objective/per_response",
    "length/mean",
    "length/correct_mean",
    "length/incorrect_mean",
    "clip/frac_low",
    "clip/frac_high",
    "groups/zero_variance_frac",
    "policy/entropy",
    "kl/ref",
    "loss/policy",
    "loss/total",
    "grad/norm",
    "ratio/mean",
    "ratio/max",
    "time/step_s",
    "time/rollout_s",
    "time/update_s",
]


def default_config() -> dict:
    """The default run's config as config.yaml holds it: conf/config.yaml with each group's preset under its key."""
    cfg = yaml.safe_load((REPO / "conf" / "config.yaml").read_text())
    cfg.pop("defaults", None)
    cfg.pop("hydra", None)
    for group, preset in GROUPS.items():
        cfg[group] = yaml.safe_load((REPO / "conf" / group / f"{preset}.yaml").read_text())
    cfg["logger"] = {"name": "none", "mode": "disabled", "project": "rlcompare", "entity": None, "group": None}
    return cfg


def write_run(root: Path, cfg: dict, variant: str, seed: int, steps: int, evals: int) -> None:
    name = f"{variant}__s{seed}"
    d = root / name
    d.mkdir(parents=True)
    sweep = {"name": "speed", "variant": variant, "reference": "v0", "component": "trainer.lr"}
    cfg = {**cfg, "seed": seed, "run_name": name, "experiment": "speed", "sweep": sweep}
    cfg["trainer"] = {**cfg["trainer"], "lr": 1e-5 * (1 + int(variant[1:]))}
    (d / "config.yaml").write_text(yaml.safe_dump(cfg, sort_keys=False))
    fingerprint = {"init_weights_hash": "w0", "model": "tiny", "prompts": {"name": "arithmetic"}, "trainer": {}}
    (d / "fingerprint.json").write_text(json.dumps(fingerprint))
    tokens_per_step = 1000
    with open(d / "metrics.jsonl", "w") as f:
        for step in range(1, steps + 1):
            row = {"step": step, "tokens/generated": step * tokens_per_step, "time/elapsed_s": 2.0 * step}
            row.update({c: 0.001 * ((step * 7 + seed * 3 + i) % 100) for i, c in enumerate(METRIC_COLUMNS)})
            f.write(json.dumps(row) + "\n")
    with open(d / "eval.jsonl", "w") as f:
        for k in range(evals):
            step = k * steps // max(evals - 1, 1)
            acc = 0.1 + 0.01 * k + 0.001 * seed
            row = {"step": step, "tokens/generated": step * tokens_per_step, "eval/accuracy": acc}
            f.write(json.dumps({**row, "eval/mean_length": 12.0, "eval/n": 256, "time/elapsed_s": 2.0 * step}) + "\n")
    summary = {"status": "completed", "error": None, "run_name": name, "experiment": "speed", "algorithm": "grpo"}
    summary.update(seed=seed, steps=steps, sweep=sweep, pid=1)
    (d / "summary.json").write_text(json.dumps(summary))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=10_000, help="run folders to generate (default 10000)")
    ap.add_argument("--variants", type=int, default=20, help="sweep members, v0 the reference (default 20)")
    ap.add_argument("--steps", type=int, default=20, help="metrics.jsonl rows per run (default 20)")
    ap.add_argument("--evals", type=int, default=5, help="eval.jsonl rows per run (default 5)")
    ap.add_argument("--keep", default=None, help="generate into this folder and keep it (default: a temporary one)")
    ap.add_argument("--code", default=str(REPO), help="checkout whose rlcompare is timed (default: this one)")
    args = ap.parse_args(argv)
    sys.path.insert(0, str(Path(args.code).resolve()))
    import rlcompare
    from rlcompare.report import build_report

    root = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="report_speed_"))
    try:
        cfg = default_config()
        if not (root / "speed").exists():
            t0 = time.perf_counter()
            for i in range(args.runs):
                write_run(root / "speed", cfg, f"v{i % args.variants}", i // args.variants, args.steps, args.evals)
            print(f"generated {args.runs} runs in {time.perf_counter() - t0:.1f} s under {root}")
        t0 = time.perf_counter()
        res = build_report(root / "speed", out_dir=root / "report")
        took = time.perf_counter() - t0
        print(f"report over {len(res['runs'])} runs: {took:.1f} s ({len(res['runs']) / took:.0f} runs/s)", end=" ")
        print(f"by {Path(rlcompare.__file__).parent.parent}")
    finally:
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
