"""Per-step throughput: tokens per second of the rollout and of the update, model FLOP utilisation, peak memory.

MFU (model FLOPs utilisation, PaLM, Chowdhery et al. 2022, appendix B) is the FLOPs the model's products need
for the step's tokens over what the device could do in the step's time: it counts neither recomputation
(activation or LM-head checkpointing) nor the attention scores, so it is comparable across implementations.
A token costs 2N FLOPs forward and 6N forward and backward (Kaplan et al. 2020, sec. 2.1), N the parameters of
every product (all but the input embedding; a tied embedding is the LM head's product and counts once).
The device's peak is measured once per process and device by a short matmul probe in the compute dtype.
"""

from __future__ import annotations

import functools
import resource
import sys
import time
from dataclasses import dataclass

import torch


def product_params(model: torch.nn.Module) -> int:
    """N: the parameters of every product of a forward, i.e. all but an untied input embedding."""
    total = sum(p.numel() for p in model.parameters())
    get_in = getattr(model, "get_input_embeddings", None)
    get_out = getattr(model, "get_output_embeddings", None)
    emb = get_in() if get_in is not None else None
    head = get_out() if get_out is not None else None
    if emb is None or (head is not None and head.weight is emb.weight):
        return total  # tied: the embedding's weight is the head's product
    return total - emb.weight.numel()


@dataclass(frozen=True)
class StepTokens:
    """The tokens one step ran through the model, by kind of pass (whole batch, every rank)."""

    generated: int  # sampled completion tokens (a decode forward each)
    prefilled: int  # prompt tokens of the sampled groups (one forward each, once per group)
    updated: int  # real completion tokens the update trained on (forward and backward)
    update_prompt: int  # prompt tokens the update ran (once per group: grouped forwards share them)
    extra_forwards: int  # forward-only passes over the batch before the update: reference, old log-probs, values
    critic: bool = False  # PPO's critic trains too (a copy of the body: one more forward and backward)


def step_flops(n_params: int, t: StepTokens) -> float:
    """Model FLOPs of one step: 2N per token forward, 6N forward and backward (attention scores not counted)."""
    batch = t.updated + t.update_prompt
    rollout = 2.0 * n_params * (t.generated + t.prefilled)
    update = 6.0 * n_params * batch * (2 if t.critic else 1)
    return rollout + update + 2.0 * n_params * batch * t.extra_forwards


@functools.lru_cache(maxsize=None)
def peak_flops(device: str, dtype: torch.dtype) -> float:
    """FLOP/s of a square matmul in `dtype` on `device`, best of 5 after a warm-up: a measured peak (on CUDA at
    n = 8192, bf16 on an H200 ~ 700 TFLOP/s; on the CPU at n = 512, which a few threads reach)."""
    cuda = device.startswith("cuda")
    n = 8192 if cuda else 512
    a = torch.randn(n, n, device=device).to(dtype)
    b = torch.randn(n, n, device=device).to(dtype)
    best = float("inf")
    for i in range(6):
        if cuda:
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(10 if cuda else 1):
            a @ b
        if cuda:
            torch.cuda.synchronize()
        if i:  # the first is the warm-up
            best = min(best, (time.perf_counter() - t0) / (10 if cuda else 1))
    return 2.0 * n**3 / max(best, 1e-12)


def peak_memory_gib(device: str) -> float:
    """CUDA: the most memory torch allocated on the device since the last `reset_peak_memory`; elsewhere the
    process's peak resident set (the kernel keeps it for the process's life: it never goes down)."""
    if device.startswith("cuda"):
        return torch.cuda.max_memory_allocated(device) / 2**30
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux, bytes on macOS
    return rss / (2**30 if sys.platform == "darwin" else 2**20)


def reset_peak_memory(device: str) -> None:
    """Start a step's CUDA peak afresh (the CPU's resident peak cannot be reset)."""
    if device.startswith("cuda"):
        torch.cuda.reset_peak_memory_stats(device)


def perf_metrics(
    *, tokens: StepTokens, rollout_s: float, update_s: float, step_s: float, flops: float, peak: float, ranks: int
) -> dict:
    """The step's `perf/` and `memory/` row entries (docs/metrics.md). `peak`: one device's FLOP/s; `ranks`
    devices ran the step."""
    return {
        "perf/rollout_tokens_per_s": tokens.generated / max(rollout_s, 1e-9),
        "perf/update_tokens_per_s": tokens.updated / max(update_s, 1e-9) if tokens.updated else None,
        "perf/model_tflop": flops / 1e12,
        "perf/peak_tflop_per_s": peak / 1e12,
        "perf/mfu": flops / (max(step_s, 1e-9) * peak * ranks),
        "perf/rollout_share": rollout_s / max(step_s, 1e-9),
    }
