"""The real Qwen2.5 tokenizer (150k BPE tokens, ChatML, two end tokens) through the pipeline with `model=hf` on a
local folder holding a tiny random Qwen2 (tests/models/qwen_folder.py): tokenization, prompt length at the budget,
several end tokens, decoding, the embedded arithmetic prompts and a reasoning-gym task, chat and plain prompts,
a SIGKILL then `resume=true`, and `rlcompare report` over runs made with it."""

from __future__ import annotations

import json
import signal
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from omegaconf import OmegaConf

from rlcompare.config import validate
from rlcompare.data.prompts import Example
from rlcompare.rollout.sampler import _completions
from rlcompare.report import main as report_main
from rlcompare.train import checkpoint
from rlcompare.train.run import train
from rlcompare.train.tracking import read_jsonl
from rlcompare.train.prompt_ids import encode_prompts
from tests.models.qwen_folder import qwen_tokenizer, save_tiny_qwen2
from tests.train.test_reliability import _assert_same_as, _cli, _finish, _start, _summary, _wait_rows

pytestmark = pytest.mark.slow  # its shared setup is seconds on 2 idle cores: out of the quick subset (issue 63)

IM_END, ENDOFTEXT = 151645, 151643


@pytest.fixture(scope="module")
def tok():
    return qwen_tokenizer()


@pytest.fixture(scope="module")
def folder(tok, tmp_path_factory):
    return str(save_tiny_qwen2(tmp_path_factory.mktemp("qwen") / "tiny-qwen2", tok))


def test_the_tokenizer_is_qwen25s(tok):
    # ids of the real Qwen2.5 vocabulary: "Hello" 9707, " world" 1879, digits one token each, " +" 488
    assert tok("Hello world, 12345 + 678 =").input_ids[:8] == [9707, 1879, 11, 220, 16, 17, 18, 19]
    assert tok.convert_tokens_to_ids(["<|endoftext|>", "<|im_start|>", "<|im_end|>"]) == [151643, 151644, 151645]
    text = "  leading spaces 3+4=7\nünïcode ✓"
    assert tok.decode(tok(text).input_ids) == text


def test_prompts_at_the_budget_are_kept_and_longer_ones_dropped(tok):
    # "12+34=" is 6 tokens (one per digit and sign); plain prompts get no bos (Qwen has none)
    short, long = Example("12+34=", "46"), Example("123+456=", "579")
    assert len(tok(short.prompt).input_ids) == 6 and len(tok(long.prompt).input_ids) == 8
    kept, dropped = encode_prompts([short, long], tok, chat=False, system_prompt=None, max_prompt_tokens=6, split="t")
    assert [p.example for p in kept] == [short] and dropped == 1
    kept, dropped = encode_prompts([short], tok, chat=True, system_prompt="be brief", max_prompt_tokens=64, split="t")
    text = tok.decode(kept[0].ids)
    assert text == "<|im_start|>system\nbe brief<|im_end|>\n<|im_start|>user\n12+34=<|im_end|>\n<|im_start|>assistant\n"


def test_either_end_token_ends_a_completion(tok):
    ids = torch.tensor([[16, 17, IM_END, 18, 19], [16, ENDOFTEXT, 17, 17, 17], [16, 17, 18, 19, 20]])
    c = _completions(ids, None, torch.tensor([IM_END, ENDOFTEXT]), ENDOFTEXT)
    assert c.mask.tolist() == [[1, 1, 1, 0, 0], [1, 1, 0, 0, 0], [1, 1, 1, 1, 1]]
    assert c.truncated.tolist() == [False, False, True]


def _settings(folder) -> list[str]:
    """Every run here: the folder's model in float32, 2 prompts x 2 completions of at most 6 tokens, one thread."""
    return [
        "logger=none",
        "trainer.progress=false",
        "trainer.threads=1",
        "trainer.unhealthy=warn",  # a random model answers nothing right: no learning signal (docs/metrics.md)
        "model=hf",
        f"model.name_or_path={folder}",
        "model.dtype=float32",
        "budget=tiny",
        "budget.max_new_tokens=6",
        "trainer.prompts_per_step=2",
        "trainer.group_size=2",
        "prompts.n_eval=4",
        "trainer.updates_per_rollout=1",
    ]


def _run(compose, folder, *extra):
    return train(compose(*_settings(folder), "budget.max_steps=2", "trainer.eval_every=2", *extra, fast=False))


@pytest.mark.slow
@pytest.mark.parametrize(
    "name,extra",
    [
        ("arith_chat", ["++prompts.chat=true", "budget.max_prompt_tokens=40", "verifier=exact_match"]),
        ("arith_plain", ["budget.max_prompt_tokens=8", "verifier=math_verify", "verifier.workers=1"]),
        (
            "gym_chain_sum",
            [
                "prompts=reasoning_gym",
                "prompts.task=chain_sum",
                "prompts.n_train=20",
                "prompts.template=plain",
                "prompts.chat=false",
                "verifier=reasoning_gym",
                "verifier.workers=1",
                "budget.max_prompt_tokens=64",
            ],
        ),
    ],
)
def test_model_hf_with_the_real_tokenizer_runs_end_to_end(compose, folder, tok, name, extra):
    s = _run(compose, folder, f"run_name={name}", *extra)
    assert s["status"] == "completed" and s["steps"] == 2
    run = Path(s["run_dir"])
    assert validate(OmegaConf.load(run / "config.yaml")).model.name_or_path == folder
    samples = [json.loads(line) for line in (run / "samples.jsonl").read_text().splitlines()]
    assert samples and all(isinstance(x["completion"], str) for x in samples)
    # decoded completions never hold an end token's text (both end a completion and are cut)
    assert not any("<|im_end|>" in x["completion"] or "<|endoftext|>" in x["completion"] for x in samples)
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2] and rows[-1]["tokens/generated"] > 0
    assert any(r["length/truncated_frac"] < 1 for r in rows)  # sampled end tokens end completions


# report.csv columns every variant has a number in (no correct completion here: length_correct has none)
HEADLINE = ("final", "best", "auc", "length_incorrect", "zero_variance_frac", "wall_time_s", "tokens_per_s")
# DAPO in ChatML: overlong punishment makes rewards vary with length, so the weights move although the random model
# answers nothing right; a warmup makes the LR scheduler's state matter; checkpoints at steps 2 and 4
RESUME = [
    "algorithm=dapo",
    "++prompts.chat=true",
    "budget.max_prompt_tokens=40",
    "budget.max_steps=4",
    "trainer.checkpoint_every=2",
    "trainer.eval_every=2",
    "trainer.warmup_steps=10",
]


@pytest.mark.slow
def test_sigkill_after_a_checkpoint_then_resume_equals_an_uninterrupted_run(compose, folder, tmp_path):
    base, results = _settings(folder), tmp_path / "results"
    run = results / "default" / "killed"
    proc = _start(tmp_path, *RESUME, "run_name=killed", f"results_dir={results}", log="killed.log", base=base)
    _wait_rows(proc, run / "metrics.jsonl", 3)  # step 2's checkpoint is written before step 3's row
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=60)
    assert proc.returncode == -signal.SIGKILL and len(read_jsonl(run / "metrics.jsonl")) < 4
    assert [checkpoint.step_of(c) for c in checkpoint.candidates(run)] == [2]
    out = _finish(_cli(*RESUME, "run_name=killed", f"results_dir={results}", "resume=true", base=base), tmp_path, 600)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "resuming" in out.stderr and _summary(run)["status"] == "completed"
    ref = train(compose(*base, *RESUME, "run_name=ref", fast=False))
    _assert_same_as(run, Path(ref["run_dir"]), 4)
    assert any(r["optim/grad_norm"] > 0 for r in read_jsonl(run / "metrics.jsonl")[2:])  # resumed steps trained


@pytest.mark.slow
def test_the_report_compares_runs_made_with_the_real_tokenizer(compose, folder):
    runs = [f"{algorithm}__s{seed}" for algorithm in ("grpo", "rloo") for seed in (0, 1)]
    for name in runs:
        algorithm, seed = name.split("__s")
        s = _run(compose, folder, "experiment=rt", f"algorithm={algorithm}", f"seed={seed}", f"run_name={name}")
        assert s["status"] == "completed"
    root = Path(s["run_dir"]).parent
    assert report_main([str(root), "--reference", "grpo"]) == 0
    head = pd.read_csv(root / "report.csv").set_index("variant").sort_index()
    assert list(head.index) == ["grpo", "rloo"] and list(head["algorithm"]) == ["grpo", "rloo"]
    assert list(head["n_seeds"]) == [2, 2] and list(head["seeds"]) == ["0 1", "0 1"] and head["matched"].all()
    assert np.isfinite(head[list(HEADLINE)].to_numpy(float)).all()
    table = pd.read_csv(root / "runs.csv").set_index("run").sort_index()
    assert list(table.index) == runs and list(table["seed"]) == [0, 1, 0, 1]
    assert table["included"].all() and (table["status"] == "completed").all()
    assert np.isfinite(table[["final_tokens", "final", "length_incorrect", "tokens_per_s"]].to_numpy(float)).all()
    diff = pd.read_csv(root / "differences.csv")
    assert set(diff["variant"]) == {"rloo"} and set(diff["reference"]) == {"grpo"} and diff["matched"].all()
    assert (diff["n_variant"] == 2).all() and (diff["n_reference"] == 2).all()
    assert np.isfinite(diff[["diff", "diff_low", "diff_high", "comparison_tokens"]].to_numpy(float)).all()
    md = (root / "report.md").read_text()
    assert "4 of 4 run folder(s) included" in md
    assert "| grpo | grpo | 2 |" in md and "| rloo | rloo | 2 |" in md
