"""Decoding for Llama-family models (Llama, Qwen2, Qwen3, Mistral) with a preallocated KV cache.

Why: transformers' `DynamicCache` concatenates every layer's keys and values with the new token at each
step, so a completion of T tokens copies O(T^2) cache memory; at the benchmark's 25M size those copies are
a quarter of a decode step. Here the cache is allocated once (`[rows, kv_heads, capacity, head_dim]`),
each step writes one position in place, and attention reads the whole buffer under a key mask (unwritten
positions masked; they hold zeros so a masked weight never multiplies garbage).

The layer math is the model's own, step for step: the model's embedding, RMSNorm modules, rotary module
(every rope scaling type), projections (plain `nn.Linear` ones fused into one matmul per layer with weights
concatenated once per sampling call; LoRA or other wrapped projections called as modules) and
`attn.scaling`. `supports(model)` lists what it covers; any other model keeps the transformers cache.
Equality with the transformers forward (fp32 and bf16 autocast) is tested in tests/test_static_decode.py.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from rlcompare.models import base_model_of

_ARCHES = ("LlamaForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM", "MistralForCausalLM")


def supports(model, capacity: int) -> str | None:
    """None when `model` can decode here with `capacity` cache positions, else why not."""
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


def _dims(config):
    nh = config.num_attention_heads
    kvh = getattr(config, "num_key_value_heads", None) or nh
    hd = getattr(config, "head_dim", None) or config.hidden_size // nh
    return nh, kvh, hd


def _rotate_half(x):
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


class _Projection:
    """Several projections of one input as one matmul when they are plain `nn.Linear` (weights concatenated
    once: they do not change while sampling), else each module called on its own."""

    def __init__(self, mods):
        self.mods = mods
        if all(type(m) is nn.Linear for m in mods):
            self.weight = torch.cat([m.weight for m in mods], 0)
            self.bias = None
            if any(m.bias is not None for m in mods):  # Qwen2: q/k/v biases
                self.bias = torch.cat([m.bias if m.bias is not None else m.weight.new_zeros(m.out_features)
                                       for m in mods], 0)
        else:
            self.weight = None

    def __call__(self, x):
        if self.weight is not None:
            return F.linear(x, self.weight, self.bias)
        return torch.cat([m(x) for m in self.mods], -1)


class StaticDecoder:
    """Prefill once per prompt, copy to its group, then one token per step; rows can be dropped (`select`).

    Use under `torch.inference_mode()`; logits are returned for the last position of each row.
    """

    def __init__(self, model, capacity: int):
        self.base = base_model_of(model)
        self.body = self.base.model
        self.nh, self.kvh, self.hd = _dims(self.base.config)
        self.capacity = capacity
        self.layers = []
        for layer in self.body.layers:
            a, m = layer.self_attn, layer.mlp
            self.layers.append((layer, _Projection((a.q_proj, a.k_proj, a.v_proj)), _Projection((m.gate_proj, m.up_proj))))
        self.keys: list[torch.Tensor] = []
        self.values: list[torch.Tensor] = []
        self.key_mask: torch.Tensor | None = None  # [rows, capacity] True on real keys
        self.length = 0
        self.can_select = True

    def prefill(self, ids: torch.Tensor, mask: torch.Tensor, pos: torch.Tensor, repeats: int = 1) -> torch.Tensor:
        """Left-padded prompts `[n,P]` -> next-token logits `[n*repeats, V]`; the cache holds n*repeats rows."""
        n, P = ids.shape
        if P > self.capacity:
            raise ValueError(f"prompt of {P} tokens exceeds the cache capacity {self.capacity}")
        self.key_mask = torch.zeros((n, self.capacity), dtype=torch.bool, device=ids.device)
        self.key_mask[:, :P] = mask.bool()
        self.keys, self.values = [], []
        logits = self._forward(ids, pos, start=0)
        self.length = P
        if repeats > 1:
            self.keys = [k.repeat_interleave(repeats, 0) for k in self.keys]
            self.values = [v.repeat_interleave(repeats, 0) for v in self.values]
            self.key_mask = self.key_mask.repeat_interleave(repeats, 0)
            logits = logits.repeat_interleave(repeats, 0)
        return logits

    def step(self, tokens: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        """One new token per row (`[b]`, positions `[b,1]`) -> next-token logits `[b, V]`."""
        if self.length >= self.capacity:
            raise ValueError(f"the KV cache of {self.capacity} positions is full")
        self.key_mask[:, self.length] = True
        logits = self._forward(tokens[:, None], pos, start=self.length)
        self.length += 1
        return logits

    def select(self, rows: torch.Tensor) -> None:
        """Keep only `rows` (indices into the current rows)."""
        self.keys = [k.index_select(0, rows) for k in self.keys]
        self.values = [v.index_select(0, rows) for v in self.values]
        self.key_mask = self.key_mask.index_select(0, rows)

    def _forward(self, ids: torch.Tensor, pos: torch.Tensor, start: int) -> torch.Tensor:
        B, T = ids.shape
        nh, kvh, hd = self.nh, self.kvh, self.hd
        x = self.body.embed_tokens(ids)
        cos, sin = self.body.rotary_emb(x, pos)
        cos, sin = cos[:, None].to(x.dtype), sin[:, None].to(x.dtype)  # [B,1,T,hd]
        # key j visible from query i: written, real, and not in the future (a query always sees itself, so
        # a padding row never takes a softmax over nothing)
        q_at = torch.arange(start, start + T, device=ids.device)[:, None]
        k_at = torch.arange(self.capacity, device=ids.device)[None, :]
        allowed = (self.key_mask[:, None, :] & (k_at <= q_at)[None]) | (k_at == q_at)[None]  # [B,T,capacity]
        allowed = allowed[:, None]
        first = not self.keys
        for li, (layer, qkv_proj, gate_up) in enumerate(self.layers):
            attn = layer.self_attn
            h = layer.input_layernorm(x)
            q, k, v = qkv_proj(h).split((nh * hd, kvh * hd, kvh * hd), -1)
            q, k, v = (t.view(B, T, -1, hd).transpose(1, 2) for t in (q, k, v))
            if hasattr(attn, "q_norm"):  # Qwen3: RMSNorm per head before rope
                q, k = attn.q_norm(q), attn.k_norm(k)
            q = q * cos + _rotate_half(q) * sin
            k = k * cos + _rotate_half(k) * sin
            if first:
                # zeros, not empty: a masked key still enters the weighted sum with weight exactly 0
                self.keys.append(torch.zeros((B, kvh, self.capacity, hd), dtype=k.dtype, device=k.device))
                self.values.append(torch.zeros((B, kvh, self.capacity, hd), dtype=v.dtype, device=v.device))
            K, V = self.keys[li], self.values[li]
            K[:, :, start:start + T] = k
            V[:, :, start:start + T] = v
            if T == 1:
                # one query: grouped heads as a batched matmul over the whole buffer (no copy of the cache)
                qg = q.reshape(B, kvh, nh // kvh, hd)
                scores = torch.matmul(qg, K.transpose(-1, -2).to(qg.dtype)) * attn.scaling
                scores = scores.float().masked_fill(~allowed, float("-inf"))
                a = torch.matmul(scores.softmax(-1).to(V.dtype), V).reshape(B, 1, nh * hd)
            else:
                a = F.scaled_dot_product_attention(q, K.to(q.dtype), V.to(q.dtype), attn_mask=allowed,
                                                   scale=attn.scaling, enable_gqa=kvh != nh)
                a = a.transpose(1, 2).reshape(B, T, nh * hd)
            x = x + attn.o_proj(a)
            h = layer.post_attention_layernorm(x)
            gate, up = gate_up(h).chunk(2, -1)
            x = x + layer.mlp.down_proj(F.silu(gate) * up)
        return self.base.lm_head(self.body.norm(x[:, -1]))
