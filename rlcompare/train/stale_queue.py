"""Bounded staleness (`rollout.staleness=k`): the rollouts sampled ahead of the update, as asynchronous trainers
queue them (verl's one-step-off / fully-async trainers, AReaL, TRL's `max_staleness`, prime-rl's
`max_off_policy_steps`).

Step t trains on the oldest queued rollout and samples one more with its current weights (those of step t, after
t - 1 updates): the batch trained at step t was sampled by the weights of step t - k, the first k by the initial
weights (step 1 samples k + 1 rollouts). The queue holds rollouts, not weights, so staleness costs no extra copy
of the model. A queued rollout is stored in checkpoints with its prompts as indices into the train split, so a
resumed run trains on the very same batches; a checkpoint's queue is untrusted and checked before use.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

import torch

from rlcompare.rollout import Completions
from rlcompare.train.batch import Collected, RolloutBatch


@dataclass
class Queued:
    """A rollout waiting for its update: what `Trainer.collect` drew, the step whose weights sampled it, and the
    mini-batch order of its groups drawn with it (`collect.group_order`)."""

    collected: Collected
    sampled_at: int
    order: torch.Tensor | None


class StaleQueue:
    def __init__(self, staleness: int):
        self.staleness = staleness
        self.pending: deque[Queued] = deque()

    def needs(self) -> int:
        """Rollouts to sample before this step's update: k + 1 on the first step, then 1 (0 when k = 0: the step
        samples its own)."""
        return self.staleness + 1 - len(self.pending) if self.staleness else 0

    def push(self, item: Queued) -> None:
        self.pending.append(item)

    def pop(self) -> Queued:
        return self.pending.popleft()

    # ------------------------------------------------------------------ checkpoints
    def state(self, train_prompts: list) -> list[dict]:
        """The queue as plain data and tensors (checkpoint._encode's kinds); prompts as train-split indices."""
        index = {id(p): i for i, p in enumerate(train_prompts)}
        return [_plain(q, index) for q in self.pending]

    def load(self, saved, train_prompts: list, group_size: int, device) -> None:
        """Replace the queue with a checkpoint's, checking every field's type and every tensor's shape first."""
        if not isinstance(saved, list) or len(saved) > self.staleness:
            raise ValueError(f"its rollout queue is malformed (a list of at most {self.staleness} expected)")
        self.pending = deque(_queued(d, train_prompts, group_size, device) for d in saved)


_COMPLETION_FIELDS = ("ids", "mask", "logp", "truncated", "lengths")
_COUNTS = ("rounds", "groups_drawn", "groups_dropped", "generated_tokens")


def _plain(q: Queued, index: dict) -> dict:
    c, b = q.collected, q.collected.batch
    out = {k: getattr(c, k) for k in _COUNTS}
    out.update(rollout_s=c.rollout_s, scoring_s=c.scoring_s, sampled_at=q.sampled_at, order=q.order)
    if b is not None:
        out["batch"] = {
            "prompt_ids": b.prompt_ids,
            "prompt_mask": b.prompt_mask,
            **{k: getattr(b.completions, k) for k in _COMPLETION_FIELDS},
            "env_mask": b.completions.env_mask,  # multi-turn episodes' environment tokens, else None
            "rewards": b.rewards,
            "verifier_rewards": b.verifier_rewards,
            "correct": b.correct,
            "reward_components": b.reward_components,
            "verifier_metrics": b.verifier_metrics,
            "prompts": [index[id(p)] for p in b.prompts],
        }
    return out


def _need(ok: bool, what: str) -> None:
    if not ok:
        raise ValueError(f"its rollout queue's {what} is malformed")


def _queued(d, train_prompts: list, group_size: int, device) -> Queued:
    _need(isinstance(d, dict), "entry")
    _need(all(isinstance(d.get(k), int) and d[k] >= 0 for k in (*_COUNTS, "sampled_at")), "counters")
    _need(all(isinstance(d.get(k), float) for k in ("rollout_s", "scoring_s")), "timings")
    order = d.get("order")
    _need(
        order is None or (isinstance(order, torch.Tensor) and order.dtype == torch.long and order.dim() == 1), "order"
    )
    batch = None if d.get("batch") is None else _batch(d["batch"], train_prompts, group_size, device)
    if order is not None and batch is not None:
        _need(sorted(order.tolist()) == list(range(len(batch.prompts))), "order")
    collected = Collected(batch, *(d[k] for k in _COUNTS), d["rollout_s"], d["scoring_s"])
    return Queued(collected, d["sampled_at"], order)


def _batch(b, train_prompts: list, group_size: int, device) -> RolloutBatch:
    _need(isinstance(b, dict), "batch")
    idx = b.get("prompts")
    _need(
        isinstance(idx, list) and idx and all(isinstance(i, int) and 0 <= i < len(train_prompts) for i in idx),
        "prompts",
    )
    rows = len(idx) * group_size
    tensor = lambda k, dt, dims: (  # noqa: E731
        isinstance(b.get(k), torch.Tensor) and b[k].dtype == dt and b[k].dim() == len(dims) and b[k].shape[0] == rows
    )
    _need(tensor("prompt_ids", torch.long, "BP") and tensor("prompt_mask", torch.long, "BP"), "prompts' ids")
    _need(b["prompt_mask"].shape == b["prompt_ids"].shape, "prompts' mask")
    _need(tensor("ids", torch.long, "BT") and tensor("mask", torch.long, "BT"), "completions")
    width = b["ids"].shape
    _need(b["mask"].shape == width, "completions' mask")
    _need(b.get("logp") is None or (tensor("logp", torch.float32, "BT") and b["logp"].shape == width), "log-probs")
    _need(tensor("truncated", torch.bool, "B") and tensor("lengths", torch.long, "B"), "completions' lengths")
    env = b.get("env_mask")  # multi-turn episodes: their lengths count the policy's tokens only
    _need(env is None or (tensor("env_mask", torch.long, "BT") and env.shape == width), "environment mask")
    policy = b["mask"] if env is None else b["mask"] * (1 - env)
    _need(bool((b["lengths"] == policy.sum(1)).all()), "completions' lengths")
    _need(tensor("rewards", torch.float32, "B") and tensor("verifier_rewards", torch.float32, "B"), "rewards")
    _need(tensor("correct", torch.bool, "B"), "correct flags")
    comps = b.get("reward_components")  # the gdpo estimator's; absent in a queue saved before them
    _need(comps is None or tensor("reward_components", torch.float32, "BK"), "reward components")
    metrics = b.get("verifier_metrics")  # the verifier's declared metrics; absent in a queue saved before them
    _need(metrics is None or tensor("verifier_metrics", torch.float32, "BM"), "verifier metrics")
    completions = Completions(*(None if b[k] is None else b[k].to(device) for k in _COMPLETION_FIELDS))
    completions.env_mask = None if env is None else env.to(device)
    prompts = [train_prompts[i] for i in idx]
    prompt_ids, prompt_mask = b["prompt_ids"].to(device), b["prompt_mask"].to(device)
    return RolloutBatch(
        prompt_ids, prompt_mask, completions, b["rewards"], b["verifier_rewards"], b["correct"], prompts, comps, metrics
    )
