"""What samples and scores completions, handed explicitly to whoever does: the trainer's rollouts, the held-out
eval (`rlcompare.train.evaluation`) and the multi-turn episodes (`rlcompare.train.env_rollout`).

`RolloutContext` holds the policy, the sampler (`rollout.sample` or the vLLM engine), the verifier, the run's
generator and the settings they read; it is built once by the trainer and never holds the trainer itself. Its
`sample` draws completions (or episodes, with an environment) and `score` scores them.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Callable

import torch

from rlcompare.rewards.pool import score_batch
from rlcompare.rewards.registry import metric_table
from rlcompare.rollout import left_pad
from rlcompare.rollout.request import SamplingRequest
from rlcompare.rollout.streams import GroupStreams
from rlcompare.train.parallel import World
from rlcompare.train.prompt_ids import EncodedPrompt


@dataclass(frozen=True)
class RolloutContext:
    """The policy, its sampler and verifier, and the settings a rollout, an eval or an episode reads."""

    cfg: Any  # the run's config, read-only: rollout., eval., budget., verifier., trainer.'s eval and logging sizes
    policy: Any  # models.Policy: the model sampled and its tokenizer
    sampler: Callable  # rollout.sample, or the colocated vLLM engine with its signature (rollout.engine=vllm)
    verifier: Any  # scores single-turn completions (episodes are scored by their environment)
    world: World  # this process's rank in a data-parallel run
    device: str
    # a training rollout's draw: the run's rollout settings (budget.max_new_tokens, rollout.temperature, top_p, the
    # speed settings), its EOS and pad ids; each call sets greedy, repeats and logprobs, the eval and the episodes
    # replace what they draw otherwise (`dataclasses.replace`)
    request: SamplingRequest
    generator: torch.Generator  # the run's rollout generator (when no group streams are given)
    reads_sampler_logp: bool  # whether anything reads a training rollout's sampler log-probs (`Trainer`)
    # the weights of the verifier's named reward components when the estimator reads them (gdpo with
    # verifier.name=weighted), else None: one reward per completion
    component_weights: tuple[float, ...] | None
    env: Any = None  # env_rollout.EnvRollout: multi-turn episodes (env.name), or None: single-turn

    @property
    def tokenizer(self):
        return self.policy.tokenizer

    @property
    def pad_id(self) -> int:
        return self.request.pad_id

    def sample(
        self,
        prompts: list[EncodedPrompt],
        *,
        repeat: int,
        greedy: bool,
        streams: GroupStreams | None = None,
        width: int | None = None,
        record=False,
        flop_observer=None,
        rollout: int = 0,
        round_: int = 0,
        groups: list[int] | None = None,
    ):
        """`repeat` completions of each prompt with the run's rollout settings: (the prompts, each repeated `repeat`
        times, their mask, the `Completions`). streams: one random stream per prompt (`rollout.streams=group`),
        else the run's generator. width: the prompts' padded width, else the longest of these. record / flop_observer:
        the speed layer's (`rollout.sample`). rollout, round_, groups: the rollout index, the sampling round and
        these prompts' indices in it (`collect.round_shares`), which key an episode's environment seed."""
        if self.env is not None:  # multi-turn episodes: the same sampler, turn after turn (train.env_rollout)
            return self.env.sample(
                self,
                prompts,
                repeat=repeat,
                greedy=greedy,
                streams=streams,
                rollout=rollout,
                round_=round_,
                groups=groups,
                width=width,
            )
        prompt_ids, prompt_mask = left_pad([p.ids for p in prompts], self.pad_id, self.device, width)
        request = replace(self.request, greedy=greedy, repeats=repeat, logprobs=not greedy and self.reads_sampler_logp)
        self.policy.model.eval()
        completions = self.sampler(
            self.policy.model,
            prompt_ids,
            prompt_mask,
            request,
            generator=self.generator,
            streams=streams,
            record=record,
            flop_observer=flop_observer,
        )
        if repeat > 1:  # the update needs every completion's prompt
            prompt_ids, prompt_mask = prompt_ids.repeat_interleave(repeat, 0), prompt_mask.repeat_interleave(repeat, 0)
        return prompt_ids, prompt_mask, completions

    def decode(self, completions) -> list[str]:
        # the tensor itself, not .tolist(): transformers converts a tensor in one call but type-checks every element
        # of nested lists (0.5 vs 0.74 ms for 128 x 16 ids)
        return self.tokenizer.batch_decode(
            completions.ids.masked_fill(completions.mask == 0, self.pad_id), skip_special_tokens=True
        )

    def score(self, prompts: list[EncodedPrompt], completions, repeat: int, *, components: bool = False) -> Scored:
        """The completions scored (`Scored`), `repeat` per prompt. With `components`, the reward components when
        the run reads them (`component_weights`). The verifier's declared metrics come with every scoring (the
        training row's verifier/<name>, the eval row's eval/verifier/<name>). Episodes are scored by their
        environment (its errors are counted under env/errors, not here)."""
        if completions.outcome is not None:
            o = completions.outcome
            return Scored(o.texts, o.rewards.clone(), o.correct.clone(), 0)
        texts = self.decode(completions)
        answers = [p.example.answer for p in prompts for _ in range(repeat)]
        scores = score_batch(self.verifier, texts, answers, timeout_s=self.cfg.verifier.timeout_s)
        scored = Scored(
            texts,
            torch.tensor([s.reward for s in scores], dtype=torch.float32),
            torch.tensor([s.correct for s in scores], dtype=torch.bool),
            sum(s.error for s in scores),
        )
        if components and self.component_weights:
            K = len(self.component_weights)  # an error scored no component: each 0, as its reward
            comps = [s.components or (0.0,) * K for s in scores]
            scored.components = torch.tensor(comps, dtype=torch.float32).reshape(-1, K)
        names = getattr(self.verifier, "declared_metrics", ())
        if names:  # a name it did not declare stops the run here, naming it
            table = metric_table(scores, names, self.cfg.verifier.name)
            scored.metrics = torch.tensor(table, dtype=torch.float32).reshape(-1, len(names))
        return scored


@dataclass
class Scored:
    """What scoring B completions gave (CPU tensors)."""

    texts: list[str]  # (B,) decoded, as the verifier read them
    rewards: torch.Tensor  # (B,) float32
    correct: torch.Tensor  # (B,) bool
    errors: int  # completions the verifier failed on (an episode's errors are its environment's: 0 here)
    components: torch.Tensor | None = None  # (B, K) float32 named reward components, when the run reads them
    metrics: torch.Tensor | None = None  # (B, M) float32 the verifier's declared metrics (nan: not reported)


def rollout_request(cfg: Any, eos_ids: list[int], pad_id: int, autocast: torch.dtype | None) -> SamplingRequest:
    """A training rollout's `SamplingRequest` from the run's config (budget., rollout.), built once per run."""
    r = cfg.rollout
    return SamplingRequest(
        max_new_tokens=cfg.budget.max_new_tokens,
        eos_ids=tuple(int(i) for i in eos_ids),
        pad_id=pad_id,
        temperature=r.temperature,
        top_p=r.top_p,
        autocast=str(autocast).removeprefix("torch.") if autocast is not None else None,
        kv_cache=r.kv_cache,
        engine=r.engine,
        sync_every=r.sync_every,
    )
