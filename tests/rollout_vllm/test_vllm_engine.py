"""rollout.engine=vllm on the CPU build (`.ci/run vllm`): the engine keeps the sampler's contract on the tiny model
(built from its config, saved to a folder vLLM loads), its log-probs are rlcompare's, seeds make draws repeatable
and independent of the batch, and a weight push makes it sample the updated policy. Skipped without vllm."""

from __future__ import annotations

import copy
import os

import pytest
import torch
from omegaconf import OmegaConf

pytest.importorskip("vllm", reason="rollout.engine=vllm needs the [vllm] extra")

from rlcompare.models.load import build_char_tokenizer, tiny_model_config  # noqa: E402
from rlcompare.rollout import left_pad, sample  # noqa: E402
from rlcompare.rollout.sampler import sequence_logits, token_logp  # noqa: E402
from rlcompare.rollout.streams import GroupStreams  # noqa: E402
from rlcompare.rollout.vllm_engine import VllmSampler  # noqa: E402

pytestmark = pytest.mark.vllm

TOK = build_char_tokenizer()
PROMPTS = ["12+34=", "7*8=", "100-1="]
# float32 on both sides, different kernels (vLLM's CPU attention and fused q/k/v against transformers' sdpa): a
# log-prob is a difference of logits of size ~5 and their logsumexp, each off by a few float32 ulps (~5e-7) per
# reduction order change through 2 layers; 1e-4 leaves two orders of margin, while a wrong temperature
# (0.7 vs 1) or a log-prob off by one position moves them by > 1e-2 (asserted below)
LOGP_TOL = 1e-4


def _model(seed: int = 0):
    from transformers import LlamaForCausalLM

    m = OmegaConf.create(
        dict(hidden_size=128, num_layers=2, num_heads=4, intermediate_size=256, max_position_embeddings=64)
    )
    torch.manual_seed(seed)
    return LlamaForCausalLM(tiny_model_config(m, TOK)).eval()


@pytest.fixture(scope="module")
def model():
    return _model()


@pytest.fixture(scope="module")
def engine(model):
    e = VllmSampler(model, max_model_len=64, max_num_seqs=32, seed=0)
    assert not os.path.exists(e.folder)  # the saved copy of the weights is removed once the engine holds them
    return e


def _prompts(texts=PROMPTS):
    return left_pad([TOK(t).input_ids for t in texts], TOK.pad_token_id, "cpu")


def _kw(**kw):
    return {"max_new_tokens": 12, "eos_id": [TOK.eos_token_id], "pad_id": TOK.pad_token_id, **kw}


def test_greedy_completions_are_the_eager_sampler_s_and_stop_at_eos(model, engine):
    ids, mask = _prompts()
    eager = sample(model, ids, mask, greedy=True, **_kw())
    got = engine(model, ids, mask, greedy=True, logprobs=False, **_kw())
    assert torch.equal(got.ids, eager.ids) and torch.equal(got.mask, eager.mask)  # the same greedy tokens
    assert got.logp is None and bool(got.truncated.all()) and got.lengths.tolist() == [12, 12, 12]
    # an end token the greedy rows do emit: each row stops at its first, EOS kept (mask 1), pad after
    eos = int(eager.ids[0, 3])
    stopped = engine(model, ids, mask, greedy=True, logprobs=False, **_kw(eos_id=[eos, TOK.eos_token_id]))
    for r in range(3):
        row = eager.ids[r].tolist()
        n = row.index(eos) + 1 if eos in row else 12
        assert stopped.lengths[r] == n and bool(stopped.truncated[r]) == (eos not in row)
        assert stopped.ids[r, :n].tolist() == row[:n] and stopped.mask[r].tolist() == [1] * n + [0] * (
            len(stopped.mask[r]) - n
        )
        assert (stopped.ids[r, n:] == TOK.pad_token_id).all()
    assert stopped.ids.shape[1] == int(stopped.lengths.max())  # padded to the longest row, as the sampler pads
    assert stopped.lengths[0] <= 4 and not stopped.truncated[0]


def test_log_probs_are_rlcompare_s_at_the_sampling_temperature(model, engine):
    ids, mask = _prompts()
    c = engine(model, ids, mask, temperature=0.7, repeats=4, **_kw())
    assert c.ids.shape[0] == 12 and c.logp.shape == c.ids.shape
    pi, pm = ids.repeat_interleave(4, 0), mask.repeat_interleave(4, 0)
    with torch.no_grad():
        logits = sequence_logits(model, pi, pm, c.ids, c.mask)
    want = token_logp(logits, c.ids, 0.7) * c.mask
    assert (c.logp * (1 - c.mask) == 0).all()  # 0 past the end, as the sampler leaves them
    assert torch.allclose(c.logp, want, atol=LOGP_TOL, rtol=0)
    assert (token_logp(logits, c.ids, 1.0) * c.mask - want).abs().max() > 1e-2  # the tolerance can tell T apart


def _streams(keys):
    return GroupStreams(keys, 4, "cpu")


def test_same_seed_same_completions_and_a_group_s_draws_do_not_depend_on_the_batch(model, engine):
    ids, mask = _prompts()
    a = engine(model, ids, mask, repeats=4, streams=_streams([(0, 1, 0, g) for g in range(3)]), **_kw())
    b = engine(model, ids, mask, repeats=4, streams=_streams([(0, 1, 0, g) for g in range(3)]), **_kw())
    assert torch.equal(a.ids, b.ids) and torch.equal(a.logp, b.logp)
    # the last group alone, keyed as before: its four completions again (vLLM seeds each request's own generator)
    alone = engine(model, ids[2:], mask[2:], repeats=4, streams=_streams([(0, 1, 0, 2)]), **_kw())
    n = alone.ids.shape[1]
    assert torch.equal(alone.ids, a.ids[8:, :n]) and (a.ids[8:, n:] == TOK.pad_token_id).all()
    other = engine(model, ids, mask, repeats=4, streams=_streams([(0, 2, 0, g) for g in range(3)]), **_kw())
    assert not torch.equal(other.ids, a.ids)  # another step's key: other draws
    # without streams the run's generator draws the seeds: the same generator state, the same completions
    g1, g2 = torch.Generator().manual_seed(5), torch.Generator().manual_seed(5)
    assert torch.equal(
        engine(model, ids, mask, generator=g1, **_kw()).ids, engine(model, ids, mask, generator=g2, **_kw()).ids
    )


def test_a_weight_push_makes_the_engine_sample_the_updated_policy(model, engine):
    ids, mask = _prompts()
    updated = copy.deepcopy(model)
    opt = torch.optim.SGD(updated.parameters(), lr=0.5)
    c = sample(model, ids, mask, greedy=True, **_kw())  # one step raising the log-prob of other completions
    loss = -token_logp(sequence_logits(updated, ids, mask, c.ids.roll(1, 1), c.mask), c.ids.roll(1, 1)).sum()
    loss.backward()
    opt.step()
    before = engine(model, ids, mask, greedy=True, logprobs=False, **_kw())
    want = sample(updated, ids, mask, greedy=True, **_kw())
    assert not torch.equal(want.ids, before.ids)  # the step changed the greedy completions
    try:
        seconds = engine.push(updated)
        assert seconds > 0 and engine.sync_s == seconds
        after = engine(model, ids, mask, greedy=True, logprobs=False, **_kw())
        assert torch.equal(after.ids, want.ids)  # the prefix cache of the old weights was dropped too
        s = engine(model, ids, mask, temperature=0.7, repeats=2, **_kw())
        with torch.no_grad():
            logits = sequence_logits(updated, ids.repeat_interleave(2, 0), mask.repeat_interleave(2, 0), s.ids, s.mask)
        assert torch.allclose(s.logp, token_logp(logits, s.ids, 0.7) * s.mask, atol=LOGP_TOL, rtol=0)
    finally:
        engine.push(model)
    assert torch.equal(engine(model, ids, mask, greedy=True, logprobs=False, **_kw()).ids, before.ids)
