"""`Trainer`: one run's training state and its step: rollout -> verifier -> advantages -> clipped-surrogate
updates -> the metrics row, under a token budget.

The trainer owns what a step changes (the policy and its optimizer, the critic, the generators, the prompt
stream, the stale-rollout queue, the counters in `TrainerState`) and wires the parts that do the work, each
handed explicit inputs rather than the trainer: sampling and scoring go through a `RolloutContext`
(`train.context`; the held-out eval in `train.evaluation` and the episodes in `train.env_rollout` receive the
same), the targets through a `TargetMaker` (`train.targets`), the update through an `update.Learner`, and the
row is assembled by `train.row`. `run.train(cfg)` drives it (the loop, checkpoints, eval cadence, logging); the
CLI is a thin Hydra wrapper around that, and tests call it on configs built with Hydra's compose API.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

import torch
from omegaconf import DictConfig

from rlcompare import fast  # the speed layer's door: recorded_update_forward, Recording, FlopObserver
from rlcompare.algos import estimator_specs, losses
from rlcompare.algos.batch_stats import weight_shares
from rlcompare.config import check_eval_fits_context, check_fits_context
from rlcompare.data.prompts import PromptStream, build_prompts
from rlcompare.models import Policy, ReferenceModel, ValueModel, load_policy
from rlcompare.rewards.registry import build_verifier
from rlcompare.rollout.streams import group_seed
from rlcompare.train import build
from rlcompare.train import collect as collect_lib
from rlcompare.train import env_rollout, evaluation, logprobs, sharding, throughput
from rlcompare.train import row as row_lib
from rlcompare.train import update as update_lib
from rlcompare.train.batch import Collected, RolloutBatch, Targets, TrainerState
from rlcompare.train.build import pick_device
from rlcompare.train.context import RolloutContext, rollout_request
from rlcompare.train.parallel import GradientSum, World
from rlcompare.train.prompt_ids import EncodedPrompt, encode_prompts
from rlcompare.train.stale_queue import Queued, StaleQueue
from rlcompare.train.targets import TargetMaker, reads_sampler_logp
from rlcompare.train.update import UpdateResult

TIMING_PREFIXES = ("time/", "perf/", "memory/")  # what varies with the machine, not with the run


# ----------------------------------------------------------------------------- run folder
def default_run_name(cfg: Any) -> str:
    return cfg.run_name or f"{cfg.algorithm.name}__s{cfg.seed}"


def resolve_run_dir(cfg: Any) -> Path:
    """The Hydra job's output dir when run by Hydra, else results_dir/experiment/run_name."""
    if isinstance(cfg.resume, str) and cfg.resume not in ("true", "false", "True", "False"):
        return Path(cfg.resume)
    try:
        from hydra.core.hydra_config import HydraConfig

        if HydraConfig.initialized():
            return Path(HydraConfig.get().runtime.output_dir)
    except Exception:
        pass
    return Path(cfg.results_dir) / cfg.experiment / default_run_name(cfg)


# ----------------------------------------------------------------------------- the trainer
class Trainer:
    """One run's training state and its `step()`; `evaluate()` runs the held-out eval (module docstring)."""

    def __init__(self, cfg: DictConfig, run_dir: Path, *, splits=None, verifier=None, world: World | None = None):
        """`splits` and `verifier` default to building them from the config (run.train passes its preflight's).
        `world`: this process's rank in a data-parallel run (`rlcompare.train.parallel`); default one process.

        No process-wide side effects: torch's thread count and the malloc setting are the train entry's
        (`rlcompare.train.run.apply_process_settings`)."""
        self.cfg = cfg
        self.run_dir = run_dir
        self.world = world if world is not None else World()
        algo = cfg.algorithm
        self.device = pick_device(cfg.device)
        build.seed_everything(cfg.seed)
        self.splits = splits if splits is not None else build_prompts(cfg.prompts)
        self.verifier = verifier if verifier is not None else build_verifier(cfg.verifier)
        self.policy: Policy = load_policy(cfg, self.splits, self.device, log=self.log)
        ctx = self.policy.context_length
        check_fits_context(cfg.budget, ctx, f"({ctx} positions)")  # the one context-length check (rlcompare.config)
        check_eval_fits_context(cfg, ctx, f"({ctx} positions)")
        self.eval_counts: dict | None = None  # the last sampled eval's per-prompt counts (`evaluate`)
        self._encode_prompts()  # train_prompts, eval_prompts and those dropped as too long
        self.pad_id = self.policy.tokenizer.pad_token_id
        model = self.policy.model
        self.autocast = build.autocast_dtype(self.device, model)
        # how the update, the reference and the recomputed old log-probs run a model over completions
        self.forward = logprobs.CompletionForward(
            cfg.trainer.group_size, cfg.rollout.temperature, self.autocast, not cfg.model.gradient_checkpointing
        )
        estimator = estimator_specs.spec(algo.advantage.estimator)  # what it needs from the run
        self._build_models(estimator)  # the trained weights, their optimizers, the reference, teacher and critic
        # the first update on a batch reuses the sampler's projections where the speed layer can (rlcompare.fast)
        self._recording: fast.Recording | None = None  # the last rollout's, whose buffers the next may reuse
        self._order: torch.Tensor | None = None  # the step's mini-batch order of its groups, once drawn
        self.queue = StaleQueue(cfg.rollout.staleness)  # rollouts sampled ahead (rollout.staleness > 0)
        self.flop_observer: fast.FlopObserver | None = None  # the benchmark's FLOP count of the fast path
        # the weights of the verifier's named reward components (verifier.name=weighted) when the estimator reads
        # them (gdpo), or None: one reward
        components = tuple(float(w) for _, w in getattr(self.verifier, "components", ())) or None
        components = components if estimator.needs.reward_components else None
        self.gen = torch.Generator(device=self.device)
        self.gen.manual_seed(cfg.seed)
        self.shuffle_gen = torch.Generator()
        self.shuffle_gen.manual_seed(cfg.seed + 1)
        self.stream = PromptStream(self.train_prompts, cfg.prompts.data_seed)
        self.state = TrainerState()
        self.env = env_rollout.build(cfg, self.world)  # multi-turn episodes (env.name), or None: single-turn
        self.vllm, sampler = build.samplers(cfg, self.policy, self.world)  # samples rollouts and eval alike
        # what the rollouts, the held-out eval and the episodes sample and score with (not this trainer)
        self.rollouts = RolloutContext(
            cfg=cfg,
            policy=self.policy,
            sampler=sampler,
            verifier=self.verifier,
            world=self.world,
            device=self.device,
            request=rollout_request(cfg, self.policy.eos_ids(), self.pad_id, self.autocast),
            generator=self.gen,
            reads_sampler_logp=reads_sampler_logp(cfg, self.ref is not None, estimator),
            component_weights=components,
            env=self.env,
        )
        # what a batch is trained toward: the loss mask, the reference's log-probs, the advantages, the old log-probs
        self.targets = TargetMaker(
            cfg,
            self.world,
            self.device,
            self.forward,
            self.policy,
            ref=self.ref,
            critic=self.critic,
            teacher=self.teacher,
            estimator=estimator,
            component_weights=components,
            autocast=self.autocast,
        )
        # the surrogate and its typed settings (objective.total_loss's `policy`), checked once here
        self.policy_settings = losses.PolicySettings.from_knobs(
            surrogate=algo.surrogate, ratio=algo.ratio, **dict(algo.clip)
        )

    def _encode_prompts(self) -> None:
        """The train and held-out prompts as token ids (chat template, system prompt), those over
        budget.max_prompt_tokens dropped (`dropped_train`, `dropped_eval`)."""
        cfg, tok = self.cfg, self.policy.tokenizer
        enc = dict(
            chat=cfg.prompts.chat,
            system_prompt=cfg.prompts.system_prompt,
            max_prompt_tokens=cfg.budget.max_prompt_tokens,
        )
        self.train_prompts, self.dropped_train = encode_prompts(self.splits.train, tok, split="train", **enc)
        self.eval_prompts, self.dropped_eval = encode_prompts(self.splits.eval, tok, split="eval", **enc)

    def _build_models(self, estimator) -> None:
        """What the update trains and reads, built in this order (the critic's head draws from torch's RNG): the
        trained weights (the policy itself, or under trainer.parallel=fsdp its sharded copy, whose weights are
        gathered into the policy after every optimizer step: rlcompare.train.sharding), their optimizer and LR
        schedule, the reference (KL), the teacher (on-policy distillation), the critic and its optimizer (when the
        estimator needs one), and over several ranks the gradient sum of the replicated weights."""
        cfg, algo, train_cfg, model = self.cfg, self.cfg.algorithm, self.cfg.trainer, self.policy.model
        self.update_model = sharding.shard_copy(model, self.world.comm_device) if self.world.shards else model
        self.params = [p for p in self.update_model.parameters() if p.requires_grad]
        self.opt = build.adamw(
            self.params, lr=train_cfg.lr, betas=tuple(train_cfg.betas), weight_decay=train_cfg.weight_decay
        )
        self.sched = torch.optim.lr_scheduler.LambdaLR(
            self.opt, lambda s: min(1.0, (s + 1) / max(1, train_cfg.warmup_steps))
        )
        self.ref = ReferenceModel(self.policy) if algo.kl.coef > 0 else None
        teacher = cfg.teacher.path is not None
        self.teacher = build.load_teacher(cfg, self.policy, self.device, self.log) if teacher else None
        self.critic = self.critic_opt = None
        if estimator.needs.critic:
            self.critic = ValueModel(model).to(self.device)
            self.critic_opt = build.adamw(self.critic.parameters(), lr=algo.critic.lr, betas=tuple(train_cfg.betas))
        self.grad_sum = GradientSum(self.world, self._replicated_params())

    def push_rollout_weights(self) -> float | None:
        """The vLLM engine takes the policy's current weights; the seconds it took (perf/weight_sync_s), or None
        when the sampler reads the policy itself."""
        return self.vllm.push(self.policy.model) if self.vllm is not None else None

    def weights_loaded(self) -> None:
        """The policy's weights were replaced (a checkpoint, rank 0's broadcast): the sharded copy takes them."""
        if self.world.shards:
            sharding.copy_into_shards(self.policy.model, self.update_model)

    def log(self, msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    def _sample_rollout(self, prompts: list[EncodedPrompt], *, reuse_recording=False, trains_these=False, **kw):
        """A training rollout's `group_size` completions of each prompt (`RolloutContext.sample`; `kw`: streams,
        width, round_, groups). reuse_recording: the last rollout's batch is done with, so its recording's buffers
        may be rewritten. trains_these: over several ranks, whether this rank's update trains on these very groups
        (`collect.round_shares`); only then is anything recorded for the update to rebuild from, and never for
        fsdp's sharded copy."""
        G = self.cfg.trainer.group_size
        own = self.world.size == 1 or (trains_these and not self.world.shards)
        record = G > 1 and bool(self.cfg.trainer.update_from_rollout) and own
        record = record and not self.cfg.rollout.staleness  # a stale rollout's activations are not the update's
        if record and reuse_recording and self._recording is not None:
            record = self._recording
        rollout = self.state.step + len(self.queue.pending)  # = collect's rollout index
        out = self.rollouts.sample(
            prompts, repeat=G, greedy=False, record=record, flop_observer=self.flop_observer, rollout=rollout, **kw
        )
        if out[2].recording is not None:
            self._recording = out[2].recording
        return out

    # ------------------------------------------------------------------ one step
    def step(self) -> dict:
        """One training step: collect (sample + score), advantages, the update over mini-batches, the metrics row."""
        t_start = time.perf_counter()
        throughput.reset_peak_memory(self.device)
        self.state.step += 1
        if self.world.mode != "none":  # torch's own RNG (dropout) keyed by (seed, step, rank): resumes exactly
            torch.manual_seed(group_seed(self.cfg.seed, self.state.step, self.world.rank))
        collected, sampled_at = self.rollout_to_train()
        self.state.tokens += collected.generated_tokens
        row = row_lib.collect_entries(self.state.step, self.state.tokens, collected, self.env)
        if self.cfg.rollout.staleness:
            row["offpolicy/staleness"] = self.state.step - sampled_at  # updates between sampling and training
        t_update = time.perf_counter()
        batch, trained = collected.batch, None
        if batch is None:  # dynamic sampling kept no informative group: no update
            self.state.skipped_updates += 1
            row["optim/skipped_updates"] = self.state.skipped_updates
        else:
            declared = getattr(self.verifier, "declared_metrics", ())  # verifier/<name> (rewards/registry.py)
            row.update(row_lib.batch_entries(batch, self.cfg.trainer.group_size))
            row.update(row_lib.verifier_entries(batch, declared))
            if not bool(torch.isfinite(batch.rewards).all()):  # a verifier's nan/inf would poison the advantages
                self._skip_update_for_nonfinite_rewards(batch, row)
            else:
                self._train_on(batch, row)
                trained = batch
        if self.vllm is not None:  # the next rollout samples the updated weights
            row["perf/weight_sync_s"] = self.push_rollout_weights() if trained is not None else 0.0
        return self._finish_row(row, collected, t_start, t_update, trained)

    def _train_on(self, batch: RolloutBatch, row: dict) -> None:
        """The batch's targets and the update on it; their entries into `row`, the update's counts into the state."""
        algo = self.cfg.algorithm
        targets = self.targets.advantages(batch)
        row.update(targets.metrics)
        row.update(
            weight_shares(
                targets.loss_mask.cpu(),
                batch.correct,
                algo.aggregation,
                algo.horizon,
                group_size=self.cfg.trainer.group_size,
            )
        )
        old_logp = self.targets.old_logp(batch, targets, row)
        with self.world.lost_peers_explained():  # fsdp's own collectives: a lost peer said as ddp says it
            up = self.update(batch, targets, old_logp)
        self._count_update(up)
        row.update(row_lib.update_entries(up, self.state.skipped_updates, self.sched.get_last_lr()[0]))

    # ------------------------------------------------------------------ collect: sample + score
    def rollout_to_train(self) -> tuple[Collected, int]:
        """This step's rollout and the step whose weights sampled it: its own (rollout.staleness=0), else the
        oldest queued one, after sampling what the queue needs with the current weights (`StaleQueue`)."""
        if not self.cfg.rollout.staleness:
            self._order = collect_lib.group_order(self.cfg, self.shuffle_gen)
            return self.collect(), self.state.step
        for _ in range(self.queue.needs()):
            self._order = collect_lib.group_order(self.cfg, self.shuffle_gen)
            self.queue.push(Queued(self.collect(), self.state.step, self._order))
        q = self.queue.pop()
        self._order = q.order  # the update walks the batch in the order drawn with it
        return q.collected, q.sampled_at

    def collect(self) -> Collected:
        """Sample, score and (with dynamic sampling) refill until the batch holds informative groups
        (`collect.collect`, with this trainer's sampler and verifier); the verifier's errors are counted."""
        G = self.cfg.trainer.group_size
        collected = collect_lib.collect(
            self.cfg,
            self.world,
            self.stream,
            order=self._order,
            rollout=self.state.step + len(self.queue.pending),  # with staleness, the rollouts queued count
            sample=self._sample_rollout,
            score=lambda prompts, completions: self.rollouts.score(prompts, completions, G, components=True),
            pad_id=self.pad_id,
            device=self.device,
            with_logp=self.rollouts.reads_sampler_logp,
        )
        self.state.verifier_errors += collected.verifier_errors
        return collected

    # ------------------------------------------------------------------ the update
    def update(self, batch: RolloutBatch, targets: Targets, old_logp: torch.Tensor | None) -> UpdateResult:
        """`trainer.updates_per_rollout` optimizer steps, one per mini-batch, each summed over micro-batches: which
        rows this rank computes is decided once (`update.plan_update`), and `update.run_update` reads the plan."""
        plan = update_lib.plan_update(
            batch, targets, self.cfg, self.world, order=self._order, generator=self.shuffle_gen
        )
        return update_lib.run_update(plan, batch, targets, old_logp, self.learner())

    def learner(self) -> update_lib.Learner:
        """What the update trains, as this trainer holds it now (the benchmark sets `flop_observer` later)."""
        return update_lib.Learner(
            cfg=self.cfg,
            world=self.world,
            model=self.update_model,
            policy_model=self.policy.model,
            params=self.params,
            opt=self.opt,
            sched=self.sched,
            critic=self.critic,
            critic_opt=self.critic_opt,
            grad_sum=self.grad_sum,
            forward=self.forward,
            policy_settings=self.policy_settings,
            vocab_size=len(self.policy.tokenizer),
            generator=self.shuffle_gen,
            step=self.state.step,
            flop_observer=self.flop_observer,
        )

    def _replicated_params(self) -> list:
        """The trained weights every rank holds whole, whose gradients are summed here (`grad_sum`): the policy's and
        the critic's, but for the policy's under fsdp (FSDP reduce-scatters those itself)."""
        policy = [] if self.world.shards else self.params
        return policy + (list(self.critic.parameters()) if self.critic is not None else [])

    def _skip_update_for_nonfinite_rewards(self, batch: RolloutBatch, row: dict) -> None:
        """A verifier returned nan/inf: skip this step's update (and count it), the LR schedule still moves."""
        self.sched.step()
        self.state.skipped_updates += min(self.cfg.trainer.updates_per_rollout, len(batch))
        self.state.note_nonfinite("reward")
        row["optim/skipped_updates"] = self.state.skipped_updates
        row.update({"optim/nonfinite": 1, "optim/lr": self.sched.get_last_lr()[0]})

    def _count_update(self, up: UpdateResult) -> None:
        """The update's skipped and applied optimizer steps, and a skip for a non-finite value, into the state."""
        self.state.skipped_updates += up.skipped
        if self.state.applied_updates is not None:
            self.state.applied_updates += up.n_updates - up.skipped
        self.state.note_nonfinite(up.nonfinite if up.skipped else None)

    def _finish_row(
        self, row: dict, collected: Collected, t_start: float, t_update: float, trained: RolloutBatch | None
    ) -> dict:
        """The row's last entries: the verifier's errors, the step's seconds, throughput and memory."""
        row.setdefault("optim/nonfinite", 0)
        row["verifier/errors"] = self.state.verifier_errors
        now = time.perf_counter()
        self.state.elapsed += now - t_start
        update_s, step_s = now - t_update, now - t_start
        extra_forwards = (self.ref is not None) + bool(self.cfg.trainer.recompute_old_logp) + (self.critic is not None)
        tokens = row_lib.step_tokens(
            collected, trained, self.cfg.trainer.group_size, extra_forwards, critic=self.critic is not None
        )
        row.update(row_lib.timing_entries(collected, update_s, step_s, self.state.elapsed))
        row.update(
            row_lib.perf_entries(
                tokens,
                collected,
                update_s,
                step_s,
                model=self.policy.model,
                dtype=self.autocast or next(self.policy.model.parameters()).dtype,
                device=self.device,
                ranks=self.world.size,
            )
        )
        return row

    # ------------------------------------------------------------------ eval
    def evaluate(self) -> tuple[dict, list[dict]]:
        """The held-out eval's row metrics and sample rows (`evaluation.evaluate`). The per-prompt correct counts of
        a sampled eval are left in `self.eval_counts` ({"n": [...], "c": [...]}; None after a greedy one) for the
        run folder."""
        row, samples, self.eval_counts = evaluation.evaluate(self.rollouts, self.eval_prompts, self.state.step)
        return row, samples
