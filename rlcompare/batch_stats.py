"""Per-step statistics of a scored rollout batch (pure torch, no I/O)."""

from __future__ import annotations

import torch


def response_weights(mask: torch.Tensor, mode: str, horizon: int | None = None) -> torch.Tensor:
    """Total loss weight each response receives under an aggregation mode (algorithms.md §4): `[B]`.

    token-mean 1/N per token, seq-mean-token-mean 1/(B|o_i|), seq-mean-token-sum 1/B,
    seq-mean-token-sum-norm 1/(BH), token-sum 1.
    """
    m = mask.float()
    lengths = m.sum(1)
    B = m.shape[0]
    if mode == "token-mean":
        return lengths / lengths.sum().clamp(min=1)
    if mode == "seq-mean-token-mean":
        return (lengths > 0).float() / B
    if mode == "seq-mean-token-sum":
        return lengths / B
    if mode == "seq-mean-token-sum-norm":
        return lengths / (B * float(horizon))
    if mode == "token-sum":
        return lengths
    raise ValueError(f"unknown aggregation mode {mode!r}")


def weight_shares(mask: torch.Tensor, correct: torch.Tensor, mode: str, horizon: int | None = None) -> dict:
    """Share of the loss weight on correct responses and on the shorter half of responses."""
    w = response_weights(mask, mode, horizon)
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
