"""Sampling with a KV cache, and per-token log-probs of given completions.

Our own loop instead of `generate()`: one batched forward per new token, log-probs of the chosen
tokens kept as they are sampled (they are the rollout policy's `old_logp` when weights have not
moved), and decoding stops as soon as every sequence has emitted EOS.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F


@dataclass
class Completions:
    ids: torch.Tensor  # [B,T] completion tokens (pad after EOS)
    mask: torch.Tensor  # [B,T] 1 on real tokens (EOS included)
    logp: torch.Tensor  # [B,T] log-prob of each chosen token under the sampling weights (temperature applied)
    truncated: torch.Tensor  # [B] bool: no EOS within the budget
    lengths: torch.Tensor  # [B] real tokens


def left_pad(seqs: list[list[int]], pad_id: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(seqs), width), dtype=torch.long)
    for i, s in enumerate(seqs):
        if s:
            ids[i, width - len(s):] = torch.tensor(s, dtype=torch.long)
            mask[i, width - len(s):] = 1
    return ids.to(device), mask.to(device)


def _top_p_filter(logits: torch.Tensor, top_p: float) -> torch.Tensor:
    sorted_logits, order = torch.sort(logits, descending=True, dim=-1)
    cum = sorted_logits.softmax(-1).cumsum(-1)
    drop = cum - sorted_logits.softmax(-1) >= top_p  # keep the smallest prefix reaching top_p
    sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
    return torch.empty_like(logits).scatter_(-1, order, sorted_logits)


@torch.inference_mode()
def sample(model, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, *, max_new_tokens: int, eos_id: int,
           pad_id: int, temperature: float = 1.0, top_p: float = 1.0, greedy: bool = False,
           generator: torch.Generator | None = None, autocast_dtype=None) -> Completions:
    """Sample completions for left-padded prompts `[B,P]`. Returns right-padded completions `[B,T]`."""
    B = prompt_ids.shape[0]
    device = prompt_ids.device
    mask = prompt_mask.clone()
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    next_pos = pos[:, -1:] + 1
    done = torch.zeros(B, dtype=torch.bool, device=device)
    eos = torch.as_tensor(eos_id, device=device).reshape(-1)  # one id or several (generation_config)
    out_ids, out_logp = [], []
    ctx = torch.autocast(device.type, dtype=autocast_dtype) if autocast_dtype is not None else _nullctx()
    with ctx:
        out = model(input_ids=prompt_ids, attention_mask=mask, position_ids=pos, use_cache=True, logits_to_keep=1)
    cache = _cache_of(out)
    logits = out.logits[:, -1].float()
    cache_kw = _cache_kwarg(model)
    for t in range(max_new_tokens):
        scaled = logits / temperature
        logprobs = scaled.log_softmax(-1)
        if greedy:
            tok = scaled.argmax(-1)
        else:
            probs = (_top_p_filter(scaled, top_p) if top_p < 1.0 else scaled).softmax(-1)
            tok = torch.multinomial(probs, 1, generator=generator).squeeze(-1)
        tok = torch.where(done, torch.full_like(tok, pad_id), tok)
        out_ids.append(tok)
        out_logp.append(logprobs.gather(-1, tok[:, None]).squeeze(-1).masked_fill(done, 0.0))
        done = done | torch.isin(tok, eos)
        if bool(done.all()) or t == max_new_tokens - 1:
            break
        mask = torch.cat([mask, torch.ones((B, 1), dtype=mask.dtype, device=device)], dim=1)
        with ctx:
            out = model(input_ids=tok[:, None], attention_mask=mask, position_ids=next_pos,
                        use_cache=True, **{cache_kw: cache})
        cache = _cache_of(out)
        logits = out.logits[:, -1].float()
        next_pos = next_pos + 1
    ids = torch.stack(out_ids, 1)
    logp = torch.stack(out_logp, 1)
    is_eos = torch.isin(ids, eos)
    # real tokens: everything up to and including the first EOS
    after_eos = (is_eos.cumsum(1) - is_eos.long()) > 0
    cmask = (~after_eos).long()
    truncated = ~is_eos.any(1)
    ids = ids.masked_fill(cmask == 0, pad_id)
    return Completions(ids=ids, mask=cmask, logp=logp * cmask, truncated=truncated, lengths=cmask.sum(1))


def _cache_kwarg(model) -> str:
    """transformers 5 renamed `past_key_values` to `cache`; accept both."""
    import inspect

    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    fwd = inspect.signature(type(base).forward).parameters
    if "cache" in fwd:
        return "cache"
    return "past_key_values"


def _cache_of(out):
    cache = getattr(out, "cache", None)
    return cache if cache is not None else out.past_key_values


class _nullctx:
    def __enter__(self):
        return self

    def __exit__(self, *a):
        return False


def sequence_logits(model, prompt_ids, prompt_mask, comp_ids, comp_mask, *, autocast_dtype=None):
    """Logits predicting each completion token: `[B,T,V]` (only the completion positions are projected)."""
    T = comp_ids.shape[1]
    ids = torch.cat([prompt_ids, comp_ids], 1)
    mask = torch.cat([prompt_mask, comp_mask.to(prompt_mask.dtype)], 1)
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    ctx = torch.autocast(ids.device.type, dtype=autocast_dtype) if autocast_dtype is not None else _nullctx()
    with ctx:
        out = model(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=False, logits_to_keep=T + 1)
    return out.logits[:, :-1]


def token_logp(logits: torch.Tensor, tokens: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """log p(token) from logits without materializing a [B,T,V] log-softmax: gather minus logsumexp."""
    logits = logits.float() / temperature
    return logits.gather(-1, tokens[..., None]).squeeze(-1) - torch.logsumexp(logits, -1)


def token_entropy(logits: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """Per-token entropy `[B,T]` in nats."""
    logits = logits.float() / temperature
    logz = torch.logsumexp(logits, -1)
    return logz - (F.softmax(logits, -1) * logits).sum(-1)
