"""The speed layer's one door: everything CPU-speed-specific is reached through the two functions here
(re-exported by `rlcompare.fast`, the only import outside fast/).

- `decoder_for(model, capacity, ...)`: the rollout asks it for a decoder; None means the ordinary path
  (transformers' own forward and KV cache, `rollout.CacheDecoder`).
- `recorded_update_forward(model, recording, rows, ...)`: the trainer asks it for the update's logits rebuilt
  from the sampler's projections; None means the plain forward (autograd through the model).

Behind the door (nothing outside it imports these): `static_decode` (preallocated-cache decoding for the Llama
family, which keeps every projection output when asked), `rebuild` (the update's forward from those outputs),
`onednn` (fp32 products through oneDNN inside the decoder). Both functions refuse, and the caller falls back,
whenever the fast path would not be exact: an untested transformers release
(`static_decode.transformers_version_refusal`, the gate that `static_decode.supports` applies first), another
architecture, autocast, gradient checkpointing, LoRA or non-fp32 projections (`recorded_update.can_rebuild`).

What crosses the door is one opaque handle, `Recording`: the sampler's result carries it
(`Completions.recording`) and the trainer's batch carries it back; only this module looks inside.
The process-wide malloc setting (`malloc_tuning`) is not here: it belongs to the process, and the CLI's train entry
applies it (`rlcompare.train.run.apply_process_settings`, through `rlcompare.fast.keep_freed_memory`).
"""

from __future__ import annotations

from typing import Protocol

import torch

import weakref

from rlcompare.fast import graph_decode, recorded_update, rollout_weights, static_decode
from rlcompare.fast.graph_decode import SamplingPlan
from rlcompare.fast.unwrap import base_model_of

__all__ = ["FlopObserver", "Recording", "SamplingPlan", "decoder_for", "recorded_update_forward", "ENGINES"]


class FlopObserver(Protocol):
    """What the benchmark passes in to count the FLOPs the fast path computes (the ordinary path is seen by a
    forward pre-hook on the model's body; the fast path never calls the body)."""

    def record(self, batch: int, seq: int, ctx: int | None, grad: bool) -> None:
        """One forward of `batch` rows of `seq` new tokens over `ctx` positions in all (the decoder)."""

    def add(self, flops: float) -> None:
        """FLOPs computed outside any forward (the recorded update's backward products, attention, LM head)."""


class Recording:
    """The sampler's projection outputs for one rollout and, for each row of the batch that holds it, its row in
    that rollout. Opaque outside this module: select rows with `select`, pass it back to
    `recorded_update_forward` or to the next rollout (`decoder_for(record=...)`, which reuses its buffers)."""

    __slots__ = ("projections", "rows")

    def __init__(self, projections: static_decode.ProjectionRecord, rows: torch.Tensor):
        self.projections = projections
        self.rows = rows  # [b] long, CPU: the rollout row of each batch row

    def select(self, keep: torch.Tensor) -> "Recording":
        """The recording of the batch rows `keep` (a [b] bool mask or indices, CPU)."""
        return Recording(self.projections, self.rows[keep.cpu()])

    def placed(self, at: torch.Tensor, n_rows: int) -> "Recording":
        """This recording's rows at the positions `at` ([b] long, CPU) of a batch of `n_rows`: the others were
        sampled elsewhere (by another rank) and have none (-1, which `recorded_update_forward` declines)."""
        rows = torch.full((n_rows,), -1, dtype=torch.long)
        rows[at] = self.rows
        return Recording(self.projections, rows)


def decoder_for(
    model,
    capacity: int,
    *,
    kv_cache: str = "auto",
    record: bool | Recording | None = False,
    autocast_dtype=None,
    flop_observer: FlopObserver | None = None,
    engine: str = "eager",
    sync_every: int = 16,
    rows: int | None = None,
):
    """The preallocated-cache decoder (`static_decode.StaticDecoder`) for `model` with `capacity` positions, or
    None when it does not apply (`kv_cache="dynamic"`, or `static_decode.supports` refuses: the transformers
    version first, then the architecture): the rollout then decodes with transformers' cache.

    record: also keep every projection output for the first update (`decoder.recording` after the prefill) when
    the update rebuilt from them would be exact (`recorded_update.can_rebuild`); a `Recording` of an earlier rollout whose
    batch is done with lends its buffers when the shapes match. Call outside `torch.inference_mode()`.
    engine: "graphs" returns the graph engine (`graph_decode.GraphDecoder`, which runs the
    whole rollout: `runs_rollout`; it keeps no record) where `graph_refusal` allows, for `rows` rows checking for
    finished rows every `sync_every` tokens; "eager" or "auto" (for now) the step-by-step decoder.
    """
    if kv_cache != "auto" or static_decode.supports(model, capacity) is not None:
        return None
    if rows is not None and _wants_graphs(model, engine) and graph_refusal(model) is None:
        return _graph_engine(model, capacity, rows, autocast_dtype, sync_every, flop_observer)
    dec = static_decode.StaticDecoder(model, capacity, flop_observer=flop_observer)
    if (
        record
        and recorded_update.can_rebuild(
            model, capacity, autocast_dtype=autocast_dtype, gradient_checkpointing=_checkpointing(model)
        )
        is None
    ):
        old = record.projections if isinstance(record, Recording) else None

        def recording(n: int, P: int, repeats: int, device, dtype) -> Recording:
            projections = static_decode.ProjectionRecord.reuse(old, model, n, P, repeats, capacity - P, device, dtype)
            return Recording(projections, torch.arange(projections.n_rows))

        dec.plan_record(recording)  # allocated at the prefill, when the batch's shapes are known
    return dec


def recorded_update_forward(
    model,
    recording: Recording | None,
    rows: torch.Tensor,
    prompt_ids: torch.Tensor,
    prompt_mask: torch.Tensor,
    comp_ids: torch.Tensor,
    *,
    group_size: int,
    flop_observer: FlopObserver | None = None,
    hidden: bool = False,
) -> torch.Tensor | None:
    """The completion logits `[b, T, V]` (with `hidden`, the final hidden states `[b, T, H]`) of the batch rows `rows` (whole groups of `group_size`, in order), under
    autograd, rebuilt from the sampler's projections (`recorded_update.rebuilt_logits`): the same values and gradients as
    the plain forward while the weights are the ones that sampled (the first optimizer step on a batch: the
    caller decides that). None when there is no recording (the ordinary path sampled, or several rollouts were
    joined), a row was not recorded here (another rank sampled it: `Recording.placed`) or the transformers
    version is outside the tested range: the caller runs the plain forward."""
    if recording is None or static_decode.transformers_version_refusal() is not None:
        return None
    record_rows = recording.rows[rows.cpu()]
    if bool((record_rows < 0).any()):  # a row this process did not sample
        return None
    record_rows = record_rows.to(comp_ids.device)
    return recorded_update.rebuilt_logits(
        model,
        recording.projections,
        record_rows,
        prompt_ids,
        prompt_mask,
        comp_ids,
        group_size=group_size,
        flop_observer=flop_observer,
        hidden=hidden,
    )


def _checkpointing(model) -> bool:
    """Whether transformers' gradient checkpointing is on (it sets `gradient_checkpointing` on the modules it
    wraps, in every release this path is tested on)."""
    return any(getattr(m, "gradient_checkpointing", False) is True for m in base_model_of(model).modules())


ENGINES = ("auto", "eager", "graphs")  # the speed layer's rollout.engine values (config/sections/rollout.py's add vllm)
# the graph engines and rollout copies of each model (base model -> {key: engine or copy}), kept across rollouts:
# their captured graphs and buffers are what makes a step cheap
_KEPT: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def _wants_graphs(model, engine: str) -> bool:
    """engine "graphs" (opt-in for now)."""
    if engine not in ENGINES:
        raise ValueError(f"engine={engine!r} must be one of {', '.join(ENGINES)}")
    # "auto" stays eager until scripts/gpu_check.sh has run the graph engine on a GPU (no GPU was at hand when it
    # was written: docs/speed.md); then it becomes `engine == "auto" and the model is on CUDA`
    return engine == "graphs"


def graph_refusal(model) -> str | None:
    """None when the graph engine can decode `model` (after `static_decode.supports`), else why not: a rope whose
    frequencies depend on the length so far (no fixed table to capture), or a projection the rollout copy cannot
    merge (`rollout_weights.refusal`)."""
    rope_type = getattr(base_model_of(model).model.rotary_emb, "rope_type", "default")
    if rope_type in static_decode._LENGTH_DEPENDENT_ROPE:
        return f"rope type {rope_type} depends on the length decoded so far"
    return rollout_weights.refusal(model)


def _graph_engine(model, capacity: int, rows: int, autocast_dtype, sync_every: int, flop_observer):
    """The graph engine for rollouts of `rows` rows within `capacity` positions. On CUDA (graphs captured) it is
    kept per model (`kept_engine`); on the CPU (no graphs: the same steps run eagerly) it is built for each
    rollout, as the eager decoder is."""
    base = base_model_of(model)
    dtype = autocast_dtype or next(base.parameters()).dtype
    if next(base.parameters()).device.type != "cuda":
        weights = rollout_weights.RolloutWeights(model, dtype)
        return graph_decode.GraphDecoder(
            model, capacity, weights, capture=False, sync_every=sync_every, flop_observer=flop_observer
        )
    engine = kept_engine(model, capacity, rows, dtype, sync_every, capture=True)
    engine.flop_observer = flop_observer
    return engine


def kept_engine(model, capacity: int, rows: int, dtype, sync_every: int, *, capture: bool):
    """The engine kept for `model`'s rollouts of `rows` rows in `dtype`, with the model's one rollout copy of the
    weights and one KV cache store (`graph_decode.CacheStore`: the training and eval engines share its memory,
    sized to the larger, and one graph pool) per dtype; rebuilt only for a longer prompt (capacity rounded up to
    64 positions), the old engine's views and graphs released first."""
    kept = _KEPT.setdefault(base_model_of(model), {})
    if ("weights", dtype) not in kept:
        kept[("weights", dtype)] = rollout_weights.RolloutWeights(model, dtype)
    store = kept.setdefault(("cache", dtype), graph_decode.CacheStore())
    key = ("engine", rows, dtype)
    engine = kept.get(key)
    if engine is None or engine.capacity < capacity:  # none yet, or a longer prompt than its cache holds
        if engine is not None:
            engine.release()
        engine = kept[key] = graph_decode.GraphDecoder(
            model,
            -(-capacity // 64) * 64,
            kept[("weights", dtype)],
            capture=capture,
            sync_every=sync_every,
            store=store,
        )
    engine.sync_every = sync_every
    return engine
