"""`rlcompare train rollout.engine=vllm` end to end on the CPU build: 3 steps through the real CLI (its own process:
one vLLM engine per process), the weight push timed in every row, the mismatch correction fed vLLM's log-probs,
the eval sampled by the same engine; then a resume from step 2's checkpoint pushes the loaded weights first and
samples step 3 again as the uninterrupted run did."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("vllm", reason="rollout.engine=vllm needs the [vllm] extra")

from rlcompare.results import read_jsonl  # noqa: E402
from rlcompare.rollout.vllm_log import NOTE  # noqa: E402
from rlcompare.train.trainer import TIMING_PREFIXES  # noqa: E402
from tests.conftest import FAST  # noqa: E402
from tests.train.test_resume_cli import _cut_back  # noqa: E402

pytestmark = pytest.mark.vllm
REPO = Path(__file__).resolve().parents[2]


def _train(tmp_path, *overrides) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO), "WANDB_MODE": "offline"}
    args = [sys.executable, "-m", "rlcompare.cli", "train", *FAST, f"results_dir={tmp_path / 'results'}", *overrides]
    return subprocess.run(args, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=500)


def _no_timing(rows: list[dict]) -> list[dict]:
    return [{k: v for k, v in r.items() if not k.startswith(TIMING_PREFIXES)} for r in rows]


def test_a_vllm_run_pushes_weights_every_step_and_resumes_onto_them(tmp_path):
    common = [
        "rollout.engine=vllm",
        "run_name=v",
        "budget.max_steps=3",
        "trainer.checkpoint_every=1",
        "trainer.recompute_old_logp=true",
        "algorithm.mismatch.mode=token-truncate",  # reads the sampler's (vLLM's) log-probs against the trainer's
    ]
    first = _train(tmp_path, *common)
    assert first.returncode == 0, first.stderr[-3000:]
    # vLLM's known-harmless messages hidden with one note (rlcompare.rollout.vllm_log): no "Failed to load weights"
    # twice a push, no chat-warmup traceback; of its own lines (on stdout) one warning is left (the in-process seed)
    log = first.stdout + first.stderr
    assert "Failed to load weights" not in log and "Traceback" not in log, log[-3000:]
    assert log.count(NOTE) == 1 and log.count("(MainProcess pid=") <= 2, log[-3000:]
    run = tmp_path / "results" / "default" / "v"
    rows = read_jsonl(run / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2, 3]
    for r in rows:
        assert r["perf/weight_sync_s"] > 0  # an update every step, so a push every step
        # same weights, two engines: vLLM's log-probs are the trainer's recomputed ones up to float32 rounding
        # (tests/rollout_vllm/test_vllm_engine.py's LOGP_TOL); a log-prob off by a position or a temperature is off by > 1e-2
        assert 0 <= r["mismatch/logp_gap_max"] < 1e-4
    assert [e["step"] for e in read_jsonl(run / "eval.jsonl")] == [0, 2, 3]  # greedy eval through the same engine
    _cut_back(run, 2)
    again = _train(tmp_path, *common, f"resume={run}")
    assert again.returncode == 0, again.stderr[-3000:]
    assert "the checkpoint's weights pushed to vLLM in" in again.stderr
    # step 3 sampled by the checkpoint's weights (the engine would otherwise hold the warm start's) from the
    # restored generator's seeds: the uninterrupted run's row
    assert _no_timing(read_jsonl(run / "metrics.jsonl")) == _no_timing(rows)
    assert json.loads((run / "summary.json").read_text())["status"] == "completed"
