"""`eval.*`: how the held-out prompts are evaluated (one greedy completion, or n samples per prompt and the k of
pass@k reported), with the ranges and checks; `eval_ks`, the k a run reports. When and in how big forwards it
evaluates are trainer keys (trainer.eval_every, trainer.eval_batch_size); whether eval.max_new_tokens fits the
model's context reads other sections: rlcompare/config/schema.py.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

from omegaconf import DictConfig

from rlcompare.config.checks import AT_LEAST_ONE, SEED, ConfigError, Range, at_least
from rlcompare.passk import MAX_SAMPLES


@dataclass
class EvalConfig:
    # when and in how big forwards: trainer.eval_every and trainer.eval_batch_size (kept there)
    samples: int = 0  # completions sampled per held-out prompt (n); 0: one greedy completion (eval/accuracy only)
    temperature: float = 1.0  # samples > 0: the eval sampler's temperature (>= 1e-6)
    top_p: float = 1.0  # samples > 0: the eval sampler's nucleus; 1: off
    max_new_tokens: Optional[int] = None  # tokens generated per eval completion at most; null: budget.max_new_tokens
    k: Any = (
        None  # samples > 0: the k of eval/pass@k, pass^k, maj@k (each in 1..samples); null: 1, 2, 4, ... <= samples
    )
    seed: int = 0  # seed of the eval's own streams, keyed by (seed, prompt): the same samples for every arm at a policy
    greedy: bool = False  # samples > 0: also decode greedily and log eval/accuracy (greedy) besides the samples


MAX_EVAL_SAMPLES = MAX_SAMPLES  # completions per held-out prompt (rlcompare.passk: the counts reader's bound too)
RANGES: dict[str, Range] = {  # keys narrower than NON_NEGATIVE (schema.py's RANGES holds every section's)
    "eval.temperature": Range(1e-6),
    "eval.top_p": Range(0, 1, low_open=True),
    "eval.max_new_tokens": AT_LEAST_ONE,
    "eval.seed": SEED,
}


def check(e: DictConfig) -> None:
    """The eval group (issue 50): greedy (samples=0) or n samples per held-out prompt, and the k reported."""
    at_least("eval.samples", e.samples, 0, "0 decodes one greedy completion per prompt")
    if e.samples > MAX_EVAL_SAMPLES:
        raise ConfigError(f"eval.samples={e.samples} must be <= {MAX_EVAL_SAMPLES} (completions per held-out prompt)")
    if e.max_new_tokens is not None:
        at_least("eval.max_new_tokens", e.max_new_tokens, 1, "null uses budget.max_new_tokens")
    if e.samples == 0:
        if e.k is not None:
            raise ConfigError(
                f"eval.k={e.k!r} applies to sampled evaluation only; set eval.samples (e.g. 16) or eval.k=null"
            )
        return
    if e.temperature < 1e-6:
        raise ConfigError(f"eval.temperature={e.temperature} must be >= 1e-6 (sampling needs a positive temperature)")
    if not 0 < e.top_p <= 1:
        raise ConfigError(f"eval.top_p={e.top_p} must be in (0, 1]")
    if e.k is None:
        return
    ks = None if isinstance(e.k, (str, bytes, float, bool)) else ([e.k] if isinstance(e.k, int) else list(e.k))
    if not ks or not all(isinstance(k, int) and not isinstance(k, bool) and 1 <= k <= e.samples for k in ks):
        raise ConfigError(
            f"eval.k={e.k!r} must be a list of integers in 1..eval.samples={e.samples} (e.g. [1, 4, 16]), "
            f"or null for the powers of two up to eval.samples"
        )


def eval_ks(e) -> list[int]:
    """The k reported for the eval settings `e` (eval.k sorted, or the powers of two up to eval.samples)."""
    if e.samples == 0:
        return []
    if e.k is None:
        ks, k = [], 1
        while k <= e.samples:
            ks.append(k)
            k *= 2
        return ks
    return sorted({int(k) for k in ([e.k] if isinstance(e.k, int) else e.k)})
