"""`trainer.*`: how the policy is updated (prompts and completions per step, the optimizer, mini- and micro-batches),
when it evaluates, checkpoints and logs samples, and how it runs (threads, data parallelism, run health), with the
accepted values, ranges and checks.

Whether the advantage estimator gets the groups it compares (trainer.group_size) reads the algorithm:
rlcompare/config/schema.py.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

from omegaconf import DictConfig

from rlcompare.config.checks import AT_LEAST_ONE, MAX_LR, POSITIVE, ConfigError, Range, at_least, one_of

PARALLEL_MODES = ("auto", "none", "ddp", "fsdp")
UNHEALTHY = ("fail", "warn")  # trainer.unhealthy (docs/metrics.md, "Run health")
GRAD_SUMS = ("auto", "shared_memory", "backend")


@dataclass
class TrainerConfig:
    prompts_per_step: int = 16  # prompts sampled per step
    group_size: int = 8  # completions sampled per prompt
    lr: float = 3e-5  # policy learning rate (AdamW)
    weight_decay: float = 0.0  # AdamW weight decay
    betas: Any = field(default_factory=lambda: [0.9, 0.99])  # AdamW betas
    warmup_steps: int = 0  # linear learning-rate warmup steps; 0: none
    max_grad_norm: Optional[float] = 1.0  # gradient-norm clip; null: off
    updates_per_rollout: int = (
        2  # optimizer steps per rollout batch (mini-batches); > 1 makes ratio and clipping matter
    )
    micro_batch_size: Optional[int] = (
        None  # sequences per forward inside a mini-batch (gradient accumulation); null: whole mini-batch
    )
    eval_every: int = 5  # steps between evaluations
    eval_batch_size: int = 256  # prompts per evaluation forward
    n_samples_logged: int = 4  # sample completions written per step to samples.jsonl
    sample_max_chars: int = 400  # characters kept of each logged sample
    recompute_old_logp: bool = (
        False  # false: reuse the sampler's log-probs (same weights) as old_logp; true: recompute them
    )
    skip_zero_advantage: bool = False  # true: no forward/backward for groups whose advantages are all 0 (when exact)
    update_from_rollout: bool = (
        True  # the first update on a batch reuses the sampler's projections (rlcompare.fast.recorded_update)
    )
    checkpoint_every: Optional[int] = None  # steps between checkpoints (and the last step); null: at each eval; 0: off
    keep_checkpoints: int = 2  # newest checkpoints kept on disk
    export_final: bool = False  # at the end of the run, write the policy as a Hugging Face folder in <run dir>/export
    max_bad_steps: int = 5  # non-finite steps (skipped) in a row before the run fails
    unhealthy: str = "fail"  # a run that broke a run-health invariant at every step: fail (exit 1) | warn (completed)
    threads: Optional[int] = None  # CPU threads for torch; null: torch's default
    keep_freed_memory: bool = True  # CPU: malloc keeps freed memory for reuse (rlcompare.fast.malloc_tuning)
    progress: bool = True  # print a progress line
    inject_nan_at_step: Optional[int] = None  # testing hook: makes that step's loss NaN; null: off
    parallel: str = "auto"  # data parallelism: auto (ddp under torchrun, else none) | none | ddp | fsdp
    grad_sum: str = (
        "auto"  # how ranks sum gradients: auto (shared memory for CPU ranks on one machine) | shared_memory | backend
    )


RANGES: dict[str, Range] = {  # keys narrower than NON_NEGATIVE (schema.py's RANGES holds every section's)
    "trainer.prompts_per_step": AT_LEAST_ONE,
    "trainer.group_size": AT_LEAST_ONE,
    "trainer.lr": Range(0, MAX_LR, low_open=True),
    "trainer.max_grad_norm": POSITIVE,
    "trainer.updates_per_rollout": AT_LEAST_ONE,
    "trainer.micro_batch_size": AT_LEAST_ONE,
    "trainer.eval_every": AT_LEAST_ONE,
    "trainer.eval_batch_size": AT_LEAST_ONE,
    "trainer.sample_max_chars": AT_LEAST_ONE,
    "trainer.keep_checkpoints": AT_LEAST_ONE,
    "trainer.max_bad_steps": AT_LEAST_ONE,
    "trainer.threads": AT_LEAST_ONE,
    "trainer.inject_nan_at_step": AT_LEAST_ONE,
}


def check(t: DictConfig) -> None:
    """The trainer's settings."""
    at_least("trainer.prompts_per_step", t.prompts_per_step, 1)
    at_least("trainer.group_size", t.group_size, 1)
    at_least("trainer.updates_per_rollout", t.updates_per_rollout, 1)
    n_seqs = t.prompts_per_step * t.group_size
    if t.updates_per_rollout > n_seqs:
        raise ConfigError(
            f"trainer.updates_per_rollout={t.updates_per_rollout} exceeds the rollout batch of {n_seqs} completions; each update needs at least one"
        )
    if t.lr <= 0:
        raise ConfigError(f"trainer.lr={t.lr} must be > 0")
    if t.micro_batch_size is not None:
        at_least("trainer.micro_batch_size", t.micro_batch_size, 1)
    at_least("trainer.eval_every", t.eval_every, 1)
    at_least("trainer.max_bad_steps", t.max_bad_steps, 1)
    at_least("trainer.keep_checkpoints", t.keep_checkpoints, 1)
    if t.checkpoint_every is not None:
        at_least("trainer.checkpoint_every", t.checkpoint_every, 0, "0 turns checkpoints off, null saves at each eval")
    at_least("trainer.eval_batch_size", t.eval_batch_size, 1)
    at_least("trainer.n_samples_logged", t.n_samples_logged, 0, "0 logs no sample completions")
    at_least("trainer.sample_max_chars", t.sample_max_chars, 1)
    at_least("trainer.warmup_steps", t.warmup_steps, 0)
    at_least("trainer.weight_decay", t.weight_decay, 0)
    if t.max_grad_norm is not None and t.max_grad_norm <= 0:
        raise ConfigError(f"trainer.max_grad_norm={t.max_grad_norm} must be > 0, or null to turn clipping off")
    betas = list(t.betas) if not isinstance(t.betas, (int, float, str)) else None
    if betas is None or len(betas) != 2 or not all(isinstance(x, (int, float)) and 0 <= x < 1 for x in betas):
        raise ConfigError(f"trainer.betas={t.betas!r} must be two numbers in [0, 1), e.g. [0.9, 0.99]")
    if t.threads is not None:
        at_least("trainer.threads", t.threads, 1, "null uses torch's default")
    if t.inject_nan_at_step is not None:
        at_least("trainer.inject_nan_at_step", t.inject_nan_at_step, 1, "a testing hook: null turns it off")
    if t.parallel not in PARALLEL_MODES:
        raise ConfigError(
            f"trainer.parallel={t.parallel!r} must be auto (ddp when launched by torchrun), none, ddp, or "
            f"fsdp (ddp with the policy's training state sharded over the ranks; docs/scaling.md)"
        )
    if t.grad_sum not in GRAD_SUMS:
        raise ConfigError(
            f"trainer.grad_sum={t.grad_sum!r} must be auto (shared memory when every rank is a CPU process on this "
            f"machine, else the backend), shared_memory, or backend (gloo or NCCL's all-reduce)"
        )
    one_of("trainer.unhealthy", t.unhealthy, UNHEALTHY)
