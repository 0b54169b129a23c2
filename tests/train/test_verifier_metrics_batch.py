"""The verifier's declared metrics ride with the rollout batch (#64): dynamic sampling's selection and joined
rounds keep each row's values, a queued rollout (rollout.staleness) keeps them through a checkpoint, where a
malformed table is refused, and over 2 ranks the row holds what one process's does."""

from __future__ import annotations

import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from rlcompare.results import read_jsonl
from rlcompare.rollout import Completions
from rlcompare.train.batch import Collected, RolloutBatch
from rlcompare.train.stale_queue import Queued, StaleQueue

G = 2
REPO = Path(__file__).resolve().parents[2]


def _batch(metrics: torch.Tensor, prompts: list) -> RolloutBatch:
    B = len(metrics)
    c = Completions(
        torch.ones(B, 3, dtype=torch.long),
        torch.ones(B, 3, dtype=torch.long),
        None,
        torch.zeros(B, dtype=torch.bool),
        torch.full((B,), 3, dtype=torch.long),
    )
    ids = torch.ones(B, 2, dtype=torch.long)
    r = torch.zeros(B)
    return RolloutBatch(ids, ids.clone(), c, r, r.clone(), torch.zeros(B, dtype=torch.bool), prompts, None, metrics)


def test_selection_and_joined_rounds_keep_each_rows_metrics():
    m = torch.tensor([[1.0, math.nan], [2.0, 0.5], [3.0, math.nan], [4.0, 1.5]])
    b = _batch(m, ["p0", "p1"])
    kept = b.select(torch.tensor([False, False, True, True]), G)  # the second group
    assert torch.allclose(kept.verifier_metrics, m[2:], equal_nan=True)
    both = RolloutBatch.concat([kept, b.select(torch.tensor([True, True, False, False]), G)], pad_id=0)
    assert torch.allclose(both.verifier_metrics, torch.cat([m[2:], m[:2]]), equal_nan=True)


def test_a_queued_rollout_keeps_its_metrics_and_a_malformed_table_is_refused():
    prompts = ["p0", "p1"]
    m = torch.tensor([[1.0], [math.nan], [3.0], [4.0]])
    q = StaleQueue(1)
    q.push(Queued(Collected(_batch(m, prompts), 1, 2, 0, 12, 0.1, 0.2), 1, None))
    saved = q.state(prompts)
    back = StaleQueue(1)
    back.load(saved, prompts, G, "cpu")
    assert torch.allclose(back.pending[0].collected.batch.verifier_metrics, m, equal_nan=True)
    saved[0]["batch"]["verifier_metrics"] = m[:3]  # a row short
    with pytest.raises(ValueError, match="verifier metrics"):
        StaleQueue(1).load(saved, prompts, G, "cpu")


@pytest.mark.slow  # two runs of two steps, one over 2 gloo ranks: a few minutes under load
def test_two_ranks_report_the_verifiers_metrics_one_process_does(tmp_path):
    """Each rank scores its share of the groups and the shares are gathered (collect.gather_round): the row's
    verifier/<component> means are the whole batch's. By hand: reward = 1 x exact_match + 0.5 x format."""
    mix = "+verifier.components=[{name: exact_match, weight: 1.0}, {name: format, weight: 0.5, pattern: '^[0-9]+$'}]"
    args = ["budget=tiny", "logger=none", "trainer.progress=false", "model.warm_start.steps=300", "prompts.n_eval=4"]
    args += ["trainer.prompts_per_step=3", "trainer.group_size=4", "trainer.eval_every=1000", "trainer.threads=1"]
    args += ["trainer.unhealthy=warn", "rollout.streams=group", "budget.max_steps=2", "verifier.name=weighted", mix]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TMPDIR": str(tmp_path)}
    launch = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"]
    rows = {}
    for name, prefix in (("two", launch), ("one", [sys.executable])):
        cmd = prefix + ["-m", "rlcompare.cli", "train", *args, f"results_dir={tmp_path}", f"run_name={name}"]
        out = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
        assert out.returncode == 0, out.stderr[-3000:]
        rows[name] = read_jsonl(tmp_path / "default" / name / "metrics.jsonl")
    for two, one in zip(rows["two"], rows["one"], strict=True):
        keys = ("verifier/exact_match", "verifier/format", "reward/mean", "accuracy/train")
        assert [two[k] for k in keys] == pytest.approx([one[k] for k in keys], abs=1e-6)
        assert two["reward/mean"] == pytest.approx(two["verifier/exact_match"] + 0.5 * two["verifier/format"], abs=1e-6)
        assert two["verifier/exact_match"] == pytest.approx(two["accuracy/train"], abs=1e-6)  # the first's correct
