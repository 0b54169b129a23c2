"""The update rebuilt from the sampler's projections (`rlcompare.fast.recorded_update`) gives the gradient of the ordinary
forward, skips exactly the rows that carry no gradient, and is used only where it is exact.

The reference in every test is the ordinary update path: `grouped_sequence_logits` (transformers' forward)
differentiated by autograd.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from rlcompare import fast
from rlcompare.fast import recorded_update, static_decode
from rlcompare.config import validate
from rlcompare.fast.recorded_update import can_rebuild, rebuilt_logits
from rlcompare.rollout import grouped_sequence_logits, left_pad, sample, token_logp
from rlcompare.train.trainer import TIMING_PREFIXES, Trainer
from test_static_decode import CASES, PROMPTS, TOK, _model
from conftest import record_step_gradients

G = 8
KW = dict(max_new_tokens=24, eos_id=TOK.eos_token_id, pad_id=TOK.pad_token_id, repeats=G)


def _eos_model(arch="llama", **extra):
    """A tiny model whose LM head has a bias making EOS likely (~4 % a token): rows end early and leave the decoder."""
    model = _model(arch, **{**CASES.get(arch, (arch, {}))[1], **extra})
    head = torch.nn.Linear(model.lm_head.in_features, model.lm_head.out_features, bias=True)
    with torch.no_grad():
        head.weight.copy_(model.lm_head.weight)
        head.bias.zero_()
        head.bias[TOK.eos_token_id] = 1.5
    model.lm_head = head
    return model


def _rollout(model, seed=0, record=True):
    pi, pm = left_pad(PROMPTS, TOK.pad_token_id, "cpu")
    comp = sample(model, pi, pm, generator=torch.Generator().manual_seed(seed), record=record, **KW)
    return pi.repeat_interleave(G, 0), pm.repeat_interleave(G, 0), comp


def _loss(logits, comp, adv):
    """GRPO-style token-mean loss on the sampled tokens (any function of the logits would do)."""
    lp = token_logp(logits, comp.ids) * comp.mask
    return -(adv[:, None] * lp).sum() / comp.mask.sum()


def _grads(model, logits_fn, comp, adv):
    model.zero_grad(set_to_none=True)
    logits = logits_fn()
    _loss(logits, comp, adv).backward()
    return logits.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}


def _ordinary_and_rebuilt(model, record, rows, pi, pm, comp, adv):
    """(logits, gradients) of the ordinary forward, then of the rebuild, for the rollout rows `rows`."""
    model.train()
    want = _grads(model, lambda: grouped_sequence_logits(model, pi, pm, comp.ids, comp.mask, group_size=G), comp, adv)
    got = _grads(model, lambda: rebuilt_logits(model, record, rows, pi, pm, comp.ids, group_size=G), comp, adv)
    return want, got


def _assert_same_grads(got, want, *, floor=0.0, eps=0.0):
    """Each gradient to 1e-5 of its scale (raised to `floor` x the largest gradient's), plus `eps`."""
    top = max(float(g.abs().max()) for g in want.values())
    for name, g in want.items():
        scale = max(float(g.abs().max()), floor * top)
        torch.testing.assert_close(got[name], g, atol=1e-5 * scale + eps, rtol=0, msg=lambda s: f"{name}: {s}")


@pytest.mark.parametrize("case", sorted(CASES))
def test_the_rebuilt_forward_gives_the_gradient_of_the_ordinary_forward(case):
    arch, extra = CASES[case]
    model = _eos_model(arch, **extra)
    pi, pm, comp = _rollout(model)
    rec = comp.recording.projections
    assert isinstance(rec, static_decode.ProjectionRecord)
    assert rec.rows is not None and 0 < len(rec.rows) < 3 * G  # some rows ended early and left the decoder
    adv = torch.randn(3 * G, generator=torch.Generator().manual_seed(1))
    adv[G : 2 * G] = 0.0  # one group without gradient: its rows are skipped in the backward
    (want_logits, want), (got_logits, got) = _ordinary_and_rebuilt(model, rec, torch.arange(3 * G), pi, pm, comp, adv)
    m = comp.mask.bool()
    torch.testing.assert_close(got_logits[m], want_logits[m], atol=1e-5, rtol=0)
    # a gradient that is zero in exact arithmetic (the key bias: softmax ignores a shift shared by all keys) is
    # float noise, held to 1e-8 of the largest gradient
    _assert_same_grads(got, want, floor=1e-3)


def test_long_rows_take_the_fused_attention_kernel_with_the_same_gradient(monkeypatch):
    """Scores above `_EXPLICIT_ATTENTION_BYTES` go to `scaled_dot_product_attention` with the boolean mask (no
    `[B, heads, T, S]` additive mask is built); the gradient is the ordinary forward's there too."""
    monkeypatch.setattr(recorded_update, "_EXPLICIT_ATTENTION_BYTES", 0)
    calls = []
    sdpa = recorded_update.F.scaled_dot_product_attention
    monkeypatch.setattr(
        recorded_update.F,
        "scaled_dot_product_attention",
        lambda *a, **k: calls.append(k["attn_mask"].dtype) or sdpa(*a, **k),
    )
    model = _eos_model()  # Llama with grouped key/value heads (4 query heads, 2 key/value heads)
    pi, pm, comp = _rollout(model)
    calls.clear()  # the sampler's own calls
    adv = torch.randn(3 * G, generator=torch.Generator().manual_seed(1))
    model.train()
    want = _grads(model, lambda: grouped_sequence_logits(model, pi, pm, comp.ids, comp.mask, group_size=G), comp, adv)[
        1
    ]
    calls.clear()
    got = _grads(
        model,
        lambda: rebuilt_logits(model, comp.recording.projections, torch.arange(3 * G), pi, pm, comp.ids, group_size=G),
        comp,
        adv,
    )[1]
    assert calls and set(calls) == {torch.bool}
    _assert_same_grads(got, want, floor=1e-3)


@pytest.mark.parametrize("groups", [(2, 0), (1, 2, 0)], ids=["subset", "all-shuffled"])
def test_a_subset_of_groups_in_any_order_rebuilds_its_own_rows(groups):
    """A subset of the groups (the record is gathered) or all of them shuffled, as one mini-batch is (rebuilt
    in the record's order, the logits put back in the batch's order)."""
    model = _eos_model()
    pi, pm, comp = _rollout(model)
    rows = torch.cat([torch.arange(i * G, (i + 1) * G) for i in groups])
    adv = torch.randn(len(rows), generator=torch.Generator().manual_seed(2))
    sub = type(comp)(comp.ids[rows], comp.mask[rows], comp.logp[rows], comp.truncated[rows], comp.lengths[rows])
    (_, want), (_, got) = _ordinary_and_rebuilt(model, comp.recording.projections, rows, pi[rows], pm[rows], sub, adv)
    _assert_same_grads(got, want)


def test_a_recording_placed_in_a_larger_batch_rebuilds_its_own_rows_and_declines_the_others():
    """Over several ranks a rank's recording sits at its groups' rows of the gathered batch (`Recording.placed`):
    those rows rebuild as the ordinary forward; a row sampled elsewhere (no recorded row) makes the speed layer
    decline (None), so the trainer runs the plain forward instead of reading another row's projections."""
    model = _eos_model()
    pi, pm, comp = _rollout(model)
    at = torch.cat([torch.arange(g * G, (g + 1) * G) for g in (3, 1, 4)])  # its 3 groups: 3, 1, 4 of 5
    placed = comp.recording.placed(at, 5 * G)
    assert placed.rows[at].tolist() == list(range(3 * G))
    assert (placed.rows[:G] == -1).all() and (placed.rows[2 * G : 3 * G] == -1).all()
    mine = torch.arange(G, 2 * G)  # the batch's group 1: the recording's group 1
    adv = torch.randn(G, generator=torch.Generator().manual_seed(3))
    sub = type(comp)(comp.ids[mine], comp.mask[mine], comp.logp[mine], comp.truncated[mine], comp.lengths[mine])
    p1, m1 = pi[mine], pm[mine]
    want = _grads(model, lambda: grouped_sequence_logits(model, p1, m1, sub.ids, sub.mask, group_size=G), sub, adv)
    got = _grads(
        model, lambda: fast.recorded_update_forward(model, placed, mine, p1, m1, sub.ids, group_size=G), sub, adv
    )
    _assert_same_grads(got[1], want[1])
    other = torch.arange(0, G)  # the batch's group 0: another rank's
    assert fast.recorded_update_forward(model, placed, other, pi[:G], pm[:G], comp.ids[:G], group_size=G) is None


def test_the_backward_computes_only_rows_with_a_gradient(monkeypatch):
    """Projection-backward FLOPs, counted by hand: 2 (dX) + 2 (dW) FLOPs per weight per live token row. Live: the
    real prompt tokens of the groups with a gradient, and, in their completions, every fed token that precedes a
    real token (a completion of n tokens feeds n - 1 of them)."""
    monkeypatch.setattr(
        recorded_update, "_FLOP_PER_BYTE", {"cpu": 0.0}
    )  # skip dead rows however few (see the next test)
    model = _eos_model("qwen2")  # biases too
    pi, pm, comp = _rollout(model)
    adv = torch.zeros(3 * G)
    adv[2 * G :] = torch.linspace(-1, 1, G)  # only group 2 has a gradient
    flops = []

    class Observer:  # fast.FlopObserver
        add = staticmethod(flops.append)

    model.train()
    logits = rebuilt_logits(
        model, comp.recording.projections, torch.arange(3 * G), pi, pm, comp.ids, group_size=G, flop_observer=Observer()
    )
    n_forward = len(flops)  # attention and LM head, counted when the forward is built
    _loss(logits, comp, adv).backward()
    weights = sum(
        m.weight.numel()
        for layer in model.model.layers
        for mods in static_decode.projection_modules(layer)
        for m in mods
    )
    prompt_tokens = len(PROMPTS[2])
    completion_tokens = int((comp.lengths[2 * G :] - 1).clamp(min=0).sum())
    assert sum(flops[n_forward:]) == 4.0 * weights * (prompt_tokens + completion_tokens)


def test_dead_rows_are_skipped_only_when_that_saves_more_than_the_copies():
    """100 rows, 128 -> 128 projection, 15 FLOP per byte: a dead row saves 4 * 128 * 128 = 65,536 FLOPs, a live
    one costs 15 * 8 * 256 = 30,720 in copies. 10 dead rows: 655,360 < 90 * 30,720 -> dense. 50 dead:
    3,276,800 > 50 * 30,720 = 1,536,000 -> gather."""
    live = recorded_update._LiveRows()
    assert live.pick(128, 128, 0.0) is None  # not known yet: every row
    live.set(torch.arange(100) < 90)
    assert live.pick(128, 128, 15.0) is None
    live.set(torch.arange(100) % 2 == 0)
    assert torch.equal(live.pick(128, 128, 15.0), torch.arange(0, 100, 2))
    live.set(torch.ones(100, dtype=torch.bool))
    assert live.pick(4096, 4096, 0.0) is None  # nothing dead: nothing to skip


@pytest.mark.parametrize(
    "split", [["trainer.updates_per_rollout=1"], ["trainer.updates_per_rollout=2", "trainer.micro_batch_size=4"]]
)
@pytest.mark.slow  # over ~2.5 s on 2 idle cores: out of the quick subset (issue 63), in CI's whole suite
def test_the_first_update_runs_no_forward_projection_and_moves_the_weights_the_same(compose, tmp_path, split):
    """Trainer level. With the rebuild the policy's projections are never called during the first update (the
    sampler computed them; with 2 mini-batches of 2 groups, in micro-batches of one group, the second mini-batch
    runs the ordinary forward: 4 layers' worth of calls instead of 8); the first gradient AdamW receives is the
    ordinary one."""

    def run(name, *extra):
        tr = Trainer(validate(compose(*split, *extra)), tmp_path / name)
        b = tr.collect().batch
        b.rewards = torch.linspace(0, 1, len(b.rewards))  # every group informative
        calls = []
        hooks = [
            m.register_forward_hook(lambda *a: calls.append(1))
            for m in tr.policy.model.modules()
            if isinstance(m, torch.nn.Linear) and m is not tr.policy.model.lm_head
        ]
        grads = record_step_gradients(tr)
        up = tr.update(b, tr.targets.advantages(b), None).metrics
        for h in hooks:
            h.remove()
        return tr, b, up, len(calls), grads[0]

    ref, b_ref, up_ref, calls_ref, g_ref = run("ordinary", "trainer.update_from_rollout=false")
    fast, b_fast, up_fast, calls_fast, g_fast = run("rebuild")
    assert b_ref.completions.recording is None and b_fast.completions.recording is not None
    assert torch.equal(b_ref.completions.ids, b_fast.completions.ids)  # same seed, same batch
    assert calls_ref > 0 and calls_fast == (0 if split == ["trainer.updates_per_rollout=1"] else calls_ref // 2)
    for g, h in zip(g_ref, g_fast):
        torch.testing.assert_close(h, g, atol=1e-5 * float(g.abs().max()) + 1e-12, rtol=0)
    for k in ("loss/policy", "policy/entropy", "objective_per_token", "clip_frac_low", "ratio_mean"):
        assert abs(up_fast[k] - up_ref[k]) < 1e-5, k


def test_a_record_is_reused_when_its_shapes_match():
    model = _eos_model()
    _, _, first = _rollout(model, seed=0)
    first_rec = first.recording.projections
    for buf in [t for layer in first_rec.prompt + first_rec.completion for t in layer if t is not None]:
        buf.fill_(float("nan"))  # stale values must never reach the update: NaN would show
    pi, pm = left_pad(PROMPTS, TOK.pad_token_id, "cpu")
    second = sample(model, pi, pm, generator=torch.Generator().manual_seed(5), record=first.recording, **KW)
    assert second.recording.projections is first_rec and not torch.equal(second.ids, first.ids)
    rec = second.recording.projections
    assert rec.rows is not None and len(rec.rows) < 3 * G  # rows left the decoder: their later positions unwritten
    fed = second.ids.shape[1] - 1
    for buf in [t for layer in rec.prompt for t in layer if t is not None] + [
        t[:, :fed] for layer in rec.completion for t in layer if t is not None
    ]:
        assert bool(torch.isfinite(buf).all())  # written by this rollout, or zeroed when the row left
    pir, pmr = pi.repeat_interleave(G, 0), pm.repeat_interleave(G, 0)
    adv = torch.randn(3 * G, generator=torch.Generator().manual_seed(3))
    (_, want), (_, got) = _ordinary_and_rebuilt(model, rec, torch.arange(3 * G), pir, pmr, second, adv)
    _assert_same_grads(got, want)
    longer = sample(
        model,
        pi,
        pm,
        generator=torch.Generator().manual_seed(5),
        record=first.recording,
        **{**KW, "max_new_tokens": 30},
    )
    assert longer.recording.projections is not first_rec  # other shapes: a new record


def test_the_rebuild_is_off_where_it_would_not_be_exact():
    from peft import LoraConfig, get_peft_model

    assert can_rebuild(_model("llama"), 40) is None
    assert "GPT2LMHeadModel" in can_rebuild(_model("gpt2", n_embd=32, n_layer=1, n_head=2), 40)
    assert can_rebuild(_model("llama"), 40, autocast_dtype=torch.bfloat16) == "autocast"
    assert can_rebuild(_model("llama"), 40, gradient_checkpointing=True) == "gradient checkpointing"
    assert can_rebuild(_model("llama", attention_dropout=0.1), 40) == "attention dropout"
    assert "bfloat16" in can_rebuild(_model("llama").to(torch.bfloat16), 40)
    lora = get_peft_model(_model("llama"), LoraConfig(r=4, target_modules="all-linear", task_type="CAUSAL_LM"))
    assert "LoRA" in can_rebuild(lora, 40)
    # and the sampler keeps no record where the decoder is transformers' own
    pi, pm = left_pad(PROMPTS, TOK.pad_token_id, "cpu")
    assert (
        sample(_model("llama"), pi, pm, record=True, kv_cache="dynamic", **{**KW, "max_new_tokens": 4}).recording
        is None
    )
    # nor where the update would not be exact: the speed layer reads these from the model itself (gradient
    # checkpointing as transformers enables it) and from the sampler's autocast; the decoder is still the fast one
    from rlcompare import fast
    from rlcompare.models import enable_gradient_checkpointing

    checkpointed = _model("llama")
    enable_gradient_checkpointing(checkpointed)
    for model, kw in ((checkpointed, {}), (_model("llama"), {"autocast_dtype": torch.bfloat16}), (lora, {})):
        assert isinstance(fast.decoder_for(model, 40, record=True, **kw), static_decode.StaticDecoder)
        assert sample(model, pi, pm, record=True, **{**KW, "max_new_tokens": 4, **kw}).recording is None


def test_a_single_new_token_rebuilds_from_the_prompt_alone():
    model = _eos_model()
    pi, pm = left_pad(PROMPTS, TOK.pad_token_id, "cpu")
    comp = sample(model, pi, pm, generator=torch.Generator().manual_seed(0), record=True, **{**KW, "max_new_tokens": 1})
    assert comp.ids.shape[1] == 1 and comp.recording.projections.completion[0][0].shape[0] == 0  # no token is ever fed
    pir, pmr = pi.repeat_interleave(G, 0), pm.repeat_interleave(G, 0)
    adv = torch.randn(3 * G, generator=torch.Generator().manual_seed(4))
    (_, want), (_, got) = _ordinary_and_rebuilt(
        model, comp.recording.projections, torch.arange(3 * G), pir, pmr, comp, adv
    )
    _assert_same_grads(got, want, eps=1e-12)


def _mlp_inputs(model, ids, mask):
    """Each layer's MLP input `[B, T, H]` in transformers' own forward of `ids` (left-padded by `mask`)."""
    seen = []
    hooks = [
        layer.mlp.register_forward_hook(lambda mod, args, out: seen.append(args[0].detach()))
        for layer in model.model.layers
    ]
    try:
        with torch.no_grad():
            model(input_ids=ids, attention_mask=mask, position_ids=(mask.cumsum(-1) - 1).clamp(min=0), use_cache=False)
    finally:
        for hook in hooks:
            hook.remove()
    return seen


def test_the_record_holds_the_mlp_activations_instead_of_gate_and_up():
    """For every position the sampler fed, the record holds silu(g), silu(g) * u and u * silu'(g) of the model's
    own gate and up outputs g, u (silu(g) = g s, silu'(g) = s (1 + g (1 - s)), s = sigmoid(g), written out here),
    and keeps no gate/up outputs."""
    model = _eos_model()
    pi, pm, comp = _rollout(model)
    rec = comp.recording.projections
    P, T1 = pi.shape[1], rec.completion[0][static_decode.ACT].shape[0]  # [T1, B, width], time-major
    ids = torch.cat([pi, comp.ids[:, :T1]], 1)
    mask = torch.cat([pm, torch.ones_like(comp.ids[:, :T1])], 1)
    real = pm[::G].bool()  # prompt tokens (the prompt record has one row per prompt)
    fed = torch.arange(T1)[None] < (comp.lengths - 1)[:, None]  # completion tokens fed while their row decoded
    assert 0 < int(fed.sum()) < fed.numel()
    for li, h in enumerate(_mlp_inputs(model, ids, mask)):
        assert rec.prompt[li][static_decode.GATE_UP] is None and rec.completion[li][static_decode.GATE_UP] is None
        mlp = model.model.layers[li].mlp
        with torch.no_grad():
            g, u = mlp.gate_proj(h), mlp.up_proj(h)
        s = torch.sigmoid(g)
        want = {
            static_decode.ACT: g * s,
            static_decode.GATED: g * s * u,
            static_decode.GATE_GRAD: u * s * (1 + g * (1 - s)),
        }
        for slot, w in want.items():
            torch.testing.assert_close(rec.prompt[li][slot][real], w[::G, :P][real], atol=1e-5, rtol=1e-4)
            torch.testing.assert_close(
                rec.completion[li][slot].transpose(0, 1)[fed], w[:, P:][fed], atol=1e-5, rtol=1e-4
            )


@pytest.mark.parametrize("case", ["llama-gqa", "qwen2-bias", "qwen3-qk-norm"])
def test_the_record_holds_queries_and_keys_roped_except_for_qwen3(case):
    """The record's q/k/v rows are the model's own projections (q_proj, k_proj, v_proj hooked in transformers'
    forward), with q and k roped by transformers' `apply_rotary_pos_emb` at each token's position, except for
    Qwen3, whose per-head q/k norms need their inputs: there q and k are as projected. v is never roped."""
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

    arch, extra = CASES[case]
    model = _eos_model(arch, **extra)
    pi, pm, comp = _rollout(model)
    rec = comp.recording.projections
    assert rec.qk_roped == (arch != "qwen3")
    T1 = rec.completion[0][static_decode.QKV].shape[0]
    ids = torch.cat([pi, comp.ids[:, :T1]], 1)
    mask = torch.cat([pm, torch.ones_like(comp.ids[:, :T1])], 1)
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    outs = {}
    attn0 = model.model.layers[0].self_attn
    hooks = [
        getattr(attn0, f"{n}_proj").register_forward_hook(lambda m, a, o, n=n: outs.__setitem__(n, o.detach()))
        for n in "qkv"
    ]
    try:
        with torch.no_grad():
            model(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=False)
            cos, sin = model.model.rotary_emb(outs["q"], pos)
    finally:
        for h in hooks:
            h.remove()
    nh, kvh, hd = static_decode.head_dims(model.config)
    B, L = ids.shape
    q, k = outs["q"].view(B, L, nh, hd).transpose(1, 2), outs["k"].view(B, L, kvh, hd).transpose(1, 2)
    if rec.qk_roped:
        q, k = apply_rotary_pos_emb(q, k, cos, sin)
    want = torch.cat([q.transpose(1, 2).reshape(B, L, -1), k.transpose(1, 2).reshape(B, L, -1), outs["v"]], -1)
    P = pi.shape[1]
    real = pm[::G].bool()
    fed = torch.arange(T1)[None] < (comp.lengths - 1)[:, None]
    torch.testing.assert_close(rec.prompt[0][static_decode.QKV][real], want[::G, :P][real], atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(
        rec.completion[0][static_decode.QKV].transpose(0, 1)[fed], want[:, P:][fed], atol=1e-5, rtol=1e-4
    )


def test_the_rebuild_runs_no_silu():
    """The MLP's SiLU work is the sampler's (`test_the_record_holds_...`): the rebuild's forward and backward
    run no `silu` or `silu_backward`."""
    model = _eos_model()
    pi, pm, comp = _rollout(model)
    model.train()
    adv = torch.randn(3 * G, generator=torch.Generator().manual_seed(1))
    with torch.profiler.profile() as prof:
        logits = rebuilt_logits(model, comp.recording.projections, torch.arange(3 * G), pi, pm, comp.ids, group_size=G)
        _loss(logits, comp, adv).backward()
    names = {e.name for e in prof.events()}
    assert "aten::mm" in names and not names & {"aten::silu", "aten::silu_", "aten::silu_backward"}


def _rollout_ending_early():
    """A rollout whose rows all end well before the 40 tokens allowed (EOS about 1 token in 3): (model, prompt ids,
    prompt mask, completions with their recording)."""
    model = _eos_model()
    with torch.no_grad():
        model.lm_head.bias[TOK.eos_token_id] = 4.0
    pi, pm = left_pad(PROMPTS, TOK.pad_token_id, "cpu")
    comp = sample(
        model, pi, pm, generator=torch.Generator().manual_seed(0), record=True, **{**KW, "max_new_tokens": 40}
    )
    return model, pi, pm, comp


def test_a_batch_that_ends_before_the_limit_rebuilds_from_a_copy_of_its_positions():
    """Every row ends before `max_new_tokens` (a model with EOS about 1 token in 3, 40 tokens allowed), so the
    record's buffers have positions past the batch's last token: the rebuild reads only the batch's own positions
    (a copy, not the buffers in place) and still gives the ordinary gradient."""
    model, pi, pm, comp = _rollout_ending_early()
    assert 1 < comp.ids.shape[1] < 40 and comp.ids.shape[1] - 1 < comp.recording.projections.n_fed
    adv = torch.randn(3 * G, generator=torch.Generator().manual_seed(4))
    (want_logits, want), (got_logits, got) = _ordinary_and_rebuilt(
        model,
        comp.recording.projections,
        torch.arange(3 * G),
        pi.repeat_interleave(G, 0),
        pm.repeat_interleave(G, 0),
        comp,
        adv,
    )
    m = comp.mask.bool()
    torch.testing.assert_close(got_logits[m], want_logits[m], atol=1e-5, rtol=0)
    _assert_same_grads(got, want, floor=1e-3)


@pytest.mark.parametrize(
    "extra, reads",
    [
        (["trainer.updates_per_rollout=1"], False),
        (["trainer.updates_per_rollout=2"], True),
        (["trainer.updates_per_rollout=2", "trainer.recompute_old_logp=true"], False),
        (["algorithm=ppo", "trainer.updates_per_rollout=1"], True),
    ],
)
def test_the_sampler_keeps_log_probs_only_where_they_are_read(compose, tmp_path, extra, reads):
    """One update per batch is on-policy and takes its old log-probs from its own forward, so the sampler skips
    them; several updates take the sampler's as old log-probs (unless recomputed), PPO's KL penalty in the reward
    reads them. A batch without them that needed them would fail its update."""
    tr = Trainer(validate(compose(*extra)), tmp_path / "run")
    comp = tr.collect().batch.completions
    assert (comp.logp is not None) == reads
    tr.step()  # the update runs with what the sampler kept


# ---------------------------------------------------------------- every preset, fast path against plain autograd
PRESETS = sorted(p.stem for p in (Path(__file__).parents[2] / "conf" / "algorithm").glob("*.yaml"))
# The fast path (the speed layer's decoder, which records; the first update rebuilt from the recording) against
# plain autograd (transformers' cache, the model's own forward): the same math in another order (one-token decode
# steps against whole-sequence forwards), ~1e-7 apart. Adam turns that into more than rounding where one path has
# a gradient of exactly 0 and the other one of 1e-9 (a KL term between two engines' log-probs, PPO's KL in the
# reward): its first steps move every weight by +-lr whatever the gradient's size. At the presets' lr (3e-5) that
# moved PPO's ratio/min 3.5e-3 within the first step (measured, the same before the speed layer had its door);
# at lr 3e-8 (policy and critic) 4e-6. So both runs use lr 3e-8, and:
# - step 1 (the same weights, the same batch; later mini-batches within 3e-8 a weight): every metric agrees to
#   STEP1_RTOL relative (STEP1_ATOL absolute near 0);
# - step 2 samples the very same tokens (every count, reward and length equal), and its update's metrics agree to
#   STEP2_RTOL / STEP2_ATOL (measured worst: PPO's grad_norm, 2e-4 absolute at 1.6e-4: whitened GAE advantages
#   near zero amplify the difference).
STEP1_RTOL, STEP1_ATOL = 1e-4, 1e-5
STEP2_RTOL, STEP2_ATOL = 1e-2, 1e-3
PLAIN = ["trainer.update_from_rollout=false", "rollout.kv_cache=dynamic"]
SMALL_STEPS = ["trainer.lr=3e-8", "algorithm.critic.lr=3e-8"]
ROLLOUT_METRICS = ("tokens/", "sampling/", "reward/", "accuracy/", "groups/", "length/", "weight/", "verifier/")


def _preset_rows(compose, tmp_path, name, preset, *extra):
    tr = Trainer(validate(compose(f"algorithm={preset}", "budget.max_steps=2", *SMALL_STEPS, *extra)), tmp_path / name)
    recorded = []
    collect = tr.collect

    def watched_collect():
        col = collect()
        recorded.append(col.batch is not None and col.batch.completions.recording is not None)
        return col

    tr.collect = watched_collect
    rows = [tr.step() for _ in range(2)]
    return rows, recorded


def _teacher_of(compose, tmp_path, preset) -> list[str]:
    """opd scores with a teacher: the shipped warm start (the same tokenizer, other weights than the tests')."""
    if preset != "opd":
        return []
    from rlcompare.train.export import export_policy

    tr = Trainer(validate(compose("model.warm_start.steps=300")), tmp_path / "teacher_run")
    return [f"teacher.path={export_policy(tr.policy, tr.cfg, tmp_path / 'teacher')}"]


@pytest.mark.parametrize("preset", PRESETS)
@pytest.mark.slow
def test_every_preset_trains_the_same_through_the_fast_path_and_plain_autograd(compose, tmp_path, preset):
    teacher = _teacher_of(compose, tmp_path, preset)
    fast, fast_recorded = _preset_rows(compose, tmp_path, "fast", preset, *teacher)
    plain, plain_recorded = _preset_rows(compose, tmp_path, "plain", preset, *PLAIN, *teacher)
    assert not any(plain_recorded)
    # the fast path ran: a batch sampled in one round carries the sampler's recording (scalerl's batch joins
    # several dynamic-sampling rounds: plain forward on both sides, its sampler still the fast one)
    assert all(fast_recorded) or preset == "scalerl", fast_recorded
    for step, (f, p) in enumerate(zip(fast, plain), 1):
        assert f.keys() == p.keys()
        for k in f:
            if k.startswith(TIMING_PREFIXES):
                continue
            if k == "critic/explained_var" and step > 1 and f["reward/std"] == p["reward/std"] == 0.0:
                # every reward 0 (PPO here): the returns are the in-reward KL alone, the two engines' log-prob
                # rounding (~1e-7), and the critic's values after one 3e-8 step are as small; their explained
                # variance is a ratio of two rounding-level variances (measured -1.77 against -0.33), not the
                # critic's. Step 1 still compares it (values 0 on both paths: 0.0 == 0.0)
                continue
            if not (isinstance(p[k], float) and isinstance(f[k], float)):
                assert f[k] == p[k], (step, k)
            elif step == 1:
                assert f[k] == pytest.approx(p[k], rel=STEP1_RTOL, abs=STEP1_ATOL, nan_ok=True), (step, k)
            elif k.startswith(ROLLOUT_METRICS):
                assert f[k] == pytest.approx(p[k], rel=1e-6, abs=1e-9, nan_ok=True), (step, k)  # the same tokens
            else:
                assert f[k] == pytest.approx(p[k], rel=STEP2_RTOL, abs=STEP2_ATOL, nan_ok=True), (step, k)


def test_a_batch_wider_than_its_rollout_never_reads_the_positions_the_sampler_did_not_write():
    """Over several ranks the gathered batch is as wide as the longest rank's completions, so a rank whose rows all
    ended sooner rebuilds positions its own sampler never wrote. The record's buffers are not zeroed when
    allocated (`static_decode.unwritten`: whatever the memory held, NaN included, which a zero attention or loss
    weight still carries, 0 x NaN = NaN; a CI run's NaN guard once skipped a 2-rank update for it). Here those
    positions hold NaN (as every such buffer does under the tests, set again here so that the test says what it
    checks): the rebuild must still give the ordinary forward's logits and gradients on the padded batch."""
    model, pi, pm, comp = _rollout_ending_early()
    rec, T = comp.recording.projections, comp.ids.shape[1]
    assert T + 4 < 40  # every row ended: positions T-1 and on were never fed
    for layer in rec.completion:
        for buf in layer:
            if buf is not None:
                buf[T - 1 :] = float("nan")
    wide = T + 4  # another rank's rows were 4 tokens longer: the batch is padded to them
    pad = lambda t, v: torch.nn.functional.pad(t, (0, wide - T), value=v)  # noqa: E731
    padded = type(comp)(
        pad(comp.ids, TOK.pad_token_id), pad(comp.mask, 0), pad(comp.logp, 0.0), comp.truncated, comp.lengths
    )
    adv = torch.randn(3 * G, generator=torch.Generator().manual_seed(5))
    pr, pmr = pi.repeat_interleave(G, 0), pm.repeat_interleave(G, 0)
    (want_logits, want), (got_logits, got) = _ordinary_and_rebuilt(
        model, rec, torch.arange(3 * G), pr, pmr, padded, adv
    )
    m = padded.mask.bool()
    torch.testing.assert_close(got_logits[m], want_logits[m], atol=1e-5, rtol=0)
    assert all(bool(torch.isfinite(g).all()) for g in got.values())
    _assert_same_grads(got, want, floor=1e-3)
