"""The graph engine: a whole rollout decoded in fixed-shape steps, each captured once in a CUDA graph and replayed.

Why: on a GPU an eager decode step is host work and kernel launches (one step of 128 rows of a 0.4B model took
~39 ms where its memory traffic takes ~0.2 ms: ../shared/docs/gpu.md), and the eager loop reads the live-row
count back every token. Here (the pattern of nano-vllm's `ModelRunner.capture_cudagraph`):

* the KV cache, the step's inputs and the sampler's outputs live in buffers allocated once per engine
  (`_State`); a step reads and writes only them, so it has fixed shapes and addresses;
* one graph per batch bucket (`bucket_sizes`: powers of two below the rollout's rows, and the rows), key width
  (`key_width`: the positions written so far rounded up to `KEY_BLOCK`, so a step reads about the keys it needs,
  not the whole capacity under a -inf mask) and sampling setting, captured when a step first needs it (`_graph`)
  and replayed at every later use; before each capture three eager warm-up runs, each undone (state, outputs,
  mask and cache column restored: the rollout goes on as if none had run), with SDPA pinned to the kernels that
  take a mask;
* the token is chosen on the device by the sampler's own `pick` (the same Gumbel-max draws from the same uniforms,
  which are drawn outside the graph, group streams included) and written into the output with the step index
  held on the device; finished rows keep decoding pad tokens and write to a trash row;
* every `sync_every` tokens the host reads which rows are still live (the only synchronisation), stops when none
  is, and moves the live rows into the next smaller bucket;
* the prefill is the preallocated-cache decoder's (`StaticDecoder.prefill`: SDPA over each prompt, copied per
  group), into the KV cache of a store shared by the model's engines (`CacheStore`: the training and the eval
  engine never decode at once, so one cache of the largest size serves both, and their graphs share one memory
  pool); the products run on the rollout copy of the weights (`rollout_weights.py`).

Without capture (the CPU, or `capture=False`) the same steps run eagerly, attention over the positions written so
far (`full_width=False`, the eager decoder's own slices) or over `key_width` keys under the mask (what the graphs
run): tests/fast/test_graph_decode.py checks both against the eager decoder on the CPU (and the lazy capture's
bookkeeping with a graph stood in for by the eager step), and
tests/fast/test_cuda_engine.py the graphs against the eager steps on a GPU.
"""

from __future__ import annotations

import contextlib
import math
import weakref
from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F

from rlcompare.fast.rollout_weights import RolloutWeights
from rlcompare.fast.static_decode import (
    StaticDecoder,
    _per_module,
    additive_mask,
    gated_mlp,
    layer_output,
    rms_norm,
    rope,
)


def bucket_sizes(rows: int) -> list[int]:
    """The batch sizes a rollout of `rows` rows decodes at: the powers of two below `rows`, and `rows`."""
    sizes, b = [], 1
    while b < rows:
        sizes.append(b)
        b *= 2
    return sizes + [rows]


def bucket_for(n: int, sizes: list[int]) -> int:
    """The smallest bucket holding `n` rows."""
    return next(b for b in sizes if b >= n)


KEY_BLOCK = 128  # the key widths a captured step attends over: multiples of this, up to the capacity


def key_width(n: int, capacity: int, block: int = KEY_BLOCK) -> int:
    """The keys a step attends over once `n` positions are written: `n` rounded up to a multiple of `block`, at
    most `capacity` (the positions past `n` are masked)."""
    return min(capacity, -(-n // block) * block)


class CacheStore:
    """The KV cache memory of one model's graph engines (training and eval rows), shared: each engine's cache is a
    view of the front of one flat buffer per layer and keys / values, sized to the largest engine's need. When an
    engine needs more, every engine's views and graphs are dropped first (`GraphDecoder.release`) and the buffers
    freed, then allocated at the new size: the old and the new cache never exist at once. `pool`: the one memory
    pool of the engines' graphs (each graph's outputs are state buffers allocated outside it, so what a graph
    leaves in the pool is scratch, reused by the next: graphs run one at a time, on one stream)."""

    def __init__(self):
        self.flat: dict[tuple[int, bool], torch.Tensor] = {}
        self.engines: "weakref.WeakSet" = weakref.WeakSet()
        self._pool = None

    def view(self, engine, layer: int, keys: bool, shape: tuple, dtype, device) -> torch.Tensor:
        """`engine`'s cache of `layer`'s keys (else values) of `shape`, zeroed where never written (a step reads
        positions not written yet under a -inf mask, and a weight of 0 times an uninitialised NaN is NaN)."""
        self.engines.add(engine)
        numel = math.prod(shape)
        buf = self.flat.get((layer, keys))
        if buf is not None and (buf.numel() < numel or buf.dtype != dtype or buf.device != torch.device(device)):
            self.release()
            buf = None
        if buf is None:
            buf = self.flat[(layer, keys)] = torch.zeros(numel, dtype=dtype, device=device)
        return buf[:numel].view(shape)

    def release(self) -> None:
        """Every engine's views and graphs dropped, then the buffers: nothing refers to the old cache."""
        for engine in list(self.engines):
            engine.release()
        self.flat.clear()

    def numel(self) -> int:
        """The elements the store holds (all layers, keys and values)."""
        return sum(buf.numel() for buf in self.flat.values())

    def pool(self):
        """The engines' one graph memory pool (`torch.cuda.graph_pool_handle`)."""
        if self._pool is None:
            self._pool = torch.cuda.graph_pool_handle()
        return self._pool


@dataclass(frozen=True)
class SamplingPlan:
    """What the sampler decides per token, handed to the engine.

    pick(logits [b, V] float32, u [b, V] | None) -> (tokens [b], log-probs [b] | None): the sampler's choice
    (temperature, top-p, Gumbel-max or argmax), run inside the graph; uniforms(out [rows, V]): the next position's
    U[0, 1) draws for every row of the rollout written into the engine's buffer `out` in place (None when greedy),
    drawn outside the graph; key: what `pick` computes (graphs are captured per key)."""

    pick: Callable
    uniforms: Callable | None
    eos: torch.Tensor  # [E] long: the end-of-sequence ids
    pad_id: int
    max_new_tokens: int
    logprobs: bool  # keep each chosen token's log-prob
    key: tuple


class _State:
    """The buffers a step reads and writes, allocated once per engine (their addresses are what a graph replays)."""

    def __init__(self, rows: int, vocab: int, max_new_tokens: int, device):
        long = dict(dtype=torch.long, device=device)
        self.tok = torch.zeros(rows, **long)  # the token each cache row feeds next
        self.pos = torch.zeros(rows, **long)  # its rope position
        self.rows = torch.zeros(rows, **long)  # the rollout row each cache row holds
        self.live = torch.zeros(rows, dtype=torch.bool, device=device)
        self.slot = torch.zeros(1, **long)  # the cache position the next step writes
        self.t = torch.zeros(1, **long)  # the completion position the next choice is written at
        self.trash = torch.tensor(rows, **long)  # the output row finished rows write to
        self.ids = torch.zeros((rows + 1, max_new_tokens), **long)
        self.logp = torch.zeros((rows + 1, max_new_tokens), dtype=torch.float32, device=device)
        self.u = torch.full((rows, vocab), 0.5, dtype=torch.float32, device=device)

    def reset(self, last_pos: torch.Tensor, P: int, pad_id: int) -> None:
        """A new rollout: every row live in its own place, fed from the prompt's last position."""
        self.pos.copy_(last_pos)
        self.rows.copy_(torch.arange(len(self.rows), device=self.rows.device))
        self.live.fill_(True)
        self.slot.fill_(P - 1)
        self.t.fill_(0)
        self.ids.fill_(pad_id)
        self.logp.zero_()


class GraphDecoder(StaticDecoder):
    """`generate` decodes a whole rollout (the sampler hands it the loop: `runs_rollout`). Reusable across rollouts
    of the same rows and new tokens, with any prompt that fits `capacity` (graphs and buffers are kept)."""

    runs_rollout = True

    def __init__(
        self,
        model,
        capacity: int,
        weights: RolloutWeights,
        *,
        capture: bool,
        sync_every: int,
        full_width: bool = False,
        warm_up: bool | None = None,
        flop_observer=None,
        store: CacheStore | None = None,
        key_block: int = KEY_BLOCK,
    ):
        super().__init__(model, capacity, flop_observer=flop_observer)
        self.weights = weights
        self.layers = [(layer, projections) for (layer, _), projections in zip(self.layers, weights.projections)]
        self.capture, self.sync_every = capture, sync_every
        # the warm-up runs before each capture; `warm_up=True` without capture runs it alone (the CPU tests)
        self.warm_up = capture if warm_up is None else warm_up
        self.warmed: set[tuple] = set()  # (bucket, key width, plan key) warmed up without capture
        self.full_width = full_width or capture  # a graph attends over fixed key widths (`key_width`)
        self.key_block = key_block
        self.store = store if store is not None else CacheStore()
        self.can_select = False  # compaction is the engine's own (`_compact`)
        self.state: _State | None = None
        self.cache: dict[tuple[int, bool], torch.Tensor] = {}  # (layer, keys) -> [rows, kvh, capacity, hd]
        self.mask: torch.Tensor | None = None  # [rows, 1, 1, capacity] additive: 0 on real keys
        # rope of every cache position, built at the first step and kept (the prefill drops `rope_table`)
        self.rope_rows: tuple[torch.Tensor, torch.Tensor] | None = None
        self.graphs: dict[tuple, torch.cuda.CUDAGraph] = {}  # (bucket, key width, plan key) -> graph
        self.eos: dict[tuple, torch.Tensor] = {}  # each plan's end ids, in a tensor of its own (its graphs read it)

    def _cache_buffer(self, layer: int, keys: bool, shape: tuple, like: torch.Tensor) -> torch.Tensor:
        """The engine's view of the model's shared cache (`CacheStore.view`); a view at another address or of
        another shape than the last one drops the graphs (they read the old one)."""
        buf = self.store.view(self, layer, keys, shape, like.dtype, like.device)
        old = self.cache.get((layer, keys))
        if old is None or old.data_ptr() != buf.data_ptr() or old.shape != buf.shape or old.dtype != buf.dtype:
            self.graphs.clear()
        self.cache[(layer, keys)] = buf
        return buf

    def release(self) -> None:
        """Drop every reference to the cache (views, the prefill's lists) and the graphs that read it."""
        self.graphs.clear()
        self.warmed.clear()
        self.cache.clear()
        self.keys.clear()  # in place: a prefill that grew the store is filling these lists
        self.values.clear()

    def generate(self, ids, mask, pos, repeats: int, plan: SamplingPlan, autocast_dtype=None):
        """Left-padded prompts `[n, P]` (positions `pos`) -> (ids `[n*repeats, steps]`, log-probs or None), `steps`
        the last position any row decoded (its EOS, or `max_new_tokens`), pad after each row's EOS."""
        self.weights.refresh()
        # under autocast every norm's output is cast to the copy's dtype by the product it feeds: written so at once
        self.norm_dtype = self.weights.dtype if autocast_dtype == self.weights.dtype else None
        ctx = _autocast(ids.device, autocast_dtype)
        with ctx:
            logits = self.prefill(ids, mask, pos, repeats).float()
        B, V, P = logits.shape[0], logits.shape[1], ids.shape[1]
        last_pos = pos[:, -1].repeat_interleave(repeats, 0)
        if self.state is None or self.state.ids.shape != (B + 1, plan.max_new_tokens) or len(self.state.u[0]) != V:
            self.state, self.mask = _State(B, V, plan.max_new_tokens, ids.device), None
            self.graphs.clear()
        s = self.state
        s.reset(last_pos, P, plan.pad_id)
        self.eos.setdefault(plan.key, plan.eos.clone())
        if self.mask is not None:
            self.mask.copy_(additive_mask(self.key_mask, self.mask.dtype)[:, None, None, :])
        if plan.uniforms is not None:
            plan.uniforms(s.u)
        self._choose(logits, B, plan)  # the first token, from the prefill's logits
        b = B
        for t in range(1, plan.max_new_tokens):
            if t % self.sync_every == 0:  # the only read-back: which rows are still decoding
                live = s.live[:b].cpu()
                n_live = int(live.sum())
                if n_live == 0:
                    break
                nb = bucket_for(n_live, bucket_sizes(B))
                if nb < b:
                    self._compact(live, nb)
                    b = nb
            if plan.uniforms is not None:
                plan.uniforms(s.u)
            if self.flop_observer is not None:
                self.flop_observer.record(b, 1, P + t, False)
            self._step(b, P + t, plan, autocast_dtype)
        return self._output(B, plan)

    def _step(self, b: int, n: int, plan: SamplingPlan, autocast_dtype) -> None:
        """One token for the first `b` cache rows, `n` positions written once its key is: the graph of its bucket
        and key width replayed (captured at its first use), or the same step run eagerly over the same key width
        (over exactly `n` keys without `full_width`), after the warm-up a capture would have run (`warm_up`)."""
        width = key_width(n, self.capacity, self.key_block) if self.full_width else n
        if self.capture:
            self._graph(b, width, plan, autocast_dtype).replay()
            return
        if self.warm_up and (b, width, plan.key) not in self.warmed:
            self._warm_up(b, width, plan, autocast_dtype)
            self.warmed.add((b, width, plan.key))
        device = self.state.ids.device
        with _autocast(device, autocast_dtype), _pinned_attention(device):
            self._body(b, plan, width)

    def _body(self, b: int, plan: SamplingPlan, n_keys: int) -> None:
        """One token for the first `b` cache rows: the model's step, then the choice (what a graph holds)."""
        self._choose(self._fixed_step(b, n_keys), b, plan)

    def _fixed_step(self, b: int, n_keys: int) -> torch.Tensor:
        """`StaticDecoder._step_forward` over the state's buffers: the token `tok` of the first `b` rows at rope
        position `pos`, written at cache position `slot` (device tensors); attention over the first `n_keys`
        positions under the mask. Returns logits `[b, V]`."""
        s, nh, kvh, hd = self.state, self.nh, self.kvh, self.hd
        x = self.body.embed_tokens(s.tok[:b, None])
        if self.rope_rows is None:  # [capacity, 1, 1, hd], as the eager decoder's `rope_table`
            at = torch.arange(self.capacity, device=x.device)[None]
            self.rope_rows = tuple(t[0, 0, :, None, None] for t in rope(self.body, x, at))
        cos, sin = (t.index_select(0, s.pos[:b]) for t in self.rope_rows)
        for li, (layer, projections) in enumerate(self.layers):
            per_module = _per_module(projections, self._recorded(li, projections, 1))
            q, k, v = self._attention_inputs(li, layer, projections, per_module, x, cos, sin, 1)
            if self.mask is None or self.mask.dtype != q.dtype:  # first step: built here, where q's dtype shows
                self.mask = additive_mask(self.key_mask, q.dtype)[:, None, None, :]
            if li == 0:
                self.mask[:b].index_fill_(-1, s.slot, 0.0)  # the new position is a real key
            K, V = self.cache[(li, True)][:b], self.cache[(li, False)][:b]
            K.index_copy_(2, s.slot, k.to(K.dtype))
            V.index_copy_(2, s.slot, v.to(V.dtype))
            K, V, mask = K[:, :, :n_keys], V[:, :, :n_keys], self.mask[:b, ..., :n_keys]
            a = F.scaled_dot_product_attention(
                q.reshape(b, kvh, nh // kvh, hd),
                K.to(q.dtype),
                V.to(q.dtype),
                attn_mask=mask,
                scale=layer.self_attn.scaling,
            )
            mlp = lambda h: gated_mlp(h, per_module)  # noqa: E731
            x = layer_output(layer, x, a.reshape(b, 1, nh * hd), per_module, mlp, self.norm_dtype)
        h = rms_norm(self.body.norm, x[:, -1], self.norm_dtype)
        return F.linear(h, self.weights.lm_head, self.weights.lm_head_bias)

    def _choose(self, logits: torch.Tensor, b: int, plan: SamplingPlan) -> None:
        """The next token of the first `b` rows from their logits (`plan.pick`, uniforms of each row's rollout row),
        written at completion position `t` of the live rows (finished rows feed pad and write to the trash row);
        then every position moves on by one."""
        s = self.state
        u = s.u.index_select(0, s.rows[:b]) if plan.uniforms is not None else None
        tok, lp = plan.pick(logits.float(), u)
        live = s.live[:b]
        tok = torch.where(live, tok, plan.pad_id)
        at = (torch.where(live, s.rows[:b], s.trash), s.t.expand(b))
        s.ids.index_put_(at, tok)
        if lp is not None:
            s.logp.index_put_(at, lp)
        s.live[:b] = live & ~torch.isin(tok, self.eos[plan.key])
        s.tok[:b] = tok
        s.pos[:b] += 1
        s.slot += 1
        s.t += 1

    def _compact(self, live: torch.Tensor, nb: int) -> None:
        """Move the live cache rows (`live`: [b] bool, host) first, in order, padded with finished ones to `nb`."""
        keep = torch.cat([live.nonzero(), (~live).nonzero()]).squeeze(-1)[:nb].to(self.state.rows.device)
        b = len(live)
        s = self.state
        for buf in [*self.cache.values(), self.key_mask, self.mask, s.tok, s.pos, s.rows, s.live]:
            if buf is not None:  # the mask: built at the first step
                buf[:nb] = buf[:b].index_select(0, keep)

    def _graph(self, b: int, width: int, plan: SamplingPlan, autocast_dtype):
        """The graph of the step of `b` rows over `width` keys for `plan`, captured at its first use after
        `WARM_UP_RUNS` undone eager runs (mid-rollout too: the rollout goes on as if they had not run)."""
        key = (b, width, plan.key)
        graph = self.graphs.get(key)
        if graph is None:
            self._warm_up(b, width, plan, autocast_dtype)
            graph = self.graphs[key] = self._capture(b, width, plan, autocast_dtype)
        return graph

    def _warm_up(self, b: int, width: int, plan: SamplingPlan, autocast_dtype) -> None:
        """`WARM_UP_RUNS` eager runs of the step (PyTorch's advice; the first of a rollout also builds the mask and
        the rope table), each undone (`_undone`), attention's kernels pinned (`_pinned_attention`); on CUDA on a
        side stream, as capture wants."""
        device = self.state.ids.device
        side = torch.cuda.Stream() if device.type == "cuda" else None
        if side is not None:
            side.wait_stream(torch.cuda.current_stream())
        with _on_stream(side), _pinned_attention(device), _autocast(device, autocast_dtype):
            for _ in range(WARM_UP_RUNS):
                with self._undone():
                    self._body(b, plan, width)
        if side is not None:
            torch.cuda.current_stream().wait_stream(side)

    def _capture(self, b: int, width: int, plan: SamplingPlan, autocast_dtype):
        """The step captured in a CUDA graph, in the model's one graph pool (`CacheStore.pool`). Capture records
        the kernels without running them: the state is left as it was."""
        device = self.state.ids.device
        graph = torch.cuda.CUDAGraph()
        with (
            torch.cuda.graph(graph, pool=self.store.pool()),
            _pinned_attention(device),
            _autocast(device, autocast_dtype),
        ):
            self._body(b, plan, width)
        torch.cuda.synchronize()
        return graph

    @contextlib.contextmanager
    def _undone(self):
        """Whatever one step writes, restored after it: the step inputs, live rows, positions `slot` and `t`, the
        outputs `ids` / `logp`, the mask and the cache column at `slot` (a warm-up leaves the rollout as it was, so
        a rollout of fewer new tokens than buckets never writes past its last column)."""
        s = self.state
        kept = [(buf, buf.clone()) for buf in (s.tok, s.pos, s.rows, s.live, s.slot, s.t, s.ids, s.logp)]
        had_mask = self.mask is not None
        column = [(buf, buf.index_select(2, s.slot)) for buf in self.cache.values()]
        mask_column = self.mask.index_select(-1, s.slot) if had_mask else None
        slot = s.slot.clone()
        yield
        for buf, old in column:
            buf.index_copy_(2, slot, old)
        if had_mask:
            self.mask.index_copy_(-1, slot, mask_column)
        else:  # built by the step: as a rollout's start sets it (`generate`)
            self.mask.copy_(additive_mask(self.key_mask, self.mask.dtype)[:, None, None, :])
        for buf, old in kept:
            buf.copy_(old)

    def _output(self, B: int, plan: SamplingPlan):
        """The decoded ids and log-probs up to the last position any row decoded (what the eager loop returns)."""
        s = self.state
        ids = s.ids[:B]
        is_eos = torch.isin(ids, plan.eos)
        ended = is_eos.any(1)
        steps = int(is_eos.int().argmax(1).max()) + 1 if bool(ended.all()) else plan.max_new_tokens
        logp = s.logp[:B, :steps].clone() if plan.logprobs else None
        return ids[:, :steps].clone(), logp


WARM_UP_RUNS = 3  # eager runs of a step before its capture (PyTorch's CUDA-graph notes use three)


def _on_stream(stream):
    """`torch.cuda.stream(stream)`, or nothing when `stream` is None."""
    return torch.cuda.stream(stream) if stream is not None else contextlib.nullcontext()


def _pinned_attention(device):
    """On CUDA, SDPA restricted to the memory-efficient and math kernels (the ones that take an additive mask),
    so that warm-up and capture choose the same kernel; nothing elsewhere (the CPU's choice is left as the eager
    decoder's, the same numbers)."""
    if device.type != "cuda":
        return contextlib.nullcontext()
    from torch.nn.attention import SDPBackend, sdpa_kernel

    return sdpa_kernel([SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH])


def _autocast(device, dtype):
    """Autocast to `dtype` (without its weight-cast cache, which graph capture does not allow), or nothing."""
    if dtype is None:
        return _NoAutocast()
    return torch.autocast(device.type, dtype=dtype, cache_enabled=False)


class _NoAutocast:
    def __enter__(self):
        return self

    def __exit__(self, *a):
        return False
