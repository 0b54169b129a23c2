"""The rollout engines' own bench, torch and transformers only (scripts/gpu_check.sh part 1, issue #53).

    python -m rlcompare.bench.engine [--size qwen2.5-0.5b] [--rows 128] [--new 512] [--engines eager,graphs]
                                     [--small] [--profile] [--layers N] [--autocast A] [--json] [--save F]

A random-initialised Qwen2 of a `QWEN_SIZES` shape (from its config: nothing downloaded, no tokenizer), random
prompt ids, `rows` completions of exactly `new` tokens (the end id is the vocabulary size: no LM head row scores
it), sampled through `rollout.sample` with group streams as a training rollout samples, on CUDA with fp32 weights
under bf16 autocast. Per engine: tokens/s and ms per token step of a timed rollout (after one untimed rollout,
which for `graphs` on CUDA captures the graphs: its seconds are `first_s`), and the peak GPU memory. `--small` is a
CPU-test shape that runs in seconds. `--profile` counts with torch.profiler what one token step of the graph
engine's body runs uncaptured (the ops a captured graph holds): top-level aten ops and, on CUDA, kernels, from two
rollouts of different lengths (the difference divided by the extra steps: the prefill cancels).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from rlcompare import fast
from rlcompare.bench.against_trl import QWEN_SIZES, model_spec, qwen_config
from rlcompare.rollout import sample
from rlcompare.rollout.request import SamplingRequest
from rlcompare.rollout.streams import GroupStreams

GROUP = 8  # completions per prompt (the bench's group size)
PROMPT = 16  # prompt tokens (the arithmetic prompts are shorter)
SMALL = dict(size="qwen2.5-tiny", rows=8, new=16, vocab=512)


def build_model(size: str, device, *, layers: int | None = None, vocab: int | None = None):
    """A Qwen2 of `size`'s shape (`layers` / `vocab` overriding), random weights, on `device`, in eval mode."""
    from transformers import Qwen2ForCausalLM

    spec = model_spec(size)
    spec |= {k: v for k, v in (("num_layers", layers), ("vocab", vocab)) if v is not None}
    torch.manual_seed(0)
    with torch.device(device):
        model = Qwen2ForCausalLM(qwen_config(spec, pad_id=0))
    return model.eval(), spec


def rollout(model, prompts: torch.Tensor, new: int, engine: str, autocast_dtype, sync_every: int = 16):
    """One rollout of `GROUP` completions per prompt, `new` tokens each; its seconds (device synchronised)."""
    V = model.config.vocab_size
    streams = GroupStreams([(0, g) for g in range(len(prompts))], GROUP, prompts.device)
    mask = torch.ones_like(prompts)
    _sync(prompts.device)
    t0 = time.perf_counter()
    request = SamplingRequest.of(
        max_new_tokens=new, eos_id=V, pad_id=0, repeats=GROUP, autocast_dtype=autocast_dtype, engine=engine,
        sync_every=sync_every,
    )  # fmt: skip
    c = sample(model, prompts, mask, request, streams=streams)
    _sync(prompts.device)
    if c.ids.shape != (len(prompts) * GROUP, new):
        raise RuntimeError(f"engine {engine} decoded {tuple(c.ids.shape)}, not {(len(prompts) * GROUP, new)}")
    return time.perf_counter() - t0


def measure(model, prompts: torch.Tensor, new: int, engine: str, autocast_dtype) -> dict:
    """tokens/s, ms per token step, the first (capturing) rollout's seconds and the peak GPU memory of `engine`."""
    cuda = prompts.device.type == "cuda"
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    first = rollout(model, prompts, new, engine, autocast_dtype)
    seconds = rollout(model, prompts, new, engine, autocast_dtype)
    rows = len(prompts) * GROUP
    return {
        "tokens_per_s": rows * new / seconds,
        "ms_per_step": 1000 * seconds / new,
        "rollout_s": seconds,
        "first_s": first,
        "peak_gib": torch.cuda.max_memory_allocated() / 2**30 if cuda else None,
    }


def ops_per_step(model, prompts: torch.Tensor, autocast_dtype, short: int = 4, long: int = 12) -> dict:
    """What one token step of the graph engine's body runs (uncaptured): top-level aten ops, and CUDA kernels."""
    from torch.profiler import ProfilerActivity, profile

    cuda = prompts.device.type == "cuda"
    counts = []
    for new in (short, long):
        rollout(model, prompts, new, "graphs", autocast_dtype, sync_every=long)  # built and warmed before counting
        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
        with _uncaptured(model, prompts, new, autocast_dtype), profile(activities=activities) as prof:
            rollout(model, prompts, new, "graphs", autocast_dtype, sync_every=long)
        events = prof.events()
        aten = [e for e in events if e.name.startswith("aten::")]
        top = sum(1 for e in aten if e.cpu_parent is None)
        # the ops that call no other op: what does the work (autocast's casts show here, inside their op's call)
        leaf = sum(1 for e in aten if not any(c.name.startswith("aten::") for c in e.cpu_children))
        kernels = sum(1 for e in events if e.device_type == torch.autograd.DeviceType.CUDA) if cuda else None
        counts.append((top, leaf, kernels))
    steps = long - short
    (t0, l0, k0), (t1, l1, k1) = counts
    return {
        "aten_ops_per_step": (t1 - t0) / steps,
        "leaf_ops_per_step": (l1 - l0) / steps,
        "kernels_per_step": (k1 - k0) / steps if cuda else None,
    }


class _uncaptured:
    """The CUDA graph engine `fast.decoder_for` keeps for these rollouts runs its steps eagerly while inside: the
    profiler then sees each op the graphs replay (a replay is one launch to it). Nothing to do on the CPU."""

    def __init__(self, model, prompts: torch.Tensor, new: int, autocast_dtype):
        self.engine = None
        if prompts.device.type == "cuda":
            rows, capacity = len(prompts) * GROUP, prompts.shape[1] + new
            self.engine = fast.decoder_for(model, capacity, engine="graphs", rows=rows, autocast_dtype=autocast_dtype)

    def __enter__(self):
        if self.engine is not None:  # no warm-up either: the two counted rollouts then run the same kinds of work
            self.engine.capture = self.engine.warm_up = False
        return self

    def __exit__(self, *a):
        if self.engine is not None:
            self.engine.capture = self.engine.warm_up = True
        return False


def _sync(device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def run(args) -> dict:
    auto = "cuda" if torch.cuda.is_available() else "cpu"
    device = torch.device(auto if args.device == "auto" else args.device)
    size, rows, new, vocab = args.size, args.rows, args.new, None
    if args.small:
        size, rows, new, vocab = SMALL["size"], SMALL["rows"], SMALL["new"], SMALL["vocab"]
    if rows % GROUP:
        raise SystemExit(f"--rows {rows} must be a multiple of the group size {GROUP}")
    model, spec = build_model(size, device, layers=args.layers, vocab=vocab)
    cast = {"auto": "bf16" if device.type == "cuda" else "none"}.get(args.autocast, args.autocast)
    autocast_dtype = {"bf16": torch.bfloat16, "none": None}[cast]
    prompts = torch.randint(1, spec["vocab"], (rows // GROUP, PROMPT), generator=torch.Generator().manual_seed(0))
    prompts = prompts.to(device)
    out = {"device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu", "torch": torch.__version__,
           "size": size, "layers": spec["num_layers"], "vocab": spec["vocab"], "rows": rows, "new_tokens": new,
           "autocast": str(autocast_dtype)}  # fmt: skip
    for engine in args.engines.split(","):
        out[engine] = measure(model, prompts, new, engine, autocast_dtype)
    if "eager" in out and "graphs" in out:
        out["graphs_over_eager"] = out["graphs"]["tokens_per_s"] / out["eager"]["tokens_per_s"]
    if args.profile:
        out["profile"] = ops_per_step(model, prompts, autocast_dtype)
    return out


def report(out: dict) -> str:
    """The figures as lines for a log."""
    lines = [f"engine bench: {out['size']} ({out['layers']} layers, vocabulary {out['vocab']}), {out['rows']} rows "
             f"x {out['new_tokens']} new tokens on {out['device']}, autocast {out['autocast']}"]  # fmt: skip
    for engine in ("eager", "graphs"):
        if engine in out:
            r = out[engine]
            peak = f", peak {r['peak_gib']:.2f} GiB" if r["peak_gib"] is not None else ""
            lines.append(f"  {engine}: {r['tokens_per_s']:,.0f} tokens/s, {r['ms_per_step']:.2f} ms/step "
                         f"(first rollout {r['first_s']:.1f} s){peak}")  # fmt: skip
    if "graphs_over_eager" in out:
        lines.append(f"  graphs / eager: {out['graphs_over_eager']:.2f}x")
    if "profile" in out:
        p = out["profile"]
        kernels = f", {p['kernels_per_step']:.0f} CUDA kernels" if p["kernels_per_step"] is not None else ""
        lines.append(f"  one token step of the graph body: {p['aten_ops_per_step']:.0f} top-level aten ops, "
                     f"{p['leaf_ops_per_step']:.0f} leaf ops{kernels}")  # fmt: skip
    return "\n".join(lines)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(prog="python -m rlcompare.bench.engine", description=__doc__.split("\n\n")[0])
    ap.add_argument("--size", default="qwen2.5-0.5b", choices=sorted(QWEN_SIZES))
    ap.add_argument("--rows", type=int, default=128)
    ap.add_argument("--new", type=int, default=512, help="new tokens per completion")
    ap.add_argument("--engines", default="eager,graphs")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--layers", type=int, default=None, help="override the shape's layer count")
    ap.add_argument("--autocast", default="auto", choices=["auto", "bf16", "none"], help="auto: bf16 on CUDA only")
    ap.add_argument("--small", action="store_true", help="a CPU-test shape (seconds)")
    ap.add_argument("--profile", action="store_true", help="ops per token step (torch.profiler)")
    ap.add_argument("--json", action="store_true", help="one JSON line instead of the report")
    ap.add_argument("--save", default=None, help="also write the JSON to this file")
    args = ap.parse_args(argv)
    with torch.inference_mode(False):
        out = run(args)
    if args.save:
        Path(args.save).write_text(json.dumps(out) + "\n")
    print(json.dumps(out) if args.json else report(out), flush=True)


if __name__ == "__main__":
    main()
