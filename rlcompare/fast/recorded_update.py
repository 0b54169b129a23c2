"""The first update on a rollout batch, without its forward matrix multiplies.

With one optimizer step per rollout batch (or on the first mini-batch of several), the update differentiates
the very weights that sampled the batch, so every projection it would compute (q/k/v, o, gate/up, down, for
every prompt and completion position) was already computed by the sampler. `static_decode` keeps those outputs
(`ProjectionRecord`); `rebuilt_logits` rebuilds the forward graph from them: norms, rope, attention and the LM
head are recomputed (cheap), while each attention projection is a `SavedProjection` that returns the sampler's
output and, in the backward pass, computes dX = dY W and dW = dY^T X as usual, and each MLP a `SavedMLP` that
does the same from the sampler's activations (silu(gate), silu(gate) * up and up * silu'(gate), recorded
instead of the gate/up outputs). The forward's projection FLOPs (a third of the update's) are skipped; the
gradient is the one of the ordinary forward, up to float rounding (the sampler's one-token steps and a
whole-sequence forward sum in different orders, ~1e-6 relative).

The backward also skips token rows whose incoming gradient is exactly zero: padding after EOS, and whole groups
whose advantages are all zero when nothing else (KL, entropy bonus) reaches them. Zero rows add nothing to dW
and get a zero dX, so the result is exact; the update's diagnostics still cover every row (the forward is
complete).

Covers the models `static_decode` decodes (Llama, Qwen2, Qwen3, Mistral) with plain `nn.Linear` projections in
float32 without autocast and without dropout; `can_rebuild` says why not otherwise, and the trainer then runs the
ordinary forward (`trainer.update_from_rollout=false` always does).
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F
from torch import nn

from rlcompare.fast import static_decode
from rlcompare.fast.unwrap import base_model_of


def can_rebuild(model, capacity: int, *, autocast_dtype=None, gradient_checkpointing: bool = False) -> str | None:
    """None when the update can be rebuilt from the sampler's projections, else why not."""
    why = static_decode.supports(model, capacity)
    if why is not None:
        return why
    base = base_model_of(model)
    if autocast_dtype is not None:
        return "autocast"
    if gradient_checkpointing:
        return "gradient checkpointing"
    if float(getattr(base.config, "attention_dropout", 0.0) or 0.0) > 0:
        return "attention dropout"
    for layer in base.model.layers:
        for mods in static_decode.projection_modules(layer):
            for m in mods:
                if type(m) is not nn.Linear:
                    return f"{type(m).__name__} projections (e.g. LoRA)"
                if m.weight.dtype != torch.float32:
                    return f"{m.weight.dtype} weights"
    return None


class _LiveRows:
    """Which token rows of a rebuild can receive a non-zero gradient, found from the gradient of the logits (a hook
    on them runs before the backward reaches any layer). Position j of a completion influences only the logits of
    its own row from index j + 1 on (causal attention, no mixing across rows), and a prompt position only its
    group's rows, so a row of zeros there makes every gradient at that position exactly zero."""

    def __init__(self, flop_observer=None):
        self.at: torch.Tensor | None = None  # the live rows' indices; None: every row (or not known yet)
        self.n = self.rows = 0
        # told the FLOPs of every backward product (`fast.FlopObserver.add`: the benchmark's count), or None
        self.flop_observer = flop_observer

    def set(self, live: torch.Tensor) -> None:
        flat = live.reshape(-1)
        self.rows, self.n = len(flat), int(flat.sum())
        self.at = flat.nonzero().squeeze(1) if self.n < len(flat) else None

    def pick(self, d_in: int, d_out: int, flop_per_byte: float):
        """The live row indices when gathering them pays: the matmul work saved on dead rows (4 d_in d_out
        FLOPs each) must exceed the copying (about 8 (d_in + d_out) bytes per live row: gather dY and X,
        scatter dX) at the device's FLOP-per-byte rate. Small widths with few dead rows stay dense."""
        if self.at is None:
            return None
        dead, live = self.rows - self.n, self.n
        return self.at if dead * 4 * d_in * d_out > flop_per_byte * live * 8 * (d_in + d_out) else None


class SavedProjection(torch.autograd.Function):
    """The outputs `ys` of the modules (weights `params`) that project one input `x`, already computed by the
    sampler with these weights: forward returns them; backward computes the gradients of x, the weights and the
    biases, over the rows `live` says can be non-zero (the others are exactly zero). With `rope` = (cos, sin),
    the first two outputs (q, k) are held with rope applied (`ProjectionRecord.qk_roped`): their gradients go
    through rope's backward first."""

    @staticmethod
    def forward(ctx, x, live: _LiveRows, n_mods: int, has_bias: bool, rope, *params_and_ys):
        weights = params_and_ys[:n_mods]
        ys = params_and_ys[(2 if has_bias else 1) * n_mods :]
        ctx.live, ctx.has_bias, ctx.roped = live, has_bias, rope is not None
        ctx.save_for_backward(x, *weights, *(rope or ()))
        return ys

    @staticmethod
    def backward(ctx, *dys):
        x, *weights = ctx.saved_tensors
        if ctx.roped:
            *weights, cos, sin = weights
            hd = cos.shape[-1]
            dys = tuple(
                static_decode.rope_backward(d.view(len(d), -1, hd), cos, sin).view(d.shape) if i < 2 else d
                for i, d in enumerate(dys)
            )
        d_out = sum(w.shape[0] for w in weights)
        at = ctx.live.pick(x.shape[-1], d_out, _FLOP_PER_BYTE.get(x.device.type, 15.0))
        x2 = x.reshape(-1, x.shape[-1])
        dy2 = [d.reshape(-1, d.shape[-1]) for d in dys]
        rows = len(x2)
        if at is not None:
            x2 = x2.index_select(0, at)
            dy2 = [d.index_select(0, at) for d in dy2]
        dx = None
        if ctx.needs_input_grad[0]:
            dx_live = dy2[0] @ weights[0]
            for d, w in zip(dy2[1:], weights[1:]):
                dx_live.addmm_(d, w)
            dx = dx_live if at is None else dx_live.new_zeros((rows, x2.shape[1])).index_copy_(0, at, dx_live)
            dx = dx.reshape(x.shape)
        dws = [d.t() @ x2 for d in dy2]
        dbs = [d.sum(0) for d in dy2] if ctx.has_bias else []
        if ctx.live.flop_observer is not None:
            ctx.live.flop_observer.add(2.0 * len(x2) * d_out * x2.shape[1] * (2 if dx is not None else 1))
        return (dx, None, None, None, None, *dws, *dbs, *([None] * len(dys)))


class SavedMLP(torch.autograd.Function):
    """down(silu(gate(h)) * up(h)) for the normed MLP input `h`, every part of it already computed by the sampler
    with these weights (`static_decode.gated_mlp`: silu(gate), the product, up * silu'(gate), down's output):
    forward returns down's output; backward computes the gradients of h and of the three weights over the live
    rows, with two elementwise passes over `[rows, intermediate]` (d up = d product * silu(gate), d gate =
    d product * up * silu'(gate)). Autograd through `SavedProjection`s around a SiLU and a product would make
    two such passes forward and three backward."""

    @staticmethod
    def forward(ctx, h, live: _LiveRows, w_gate, w_up, w_down, act, gated, gate_grad, y):
        ctx.live = live
        ctx.save_for_backward(h, w_gate, w_up, w_down, act, gated, gate_grad)
        return y

    @staticmethod
    def backward(ctx, dy):
        h, w_gate, w_up, w_down, *acts = ctx.saved_tensors
        inter, hidden = w_gate.shape
        # a dead row skips all three products (12 hidden x inter FLOPs), the same test as a (hidden -> 3 inter) one
        at = ctx.live.pick(hidden, 3 * inter, _FLOP_PER_BYTE.get(h.device.type, 15.0))
        h2, dy2 = h.reshape(-1, hidden), dy.reshape(-1, hidden)
        act, gated, gate_grad = (t.reshape(-1, inter) for t in acts)
        rows = len(h2)
        if at is not None:
            h2, dy2, act, gated, gate_grad = (t.index_select(0, at) for t in (h2, dy2, act, gated, gate_grad))
        d_gated = dy2 @ w_down
        dw_down = dy2.t() @ gated
        d_up = d_gated * act
        d_gate = d_gated.mul_(gate_grad)
        dh = d_gate @ w_gate
        dh.addmm_(d_up, w_up)
        if at is not None:
            dh = dh.new_zeros((rows, hidden)).index_copy_(0, at, dh)
        if ctx.live.flop_observer is not None:
            ctx.live.flop_observer.add(12.0 * len(h2) * hidden * inter)
        return (dh.reshape(h.shape), None, d_gate.t() @ h2, d_up.t() @ h2, dw_down, None, None, None, None)


def _saved_mlp(layer, h, rows_of, live: _LiveRows):
    """`SavedMLP` of `layer` for its MLP input `h`; `rows_of(slot)` gives the record's rows of `h` in a slot."""
    mlp = layer.mlp
    return SavedMLP.apply(
        h,
        live,
        mlp.gate_proj.weight,
        mlp.up_proj.weight,
        mlp.down_proj.weight,
        *(
            rows_of(slot)
            for slot in (static_decode.ACT, static_decode.GATED, static_decode.GATE_GRAD, static_decode.DOWN)
        ),
    )


def _saved_projection(mods, x, y, live: _LiveRows, rope=None):
    weights = [m.weight for m in mods]
    biases = static_decode.linear_biases(mods)
    ys = y.split([w.shape[0] for w in weights], -1) if len(mods) > 1 else (y,)
    return SavedProjection.apply(x, live, len(mods), bool(biases), rope, *weights, *biases, *ys)


# matmul FLOPs per byte copied, roughly (fp32 matmul peak / memory copy rate): 2 CPU cores ~200 GFLOP/s over
# ~10 GB/s; a data-centre GPU ~1000 TFLOP/s (bf16) over ~5 TB/s. Decides when skipping dead rows pays.
_FLOP_PER_BYTE = {"cpu": 15.0, "cuda": 200.0}

# attention scores up to this size are computed as plain matmuls; above, by the fused kernel
_EXPLICIT_ATTENTION_BYTES = 64 * 2**20


def _attention(q, k, v, mask, scale):
    """softmax(q k^T * scale, masked) v for q `[B, nh, T, hd]`, k/v `[B, kvh, S, hd]` and `mask` from
    `_attention_mask` (every query sees at least itself). For the short rows of RL completions, explicit matmuls
    run forward and backward 2-3x faster on the CPU than `scaled_dot_product_attention`'s flash kernel; the mask,
    additive, enters the first one (`baddbmm`), so there is no separate scale or mask pass, forward or backward.
    Long rows (a boolean mask) use the kernel, which never holds the `[B, nh, T, S]` scores."""
    B, nh, T, hd = q.shape
    kvh, S = k.shape[1], k.shape[2]
    if mask.dtype == torch.bool:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale, enable_gqa=kvh != nh)
    if kvh != nh:  # query head i reads key/value head i // (nh // kvh), as transformers' repeat_kv
        k, v = k.repeat_interleave(nh // kvh, 1), v.repeat_interleave(nh // kvh, 1)
    scores = torch.baddbmm(
        mask.reshape(B * nh, T, S), q.reshape(B * nh, T, hd), k.reshape(B * nh, S, hd).transpose(1, 2), alpha=scale
    )
    return torch.bmm(scores.softmax(-1), v.reshape(B * nh, S, hd)).view(B, nh, T, hd)


def _attention_mask(allowed: torch.Tensor, heads: int, dtype) -> torch.Tensor:
    """The mask `_attention` takes for the boolean `allowed` `[B, 1, T, S]`: itself when the scores are long
    enough for the fused kernel, else 0 / -inf `[B, heads, T, S]`, built once for every layer."""
    B, _, T, S = allowed.shape
    if B * heads * T * S * torch.finfo(dtype).bits // 8 > _EXPLICIT_ATTENTION_BYTES:
        return allowed
    return static_decode.additive_mask(allowed.expand(B, heads, T, S), dtype)


def rebuilt_logits(
    model,
    record: static_decode.ProjectionRecord,
    record_rows: torch.Tensor,
    prompt_ids: torch.Tensor,
    prompt_mask: torch.Tensor,
    comp_ids: torch.Tensor,
    *,
    group_size: int,
    flop_observer=None,
    hidden: bool = False,
) -> torch.Tensor:
    """The completion logits `[b, T, V]` of `grouped_sequence_logits`, under autograd, from the sampler's record
    (with `hidden`: the final hidden states `[b, T, H]` the LM head would project, for the caller to project).

    The `b` rows come in whole groups of `group_size` (one prompt each, `prompt_ids`/`prompt_mask` repeated per
    row); `record_rows` [b] are their rows in `record`. `flop_observer` (`fast.FlopObserver`, the benchmark's)
    is told the FLOPs computed: the backward products and the recomputed attention and LM head.
    """
    G = group_size
    base = base_model_of(model)
    body = base.model
    nh, kvh, hd = static_decode.head_dims(base.config)
    b, T = comp_ids.shape
    P = prompt_ids.shape[1]
    if P != record.P or record.repeats != G or b % G:
        raise ValueError("rebuilt_logits: the rows are not whole groups of the recorded rollout")
    groups = record_rows[::G] // G
    g = len(groups)
    every_row = torch.arange(record.n_rows, device=record_rows.device)
    all_groups = g * G == record.n_rows and bool((record_rows == every_row).all())
    if not all_groups and g * G == record.n_rows and bool((record_rows.sort().values == every_row).all()):
        # every recorded row, shuffled (one mini-batch): rebuild in the record's order, which reads the record in
        # place instead of copying all of it, and put the logits in the batch's order
        at = record_rows.argsort()
        again = functools.partial(rebuilt_logits, group_size=G, flop_observer=flop_observer, hidden=hidden)
        return again(model, record, every_row, prompt_ids[at], prompt_mask[at], comp_ids[at]).index_select(
            0, record_rows
        )
    Tc = T - 1  # tokens fed to the model: all but the last
    record.zero_past_fed(Tc)  # a batch wider than this rollout (another rank's rows were longer)
    pmu = prompt_mask[::G].bool()  # each group's prompt: its real tokens
    # The token rows of the prompts (g x P) and of the completions (Tc x b, time-major as the record holds them)
    # go through every per-token operation (norms, projections, MLP, residuals, rope) together, as one
    # [g*P + Tc*b, ...] batch: one product per weight instead of two, and no small second set of operations for
    # the prompts; only attention is per part.
    n_p = g * P
    x, cos, sin = _rebuild_inputs(body, prompt_ids, prompt_mask, comp_ids, G, Tc)
    masks = _rebuild_masks(pmu, G, b, Tc, nh, x.dtype)
    live = _LiveRows(flop_observer)
    in_place = all_groups and Tc == record.n_fed  # the record's flat buffers are these rows in this order
    rows_of = functools.partial(_recorded_rows, record, None if in_place else (groups, record_rows, all_groups), Tc)

    heads = functools.partial(_split_heads, g=g, P=P, b=b, Tc=Tc)
    # query-key pairs attended per layer (prompts causal; completions see their prompt and their past)
    pairs = g * P * (P + 1) / 2 + (b * (Tc * P + Tc * (Tc + 1) / 2) if Tc > 0 else 0.0)
    for li, layer in enumerate(body.layers):
        mods = static_decode.projection_modules(layer)
        attn = layer.self_attn
        layer_rows = functools.partial(rows_of, li)

        def project(slot, inp):
            rope = (cos, sin) if slot == static_decode.QKV and record.qk_roped else None
            return _saved_projection(mods[slot], inp, layer_rows(slot), live, rope)

        q, k, v = project(static_decode.QKV, static_decode.rms_norm(layer.input_layernorm, x))
        q, k, v = q.view(-1, nh, hd), k.view(-1, kvh, hd), v.view(-1, kvh, hd)
        if not record.qk_roped:  # the record holds them before rope (Qwen3: after its q/k norms)
            q, k = static_decode.roped_queries_keys(attn, q, k, cos, sin)
        a = _two_part_attention(heads(q, nh), heads(k, kvh), heads(v, kvh), masks, attn.scaling, G)
        x = static_decode.layer_output(layer, x, a, project, lambda h: _saved_mlp(layer, h, layer_rows, live))
    h = static_decode.rms_norm(body.norm, torch.cat([x[P - 1 : n_p : P], x[n_p:]]))  # each prompt's last; completions
    logits = h if hidden else base.lm_head(h)
    if flop_observer is not None:  # attention forward + backward (3x), LM head forward + backward (3x)
        H, V_ = base.config.hidden_size, base.lm_head.out_features
        flop_observer.add(3.0 * 4 * H * pairs * len(body.layers) + 3.0 * 2 * H * V_ * (g + b * Tc))
    return _batch_order(logits, g, G, b, Tc, pmu, live)


def _rebuild_inputs(body, prompt_ids, prompt_mask, comp_ids, G: int, Tc: int) -> tuple:
    """The rebuild's embedded rows (each group's prompt, g x P, then the fed completion tokens, Tc x b time-major)
    and their rope `cos`, `sin` [rows, 1, hd] (broadcast over heads), at the positions the sampler used."""
    pos_p = (prompt_mask[::G].cumsum(-1) - 1).clamp(min=0)
    pos_c = pos_p[:, -1:].repeat_interleave(G, 0) + 1 + torch.arange(Tc, device=comp_ids.device)
    x = body.embed_tokens(torch.cat([prompt_ids[::G].reshape(-1), comp_ids[:, :Tc].t().reshape(-1)]))
    cos, sin = static_decode.rope(body, x, torch.cat([pos_p.reshape(-1), pos_c.t().reshape(-1)])[None])
    return x, cos[0].transpose(0, 1), sin[0].transpose(0, 1)


def _recorded_rows(record, selection, Tc: int, li: int, slot: int) -> torch.Tensor:
    """Layer `li`'s recorded input rows of projection `slot`, in the rebuild's order: the record's flat buffer in
    place (`selection` None), else its prompt and completion parts, `(groups, record_rows, all_groups)` picked."""
    if selection is None:
        return record.flat[li][slot]
    groups, record_rows, all_groups = selection
    prompt, comp = record.prompt[li][slot], record.completion[li][slot][:Tc]
    if not all_groups:
        prompt, comp = prompt.index_select(0, groups), comp.index_select(1, record_rows)
    return torch.cat([prompt.reshape(-1, prompt.shape[-1]), comp.reshape(-1, comp.shape[-1])])


def _split_heads(t: torch.Tensor, n_heads: int, *, g: int, P: int, b: int, Tc: int) -> tuple:
    """The prompt rows and the completion rows of `t` [g*P + Tc*b, heads, hd] -> [batch, heads, positions, hd] each.
    `split`, not two slices: its backward is one `cat` of the parts' gradients, where each slice's would be a
    zero-filled full-size gradient, then a sum of the two."""
    hd = t.shape[-1]
    prompt, comp = t.split([g * P, len(t) - g * P])
    return prompt.view(g, P, n_heads, hd).transpose(1, 2), comp.view(Tc, b, n_heads, hd).permute(1, 2, 0, 3)


def _two_part_attention(q, k, v, masks, scaling: float, G: int) -> torch.Tensor:
    """Attention of the prompt rows over their prompt and of the completion rows over their group's prompt and
    their own past; (prompt, completion) parts of q, k, v in, `[rows, heads * hd]` out (completions time-major)."""
    (q_p, q_c), (k_p, k_c), (v_p, v_c) = q, k, v
    nh, hd = q_p.shape[1], q_p.shape[3]
    a = _attention(q_p, k_p, v_p, masks[0], scaling).transpose(1, 2).reshape(-1, nh * hd)
    if masks[1] is None:
        return a
    K = torch.cat([k_p.repeat_interleave(G, 0), k_c], 2)
    V = torch.cat([v_p.repeat_interleave(G, 0), v_c], 2)
    a_c = _attention(q_c, K, V, masks[1], scaling)
    return torch.cat([a, a_c.permute(2, 0, 1, 3).reshape(-1, nh * hd)])


def _rebuild_masks(pmu: torch.Tensor, G: int, b: int, Tc: int, nh: int, dtype) -> tuple:
    """The additive attention masks of the rebuild: the prompts' (causal over their real tokens; each position sees
    itself, so a left-pad row is never all -inf) and the completions' (their prompt's real tokens, then causal over
    the fed completion tokens); the second None when no completion token is fed."""
    P, dev = pmu.shape[1], pmu.device
    ar_p = torch.arange(P, device=dev)
    allowed_p = (pmu[:, None, :] & (ar_p[None, :] <= ar_p[:, None])[None]) | torch.eye(P, dtype=torch.bool, device=dev)[
        None
    ]
    mask_p = _attention_mask(allowed_p[:, None], nh, dtype)
    if Tc == 0:
        return mask_p, None
    ar_c = torch.arange(Tc, device=dev)
    allowed_c = torch.cat(
        [
            pmu.repeat_interleave(G, 0)[:, None, :].expand(b, Tc, P),
            (ar_c[None, :] <= ar_c[:, None])[None].expand(b, Tc, Tc),
        ],
        -1,
    )
    return mask_p, _attention_mask(allowed_c[:, None], nh, dtype)


def _batch_order(logits: torch.Tensor, g: int, G: int, b: int, Tc: int, pmu: torch.Tensor, live) -> torch.Tensor:
    """The rebuild's rows (each group's last prompt position, then the completions time-major) as `[b, T, V]`, with
    the hook that tells `live` which rows' gradients are nonzero (the backward products skip the others)."""
    first = logits[:g].repeat_interleave(G, 0)[:, None]
    logits = first if Tc == 0 else torch.cat([first, logits[g:].view(Tc, b, -1).transpose(0, 1)], 1)
    if logits.requires_grad:

        def find_live(grad):
            nz = (grad != 0).any(-1)  # [b, T]: logits index t has a gradient
            prompt = nz.reshape(g, -1).any(1)[:, None] & pmu  # a group with any gradient; real tokens
            # fed position j reaches logits j+1 .. T-1 of its row
            comp = nz.flip(1).cummax(1).values.flip(1)[:, 1:] if Tc > 0 else nz[:, :0]
            live.set(torch.cat([prompt.reshape(-1), comp.t().reshape(-1)]))  # rows in the rebuild's order

        logits.register_hook(find_live)
    return logits
