"""On-policy distillation's teacher (rlcompare.train.teacher, issue 52): loaded frozen from a save_pretrained folder
through the same path as users' checkpoints, its log-probs of the sampled tokens equal a plain forward's (chunked or
not, grouped or not), a teacher identical to the student gives a zero distillation advantage, and bad teachers
(another vocabulary, pickle weights, code in the folder, another device) are refused with one line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from rlcompare.algos.distill import distill_advantages
from rlcompare.config import ConfigError
from rlcompare.train.model_folder import check_teacher_folder
from rlcompare.train.teacher import (
    check_same_device,
    check_same_tokenizer,
    load_teacher,
    teacher_token_logp,
)


def _save_tiny(folder: Path, *, seed: int = 0, extra_tokens: int = 0) -> Path:
    from transformers import AutoModelForCausalLM, Qwen2Config

    from rlcompare.models import build_char_tokenizer

    tok = build_char_tokenizer()
    if extra_tokens:
        tok.add_tokens([f"<x{i}>" for i in range(extra_tokens)])
    config = Qwen2Config(
        vocab_size=len(tok),
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=64,
        max_position_embeddings=128,
        pad_token_id=tok.pad_token_id,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
    )
    torch.manual_seed(seed)
    AutoModelForCausalLM.from_config(config).save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("teachers")
    return {
        "a": _save_tiny(root / "a"),
        "b": _save_tiny(root / "b", seed=1),
        "vocab": _save_tiny(root / "v", extra_tokens=3),
    }


def _batch(tok, group_size=2):
    prompts = tok(["3+4=", "12+9="], return_tensors="pt", padding=True)
    pid = prompts.input_ids.repeat_interleave(group_size, 0)
    pmask = prompts.attention_mask.repeat_interleave(group_size, 0)
    comp = torch.tensor([[5, 6, 7], [8, 9, 0], [10, 11, 12], [13, 0, 0]])
    cmask = torch.tensor([[1, 1, 1], [1, 1, 0], [1, 1, 1], [1, 0, 0]])
    return pid, pmask, comp, cmask


def _plain_logp(model, pid, pmask, comp, cmask):
    """log p of each completion token from one forward over the whole sequence, left-padded prompts' positions
    counted from their first real token, written out here independently of the sampler's helpers."""
    ids = torch.cat([pid, comp], 1)
    mask = torch.cat([pmask, cmask], 1)
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=mask, position_ids=pos).logits.float()
    P = pid.shape[1]
    lp = torch.log_softmax(logits[:, P - 1 : -1], -1)
    return lp.gather(-1, comp[..., None]).squeeze(-1)


def test_the_teacher_is_frozen_and_its_log_probs_equal_a_plain_forward(folders):
    t = load_teacher(str(folders["b"]), dtype=torch.float32, device="cpu")
    assert not t.model.training and not any(p.requires_grad for p in t.model.parameters())
    pid, pmask, comp, cmask = _batch(t.tokenizer)
    want = _plain_logp(t.model, pid, pmask, comp, cmask)
    real = cmask.bool()
    for kw in ({}, {"group_size": 2}, {"max_logits": 7}):  # plain, grouped, chunked through the LM head
        got = teacher_token_logp(t, pid, pmask, comp, cmask, **kw)
        assert got.shape == comp.shape
        assert torch.allclose(got[real], want[real], atol=1e-5), kw


def test_a_teacher_identical_to_the_student_gives_a_zero_advantage(folders):
    student = load_teacher(str(folders["a"]), dtype=torch.float32, device="cpu")
    teacher = load_teacher(str(folders["a"]), dtype=torch.float32, device="cpu")
    other = load_teacher(str(folders["b"]), dtype=torch.float32, device="cpu")
    pid, pmask, comp, cmask = _batch(student.tokenizer)
    old = teacher_token_logp(student, pid, pmask, comp, cmask, group_size=2)
    same = distill_advantages(teacher_token_logp(teacher, pid, pmask, comp, cmask, group_size=2), old, cmask)
    assert torch.count_nonzero(same.advantages) == 0
    differ = distill_advantages(teacher_token_logp(other, pid, pmask, comp, cmask, group_size=2), old, cmask)
    assert torch.count_nonzero(differ.advantages) == int(cmask.sum())  # a different teacher: every real token moves


def test_another_vocabulary_is_refused_naming_both(folders):
    student = load_teacher(str(folders["a"]), dtype=torch.float32, device="cpu")
    bad = load_teacher(str(folders["vocab"]), dtype=torch.float32, device="cpu")
    with pytest.raises(ConfigError, match=r"teacher: the teacher .*/v' and the student 'model=tiny' have different"):
        check_same_tokenizer(student.tokenizer, student.model, bad, "model=tiny")
    check_same_tokenizer(student.tokenizer, student.model, student, "model=tiny")  # the same one passes


def test_pickle_weights_code_and_auto_map_are_refused_before_loading(folders, tmp_path):
    check_teacher_folder(str(folders["a"]))  # a clean save_pretrained folder passes
    pick = tmp_path / "pickled"
    pick.mkdir()
    for f in folders["a"].iterdir():
        (pick / f.name).write_bytes(f.read_bytes())
    (pick / "pytorch_model.bin").write_bytes(b"not opened")
    with pytest.raises(ConfigError, match=r"holds pickle files \['pytorch_model.bin'\]"):
        check_teacher_folder(str(pick))
    (pick / "pytorch_model.bin").unlink()
    (pick / "modeling_evil.py").write_text("raise SystemExit")
    with pytest.raises(ConfigError, match=r"holds code \['modeling_evil.py'\]"):
        check_teacher_folder(str(pick))
    (pick / "modeling_evil.py").unlink()
    conf = json.loads((pick / "config.json").read_text())
    (pick / "config.json").write_text(json.dumps({**conf, "auto_map": {"AutoModelForCausalLM": "evil.Model"}}))
    with pytest.raises(ConfigError, match="auto_map"):
        check_teacher_folder(str(pick))
    with pytest.raises(ConfigError, match="is not a folder"):
        check_teacher_folder(str(tmp_path / "missing"))


def test_a_teacher_on_another_device_is_refused():
    check_same_device("cpu", "cpu")
    with pytest.raises(ConfigError, match=r"teacher.device='cuda' is not the policy's device 'cpu'"):
        check_same_device("cuda", "cpu")
