"""`rlcompare train`: composition of every preset, end-to-end runs, results layout, determinism, W&B offline."""

from __future__ import annotations

import re

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from rlcompare.config import validate
from rlcompare.train.run import train
from rlcompare.train.tracking import read_jsonl
from rlcompare.train.trainer import TIMING_PREFIXES  # what varies with the machine, not the run

PRESETS = ["ppo", "grpo", "drgrpo", "dapo", "gspo", "dhpo", "rloo"]
REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("preset", PRESETS)
def test_every_preset_composes_with_every_default_group(compose, preset):
    cfg = validate(compose(f"algorithm={preset}", fast=False))
    assert cfg.algorithm.name == preset
    assert cfg.model.kind == "tiny" and cfg.prompts.name == "arithmetic"
    assert cfg.verifier.name == "exact_match" and cfg.budget.name == "smoke" and cfg.logger.name == "wandb"
    assert cfg.logger.mode == "offline"


@pytest.mark.parametrize("preset", PRESETS)
@pytest.mark.slow  # over ~1.5 s on 2 idle cores: out of the quick subset (issue 63), in CI's whole suite
def test_each_preset_trains_end_to_end(compose, preset):
    s = train(compose(f"algorithm={preset}", "trainer.updates_per_rollout=2", f"run_name={preset}"))
    assert s["status"] == "completed" and s["steps"] == 3
    run = Path(s["run_dir"])
    rows = read_jsonl(run / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2, 3]
    # cumulative generated tokens strictly increase and add up the per-step counts
    assert [r["tokens/generated"] for r in rows] == [sum(x["tokens/step"] for x in rows[: i + 1]) for i in range(3)]
    for key in (
        "objective/per_token",
        "objective/per_response",
        "clip/frac_low",
        "ratio/mean",
        "policy/entropy",
        "time/step_s",
    ):
        assert key in rows[-1]
    if preset == "ppo":
        assert rows[-1]["loss/value"] is not None
    evals = read_jsonl(run / "eval.jsonl")
    assert evals[0]["step"] == 0 and evals[-1]["step"] == 3 and evals[0]["eval/n"] == 16
    fp = json.loads((run / "fingerprint.json").read_text())
    assert fp["init_weights_hash"] and fp["prompts"]["data_seed"] == 0 and fp["sampling"]["group_size"] == 4
    assert OmegaConf.load(run / "config.yaml").algorithm.name == preset


@pytest.mark.slow  # over ~1.5 s on 2 idle cores: out of the quick subset (issue 63), in CI's whole suite
def test_off_policy_updates_clip_tokens(compose):
    """With several optimizer steps per rollout batch, ratios leave 1 and some tokens are clipped."""
    # a reward that varies within most groups even for a barely trained model: answers starting with 0-4
    # (every step clipped some tokens at seeds 0-3 except one or two steps per seed)
    s = train(
        compose(
            "algorithm=grpo",
            "trainer.updates_per_rollout=4",
            "trainer.lr=3e-3",
            "run_name=offpolicy",
            "verifier=format",
            "verifier.pattern='^[0-4]'",
        )
    )
    rows = read_jsonl(Path(s["run_dir"]) / "metrics.jsonl")
    assert max(r["ratio/max"] for r in rows) > 1.0 + 1e-4
    assert any(r["clip/frac_low"] + r["clip/frac_high"] > 0 for r in rows)


@pytest.mark.slow  # tens of seconds under load (issue 63: -m 'not slow' under 5 min)
def test_same_config_and_seed_give_identical_metrics(compose):
    runs = [train(compose("algorithm=dapo", f"run_name=det{i}", "trainer.updates_per_rollout=2")) for i in range(2)]
    other = train(compose("algorithm=dapo", "run_name=det_seed1", "seed=1", "trainer.updates_per_rollout=2"))

    def rows(s):
        return [
            {k: v for k, v in r.items() if not k.startswith(TIMING_PREFIXES)}
            for r in read_jsonl(Path(s["run_dir"]) / "metrics.jsonl")
        ]

    assert rows(runs[0]) == rows(runs[1])
    assert rows(runs[0]) != rows(other)


def test_token_budget_stops_the_run(compose):
    s = train(compose("budget.max_steps=null", "budget.total_tokens=60", "run_name=budget"))
    rows = read_jsonl(Path(s["run_dir"]) / "metrics.jsonl")
    assert rows[-1]["tokens/generated"] >= 60 and rows[-2]["tokens/generated"] < 60 if len(rows) > 1 else True


@pytest.mark.slow  # over ~1.5 s on 2 idle cores: out of the quick subset (issue 63), in CI's whole suite
def test_occupied_run_folder_is_refused(compose):
    train(compose("run_name=taken"))
    from rlcompare.config import ConfigError

    with pytest.raises(ConfigError, match="resume=true"):
        train(compose("run_name=taken"))


@pytest.mark.slow  # over ~2.5 s on 2 idle cores: out of the quick subset (issue 63), in CI's whole suite
def test_wandb_offline_run_reads_back_with_wandb_tools(compose, tmp_path):
    s = train(compose("logger=wandb", "logger.mode=offline", "run_name=wb"))
    run_dirs = list((Path(s["run_dir"]) / "wandb").glob("offline-run-*"))
    assert len(run_dirs) == 1
    out = subprocess.run(
        [str(Path(sys.executable).with_name("wandb")), "leet", "inspect", "--summary", "--json", str(run_dirs[0])],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    summary = json.loads(out.stdout)
    flat = json.dumps(summary)
    assert "eval/accuracy" in flat and "reward/mean" in flat and "tokens/generated" in flat


@pytest.mark.slow
def test_cli_single_run_lands_in_results_and_leaves_no_stray_folders(tmp_path):
    env = {**os.environ, "RLCOMPARE_CACHE": os.environ["RLCOMPARE_CACHE"], "WANDB_MODE": "offline"}
    cmd = [
        sys.executable,
        "-m",
        "rlcompare.cli",
        "train",
        "budget=tiny",
        "model.warm_start.steps=20",
        "prompts.n_eval=8",
        "trainer.prompts_per_step=2",
        "trainer.group_size=2",
        "trainer.progress=false",
        "algorithm=dapo",
        "trainer.unhealthy=warn",  # the 20-step warm start solves nothing (run health, docs/metrics.md)
        "results_dir=results",
    ]
    out = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["results"]
    run = (
        tmp_path
        / "results"
        / "default"
        / "dapo__budget=tiny__model.warm_start.steps=20__prompts.n_eval=8__trainer.group_size=2__trainer.prompts_per_step=2__s0"
    )
    assert (run / ".hydra" / "config.yaml").exists() and (run / "summary.json").exists()
    assert json.loads((run / "summary.json").read_text())["status"] == "completed"
    assert list((run / "wandb").glob("offline-run-*"))


@pytest.mark.slow  # over ~2.5 s on 2 idle cores: out of the quick subset (issue 63), in CI's whole suite
def test_cli_help_lists_groups_and_cfg_job_prints_the_recipe():
    out = subprocess.run(
        [sys.executable, "-m", "rlcompare.cli", "train", "--help"], capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0
    for group in ("algorithm", "model", "prompts", "verifier", "budget", "logger"):
        assert f"{group}:" in out.stdout
    assert "dhpo" in out.stdout and "drgrpo" in out.stdout
    out = subprocess.run(
        [sys.executable, "-m", "rlcompare.cli", "train", "algorithm=dapo", "--cfg", "job"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0
    job = OmegaConf.create(out.stdout)
    assert job.algorithm.clip.eps_high == 0.28 and job.algorithm.dynamic_sampling.enabled is True


def test_cli_config_error_is_one_clear_line(tmp_path):
    out = subprocess.run(
        [sys.executable, "-m", "rlcompare.cli", "train", "algorithm.clip.eps_low=-1", f"results_dir={tmp_path}"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 2
    assert "algorithm.clip.eps_low=-1" in out.stderr and "negative" in out.stderr


def test_derived_run_names_are_short_readable_and_distinct():
    from rlcompare.cli import MAX_NAME, run_name

    assert run_name("grpo", 0, "trainer.lr=1e-3") == "grpo__trainer.lr=1e-3__s0"
    # a path names the run by its last component
    assert (
        run_name("ppo", 1, "model.name_or_path=/data/ckpt/qwen-sft/__model=hf")
        == "ppo__model.name_or_path=qwen-sft__model=hf__s1"
    )
    # long override sets are cut to MAX_NAME characters, and two that differ only past the cut stay apart
    base = "__".join(f"trainer.knob_{i}=value_{i}" for i in range(12))
    a, b = run_name("dapo", 0, base + "__rollout.top_p=0.9"), run_name("dapo", 0, base + "__rollout.top_p=0.8")
    assert len(a) == len(b) == MAX_NAME and a != b and a[: MAX_NAME - 13] == b[: MAX_NAME - 13]
    assert a.endswith("__s0") and re.fullmatch(r"dapo__trainer\.knob_0=.*~[0-9a-f]{8}__s12", run_name("dapo", 12, base))
    assert a.startswith("dapo__trainer.knob_0=value_0__")
