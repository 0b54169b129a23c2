"""The trainer's typed data: one rollout batch, what the update optimizes toward, and the run's counters.

Shapes: `B` completions (`n_prompts x G`, the `G` completions of one prompt contiguous: a group), `P` prompt
positions (left-padded), `T` completion positions (right-padded). Tensors live on the training device unless
the comment says CPU.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

import torch

from rlcompare.rollout import Completions


@dataclass
class RolloutBatch:
    """The completions of one rollout batch (one or several sampling rounds) and their scores."""

    prompt_ids: torch.Tensor  # (B, P) left-padded prompt token ids, each prompt repeated for its G completions
    prompt_mask: torch.Tensor  # (B, P) 1 on real prompt tokens
    # ids (B, T), mask (B, T), sampler logp (B, T) or None, truncated (B,), lengths (B,), and the speed layer's
    # opaque `recording` (None when the ordinary path sampled or several rounds were joined)
    completions: Completions
    rewards: torch.Tensor  # (B,) CPU float32: the verifier's reward plus shaping (DAPO's soft overlong punishment)
    verifier_rewards: torch.Tensor  # (B,) CPU float32: the verifier's reward alone
    correct: torch.Tensor  # (B,) CPU bool
    prompts: list[Any]  # B / G `prompt_ids.EncodedPrompt`s, one per group
    # (B, K) CPU float32 the verifier's named reward components, when the estimator reads them (gdpo), else None
    reward_components: torch.Tensor | None = None
    # (B, M) CPU float32 what the verifier reported under its declared metrics (nan where a scoring reported none),
    # when it declares any, else None: the row's verifier/<name> (rewards/registry.py metric_table)
    verifier_metrics: torch.Tensor | None = None

    def __len__(self) -> int:
        return len(self.rewards)

    def select(self, rows: torch.Tensor, group_size: int) -> "RolloutBatch":
        """The completions where the (B,) CPU bool mask `rows` is true (whole groups)."""
        at = rows.to(self.prompt_ids.device)
        groups = rows.view(-1, group_size)[:, 0].tolist()
        return RolloutBatch(
            self.prompt_ids[at],
            self.prompt_mask[at],
            self.completions.select(rows),
            self.rewards[rows],
            self.verifier_rewards[rows],
            self.correct[rows],
            [p for p, g in zip(self.prompts, groups) if g],
            None if self.reward_components is None else self.reward_components[rows],
            None if self.verifier_metrics is None else self.verifier_metrics[rows],
        )

    @staticmethod
    def concat(parts: list["RolloutBatch"], pad_id: int) -> "RolloutBatch":
        """Several sampling rounds as one batch, padded to the widest prompt and completion. The rounds were
        sampled separately, so the result carries no recording (the update runs the plain forward)."""
        if len(parts) == 1:
            return parts[0]
        P = max(p.prompt_ids.shape[1] for p in parts)
        T = max(p.completions.ids.shape[1] for p in parts)

        def prompts(attr, value):
            return torch.cat([_pad_left(getattr(p, attr), P, value) for p in parts])

        def comps(attr, value):
            return torch.cat([_pad_right(getattr(p.completions, attr), T, value) for p in parts])

        completions = Completions(
            comps("ids", pad_id),
            comps("mask", 0),
            comps("logp", 0.0) if parts[0].completions.logp is not None else None,
            torch.cat([p.completions.truncated for p in parts]),
            torch.cat([p.completions.lengths for p in parts]),
            env_mask=comps("env_mask", 0) if parts[0].completions.env_mask is not None else None,
        )
        return RolloutBatch(
            prompts("prompt_ids", pad_id),
            prompts("prompt_mask", 0),
            completions,
            torch.cat([p.rewards for p in parts]),
            torch.cat([p.verifier_rewards for p in parts]),
            torch.cat([p.correct for p in parts]),
            sum((p.prompts for p in parts), []),
            None if parts[0].reward_components is None else torch.cat([p.reward_components for p in parts]),
            None if parts[0].verifier_metrics is None else torch.cat([p.verifier_metrics for p in parts]),
        )


def _pad_right(x, width, value):
    return torch.nn.functional.pad(x, (0, width - x.shape[1]), value=value)


def _pad_left(x, width, value):
    return torch.nn.functional.pad(x, (width - x.shape[1], 0), value=value)


@dataclass
class Collected:
    """What one `collect.collect` drew: the batch (None when dynamic sampling kept no informative group) and
    how it was drawn."""

    batch: RolloutBatch | None
    rounds: int  # sampling rounds run
    groups_drawn: int  # prompts sampled, over all rounds
    groups_dropped: int  # groups dynamic sampling dropped (all rewards equal)
    generated_tokens: int  # real completion tokens sampled, over all rounds
    rollout_s: float  # seconds in the sampler
    scoring_s: float  # seconds in the verifier
    verifier_errors: int = 0  # completions the verifier failed on, over all rounds (counted when collected)


@dataclass
class Targets:
    """What the update optimizes toward on one batch (`TargetMaker.advantages`, from `objective.advantages`)."""

    loss_mask: torch.Tensor  # (B, T) the completion mask, 0 on rows the overlong filter removes (DAPO)
    advantages: torch.Tensor  # (B,) per response (group, RLOO) or (B, T) per token (GAE, REINFORCE++)
    ref_logp: torch.Tensor | None = None  # (B, T) the reference's log-probs (0 on padding); None when beta = 0
    returns: torch.Tensor | None = None  # (B, T) GAE returns, the critic's regression target (PPO)
    old_values: torch.Tensor | None = None  # (B, T) the critic's values at rollout time (PPO's value clip)
    token_weight: torch.Tensor | None = None  # (B, T) the rollout-mismatch correction's weights, or None
    metrics: dict = field(default_factory=dict)  # the advantage's own row entries (distill/*), or none


@dataclass
class TrainerState:
    """The run's counters: saved in checkpoints (`as_dict`), reported in summary.json."""

    step: int = 0
    tokens: int = 0  # generated tokens, over the run
    bad_in_row: int = 0  # consecutive steps whose update a non-finite value skipped
    last_bad: list | None = None  # [step, quantity] of the last such step
    skipped_updates: int = 0
    applied_updates: int | None = 0  # optimizer steps taken; None: resumed from a checkpoint written before the count
    elapsed: float = 0.0  # training seconds (evals excluded)
    eval_initial: float | None = None
    eval_best: float | None = None
    eval_last: float | None = None
    verifier_errors: int = 0

    def note_eval(self, accuracy: float) -> None:
        if self.eval_initial is None:
            self.eval_initial = accuracy
        self.eval_best = accuracy if self.eval_best is None else max(self.eval_best, accuracy)
        self.eval_last = accuracy

    def note_nonfinite(self, what: str | None) -> None:
        """Track the run of consecutive steps whose update was skipped for a non-finite value (run.py stops the
        run at trainer.max_bad_steps); `last_bad` = [step, quantity] names where it broke."""
        if what is None:
            self.bad_in_row = 0
        else:
            self.bad_in_row += 1
            self.last_bad = [self.step, what]

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "TrainerState":
        """From `as_dict` (a checkpoint's); keys it does not know are refused (TypeError)."""
        return cls(**d)
