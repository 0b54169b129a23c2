"""Bounded staleness (issue 44): `rollout.staleness=k` trains step t on the rollout that step t-k's weights sampled
(the first k on rollouts of the initial weights), the behaviour log-probs are the sampler's, the queue survives a
kill and resume exactly, a tampered queue is refused, and it is a sweep component of its own."""

from __future__ import annotations

import copy
import signal
import subprocess
from pathlib import Path

import pytest
import torch

from rlcompare.config import ConfigError, validate
from rlcompare.sweep import COMPONENTS
from rlcompare.train import checkpoint
from rlcompare.train.run import train
from rlcompare.train.trainer import Trainer
from rlcompare.train.tracking import read_jsonl
from tests.train.test_reliability import _assert_same_as, _cli, _env, _start, _summary, _wait_rows

STALE = ["rollout.staleness=2", "budget.max_steps=5", "trainer.warmup_steps=0"]


@pytest.mark.slow  # over ~1.5 s on 2 idle cores: out of the quick subset (issue 63), in CI's whole suite
def test_the_metric_counts_the_updates_between_sampling_and_training(compose):
    # k = 2: step 1 samples three rollouts with the initial weights and trains on the first (0 updates old); steps 2
    # and 3 train on the other two (1 and 2 updates old); from step 4 on, each trains on the rollout step t - 2
    # sampled (2 updates old)
    out = train(compose(*STALE, "run_name=k2"))
    rows = read_jsonl(Path(out["run_dir"]) / "metrics.jsonl")
    assert [r["offpolicy/staleness"] for r in rows] == [0, 1, 2, 2, 2]


def test_staleness_zero_logs_nothing_new(compose, tmp_path):
    out = train(compose("budget.max_steps=2", "run_name=k0"))
    rows = read_jsonl(Path(out["run_dir"]) / "metrics.jsonl")
    assert not any(k.startswith("offpolicy/") for r in rows for k in r)


def test_the_batch_trained_at_step_t_was_sampled_by_step_t_minus_k_weights(compose, tmp_path):
    # the behaviour log-probs of the batch trained at step 4 are those of the weights step 2 started with (after one
    # update), recomputed here from a snapshot; not those of the weights step 4 starts with
    tr = Trainer(validate(compose(*STALE, "rollout.streams=group")), tmp_path / "run")
    snapshots, trained = {}, {}
    real_update = tr.update

    def update(batch, targets, old_logp):
        trained[tr.state.step] = batch
        return real_update(batch, targets, old_logp)

    tr.update = update
    for _ in range(4):
        snapshots[tr.state.step + 1] = copy.deepcopy(tr.policy.model.state_dict())  # the weights step t starts with
        tr.step()
    batch = trained[4]

    def logp_under(weights):
        tr.policy.model.load_state_dict(weights)
        return tr.targets.recompute_logp(batch)

    mask = batch.completions.mask.bool()
    behaviour = batch.completions.logp[mask]
    assert torch.allclose(logp_under(snapshots[2])[mask], behaviour, atol=1e-5)
    assert not torch.allclose(logp_under(snapshots[4])[mask], behaviour, atol=1e-3)  # the weights did move


def test_the_update_reads_the_samplers_log_probs_as_the_old_ones(compose, tmp_path):
    # one update per batch is on-policy at k = 0 (old = current, detached: None); with k > 0 the ratio's denominator
    # is the behaviour policy's, which only the sampler has
    tr = Trainer(validate(compose("rollout.staleness=1")), tmp_path / "run")
    collected, _ = tr.rollout_to_train()
    b = collected.batch
    assert b.completions.logp is not None
    assert tr.targets.old_logp(b, tr.targets.advantages(b), {}) is b.completions.logp


@pytest.mark.slow
def test_sigkill_then_resume_equals_an_uninterrupted_stale_run(compose, tmp_path):
    stale = ["algorithm=dapo", "rollout.staleness=2", "budget.max_steps=6", "trainer.checkpoint_every=2"]
    results = tmp_path / "results"
    run = results / "default" / "killed"
    proc = _start(tmp_path, *stale, "run_name=killed", f"results_dir={results}", log="killed.log")
    _wait_rows(proc, run / "metrics.jsonl", 3)  # a checkpoint at step 2 holds a queue of two rollouts
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=60)
    out = subprocess.run(
        _cli(*stale, "run_name=killed", f"results_dir={results}", "resume=true"),
        cwd=tmp_path,
        env=_env(WANDB_MODE="offline"),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert _summary(run)["status"] == "completed"
    ref = train(compose(*stale, "run_name=ref"))
    _assert_same_as(run, Path(ref["run_dir"]), 6)


@pytest.mark.slow  # over ~1.5 s on 2 idle cores: out of the quick subset (issue 63), in CI's whole suite
def test_a_checkpoint_with_a_tampered_queue_is_refused(compose, tmp_path):
    out = train(compose(*STALE, "trainer.checkpoint_every=1", "budget.max_steps=1", "run_name=t"))
    path = checkpoint.latest(Path(out["run_dir"]))
    blob = checkpoint.read(path)
    assert len(blob["pending"]) == 2  # k = 2: two rollouts wait after step 1
    tr = Trainer(validate(compose(*STALE, "run_name=t2")), tmp_path / "t2")
    for tamper in (
        lambda b: b["pending"][0]["batch"].update(ids=b["pending"][0]["batch"]["ids"][:, :1]),  # mask's width differs
        lambda b: b["pending"][0]["batch"].update(prompts=[10**9]),  # no such prompt
        lambda b: b["pending"][1].update(sampled_at=-1),
        lambda b: b.update(pending=b["pending"] * 2),  # more than k rollouts
    ):
        bad = copy.deepcopy(blob)
        tamper(bad)
        with pytest.raises(checkpoint.CheckpointError, match="rollout queue"):
            checkpoint.load(tr, path, bad)


def test_staleness_is_a_component_and_a_negative_one_is_refused(compose):
    assert COMPONENTS["staleness"] == ("rollout.staleness",)
    with pytest.raises(ConfigError, match=r"rollout\.staleness=-1 must be >= 0"):
        validate(compose("rollout.staleness=-1"))


def test_a_staleness_past_the_bound_is_refused_before_sampling_anything(compose):
    # 10**6 sampled rollouts ahead for hours before the first update, ignoring SIGTERM (the step in flight)
    validate(compose("rollout.staleness=256"))
    with pytest.raises(ConfigError, match=r"rollout\.staleness=1000000 must be <= 256 .*k \+ 1 rollouts ahead"):
        validate(compose("rollout.staleness=1000000"))
