"""The trainer's door to multi-turn episodes (#51): with `env.name` set, the trainer's `_sample` calls
`EnvRollout.sample` instead of the sampler alone, and its scoring reads the episodes' outcome instead of the
verifier. Everything else (advantages, losses, staleness, resume) sees a batch whose loss mask has holes
(`Completions.policy_mask`).

Random draws: turn 0 is the single-turn rollout's (the trainer's generator, or its group streams); with
`rollout.streams=group` each later turn of episode `i` of group `key` draws from its own stream keyed
`(*key, turn, i)`, so an episode's tokens do not depend on the rest of the batch either. Environment seeds:
one per group (the G episodes of a group have the same start), from (run seed, rollout index, call, group) in
training and from (eval.seed, prompt text) in the held-out eval.
"""

from __future__ import annotations

import zlib
from typing import Any

from rlcompare.config import ConfigError
from rlcompare.envs import runner
from rlcompare.rollout import episodes, sample
from rlcompare.rollout.streams import GroupStreams, group_seed


class EnvRollout:
    def __init__(self, cfg: Any):
        e = cfg.env
        self.cfg = cfg
        spec = {"name": e.name, "target": e.target, "settings": dict(e.settings or {})}
        self.replay = runner.EnvReplay(spec, workers=cfg.verifier.workers)
        self.settings = episodes.EpisodeSettings(
            max_turns=e.max_turns,
            max_tokens=e.max_tokens,
            turn_tokens=cfg.budget.max_new_tokens,
            stop=tuple(e.stop or ()),
            reward=e.reward,
            max_observation_tokens=e.max_observation_tokens,
        )
        self.pending: list[episodes.Outcome] = []  # the training episodes' outcomes since the last row
        self._call = (None, 0)  # (rollout index, calls in it): the environment seeds' key

    def sample(self, tr, prompts: list, *, repeat: int, greedy: bool, streams: GroupStreams | None):
        """`repeat` episodes of each prompt: (prompt ids, prompt mask, Completions with env_mask and outcome)."""
        G = repeat
        seeds = self._seeds(tr, prompts, greedy)
        session = runner.open_session(
            self.replay,
            [p.example for p in prompts for _ in range(G)],
            [s for s in seeds for _ in range(G)],
            tr.cfg.verifier,
        )
        logprobs = not greedy and tr._reads_sampler_logp()

        def sample_turn(ids, mask, *, repeats, max_new_tokens, turn, rows):
            tr.policy.model.eval()
            return sample(
                tr.policy.model,
                ids,
                mask,
                max_new_tokens=max_new_tokens,
                eos_id=tr.eos_ids,
                pad_id=tr.pad_id,
                temperature=tr.cfg.rollout.temperature,
                top_p=tr.cfg.rollout.top_p,
                greedy=greedy,
                generator=tr.gen,
                autocast_dtype=tr.autocast,
                repeats=repeats,
                kv_cache=tr.cfg.rollout.kv_cache,
                engine=tr.cfg.rollout.engine,
                sync_every=tr.cfg.rollout.sync_every,
                logprobs=logprobs,
                streams=streams if turn == 0 else turn_streams(streams, rows, turn, G, tr.device),
            )

        prompt_ids, prompt_mask, completions = episodes.run(
            sample_turn,
            tr.policy.tokenizer,
            [p.ids for p in prompts],
            session,
            self.settings,
            group_size=G,
            pad_id=tr.pad_id,
            device=tr.device,
        )
        if not logprobs:
            completions.logp = None
        if not greedy:
            self.pending.append(completions.outcome)
        return prompt_ids, prompt_mask, completions

    def _seeds(self, tr, prompts: list, greedy: bool) -> list[int]:
        if greedy:  # the held-out eval: the same episode at every eval
            return [group_seed(tr.cfg.eval.seed, zlib.crc32(p.example.prompt.encode())) for p in prompts]
        rollout = tr.state.step + len(tr.queue.pending)
        calls = self._call[1] + 1 if self._call[0] == rollout else 0
        self._call = (rollout, calls)
        return [group_seed(tr.cfg.seed, rollout, calls, g) for g in range(len(prompts))]

    def metrics(self) -> dict:
        """The episode entries of this step's row (`episodes.metrics`), from the episodes sampled since the last."""
        row, self.pending = episodes.metrics(self.pending), []
        return row


def turn_streams(streams: GroupStreams | None, rows: list[int], turn: int, G: int, device) -> GroupStreams | None:
    """Later turns under rollout.streams=group: one stream per live episode, keyed (group's key, turn, member)."""
    if streams is None:
        return None
    return GroupStreams([(*streams.keys[r // G], turn, r % G) for r in rows], 1, device)


def scored(outcome: episodes.Outcome):
    """The trainer's `_score` for episodes: (texts, rewards, correct, verifier errors: none, the environment's are
    counted under env/errors)."""
    return outcome.texts, outcome.rewards.clone(), outcome.correct.clone(), 0


def build(cfg: Any, world) -> EnvRollout | None:
    """The run's episodes, or None for single-turn runs (env.name=none)."""
    if cfg.env.name == "none":
        return None
    if world.size > 1:
        raise ConfigError(
            "env.name={!r} runs on one process: multi-turn episodes are not gathered across ranks yet; "
            "launch without torchrun (trainer.parallel=none)".format(cfg.env.name)
        )
    return EnvRollout(cfg)


def overlong_lengths(completions, cfg: Any):
    """DAPO's soft overlong punishment (Eq. 13) reads how close a response came to where it is cut: a single-turn
    completion's length against `budget.max_new_tokens`; an episode's whole length after the prompt (the policy's
    and the environment's tokens) against `env.max_tokens`, where the rollout cuts an episode. Returns
    ([B] lengths on the CPU, L_max)."""
    if completions.env_mask is None:
        return completions.lengths.cpu(), int(cfg.budget.max_new_tokens)
    env_tokens = (completions.env_mask * completions.mask).sum(1)
    return (completions.lengths + env_tokens).cpu(), int(cfg.env.max_tokens)
