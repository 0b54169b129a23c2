"""Issue 41 (the third audit), the training side: crafted checkpoints are refused before anything loads, stray
folders in checkpoints/ are ignored, a refused resume leaves the run folder as it was, and the rest of the items
named in each test."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from rlcompare.config import ConfigError, validate
from rlcompare.train import checkpoint
from rlcompare.train.run import train
from rlcompare.train.tracking import read_jsonl
from tests.conftest import FAST

REPO = Path(__file__).resolve().parents[2]
# PPO: a critic and its optimizer besides the policy's; a checkpoint each step
OV = ["algorithm=ppo", "budget.max_steps=3", "trainer.checkpoint_every=1", "trainer.keep_checkpoints=3"]


def _env() -> dict:
    path = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p)
    return {**os.environ, "PYTHONPATH": path, "WANDB_MODE": "offline"}


def _cli(tmp_path: Path, *overrides: str) -> subprocess.CompletedProcess:
    """`rlcompare train` in a child process (a crash there cannot take the test process with it)."""
    cmd = [sys.executable, "-m", "rlcompare.cli", "train", *FAST, f"results_dir={tmp_path / 'results'}", *overrides]
    return subprocess.run(cmd, cwd=tmp_path, env=_env(), capture_output=True, text=True, timeout=600)


def _rewrite(step_dir: Path, change) -> None:
    f = step_dir / checkpoint.FILE
    blob = checkpoint.read_file(f)
    change(blob)
    checkpoint.write_file(blob, f)


def _cut_back(run: Path, after: int) -> None:
    """The run as a kill after step `after` leaves it (later rows and checkpoints gone, summary "running")."""
    for f in ("metrics.jsonl", "eval.jsonl", "samples.jsonl"):
        rows = [ln for ln in (run / f).read_text().splitlines(keepends=True) if json.loads(ln)["step"] <= after]
        (run / f).write_text("".join(rows))
    for c in checkpoint.candidates(run):
        if checkpoint.step_of(c) > after:
            shutil.rmtree(c)
    summary = json.loads((run / "summary.json").read_text())
    (run / "summary.json").write_text(json.dumps({**summary, "status": "running"}))


@pytest.fixture(scope="module")
def _finished(tmp_path_factory):
    """One PPO run of 3 steps with a checkpoint after each, made once; tests copy it."""
    from hydra import compose, initialize_config_dir

    from rlcompare.cli import conf_dir, register_resolvers

    root = tmp_path_factory.mktemp("audit3")
    register_resolvers()
    with initialize_config_dir(config_dir=conf_dir(), version_base=None):
        cfg = compose("config", overrides=[*FAST, f"results_dir={root / 'results'}", *OV, "run_name=base"])
    torch.set_num_threads(1)
    return Path(train(cfg)["run_dir"])


@pytest.fixture
def interrupted(_finished, tmp_path):
    """A copy of the finished run under tmp_path/results/default/base, cut back to step 2."""
    run = tmp_path / "results" / "default" / "base"
    shutil.copytree(_finished, run)
    _cut_back(run, after=2)
    return run


def _shorten_exp_avg(blob: dict) -> None:
    state = blob["opt"]["state"]
    first = min(state)
    state[first]["exp_avg"] = state[first]["exp_avg"].flatten()[:3].clone()


# ----------------------------------------------------------------------------- item 1: crafted optimizer state
def test_a_shortened_optimizer_moment_is_refused_before_anything_loads(interrupted, tmp_path):
    for c in checkpoint.candidates(interrupted):
        _rewrite(c, _shorten_exp_avg)
    summary_before = (interrupted / "summary.json").read_text()
    rows_before = read_jsonl(interrupted / "metrics.jsonl")
    res = _cli(tmp_path, *OV, "run_name=base", "resume=true")
    assert res.returncode == 2, res.stderr[-2000:]
    errors = [ln for ln in res.stderr.splitlines() if ln.startswith("rlcompare: config error")]
    assert len(errors) == 1 and "exp_avg is (3,)" in errors[0] and "does not fit this run" in errors[0], errors
    assert "Traceback" not in res.stderr
    assert read_jsonl(interrupted / "metrics.jsonl") == rows_before  # nothing dropped
    assert (interrupted / "summary.json").read_text() == summary_before  # item 18: left as it was


@pytest.mark.parametrize(
    "change, why",
    [
        (
            lambda b: b["critic_opt"]["state"][0].update(exp_avg_sq=b["critic_opt"]["state"][0]["exp_avg_sq"][:1]),
            r"critic optimizer state of parameter 0: exp_avg_sq is",
        ),
        (
            lambda b: b["opt"]["state"][0].update(exp_avg=b["opt"]["state"][0]["exp_avg"].double()),
            r"exp_avg is .* torch.float64, the parameter is",
        ),
        (lambda b: b["opt"]["state"][0].update(step=torch.tensor([1.0, 2.0])), r"`step` is not a finite scalar"),
        (lambda b: b["opt"]["state"][0].pop("exp_avg_sq"), r"holds \['exp_avg', 'step'\]"),
        (lambda b: b["opt"]["state"].update({10_000: b["opt"]["state"][0]}), r"parameter 10000, which this run"),
        (lambda b: b["opt"]["param_groups"][0].update(params=[0]), r"parameter groups"),
        (lambda b: b["critic"].update({k: v[:1] for k, v in list(b["critic"].items())[:1]}), r"critic weight"),
    ],
)
def test_every_optimizer_and_model_tensor_is_checked_against_its_parameter(compose, interrupted, change, why):
    ckpt = checkpoint.latest(interrupted)
    _rewrite(ckpt, change)
    blob = checkpoint.read(ckpt)
    from rlcompare.train.trainer import Trainer

    tr = Trainer(validate(compose(*OV, "run_name=base")), interrupted)
    before = [p.detach().clone() for p in tr.policy.model.parameters()]
    with pytest.raises(checkpoint.CheckpointError, match=why):
        checkpoint.load(tr, ckpt, blob)
    assert all(torch.equal(a, p) for a, p in zip(before, tr.policy.model.parameters()))  # nothing was loaded


def test_a_non_finite_weight_in_a_checkpoint_is_refused_when_read(interrupted):
    ckpt = checkpoint.latest(interrupted)
    name = next(iter(checkpoint.read_file(ckpt / checkpoint.FILE)["policy"]))

    def poison(b):
        b["policy"][name] = b["policy"][name].clone()
        b["policy"][name].view(-1)[0] = float("nan")

    _rewrite(ckpt, poison)
    with pytest.raises(checkpoint.CheckpointError, match="its policy tensors .not all finite. is malformed"):
        checkpoint.read(ckpt)


# ----------------------------------------------------------------------------- item 8: stray folders, counters
def test_a_bak_copy_in_checkpoints_is_neither_read_nor_kept_over_real_checkpoints(compose, interrupted):
    shutil.copytree(checkpoint.latest(interrupted), interrupted / "checkpoints" / "step_00000002.bak")
    (interrupted / "checkpoints" / "step_notes").mkdir()
    assert [c.name for c in checkpoint.candidates(interrupted)] == ["step_00000002", "step_00000001"]
    s = train(compose(*OV, "run_name=base", "resume=true", "trainer.keep_checkpoints=1"))
    assert s["status"] == "completed" and s["steps"] == 3
    left = sorted(p.name for p in (interrupted / "checkpoints").iterdir())
    assert left == ["step_00000002.bak", "step_00000003", "step_notes"]  # rotation deleted only real ones


@pytest.mark.parametrize(
    "counters, what",
    [
        ({"tokens": 10**40}, "counters disagree with metrics.jsonl"),
        ({"tokens": 1}, "counters disagree with metrics.jsonl"),
        ({"skipped_updates": 7}, "trainer state is malformed"),
        ({"elapsed": -1.0}, "trainer state is malformed"),
        ({"eval_best": 3.5}, "trainer state is malformed"),
    ],
)
def test_counters_out_of_range_or_against_the_rows_are_refused(compose, interrupted, counters, what):
    for c in checkpoint.candidates(interrupted):
        _rewrite(c, lambda b: b["state"].update(counters))
    rows = read_jsonl(interrupted / "metrics.jsonl")
    with pytest.raises(ConfigError, match=f"none of the checkpoints .*{what}"):
        train(compose(*OV, "run_name=base", "resume=true"))
    assert read_jsonl(interrupted / "metrics.jsonl") == rows


def test_a_checkpoint_claiming_step_minus_one_deletes_no_rows(compose, interrupted):
    crafted = interrupted / "checkpoints" / "step_-0000001"
    shutil.copytree(checkpoint.latest(interrupted), crafted)
    _rewrite(crafted, lambda b: (b.update(step=-1), b["state"].update(step=-1)))
    for name in ("step_00000001", "step_00000002"):
        shutil.rmtree(interrupted / "checkpoints" / name)
    assert checkpoint.candidates(interrupted) == []  # not a checkpoint name: never read
    # no checkpoint: the run restarts from step 0 and writes steps 1..3 once each (a step -1 would write from 0)
    s = train(compose(*OV, "run_name=base", "resume=true"))
    assert s["steps"] == 3 and [r["step"] for r in read_jsonl(interrupted / "metrics.jsonl")] == [1, 2, 3]


def test_a_step_zero_checkpoint_is_refused(interrupted):
    crafted = interrupted / "checkpoints" / "step_00000000"
    shutil.copytree(checkpoint.latest(interrupted), crafted)
    _rewrite(crafted, lambda b: (b.update(step=0), b["state"].update(step=0)))
    with pytest.raises(checkpoint.CheckpointError, match="trainer state is malformed"):
        checkpoint.read(crafted)


# ----------------------------------------------------------------------------- item 18
def test_a_refused_resume_leaves_summary_and_config_as_they_were(compose, interrupted):
    name = next(iter(checkpoint.read_file(checkpoint.latest(interrupted) / checkpoint.FILE)["policy"]))
    for c in checkpoint.candidates(interrupted):
        _rewrite(c, lambda b: b["policy"].update({name: torch.zeros(3, 3)}))
    before = {f: (interrupted / f).read_text() for f in ("summary.json", "config.yaml")}
    with pytest.raises(ConfigError, match="does not fit this run"):
        train(compose(*OV, "run_name=base", "resume=true"))
    assert json.loads(before["summary.json"])["status"] == "running"
    assert {f: (interrupted / f).read_text() for f in before} == before
