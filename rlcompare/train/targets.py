"""What a rollout batch is trained toward (`Targets`): the loss mask, the reference's log-probs, the advantages
(with the critic's values or the teacher's log-probs when the estimator needs them, KL in the reward when so
placed) and the old log-probs of the surrogate's ratio.

Over several ranks each pass over the batch (reference, critic, teacher, recomputed old log-probs) runs on one
share of the groups per rank and is gathered (`TargetMaker.by_rank`), so the whole batch's costs 1/N each.
"""

from __future__ import annotations

import time
from typing import Any

import torch

from rlcompare.algos import losses, objective
from rlcompare.train import offpolicy as off_policy
from rlcompare.train import teacher as teacher_lib
from rlcompare.train.batch import RolloutBatch, Targets


def reads_sampler_logp(cfg: Any, has_reference: bool, estimator) -> bool:
    """Whether anything reads a training rollout's sampler log-probs: the old log-probs of several updates per
    batch, or PPO's KL penalty in the reward. One update per batch is on-policy and uses its own, detached."""
    algo, train_cfg = cfg.algorithm, cfg.trainer
    old = train_cfg.updates_per_rollout > 1 and not train_cfg.recompute_old_logp
    # the mismatch correction compares the trainer's recomputed old log-probs with the sampler's
    stale = cfg.rollout.staleness > 0  # the behaviour policy's log-probs: only the sampler has them
    return (
        old
        or stale
        or (has_reference and algo.kl.placement == "in_reward")
        or algo.mismatch.mode is not None
        or algo.off_policy.correction is not None
        or estimator.needs.sampler_logp  # distill: A_t = log pi_T - log pi_old, the sampler's
    )


class TargetMaker:
    """Builds a batch's `Targets` with the run's reference, critic and teacher (each None when not used)."""

    def __init__(
        self, cfg: Any, world, device, forward, policy, *, ref, critic, teacher, estimator, component_weights, autocast
    ):
        """forward: `logprobs.CompletionForward`; estimator: the advantage estimator's spec (what it needs);
        component_weights: the verifier's named reward components' weights, or None; autocast: the teacher's."""
        self.cfg, self.world, self.device, self.forward, self.policy = cfg, world, device, forward, policy
        self.ref, self.critic, self.teacher = ref, critic, teacher
        self.estimator, self.component_weights, self.autocast = estimator, component_weights, autocast
        self.teacher_cost: dict[str, float] = {}  # the last teacher pass's time/ and perf/ entries

    def advantages(self, batch: RolloutBatch) -> Targets:
        """The loss mask, the reference's log-probs, and the advantages (with KL in the reward when so placed)."""
        algo, completions, device = self.cfg.algorithm, batch.completions, self.device
        targets = Targets(
            loss_mask=objective.loss_mask(
                completions.policy_mask, completions.truncated, overlong_filter=algo.overlong.filter
            ),
            advantages=torch.empty(0),
        )
        if self.ref is not None:
            targets.ref_logp = self._token_logp_by_rank(batch, self.ref)
        kl = None  # KL in the reward: -beta * sg(kl_t) on each real token, from the sampler's log-probs
        if targets.ref_logp is not None and algo.kl.placement == "in_reward":
            kl = objective.reward_kl(
                completions.logp, targets.ref_logp, completions.policy_mask, estimator=algo.kl.estimator
            )
        values = teacher_logp = None
        needs = self.estimator.needs
        if needs.critic:  # PPO: the critic's values at rollout time
            values = self.by_rank(batch, self._values_of(batch))
        if needs.teacher:  # distillation: the teacher scores the sampled tokens, once per rollout batch
            teacher_logp = self._teacher_logp(batch)
        est = objective.advantages(
            algo.advantage.estimator,
            batch.rewards.to(device),
            completions.policy_mask,
            group_size=self.cfg.trainer.group_size,
            scale=algo.advantage.scale,
            std_ddof=algo.advantage.std_ddof,
            eps=algo.advantage.eps,
            kl=kl,
            beta=algo.kl.coef,
            values=values,
            gae_gamma=algo.critic.gamma,
            gae_lam=algo.critic.lam,
            teacher_logp=teacher_logp,
            old_logp=completions.logp,
            components=batch.reward_components.to(device) if batch.reward_components is not None else None,
            component_weights=self.component_weights if needs.reward_components else None,
            **{k: algo.advantage[k] for k in self.estimator.knobs()},
        )
        targets.advantages, targets.returns, targets.old_values = est.advantages, est.returns, est.old_values
        targets.metrics = {**est.metrics, **self.teacher_cost}
        return targets

    def old_logp(self, batch: RolloutBatch, targets: Targets, row: dict) -> torch.Tensor | None:
        """The old log-probs of the surrogate's ratio: recomputed by the trainer (and the mismatch correction's
        weights from them, into `targets`, its metrics into `row`), the sampler's, or None when one update per
        batch is on-policy."""
        algo, train_cfg, completions = self.cfg.algorithm, self.cfg.trainer, batch.completions
        if train_cfg.recompute_old_logp:
            old_logp = self.recompute_logp(batch)
            if algo.mismatch.mode is not None:  # same weights, two engines: TIS / IcePop / TRL's modes
                targets.token_weight, mm = losses.mismatch_weights(
                    old_logp,
                    completions.logp,
                    targets.loss_mask,
                    mode=algo.mismatch.mode,
                    c_min=algo.mismatch.c_min,
                    c_max=algo.mismatch.c_max,
                )
                row.update({"mismatch/" + k[len("mismatch_") :]: v for k, v in mm.items()})
            if algo.off_policy.correction is not None:  # the proximal policy against the stale behaviour policy
                off_policy.apply_correction(algo, old_logp, completions.logp, targets, row)
            return old_logp
        if train_cfg.updates_per_rollout > 1 or self.cfg.rollout.staleness:
            return completions.logp  # the sampler's log-probs: the behaviour policy's, temperature applied
        return None  # one update per batch is on-policy: old = current (detached) is exact

    def recompute_logp(self, batch: RolloutBatch) -> torch.Tensor:
        """(B, T) the policy's current log-probs of the batch's completions (trainer.recompute_old_logp)."""
        self.policy.model.eval()
        return self._token_logp_by_rank(batch, lambda fn: fn(self.policy.model))

    def by_rank(self, batch: RolloutBatch, rows_fn):
        """`rows_fn(rows)` -> a (b, ...) tensor for the rows `rows` of the batch: computed by each rank for its share
        of the groups and gathered, so the whole batch's (reference log-probs, critic values) cost 1/N each."""
        if self.world.size == 1:
            return rows_fn(slice(None))
        return self.world.gather_rows(rows_fn(self.world.row_share(len(batch), self.cfg.trainer.group_size)))

    def _teacher_logp(self, batch: RolloutBatch) -> torch.Tensor:
        """(B, T) log pi_T of the sampled tokens at the rollout temperature (as the policy's, so that a teacher
        equal to the student gives 0), chunked, one share of the groups per rank; its cost into the row."""
        t0 = time.perf_counter()
        completions, G = batch.completions, self.cfg.trainer.group_size

        def logp(r):
            ids, mask = completions.ids[r], completions.mask[r]
            return teacher_lib.teacher_token_logp(
                self.teacher,
                batch.prompt_ids[r],
                batch.prompt_mask[r],
                ids,
                mask,
                group_size=G,
                temperature=self.cfg.rollout.temperature,
                autocast_dtype=self.autocast,
            )

        out = self.by_rank(batch, logp)
        seconds = time.perf_counter() - t0
        scored = int(completions.mask.sum())
        self.teacher_cost = {"time/teacher_s": seconds, "perf/teacher_tokens_per_s": scored / max(seconds, 1e-9)}
        return out

    def _token_logp_by_rank(self, batch: RolloutBatch, run_on) -> torch.Tensor:
        """(B, T) log-probs of the batch's completions, 0 on padding, without graph, under `run_on(fn)`: `fn(model)`
        with the reference's weights (`self.ref`) or the policy's; one share of the groups per rank (`by_rank`)."""
        completions = batch.completions

        @torch.no_grad()
        def logp(r):
            ids, mask = completions.ids[r], completions.mask[r]
            stats = run_on(lambda m: self.forward.stats(m, batch.prompt_ids[r], batch.prompt_mask[r], ids, mask))
            return stats[0] * completions.policy_mask[r]  # 0 on padding and on an episode's environment tokens

        return self.by_rank(batch, logp)

    def _values_of(self, batch: RolloutBatch):
        completions = batch.completions

        @torch.no_grad()
        def values(r):
            mask = completions.mask[r]
            return self.critic(batch.prompt_ids[r], batch.prompt_mask[r], completions.ids[r], mask) * mask

        return values
