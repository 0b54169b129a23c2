"""W&B continues across a resume (issue 18): the resumed process appends to the same W&B run and W&B ends up with
every step exactly once, read back with wandb's own reader; W&B writes nothing outside the run folder."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import FAST
from rlcompare.train.tracking import read_jsonl

REPO = Path(__file__).resolve().parents[2]
OV = [
    "logger=wandb",
    "logger.mode=offline",
    "algorithm=dapo",
    "budget.max_steps=8",
    "trainer.checkpoint_every=2",
    "trainer.eval_every=3",
    "run_name=wb",
]
WANDB_DIR_VARS = (
    "WANDB_DIR",
    "WANDB_CACHE_DIR",
    "WANDB_DATA_DIR",
    "WANDB_CONFIG_DIR",
    "XDG_CACHE_HOME",
    "XDG_DATA_HOME",
    "XDG_CONFIG_HOME",
)


def _env(home: Path) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in WANDB_DIR_VARS}
    path = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p)
    return {**env, "HOME": str(home), "PYTHONPATH": path, "WANDB_MODE": "offline"}


def _records(wandb_file: Path, home: Path) -> list[dict]:
    """Every record of a .wandb transaction log, as wandb's own reader prints them."""
    out = subprocess.run(
        [sys.executable, "-m", "wandb", "leet", "inspect", "--json", str(wandb_file)],
        capture_output=True,
        text=True,
        timeout=300,
        env=_env(home),
    )
    assert out.returncode == 0, out.stderr[-2000:]
    return [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]


def _history(records: list[dict]) -> list[dict]:
    return [r["history"]["item"] for r in records if r.get("type") == "history"]


@pytest.mark.slow
def test_a_killed_then_resumed_offline_run_has_every_step_once_in_one_wandb_run(tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    results = tmp_path / "results"
    run = results / "default" / "wb"
    cmd = [sys.executable, "-m", "rlcompare.cli", "train", *FAST, *OV, f"results_dir={results}"]
    proc = subprocess.Popen(
        cmd, cwd=tmp_path, env=_env(home), stdout=subprocess.DEVNULL, stderr=open(tmp_path / "killed.log", "w")
    )
    k = random.Random(18).randint(3, 6)
    t0 = time.time()
    while len(read_jsonl(run / "metrics.jsonl")) < k:
        assert proc.poll() is None and time.time() - t0 < 300, (tmp_path / "killed.log").read_text()[-2000:]
        time.sleep(0.005)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=60)
    wid = (run / "wandb_id.txt").read_text().strip()

    out = subprocess.run(
        cmd + ["resume=true"], cwd=tmp_path, env=_env(home), capture_output=True, text=True, timeout=400
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert "resuming" in out.stderr
    assert (run / "wandb_id.txt").read_text().strip() == wid

    segments = sorted(p / f"run-{wid}.wandb" for p in (run / "wandb").glob(f"offline-run-*-{wid}"))
    assert len(segments) == 2  # the killed process's and the resumed one's, both of run `wid`
    records = [_records(s, home) for s in segments]
    # the W&B service writes its log in blocks: a SIGKILL may leave the first segment short or empty
    assert [r["run"]["run_id"] for recs in records for r in recs if r.get("type") == "run"] in ([wid], [wid, wid])
    assert any(r.get("type") == "run" for r in records[-1])
    history = [h for recs in records for h in _history(recs)]
    assert [h["_step"] for h in history] == list(range(0, 9))  # every step once, in order, across both

    metrics = {r["step"]: r for r in read_jsonl(run / "metrics.jsonl")}
    evals = {r["step"]: r for r in read_jsonl(run / "eval.jsonl")}
    for h in history:
        step = h["_step"]
        if step in metrics:
            assert h["tokens/generated"] == metrics[step]["tokens/generated"], step
            assert h["sampling/rounds"] == metrics[step]["sampling/rounds"], step
        if step in evals:
            assert h["eval/accuracy"] == evals[step]["eval/accuracy"], step
    assert sorted(evals) == [0, 3, 6, 8]
    tables = [h["_step"] for h in history if any(k.split(".")[0] == "samples" for k in h)]  # the sample tables
    assert tables == [0, 3, 6, 8], [sorted(h) for h in history if h["_step"] in evals][:2]

    leftovers = sorted(str(p.relative_to(home)) for p in home.rglob("*"))
    assert leftovers == []  # W&B's cache and data folders are inside the run folder
