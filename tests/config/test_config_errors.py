"""Bad configs fail before anything heavy runs (no warm start, no model load), with one message naming the key
and what it accepts (issue #7)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from rlcompare.config import ConfigError
from rlcompare.train.run import train

# (overrides, regex the message must match). "{tmp}" is the test's tmp_path.
CASES = [
    # unknown keys and wrong types (schema)
    (["+trainer.lr_rate=1"], r"unknown config key 'trainer\.lr_rate'; accepted keys here: .*\blr\b"),
    (["+algorithm.clip.eps_hihg=0.3"], r"unknown config key 'algorithm\.clip\.eps_hihg'.*eps_high"),
    (["trainer.lr=fast"], r"bad value for 'trainer\.lr'"),
    # names of components
    (
        ["algorithm.aggregation=mean"],
        r"algorithm\.aggregation='mean' is not accepted; use one of: token-mean, token-sum",
    ),
    (
        ["algorithm.ratio=tokens"],
        r"algorithm\.ratio='tokens' is not accepted; use one of: token, sequence, sequence-token, hybrid",
    ),
    (
        ["algorithm.advantage.estimator=grpo"],
        r"algorithm\.advantage\.estimator='grpo' is not accepted; use one of: group, rloo, gae",
    ),
    (["algorithm.kl.estimator=k4"], r"algorithm\.kl\.estimator='k4' is not accepted; use one of: k1, k2, k3"),
    (["verifier.name=nope"], r"verifier\.name='nope' is not a known verifier; use one of: exact_match, math_verify"),
    (["device=tpu"], r"device='tpu' is not accepted; use one of: auto, cpu, cuda"),
    (["logger.mode=cloud"], r"logger\.mode='cloud' is not accepted; use one of: offline, online, disabled"),
    # ranges and combinations
    (
        ["algorithm.clip.eps_low=-0.1"],
        r"algorithm\.clip\.eps_low=-0\.1 must be >= 0; a clipping range cannot be negative",
    ),
    (["algorithm.clip.eps_high=-1"], r"algorithm\.clip\.eps_high=-1(\.0)? must be >= 0"),
    (["algorithm.advantage.eps=-1"], r"algorithm\.advantage\.eps=-1(\.0)? must be >= 0"),
    (["algorithm.clip.dual_clip=1.0"], r"algorithm\.clip\.dual_clip=1\.0 must be > 1"),
    (["algorithm.clip.mix=entropy"], r"algorithm\.clip\.mix=entropy only applies to algorithm\.ratio=hybrid"),
    (
        ["algorithm.aggregation=seq-mean-token-sum-norm", "algorithm.horizon=null"],
        r"seq-mean-token-sum-norm needs algorithm\.horizon > 0",
    ),
    (["algorithm.kl.coef=-0.1"], r"algorithm\.kl\.coef=-0\.1 must be >= 0"),
    (
        ["trainer.group_size=1"],
        r"trainer\.group_size=1 with algorithm\.advantage\.estimator=group: .*trainer\.group_size >= 2",
    ),
    (["trainer.prompts_per_step=0"], r"trainer\.prompts_per_step=0 must be >= 1"),
    (["trainer.lr=0"], r"trainer\.lr=0(\.0)? must be > 0"),
    (
        ["trainer.updates_per_rollout=100"],
        r"trainer\.updates_per_rollout=100 exceeds the rollout batch of 16 completions",
    ),
    (["trainer.checkpoint_every=-1"], r"trainer\.checkpoint_every=-1 must be >= 0"),
    (["trainer.n_samples_logged=-1"], r"trainer\.n_samples_logged=-1 must be >= 0"),
    (["rollout.top_p=1.5"], r"rollout\.top_p=1\.5 must be in \(0, 1\]"),
    (["rollout.top_p=0"], r"rollout\.top_p=0(\.0)? must be in \(0, 1\]"),
    (["rollout.temperature=0"], r"rollout\.temperature=0(\.0)? must be > 0"),
    (["rollout.kv_cache=static"], r"rollout\.kv_cache=.static. must be auto .* or dynamic"),
    (["rollout.engine=cuda"], r"rollout\.engine=.cuda. must be auto .*, eager .*, graphs .* or vllm \(colocated vLLM"),
    (["rollout.sync_every=0"], r"rollout\.sync_every=0 must be >= 1"),
    (["verifier.timeout_s=0"], r"verifier\.timeout_s=0(\.0)? must be > 0"),
    # budget
    (
        ["budget.max_steps=null", "budget.total_tokens=null"],
        r"budget needs budget\.total_tokens .* or budget\.max_steps",
    ),
    (
        ["budget.max_steps=null", "budget.total_tokens=10"],
        r"budget\.total_tokens=10 is smaller than one step \(4 prompts x 4 completions",
    ),
    (["budget.max_steps=0"], r"budget\.max_steps=0 must be >= 1"),
    # model context
    (
        ["budget.max_new_tokens=60"],
        r"budget\.max_prompt_tokens \+ budget\.max_new_tokens = 76 exceeds the model's context "
        r"model\.max_position_embeddings=64",
    ),
    (
        ["model=hf", "model.name_or_path={tmp}/hf_model", "budget.max_new_tokens=40"],
        r"budget\.max_prompt_tokens \+ budget\.max_new_tokens = 56 exceeds the model's context \(32 positions",
    ),
    (
        ["model=hf", "model.name_or_path={tmp}/empty_dir"],
        r"model\.name_or_path='.*empty_dir' is a folder without config\.json",
    ),
    (["model=hf", "model.name_or_path=null"], r"model\.kind=hf needs model\.name_or_path"),
    # data
    (["prompts=gsm8k", "prompts.kind=file"], r"prompts\.kind=file needs prompts\.path"),
    (
        ["prompts=gsm8k", "prompts.kind=file", "prompts.path={tmp}/missing.jsonl"],
        r"prompts\.path='.*missing\.jsonl': file not found",
    ),
    (
        ["prompts=gsm8k", "prompts.kind=file", "prompts.path={tmp}/rows.jsonl"],
        r"field 'question' \(prompts\.fields\.question\) not found; columns are: q, a",
    ),
    (
        ["prompts=gsm8k", "prompts.kind=file", "prompts.path={tmp}/rows.jsonl", "prompts.template=nonsense"],
        r"prompts\.template='nonsense' is neither a named template",
    ),
    (["prompts=countdown_file", "prompts.path={tmp}/missing.csv"], r"prompts\.path='.*missing\.csv': file not found"),
    # where results go
    (["results_dir={tmp}/a_file/results"], r"results_dir='.*a_file/results' is not writable"),
    (["resume={tmp}/no_such_run"], r"resume='.*no_such_run': no run folder there"),
]


@pytest.fixture
def no_heavy_work(monkeypatch):
    """Anything past the checks (Trainer: warm start, model load) fails the test."""
    from rlcompare.models import load as models
    from rlcompare.train import trainer

    def heavy(*a, **k):
        raise AssertionError("heavy work started before the bad config was refused")

    monkeypatch.setattr(trainer.Trainer, "__init__", heavy)
    monkeypatch.setattr(trainer, "load_policy", heavy)
    monkeypatch.setattr(models, "warm_start_tiny", heavy)


def _fixtures(tmp: Path) -> None:
    from transformers import LlamaConfig

    LlamaConfig(
        vocab_size=32,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        max_position_embeddings=32,
    ).save_pretrained(tmp / "hf_model")  # config only: no weights to load
    (tmp / "empty_dir").mkdir()
    (tmp / "a_file").write_text("not a folder")
    (tmp / "rows.jsonl").write_text("".join(json.dumps({"q": f"{i}+1=", "a": str(i + 1)}) + "\n" for i in range(20)))


@pytest.mark.parametrize("overrides,message", CASES, ids=[" ".join(c[0]) for c in CASES])
def test_bad_config_fails_early_with_a_message_naming_the_key(compose, tmp_path, no_heavy_work, overrides, message):
    _fixtures(tmp_path)
    fast = "model=hf" not in overrides  # FAST holds tiny-model keys
    cfg = compose(*[o.replace("{tmp}", str(tmp_path)) for o in overrides], fast=fast)
    with pytest.raises(ConfigError, match=message) as e:
        train(cfg)
    assert "\n" not in str(e.value)  # one line
    assert not (tmp_path / "results").exists()  # nothing written


def test_a_misspelt_key_inside_a_yaml_preset_is_named(compose, tmp_path, no_heavy_work):
    presets = tmp_path / "presets" / "algorithm"
    presets.mkdir(parents=True)
    (presets / "mine.yaml").write_text("defaults:\n  - grpo\n  - _self_\nname: mine\nclip:\n  eps_hihg: 0.3\n")
    cfg = compose(f"hydra.searchpath=[file://{tmp_path / 'presets'}]", "algorithm=mine")
    with pytest.raises(
        ConfigError, match=r"unknown config key 'algorithm\.clip\.eps_hihg'; accepted keys here: .*eps_high"
    ):
        train(cfg)


@pytest.mark.slow
def test_resume_with_a_different_config_names_the_differing_keys(compose, monkeypatch):
    train(compose("run_name=diff", "budget.max_steps=1", "trainer.checkpoint_every=1"))
    from rlcompare.train import trainer

    monkeypatch.setattr(trainer.Trainer, "__init__", lambda *a, **k: pytest.fail("heavy work before the check"))
    with pytest.raises(
        ConfigError,
        match=r"resume: the config differs from the run being resumed in: "
        r"algorithm\.clip\.eps_high, trainer\.lr \(.*trainer\.lr: 3e-05 in the run, 0\.001 now",
    ):
        train(
            compose(
                "run_name=diff",
                "budget.max_steps=1",
                "trainer.checkpoint_every=1",
                "resume=true",
                "trainer.lr=1e-3",
                "algorithm.clip.eps_high=0.3",
            )
        )
    # how a run is run may change: threads, checkpoint cadence, the progress bar
    monkeypatch.undo()
    out = train(
        compose(
            "run_name=diff", "budget.max_steps=1", "trainer.checkpoint_every=2", "resume=true", "trainer.progress=true"
        )
    )
    assert out["status"] == "completed"


@pytest.mark.parametrize(
    "override,expected",
    [
        ("algorithm=nope", ["Could not find 'algorithm/nope'", "Available options in 'algorithm'", "grpo", "dapo"]),
        ("model=nope", ["Could not find 'model/nope'", "Available options in 'model'", "tiny", "hf"]),
        ("trainer.lr_rate=1", ["trainer.lr_rate", "not in struct"]),
    ],
)
def test_cli_unknown_preset_group_option_or_knob(tmp_path, override, expected):
    out = subprocess.run(
        [sys.executable, "-m", "rlcompare.cli", "train", override, f"results_dir={tmp_path}/results"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
        env={**os.environ},
    )
    assert out.returncode != 0
    for piece in expected:
        assert piece in out.stderr, out.stderr[-2000:]
    assert not (tmp_path / "results").exists()


def test_cli_schema_error_exits_2_before_the_model_loads(tmp_path):
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "rlcompare.cli",
            "train",
            "verifier.name=nope",
            "trainer.threads=1",
            f"results_dir={tmp_path}/results",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    assert out.returncode == 2
    assert "rlcompare: config error: verifier.name='nope' is not a known verifier" in out.stderr
    assert "warm start" not in out.stderr and "Loading weights" not in out.stderr
