"""The sampling loop: its log-probs equal a full forward's, shared prefill and row compaction change nothing."""

from __future__ import annotations

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from rlcompare.models import build_char_tokenizer
import pytest

from rlcompare.rollout.sampler import _top_p_filter, gumbel_max, left_pad, sample, sequence_logits, token_logp


def _model(seed=0):
    tok = build_char_tokenizer()
    torch.manual_seed(seed)
    cfg = LlamaConfig(
        vocab_size=len(tok),
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=4,
        intermediate_size=64,
        max_position_embeddings=64,
        pad_token_id=tok.pad_token_id,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
    )
    model = LlamaForCausalLM(cfg).eval()
    # make EOS likely so that rows finish at different steps (exercises row compaction)
    with torch.no_grad():
        model.lm_head.weight[tok.eos_token_id] *= 0
        model.lm_head.weight[tok.eos_token_id] += model.lm_head.weight.mean(0)
    return model, tok


def _prompts(tok, texts):
    return left_pad([[tok.bos_token_id] + tok(t).input_ids for t in texts], tok.pad_token_id, "cpu")


@pytest.mark.parametrize("probs", [[0.5, 0.3, 0.15, 0.05, 0.0], [0.01, 0.01, 0.97, 0.01, 0.0]])
def test_gumbel_max_draws_each_token_with_its_softmax_probability(probs):
    # 200,000 draws: the standard error of a frequency is at most sqrt(0.25 / 2e5) = 0.0011; 0.006 is > 5 of them.
    # A token of probability 0 (logit -inf) is never drawn.
    p = torch.tensor(probs)
    logits = p.log().expand(200_000, -1)
    tok = gumbel_max(logits, torch.Generator().manual_seed(0))
    freq = torch.bincount(tok, minlength=len(probs)).float() / len(tok)
    assert torch.allclose(freq, p, atol=0.006), freq
    assert freq[-1] == 0


def test_gumbel_max_is_reproducible_from_its_generator_and_honours_a_top_p_filter():
    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0]]).expand(50_000, -1)  # softmax 0.644, 0.237, 0.087, 0.032
    a = gumbel_max(logits, torch.Generator().manual_seed(3))
    assert torch.equal(a, gumbel_max(logits, torch.Generator().manual_seed(3)))
    assert not torch.equal(a, gumbel_max(logits, torch.Generator().manual_seed(4)))
    # top_p = 0.85 keeps the two most likely tokens (0.644 + 0.237 >= 0.85), renormalised: 0.731, 0.269
    tok = gumbel_max(_top_p_filter(logits, 0.85), torch.Generator().manual_seed(5))
    freq = torch.bincount(tok, minlength=4).float() / len(tok)
    assert torch.allclose(freq, torch.tensor([0.731, 0.269, 0.0, 0.0]), atol=0.01), freq


def test_sampler_logp_equals_full_forward_logp_with_shared_prefill_and_compaction():
    model, tok = _model()
    pi, pm = _prompts(tok, ["3+4=", "13+14=", "1+1="])
    g = torch.Generator().manual_seed(0)
    comp = sample(
        model,
        pi,
        pm,
        max_new_tokens=12,
        eos_id=tok.eos_token_id,
        pad_id=tok.pad_token_id,
        temperature=0.7,
        generator=g,
        repeats=4,
    )
    assert comp.ids.shape[0] == 12
    assert len(set(comp.lengths.tolist())) > 1  # rows finished at different steps
    pi_r, pm_r = pi.repeat_interleave(4, 0), pm.repeat_interleave(4, 0)
    with torch.no_grad():
        full = token_logp(sequence_logits(model, pi_r, pm_r, comp.ids, comp.mask), comp.ids, 0.7) * comp.mask
    assert torch.allclose(full, comp.logp, atol=1e-4)
    # padding after EOS: masked, pad id, zero log-prob
    assert torch.all(comp.ids[comp.mask == 0] == tok.pad_token_id) and torch.all(comp.logp[comp.mask == 0] == 0)
    ends = comp.lengths - 1
    finished = ~comp.truncated
    assert torch.all(comp.ids[finished, ends[finished]] == tok.eos_token_id)


def test_sampling_without_logprobs_draws_the_same_tokens():
    """`logprobs=False` (one update per batch reads none) skips only the log-probs: same generator, same tokens,
    rows finishing at different steps (row compaction) included."""
    model, tok = _model()
    pi, pm = _prompts(tok, ["3+4=", "13+14=", "1+1="])
    kw = dict(max_new_tokens=12, eos_id=tok.eos_token_id, pad_id=tok.pad_token_id, temperature=0.7, repeats=4)
    with_lp = sample(model, pi, pm, generator=torch.Generator().manual_seed(0), **kw)
    without = sample(model, pi, pm, generator=torch.Generator().manual_seed(0), logprobs=False, **kw)
    assert len(set(with_lp.lengths.tolist())) > 1
    assert without.logp is None and with_lp.logp is not None
    for name in ("ids", "mask", "truncated", "lengths"):
        assert torch.equal(getattr(without, name), getattr(with_lp, name)), name


def test_greedy_with_repeats_equals_one_prompt_at_a_time():
    model, tok = _model(1)
    texts = ["3+4=", "13+14=", "19+1="]
    pi, pm = _prompts(tok, texts)
    kw = dict(max_new_tokens=10, eos_id=tok.eos_token_id, pad_id=tok.pad_token_id, greedy=True)
    grouped = sample(model, pi, pm, repeats=3, **kw)
    for i, text in enumerate(texts):
        single = sample(model, *_prompts(tok, [text]), **kw)
        n = int(single.lengths[0])
        for r in range(3):
            assert grouped.ids[3 * i + r, :n].tolist() == single.ids[0, :n].tolist()
            assert int(grouped.lengths[3 * i + r]) == n


def test_several_eos_ids_stop_a_row():
    model, tok = _model()
    pi, pm = _prompts(tok, ["1+1="])
    stop = [tok.eos_token_id, tok.convert_tokens_to_ids("7")]
    comp = sample(
        model,
        pi,
        pm,
        max_new_tokens=16,
        eos_id=torch.tensor(stop),
        pad_id=tok.pad_token_id,
        generator=torch.Generator().manual_seed(3),
        repeats=8,
    )
    for row, n in zip(comp.ids, comp.lengths):
        real = row[: int(n)].tolist()
        assert all(t not in stop for t in real[:-1])  # nothing after the first stop token is kept


def test_grouped_logits_equal_per_row_logits_in_value_and_gradient():
    model, tok = _model(2)
    model.train()
    G = 3
    pi, pm = _prompts(tok, ["3+4=", "13+14="])
    comp = sample(
        model,
        pi,
        pm,
        max_new_tokens=6,
        eos_id=tok.eos_token_id,
        pad_id=tok.pad_token_id,
        generator=torch.Generator().manual_seed(0),
        repeats=G,
    )
    pi_r, pm_r = pi.repeat_interleave(G, 0), pm.repeat_interleave(G, 0)
    from rlcompare.rollout import grouped_sequence_logits

    def loss_and_grad(fn):
        model.zero_grad()
        lp = token_logp(fn(), comp.ids) * comp.mask
        (lp.sum()).backward()
        return lp.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}

    ref, g_ref = loss_and_grad(lambda: sequence_logits(model, pi_r, pm_r, comp.ids, comp.mask))
    got, g_got = loss_and_grad(lambda: grouped_sequence_logits(model, pi_r, pm_r, comp.ids, comp.mask, group_size=G))
    assert torch.allclose(ref, got, atol=1e-5)
    assert g_ref.keys() == g_got.keys()
    for n in g_ref:
        assert torch.allclose(g_ref[n], g_got[n], atol=1e-5, rtol=1e-4), n
