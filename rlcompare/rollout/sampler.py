"""Sampling with a KV cache, and per-token log-probs of given completions.

Our own loop instead of `generate()`: one batched forward per new token, log-probs of the chosen
tokens kept as they are sampled (they are the rollout policy's `old_logp` when weights have not
moved), and decoding stops as soon as every sequence has emitted EOS.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
from dataclasses import dataclass

import torch

from rlcompare import fast  # the speed layer's door: decoder_for, Recording
from rlcompare.fast import base_model_of
from rlcompare.rollout.request import SamplingRequest, request_of
from rlcompare.rollout.streams import GroupStreams


@dataclass
class Completions:
    ids: torch.Tensor  # [B,T] completion tokens (pad after EOS)
    mask: torch.Tensor  # [B,T] 1 on real tokens (EOS included)
    # [B,T] log-prob of each chosen token under the sampling weights (temperature applied); None when the sampler
    # was told nobody reads them (`sample(logprobs=False)`)
    logp: torch.Tensor | None
    truncated: torch.Tensor  # [B] bool: no EOS within the budget
    lengths: torch.Tensor  # [B] real tokens
    # the speed layer's opaque handle on the sampler's projection outputs (`sample(record=True)` where
    # `fast.decoder_for` keeps them), for the first update to reuse (`fast.recorded_update_forward`); else None
    recording: fast.Recording | None = None
    # multi-turn episodes (rlcompare.rollout.episodes): [B,T] 1 on the environment's tokens, which `mask` covers
    # (they are context, attended) but the loss does not (`policy_mask`); None: every real token is the policy's
    env_mask: torch.Tensor | None = None
    # multi-turn episodes: their rewards, correct flags and end reasons (`episodes.Outcome`), read by the scoring
    # in place of the verifier; None for single-turn completions
    outcome: object | None = None

    @property
    def policy_mask(self) -> torch.Tensor:
        """[B,T] 1 on the policy's own tokens: the loss mask (`mask` itself when no environment spoke)."""
        return self.mask if self.env_mask is None else self.mask * (1 - self.env_mask)

    def select(self, rows: torch.Tensor) -> "Completions":
        """The completions `rows` (a [B] bool mask, CPU), on their device, with their recording."""
        at = rows.to(self.ids.device)
        return Completions(
            self.ids[at],
            self.mask[at],
            self.logp[at] if self.logp is not None else None,
            self.truncated[at],
            self.lengths[at],
            recording=self.recording.select(rows) if self.recording is not None else None,
            env_mask=self.env_mask[at] if self.env_mask is not None else None,
        )


def left_pad(seqs: list[list[int]], pad_id: int, device, width: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Token lists as `[n, width]` ids (`width`: the longest unless given) left-padded with `pad_id` and their
    0/1 mask (built as lists: one tensor each instead of a few small writes per row)."""
    width = max(len(s) for s in seqs) if width is None else width
    ids = torch.tensor([[pad_id] * (width - len(s)) + list(s) for s in seqs], dtype=torch.long)
    mask = torch.tensor([[0] * (width - len(s)) + [1] * len(s) for s in seqs], dtype=torch.long)
    return ids.to(device), mask.to(device)


def _top_p_filter(logits: torch.Tensor, top_p: float) -> torch.Tensor:
    sorted_logits, order = torch.sort(logits, descending=True, dim=-1)
    cum = sorted_logits.softmax(-1).cumsum(-1)
    drop = cum - sorted_logits.softmax(-1) >= top_p  # keep the smallest prefix reaching top_p
    # the most likely token always stays (it already does for any top_p float32 can hold: its mass before it is 0);
    # a top_p below that (1e-300 is 0 in float32) dropped every token, and the draw then took token 0 (pad)
    drop[..., 0] = False
    sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
    return torch.empty_like(logits).scatter_(-1, order, sorted_logits)


def gumbel_max(
    logits: torch.Tensor, generator: torch.Generator | None = None, u: torch.Tensor | None = None
) -> torch.Tensor:
    """One token per row `[..., V]`, drawn from softmax(logits): argmax(logits + G) with G = -log(-log U),
    U ~ U[0, 1), is exactly that draw (the Gumbel-max trick; Maddison, Tarlow & Minka 2014, sec. 2).
    It replaces `torch.multinomial(logits.softmax(-1), 1)`, whose CPU kernel draws its Exp(1) variates one by
    one in float64 (about 20 ns each: 200 us for a [128, 82] step, more than the step's attention), and it
    needs no softmax. A U of exactly 0 gives G = -inf: that token is not drawn.
    u: the uniforms to use (same shape as logits; `streams.GroupStreams`), else drawn from `generator`."""
    if u is None:
        u = torch.rand(logits.shape, generator=generator, device=logits.device, dtype=logits.dtype)
        return (logits - u.log_().neg_().log_()).argmax(-1)
    return (logits - u.log().neg().log()).argmax(-1)  # not in place: the caller's tensor


def sample(
    model,
    prompt_ids: torch.Tensor,
    prompt_mask: torch.Tensor,
    request: SamplingRequest | None = None,
    *,
    generator: torch.Generator | None = None,
    streams: GroupStreams | None = None,
    record: bool | fast.Recording = False,
    flop_observer: fast.FlopObserver | None = None,
    **loose,
) -> Completions:
    """Sample the completions `request` asks for (see `_sample`); the tensors returned are ordinary tensors, usable
    under autograd. `loose`: the request's fields as keywords (`SamplingRequest.of`), instead of `request`.

    The decoder is the speed layer's where it applies (`fast.decoder_for`), else transformers' cache.
    generator / streams: the randomness drawn from (`_sample`).
    record: keep every projection output (`Completions.recording`) where the speed layer can rebuild the first
    update from them (`fast.recorded_update_forward`); an earlier call's `Recording` whose batch is no longer
    needed lends its buffers when the shapes match. flop_observer: the benchmark's FLOP count of the speed
    layer's decoder.
    """
    request = request_of(request, loose)
    decoder = fast.decoder_for(
        model,
        prompt_ids.shape[1] + request.max_new_tokens,
        kv_cache=request.kv_cache,
        record=record,
        autocast_dtype=autocast_dtype_of(request),
        flop_observer=flop_observer,
        engine=request.engine,
        sync_every=request.sync_every,
        rows=prompt_ids.shape[0] * request.repeats,
    )
    with torch.inference_mode():
        c = _sample(
            model,
            prompt_ids,
            prompt_mask,
            request,
            decoder=decoder or CacheDecoder(model),
            generator=generator,
            streams=streams,
        )
    return Completions(
        *(x.clone() if x is not None else None for x in (c.ids, c.mask, c.logp, c.truncated, c.lengths)),
        recording=getattr(decoder, "recording", None),
    )


def autocast_dtype_of(request: SamplingRequest) -> torch.dtype | None:
    """The request's autocast dtype as torch's, or None."""
    return getattr(torch, request.autocast) if request.autocast is not None else None


def _sample(
    model,
    prompt_ids: torch.Tensor,
    prompt_mask: torch.Tensor,
    request: SamplingRequest | None = None,
    *,
    decoder=None,
    generator: torch.Generator | None = None,
    streams: GroupStreams | None = None,
    **loose,
) -> Completions:
    """Sample `request.repeats` completions for each left-padded prompt `[n,P]`; returns right-padded
    `[n*repeats, T]` completions, the `repeats` completions of a prompt contiguous.
    request.logprobs: keep each chosen token's log-prob (`Completions.logp`); False skips the gather and logsumexp
    of every step (one update per batch needs none: its old log-probs are the update's own, detached).

    Each prompt is prefilled once and its KV cache copied to its group. Rows that emitted EOS are dropped
    from the decode batch (once they are a quarter of it), so long stragglers do not pay for finished rows.
    decoder: `prefill` / `step` / `select` (`sample` picks it: the speed layer's or `CacheDecoder`).
    streams: one random stream per prompt group (`rollout.streams=group`), used instead of `generator`, so that
    a row's draws do not depend on the other rows of the batch.
    """
    q = request_of(request, loose)
    repeats, max_new_tokens, pad_id, greedy, logprobs = q.repeats, q.max_new_tokens, q.pad_id, q.greedy, q.logprobs
    n = prompt_ids.shape[0]
    B = n * repeats
    device = prompt_ids.device
    eos = torch.tensor(q.eos_ids, dtype=torch.long, device=device)  # one id or several (generation_config)
    autocast_dtype = autocast_dtype_of(q)
    ctx = torch.autocast(device.type, dtype=autocast_dtype) if autocast_dtype is not None else _nullctx()
    pos = (prompt_mask.cumsum(-1) - 1).clamp(min=0)
    decoder = decoder if decoder is not None else CacheDecoder(model)
    if getattr(decoder, "runs_rollout", False):  # the speed layer's graph engine runs the whole loop itself,
        # its one prefill included (after the refresh of its copy of the weights)
        plan = _plan(B, eos, q, generator, streams)
        ids, logp = decoder.generate(prompt_ids, prompt_mask, pos, repeats, plan, autocast_dtype)
        return _completions(ids, logp, eos, pad_id)
    with ctx:
        logits = decoder.prefill(prompt_ids, prompt_mask, pos, repeats).float()
    next_pos = pos[:, -1:].repeat_interleave(repeats, 0) + 1
    ids = torch.full((B, max_new_tokens), pad_id, dtype=torch.long, device=device)
    logp = torch.zeros((B, max_new_tokens), dtype=torch.float32, device=device) if logprobs else None
    rows = None  # full-batch row of each cache row; None while they are the identity
    live = torch.ones(B, dtype=torch.bool, device=device)  # cache rows still decoding
    all_live = True  # every cache row is live (the common case: plain writes, no masks)
    steps = 0
    for t in range(max_new_tokens):
        u = None if greedy else _uniforms(logits, generator, streams, rows)
        tok, tok_logp = _pick(logits, u, temperature=q.temperature, top_p=q.top_p, greedy=greedy, logprobs=logprobs)
        if not all_live:
            tok = torch.where(live, tok, torch.full_like(tok, pad_id))
        # the live cache rows `src` and their batch rows `dst` (plain slices while every row is live)
        src = slice(None) if all_live else live.nonzero().squeeze(-1)
        dst = src if rows is None else rows[src]
        ids[dst, t] = tok[src]
        if logprobs:
            logp[dst, t] = tok_logp[src]
        steps = t + 1
        ended = tok == eos[0] if len(eos) == 1 else torch.isin(tok, eos)
        live = live & ~ended
        n_live = int(live.sum())
        if t == max_new_tokens - 1 or n_live == 0:
            break
        all_live = n_live == len(live)
        if decoder.can_select and (len(live) - n_live) * 4 >= len(live):
            keep = live.nonzero().squeeze(-1)
            decoder.select(keep)
            rows = keep if rows is None else rows[keep]
            next_pos, tok, live, all_live = next_pos[keep], tok[keep], live[keep], True
        with ctx:
            logits = decoder.step(tok, next_pos).float()
        next_pos = next_pos + 1
    return _completions(ids[:, :steps], logp[:, :steps] if logprobs else None, eos, pad_id)


def _uniforms(logits: torch.Tensor, generator, streams: GroupStreams | None, rows) -> torch.Tensor:
    """The U[0, 1) draws of each cache row's Gumbel-max: from its group stream (`rows`: the batch row of each
    cache row, None while they are the identity), or one `[rows, V]` draw from `generator`."""
    if streams is None:
        return torch.rand(logits.shape, generator=generator, device=logits.device, dtype=logits.dtype)
    u = streams.uniform(logits.shape[-1])  # every row's uniforms, then those of the rows still in the cache
    return u if rows is None else u[rows]


def _pick(
    logits: torch.Tensor, u: torch.Tensor | None, *, temperature: float, top_p: float, greedy: bool, logprobs: bool
):
    """One token per row of `logits` `[b, V]` (float32) and its log-prob under the sampling weights (temperature
    applied; None unless `logprobs`): argmax when greedy, else Gumbel-max with the uniforms `u` over the top-p
    filtered logits. Device work only, no read-back: the graph engine runs it inside its captured steps."""
    scaled = logits / temperature if temperature != 1.0 else logits
    tok = scaled.argmax(-1) if greedy else gumbel_max(_top_p_filter(scaled, top_p) if top_p < 1.0 else scaled, None, u)
    if not logprobs:
        return tok, None
    # log p of the chosen token: gather minus logsumexp, no [B,V] log-softmax
    return tok, scaled.gather(-1, tok[:, None]).squeeze(-1) - torch.logsumexp(scaled, -1)


def _plan(B: int, eos: torch.Tensor, q: SamplingRequest, generator, streams) -> fast.SamplingPlan:
    """The graph engine's `fast.SamplingPlan`: `_pick` with the request's settings, and each position's uniforms
    for all `B` rows (a row's group stream, or one `[B, V]` draw from `generator`: with one stream per batch the
    engine's tokens are another draw than the eager loop's, whose draws follow its own row drops)."""
    if q.greedy:
        uniforms = None
    elif streams is not None:
        uniforms = streams.uniform_
    else:  # what torch.rand((B, V), generator=generator) draws, into the engine's buffer
        uniforms = lambda out: out.uniform_(0.0, 1.0, generator=generator)  # noqa: E731
    settings = dict(temperature=q.temperature, top_p=q.top_p, greedy=q.greedy, logprobs=q.logprobs)
    return fast.SamplingPlan(
        pick=functools.partial(_pick, **settings),
        uniforms=uniforms,
        eos=eos,
        pad_id=q.pad_id,
        max_new_tokens=q.max_new_tokens,
        logprobs=q.logprobs,
        key=(*settings.values(), tuple(eos.tolist()), q.pad_id),
    )


def _completions(ids: torch.Tensor, logp: torch.Tensor | None, eos: torch.Tensor, pad_id: int) -> Completions:
    """The decoded ids (B, T) as completions: real tokens up to and including the first EOS, pad after it."""
    is_eos = torch.isin(ids, eos)
    after_eos = (is_eos.cumsum(1) - is_eos.long()) > 0
    cmask = (~after_eos).long()
    return Completions(
        ids=ids.masked_fill(cmask == 0, pad_id),
        mask=cmask,
        logp=logp * cmask if logp is not None else None,
        truncated=~is_eos.any(1),
        lengths=cmask.sum(1),
    )


def make_decoder(model, capacity: int, kv_cache: str = "auto"):
    """The decoder `_sample` drives: `prefill(ids, mask, pos, repeats)`, `step(tokens, pos)`, `select(rows)`:
    the speed layer's where it applies ("auto"), else transformers' cache."""
    return fast.decoder_for(model, capacity, kv_cache=kv_cache) or CacheDecoder(model)


class CacheDecoder:
    """Decoding through the model's own forward and transformers' KV cache (any architecture it supports)."""

    def __init__(self, model):
        self.model = model
        self.cache_kw = _cache_kwarg(model)
        self.cache = None
        self.mask = None
        self.can_select = False
        self.recording = None  # keeps no projections (the speed layer's decoder does)

    def prefill(self, ids, mask, pos, repeats: int = 1):
        out = self.model(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=True, logits_to_keep=1)
        self.cache, self.mask = _cache_of(out), mask
        logits = out.logits[:, -1]
        if repeats > 1:
            self.cache.batch_repeat_interleave(repeats)
            logits, self.mask = logits.repeat_interleave(repeats, 0), mask.repeat_interleave(repeats, 0)
        self.can_select = hasattr(self.cache, "batch_select_indices")
        return logits

    def step(self, tokens, pos):
        self.mask = torch.cat([self.mask, self.mask.new_ones((self.mask.shape[0], 1))], dim=1)
        out = self.model(
            input_ids=tokens[:, None],
            attention_mask=self.mask,
            position_ids=pos,
            use_cache=True,
            **{self.cache_kw: self.cache},
        )
        self.cache = _cache_of(out)
        return out.logits[:, -1]

    def select(self, rows):
        self.cache.batch_select_indices(rows)
        self.mask = self.mask[rows]


def check_sampling_support(model, token_id: int) -> None:
    """Run, on a 2-token prompt, every cache operation the sampler and the grouped update use (prefill,
    repeat per group, drop rows, one decode step); raise `ValueError` saying why a model cannot be sampled.

    Attention models with a transformers KV cache pass; state-space and recurrent models (Mamba, RWKV,
    hybrids such as Jamba) keep a state that cannot be copied per group or cut per row this way.
    """
    device = next(model.parameters()).device
    ids = torch.full((1, 2), int(token_id), dtype=torch.long, device=device)
    try:
        with torch.inference_mode():
            decoder = CacheDecoder(model)
            decoder.prefill(ids, torch.ones_like(ids), torch.arange(2, device=device)[None], repeats=2)
            decoder.select(torch.tensor([1], device=device))
            decoder.step(ids[:1, 0], torch.full((1, 1), 2, device=device))
    except (AttributeError, TypeError, ValueError, NotImplementedError, RuntimeError) as e:
        raise ValueError(
            f"{type(base_model_of(model)).__name__} cannot be sampled by rlcompare ({type(e).__name__}: {str(e).rstrip('.')}); rlcompare "
            f"needs an attention model with a transformers KV cache (copied per group, cut per row); "
            f"state-space and recurrent models (Mamba, RWKV, Jamba-style hybrids) are not "
            f"supported"
        ) from None


def _cache_kwarg(model) -> str:
    """transformers 5 renamed `past_key_values` to `cache`; accept both."""
    return _cache_kwarg_of(type(base_model_of(model)))


@functools.lru_cache(maxsize=None)
def _cache_kwarg_of(cls) -> str:
    return "cache" if "cache" in inspect.signature(cls.forward).parameters else "past_key_values"


def _cache_of(out):
    cache = getattr(out, "cache", None)
    return cache if cache is not None else out.past_key_values


class _nullctx:
    def __enter__(self):
        return self

    def __exit__(self, *a):
        return False


# The causal LMs whose logits are exactly `lm_head(final hidden states)` (no soft-capping or scaling after the
# head): for these the update may run the model to its hidden states and apply the head itself, in chunks.
_PLAIN_HEAD_ARCHES = ("LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM")


def lm_head_of(model):
    """The LM head module of `model` (under a peft wrapper too) when its logits are `head(final hidden states)`,
    else None: `sequence_logits(hidden=True)` then does not apply and the logits are computed whole."""
    base = base_model_of(model)
    head = getattr(base, "lm_head", None)
    plain = any(c.__name__ in _PLAIN_HEAD_ARCHES for c in type(base).__mro__)  # fully_shard subclasses the model
    return head if plain and isinstance(head, torch.nn.Module) else None


class _Unprojected(torch.nn.Module):
    """Stands in for the LM head during one forward: the model returns its final hidden states as its "logits"."""

    def forward(self, hidden):
        return hidden


@contextlib.contextmanager
def _head_removed(model, remove: bool):
    """Within: the model's forward returns final hidden states `[.., H]` instead of logits (when `remove`). The
    forward still goes through the model's (and any wrapper's) own `forward`, so hooks keep working."""
    if not remove:
        yield
        return
    base = base_model_of(model)
    head = base.lm_head
    base.lm_head = _Unprojected()
    try:
        yield
    finally:
        base.lm_head = head


def sequence_logits(model, prompt_ids, prompt_mask, comp_ids, comp_mask, *, autocast_dtype=None, hidden=False):
    """Logits predicting each completion token: `[B,T,V]` (only the completion positions are projected).
    hidden: the final hidden states `[B,T,H]` at those positions instead, for the caller to apply the LM head
    (`lm_head_of`, which must not be None) in chunks."""
    T = comp_ids.shape[1]
    ids = torch.cat([prompt_ids, comp_ids], 1)
    mask = torch.cat([prompt_mask, comp_mask.to(prompt_mask.dtype)], 1)
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    ctx = torch.autocast(ids.device.type, dtype=autocast_dtype) if autocast_dtype is not None else _nullctx()
    with ctx, _head_removed(model, hidden):
        out = model(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=False, logits_to_keep=T + 1)
    return out.logits[:, :-1]


def token_logp(logits: torch.Tensor, tokens: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """log p(token) from logits without materializing a [B,T,V] log-softmax: gather minus logsumexp."""
    logits = logits.float()
    if temperature != 1.0:  # x / 1 is x: no copy of the logits
        logits = logits / temperature
    return logits.gather(-1, tokens[..., None]).squeeze(-1) - torch.logsumexp(logits, -1)


def grouped_sequence_logits(
    model, prompt_ids, prompt_mask, comp_ids, comp_mask, *, group_size: int, autocast_dtype=None, hidden=False
):
    """`sequence_logits` for rows that come in groups of `group_size` sharing one prompt: each prompt is run
    once and its KV cache (with its graph) copied to the group, so the prompt's forward and backward are paid
    once per group instead of once per completion. Same values and gradients as `sequence_logits` (`hidden`
    too: the final hidden states instead of the logits).
    """
    G = group_size
    pu, pmu = prompt_ids[::G], prompt_mask[::G]
    pos = (pmu.cumsum(-1) - 1).clamp(min=0)
    ctx = torch.autocast(prompt_ids.device.type, dtype=autocast_dtype) if autocast_dtype is not None else _nullctx()
    with ctx, _head_removed(model, hidden):
        out = model(input_ids=pu, attention_mask=pmu, position_ids=pos, use_cache=True, logits_to_keep=1)
        cache = _cache_of(out)
        cache.batch_repeat_interleave(G)
        first = out.logits[:, -1:].repeat_interleave(G, 0)  # predicts each completion's first token
        mask = torch.cat([pmu.repeat_interleave(G, 0), comp_mask.to(pmu.dtype)], 1)
        cpos = pos[:, -1:].repeat_interleave(G, 0) + 1 + torch.arange(comp_ids.shape[1], device=comp_ids.device)
        rest = model(
            input_ids=comp_ids, attention_mask=mask, position_ids=cpos, use_cache=True, **{_cache_kwarg(model): cache}
        ).logits
    return torch.cat([first, rest[:, :-1]], 1)
