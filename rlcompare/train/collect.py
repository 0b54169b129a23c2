"""Collection: the rollout -> batch step. Prompts are taken from the stream, sampled `G` times each, scored,
shaped (DAPO's soft overlong punishment) and, with dynamic sampling, refilled until the batch holds
`trainer.prompts_per_step` informative groups.

Over several ranks each samples and scores a share of every round's groups (`round_shares`: on a step's first
round the groups it will train on, so its first update can be rebuilt from its own rollout), and the shares are
gathered into the whole round, in group order, on every rank (`gather_round`).

Shapes as in `rlcompare.train.batch`: `B` rows (completions), groups of `G` contiguous rows, `P` prompt
positions, `T` completion positions.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable

import torch

from rlcompare.algos import advantages as adv_lib
from rlcompare.algos import losses
from rlcompare.rollout import Completions, left_pad
from rlcompare.rollout.streams import GroupStreams
from rlcompare.train.batch import Collected, RolloutBatch
from rlcompare.train.env_rollout import overlong_lengths
from rlcompare.train.parallel import World
from rlcompare.train.update import group_rows, splits_by_groups


@dataclass
class Round:
    """One sampling round's rows: this rank's share of its groups, or after `gather_round` the whole round."""

    prompt_ids: torch.Tensor | None  # (b, P) each prompt repeated for its G completions; None for an empty share
    prompt_mask: torch.Tensor | None  # (b, P)
    completions: Completions  # ids (b, T), mask (b, T), sampler logp (b, T) or None, truncated (b,), lengths (b,)
    verifier_rewards: torch.Tensor  # (b,) CPU float32
    correct: torch.Tensor  # (b,) CPU bool
    errors: int  # completions the verifier failed on
    components: torch.Tensor | None = None  # (b, K) CPU float32 named reward components, when the estimator reads them
    verifier_metrics: torch.Tensor | None = None  # (b, M) CPU float32 the verifier's declared metrics (nan: unreported)


# sample(prompts, *, reuse_recording, streams, trains_these, width, round_, groups) -> (prompt_ids, prompt_mask,
# completions), groups: the prompts' indices in the round;
# score(prompts, completions) -> `context.Scored` (texts, rewards, correct, errors, components, verifier metrics):
# the trainer's sampler and verifier, G per prompt
Sample = Callable[..., tuple]
Score = Callable[[list, Completions], Any]


def collect(
    cfg: Any,
    world: World,
    stream,
    *,
    order: torch.Tensor | None,
    rollout: int,
    sample: Sample,
    score: Score,
    pad_id: int,
    device,
    with_logp: bool,
) -> Collected:
    """Sample, score and (with dynamic sampling) refill until the batch holds informative groups.

    order: the step's mini-batch order of its groups (`group_order`), or None; rollout: this rollout's index
    (the step's, or with staleness the step plus the rollouts queued before), which keys its streams."""
    algo, G, n_prompts = cfg.algorithm, cfg.trainer.group_size, cfg.trainer.prompts_per_step
    kept, rounds, drawn, dropped, gen_tokens, errors = [], 0, 0, 0, 0, 0
    t_roll = t_score = 0.0
    need = n_prompts
    while need > 0:
        prompts = stream.take(need)
        t0 = time.perf_counter()
        shares, trains_these = round_shares(world, len(prompts), rounds, order, cfg.trainer.updates_per_rollout)
        mine = [prompts[j] for j in shares[world.rank]]  # this rank's groups (all of them on one process)
        if mine:
            prompt_ids, prompt_mask, completions = sample(
                mine,
                reuse_recording=rounds == 0,
                streams=round_streams(cfg, rollout, rounds, shares[world.rank], device),
                trains_these=trains_these,
                width=max(len(p.ids) for p in prompts),
                round_=rounds,
                groups=shares[world.rank],
            )
        else:  # a refill of fewer groups than ranks: nothing for this one
            prompt_ids = prompt_mask = None
            completions = no_completions(device, with_logp=with_logp, episodes=cfg.env.name != "none")
        t1 = time.perf_counter()
        s = score(mine, completions)
        t_score += time.perf_counter() - t1
        t_roll += t1 - t0
        part = Round(prompt_ids, prompt_mask, completions, s.rewards, s.correct, s.errors, s.components, s.metrics)
        if world.size > 1:  # every rank holds the whole round, in group order
            part = gather_round(world, prompts, shares, part, pad_id=pad_id, device=device, group_size=G)
        errors += part.errors
        rounds += 1
        drawn += len(prompts)
        gen_tokens += int(part.completions.lengths.sum())
        batch = _shaped(part, prompts, cfg)
        if algo.dynamic_sampling.enabled:
            info = adv_lib.informative_groups(batch.rewards, G)
            dropped += int((~info).sum())
            if info.any():
                kept.append(batch.select(info.repeat_interleave(G), G))
            need = n_prompts - sum(len(k.prompts) for k in kept)
            if rounds > algo.dynamic_sampling.max_rounds:
                break
        else:
            kept.append(batch)
            need = 0
    batch = RolloutBatch.concat(kept, pad_id) if kept else None
    if batch is not None and len(batch.prompts) > n_prompts:
        batch = batch.select(torch.arange(len(batch.prompts) * G) < n_prompts * G, G)
    return Collected(batch, rounds, drawn, dropped, gen_tokens, t_roll, t_score, verifier_errors=errors)


def _shaped(part: Round, prompts: list, cfg: Any) -> RolloutBatch:
    """One whole round as a batch, its rewards the verifier's plus DAPO's soft overlong punishment when on."""
    algo, completions = cfg.algorithm, part.completions
    rewards = part.verifier_rewards.clone()
    if algo.overlong.soft_punishment:
        lengths, max_len = overlong_lengths(completions, cfg)
        rewards = rewards + losses.overlong_penalty(
            lengths,
            max_len=max_len,
            cache_len=algo.overlong.cache_len,
            factor=algo.overlong.factor,
        )
    return RolloutBatch(
        part.prompt_ids,
        part.prompt_mask,
        completions,
        rewards,
        part.verifier_rewards,
        part.correct,
        prompts,
        reward_components=part.components,
        verifier_metrics=part.verifier_metrics,
    )


def group_order(cfg: Any, generator: torch.Generator) -> torch.Tensor | None:
    """The step's mini-batch order of its prompt groups (`update.plan_update`'s), drawn before sampling where the
    batch is sure to be whole groups (no dynamic sampling), so that over several ranks each can sample the
    groups it will train on (`round_shares`); the same draw, from the same generator, as one drawn later."""
    n = cfg.trainer.prompts_per_step
    if cfg.algorithm.dynamic_sampling.enabled or not splits_by_groups(cfg, n):
        return None
    return torch.randperm(n, generator=generator)


def round_shares(
    world: World, n: int, round_: int, order: torch.Tensor | None, updates_per_rollout: int
) -> tuple[list[list[int]], bool]:
    """Every rank's prompt groups of a sampling round of `n`, and whether each rank's update trains on its own:
    on a step's first round with the mini-batch order drawn (`group_order`), the groups each rank trains on
    in every mini-batch (`World.group_shares`), so the first update can be rebuilt from the rank's own
    rollout; else contiguous shares. What is sampled is the same either way (one stream per group)."""
    if world.size > 1 and round_ == 0 and order is not None and len(order) == n:
        return world.group_shares(order, updates_per_rollout), True
    return world.shares(n), False


def round_streams(cfg: Any, rollout: int, round_: int, mine: list[int], device) -> GroupStreams | None:
    """rollout.streams=group: one stream per prompt group of this round, keyed by (seed, rollout, round, group)."""
    if cfg.rollout.streams != "group":
        return None
    keys = [(cfg.seed, rollout, round_, j) for j in mine]
    return GroupStreams(keys, cfg.trainer.group_size, device)


def gather_round(
    world: World, prompts: list, shares: list[list[int]], part: Round, *, pad_id: int, device, group_size: int
) -> Round:
    """The ranks' shares of one sampling round (`shares`: each rank's groups) as the whole round in group
    order, the same on every rank; this rank's recording (if any) placed at its rows. Episodes (`env_mask` set):
    their environment mask too, and their prompts as the ranks hold them (each with its first observation)."""
    G = group_size
    c = part.completions
    episodes = c.env_mask is not None
    if not episodes:
        prompt_ids, prompt_mask = left_pad([p.ids for p in prompts], pad_id, device)
        prompt_ids, prompt_mask = prompt_ids.repeat_interleave(G, 0), prompt_mask.repeat_interleave(G, 0)

    # gathered rows come in rank order: group g's sit at the position of g in sum(shares, [])
    in_order = group_rows(torch.argsort(torch.as_tensor(sum(shares, []), dtype=torch.long)), G)

    tensors, pads = zip(  # each with the value that pads a shorter share
        (c.ids, pad_id),
        (c.mask, 0),
        (c.logp, 0.0),
        (c.truncated, False),
        (c.lengths, 0),
        (part.verifier_rewards, 0.0),
        (part.correct, False),
        (part.components, 0.0),
        (part.verifier_metrics, 0.0),
        (torch.tensor([part.errors]), 0),
        (c.env_mask, 0),
        # left-padded prompts travel flipped: the gather pads on the right, so they come back left-padded
        (_flipped(part.prompt_ids, device) if episodes else None, pad_id),
        (_flipped(part.prompt_mask, device) if episodes else None, 0),
    )
    *rows, n_errors, env_mask, flipped_ids, flipped_mask = world.gather_many(list(tensors), list(pads))
    ids, mask, logp, truncated, lengths, rewards, correct, comps, metrics, env_mask, flipped_ids, flipped_mask = (
        None if x is None else x[in_order.to(x.device)] for x in (*rows, env_mask, flipped_ids, flipped_mask)
    )
    if episodes:
        prompt_ids, prompt_mask = flipped_ids.flip(1), flipped_mask.flip(1)
    recording = (
        c.recording.placed(group_rows(torch.as_tensor(shares[world.rank], dtype=torch.long), G), len(prompts) * G)
        if c.recording is not None
        else None
    )
    whole = Completions(ids, mask, logp, truncated, lengths, recording=recording, env_mask=env_mask)
    return Round(prompt_ids, prompt_mask, whole, rewards, correct, int(n_errors.sum()), comps, metrics)


def _flipped(x: torch.Tensor | None, device) -> torch.Tensor:
    """A share's (b, P) left-padded prompt tensor reversed along P (an empty share's: (0, 0))."""
    return torch.zeros((0, 0), dtype=torch.long, device=device) if x is None else x.flip(1)


def no_completions(device, *, with_logp: bool, episodes: bool = False) -> Completions:
    """A rank's empty share of a sampling round (0 rows), in the shapes the gather pads (with an environment
    mask for episodes)."""
    empty = torch.zeros((0, 0), dtype=torch.long, device=device)
    return Completions(
        empty,
        empty.clone(),
        torch.zeros((0, 0), device=device) if with_logp else None,
        torch.zeros(0, dtype=torch.bool, device=device),
        torch.zeros(0, dtype=torch.long, device=device),
        env_mask=empty.clone() if episodes else None,
    )
