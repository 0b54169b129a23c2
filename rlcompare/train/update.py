"""The update: `trainer.updates_per_rollout` optimizer steps over one rollout batch, in two parts.

`plan_update(batch, targets, cfg, world)` decides, without touching a model, how the update walks the batch: its
mini-batches (whole groups where there are enough, so each prompt's forward is shared by its completions; else
rows), each optimizer step's rows on this rank, less the idle rows (`trainer.skip_zero_advantage`), in
micro-batches, and how many micro-batches fsdp pads every rank to. `run_update(plan, batch, targets, old_logp,
learner)` only reads the plan: per optimizer step the forward and backward of each micro-batch
(`objective.total_loss`), the gradient sum over ranks, the NaN guard, the optimizer step; the metrics reduced over
micro-batches and ranks (`MetricsAccumulator`).

Shapes as in `rlcompare.train.batch`: `B` rows (completions), groups of `G` contiguous rows, `T` completion positions.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch

from rlcompare import fast  # the speed layer's door: recorded_update_forward, FlopObserver
from rlcompare.algos import estimator_specs, losses, objective, surrogate_specs
from rlcompare.train import offpolicy as off_policy
from rlcompare.train import sharding
from rlcompare.train.batch import RolloutBatch, Targets
from rlcompare.train.logprobs import CompletionForward
from rlcompare.train.parallel import GradientSum, World, merge_metrics


# ----------------------------------------------------------------------------- the plan
@dataclass
class StepPlan:
    """One optimizer step of an update, as this rank computes it."""

    rows: torch.Tensor  # the step's rows, every rank's (CPU long indices into the batch)
    share: slice  # the positions of this rank's share within `rows`
    mine: torch.Tensor  # this rank's rows that compute a loss (its share less the idle rows), on the device
    idle: torch.Tensor  # this rank's idle rows (objective 0, not computed), on the device
    micro: list  # `mine` in micro-batches
    n_micro: int  # the most micro-batches any rank runs (fsdp pads to it); len(micro) otherwise


@dataclass
class UpdatePlan:
    """How one update walks the batch: its optimizer steps and what they share."""

    steps: list  # [StepPlan] per optimizer step
    grouped: bool  # mini-batches hold whole groups (the prompt's forward shared by its completions)
    micro_rows: int | None  # rows per micro-batch (trainer.micro_batch_size, rounded to whole groups); None: whole
    idle: torch.Tensor | None  # (B,) bool, rows whose loss is exactly 0 (trainer.skip_zero_advantage), or None
    n_idle: int
    total_tokens: float  # the whole rollout batch's loss tokens (every aggregation's normalizer)
    group_tokens: torch.Tensor | None  # (B,) each row's group token count (prompt-mean-token-mean), or None


@dataclass
class UpdateResult:
    metrics: dict  # reduced over the update (MetricsAccumulator.reduced)
    skipped: int  # optimizer steps the NaN guard skipped
    nonfinite: str | None  # which quantity made the first skip: "loss" | "gradient norm"
    idle_rows_frac: float  # rows the zero-advantage skip left out
    n_updates: int  # mini-batches (optimizer steps)


def splits_by_groups(cfg: Any, n_groups: int) -> bool:
    """Whether a batch of `n_groups` whole groups is cut into mini-batches of whole groups (`plan_update`)."""
    return cfg.trainer.group_size > 1 and n_groups >= cfg.trainer.updates_per_rollout


def reads_step_statistics(algo: Any) -> bool:
    """Whether the loss reads statistics of all the tokens of one optimizer step: the top-entropy threshold
    (arXiv 2506.01939) or Clip-Cov / KL-Cov's covariance selection (arXiv 2505.22617)."""
    return algo.top_entropy_quantile is not None or surrogate_specs.spec(algo.surrogate).selects_tokens


def plan_update(
    batch: RolloutBatch,
    targets: Targets,
    cfg: Any,
    world: World,
    *,
    order: torch.Tensor | None = None,
    generator: torch.Generator | None = None,
) -> UpdatePlan:
    """Mini-batch partitioning: whole groups per mini-batch where there are enough groups, so each prompt's
    forward/backward is shared by its completions (grouped_sequence_logits); else rows. Then, for each
    optimizer step, the rows this rank computes and their micro-batches (`_plan_step`).

    order: the step's group order drawn before sampling (`collect.group_order`), used when the plan is grouped
    and it has one entry per group; else the order (of groups, or of rows) is drawn here from `generator`."""
    algo, train_cfg = cfg.algorithm, cfg.trainer
    B, G = len(batch), train_cfg.group_size
    n_groups = B // G
    grouped = n_groups * G == B and splits_by_groups(cfg, n_groups)
    if grouped:
        drawn = order is not None and len(order) == n_groups
        order = order if drawn else torch.randperm(n_groups, generator=generator)
        minibatches = [group_rows(g, G) for g in torch.tensor_split(order, train_cfg.updates_per_rollout)]
    else:
        order = torch.randperm(B, generator=generator)
        minibatches = [mb for mb in torch.tensor_split(order, train_cfg.updates_per_rollout) if len(mb)]
    device = targets.loss_mask.device
    idle = idle_rows(targets, G if grouped else 1, cfg)
    micro_rows = train_cfg.micro_batch_size and (
        max(G, train_cfg.micro_batch_size // G * G) if grouped else train_cfg.micro_batch_size
    )
    # prompt-mean-token-mean: each row's group token count over the whole batch (mini-batches may split groups)
    group_tokens = (
        losses.group_token_counts(targets.loss_mask, G) if algo.aggregation == "prompt-mean-token-mean" else None
    )
    return UpdatePlan(
        steps=[_plan_step(rows, G if grouped else 1, idle, micro_rows, world, device) for rows in minibatches],
        grouped=grouped,
        micro_rows=micro_rows,
        idle=idle,
        n_idle=int(idle.sum()) if idle is not None else 0,
        total_tokens=float(targets.loss_mask.sum()),
        group_tokens=group_tokens,
    )


def _plan_step(rows: torch.Tensor, unit: int, idle, micro_rows, world: World, device) -> StepPlan:
    """One optimizer step's rows on this rank: its share of `rows` (whole units of `unit` rows), less the idle
    rows (trainer.skip_zero_advantage), in micro-batches of `micro_rows`. Under fsdp every rank runs as many
    micro-batches as the rank with the most: the batch and the idle rows are the same on every rank, so each
    rank counts them all here rather than asking the others."""

    def computed(rank: int | None) -> tuple[torch.Tensor, torch.Tensor]:
        share = world.share_rows(rows, unit, rank).to(device)
        if idle is None:
            return share, share[:0]
        return share[~idle[share]], share[idle[share]]  # whole groups when grouped

    def n_micro(m: torch.Tensor) -> int:
        return 0 if not len(m) else 1 if not micro_rows else math.ceil(len(m) / micro_rows)

    mine, idle_here = computed(None)
    micro = [] if not len(mine) else ([mine] if not micro_rows else list(torch.split(mine, micro_rows)))
    ranks = range(world.size) if world.shards else ()
    return StepPlan(
        rows=rows,
        share=world.row_share(len(rows), unit),
        mine=mine,
        idle=idle_here,
        micro=micro,
        n_micro=max([len(micro)] + [n_micro(computed(r)[0]) for r in ranks]),
    )


def idle_rows(targets: Targets, unit: int, cfg: Any) -> torch.Tensor | None:
    """With trainer.skip_zero_advantage: a [B] bool mask of rows whose policy loss is exactly 0 (every
    advantage 0, in whole groups of `unit` rows), or None when skipping them would change the update:
    a KL term in the loss (a reference: algorithm.kl.coef > 0), an entropy bonus or a critic (GAE) make every
    row count, and so do the statistics over every row of an optimizer step (`reads_step_statistics`)."""
    algo, train_cfg = cfg.algorithm, cfg.trainer
    if (
        not train_cfg.skip_zero_advantage
        or algo.kl.coef > 0
        or algo.entropy_coef > 0
        or estimator_specs.spec(algo.advantage.estimator).needs.critic
    ):
        return None
    if reads_step_statistics(algo):  # the entropy threshold and the covariance are over every row
        return None
    adv = targets.advantages
    zero = (adv.reshape(adv.shape[0], -1) == 0).all(1).to(targets.loss_mask.device)
    return zero.view(-1, unit).all(1).repeat_interleave(unit) if unit > 1 else zero


def group_rows(groups: torch.Tensor, group_size: int) -> torch.Tensor:
    """The batch rows of the groups `groups` ([g] long), group by group."""
    return (groups[:, None] * group_size + torch.arange(group_size)).reshape(-1)


# ----------------------------------------------------------------------------- running it
@dataclass
class Learner:
    """What an update trains and with what, as the trainer holds it at the update (`Trainer.learner`)."""

    cfg: Any  # the run's config: algorithm.*, trainer.*
    world: World
    model: torch.nn.Module  # the module the update trains: the policy, or under trainer.parallel=fsdp its shards
    policy_model: torch.nn.Module  # the policy itself: the sampler's weights (the step statistics' forward)
    params: list  # the trained parameters of `model`
    opt: torch.optim.Optimizer
    sched: Any  # the LR schedule, stepped once per update
    critic: torch.nn.Module | None  # PPO's value model, or None
    critic_opt: torch.optim.Optimizer | None
    grad_sum: GradientSum  # over several ranks: the gradients summed as the backward produces them
    forward: CompletionForward
    policy_settings: losses.PolicySettings  # the surrogate and its typed settings
    vocab_size: int  # the tokenizer's: the entropy mix's normalizer (log V)
    generator: torch.Generator  # Cov selection's draws (the run's shuffle generator, checkpointed)
    step: int  # the trainer's step (trainer.inject_nan_at_step)
    flop_observer: fast.FlopObserver | None = None  # the benchmark's FLOP count of the fast path


def run_update(
    plan: UpdatePlan, batch: RolloutBatch, targets: Targets, old_logp: torch.Tensor | None, learner: Learner
) -> UpdateResult:
    """`trainer.updates_per_rollout` optimizer steps, one per mini-batch of the plan, each summed over
    micro-batches; the LR schedule steps once. old_logp: (B, T) the ratio's old log-probs, or None (one update
    per batch is on-policy: old = current, detached)."""
    metrics = MetricsAccumulator()
    skipped, nonfinite = 0, None
    learner.model.train()
    for i, step in enumerate(plan.steps):
        _zero_grad(learner)
        _count_idle_rows(step.idle, batch, metrics)
        if plan.idle is not None and not len(step.mine):  # all idle: zero gradients, so AdamW steps as unskipped
            for p in learner.params:
                p.grad = torch.zeros_like(p)
        # statistics of the whole optimizer step (top-entropy threshold, Cov selection): from a forward
        # without graph when the step is split in micro-batches or across ranks, else from the step's own forward
        selection = (
            _shared_selection(batch, targets, step, old_logp, plan, learner)
            if len(step.micro) > 1 or learner.world.size > 1
            else None
        )
        totals, first = [], 0
        for j, idx in enumerate(step.micro):
            sel = None if selection is None else {k: v[first : first + len(idx)] for k, v in selection.items()}
            first += len(idx)
            if j == len(step.micro) - 1:
                learner.grad_sum.arm()  # this backward's gradients are the step's: their sums start as they come
            micro = MicroBatch(idx, first_minibatch=i == 0, selection=sel)
            totals.append(micro_step(batch, targets, old_logp, micro, plan, learner, metrics))
        _pad_micro_steps(batch, step.rows, step.n_micro - len(step.micro), plan.grouped, learner)
        # the sum over ranks (the mini-batch's gradient), and whether any rank's loss was NaN/inf: one flag
        # that rides the sum's barrier, not every rank's totals
        nonfinite_loss = learner.grad_sum.finish(not all(math.isfinite(v) for v in totals))
        bad = _optimizer_step(nonfinite_loss, metrics, learner)
        if bad:
            skipped += 1  # a NaN/inf loss or gradient: this update (policy and critic) skipped
            nonfinite = nonfinite or bad
    learner.sched.step()
    metrics.merge_ranks(learner.world)
    return UpdateResult(
        metrics.reduced(),
        skipped=skipped,
        nonfinite=nonfinite,
        idle_rows_frac=plan.n_idle / len(batch),
        n_updates=len(plan.steps),
    )


@dataclass
class MicroBatch:
    """One micro-batch of an optimizer step."""

    rows: torch.Tensor  # (b,) long, its rows of the batch, on the device
    first_minibatch: bool  # of the update's first optimizer step: the weights are still the sampler's
    selection: dict | None  # the step's token selection at these rows (`_shared_selection`), or None: its own


def micro_step(
    batch: RolloutBatch,
    targets: Targets,
    old_logp,
    micro: MicroBatch,
    plan: UpdatePlan,
    learner: Learner,
    metrics: MetricsAccumulator,
) -> float:
    """Forward, total_loss and backward of one micro-batch; returns its total loss."""
    algo, train_cfg, idx = learner.cfg.algorithm, learner.cfg.trainer, micro.rows
    completions = batch.completions
    ids, mask, loss_mask = completions.ids[idx], completions.mask[idx], targets.loss_mask[idx]
    own = completions.policy_mask[idx]  # the policy's tokens (mask less the environment's, in episodes)
    # the entropy bonus needs its gradient; otherwise it is a metric (and DHPO's mix weight): no graph
    logp, entropy = _update_stats(batch, idx, plan.grouped, micro.first_minibatch, algo.entropy_coef > 0, learner)
    logp = logp * own
    old = old_logp[idx] if old_logp is not None else logp.detach()
    selection = micro.selection
    if selection is None:
        selection = token_selection(targets, idx, logp.detach(), old, entropy.detach(), learner)
    token_weight, extra = _token_weight(targets, idx, loss_mask, selection.get("keep"))
    if off_policy.logs_gap(algo, learner.cfg.rollout):  # |log pi_theta / pi_behav| of the policy being updated
        extra.update(off_policy.gap_metrics(logp, completions.logp[idx] if completions.logp is not None else None, own))
    mixes_entropy = algo.ratio == "hybrid" and algo.clip.mix == "entropy"
    values = (
        learner.critic(batch.prompt_ids[idx], batch.prompt_mask[idx], ids, mask) if learner.critic is not None else None
    )
    norm = losses.Normalizers(
        total_tokens=plan.total_tokens,
        total_seqs=len(batch),
        group_size=train_cfg.group_size,
        horizon=algo.horizon,
        group_tokens=plan.group_tokens[idx] if plan.group_tokens is not None else None,
    )
    loss, parts = objective.total_loss(
        logp,
        old,
        targets.advantages[idx],
        own,
        loss_mask,
        aggregation=algo.aggregation,
        norm=norm,
        policy=learner.policy_settings,
        token_weight=token_weight,
        cov_selected=selection.get("cov_selected"),
        mix_entropy=(entropy.detach() / math.log(learner.vocab_size)) if mixes_entropy else None,
        ref_logp=targets.ref_logp[idx] if targets.ref_logp is not None else None,
        kl_coef=algo.kl.coef,
        kl_estimator=algo.kl.estimator,
        kl_in_loss=algo.kl.placement == "in_loss",
        entropy=entropy,
        entropy_coef=algo.entropy_coef,
        values=values,
        old_values=targets.old_values[idx] if values is not None else None,
        returns=targets.returns[idx] if values is not None else None,
        value_coef=algo.critic.coef,
        value_clip=algo.critic.value_clip,
    )
    if train_cfg.inject_nan_at_step is not None and learner.step == train_cfg.inject_nan_at_step:
        loss = loss * float("nan")
    total = float(loss.detach())
    loss.backward()
    _add_micro_metrics(metrics, parts, extra, own, entropy.detach())
    return total


def _update_stats(batch: RolloutBatch, idx, grouped: bool, first_minibatch: bool, entropy_grad: bool, learner: Learner):
    """(log p, entropy) of the micro-batch `idx` under autograd. On the first mini-batch the weights are the
    sampler's, so the speed layer may rebuild the forward from the rollout's projections
    (`fast.recorded_update_forward`); else, or where it declines, the plain forward."""
    completions = batch.completions
    prompt_ids, prompt_mask = batch.prompt_ids[idx], batch.prompt_mask[idx]
    rebuilt = None
    if grouped and first_minibatch:

        def rebuilt(hidden: bool):
            return fast.recorded_update_forward(
                learner.model,
                completions.recording,
                idx,
                prompt_ids,
                prompt_mask,
                completions.ids[idx],
                group_size=learner.cfg.trainer.group_size,
                flop_observer=learner.flop_observer,
                hidden=hidden,
            )

    return learner.forward.stats(
        learner.model,
        prompt_ids,
        prompt_mask,
        completions.ids[idx],
        completions.mask[idx],
        grouped=grouped,
        entropy=True,
        entropy_grad=entropy_grad,
        rebuilt=rebuilt,
    )


def _zero_grad(learner: Learner) -> None:
    learner.opt.zero_grad(set_to_none=True)
    if learner.critic_opt is not None:
        learner.critic_opt.zero_grad(set_to_none=True)


def _count_idle_rows(idle_rows: torch.Tensor, batch: RolloutBatch, metrics: MetricsAccumulator) -> None:
    """Idle-row skipping (trainer.skip_zero_advantage): the rows not computed still count, with objective 0, in
    the token means."""
    if len(idle_rows):
        idle_mask = batch.completions.policy_mask[idle_rows]
        metrics.add("objective_per_token", 0.0, weight=float(idle_mask.sum()), kind="weighted")
        metrics.add("objective_per_response", 0.0, weight=_responses(idle_mask), kind="weighted")


def _pad_micro_steps(batch: RolloutBatch, step_rows, missing: int, grouped: bool, learner: Learner) -> None:
    """Under fsdp every rank must run as many forwards and backwards of the sharded copy as the others (each
    one all-gathers the weights and reduce-scatters the gradients): a rank with fewer micro-batches runs
    `missing` zero-weight ones on the step's first group (or row), the same forwards as a real one, which add
    nothing to any gradient."""
    for _ in range(missing):
        r = step_rows[: learner.cfg.trainer.group_size if grouped else 1].to(batch.completions.mask.device)
        ids, mask = batch.completions.ids[r], batch.completions.mask[r]
        logits = learner.forward.logits(learner.model, batch.prompt_ids[r], batch.prompt_mask[r], ids, mask, grouped)
        (logits.sum() * 0.0).backward()


def _optimizer_step(nonfinite_loss: bool, metrics: MetricsAccumulator, learner: Learner) -> str | None:
    """Clip the gradients and step (policy and critic), unless a loss or gradient norm is NaN/inf (the NaN
    guard): then the gradients are dropped and the quantity named."""
    max_norm = learner.cfg.trainer.max_grad_norm or float("inf")
    gnorm = sharding.full_tensor(torch.nn.utils.clip_grad_norm_(learner.params, max_norm))  # global under fsdp
    cnorm = (
        torch.nn.utils.clip_grad_norm_(learner.critic.parameters(), max_norm) if learner.critic is not None else None
    )
    bad = _nonfinite(nonfinite_loss, gnorm, cnorm)
    if bad:
        _zero_grad(learner)
        return bad
    learner.opt.step()
    if learner.critic_opt is not None:
        learner.critic_opt.step()
    if learner.world.shards:
        sharding.copy_into_full(learner.model, learner.policy_model)  # the sampler's weights: the new ones
    metrics.add("optim/grad_norm", float(gnorm))
    return None


def _nonfinite(nonfinite_loss: bool, gnorm, cnorm) -> str | None:
    """Which quantity of one update is NaN/inf: "loss", "gradient norm", or None when all are finite."""
    if nonfinite_loss:
        return "loss"
    if not torch.isfinite(gnorm) or (cnorm is not None and not torch.isfinite(cnorm)):
        return "gradient norm"
    return None


# ----------------------------------------------------------------------------- token selection and weights
def _shared_selection(batch: RolloutBatch, targets: Targets, step: StepPlan, old_logp, plan, learner: Learner) -> dict:
    """_step_selection over every row of the optimizer step (each rank computes it whole: a quantile and a
    covariance over all the step's tokens), then this rank's rows of it (`step.share` of `step.rows`)."""
    if not reads_step_statistics(learner.cfg.algorithm) or not len(step.mine):
        return {}
    rows = step.rows.to(batch.completions.mask.device)
    everything = [rows] if not plan.micro_rows else list(torch.split(rows, plan.micro_rows))
    selection = _step_selection(batch, targets, everything, old_logp, plan.grouped, learner)
    return {k: v[step.share] for k, v in selection.items()}


@torch.no_grad()
def _step_selection(
    batch: RolloutBatch, targets: Targets, micro: list, old_logp, grouped: bool, learner: Learner
) -> dict:
    """token_selection over all the micro-batches of one optimizer step, from a forward without graph (the
    weights do not change before the step); rows in the order of `micro`."""
    if not reads_step_statistics(learner.cfg.algorithm):
        return {}
    completions = batch.completions
    logps, entropies = [], []
    for idx in micro:
        ids, mask = completions.ids[idx], completions.mask[idx]
        logp, entropy = learner.forward.stats(
            learner.policy_model,
            batch.prompt_ids[idx],
            batch.prompt_mask[idx],
            ids,
            mask,
            grouped=grouped,
            entropy=True,
        )
        logps.append(logp * completions.policy_mask[idx])
        entropies.append(entropy)
    rows = torch.cat(micro)
    logp = torch.cat(logps)
    return token_selection(
        targets, rows, logp, old_logp[rows] if old_logp is not None else logp, torch.cat(entropies), learner
    )


def token_selection(targets: Targets, rows, logp, old_logp, entropy, learner: Learner) -> dict:
    """For `rows` (every row of one optimizer step): `keep`, the top-entropy tokens, and `cov_selected`, the
    tokens a selecting surrogate restricts (Clip-Cov, KL-Cov: its spec's selects_tokens); only those the config asks
    for."""
    algo = learner.cfg.algorithm
    loss_mask = targets.loss_mask[rows]
    out = {}
    if algo.top_entropy_quantile is not None:
        out["keep"] = losses.entropy_mask(entropy, loss_mask, quantile=algo.top_entropy_quantile)
    if surrogate_specs.spec(algo.surrogate).selects_tokens:
        # the shuffle generator: seeded by the run and saved in checkpoints, so a resumed run draws the same
        out["cov_selected"] = losses.cov_selection(
            logp, old_logp, targets.advantages[rows], loss_mask, learner.policy_settings, generator=learner.generator
        )
    return out


def _token_weight(targets: Targets, idx, loss_mask, keep) -> tuple[torch.Tensor | None, dict]:
    """policy_loss's token_weight: the rollout-mismatch weights times the top-entropy mask (None if neither)."""
    weight, extra = targets.token_weight, {}
    weight = None if weight is None else weight[idx]
    if keep is not None:
        extra["entropy_mask_kept_frac"] = float(keep.sum() / loss_mask.bool().sum().clamp(min=1))
        weight = keep.to(torch.float32) if weight is None else weight * keep
    return weight, extra


# ----------------------------------------------------------------------------- metrics
# how each policy metric reduces over micro-batches (and ranks); the rest are token-weighted means, but for the
# means over responses, weighted by responses
_POLICY_METRIC_KINDS = {
    "ratio_min": "min",
    "ratio_max": "max",
    "seq_ratio_min": "min",
    "seq_ratio_max": "max",
    **off_policy.GAP_METRIC_KINDS,
}
_PER_RESPONSE_METRICS = {"objective_per_response", "seq_ratio_mean"}  # a mean over responses (ratio/seq_mean)


def _add_micro_metrics(
    metrics: MetricsAccumulator, parts, extra: dict, mask: torch.Tensor, entropy: torch.Tensor
) -> None:
    """One micro-batch's loss parts and diagnostics, each with the weight that makes its reduction the whole
    mini-batch's (and the whole batch's over ranks): tokens for token means, responses for response means."""
    weight = float(mask.sum())
    if parts.kl_ref is not None:
        metrics.add("kl/ref", parts.kl_ref, weight=weight, kind="weighted")
    if parts.value is not None:
        metrics.add("loss/value", float(parts.value.detach()), kind="sum")
    metrics.add("loss/policy", float(parts.policy.detach()), kind="sum")
    for k, v in {**parts.policy_metrics, **extra}.items():
        w = _responses(mask) if k in _PER_RESPONSE_METRICS else weight
        metrics.add(k, v, weight=w, kind=_POLICY_METRIC_KINDS.get(k, "weighted"))
    entropy_mean = float((entropy * mask).sum() / mask.sum().clamp(min=1))
    metrics.add("policy/entropy", entropy_mean, weight=weight, kind="weighted")


def _responses(mask: torch.Tensor) -> float:
    """Responses with at least one real token in a (b, T) mask: the weight of a per-response mean."""
    return float((mask.sum(1) > 0).sum())


class MetricsAccumulator:
    """An update's metrics, collected per micro-batch (or optimizer step) and reduced by their kind:
    "mean" (of the values), "sum", "weighted" (mean weighted by each value's real-token count), "min", "max"."""

    def __init__(self):
        self._values: dict[str, list[tuple[float, float]]] = {}
        self._kinds: dict[str, str] = {}

    def add(self, name: str, value: float, *, weight: float = 1.0, kind: str = "mean") -> None:
        self._values.setdefault(name, []).append((value, weight))
        self._kinds[name] = kind

    def merge_ranks(self, world: World) -> None:
        """Every rank's entries (data parallelism), so that the reduction is the whole batch's."""
        self._values, self._kinds = merge_metrics(world, self._values, self._kinds)

    def reduced(self) -> dict[str, float]:
        out = {}
        for name, vals in self._values.items():
            kind = self._kinds[name]
            if kind == "sum":
                out[name] = sum(v for v, _ in vals)
            elif kind == "min":
                out[name] = min(v for v, _ in vals)
            elif kind == "max":
                out[name] = max(v for v, _ in vals)
            elif kind == "weighted":
                total = sum(w for _, w in vals)
                out[name] = sum(v * w for v, w in vals) / total if total else float("nan")
            else:
                out[name] = sum(v for v, _ in vals) / max(1, len(vals))
        return out
