"""Runs with an environment (#51): bad settings refused before anything heavy, the episodes' metrics, a lying
environment that never stops the run, and SIGKILL then resume of a multi-turn run equal to the uninterrupted one."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest
import torch

from rlcompare.config import ConfigError, validate
from rlcompare.train.run import train
from rlcompare.train.tracking import read_jsonl

from test_reliability import _assert_same_as, _cli, _finish, _start, _summary, _wait_rows

ENV = ["env=feedback", "budget.max_steps=2"]


@pytest.mark.parametrize(
    "overrides, key",
    [
        (["env.max_turns=0"], "env.max_turns"),
        (["env.reward=mean"], "env.reward"),
        (["env.max_tokens=60"], "env.max_tokens"),  # 16 prompt + 60 > the tiny model's 64 positions
        (["env.max_tokens=4"], "env.max_tokens"),  # below budget.max_new_tokens (6): no full turn fits
        (["env.name=custom"], "env.target"),
        (["env.name=custom", "env.target=tests.envs.hostile_envs:Nowhere"], "env.target"),
        (["env.target=x:y"], "env.target"),
        (["env.stop=[3]"], "env.stop"),
        (["env.name=chat"], "env.name"),
    ],
)
def test_bad_env_settings_are_refused_naming_the_key_before_the_run_folder(compose, tmp_path, overrides, key):
    cfg = compose("env=feedback", *overrides, "run_name=bad")
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        train(cfg)
    assert not (tmp_path / "results" / "default" / "bad").exists()


@pytest.mark.slow  # tens of seconds under load (issue 63: -m 'not slow' under 5 min)
def test_the_default_is_single_turn_and_keeps_its_fingerprint(compose):
    cfg = validate(compose())
    assert cfg.env.name == "none"
    out = train(compose("budget.max_steps=1", "run_name=st"))
    fp = (Path(out["run_dir"]) / "fingerprint.json").read_text()
    assert '"env"' not in fp
    assert "tokens/env" not in read_jsonl(Path(out["run_dir"]) / "metrics.jsonl")[0]


@pytest.mark.slow  # tens of seconds under load (issue 63: -m 'not slow' under 5 min)
def test_an_env_run_logs_its_episodes(compose):
    out = train(compose(*ENV, "run_name=fb"))
    run = Path(out["run_dir"])
    rows = read_jsonl(run / "metrics.jsonl")
    B = 4 * 4  # FAST: 4 prompts x 4 episodes
    for r in rows:
        assert r["tokens/env"] > 0 and 1 <= r["env/turns_mean"] <= 3
        assert sum(r[f"env/ends/{k}"] for k in ("done", "max_turns", "budget")) + r["env/errors"] == B
        assert r["env/errors"] == 0
    assert '"env"' in (run / "fingerprint.json").read_text()


@pytest.mark.slow  # over ~1.5 s on 2 idle cores: out of the quick subset (issue 63), in CI's whole suite
def test_a_nan_reward_environment_ends_its_episodes_not_the_run(compose):
    out = train(compose(*ENV, "env.name=custom", "env.target=tests.envs.hostile_envs:NanReward", "run_name=nan"))
    rows = read_jsonl(Path(out["run_dir"]) / "metrics.jsonl")
    assert len(rows) == 2 and all(r["env/errors/nan_reward"] == 16 for r in rows)
    assert _summary(Path(out["run_dir"]))["status"] == "completed"


KILL = ["env=feedback", "budget.max_steps=6", "trainer.checkpoint_every=2", "trainer.eval_every=3"]


@pytest.mark.slow
def test_sigkill_mid_multi_turn_run_then_resume_equals_the_uninterrupted_run(compose, tmp_path):
    results = tmp_path / "results"
    run = results / "default" / "killed"
    proc = _start(tmp_path, *KILL, "run_name=killed", f"results_dir={results}", log="killed.log")
    _wait_rows(proc, run / "metrics.jsonl", 3)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=60)
    assert len(read_jsonl(run / "metrics.jsonl")) < 6
    out = _finish(
        _cli(*KILL, "run_name=killed", f"results_dir={results}", "resume=true"), tmp_path, WANDB_MODE="offline"
    )
    assert out.returncode == 0, out.stderr[-3000:]
    ref = train(compose(*KILL, "run_name=ref"))
    _assert_same_as(run, Path(ref["run_dir"]), 6)


@pytest.mark.parametrize(
    "overrides",
    [
        ["algorithm=ppo", "algorithm.kl.coef=0.05"],  # critic, GAE across the holes, a reference model
        ["algorithm=dapo"],  # dynamic sampling refills, overlong filter, token-mean
        ["rollout.staleness=1", "algorithm.off_policy.correction=decoupled", "trainer.recompute_old_logp=true"],
        ["rollout.streams=group", "algorithm=drgrpo"],  # per-episode streams for later turns; seq-mean-token-sum-norm
    ],
    ids=["ppo", "dapo", "stale", "group_streams"],
)
@pytest.mark.slow  # tens of seconds under load (issue 63: -m 'not slow' under 5 min)
def test_env_runs_through_every_kind_of_update(compose, overrides):
    out = train(compose(*ENV, *overrides, "run_name=kinds"))
    rows = read_jsonl(Path(out["run_dir"]) / "metrics.jsonl")
    assert len(rows) == 2 and all(r["optim/nonfinite"] == 0 for r in rows)
    assert all(r["tokens/env"] >= 0 for r in rows)


def test_dapo_soft_overlong_reads_an_episode_against_env_max_tokens():
    """An episode is cut at env.max_tokens after the prompt (policy and environment tokens): DAPO's Eq. 13 reads
    it there. 5 policy + 3 environment tokens, L_max = env.max_tokens = 10, L_cache = 4: 8 > 10 - 4, so the
    penalty is (6 - 8) / 4 = -0.5. Counting the policy's 5 against budget.max_new_tokens = 10 would give 0."""
    from types import SimpleNamespace

    from rlcompare.algos import losses
    from rlcompare.rollout.sampler import Completions
    from rlcompare.train.env_rollout import overlong_lengths

    mask = torch.tensor([[1, 1, 1, 1, 1, 1, 1, 1, 0, 0]])
    env_mask = torch.tensor([[0, 0, 1, 1, 1, 0, 0, 0, 0, 0]])
    ep = Completions(mask.clone(), mask, None, torch.tensor([False]), torch.tensor([5]), env_mask=env_mask)
    cfg = SimpleNamespace(budget=SimpleNamespace(max_new_tokens=10), env=SimpleNamespace(max_tokens=10))
    lengths, max_len = overlong_lengths(ep, cfg)
    assert lengths.tolist() == [8] and max_len == 10
    assert losses.overlong_penalty(lengths, max_len=max_len, cache_len=4).tolist() == [-0.5]
    single = Completions(mask.clone(), mask, None, torch.tensor([False]), torch.tensor([8]))
    assert overlong_lengths(single, cfg)[0].tolist() == [8]  # single-turn: its own length, budget.max_new_tokens
    assert overlong_lengths(single, SimpleNamespace(budget=SimpleNamespace(max_new_tokens=16), env=None))[1] == 16
