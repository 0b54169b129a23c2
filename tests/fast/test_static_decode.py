"""The preallocated-cache decoder (`rlcompare.fast.static_decode`) computes what the model's own forward computes.

The reference in every test is transformers: one full forward of each whole sequence (no cache, no padding),
or the sampler driven through transformers' DynamicCache (`kv_cache="dynamic"`) with the same generator.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from rlcompare import fast
from rlcompare.fast import static_decode
from rlcompare.models import build_char_tokenizer
from rlcompare.rollout import CacheDecoder, left_pad, make_decoder, sample, token_logp

TOK = build_char_tokenizer()
IDS = dict(
    vocab_size=len(TOK), pad_token_id=TOK.pad_token_id, bos_token_id=TOK.bos_token_id, eos_token_id=TOK.eos_token_id
)


def _model(arch: str, **extra):
    from transformers import AutoConfig, AutoModelForCausalLM

    kw = dict(
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=64,
        max_position_embeddings=128,
        **IDS,
    )
    kw.update(extra)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(AutoConfig.for_model(arch, **kw)).eval()
    with torch.no_grad():  # non-trivial biases and norm weights, so a dropped bias or norm shows
        for name, p in model.named_parameters():
            if name.endswith("bias") or "norm" in name:
                p.add_(0.3 * torch.randn_like(p))
    return model


# 4, 7 and 10 tokens: left padding of 6, 3 and 0
PROMPTS = [[TOK.bos_token_id] + [10 + i, 11, 12] * (1 + i) for i in range(3)]
CASES = {
    "llama-mha": ("llama", {"num_key_value_heads": 4}),
    "llama-gqa": ("llama", {}),
    "qwen2-bias": ("qwen2", {}),
    "qwen3-qk-norm": ("qwen3", {"head_dim": 16}),  # head_dim != hidden / heads, as in Qwen3-0.6B (128 vs 64)
    "mistral": ("mistral", {"sliding_window": None}),
    # 256 wide: the projections go through oneDNN with packed weights (rlcompare.fast.onednn) where available
    "llama-wide": (
        "llama",
        {
            "hidden_size": 256,
            "num_attention_heads": 8,
            "num_key_value_heads": 4,
            "intermediate_size": 512,
            "num_hidden_layers": 1,
        },
    ),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_each_step_equals_a_full_forward_of_the_whole_sequence(case):
    arch, extra = CASES[case]
    model = _model(arch, **extra)
    pi, pm = left_pad(PROMPTS, TOK.pad_token_id, "cpu")
    pos = (pm.cumsum(-1) - 1).clamp(min=0)
    dec = make_decoder(model, pi.shape[1] + 6)
    assert isinstance(dec, static_decode.StaticDecoder)
    with torch.inference_mode():
        _assert_steps_are_full_forwards(
            model, dec, dec.prefill(pi, pm, pos), [list(p) for p in PROMPTS], pos[:, -1:] + 1, steps=6, seed=1
        )


def _assert_steps_are_full_forwards(model, dec, logits, seqs, next_pos, *, steps, seed):
    """Decode `steps` random tokens per row from the prefill's `logits`, checking before each step that every
    row's logits equal the model's forward of its whole sequence alone (no padding, no cache); `seqs` (each
    row's tokens so far) grows in place."""
    g = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        for i, s in enumerate(seqs):
            want = model(input_ids=torch.tensor([s])).logits[0, -1]
            torch.testing.assert_close(logits[i], want, atol=2e-5, rtol=0)
        tok = torch.randint(5, 80, (len(seqs),), generator=g)
        for s, t in zip(seqs, tok.tolist()):
            s.append(t)
        logits = dec.step(tok, next_pos)
        next_pos = next_pos + 1


@pytest.mark.parametrize("case", ["llama-gqa", "qwen3-qk-norm"])
def test_each_copy_of_a_prompt_decodes_from_its_own_cache_and_never_reads_unwritten_positions(case):
    """Prefill with 2 copies per prompt writes each prompt's keys and values into both copies' rows and nothing
    past the prompt (the cache is allocated empty): with every later position set to NaN, each copy still
    equals the whole sequence's forward step after step, while the two copies of a prompt take different
    tokens."""
    arch, extra = CASES[case]
    model = _model(arch, **extra)
    pi, pm = left_pad(PROMPTS, TOK.pad_token_id, "cpu")
    pos = (pm.cumsum(-1) - 1).clamp(min=0)
    P = pi.shape[1]
    dec = make_decoder(model, P + 5)
    seqs = [list(PROMPTS[i // 2]) for i in range(6)]
    with torch.inference_mode():
        logits = dec.prefill(pi, pm, pos, repeats=2)
        for cache in dec.keys + dec.values:
            assert cache.shape[0] == 6
            cache[:, :, P:] = float("nan")
        _assert_steps_are_full_forwards(
            model, dec, logits, seqs, pos[:, -1:].repeat_interleave(2, 0) + 1, steps=5, seed=2
        )
    assert seqs[0] != seqs[1]


@pytest.mark.parametrize("case", ["llama-gqa", "qwen2-bias"])
def test_sampling_matches_the_transformers_cache_token_for_token(case):
    arch, extra = CASES[case]
    model = _model(arch, **extra)
    pi, pm = left_pad(PROMPTS, TOK.pad_token_id, "cpu")
    kw = dict(max_new_tokens=24, eos_id=TOK.eos_token_id, pad_id=TOK.pad_token_id, repeats=8)
    fast = sample(model, pi, pm, generator=torch.Generator().manual_seed(0), kv_cache="auto", **kw)
    ref = sample(model, pi, pm, generator=torch.Generator().manual_seed(0), kv_cache="dynamic", **kw)
    assert torch.equal(fast.ids, ref.ids) and torch.equal(fast.mask, ref.mask)
    torch.testing.assert_close(fast.logp, ref.logp, atol=2e-5, rtol=0)
    # some rows ended early, so rows were dropped from the cache on the way
    assert 0 < int((~fast.truncated).sum()) and int(fast.truncated.sum()) > 0


def test_dropping_rows_keeps_the_remaining_rows_exact():
    model = _model("llama")
    pi, pm = left_pad(PROMPTS, TOK.pad_token_id, "cpu")
    pos = (pm.cumsum(-1) - 1).clamp(min=0)
    tok = torch.tensor([20, 21, 22])
    with torch.inference_mode():
        full = make_decoder(model, 16)
        full.prefill(pi, pm, pos)
        want = full.step(tok, pos[:, -1:] + 1)
        cut = make_decoder(model, 16)
        cut.prefill(pi, pm, pos)
        cut.select(torch.tensor([2, 0]))
        got = cut.step(tok[[2, 0]], (pos[:, -1:] + 1)[[2, 0]])
    torch.testing.assert_close(got, want[[2, 0]], atol=1e-6, rtol=0)


@pytest.mark.parametrize("case", ["llama-gqa", "qwen3-qk-norm"])
def test_bf16_autocast_stays_close_to_the_model_under_the_same_autocast(case):
    arch, extra = CASES[case]
    model = _model(arch, **extra)
    pi, pm = left_pad(PROMPTS, TOK.pad_token_id, "cpu")
    kw = dict(max_new_tokens=8, eos_id=TOK.eos_token_id, pad_id=TOK.pad_token_id, autocast_dtype=torch.bfloat16)
    fast = sample(model, pi, pm, generator=torch.Generator().manual_seed(0), kv_cache="auto", **kw)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        for i, p in enumerate(PROMPTS):
            n = int(fast.lengths[i])
            logits = model(input_ids=torch.tensor([p + fast.ids[i, :n].tolist()])).logits[
                0, len(p) - 1 : len(p) - 1 + n
            ]
            # bf16 keeps ~3 significant digits; log-probs of ~-4.4 agree to a few hundredths
            torch.testing.assert_close(token_logp(logits, fast.ids[i, :n]), fast.logp[i, :n], atol=5e-2, rtol=0)


def test_lora_adapters_are_applied_through_their_modules():
    from peft import LoraConfig, get_peft_model

    model = _model("llama")
    lora = get_peft_model(model, LoraConfig(r=4, lora_alpha=8, target_modules="all-linear", task_type="CAUSAL_LM"))
    with torch.no_grad():  # B starts at zero (adapter = identity); make the adapters matter
        for name, p in lora.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.5)
    pi, pm = left_pad(PROMPTS, TOK.pad_token_id, "cpu")
    kw = dict(max_new_tokens=8, eos_id=TOK.eos_token_id, pad_id=TOK.pad_token_id, repeats=2)
    assert isinstance(make_decoder(lora, 20), static_decode.StaticDecoder)
    fast = sample(lora, pi, pm, generator=torch.Generator().manual_seed(0), kv_cache="auto", **kw)
    ref = sample(lora, pi, pm, generator=torch.Generator().manual_seed(0), kv_cache="dynamic", **kw)
    assert torch.equal(fast.ids, ref.ids)
    torch.testing.assert_close(fast.logp, ref.logp, atol=2e-5, rtol=0)
    with lora.disable_adapter():  # the reference model (adapters off) is a different function
        base = sample(lora, pi, pm, generator=torch.Generator().manual_seed(0), kv_cache="auto", **kw)
    assert not torch.allclose(base.logp, fast.logp)


@pytest.mark.parametrize(
    "arch,extra,reason",
    [
        ("mistral", {"sliding_window": 8}, "sliding window 8 < 20"),
        ("qwen2", {"use_sliding_window": True, "sliding_window": 8, "max_window_layers": 0}, "sliding window 8 < 20"),
        ("gemma", {"head_dim": 8}, "GemmaForCausalLM is not one of"),
    ],
)
def test_unsupported_models_keep_the_transformers_cache(arch, extra, reason):
    model = _model(arch, **extra)
    assert reason in static_decode.supports(model, 20)
    assert isinstance(make_decoder(model, 20), CacheDecoder)
    assert isinstance(make_decoder(_model("llama"), 20, kv_cache="dynamic"), CacheDecoder)


def test_a_full_cache_is_an_error_not_a_silent_overwrite():
    model = _model("llama")
    pi, pm = left_pad(PROMPTS, TOK.pad_token_id, "cpu")
    pos = (pm.cumsum(-1) - 1).clamp(min=0)
    dec = make_decoder(model, pi.shape[1] + 1)
    with torch.inference_mode():
        dec.prefill(pi, pm, pos)
        dec.step(torch.tensor([20, 21, 22]), pos[:, -1:] + 1)
        with pytest.raises(ValueError, match="cache of 11 positions is full"):
            dec.step(torch.tensor([20, 21, 22]), pos[:, -1:] + 2)


def test_bf16_weights_as_on_a_gpu_by_default_match_the_transformers_cache():
    # model.dtype=auto loads bf16 weights on a GPU and samples under bf16 autocast: the same dtypes on the CPU
    model = _model("qwen2").to(torch.bfloat16)
    pi, pm = left_pad(PROMPTS, TOK.pad_token_id, "cpu")
    kw = dict(
        max_new_tokens=8,
        eos_id=TOK.eos_token_id,
        pad_id=TOK.pad_token_id,
        repeats=2,
        autocast_dtype=torch.bfloat16,
        greedy=True,
    )
    fast = sample(model, pi, pm, kv_cache="auto", **kw)
    ref = sample(model, pi, pm, kv_cache="dynamic", **kw)
    assert isinstance(make_decoder(model, 20), static_decode.StaticDecoder)
    assert (fast.ids == ref.ids).float().mean() > 0.9  # greedy ties may break differently in bf16
    same = (fast.ids == ref.ids).all(1)
    torch.testing.assert_close(fast.logp[same], ref.logp[same], atol=1e-2, rtol=0)  # measured: 1e-3


def test_onednn_products_equal_torch_and_apply_only_where_they_pay():
    from rlcompare.fast import onednn

    w = torch.randn(512, 256)
    assert onednn.usable(w) == onednn.available()
    assert not onednn.usable(torch.randn(384, 128))  # fewer than MIN_SIZE elements: torch's product
    assert not onednn.usable(torch.randn(128, 512))  # 512 -> 128: 2 us a step faster, less than its packing
    assert onednn.usable(torch.randn(1024, 128)) == onednn.available()  # 128 -> 1024: 56 us a step faster
    assert not onednn.usable(w.to(torch.bfloat16))
    if not onednn.available():
        pytest.skip("this torch build has no oneDNN linear")
    x, b = torch.randn(3, 7, 256), torch.randn(512)
    want = torch.nn.functional.linear(x, w, b)
    for weight in (w, onednn.pack(w, 21)):
        torch.testing.assert_close(onednn.linear(x, weight, b), want, atol=1e-4, rtol=1e-5)


def test_rms_norm_is_the_modules_own_result_and_calls_any_other_module():
    """The decode step's RMSNorm without the module call: bit for bit the module's output in float32 and bf16;
    a module with a hook, or of another class, is called instead (so the hook runs)."""
    model = _model("llama")
    norm = model.model.layers[0].input_layernorm
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        norm.weight.copy_(torch.randn(norm.weight.shape, generator=g))  # not the initial ones
        for dtype in (torch.float32, torch.bfloat16):
            for shape, scale in (((3, 1), 1.0), ((16, 7), 30.0), ((128, 1), 1e-3)):
                x = (torch.randn(*shape, norm.weight.shape[0], generator=g) * scale).to(dtype)
                assert torch.equal(static_decode.rms_norm(norm, x), norm(x))
        calls = []
        handle = norm.register_forward_hook(lambda mod, inp, out: calls.append(1) or out * 2)
        x = torch.randn(2, 1, norm.weight.shape[0])
        assert torch.equal(static_decode.rms_norm(norm, x), norm(x)) and len(calls) == 2
        handle.remove()
        other = torch.nn.LayerNorm(norm.weight.shape[0])
        assert torch.equal(static_decode.rms_norm(other, x), other(x))


def test_rms_norm_backward_is_the_derivative():
    """`_RMSNorm` (the rebuild's RMSNorm, a hand-written backward). x = (3, 4), w = (1, 1), eps = 0: y1 =
    sqrt(2) x1 / |x|, so dy1/dx1 = sqrt(2) x2^2 / |x|^3 = sqrt(2) 16/125 = 0.181019 and dy1/dx2 = -sqrt(2) x1 x2 /
    |x|^3 = -sqrt(2) 12/125 = -0.135765; dL/dw for L = y1 is n1 = sqrt(2) 3/5 = 0.848528. Then float64 gradcheck
    against finite differences on a batch with a non-trivial weight."""
    x = torch.tensor([[3.0, 4.0]], requires_grad=True)
    w = torch.ones(2, requires_grad=True)
    y = static_decode._RMSNorm.apply(x, w, 0.0)
    y[0, 0].backward()
    torch.testing.assert_close(x.grad, torch.tensor([[0.181019, -0.135765]]), atol=2e-6, rtol=0)
    torch.testing.assert_close(w.grad, torch.tensor([0.848528, 0.0]), atol=2e-6, rtol=0)
    g = torch.Generator().manual_seed(0)
    xs = torch.randn(3, 4, 5, generator=g, dtype=torch.float64, requires_grad=True)
    ws = torch.randn(5, generator=g, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda a, b: static_decode._RMSNorm.apply(a, b, 1e-6), (xs, ws))


def test_rope_backward_is_the_derivative():
    """`_Rope` (the rebuild's rope, a hand-written backward), head dim 4, pair 1 at cos/sin (0.6, 0.8), pair 2 at
    (0.28, 0.96): y1 = 0.6 x1 - 0.8 x3, y3 = 0.6 x3 + 0.8 x1, y2 = 0.28 x2 - 0.96 x4, y4 = 0.28 x4 + 0.96 x2. For
    L = y1 + 3 y2 + 2 y3 + 5 y4: dL/dx1 = 0.6 + 2 * 0.8 = 2.2, dL/dx2 = 3 * 0.28 + 5 * 0.96 = 5.64, dL/dx3 =
    -0.8 + 2 * 0.6 = 0.4, dL/dx4 = -3 * 0.96 + 5 * 0.28 = -1.48. Then float64 gradcheck on the rebuild's shapes
    (rows, heads, hd; cos/sin broadcast over heads)."""
    cos = torch.tensor([0.6, 0.28, 0.6, 0.28])
    signed_sin = torch.tensor([-0.8, -0.96, 0.8, 0.96])  # `rope()`'s form: the first half negated
    x = torch.tensor([[0.3, -1.2, 2.0, 0.7]], requires_grad=True)
    y = static_decode.apply_rope(x, cos, signed_sin)
    assert y.grad_fn is not None and "_Rope" in type(y.grad_fn).__name__
    torch.testing.assert_close(
        y.detach(),
        torch.tensor(
            [[0.3 * 0.6 - 0.8 * 2.0, -1.2 * 0.28 - 0.96 * 0.7, 2.0 * 0.6 + 0.8 * 0.3, 0.7 * 0.28 + 0.96 * -1.2]]
        ),
    )
    (y * torch.tensor([1.0, 3.0, 2.0, 5.0])).sum().backward()
    torch.testing.assert_close(x.grad, torch.tensor([[2.2, 5.64, 0.4, -1.48]]), atol=1e-6, rtol=0)
    g = torch.Generator().manual_seed(0)
    xs = torch.randn(6, 3, 8, generator=g, dtype=torch.float64, requires_grad=True)
    angle = torch.randn(6, 1, 4, generator=g, dtype=torch.float64)
    c, s = torch.cat([angle.cos()] * 2, -1), torch.cat([-angle.sin(), angle.sin()], -1)
    assert torch.autograd.gradcheck(lambda a: static_decode._Rope.apply(a, c, s), (xs,))


@pytest.mark.parametrize(
    "version,refused",
    [
        ("4.55.4", True),
        ("4.56.0", False),
        ("5.25.0", False),
        ("5.26.0.dev0", True),
        ("6.0.0", True),
    ],
)
def test_the_fast_path_refuses_transformers_outside_its_tested_range(version, refused):
    why = static_decode.transformers_version_refusal(version)
    assert (why is not None) == refused
    if refused:
        assert version in why and ">=4.56,<5.26" in why


def test_the_test_extra_pins_transformers_below_the_tested_range_s_end():
    """The tests assert the fast path, which refuses a transformers past TESTED_TRANSFORMERS: the test extra's pin
    must end where the range does, or a new transformers release fails them (as 5.25.0 did to a range ending there)."""
    import tomllib

    test_extra = tomllib.loads((Path(__file__).resolve().parents[2] / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]["test"]
    assert f"transformers<{static_decode.TESTED_TRANSFORMERS[1]}" in test_extra


def test_an_untested_transformers_falls_back_to_the_transformers_cache(monkeypatch):
    import transformers

    model = _model("llama")
    assert static_decode.supports(model, 20) is None
    pi, pm = left_pad(PROMPTS, TOK.pad_token_id, "cpu")
    kw = dict(max_new_tokens=4, eos_id=TOK.eos_token_id, pad_id=TOK.pad_token_id, repeats=2)
    recorded = sample(model, pi, pm, record=True, **kw)
    assert recorded.recording is not None
    monkeypatch.setattr(transformers, "__version__", "9.0.0")
    assert "transformers 9.0.0" in static_decode.supports(model, 20)
    assert isinstance(make_decoder(model, 20), CacheDecoder)
    # both doors of the speed layer refuse: the sampler keeps no recording, and a recording made before is
    # not rebuilt (the trainer runs the plain forward)
    assert fast.decoder_for(model, 20) is None and fast.decoder_for(model, 20, record=True) is None
    assert sample(model, pi, pm, record=True, **kw).recording is None
    rows = torch.arange(len(recorded.ids))
    assert (
        fast.recorded_update_forward(
            model,
            recorded.recording,
            rows,
            pi.repeat_interleave(2, 0),
            pm.repeat_interleave(2, 0),
            recorded.ids,
            group_size=2,
        )
        is None
    )
