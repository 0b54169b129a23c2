"""Environments at their edges through `rlcompare train` (#62): env=calc whose turns cannot hold a tool call is
refused before anything heavy; an environment that gives no verdict is counted by its reward; a hanging
environment's tool processes do not outlive the run (`rlcompare train ... | tee log` used to hang on them)."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import pytest

from rlcompare.train.run import train
from rlcompare.train.tracking import read_jsonl

from test_reliability import _cli, _env, _summary


@pytest.mark.slow  # over ~2.5 s on 2 idle cores: out of the quick subset (issue 63), in CI's whole suite
def test_calc_whose_turns_cannot_hold_a_tool_call_is_refused_by_the_cli_before_the_run_folder(tmp_path):
    argv = _cli("env=calc", "prompts=chain_calc", "budget=tiny", f"results_dir={tmp_path / 'results'}", base=[])
    done = subprocess.run(argv, cwd=tmp_path, env=_env(), capture_output=True, text=True, timeout=300)
    assert done.returncode != 0
    assert done.stderr.strip().splitlines()[-1] == (
        "rlcompare: config error: budget.max_new_tokens=6: env=calc's shortest tool call '<calc>1+1</calc>' is 16 "
        "tokens of this model's tokenizer, so no policy turn could call the tool and the run would train "
        "single-turn; raise budget.max_new_tokens to at least 16 (budget=lab, prompts=chain_calc's, gives 48)"
    )
    assert not (tmp_path / "results").exists()  # refused before the run folder, the warm start or the model


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["budget.max_new_tokens=24", "eval.max_new_tokens=8"], "eval.max_new_tokens=8: env=calc's shortest"),
        (["budget.max_new_tokens=16", "env.max_tokens=18"], "env.max_tokens=18: an episode of env=calc must hold"),
        (["budget.max_new_tokens=24", "env.stop=[]"], "env.stop=[]: env=calc reads a tool call at the end"),
        (["budget.max_new_tokens=16", "env.max_tokens=19"], None),  # the call (16), its answer "2\n" and one more
    ],
)
def test_calc_turns_and_episodes_must_hold_a_call_its_answer_and_the_stop(compose, overrides, message):
    from rlcompare.config import ConfigError, validate
    from rlcompare.train.env_room import check_env_room

    if message is None:
        check_env_room(validate(compose("env=calc", "prompts=chain_calc", *overrides)))
        return
    with pytest.raises(ConfigError) as e:  # the stop calc declares: the config check's; the room: the tokenizer's
        check_env_room(validate(compose("env=calc", "prompts=chain_calc", *overrides)))
    assert str(e.value).startswith(message)


@pytest.mark.slow  # over ~1.5 s on 2 idle cores: out of the quick subset (issue 63), in CI's whole suite
def test_an_environment_without_a_verdict_is_counted_by_its_reward(compose):
    # reward 1 on every episode and no info["correct"]: every episode is correct (at 6c29db8: accuracy 0.0)
    cfg = compose("env.name=custom", "env.target=tests.envs.hostile_envs:Unsaid", "budget.max_steps=1", "run_name=u")
    rows = read_jsonl(Path(train(cfg)["run_dir"]) / "metrics.jsonl")
    assert rows[0]["reward/mean"] == 1.0 and rows[0]["accuracy/train"] == 1.0 and rows[0]["env/ends/done"] == 16


@pytest.mark.slow
def test_a_hanging_environments_tool_processes_do_not_hold_the_runs_output_open(tmp_path):
    """The run's stdout and stderr are pipes (as under `| tee`): they must close when the run ends, though every
    step of the environment started a tool process inheriting them and then hung."""
    argv = _cli(
        "env.name=custom",
        "env.target=tests.envs.hostile_envs:HangingTool",
        "budget.max_steps=1",
        "trainer.eval_every=1000",  # the held-out eval's episodes would only hang the same way
        "verifier.timeout_s=0.3",
        f"results_dir={tmp_path / 'results'}",
        "run_name=hang",
    )
    t0 = time.monotonic()
    # capture_output reads both pipes to their end: a tool process still holding one makes this time out
    done = subprocess.run(argv, cwd=tmp_path, env=_env(WANDB_MODE="offline"), capture_output=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    rows = read_jsonl(tmp_path / "results" / "default" / "hang" / "metrics.jsonl")
    assert rows[0]["env/errors/timeout"] == 16
    assert _summary(tmp_path / "results" / "default" / "hang")["status"] == "completed"
    assert time.monotonic() - t0 < 290
