"""`rollout.*`: how completions are sampled (temperature, nucleus, the decode engine and its cache, random streams,
stale rollouts), with the accepted values, ranges and checks. What `rollout.engine=vllm` cannot honour reads the env,
model and trainer sections too: rlcompare/config/schema.py.
"""

from __future__ import annotations

from dataclasses import dataclass

from omegaconf import DictConfig

from rlcompare.config.checks import ConfigError, Range, at_least

KV_CACHES = ("auto", "dynamic")
# rlcompare.fast.ENGINES (tests/fast/test_graph_decode.py), and vllm: rlcompare.rollout.vllm_engine
ROLLOUT_ENGINES = ("auto", "eager", "graphs", "vllm")
STREAMS = ("batch", "group")
MAX_STALENESS = 256  # the largest staleness M2PO (arXiv 2510.01161) trains at; the first step samples k + 1 rollouts


@dataclass
class RolloutConfig:
    temperature: float = 1.0  # sampling temperature (>= 1e-6)
    top_p: float = 1.0  # nucleus sampling: keep the smallest token set with this probability; 1: off
    kv_cache: str = (
        "auto"  # auto: preallocated cache for Llama/Qwen2/Qwen3/Mistral (same tokens) | dynamic: transformers' cache
    )
    streams: str = "batch"  # batch: one random stream per batch | group: one per prompt group (torchrun needs it)
    staleness: int = (
        0  # train step t on the rollout sampled by step t-k's weights (first k: initial ones); 0: on-policy
    )
    engine: str = "auto"  # auto: eager until the graph engine has run on a GPU | eager: step by step | graphs: CUDA-graph decode | vllm: a colocated vLLM engine ([vllm] extra; docs/vllm.md)
    sync_every: int = 16  # graphs engine: tokens between checks for finished rows (the only host syncs)


RANGES: dict[str, Range] = {  # keys narrower than NON_NEGATIVE (schema.py's RANGES holds every section's)
    "rollout.temperature": Range(1e-6),  # float32 logits / 1e-320 are inf (the scalar rounds to 0): nan log-probs
    "rollout.top_p": Range(0, 1, low_open=True),
}


def check(r: DictConfig) -> None:
    """The sampler's settings."""
    if r.temperature <= 0:
        raise ConfigError(f"rollout.temperature={r.temperature} must be > 0 (sampling needs a positive temperature)")
    if not 0 < r.top_p <= 1:
        raise ConfigError(f"rollout.top_p={r.top_p} must be in (0, 1]")
    at_least("rollout.staleness", r.staleness, 0, "0 trains on-policy; k trains on rollouts k updates old")
    # the first step samples k + 1 rollouts: 10**6 sampled for hours, and SIGTERM waits for that step to end
    if r.staleness > MAX_STALENESS:
        raise ConfigError(
            f"rollout.staleness={r.staleness} must be <= {MAX_STALENESS} (the first step samples k + 1 "
            f"rollouts ahead and keeps them in memory and in every checkpoint); lower it"
        )
    if r.streams not in STREAMS:
        raise ConfigError(
            f"rollout.streams={r.streams!r} must be batch (one random stream for the batch) or "
            f"group (one per prompt group, as data-parallel runs need)"
        )
    if r.engine not in ROLLOUT_ENGINES:
        raise ConfigError(
            f"rollout.engine={r.engine!r} must be auto (graphs on CUDA, eager on the CPU), eager (one decode "
            f"step at a time), graphs (CUDA-graph decode steps; docs/speed.md) or vllm (colocated vLLM; docs/vllm.md)"
        )
    at_least("rollout.sync_every", r.sync_every, 1)
    if r.kv_cache not in KV_CACHES:
        raise ConfigError(
            f"rollout.kv_cache={r.kv_cache!r} must be auto (a preallocated cache where the "
            f"architecture allows) or dynamic (transformers' cache)"
        )
