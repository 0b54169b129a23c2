"""Completion tokens' log-probs and entropies through the LM head, in chunks of positions.

An update reads two numbers per completion token, log p(token) and the entropy, but the ordinary path gets them
from `[B,T,V]` logits and a float32 copy: with a real vocabulary (151,936 for Qwen2.5) and 128 x 512 completion
tokens the copy alone is 40 GB. Where the logits of a forward would exceed `MAX_LOGITS` elements (and the
architecture's logits are just `lm_head(hidden)`, `rollout.lm_head_of`), the model is run to its final hidden
states and the head is applied to `MAX_LOGITS // V` positions at a time, each chunk under activation
checkpointing: its logits are rebuilt in the backward, so one chunk's logits exist at a time, for one more head
product per token. Below that size the logits are computed whole as before, so runs with a small vocabulary
(the default's 82 characters) keep their rows bit for bit; chunking changes only the order in which the head's
weight gradient is summed over positions (and, on some BLAS builds, the last bits of a product).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Callable

import torch
from torch.utils.checkpoint import checkpoint

from rlcompare.algos import losses
from rlcompare.rollout import grouped_sequence_logits, lm_head_of, sequence_logits, token_logp

# Logits elements one forward may hold at once (64M: 256 MB in float32; 441 positions of a 151,936-token
# vocabulary). Read at call time, so a test can lower it to force chunking on a small model.
MAX_LOGITS = 1 << 26


def stats_from_logits(
    logits: torch.Tensor, tokens: torch.Tensor, *, temperature: float, entropy: bool, entropy_grad: bool
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(log p of `tokens` [B,T], entropy [B,T] or None) from logits `[B,T,V]`, temperature applied. The entropy
    carries a graph only when `entropy_grad` (the entropy bonus); otherwise it is a metric."""
    logp = token_logp(logits, tokens, temperature)
    ent = None
    if entropy:
        with torch.set_grad_enabled(entropy_grad):
            ent = losses.entropy_from_logits(logits / temperature if temperature != 1.0 else logits, chunk_size=1024)
    return logp, ent


def stats_from_hidden(
    hidden: torch.Tensor,
    head: torch.nn.Module,
    tokens: torch.Tensor,
    *,
    temperature: float,
    entropy: bool,
    entropy_grad: bool,
    autocast_dtype=None,
    chunk_positions: int,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """`stats_from_logits(head(hidden))` computed `chunk_positions` positions at a time: hidden `[B,T,H]` (the
    final hidden states), tokens `[B,T]`. Under autograd each chunk is checkpointed: only its hidden states are
    kept, and its logits are rebuilt in the backward. The head runs under `autocast_dtype` as in the model."""
    B, T, H = hidden.shape

    def chunk(h: torch.Tensor, t: torch.Tensor):
        ctx = (
            torch.autocast(h.device.type, dtype=autocast_dtype)
            if autocast_dtype is not None
            else contextlib.nullcontext()
        )
        with ctx:
            logits = head(h)
        lp, e = stats_from_logits(logits, t, temperature=temperature, entropy=entropy, entropy_grad=entropy_grad)
        return lp, (e if e is not None else lp.new_zeros(()))

    logps, ents = [], []
    taped = torch.is_grad_enabled() and (hidden.requires_grad or any(p.requires_grad for p in head.parameters()))
    for h, t in zip(hidden.reshape(B * T, H).split(chunk_positions), tokens.reshape(B * T).split(chunk_positions)):
        lp, e = checkpoint(chunk, h, t, use_reentrant=False) if taped else chunk(h, t)
        logps.append(lp)
        ents.append(e)
    logp = torch.cat(logps).view(B, T)
    return logp, torch.cat(ents).view(B, T) if entropy else None


def completion_stats(
    forward: Callable[[bool], torch.Tensor],
    head: torch.nn.Module | None,
    tokens: torch.Tensor,
    *,
    temperature: float,
    entropy: bool = False,
    entropy_grad: bool = False,
    autocast_dtype=None,
    max_logits: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(log p [B,T], entropy [B,T] or None) of the completion `tokens` [B,T].

    forward(hidden): the completions' logits `[B,T,V]` (hidden=False) or final hidden states `[B,T,H]`
    (hidden=True: `sequence_logits(..., hidden=True)`). head: the LM head (`rollout.lm_head_of`), or None when
    the logits must be computed whole. max_logits: the chunk budget in logits elements (`MAX_LOGITS` if None).
    """
    budget = MAX_LOGITS if max_logits is None else max_logits
    B, T = tokens.shape
    vocab = _vocab(head) if head is not None else 0
    if head is None or B * T * vocab <= budget:
        return stats_from_logits(
            forward(False), tokens, temperature=temperature, entropy=entropy, entropy_grad=entropy_grad
        )
    return stats_from_hidden(
        forward(True),
        head,
        tokens,
        temperature=temperature,
        entropy=entropy,
        entropy_grad=entropy_grad,
        autocast_dtype=autocast_dtype,
        chunk_positions=max(1, budget // vocab),
    )


def _vocab(head: torch.nn.Module) -> int:
    out = getattr(head, "out_features", None)  # nn.Linear, and peft's LoRA layer around one
    return int(out) if out is not None else int(head.weight.shape[0])


@dataclass(frozen=True)
class CompletionForward:
    """How the trainer runs a model over completions (the update, the reference, the recomputed old log-probs):
    temperature applied, under the run's autocast, rows in whole groups sharing their prompt's forward."""

    group_size: int  # G: the completions of one prompt, contiguous rows
    temperature: float  # rollout.temperature: the log-probs are the sampler's distribution's
    autocast: torch.dtype | None  # bfloat16 on a CUDA device that supports it for float32 weights, else None
    share_prompts: bool  # whole groups share their prompt's forward (off under model.gradient_checkpointing)

    def logits(self, model, prompt_ids, prompt_mask, ids, mask, grouped: bool = True, hidden: bool = False):
        """Completion logits (B, T, V), or with `hidden` the final hidden states (B, T, H); rows in whole groups
        share their prompt's forward (and backward)."""
        G = self.group_size
        if grouped and G > 1 and ids.shape[0] % G == 0 and self.share_prompts:
            return grouped_sequence_logits(
                model, prompt_ids, prompt_mask, ids, mask, group_size=G, autocast_dtype=self.autocast, hidden=hidden
            )
        return sequence_logits(model, prompt_ids, prompt_mask, ids, mask, autocast_dtype=self.autocast, hidden=hidden)

    def stats(
        self,
        model,
        prompt_ids,
        prompt_mask,
        ids,
        mask,
        *,
        grouped=True,
        entropy=False,
        entropy_grad=False,
        rebuilt=None,
    ):
        """(log p [b,T], entropy [b,T] or None) of the completions `ids`, through the LM head in chunks of
        positions where the whole logits would be large (`completion_stats`); rebuilt(hidden): the speed layer's
        forward from the rollout's record, or None where it declines (then the plain forward)."""

        def forward(hidden: bool) -> torch.Tensor:
            out = rebuilt(hidden) if rebuilt is not None else None
            return out if out is not None else self.logits(model, prompt_ids, prompt_mask, ids, mask, grouped, hidden)

        return completion_stats(
            forward,
            lm_head_of(model),
            ids,
            temperature=self.temperature,
            entropy=entropy,
            entropy_grad=entropy_grad,
            autocast_dtype=self.autocast,
        )
