"""Completion log-probs and entropies through the LM head in chunks of positions (`rlcompare.train.logprobs`): the
same values and gradients as the whole logits, never more than one chunk's logits at a time, and the whole-logits
path (the default run's rows, bit for bit) wherever the logits fit the budget."""

from __future__ import annotations

import math

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM

from rlcompare.config import validate
from rlcompare.models import build_char_tokenizer
from rlcompare.rollout import grouped_sequence_logits, left_pad, lm_head_of, sample, sequence_logits
from rlcompare.train import logprobs
from rlcompare.train.trainer import TIMING_PREFIXES, Trainer

TOK = build_char_tokenizer()
G = 4


def test_log_prob_and_entropy_of_a_three_token_head_worked_by_hand():
    # logits z = W h = [0, ln 2, ln 4] -> p = [1/7, 2/7, 4/7]; at temperature 2, z/2 = [0, ln sqrt2, ln 2]:
    # p = [1, sqrt2, 2] / (3 + sqrt2)
    head = torch.nn.Linear(1, 3, bias=False)
    with torch.no_grad():
        head.weight.copy_(torch.tensor([[0.0], [math.log(2)], [math.log(4)]]))
    hidden = torch.ones(1, 2, 1)  # two positions, the same hidden state
    tokens = torch.tensor([[2, 0]])
    p = [1 / 7, 2 / 7, 4 / 7]
    h = -sum(x * math.log(x) for x in p)
    lp, ent = logprobs.stats_from_hidden(
        hidden, head, tokens, temperature=1.0, entropy=True, entropy_grad=False, chunk_positions=1
    )
    assert lp.flatten().tolist() == pytest.approx([math.log(4 / 7), math.log(1 / 7)], abs=1e-6)
    assert ent.flatten().tolist() == pytest.approx([h, h], abs=1e-6)
    s = 3 + math.sqrt(2)
    q = [1 / s, math.sqrt(2) / s, 2 / s]
    lp, ent = logprobs.stats_from_hidden(
        hidden, head, tokens, temperature=2.0, entropy=True, entropy_grad=False, chunk_positions=1
    )
    assert lp.flatten().tolist() == pytest.approx([math.log(q[2]), math.log(q[0])], abs=1e-6)
    assert ent.flatten().tolist() == pytest.approx([-sum(x * math.log(x) for x in q)] * 2, abs=1e-6)


def _loss_and_grads(params, fn):
    """A loss reading both outputs (as an update with an entropy bonus does) and its gradients."""
    for p in params:
        p.grad = None
    lp, ent = fn()
    w = torch.linspace(-1, 1, lp.numel()).view_as(lp)
    ((w * lp).sum() - 0.01 * ent.sum()).backward()
    return lp.detach(), ent.detach(), [p.grad.clone() for p in params]


@pytest.mark.parametrize("chunk", [1, 7, 64])
def test_chunks_give_the_values_and_gradients_of_the_whole_logits(chunk):
    torch.manual_seed(0)
    B, T, H, V = 3, 5, 16, 50
    hidden = torch.randn(B, T, H, requires_grad=True)
    head = torch.nn.Linear(H, V, bias=False)
    tokens = torch.randint(V, (B, T))
    kw = dict(temperature=0.7, entropy=True, entropy_grad=True)
    params = [hidden, head.weight]
    want = _loss_and_grads(params, lambda: logprobs.stats_from_logits(head(hidden), tokens, **kw))
    got = _loss_and_grads(params, lambda: logprobs.stats_from_hidden(hidden, head, tokens, chunk_positions=chunk, **kw))
    torch.testing.assert_close(got[0], want[0], rtol=0, atol=1e-6)
    torch.testing.assert_close(got[1], want[1], rtol=0, atol=1e-6)
    for g, w in zip(got[2], want[2]):
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-6)


class _CountingHead(torch.nn.Module):
    """Wraps a head and records how many positions each call projects (forward and the backward's recompute)."""

    def __init__(self, head):
        super().__init__()
        self.head, self.rows = head, []
        self.out_features = head.out_features

    def forward(self, h):
        self.rows.append(h.reshape(-1, h.shape[-1]).shape[0])
        return self.head(h)


def test_at_most_one_chunk_of_logits_exists_and_the_backward_rebuilds_each_chunk():
    torch.manual_seed(0)
    hidden = torch.randn(2, 9, 8, requires_grad=True)
    head = _CountingHead(torch.nn.Linear(8, 20, bias=False))
    tokens = torch.randint(20, (2, 9))
    lp, _ = logprobs.completion_stats(
        lambda is_hidden: hidden if is_hidden else head(hidden), head, tokens, temperature=1.0, max_logits=4 * 20
    )
    assert head.rows == [4, 4, 4, 4, 2]  # 18 positions in chunks of 4: no call sees more than 4 x 20 logits
    lp.sum().backward()
    assert sorted(head.rows[5:]) == [2, 4, 4, 4, 4]  # each chunk's logits rebuilt in the backward, none kept
    head.rows.clear()
    logprobs.completion_stats(lambda is_hidden: head(hidden), head, tokens, temperature=1.0, max_logits=18 * 20)
    assert head.rows == [18]  # within the budget: the whole logits, as before


def _model(arch="qwen2", **extra):
    cfg = AutoConfig.for_model(
        arch,
        vocab_size=len(TOK),
        pad_token_id=TOK.pad_token_id,
        eos_token_id=TOK.eos_token_id,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=64,
        max_position_embeddings=128,
        **extra,
    )
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(cfg).eval()


def _batch(model):
    prompts = [[TOK.bos_token_id] + [10 + i, 11, 12] * (1 + i) for i in range(3)]
    pi, pm = left_pad(prompts, TOK.pad_token_id, "cpu")
    comp = sample(
        model,
        pi,
        pm,
        max_new_tokens=12,
        eos_id=TOK.eos_token_id,
        pad_id=TOK.pad_token_id,
        repeats=G,
        generator=torch.Generator().manual_seed(0),
    )
    return pi.repeat_interleave(G, 0), pm.repeat_interleave(G, 0), comp


@pytest.mark.parametrize("arch,tied", [("qwen2", True), ("llama", False)])
@pytest.mark.parametrize("grouped", [False, True])
def test_a_model_in_chunks_trains_like_its_whole_logits(arch, tied, grouped):
    model = _model(arch, tie_word_embeddings=tied)
    pi, pm, comp = _batch(model)
    model.train()
    head = lm_head_of(model)
    assert head is not None

    def forward(hidden):
        if grouped:
            return grouped_sequence_logits(model, pi, pm, comp.ids, comp.mask, group_size=G, hidden=hidden)
        return sequence_logits(model, pi, pm, comp.ids, comp.mask, hidden=hidden)

    kw = dict(temperature=0.9, entropy=True, entropy_grad=True)
    params = list(model.parameters())
    want = _loss_and_grads(params, lambda: logprobs.completion_stats(forward, head, comp.ids, **kw))
    V = head.out_features
    assert comp.ids.numel() * V <= logprobs.MAX_LOGITS  # the default budget: whole logits here
    got = _loss_and_grads(params, lambda: logprobs.completion_stats(forward, head, comp.ids, max_logits=5 * V, **kw))
    assert isinstance(model.lm_head, torch.nn.Linear)  # the head is back in place after the hidden forward
    torch.testing.assert_close(got[0], want[0], rtol=0, atol=2e-6)
    torch.testing.assert_close(got[1], want[1], rtol=0, atol=2e-6)
    for g, w in zip(got[2], want[2]):
        torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-6)


def test_models_whose_logits_are_more_than_the_head_keep_the_whole_logits():
    model = _model("gemma2", final_logit_softcapping=30.0, head_dim=8)  # tanh soft-capping after the head
    assert lm_head_of(model) is None
    assert lm_head_of(_model("qwen2")) is not None


def _rows(compose, tmp_path, name, *extra):
    tr = Trainer(validate(compose("budget.max_steps=2", *SMALL_STEPS, *extra)), tmp_path / name)
    return [{k: v for k, v in tr.step().items() if not k.startswith(TIMING_PREFIXES)} for _ in range(2)]


# as tests/fast/test_recorded_update.py: tiny steps, so that step 2 samples from nearly the same weights; step 1
# agrees to 1e-4 relative (the head's gradient summed per chunk), step 2 to its looser tolerance
SMALL_STEPS = ["trainer.lr=3e-8", "algorithm.critic.lr=3e-8"]
TOL = {1: dict(rel=1e-4, abs=1e-5), 2: dict(rel=1e-2, abs=1e-3)}


@pytest.mark.slow
@pytest.mark.parametrize(
    "extra",
    [
        (),  # the default (the first update rebuilt from the rollout's record: its hidden states then)
        ("algorithm.kl.coef=0.05", "algorithm.entropy_coef=0.01", "trainer.updates_per_rollout=2"),
        ("trainer.update_from_rollout=false", "trainer.recompute_old_logp=true", "algorithm.top_entropy_quantile=0.8"),
    ],
)
def test_a_run_in_chunks_matches_the_whole_logits_run(compose, tmp_path, monkeypatch, extra):
    whole = _rows(compose, tmp_path, "whole", *extra)
    monkeypatch.setattr(logprobs, "MAX_LOGITS", 3 * len(TOK))  # 3 positions a chunk
    calls, in_chunks = [], logprobs.stats_from_hidden
    monkeypatch.setattr(logprobs, "stats_from_hidden", lambda *a, **k: calls.append(1) or in_chunks(*a, **k))
    chunked = _rows(compose, tmp_path, "chunked", *extra)
    assert calls  # the chunked path ran
    for step, (c, w) in enumerate(zip(chunked, whole), 1):
        assert c.keys() == w.keys()
        for k in w:
            if isinstance(w[k], float) and isinstance(c[k], float):
                assert c[k] == pytest.approx(w[k], nan_ok=True, **TOL[step]), (step, k)
            else:
                assert c[k] == w[k], (step, k)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA (scripts/gpu_check.sh runs it on a GPU)")
def test_on_cuda_chunks_under_bf16_autocast_match_and_hold_less_memory():
    """A Qwen2.5-sized vocabulary on CUDA under bf16 autocast: the chunked path's log-probs, entropies and gradients
    match the whole logits' (to bf16 precision), and its peak memory is a fraction of theirs."""
    torch.manual_seed(0)
    B, T, H, V = 16, 256, 256, 151936
    hidden = torch.randn(B, T, H, device="cuda", requires_grad=True)
    head = torch.nn.Linear(H, V, bias=False).cuda()
    tokens = torch.randint(V, (B, T), device="cuda")
    kw = dict(temperature=1.0, entropy=True, entropy_grad=True, autocast_dtype=torch.bfloat16)

    def whole(is_hidden):
        with torch.autocast("cuda", dtype=torch.bfloat16):
            return hidden if is_hidden else head(hidden)

    def run(max_logits):
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        out = _loss_and_grads(
            [hidden, head.weight], lambda: logprobs.completion_stats(whole, head, tokens, max_logits=max_logits, **kw)
        )
        return out, torch.cuda.max_memory_allocated() - base

    want, whole_peak = run(B * T * V)  # within the budget: the whole logits
    got, chunked_peak = run(256 * V)  # 256 positions a chunk
    torch.testing.assert_close(got[0], want[0], rtol=0, atol=1e-3)
    torch.testing.assert_close(got[1], want[1], rtol=0, atol=1e-3)
    for g, w in zip(got[2], want[2]):  # bf16 products: each chunk's partial sum is rounded on its own
        assert float((g - w).norm() / w.norm()) < 1e-2
    assert chunked_peak < whole_peak / 4, (chunked_peak, whole_peak)


@pytest.mark.slow
def test_fsdp_sharded_copy_in_chunks_gets_the_gradients_of_the_whole_logits(tmp_path):
    """trainer.parallel=fsdp trains a `fully_shard` copy (one gloo rank here): the chunked head runs outside the
    root's forward, on the root's unsharded weights, and still gets the plain model's gradients."""
    import torch.distributed as dist

    from rlcompare.train import sharding

    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        model = _model("qwen2", tie_word_embeddings=True)
        pi, pm, comp = _batch(model)
        model.train()
        sharded = sharding.shard_copy(model, "cpu")
        sharded.train()

        def run(m, budget):
            m.zero_grad(set_to_none=True)
            fwd = lambda hidden: grouped_sequence_logits(m, pi, pm, comp.ids, comp.mask, group_size=G, hidden=hidden)  # noqa: E731
            lp, ent = logprobs.completion_stats(
                fwd, lm_head_of(m), comp.ids, temperature=1.0, entropy=True, entropy_grad=True, max_logits=budget
            )
            (lp.sum() - 0.01 * ent.sum()).backward()
            return lp.detach(), {n: sharding.full_tensor(p.grad) for n, p in m.named_parameters()}

        want, want_grads = run(model, None)
        got, got_grads = run(sharded, 5 * len(TOK))
        torch.testing.assert_close(got, want, rtol=0, atol=2e-6)
        assert want_grads.keys() == got_grads.keys()
        for n in want_grads:
            torch.testing.assert_close(got_grads[n], want_grads[n], rtol=1e-4, atol=1e-6)
    finally:
        dist.destroy_process_group()
