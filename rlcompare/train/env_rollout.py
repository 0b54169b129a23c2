"""The door to multi-turn episodes (#51): with `env.name` set, `RolloutContext.sample` calls `EnvRollout.sample`
(with the context: the policy, the generator, the settings) instead of the sampler alone, and its scoring reads
the episodes' outcome instead of the verifier. Everything else (advantages, losses, staleness, resume) sees a batch whose loss mask has holes
(`Completions.policy_mask`).

Random draws: turn 0 is the single-turn rollout's (the trainer's generator, or its group streams); with
`rollout.streams=group` each later turn of episode `i` of group `key` draws from its own stream keyed
`(*key, turn, i)`, so an episode's tokens do not depend on the rest of the batch either. Environment seeds:
one per group (the G episodes of a group have the same start), from (run seed, rollout index, call, group) in
training and from (eval.seed, prompt text) in the held-out eval.

Over several ranks (#51) each rank runs the episodes of its share of a round's groups, as it samples its share of
a single-turn round: a group's environment seed is keyed by its index in the whole round, its streams by the
round's keys, so an episode is the one a single process runs (up to the rounding of a batch of another shape:
later turns pad the live episodes' contexts to the longest on the rank). The collector gathers the rounds,
`env_mask` with them (`collect.gather_round`), and the row's episode entries are every rank's (`metrics`).
"""

from __future__ import annotations

import zlib
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import torch

from rlcompare import env_specs
from rlcompare.envs import runner
from rlcompare.rollout import episodes, sample
from rlcompare.rollout.streams import GroupStreams, group_seed

if TYPE_CHECKING:  # the context holds an EnvRollout: imported for the annotations only
    from rlcompare.train.context import RolloutContext


class EnvRollout:
    def __init__(self, cfg: Any, world=None):
        e = cfg.env
        self.cfg, self.world = cfg, world
        # plain containers all the way down: the spec is pickled to worker processes, which cannot unpickle a
        # node of the composed config (its classes are made at run time)
        spec = runner.plain({"name": e.name, "target": e.target, "settings": e.settings or {}})
        self.replay = runner.EnvReplay(spec, workers=cfg.verifier.workers)
        self.settings = episodes.EpisodeSettings(
            max_turns=e.max_turns,
            max_tokens=e.max_tokens,
            turn_tokens=cfg.budget.max_new_tokens,
            stop=tuple(e.stop or ()),
            reward=e.reward,
            max_observation_tokens=e.max_observation_tokens,
            env=e.name,
            metrics=tuple(env_specs.SPECS[e.name].metrics) if e.name in env_specs.SPECS else (),  # custom: none
        )
        self.pending: list[episodes.Outcome] = []  # this rank's training episodes' outcomes since the last row

    def sample(
        self,
        ctx: RolloutContext,
        prompts: list,
        *,
        repeat: int,
        greedy: bool,
        streams: GroupStreams | None,
        rollout: int = 0,
        round_: int = 0,
        groups: list[int] | None = None,
        width: int | None = None,
    ):
        """`repeat` episodes of each prompt: (prompt ids, prompt mask, Completions with env_mask and outcome).
        rollout, round_, groups: the rollout index (`collect`'s), the sampling round and these prompts' indices in
        it (the environment seeds' key; all of the round's by default); width: the round's prompt width (turn 0
        pads to at least it)."""
        seeds = self._seeds(ctx, prompts, greedy, rollout, round_, groups)
        request = replace(ctx.request, greedy=greedy, logprobs=not greedy and ctx.reads_sampler_logp)
        out = self._episodes(ctx, prompts, repeat, seeds, (request, ctx.generator, streams), self.settings, width)
        if not greedy:
            self.pending.append(out[2].outcome)
        return out

    def sample_eval(self, ctx: RolloutContext, prompts: list, *, streams: GroupStreams, width: int | None = None):
        """The sampled held-out eval's episodes (eval.samples > 0, `rlcompare.train.evaluation`): eval.samples of
        each prompt, drawn with the eval's temperature, top_p and streams (`streams`: the eval's, one per prompt;
        later turns keyed (its key, turn, member), apart from training's), policy turns of eval.max_new_tokens
        tokens, from the greedy eval's environment seeds. Their outcomes never enter the training row."""
        e = ctx.cfg.eval
        settings = replace(self.settings, turn_tokens=e.max_new_tokens or self.settings.turn_tokens)
        request = replace(ctx.request, temperature=e.temperature, top_p=e.top_p, greedy=False, logprobs=False)
        seeds = eval_seeds(e.seed, prompts)
        return self._episodes(ctx, prompts, e.samples, seeds, (request, None, streams), settings, width)[2]

    def _episodes(self, ctx: RolloutContext, prompts, G: int, seeds, draw: tuple, settings, width):
        """`G` episodes of each prompt (`episodes.run`), each policy turn sampled by `rollout.sample` as `draw` says:
        (the `SamplingRequest` whose budget and repeats each turn sets, the generator, turn 0's streams)."""
        request, generator, streams = draw
        model = ctx.policy.model
        session = runner.open_session(
            self.replay,
            [p.example for p in prompts for _ in range(G)],
            [s for s in seeds for _ in range(G)],
            ctx.cfg.verifier,
        )

        def sample_turn(ids, mask, *, repeats, max_new_tokens, turn, rows):
            model.eval()
            turn_request = replace(request, max_new_tokens=max_new_tokens, repeats=repeats)
            turn_rows = streams if turn == 0 else turn_streams(streams, rows, turn, G, ctx.device)
            return sample(model, ids, mask, turn_request, generator=generator, streams=turn_rows)

        prompt_ids, prompt_mask, completions = episodes.run(
            sample_turn,
            ctx.tokenizer,
            [p.ids for p in prompts],
            session,
            settings,
            group_size=G,
            pad_id=ctx.pad_id,
            device=ctx.device,
            width=width,
        )
        if not request.logprobs:
            completions.logp = None
        return prompt_ids, prompt_mask, completions

    def _seeds(self, ctx: RolloutContext, prompts: list, greedy: bool, rollout: int, round_: int, groups) -> list[int]:
        if greedy:  # the held-out eval: the same episode at every eval
            return eval_seeds(ctx.cfg.eval.seed, prompts)
        groups = range(len(prompts)) if groups is None else groups
        return [group_seed(ctx.cfg.seed, rollout, round_, g) for g in groups]

    def metrics(self) -> dict:
        """The episode entries of this step's row (`episodes.metrics`), from the episodes every rank sampled since
        the last row (a collective over several ranks: every rank calls it, at its row)."""
        mine, self.pending = self.pending, []
        if self.world is not None and self.world.size > 1:
            parts = self.world.gather_objects([_counts(o) for o in mine])
            mine = [_from_counts(c) for part in parts for c in part]
        return episodes.metrics(mine, self.settings.env, self.settings.metrics)


def eval_seeds(eval_seed: int, prompts: list) -> list[int]:
    """The held-out episodes' environment seeds: one per prompt, from (eval.seed, prompt text), so a prompt's
    episode starts alike at every eval, on any rank, greedy or sampled."""
    return [group_seed(eval_seed, zlib.crc32(p.example.prompt.encode())) for p in prompts]


def _counts(o: episodes.Outcome) -> dict:
    """What `episodes.metrics` reads of an outcome, as JSON data for the other ranks."""
    return {"ends": list(o.ends), "turns": o.turns.tolist(), "env_tokens": int(o.env_tokens), "reported": o.reported}


def _from_counts(c: dict) -> episodes.Outcome:
    n = len(c["ends"])
    return episodes.Outcome(
        rewards=torch.zeros(n),
        correct=torch.zeros(n, dtype=torch.bool),
        ends=c["ends"],
        turns=torch.tensor(c["turns"], dtype=torch.long),
        env_tokens=c["env_tokens"],
        reported=c["reported"],
    )


def turn_streams(streams: GroupStreams | None, rows: list[int], turn: int, G: int, device) -> GroupStreams | None:
    """Later turns under rollout.streams=group: one stream per live episode, keyed (group's key, turn, member)."""
    if streams is None:
        return None
    return GroupStreams([(*streams.keys[r // G], turn, r % G) for r in rows], 1, device)


def build(cfg: Any, world) -> EnvRollout | None:
    """The run's episodes, or None for single-turn runs (env.name=none)."""
    if cfg.env.name == "none":
        return None
    return EnvRollout(cfg, world)


def overlong_lengths(completions, cfg: Any):
    """DAPO's soft overlong punishment (Eq. 13) reads how close a response came to where it is cut: a single-turn
    completion's length against `budget.max_new_tokens`; an episode's whole length after the prompt (the policy's
    and the environment's tokens) against `env.max_tokens`, where the rollout cuts an episode. Returns
    ([B] lengths on the CPU, L_max)."""
    if completions.env_mask is None:
        return completions.lengths.cpu(), int(cfg.budget.max_new_tokens)
    env_tokens = (completions.env_mask * completions.mask).sum(1)
    return (completions.lengths + env_tokens).cpu(), int(cfg.env.max_tokens)
