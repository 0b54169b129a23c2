"""The graph engine on a GPU: replayed CUDA graphs compute what the same steps compute eagerly, see the weights
of the last optimizer step, and sample what the eager decoder samples. Skipped without CUDA (the CPU tests of
the same engine, graphs aside, are in tests/fast/test_graph_decode.py); scripts/gpu_check.sh runs them."""

from __future__ import annotations

import pytest
import torch

from rlcompare import fast
from rlcompare.fast import graph_decode
from rlcompare.rollout import left_pad, sample
from rlcompare.rollout.streams import GroupStreams
from tests.fast.test_static_decode import PROMPTS, TOK, _model

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")

EOS, PAD = TOK.eos_token_id, TOK.pad_token_id


def _cuda_model(arch: str = "llama", dtype=torch.float32):
    model = _model(arch).to("cuda", dtype)
    with torch.no_grad():  # rows end at scattered steps, so the engine compacts into smaller buckets
        model.lm_head.weight[EOS] += 2.0 * model.model.norm.weight / model.model.norm.weight.norm()
    return model


def _sample(model, engine: str, repeats: int = 8, **kw):
    pi, pm = left_pad(PROMPTS, PAD, "cuda")
    streams = GroupStreams([(0, g) for g in range(len(PROMPTS))], repeats, "cuda")
    kw = dict(max_new_tokens=32, eos_id=EOS, pad_id=PAD, repeats=repeats) | kw
    return sample(model, pi, pm, streams=streams, engine=engine, sync_every=4, **kw)


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
@pytest.mark.parametrize(
    "kw", [dict(), dict(temperature=0.7, top_p=0.9), dict(greedy=True)], ids=["t1", "top-p", "greedy"]
)
def test_graph_tokens_equal_the_eager_decoders(arch, kw):
    """fp32 weights, no autocast: the same uniforms give the same tokens; log-probs to float32 rounding (the graph
    attends over the whole cache under a mask, and TF32 may differ by batch shape)."""
    model = _cuda_model(arch)
    eager = _sample(model, "eager", **kw)
    graphs = _sample(model, "graphs", **kw)
    assert torch.equal(graphs.ids, eager.ids)
    torch.testing.assert_close(graphs.logp, eager.logp, atol=1e-4, rtol=0)
    engine = fast.decoder_for(model, 64, engine="graphs", rows=3 * 8)
    assert isinstance(engine, graph_decode.GraphDecoder) and engine.capture and engine.graphs


def test_replays_equal_the_same_steps_run_eagerly():
    """The captured graphs against `capture=False` on the same GPU: the same kernels, so the same numbers."""
    model = _cuda_model()
    graphs = _sample(model, "graphs")
    engine = fast.decoder_for(model, 64, engine="graphs", rows=3 * 8)
    engine.capture = False  # the same engine, its steps run eagerly
    try:
        eager_steps = _sample(model, "graphs")
    finally:
        engine.capture = True
    assert torch.equal(graphs.ids, eager_steps.ids)
    torch.testing.assert_close(graphs.logp, eager_steps.logp, atol=1e-6, rtol=0)


def test_a_replay_after_an_optimizer_step_samples_with_the_new_weights():
    model = _cuda_model()
    _sample(model, "graphs")  # captures
    engine = fast.decoder_for(model, 64, engine="graphs", rows=3 * 8)
    captured = dict(engine.graphs)
    with torch.no_grad():  # an optimizer step, in place, as AdamW's
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    after = _sample(model, "graphs")
    # the graphs captured before are replayed, not captured again (rows that end at other steps may visit a
    # (bucket, key width) the first rollout did not: captured then)
    assert all(engine.graphs.get(k) is g for k, g in captured.items())
    eager_after = _sample(model, "eager")
    assert torch.equal(after.ids, eager_after.ids)
    torch.testing.assert_close(after.logp, eager_after.logp, atol=1e-4, rtol=0)


def test_the_bf16_rollout_copy_of_fp32_weights_stays_within_the_autocast_gap():
    """fp32 weights under bf16 autocast (the trainer's setting on a GPU): the engine samples from a bf16 copy. Its
    log-probs against one full forward of the trainer under the same autocast: the sampler-vs-trainer gap that
    `mismatch/logp_gap_max` logs (measured on an H200 for the eager decoder: 8.2e-3, ../shared/docs/gpu.md)."""
    from rlcompare.rollout import token_logp

    model = _cuda_model("qwen2")
    got = _sample(model, "graphs", autocast_dtype=torch.bfloat16)
    engine = fast.decoder_for(model, 64, engine="graphs", rows=3 * 8, autocast_dtype=torch.bfloat16)
    assert engine.weights.lm_head.dtype == torch.bfloat16
    gaps = []
    with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16):
        for i in range(len(got.ids)):
            prompt = PROMPTS[i // 8]
            n = int(got.lengths[i])
            ids = torch.tensor([prompt + got.ids[i, :n].tolist()], device="cuda")
            logits = model(input_ids=ids).logits[0, len(prompt) - 1 : len(prompt) - 1 + n]
            gaps.append((token_logp(logits, got.ids[i, :n]) - got.logp[i, :n]).abs().max())
    gap = float(torch.stack(gaps).max())
    print(f"bf16 rollout copy: sampler-vs-trainer log-prob gap max {gap:.2e}")
    assert gap < 5e-2


def test_graphs_per_key_width_block_and_a_store_shared_by_two_row_counts():
    """Key blocks of 16 in a cache of 64 (prompts of 10, 32 new tokens): graphs of several widths, captured as the
    steps need them, sample the eager decoder's tokens; the 8-row engine of the same model then views the front of
    the 24-row engine's cache (one store, the larger size) and samples the eager tokens too."""
    model = _cuda_model()
    engine = fast.decoder_for(model, 42, engine="graphs", rows=3 * 8)
    engine.key_block = 16
    try:
        graphs, eager = _sample(model, "graphs"), _sample(model, "eager")
        assert torch.equal(graphs.ids, eager.ids)
        torch.testing.assert_close(graphs.logp, eager.logp, atol=1e-4, rtol=0)
        assert len({w for _, w, _ in engine.graphs}) > 1
        numel = engine.store.numel()
        small_graphs, small_eager = _sample(model, "graphs", repeats=1), _sample(model, "eager", repeats=1)
        assert torch.equal(small_graphs.ids, small_eager.ids)
        small = fast.decoder_for(model, 42, engine="graphs", rows=3)
        assert small.store is engine.store and engine.store.numel() == numel
        assert small.cache[(0, True)].data_ptr() == engine.cache[(0, True)].data_ptr()
    finally:
        engine.key_block = graph_decode.KEY_BLOCK
