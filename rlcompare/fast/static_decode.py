"""Decoding for Llama-family models (Llama, Qwen2, Qwen3, Mistral) with a preallocated KV cache.

Why: transformers' `DynamicCache` concatenates every layer's keys and values with the new token at each
step, so a completion of T tokens copies O(T^2) cache memory; at the benchmark's 25M size those copies are
a quarter of a decode step. Here the cache is allocated once (`[rows, kv_heads, capacity, head_dim]`),
each step writes one position in place, and attention reads the positions written so far under a key mask
(the prompt padding; masked positions hold zeros so a masked weight never multiplies garbage). A one-token
step (`_step_forward`) runs the same math in fewer operations, since at small widths a step is mostly
per-operation overhead: rope from a table of every cache position, queries and keys roped together, RMSNorm
without the module call, the fused attention kernel.

The layer math is the model's own, step for step: the model's embedding, RMSNorm modules, rotary module
(every rope scaling type), projections (plain `nn.Linear` ones fused into one matmul per layer with weights
concatenated once per sampling call; LoRA or other wrapped projections called as modules) and
`attn.scaling`. `supports(model)` lists what it covers; any other model keeps the transformers cache.
Equality with the transformers forward (fp32 and bf16 autocast) is tested in tests/fast/test_static_decode.py.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from rlcompare.fast import onednn
from rlcompare.fast.unwrap import base_model_of

_ARCHES = ("LlamaForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM", "MistralForCausalLM")
# The transformers releases this path is tested on, [low, high): it reads model internals (module names,
# `attn.scaling`, rotary modules, per-layer sliding windows) that transformers does not promise to keep.
# Outside the range `supports` refuses with the reason and the sampler keeps transformers' own cache. The test extra
# pins transformers below `high` (pyproject.toml), so that the tests run a release the range admits; raise both
# once tests/fast passes on the next release (5.25.0: 2026-12-03).
TESTED_TRANSFORMERS = ("4.56", "5.26")


def transformers_version_refusal(version: str | None = None) -> str | None:
    """None when the installed (or given) transformers version is in TESTED_TRANSFORMERS, else why not."""
    from packaging.version import Version

    if version is None:
        import transformers

        version = transformers.__version__
    low, high = TESTED_TRANSFORMERS
    release = Version(Version(version).base_version)  # 5.25.0.dev0 counts as 5.25.0
    if Version(low) <= release < Version(high):
        return None
    return f"transformers {version} is outside the range the fast path is tested on (>={low},<{high})"


def supports(model, capacity: int) -> str | None:
    """None when `model` can decode here with `capacity` cache positions, else why not."""
    why = transformers_version_refusal()
    if why is not None:
        return why
    base = base_model_of(model)
    name = type(base).__name__
    if name not in _ARCHES:
        return f"{name} is not one of {', '.join(_ARCHES)}"
    c = base.config
    if getattr(c, "hidden_act", "silu") != "silu" or getattr(c, "mlp_bias", False):
        return "non-standard MLP"
    if getattr(c, "pretraining_tp", 1) not in (1, None):
        return "pretraining_tp > 1"
    for layer in base.model.layers:
        # Qwen2/3 name the window per layer (None on full-attention layers); Mistral only in its config
        window = getattr(layer.self_attn, "sliding_window", getattr(c, "sliding_window", None))
        if window is not None and window < capacity:
            return f"sliding window {window} < {capacity} positions"
    return None


def head_dims(config) -> tuple[int, int, int]:
    """(query heads, key/value heads, head dim)."""
    nh = config.num_attention_heads
    kvh = getattr(config, "num_key_value_heads", None) or nh
    hd = getattr(config, "head_dim", None) or config.hidden_size // nh
    return nh, kvh, hd


def linear_biases(mods) -> list[torch.Tensor]:
    """The biases of linear modules projecting one input (Qwen2: q/k/v), zeros for any without one; [] when none
    has a bias."""
    if all(m.bias is None for m in mods):
        return []
    return [m.bias if m.bias is not None else m.weight.new_zeros(m.weight.shape[0]) for m in mods]


class _Projection:
    """The projections of one input (q/k/v, gate/up, or a single one) as one matmul when they are plain
    `nn.Linear` (weights concatenated once: they do not change while sampling), else each module called on its
    own (LoRA). `pieces` splits the output back into one view per module."""

    def __init__(self, mods):
        self.mods = mods
        self.sizes = [m.weight.shape[0] if type(m) is nn.Linear else m.out_features for m in mods]
        self.weight = self.bias = None
        if len(mods) == 1 and type(mods[0]) is nn.Linear:
            self.weight, self.bias = mods[0].weight, mods[0].bias
        elif all(type(m) is nn.Linear for m in mods):
            self.weight = torch.cat([m.weight for m in mods], 0)
            biases = linear_biases(mods)
            self.bias = torch.cat(biases, 0) if biases else None
        self.dnn = self.weight is not None and onednn.usable(self.weight)
        self.packed = None
        self.weight_t = self.weight.t() if self.weight is not None else None  # for `into`'s product

    def _dnn_for(self, x) -> bool:
        """oneDNN's product applies to this input: CPU float32 without autocast."""
        return self.dnn and x.dtype == torch.float32 and not torch.is_autocast_enabled("cpu")

    def __call__(self, x):
        if self.weight is not None:
            if self._dnn_for(x):
                # CPU fp32: oneDNN with the weight packed once, 1.4-1.9x torch's product at 128 rows
                if self.packed is None:
                    self.packed = onednn.pack(self.weight, x.reshape(-1, x.shape[-1]).shape[0])
                return onednn.linear(x, self.packed, self.bias)
            return F.linear(x, self.weight, self.bias)
        if len(self.mods) == 1:
            return self.mods[0](x)
        return torch.cat([m(x) for m in self.mods], -1)

    def into(self, x, out):
        """`self(x)`, computed straight into `out` (`[rows of x, width]`, contiguous) and shaped as `self(x)` where
        torch's product can write there; otherwise (no `out`; oneDNN's product, which has no output argument;
        modules called) a new tensor."""
        if out is None or self.weight is None or self._dnn_for(x) or x.dtype != self.weight.dtype:
            return self(x)
        x2 = x.view(-1, x.shape[-1]) if x.is_contiguous() else x.reshape(-1, x.shape[-1])
        if self.bias is None:
            torch.mm(x2, self.weight_t, out=out)
        else:
            torch.addmm(self.bias, x2, self.weight_t, out=out)
        return out.view(*x.shape[:-1], out.shape[-1])

    def pieces(self, y):
        return y.split(self.sizes, -1) if len(self.mods) > 1 else (y,)


class StaticDecoder:
    """Prefill once per prompt, copy to its group, then one token per step; rows can be dropped (`select`).

    Use under `torch.inference_mode()`; logits are returned for the last position of each row.
    """

    def __init__(self, model, capacity: int, *, flop_observer=None):
        self.base = base_model_of(model)
        self.body = self.base.model
        self.nh, self.kvh, self.hd = head_dims(self.base.config)
        self.capacity = capacity
        self.layers = []
        for layer in self.body.layers:
            self.layers.append((layer, tuple(_Projection(mods) for mods in projection_modules(layer))))
        self.keys: list[torch.Tensor] = []
        self.values: list[torch.Tensor] = []
        self.key_mask: torch.Tensor | None = None  # [rows, capacity] True on real keys
        self.length = 0
        self.can_select = True
        self.record: ProjectionRecord | None = None  # every projection output, kept when `plan_record` asked
        self.recording = None  # the handle `plan_record`'s factory made for `record` (rlcompare.fast.speed.Recording)
        self._record_factory = None
        self.flop_observer = flop_observer  # told of every forward (the benchmark's FLOP count), or None
        # one-token steps: cos/sin of every cache position computed once (the per-step rotary call is a dozen
        # small ops), and the prompt padding as an additive mask for the fused attention kernel
        self.rope_table: tuple[torch.Tensor, torch.Tensor] | None = None
        self.add_mask: torch.Tensor | None = None
        self.table_rope = getattr(self.body.rotary_emb, "rope_type", "default") not in _LENGTH_DEPENDENT_ROPE
        self.qk_roped_in_place = qk_roped_in_place(model)
        self.norm_dtype: torch.dtype | None = None  # `rms_norm`'s out_dtype for the projections' inputs (graph engine)

    def plan_record(self, factory) -> None:
        """Keep every projection output of the next rollout: at the prefill, `factory(n, P, repeats, device,
        dtype)` gives a handle whose `projections` is the `ProjectionRecord` to fill (`self.recording`)."""
        self._record_factory = factory

    def prefill(self, ids: torch.Tensor, mask: torch.Tensor, pos: torch.Tensor, repeats: int = 1) -> torch.Tensor:
        """Left-padded prompts `[n,P]` -> next-token logits `[n*repeats, V]`; the cache holds n*repeats rows."""
        n, P = ids.shape
        if P > self.capacity:
            raise ValueError(f"prompt of {P} tokens exceeds the cache capacity {self.capacity}")
        if self._record_factory is not None:
            # ordinary tensors even under the sampler's inference mode: the update differentiates through them
            with torch.inference_mode(False):
                self.recording = self._record_factory(n, P, repeats, ids.device, next(self.base.parameters()).dtype)
            self.record = self.recording.projections
        self.key_mask = torch.zeros((n, self.capacity), dtype=torch.bool, device=ids.device)
        self.key_mask[:, :P] = mask.bool()
        self.keys, self.values = [], []
        logits = self._forward(ids, pos, 0, repeats)
        self.length = P
        if repeats > 1:
            self.key_mask = self.key_mask.repeat_interleave(repeats, 0)
            logits = logits.repeat_interleave(repeats, 0)
        self.rope_table = self.add_mask = None
        return logits

    def step(self, tokens: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        """One new token per row (`[b]`, positions `[b,1]`) -> next-token logits `[b, V]`."""
        if self.length >= self.capacity:
            raise ValueError(f"the KV cache of {self.capacity} positions is full")
        self.key_mask[:, self.length] = True
        logits = self._forward(tokens[:, None], pos, self.length)
        self.length += 1
        if self.record is not None:
            self.record.fed = self.length - self.record.P  # completion positions 0..length-P-1 written
        return logits

    def select(self, rows: torch.Tensor) -> None:
        """Keep only `rows` (indices into the current rows)."""
        self.keys = [k.index_select(0, rows) for k in self.keys]
        self.values = [v.index_select(0, rows) for v in self.values]
        self.key_mask = self.key_mask.index_select(0, rows)
        if self.add_mask is not None:
            self.add_mask = self.add_mask.index_select(0, rows)
        if self.record is not None:
            self.record.select(rows, self.length)

    def _forward(self, ids: torch.Tensor, pos: torch.Tensor, start: int, repeats: int = 1) -> torch.Tensor:
        """The prompts (`start` 0) or one new token per row at position `start`, through every layer."""
        if self.flop_observer is not None:
            self.flop_observer.record(
                int(ids.shape[0]), int(ids.shape[1]), start + int(ids.shape[1]), torch.is_grad_enabled()
            )
        return self._step_forward(ids, pos, start) if start else self._prefill_forward(ids, pos, repeats)

    def _prefill_forward(self, ids: torch.Tensor, pos: torch.Tensor, repeats: int) -> torch.Tensor:
        """The prompts `[n, P]` through every layer (attention over their own keys), filling a cache of
        n * repeats rows: each prompt's keys and values are written once into each of its copies' rows, at
        positions 0..P-1 only. The cache is not zeroed: the steps read only positions already written (the
        prompt's, and each step's own before it attends), so the rest is never seen."""
        n, T = ids.shape
        nh, kvh, hd = self.nh, self.kvh, self.hd
        x = self.body.embed_tokens(ids)
        cos, sin = rope(self.body, x, pos)
        # key j visible from query i: real and not in the future (a query always sees itself, so a padding row
        # never takes a softmax over nothing)
        at = torch.arange(T, device=ids.device)
        allowed = (self.key_mask[:, None, :T] & (at[None, :] <= at[:, None])[None]) | (at[None, :] == at[:, None])[None]
        for li, (layer, projections) in enumerate(self.layers):
            attn = layer.self_attn
            project = _per_module(projections, self._recorded(li, projections, 0))
            q, k, v = self._attention_inputs(li, layer, projections, project, x, cos, sin, 0)
            for cache, t in ((self.keys, k), (self.values, v)):
                full = self._cache_buffer(len(cache), cache is self.keys, (n * repeats, kvh, self.capacity, hd), t)
                full.view(n, repeats, kvh, self.capacity, hd)[:, :, :, :T] = t[:, None]
                cache.append(full)
            a = F.scaled_dot_product_attention(
                q, k, v, attn_mask=allowed[:, None], scale=attn.scaling, enable_gqa=kvh != nh
            )
            keep = self._keep(li, 0)
            x = layer_output(
                layer, x, a.transpose(1, 2).reshape(n, T, nh * hd), project, lambda h: gated_mlp(h, project, keep)
            )
        return self.base.lm_head(rms_norm(self.body.norm, x[:, -1]))

    def _cache_buffer(self, layer: int, keys: bool, shape: tuple, like: torch.Tensor) -> torch.Tensor:
        """The cache tensor of `layer`'s keys (else values) that the prefill fills: a new one (the graph engine
        hands out its persistent buffers instead, whose addresses its captured steps read)."""
        return unwritten(shape, dtype=like.dtype, device=like.device)

    def _recorded(self, li: int, projections, start: int):
        """`project(slot, input)`: the whole output of projection `slot` of layer `li`, kept in the record when
        there is one."""
        return lambda slot, inp: self._kept(li, slot, start, lambda out: projections[slot].into(inp, out))

    def _kept(self, li: int, slot: int, start: int, compute, like=None, then=None) -> torch.Tensor:
        """`compute(out)`, the output of slot `slot` of layer `li` at `start`, kept in the record when there is one:
        `out` is the slot's record block (shaped as `like` when given), or None without one, and `compute` writes
        there when it can; a new tensor it returns instead is copied in. `then(y)` changes y in place first."""
        rec = self.record
        block = rec.block(li, slot, start) if rec is not None else None
        if block is not None and like is not None:
            block = block.view(like.shape)
        y = compute(block)
        if then is not None:
            then(y)
        if rec is not None and (block is None or y.data_ptr() != block.data_ptr()):
            rec.write(li, slot, y, start)
        return y

    def _attention_inputs(self, li: int, layer, projections, project, x, cos, sin, start: int):
        """Queries, keys and values `[B, heads, T, hd]` of layer `li` for its input `x` `[B, T, H]` (`cos`/`sin` as
        `rope` gives them), q and k roped. Where `qk_roped_in_place`, rope is applied in place in the q/k/v output
        and kept so in the record (the update then reads roped queries and keys, `ProjectionRecord.qk_roped`, and
        recomputes no rope); Qwen3 (per-head q/k norms before rope) goes through `attention_inputs`."""
        if not self.qk_roped_in_place:
            return attention_inputs(layer, x, cos, sin, (self.nh, self.kvh, self.hd), project, self.norm_dtype)
        B, T = x.shape[:2]
        nqk, hd = self.nh + self.kvh, self.hd
        h = rms_norm(layer.input_layernorm, x, self.norm_dtype)
        cos, sin = cos.transpose(1, 2), sin.transpose(1, 2)  # broadcast over [B, T, heads, hd]
        y = self._kept(
            li,
            QKV,
            start,
            lambda out: projections[QKV].into(h, out),
            then=lambda y: rope_in_place(y[..., : nqk * hd].view(B, T, nqk, hd), cos, sin),
        )
        return tuple(t.view(B, T, -1, hd).transpose(1, 2) for t in projections[QKV].pieces(y))

    def _keep(self, li: int, start: int):
        """`keep(slot, into, like)` for the MLP activation of slot ACT, GATED or GATE_GRAD of layer `li`
        (`_kept`: `into(out)` computes it, into `out` when that is not None; `like` has its shape); None without a
        record."""
        if self.record is None:
            return None
        return lambda slot, into, like: self._kept(li, slot, start, into, like)

    def _step_forward(self, ids: torch.Tensor, pos: torch.Tensor, start: int) -> torch.Tensor:
        """One new token per row: the layers of `_prefill_forward` with fewer, larger operations (a decode step at the
        benchmark's 0.5M size is mostly per-operation overhead): rope from a table, applied to the queries and
        keys together, RMSNorm without the module call, and the fused attention kernel over the keys written
        so far (grouped heads as queries of their key/value head; the prompt padding as an additive mask)."""
        B = ids.shape[0]
        nh, kvh, hd = self.nh, self.kvh, self.hd
        x = self.body.embed_tokens(ids)
        if self.table_rope:
            if self.rope_table is None:  # [capacity, 1, 1, hd]: a row per position, broadcast over T and heads
                self.rope_table = tuple(
                    t[0, 0, :, None, None]
                    for t in rope(self.body, x, torch.arange(self.capacity, device=ids.device)[None])
                )
            at = pos.reshape(-1)
            cos, sin = (t.index_select(0, at) for t in self.rope_table)  # [B,1,1,hd]
        else:
            cos, sin = rope(self.body, x, pos)
        n = start + 1
        for li, (layer, projections) in enumerate(self.layers):
            attn = layer.self_attn
            per_module = _per_module(projections, self._recorded(li, projections, start))
            q, k, v = self._attention_inputs(li, layer, projections, per_module, x, cos, sin, start)
            K, V = self.keys[li], self.values[li]
            K[:, :, start:n] = k
            V[:, :, start:n] = v
            if self.add_mask is None or self.add_mask.dtype != q.dtype:
                self.add_mask = additive_mask(self.key_mask, q.dtype)[:, None, None, :]
                self.add_mask[..., self.length :] = 0  # completion positions: real once written
            a = F.scaled_dot_product_attention(
                q.reshape(B, kvh, nh // kvh, hd),
                K[:, :, :n].to(q.dtype),
                V[:, :, :n].to(q.dtype),
                attn_mask=self.add_mask[..., :n],
                scale=attn.scaling,
            )
            keep = self._keep(li, start)
            x = layer_output(layer, x, a.reshape(B, 1, nh * hd), per_module, lambda h: gated_mlp(h, per_module, keep))
        return self.base.lm_head(rms_norm(self.body.norm, x[:, -1]))


def _per_module(projections, project):
    """`project(slot, input)` returning the whole output of projection `slot`, as one returning one output per
    module (q, k, v; gate, up), the form `attention_inputs` and `layer_output` take."""
    return lambda slot, inp: projections[slot].pieces(project(slot, inp))


# ----------------------------------------------------------------------------- one layer, shared with the rebuild
QKV, O, GATE_UP, DOWN = range(4)  # the four projections of a layer, in the order they run
# also recorded: the MLP's silu(gate), silu(gate) * up (the down projection's input) and up * silu'(gate); the
# GATE_UP outputs themselves are not (the rebuild needs only these three)
ACT, GATED, GATE_GRAD = 4, 5, 6


def unwritten(shape: tuple, *, dtype, device) -> torch.Tensor:
    """A buffer whose positions are each written before they are read (the KV cache, the projection record):
    uninitialised, since zeroing it would be one more pass over memory that the writes make anyway. The tests
    fill it with NaN instead (tests/conftest.py, tests/train/dp_worker.py), so that reading a position nobody
    wrote fails there every time, not once in a while."""
    return torch.empty(shape, dtype=dtype, device=device)


def additive_mask(allowed: torch.Tensor, dtype) -> torch.Tensor:
    """0 where `allowed` is True, -inf elsewhere: a boolean attention mask as a term added to the scores."""
    return torch.zeros(allowed.shape, dtype=dtype, device=allowed.device).masked_fill_(~allowed, float("-inf"))


def rope(body, x: torch.Tensor, pos: torch.Tensor):
    """The model's rotary cos and sin for positions `pos` [B,T], shaped [B,1,T,hd] to broadcast over heads, the
    sin's first half negated, the form `apply_rope` takes."""
    cos, sin = body.rotary_emb(x, pos)
    half = sin.shape[-1] // 2
    return cos[:, None].to(x.dtype), torch.cat((-sin[..., :half], sin[..., half:]), -1)[:, None].to(x.dtype)


# rope types whose frequencies depend on the longest position seen so far: no table computed ahead
_LENGTH_DEPENDENT_ROPE = ("dynamic", "longrope")
# the RMSNorm classes of the supported models, all `weight * (x * rsqrt(mean(x^2) + eps))` in float32
_RMS_NORMS = ("LlamaRMSNorm", "Qwen2RMSNorm", "Qwen3RMSNorm", "MistralRMSNorm")


def qk_roped_in_place(model) -> bool:
    """Whether the sampler ropes each layer's queries and keys in place in its q/k/v output (and so keeps them in
    the record): every supported model but Qwen3, whose per-head q/k norms sit between the projection and rope
    (the update needs their inputs)."""
    return not hasattr(base_model_of(model).model.layers[0].self_attn, "q_norm")


def _rope(x, cos, signed_sin, out=None):
    """x * cos + roll(x) * signed_sin, roll by half the last dim (`apply_rope`), into `out` when given."""
    return torch.addcmul(x * cos, x.roll(x.shape[-1] // 2, -1), signed_sin, out=out)


def rope_in_place(x, cos, signed_sin):
    """`apply_rope(x, cos, signed_sin)` written over x (both terms are computed before the write)."""
    return _rope(x, cos, signed_sin, out=x)


def rope_backward(dy, cos, signed_sin):
    """The gradient of `apply_rope` with respect to x for the output gradient dy: dx = dy * c + roll(dy * s) (rolling
    by half twice is the identity), and roll(dy * s) = roll(dy) * roll(s): one addcmul of dy * c, roll(dy) and
    roll(s)."""
    half = dy.shape[-1] // 2
    return torch.addcmul(dy * cos, dy.roll(half, -1), signed_sin.roll(half, -1))


def apply_rope(x, cos, signed_sin):
    """The model's x * cos + rotate_half(x) * sin, rotate_half(x) = cat(-x2, x1), as
    x * cos + roll(x) * cat(-sin1, sin2): two passes and an addcmul instead of five (negation is exact, so the
    terms are the same numbers); under autograd `_Rope`, whose backward has the same three."""
    if torch.is_grad_enabled() and x.requires_grad and not (cos.requires_grad or signed_sin.requires_grad):
        return _Rope.apply(x, cos, signed_sin)
    return _rope(x, cos, signed_sin)


class _Rope(torch.autograd.Function):
    """y = x * c + roll(x) * s (roll by half the last dim, `apply_rope`), differentiated in x only
    (`rope_backward`): three passes over `[rows, heads, hd]` where autograd's chain takes four (two products, a
    roll, the sum of two gradients), and x is not kept."""

    @staticmethod
    def forward(ctx, x, cos, signed_sin):
        ctx.save_for_backward(cos, signed_sin)
        return _rope(x, cos, signed_sin)

    @staticmethod
    def backward(ctx, dy):
        return rope_backward(dy, *ctx.saved_tensors), None, None


def rms_norm(norm: nn.Module, x: torch.Tensor, out_dtype: torch.dtype | None = None) -> torch.Tensor:
    """`norm(x)` for the models' RMSNorm, the same operations without the module call and the casts a float32
    input does not need (under autograd, `_RMSNorm`'s shorter backward); any other module (or one with hooks) is
    called. out_dtype (float32 `x` and weight, no autograd): the result written in that dtype by the last product
    itself (computed in float32, rounded to nearest on the write: what the product's cast under autocast does
    after it, one op and one float32 `[rows, hidden]` pass fewer: the graph engine's rollout copy)."""
    if type(norm).__name__ not in _RMS_NORMS or norm._forward_hooks or norm._forward_pre_hooks:
        return norm(x)
    fp32 = x.dtype == torch.float32 and norm.weight.dtype == torch.float32
    if out_dtype not in (None, torch.float32) and fp32 and not torch.is_grad_enabled():
        n = x * x.pow(2).mean(-1, keepdim=True).add_(norm.variance_epsilon).rsqrt_()
        return torch.mul(n, norm.weight, out=torch.empty(x.shape, dtype=out_dtype, device=x.device))
    if x.dtype == torch.float32 and norm.weight.dtype == torch.float32 and torch.is_grad_enabled():
        return _RMSNorm.apply(x, norm.weight, norm.variance_epsilon)
    if x.dtype == torch.float32:  # the same operations, the temporaries reused (w * n = n * w exactly)
        return (x * x.pow(2).mean(-1, keepdim=True).add_(norm.variance_epsilon).rsqrt_()).mul_(norm.weight)
    h = x.to(torch.float32)
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + norm.variance_epsilon)
    return norm.weight * h.to(x.dtype)


class _RMSNorm(torch.autograd.Function):
    """y = w * n, n = x * r, r = (mean(x^2) + eps)^(-1/2) over the last dim, in float32: the forward is the
    model's operations (same numbers); the backward is dx = r * (dn - n * mean(dn * n)) with dn = dy * w, and
    dw = sum over rows of dy * n, six passes over `[rows, hidden]` where autograd's chain of the forward's
    operations takes about ten (the mean's and the power's gradients each a full pass, three summed gradients)."""

    @staticmethod
    def forward(ctx, x, weight, eps):
        r = torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
        n = x * r
        ctx.save_for_backward(weight, n, r)
        return weight * n

    @staticmethod
    def backward(ctx, dy):
        weight, n, r = ctx.saved_tensors
        dn = dy * weight
        minus_mean = torch.linalg.vecdot(dn, n).unsqueeze(-1).div_(-n.shape[-1])  # -mean(dn * n) per row
        dx = torch.addcmul(dn, n, minus_mean).mul_(r)
        dw = (dy * n).reshape(-1, n.shape[-1]).sum(0) if ctx.needs_input_grad[1] else None
        return dx, dw, None


def attention_inputs(layer, x, cos, sin, dims, project, norm_dtype=None):
    """Queries, keys and values `[B, heads, T, hd]` (rope applied) of one layer for its input `x` [B,T,H].
    `project(slot, input)` returns the outputs of the modules of projection `slot` (QKV: q, k, v); norm_dtype:
    `rms_norm`'s out_dtype."""
    nh, kvh, hd = dims
    B, T = x.shape[:2]
    h = rms_norm(layer.input_layernorm, x, norm_dtype)
    q, k, v = project(QKV, h)
    q, k, v = (t.reshape(B, T, -1, hd).transpose(1, 2) for t in (q, k, v))
    return (*roped_queries_keys(layer.self_attn, q, k, cos, sin), v)


def roped_queries_keys(attn, q, k, cos, sin):
    """Queries and keys (head dim last, any layout before it) with rope applied, after Qwen3's per-head RMSNorm
    where the attention module has one."""
    if hasattr(attn, "q_norm"):
        q, k = rms_norm(attn.q_norm, q), rms_norm(attn.k_norm, k)
    return apply_rope(q, cos, sin), apply_rope(k, cos, sin)


def layer_output(layer, x, a, project, mlp, norm_dtype=None):
    """The rest of the layer after attention: output projection and residual, then the MLP of the normed
    stream (`mlp(h)`: `gated_mlp`, or the rebuild's; norm_dtype: `rms_norm`'s out_dtype) and residual."""
    x = x + project(O, a)[0]
    return x + mlp(rms_norm(layer.post_attention_layernorm, x, norm_dtype))


def gated_mlp(h, project, keep=None):
    """down(silu(gate(h)) * up(h)), the MLP of every supported model (`supports`: SiLU, no bias). `keep(slot, t)`,
    when given, receives silu(gate) (slot ACT), the product (GATED) and up * silu'(gate) (GATE_GRAD, the factor
    taking d(product) to d(gate)): with them the rebuild's backward is two elementwise passes over
    `[rows, intermediate]` (d up = d product * silu(gate), d gate = d product * GATE_GRAD) and its forward none,
    against five for autograd's SiLU and product; the sampler computes them on one token per row at a time."""
    gate, up = project(GATE_UP, h)
    if keep is None:
        return project(DOWN, F.silu(gate) * up)[0]
    # each computed into its record block (out=None: a new tensor)
    act = keep(ACT, lambda out: F.silu(gate) if out is None else torch.ops.aten.silu.out(gate, out=out), gate)
    gated = keep(GATED, lambda out: torch.mul(act, up, out=out) if out is not None else act * up, gate)
    keep(
        GATE_GRAD,
        lambda out: (
            torch.ops.aten.silu_backward(up, gate)
            if out is None  # up * silu'(gate)
            else torch.ops.aten.silu_backward.grad_input(up, gate, grad_input=out)
        ),
        gate,
    )
    return project(DOWN, gated)[0]


def projection_modules(layer) -> tuple[tuple[nn.Module, ...], ...]:
    """The modules behind each projection slot of a layer (QKV: q, k, v; GATE_UP: gate, up)."""
    a, m = layer.self_attn, layer.mlp
    return (a.q_proj, a.k_proj, a.v_proj), (a.o_proj,), (m.gate_proj, m.up_proj), (m.down_proj,)


def projection_widths(config) -> tuple[int, int, int, int]:
    nh, kvh, hd = head_dims(config)
    return nh * hd + 2 * kvh * hd, config.hidden_size, 2 * config.intermediate_size, config.hidden_size


def record_widths(config) -> tuple[int, ...]:
    """Width of each recorded slot: the four projections (QKV, O, GATE_UP, DOWN), GATE_UP's 0 (not kept), then
    ACT, GATED and GATE_GRAD."""
    qkv, o, _, down = projection_widths(config)
    return (qkv, o, 0, down) + (config.intermediate_size,) * 3


class ProjectionRecord:
    """The projection outputs the sampler computed and the MLP's activations (`gated_mlp`), kept for the update
    (`rlcompare.fast.recorded_update`).

    prompt[layer][slot] (slots QKV, O, DOWN, ACT, GATED, GATE_GRAD; GATE_UP is None): `[n, P, width]`, one row per
    prompt (before the copies per group); QKV's q and k columns with rope applied when `qk_roped`
    (`qk_roped_in_place`: all but Qwen3);
    completion[layer][slot]: `[max_new_tokens - 1, B, width]`, time-major: [j, row] = completion token j of `row`,
    fed at decode step j + 1 (the last token is never fed). A decode step writes one contiguous `[B, width]`
    block (B-major, each of its rows would be a strided write into its own page: 2.3 ms a rollout slower at the
    benchmark's 0.5M size). Positions a row never fed (it was dropped after its EOS) are zero; positions past the
    rollout's last step (`fed`) are zeroed when a wider batch reads them (`zero_past_fed`).
    flat[layer][slot]: `[n * P + (max_new_tokens - 1) * B, width]`, the memory of both, prompt rows first: the
    token rows of a whole-batch rebuild in its order (`rlcompare.fast.recorded_update`), read in place.
    Allocate it outside `torch.inference_mode()` (the sampler writes into it there) so that the update can use
    it under autograd.
    """

    def __init__(self, model, n: int, P: int, repeats: int, max_new_tokens: int, device, dtype):
        base = base_model_of(model)
        widths = record_widths(base.config)
        B, T1 = n * repeats, max(0, max_new_tokens - 1)
        self.P, self.repeats, self.n_rows, self.n_fed = P, repeats, B, T1
        self.qk_roped = qk_roped_in_place(model)  # QKV rows hold q and k with rope applied
        self.key = (n, P, repeats, max_new_tokens, str(device), dtype)
        self.fed = 0  # completion positions this rollout wrote (decode steps run), or zeroed since
        self.flat = [
            [unwritten((n * P + B * T1, w), device=device, dtype=dtype) if w else None for w in widths]
            for _ in base.model.layers
        ]
        self.prompt = [
            [t[: n * P].view(n, P, t.shape[1]) if t is not None else None for t in layer] for layer in self.flat
        ]
        self.completion = [
            [t[n * P :].view(T1, B, t.shape[1]) if t is not None else None for t in layer] for layer in self.flat
        ]
        self.rows: torch.Tensor | None = None  # batch row of each decoder row; None while they are the identity
        # blocks[layer][slot]: the prompt rows `[n * P, width]`, then each decode step's `[B, width]` (views made
        # once: a step looks them up instead of slicing)
        self.blocks = [
            [
                [t[: n * P]] + list(t[n * P :].view(T1, B, t.shape[1]).unbind(0)) if t is not None else None
                for t in layer
            ]
            for layer in self.flat
        ]

    @classmethod
    def reuse(
        cls, old: "ProjectionRecord | None", model, n: int, P: int, repeats: int, max_new_tokens: int, device, dtype
    ) -> "ProjectionRecord":
        """`old` itself when it has the same shapes (its buffers are overwritten; fresh pages would cost a page
        fault per 4 KiB at every rollout), else a new record."""
        if old is not None and old.key == (n, P, repeats, max_new_tokens, str(device), dtype):
            old.rows, old.fed = None, 0
            return old
        return cls(model, n, P, repeats, max_new_tokens, device, dtype)

    def block(self, layer: int, slot: int, start: int) -> torch.Tensor | None:
        """The block that the prefill (`start` 0: `[n * P, width]`) or decode step `start` (`[B, width]`) writes in
        slot `slot`, for computing it in place; None when there is none to write straight into: a slot not kept,
        or rows dropped (their writes are scattered)."""
        blocks = self.blocks[layer][slot]
        if blocks is None or (start and self.rows is not None):
            return None
        return blocks[start - self.P + 1 if start else 0]

    def write(self, layer: int, slot: int, y: torch.Tensor, start: int) -> None:
        """Copy the output `y` of the prefill or of decode step `start` into its block (the decoder's rows into
        their batch rows once rows were dropped)."""
        blocks = self.blocks[layer][slot]
        if blocks is None:  # a slot not kept
            return
        block = blocks[start - self.P + 1 if start else 0]
        y = y.reshape(-1, block.shape[-1])
        if start and self.rows is not None:
            block.index_copy_(0, self.rows, y)
        else:
            block.copy_(y)

    def zero_past_fed(self, width: int) -> None:
        """Zero the completion positions `fed..width-1`, which this rollout never wrote, before a batch `width`
        positions wide reads them: over several ranks the gathered batch is as wide as the longest rank's rows. The
        buffers are `unwritten` (or hold an earlier rollout's values), and a NaN there would survive the zero
        weight that attention or the loss mask gives it (0 x NaN = NaN) and poison the gradient."""
        if width <= self.fed:
            return
        with torch.no_grad():
            for layer in self.completion:
                for buf in layer:
                    if buf is not None:
                        buf[self.fed : width] = 0
        self.fed = width

    def select(self, keep: torch.Tensor, next_position: int) -> None:
        """The decoder keeps only rows `keep`; the others are never written again from `next_position` on."""
        rows = torch.arange(self.n_rows, device=keep.device) if self.rows is None else self.rows
        dropped = torch.ones(len(rows), dtype=torch.bool, device=keep.device)
        dropped[keep] = False
        gone = rows[dropped]
        j = next_position - self.P
        for layer in self.completion:
            for buf in layer:
                if buf is not None:
                    buf[j:, gone] = 0
        self.rows = rows[keep]
