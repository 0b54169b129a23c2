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
from rlcompare.config.sections import rollout as rollout_config
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


def _pair(
    model,
    *,
    repeats,
    sync_every=16,
    full_width=False,
    warm_up=False,
    key_block=graph_decode.KEY_BLOCK,
    monkeypatch=None,
    **kw,
):
    """(eager, engine) completions of PROMPTS with the same group streams, and the engine's compactions
    ((rows, bucket) of each); `warm_up`: the engine runs the warm-up it runs before a capture (without one);
    `full_width`: it attends over `key_width` keys (multiples of `key_block`) as the graphs do."""
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
        real_init(self, *a, **{**k, "full_width": full_width, "warm_up": warm_up, "key_block": key_block})

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


@pytest.mark.parametrize("key_block", [8, graph_decode.KEY_BLOCK], ids=["blocks-of-8", "whole-cache"])
@pytest.mark.parametrize("case", ["llama-gqa", "qwen2-bias", "qwen3-qk-norm"])
def test_attention_over_key_width_blocks_as_the_graphs_run_it_samples_the_same_tokens(case, key_block, monkeypatch):
    """The prompts are 10 positions and 24 new tokens, a cache of 34: blocks of 8 attend over 16, 24, 32 and 34
    keys as the rollout goes; a block of 128 over the whole cache (34) at every step."""
    from tests.fast.test_static_decode import CASES

    arch, extra = CASES[case]
    model = _eos_often(_model(arch, **extra), 2.0)
    eager, engine, _ = _pair(
        model, repeats=4, sync_every=3, full_width=True, key_block=key_block, monkeypatch=monkeypatch
    )
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
    """Two rollouts on one engine (the second under another sampling setting: other warm-ups, the mask built by
    then), key widths of blocks of 4: prompts of 10 positions and 5 new tokens write 11..14 positions at the 4
    decode steps, so widths 12 (11, 12) and 15 (13 -> 16, capped at the capacity 15). Each (bucket, width) is
    warmed up at its first step, mid-rollout for the second; before and after each warm-up every buffer holds the
    same bits."""
    from rlcompare.rollout import sampler

    model = _model("llama")
    pi, pm = left_pad(PROMPTS, PAD, "cpu")
    repeats, new = 4, 5
    assert pi.shape[1] == 10
    engine = graph_decode.GraphDecoder(
        model,
        pi.shape[1] + new,
        rollout_weights.RolloutWeights(model, torch.float32),
        capture=False,
        sync_every=2,
        full_width=True,
        warm_up=True,
        key_block=4,
    )
    calls = []
    real = engine._warm_up

    def warm_up(b, width, plan, autocast_dtype):
        before = _snapshot(engine)
        real(b, width, plan, autocast_dtype)
        after = _snapshot(engine)
        calls.append((b, width, before["t"].item(), before["slot"].item()))
        assert before.keys() == after.keys()
        for k in before:
            assert torch.equal(before[k], after[k]), k

    engine._warm_up = warm_up
    kw = dict(max_new_tokens=new, eos_id=10_000, pad_id=PAD, repeats=repeats, decoder=engine)
    with torch.inference_mode():
        sampler._sample(model, pi, pm, streams=_streams(repeats), **kw)
        assert engine.mask is not None  # built by the first warm-up, kept
        sampler._sample(model, pi, pm, streams=_streams(repeats), temperature=0.5, **kw)
    # step 1 writes slot 10 with the first choice made (t 1); step 3 slot 12 (t 3); no row ends: one bucket, 12
    assert calls == [(12, 12, 1, 10), (12, 15, 3, 12)] * 2
    keys = {k for *_, k in engine.warmed}
    assert len(keys) == 2 and engine.warmed == {(12, w, k) for w in (12, 15) for k in keys}


def test_key_width_rounds_the_positions_up_to_a_block_within_the_capacity():
    kw = graph_decode.key_width
    assert graph_decode.KEY_BLOCK == 128
    # the qwen2.5-0.5b bench: 16-token prompts + 512 new tokens, a cache of 528 rounded up to 576
    assert [kw(n, 576) for n in (17, 128, 129, 256, 257, 512, 513, 528)] == [128, 128, 256, 256, 384, 512, 576, 576]
    assert [kw(n, 34, 8) for n in (11, 16, 17, 24, 25, 32, 33, 34)] == [16, 16, 24, 24, 32, 32, 34, 34]
    assert kw(5, 40, 128) == 40  # a block wider than the cache: the whole cache


def test_each_step_attends_over_its_key_width(monkeypatch):
    """Blocks of 8 in a cache of 34 (prompts of 10, 24 new tokens): decode step t writes position 9 + t, so
    steps 1-6 attend over 16 keys, 7-14 over 24, 15-22 over 32 and 23 over 34, in every layer (2)."""
    widths, inside = [], []
    real_step, real_sdpa = graph_decode.GraphDecoder._fixed_step, torch.nn.functional.scaled_dot_product_attention

    def fixed_step(self, b, n_keys):
        inside.append(True)
        try:
            return real_step(self, b, n_keys)
        finally:
            inside.pop()

    def sdpa(q, k, v, **kw):
        if inside:
            widths.append((k.shape[-2], kw["attn_mask"].shape[-1]))
        return real_sdpa(q, k, v, **kw)

    monkeypatch.setattr(graph_decode.GraphDecoder, "_fixed_step", fixed_step)
    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", sdpa)
    eager, engine, _ = _pair(
        _model("llama"), repeats=2, full_width=True, key_block=8, eos_id=10_000, monkeypatch=monkeypatch
    )
    want = [16] * 6 + [24] * 8 + [32] * 8 + [34]
    assert widths == [(w, w) for w in want for _ in range(2)]
    assert torch.equal(engine.ids, eager.ids)
    torch.testing.assert_close(engine.logp, eager.logp, atol=2e-6, rtol=0)


class _EagerGraph:
    """A stand-in for a captured graph on the CPU: `replay` runs the captured step eagerly."""

    def __init__(self, engine, b, width, plan, autocast_dtype, log):
        self.engine, self.args, self.log = engine, (b, width, plan), log
        self.autocast_dtype = autocast_dtype

    def replay(self):
        b, width, plan = self.args
        self.log.append(("replay", b, width))
        with graph_decode._autocast(self.engine.state.ids.device, self.autocast_dtype):
            self.engine._body(b, plan, width)


def test_graphs_are_captured_lazily_once_per_bucket_and_key_width(monkeypatch):
    """With capture on and a graph stood in for by the eager step: a graph is captured at the first step of its
    (bucket, key width), after three warm-up runs of that step, and replayed at every step of it; a second rollout
    on the same paths captures nothing; the tokens are the eager decoder's."""
    from rlcompare.rollout import sampler

    log = []
    real_body = graph_decode.GraphDecoder._body
    monkeypatch.setattr(
        graph_decode.GraphDecoder,
        "_body",
        lambda self, b, plan, w: log.append(("body", b, w)) or real_body(self, b, plan, w),
    )
    monkeypatch.setattr(
        graph_decode.GraphDecoder,
        "_capture",
        lambda self, b, w, plan, dt: log.append(("capture", b, w)) or _EagerGraph(self, b, w, plan, dt, log),
    )
    model = _eos_often(_model("llama"), 2.0)
    pi, pm = left_pad(PROMPTS, PAD, "cpu")
    new, repeats = 24, 8
    weights = rollout_weights.RolloutWeights(model, torch.float32)
    engine = graph_decode.GraphDecoder(model, pi.shape[1] + new, weights, capture=True, sync_every=1, key_block=8)
    kw = dict(max_new_tokens=new, eos_id=EOS, pad_id=PAD, repeats=repeats, decoder=engine)
    with torch.inference_mode():
        got = sampler._sample(model, pi, pm, streams=_streams(repeats), **kw)
    eager = sample(
        model, pi, pm, streams=_streams(repeats), engine="eager", **{k: v for k, v in kw.items() if k != "decoder"}
    )
    assert torch.equal(got.ids, eager.ids)
    torch.testing.assert_close(got.logp, eager.logp, atol=1e-5, rtol=0)
    replays = [e[1:] for e in log if e[0] == "replay"]
    captures = [e[1:] for e in log if e[0] == "capture"]
    # every step replayed a graph, the first of its (bucket, width) captured just before, once
    assert captures == list(dict.fromkeys(replays))
    plan_keys = {k for *_, k in engine.graphs}
    assert len(plan_keys) == 1 and set(engine.graphs) == {(b, w, *plan_keys) for b, w in captures}
    for c in captures:
        at = log.index(("capture", *c))
        assert log[at - 3 : at] == [("body", *c)] * 3 and log[at + 1] == ("replay", *c)
    # buckets shrink and widths grow along the rollout; more than one of each was visited
    assert [b for b, _ in replays] == sorted((b for b, _ in replays), reverse=True)
    assert [w for _, w in replays] == sorted(w for _, w in replays)
    assert len({b for b, _ in replays}) > 1 and len({w for _, w in replays}) > 1
    assert all(w == graph_decode.key_width(w, pi.shape[1] + new, 8) for _, w in replays)
    log.clear()
    with torch.inference_mode():
        again = sampler._sample(model, pi, pm, streams=_streams(repeats), **kw)
    assert torch.equal(again.ids, got.ids) and not [e for e in log if e[0] == "capture"]


def test_two_engines_of_one_model_share_one_cache_store_of_the_larger_size():
    """The training engine (3 rows) decodes first, then the eval engine (12 rows): the store grows to 12 rows,
    dropping the smaller engine's views and graphs before it allocates, so the old buffer is gone; then the
    smaller engine views the front of the same buffer, and the larger one's graphs stay. Each samples the eager
    decoder's tokens. Sizes: 2 layers x (keys, values) x rows x 2 KV heads x capacity 64 (34 rounded up) x head width 8."""
    import gc
    import weakref

    from rlcompare.fast import speed
    from rlcompare.rollout import sampler

    model = _model("llama")
    assert static_decode.head_dims(model.config)[1:] == (2, 8) and len(model.model.layers) == 2
    pi, pm = left_pad(PROMPTS, PAD, "cpu")
    new = 24
    small = speed.kept_engine(model, pi.shape[1] + new, 3, torch.float32, 4, capture=False)
    large = speed.kept_engine(model, pi.shape[1] + new, 12, torch.float32, 4, capture=False)
    assert small is not large and small.store is large.store and small.capacity == 64
    store = small.store

    def rollout(engine, repeats):
        kw = dict(max_new_tokens=new, eos_id=EOS, pad_id=PAD, repeats=repeats)
        with torch.inference_mode():
            got = sampler._sample(model, pi, pm, streams=_streams(repeats), decoder=engine, **kw)
        eager = sample(model, pi, pm, streams=_streams(repeats), engine="eager", **kw)
        assert torch.equal(got.ids, eager.ids)

    rollout(small, 1)
    assert store.numel() == 2 * 2 * 3 * 2 * 64 * 8
    old = weakref.ref(store.flat[(0, True)])
    small.graphs["sentinel"] = object()
    rollout(large, 4)
    gc.collect()
    assert old() is None and small.graphs == {} and small.cache == {}
    assert store.numel() == 2 * 2 * 12 * 2 * 64 * 8
    large.graphs["sentinel"] = object()
    rollout(small, 1)
    assert store.numel() == 2 * 2 * 12 * 2 * 64 * 8  # no growth: a view of the front
    for key in small.cache:
        assert small.cache[key].data_ptr() == large.cache[key].data_ptr()
    assert "sentinel" in large.graphs
    assert speed.kept_engine(model, pi.shape[1] + new, 12, torch.float32, 4, capture=False) is large


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
    """The speed layer's engines, and vllm, which the trainer builds itself (rlcompare.rollout.vllm_engine)."""
    assert fast.ENGINES + ("vllm",) == rollout_config.ROLLOUT_ENGINES


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
