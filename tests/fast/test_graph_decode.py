"""The graph engine (`rlcompare.fast.graph_decode`) samples what the eager decoder samples, on the CPU.

On the CPU no graph is captured, but every other part runs: the persistent buffers, the fixed-shape step, the
choice on the device with the step index held in a tensor, the trash row, the check for finished rows every
`sync_every` tokens and the compaction into smaller buckets. The reference is the eager loop
(`rollout.sampler._sample` over `StaticDecoder`) with the same weights and the same uniforms (group streams).
The graphs themselves are checked on a GPU (tests/fast/test_cuda_engine.py).
"""

from __future__ import annotations

import pytest
import torch

from rlcompare import fast
from rlcompare.config import schema
from rlcompare.fast import graph_decode, rollout_weights, static_decode
from rlcompare.rollout import left_pad, sample
from rlcompare.rollout.streams import GroupStreams
from tests.fast.test_static_decode import PROMPTS, TOK, _model

EOS, PAD = TOK.eos_token_id, TOK.pad_token_id


def _streams(repeats: int, seed: int = 0) -> GroupStreams:
    return GroupStreams([(seed, g) for g in range(len(PROMPTS))], repeats, "cpu")


def _eos_often(model, boost: float):
    """Raise the EOS logit so that rows end at scattered steps (the finish patterns compaction has to follow)."""
    with torch.no_grad():
        model.lm_head.weight[EOS] += boost * model.model.norm.weight / model.model.norm.weight.norm()
    return model


def _pair(model, *, repeats, sync_every=16, full_width=False, warm_up=False, monkeypatch=None, **kw):
    """(eager, engine) completions of PROMPTS with the same group streams, and the engine's compactions
    ((rows, bucket) of each); `warm_up`: the engine runs the warm-up it runs before a capture (without one)."""
    kw = dict(max_new_tokens=24, eos_id=EOS, pad_id=PAD, repeats=repeats) | kw
    pi, pm = left_pad(PROMPTS, PAD, "cpu")
    eager = sample(model, pi, pm, streams=_streams(repeats), engine="eager", **kw)
    buckets = []
    real_compact = graph_decode.GraphDecoder._compact

    def compact(self, live, nb):
        buckets.append((len(live), nb))
        real_compact(self, live, nb)

    real_init = graph_decode.GraphDecoder.__init__

    def init(self, *a, **k):
        real_init(self, *a, **{**k, "full_width": full_width, "warm_up": warm_up})

    monkeypatch.setattr(graph_decode.GraphDecoder, "_compact", compact)
    monkeypatch.setattr(graph_decode.GraphDecoder, "__init__", init)
    engine = sample(model, pi, pm, streams=_streams(repeats), engine="graphs", sync_every=sync_every, **kw)
    return eager, engine, buckets


def test_buckets_are_the_powers_of_two_below_the_rows_and_the_rows():
    assert graph_decode.bucket_sizes(12) == [1, 2, 4, 8, 12]
    assert graph_decode.bucket_sizes(8) == [1, 2, 4, 8]
    assert graph_decode.bucket_sizes(1) == [1]
    sizes = graph_decode.bucket_sizes(24)
    assert [graph_decode.bucket_for(n, sizes) for n in (1, 3, 4, 5, 9, 17, 24)] == [1, 4, 4, 8, 16, 24, 24]


@pytest.mark.parametrize(
    "repeats,sync_every,temperature,top_p",
    [(1, 1, 1.0, 1.0), (3, 5, 0.7, 0.9), (8, 1, 1.0, 0.9), (8, 5, 0.8, 1.0), (8, 16, 1.0, 1.0)],
)
def test_the_engine_samples_the_eager_decoders_tokens_as_rows_finish_and_move_to_smaller_buckets(
    repeats, sync_every, temperature, top_p, monkeypatch
):
    model = _eos_often(_model("llama"), 2.0)
    eager, engine, buckets = _pair(
        model, repeats=repeats, sync_every=sync_every, temperature=temperature, top_p=top_p, monkeypatch=monkeypatch
    )
    assert torch.equal(engine.ids, eager.ids) and torch.equal(engine.mask, eager.mask)
    assert torch.equal(engine.truncated, eager.truncated) and torch.equal(engine.lengths, eager.lengths)
    # the two drop finished rows at other steps, and a row's products round differently in a batch of another
    # size (measured: 1.4e-6 at most)
    torch.testing.assert_close(engine.logp, eager.logp, atol=1e-5, rtol=0)
    # rows ended at scattered steps, and where a check found few enough live rows they moved to a smaller bucket
    assert len(set(eager.lengths.tolist())) > 2
    if repeats == 8 and sync_every < 16:
        assert buckets and all(nb < b for b, nb in buckets)


@pytest.mark.parametrize(
    "kw",
    [
        dict(temperature=0.7, top_p=0.9),
        dict(greedy=True),
        # under autocast the rollout copy holds the weights in bf16: F.linear rounds an fp32 weight to nearest at
        # every step, the copy once, so the products are the same numbers
        dict(autocast_dtype=torch.bfloat16),
    ],
    ids=["top-p", "greedy", "bf16-autocast"],
)
@pytest.mark.parametrize("warm_up", [False, True], ids=["", "warmed-up"])
def test_in_batches_of_the_same_rows_the_engine_equals_the_eager_decoder_bit_for_bit(kw, warm_up, monkeypatch):
    """No row ends (an end id never sampled), so both decode every row at every step: the same batch shapes.
    With the capture's warm-up run first (three steps per bucket, each undone), the tokens are the same."""
    eager, engine, buckets = _pair(
        _model("qwen2"), repeats=4, sync_every=4, warm_up=warm_up, monkeypatch=monkeypatch, **{"eos_id": 10_000, **kw}
    )
    assert torch.equal(engine.ids, eager.ids) and torch.equal(engine.logp, eager.logp)
    assert buckets == [] and bool(engine.truncated.all())


@pytest.mark.parametrize("case", ["llama-gqa", "qwen2-bias", "qwen3-qk-norm"])
def test_attention_over_the_whole_cache_as_the_graphs_run_it_samples_the_same_tokens(case, monkeypatch):
    from tests.fast.test_static_decode import CASES

    arch, extra = CASES[case]
    model = _eos_often(_model(arch, **extra), 2.0)
    eager, engine, _ = _pair(model, repeats=4, sync_every=3, full_width=True, monkeypatch=monkeypatch)
    assert torch.equal(engine.ids, eager.ids)
    # the masked positions add exact zeros; only the order of the softmax's sums differs
    torch.testing.assert_close(engine.logp, eager.logp, atol=2e-6, rtol=0)


def _snapshot(engine) -> dict:
    """Every buffer a step reads or writes (the state, the mask as the rollout's start sets it, the cache)."""
    s = engine.state
    snap = {k: getattr(s, k).clone() for k in ("tok", "pos", "rows", "live", "slot", "t", "ids", "logp", "u")}
    mask = engine.mask if engine.mask is not None else static_decode.additive_mask(engine.key_mask, torch.float32)
    snap["mask"] = mask.reshape(len(engine.key_mask), -1).clone()
    snap |= {f"cache{k}": v.clone() for k, v in engine.cache.items()}
    return snap


def test_the_warm_up_leaves_state_outputs_mask_and_cache_bit_identical():
    """Two rollouts on one engine (the second under another sampling setting: another warm-up, the mask built by
    then); before and after each warm-up every buffer holds the same bits."""
    from rlcompare.rollout import sampler

    model = _model("llama")
    pi, pm = left_pad(PROMPTS, PAD, "cpu")
    repeats, new = 4, 5
    engine = graph_decode.GraphDecoder(
        model,
        pi.shape[1] + new,
        rollout_weights.RolloutWeights(model, torch.float32),
        capture=False,
        sync_every=2,
        warm_up=True,
    )
    calls = []
    real = engine._capture_all

    def capture_all(B, plan, autocast_dtype):
        before = _snapshot(engine)
        real(B, plan, autocast_dtype)
        after = _snapshot(engine)
        calls.append((B, before["t"].item(), before["slot"].item()))
        assert before.keys() == after.keys()
        for k in before:
            assert torch.equal(before[k], after[k]), k

    engine._capture_all = capture_all
    kw = dict(max_new_tokens=new, eos_id=10_000, pad_id=PAD, repeats=repeats, decoder=engine)
    with torch.inference_mode():
        sampler._sample(model, pi, pm, streams=_streams(repeats), **kw)
        assert engine.mask is not None  # built by the first warm-up, kept
        sampler._sample(model, pi, pm, streams=_streams(repeats), temperature=0.5, **kw)
    # at each rollout's start: the first choice not made yet (t 0), the slot before the prompt's end
    assert calls == [(12, 0, pi.shape[1] - 1)] * 2
    assert engine.warmed == {(b, key) for b in graph_decode.bucket_sizes(12) for key in {k for _, k in engine.warmed}}
    assert len(engine.warmed) == 2 * len(graph_decode.bucket_sizes(12))


@pytest.mark.parametrize("new", [1, 2])
def test_fewer_new_tokens_than_buckets_warm_up_and_sample_the_eager_tokens(new, monkeypatch):
    """24 rows decode in 6 buckets (1, 2, 4, 8, 16, 24): a warm-up that advanced the step index would write past
    the output's last column from the second bucket on."""
    assert len(graph_decode.bucket_sizes(24)) == 6
    eager, engine, _ = _pair(
        _model("llama"),
        repeats=8,
        sync_every=1,
        warm_up=True,
        monkeypatch=monkeypatch,
        max_new_tokens=new,
        eos_id=10_000,
    )
    assert engine.ids.shape == (24, new)
    assert torch.equal(engine.ids, eager.ids) and torch.equal(engine.logp, eager.logp)


@pytest.mark.parametrize("warm_up", [False, True], ids=["", "warmed-up"])
def test_a_rollout_prefills_once_after_the_refresh_of_the_weights(warm_up, monkeypatch):
    """The sampler hands the graph engine the prompts unprefilled: one prefill per rollout, the first after the
    rollout copy is rewritten (the engine's first rollout, warm-up included, and a second on the same engine)."""
    from rlcompare.rollout import sampler

    events = []
    real_prefill, real_refresh = static_decode.StaticDecoder.prefill, rollout_weights.RolloutWeights.refresh
    monkeypatch.setattr(
        static_decode.StaticDecoder, "prefill", lambda self, *a: events.append("prefill") or real_prefill(self, *a)
    )
    monkeypatch.setattr(
        rollout_weights.RolloutWeights, "refresh", lambda self: events.append("refresh") or real_refresh(self)
    )
    model = _model("llama")
    pi, pm = left_pad(PROMPTS, PAD, "cpu")
    weights = rollout_weights.RolloutWeights(model, torch.float32)
    engine = graph_decode.GraphDecoder(model, pi.shape[1] + 6, weights, capture=False, sync_every=2, warm_up=warm_up)
    kw = dict(max_new_tokens=6, eos_id=EOS, pad_id=PAD, repeats=2, decoder=engine)
    with torch.inference_mode():
        first = sampler._sample(model, pi, pm, streams=_streams(2), **kw)
        sampler._sample(model, pi, pm, streams=_streams(2, seed=1), **kw)
    assert events == ["refresh", "prefill"] * 2
    eager = sample(
        model, pi, pm, streams=_streams(2), engine="eager", **{k: v for k, v in kw.items() if k != "decoder"}
    )
    assert torch.equal(first.ids, eager.ids)


def test_the_engine_draws_its_uniforms_into_its_own_buffer(monkeypatch):
    """No new `[rows, V]` tensor per position: the group streams fill the engine's buffer in place (a call of
    `uniform` would raise), the buffer's address the same at every position, and the tokens the eager loop's."""
    seen = []
    real = GroupStreams.uniform_

    def uniform_(self, out):
        seen.append(out.data_ptr())
        return real(self, out)

    monkeypatch.setattr(GroupStreams, "uniform_", uniform_)
    eager, _, _ = _pair(_model("llama"), repeats=2, sync_every=3, monkeypatch=monkeypatch, eos_id=10_000)
    seen.clear()
    monkeypatch.setattr(GroupStreams, "uniform", lambda *a: pytest.fail("a fresh [rows, V] draw"))
    pi, pm = left_pad(PROMPTS, PAD, "cpu")
    kw = dict(max_new_tokens=24, eos_id=10_000, pad_id=PAD, repeats=2)
    engine = sample(_model("llama"), pi, pm, streams=_streams(2), engine="graphs", sync_every=3, **kw)
    assert len(seen) == 24 and len(set(seen)) == 1
    assert torch.equal(engine.ids, eager.ids) and torch.equal(engine.logp, eager.logp)


def test_one_stream_per_batch_draws_every_row_each_step(monkeypatch):
    """With the run's generator the engine draws `[rows, V]` uniforms at every position, as the eager loop does
    while no row has ended (after that the eager loop draws for its remaining rows only): with an end id never
    sampled, both take the same tokens from generators seeded alike."""
    model = _model("llama")
    pi, pm = left_pad(PROMPTS, PAD, "cpu")
    kw = dict(max_new_tokens=7, eos_id=10_000, pad_id=PAD, repeats=2)
    eager = sample(model, pi, pm, generator=torch.Generator().manual_seed(3), engine="eager", **kw)
    engine = sample(model, pi, pm, generator=torch.Generator().manual_seed(3), engine="graphs", sync_every=2, **kw)
    assert torch.equal(engine.ids, eager.ids) and torch.equal(engine.logp, eager.logp)
    assert bool(engine.truncated.all())


def test_lora_adapters_merged_into_the_rollout_copy_sample_the_adapted_model(monkeypatch):
    from peft import LoraConfig, get_peft_model

    lora = get_peft_model(_model("llama"), LoraConfig(r=4, lora_alpha=8, target_modules="all-linear"))
    with torch.no_grad():  # B starts at zero (adapter = identity); make the adapters matter
        for name, p in lora.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.5)
    eager, engine, _ = _pair(lora, repeats=2, sync_every=4, monkeypatch=monkeypatch)
    assert torch.equal(engine.ids, eager.ids)
    # W x + s B (A x) against (W + s B A) x: the rounding of another order of products
    torch.testing.assert_close(engine.logp, eager.logp, atol=2e-5, rtol=0)
    with lora.disable_adapter():  # the merged copy follows the adapters' switch
        off = rollout_weights.RolloutWeights(lora, torch.float32)
        base = static_decode.projection_modules(lora.get_base_model().model.layers[0])[0][0]
        assert torch.equal(off.projections[0][static_decode.QKV].weight[: base.out_features], base.base_layer.weight)


def test_a_refresh_rewrites_the_copy_in_place_with_the_new_weights():
    from peft import LoraConfig, get_peft_model

    lora = get_peft_model(_model("llama"), LoraConfig(r=2, lora_alpha=4, target_modules=["q_proj", "v_proj"]))
    copy = rollout_weights.RolloutWeights(lora, torch.float32)
    qkv = copy.projections[1][static_decode.QKV]
    address = qkv.weight.data_ptr()
    attn = lora.get_base_model().model.layers[1].self_attn
    with torch.no_grad():  # an optimizer step: adapters and head move
        attn.q_proj.lora_B["default"].weight.fill_(0.25)
        lora.get_base_model().lm_head.weight.mul_(2)
    copy.refresh()
    A = attn.q_proj.lora_A["default"].weight
    # scaling = alpha / r = 2; B is all 0.25: q = W + 2 * 0.25 * (column sums of A repeated)
    want_q = attn.q_proj.base_layer.weight + 0.5 * A.sum(0, keepdim=True).expand(attn.q_proj.out_features, -1)
    got_q = qkv.weight[: attn.q_proj.out_features]
    torch.testing.assert_close(got_q, want_q, atol=1e-6, rtol=0)
    assert qkv.weight.data_ptr() == address
    assert torch.equal(copy.lm_head, lora.get_base_model().lm_head.weight)


def test_decoder_for_picks_the_engine_by_setting_device_and_model():
    model = _model("llama")
    assert isinstance(fast.decoder_for(model, 20, engine="graphs", rows=4), graph_decode.GraphDecoder)
    # auto on the CPU keeps today's eager decoder (the default run's rows unchanged)
    for engine in ("auto", "eager"):
        dec = fast.decoder_for(model, 20, engine=engine, rows=4)
        assert type(dec) is static_decode.StaticDecoder
    assert fast.decoder_for(model, 20, engine="graphs", rows=4, kv_cache="dynamic") is None
    dynamic = _model("llama", rope_scaling={"rope_type": "dynamic", "factor": 2.0})
    assert "depends on the length" in fast.speed.graph_refusal(dynamic)
    assert type(fast.decoder_for(dynamic, 20, engine="graphs", rows=4)) is static_decode.StaticDecoder
    with pytest.raises(ValueError, match="engine='graph' must be one of auto, eager, graphs"):
        fast.decoder_for(model, 20, engine="graph", rows=4)


def test_the_accepted_engines_are_the_config_s():
    assert fast.ENGINES == schema.ROLLOUT_ENGINES


def test_a_norm_written_in_bf16_is_the_float32_norm_rounded_once():
    """x = (3, 4): mean of squares 12.5, n = x / sqrt(12.5) = (0.8485281, 1.1313708); weight (1, 0.5) gives
    (0.8485281, 0.5656854); bf16 steps are 2^-9 in [0.5, 1): 434.45 and 289.63 steps round to 434 and 290."""
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    norm = LlamaRMSNorm(2, eps=0.0)
    with torch.no_grad():
        norm.weight.copy_(torch.tensor([1.0, 0.5]))
        y = static_decode.rms_norm(norm, torch.tensor([[3.0, 4.0]]), torch.bfloat16)
        assert y.dtype == torch.bfloat16 and y.tolist() == [[434 / 512, 290 / 512]]
        # at a model's width: the bits of the float32 norm cast by autocast before a product
        wide = _model("llama").model.norm
        x = torch.randn(6, wide.weight.numel(), generator=torch.Generator().manual_seed(0))
        assert torch.equal(static_decode.rms_norm(wide, x, torch.bfloat16), static_decode.rms_norm(wide, x).bfloat16())
        assert static_decode.rms_norm(wide, x, torch.float32).dtype == torch.float32


def test_under_bf16_autocast_the_engine_writes_its_norms_in_the_copy_s_dtype(monkeypatch):
    seen = []
    real = static_decode.rms_norm

    def rms_norm(norm, x, out_dtype=None):
        seen.append(out_dtype)
        return real(norm, x, out_dtype)

    monkeypatch.setattr(graph_decode, "rms_norm", rms_norm)
    monkeypatch.setattr(static_decode, "rms_norm", rms_norm)
    eager, engine, _ = _pair(
        _model("llama"), repeats=2, sync_every=4, monkeypatch=monkeypatch, eos_id=10_000, autocast_dtype=torch.bfloat16
    )
    assert seen.count(torch.bfloat16) > 0  # the engine's steps (the eager decoder's norms have no out_dtype)
    assert torch.equal(engine.ids, eager.ids) and torch.equal(engine.logp, eager.logp)
