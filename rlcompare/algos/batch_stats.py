"""Training diagnostics of one scored rollout batch, logged per step (pure torch, no I/O): how the loss weight
splits between correct and short responses, and completion lengths.

Not to be confused with `rlcompare.stats`, which is the report's seed statistics (numpy, across runs: intervals,
IQM, probability of improvement). This module describes one batch inside a run; that one compares runs.
"""

from __future__ import annotations

import torch

from rlcompare.algos.losses import aggregation_weights


def weight_shares(
    mask: torch.Tensor, correct: torch.Tensor, mode: str, horizon: int | None = None, group_size: int | None = None
) -> dict:
    """Share of the loss weight on correct responses and on the shorter half of responses."""
    w = aggregation_weights(mask, mode, horizon=horizon, group_size=group_size).sum(1)  # each response's total weight
    total = w.sum().clamp(min=1e-12)
    lengths = mask.float().sum(1)
    order = torch.argsort(lengths, stable=True)
    short = torch.zeros_like(correct, dtype=torch.bool)
    short[order[: len(order) // 2]] = True
    return {
        "weight/correct_share": float(w[correct.bool()].sum() / total),
        "weight/short_share": float(w[short].sum() / total),
    }


def length_stats(lengths: torch.Tensor, correct: torch.Tensor, truncated: torch.Tensor) -> dict:
    lengths = lengths.float()
    c, i = correct.bool(), ~correct.bool()
    nan = float("nan")
    return {
        "length/mean": float(lengths.mean()),
        "length/correct_mean": float(lengths[c].mean()) if c.any() else nan,
        "length/correct_max": float(lengths[c].max()) if c.any() else nan,
        "length/incorrect_mean": float(lengths[i].mean()) if i.any() else nan,
        "length/incorrect_max": float(lengths[i].max()) if i.any() else nan,
        "length/truncated_frac": float(truncated.float().mean()),
    }


def reported_means(values: torch.Tensor) -> list[float | None]:
    """Per column of a (B, M) table of what B scorings reported (nan where one reported nothing), the mean over the
    rows that reported it, in float64; None for a column no row reported (the verifier's declared metrics)."""
    seen = ~torch.isnan(values)
    sums = torch.where(seen, values, 0.0).sum(0, dtype=torch.float64)
    counts = seen.sum(0)
    return [float(s / n) if n else None for s, n in zip(sums.tolist(), counts.tolist())]
