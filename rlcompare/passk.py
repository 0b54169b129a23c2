"""Sampled-evaluation estimators from per-prompt counts: pass@k, pass^k, maj@k, avg@n (docs/metrics.md, "Sampled
evaluation"). Plain Python, torch-free and free of I/O: the trainer computes the logged values with it and the report
recomputes any k from the stored counts (`eval_counts.jsonl`) with the same functions.

A prompt evaluated with n samples of which c were correct:

- pass@k = 1 - C(n-c, k) / C(n, k), the unbiased estimator of the chance that at least one of k samples is
  correct (Chen et al. 2021, arXiv 2107.03374, eq. 1), computed as 1 - prod_{i=n-c+1}^{n} (1 - k/i): no binomial
  coefficient is formed, so it stays exact to rounding for any n (C(1024, 512) overflows a float).
- pass^k = C(c, k) / C(n, k) = prod_{i=0}^{k-1} (c-i)/(n-i), the unbiased estimator of the chance that all of k
  samples are correct.
- avg@n = c / n, pass@1 averaged over the n samples.
- maj@k: the majority answer over the FIRST k samples (in sample order; the samples are i.i.d., so this is one
  unbiased draw of the k-sample majority vote, not its expectation over subsets). A sample's vote is its
  verifier-canonical answer; samples without an answer (None) do not vote, and a prompt none of whose first k
  samples has an answer counts wrong. Ties: of the answers with the most votes, the one that appears first wins.
  The majority answer is correct when the first sample carrying it was scored correct.
"""

from __future__ import annotations

import math
from typing import Optional, Sequence

# completions per held-out prompt (`eval.samples`' maximum, rlcompare.config.sections.evaluation): 200 prompts x 4096 is already
# 800k completions an eval. A counts file read back may hold no larger n, so that recomputing pass@k from one (a
# product of c terms) stays bounded whatever the file says.
MAX_SAMPLES = 4096


def _check(n: int, c: int, k: int) -> None:
    if not (isinstance(n, int) and isinstance(c, int) and isinstance(k, int)):
        raise TypeError(f"n, c, k must be integers, got {n!r}, {c!r}, {k!r}")
    if n < 1 or not 0 <= c <= n:
        raise ValueError(f"need n >= 1 and 0 <= c <= n, got n={n}, c={c}")
    if not 1 <= k <= n:
        raise ValueError(f"k={k} must be in [1, n={n}]: pass@k and pass^k are estimated from k of the n samples")


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k of one prompt with c correct of n samples: 1 - C(n-c, k)/C(n, k)."""
    _check(n, c, k)
    if n - c < k:  # every k-subset holds a correct sample
        return 1.0
    miss = 1.0
    for i in range(n - c + 1, n + 1):
        miss *= 1.0 - k / i
    return 1.0 - miss


def pass_hat_k(n: int, c: int, k: int) -> float:
    """Unbiased pass^k (all k correct) of one prompt with c correct of n samples: C(c, k)/C(n, k)."""
    _check(n, c, k)
    if c < k:
        return 0.0
    hit = 1.0
    for i in range(k):
        hit *= (c - i) / (n - i)
    return hit


def _mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else float("nan")


def check_counts(ns: Sequence[int], cs: Sequence[int]) -> None:
    """Per-prompt sample counts `ns` and correct counts `cs`: the same length, integers, 0 <= c <= n, n >= 1."""
    if len(ns) != len(cs):
        raise ValueError(f"{len(ns)} sample counts but {len(cs)} correct counts: one of each per prompt")
    for i, (n, c) in enumerate(zip(ns, cs)):
        ok = all(isinstance(x, int) and not isinstance(x, bool) for x in (n, c))
        if not ok or n < 1 or not 0 <= c <= n:
            raise ValueError(f"prompt {i}: c={c!r} correct of n={n!r} samples: need integers with 0 <= c <= n, n >= 1")


def mean_pass_at_k(ns: Sequence[int], cs: Sequence[int], k: int) -> float:
    """pass@k averaged over prompts (nan for none); every prompt needs k <= its n."""
    check_counts(ns, cs)
    return _mean([pass_at_k(n, c, k) for n, c in zip(ns, cs)])


def mean_pass_hat_k(ns: Sequence[int], cs: Sequence[int], k: int) -> float:
    """pass^k averaged over prompts (nan for none)."""
    check_counts(ns, cs)
    return _mean([pass_hat_k(n, c, k) for n, c in zip(ns, cs)])


def avg_at_n(ns: Sequence[int], cs: Sequence[int]) -> float:
    """pass@1 averaged over each prompt's samples, then over prompts: mean of c_i / n_i."""
    check_counts(ns, cs)
    return _mean([c / n for n, c in zip(ns, cs)])


def majority_correct(answers: Sequence[Optional[str]], correct: Sequence[bool], k: int) -> bool:
    """maj@k of one prompt: whether the majority answer of its first k samples is correct (module docstring)."""
    if len(answers) != len(correct):
        raise ValueError(f"{len(answers)} answers but {len(correct)} scores: one of each per sample")
    if not 1 <= k <= len(answers):
        raise ValueError(f"k={k} must be in [1, n={len(answers)}]")
    votes: dict[str, int] = {}
    first: dict[str, int] = {}
    for j in range(k):
        a = answers[j]
        if a is None:
            continue
        votes[a] = votes.get(a, 0) + 1
        first.setdefault(a, j)
    if not votes:
        return False
    top = max(votes.values())
    winner = min((a for a, v in votes.items() if v == top), key=first.__getitem__)
    return bool(correct[first[winner]])


def default_ks(n: int) -> list[int]:
    """The k reported by default for n samples: the powers of two up to n (1, 2, 4, ..., <= n)."""
    ks, k = [], 1
    while k <= n:
        ks.append(k)
        k *= 2
    return ks


def crossing_k(ks: Sequence[float], arm: Sequence[float], base: Sequence[float]) -> Optional[float]:
    """The first k at which `arm`'s pass@k curve falls to or below `base`'s, after being above it at a smaller k
    (ks increasing, the curves read at them): the k where the base model catches up (arXiv 2504.13837). Linear in
    log2 k between the two ks around the crossing; None when the arm never starts above or never falls back.
    Values that are nan are skipped."""
    pts = [(float(k), a - b) for k, a, b in zip(ks, arm, base) if not (math.isnan(a) or math.isnan(b))]
    above = False
    for (k0, d0), (k1, d1) in zip(pts, pts[1:]):
        above = above or d0 > 0
        if above and d0 > 0 and d1 <= 0:
            x0, x1 = math.log2(k0), math.log2(k1)
            return float(2 ** (x0 + (x1 - x0) * d0 / (d0 - d1)))
    return None
