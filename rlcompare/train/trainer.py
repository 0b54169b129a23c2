"""The training loop: rollout -> verifier -> advantages -> clipped-surrogate updates, under a token budget.

`train(cfg)` is the whole run; the CLI is a thin Hydra wrapper around it, and tests call it on
configs built with Hydra's compose API.
"""

from __future__ import annotations

import random
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from omegaconf import DictConfig

from rlcompare import fast  # the speed layer's door: recorded_update_forward, Recording, FlopObserver
from rlcompare.algos import estimator_specs, losses, objective
from rlcompare.algos.batch_stats import length_stats, weight_shares
from rlcompare.config import ConfigError, check_eval_fits_context, check_fits_context
from rlcompare.data.prompts import PromptStream, build_prompts
from rlcompare.models import Policy, ReferenceModel, ValueModel, load_policy
from rlcompare.rewards.pool import score_batch
from rlcompare.rewards.registry import build_verifier
from rlcompare.rollout import left_pad, sample
from rlcompare.rollout.streams import GroupStreams, group_seed
from rlcompare.rollout.vllm_engine import VllmSampler
from rlcompare.train import collect as collect_lib
from rlcompare.train import env_rollout, evaluation, logprobs, sharding, throughput
from rlcompare.train import update as update_lib
from rlcompare.train.batch import Collected, RolloutBatch, Targets, TrainerState
from rlcompare.train.update import UpdateResult
from rlcompare.train.parallel import GradientSum, World
from rlcompare.train import offpolicy as off_policy
from rlcompare.train import teacher as teacher_lib
from rlcompare.train.stale_queue import Queued, StaleQueue
from rlcompare.train.prompt_ids import EncodedPrompt, encode_prompts

TIMING_PREFIXES = ("time/", "perf/", "memory/")  # what varies with the machine, not with the run


def _row_name(key: str) -> str:
    """A metric's name in the row: its own when namespaced (`loss/value`), `offpolicy/<kind>` for the off-policy
    gaps, `ratio/seq_*` for GSPO's sequence ratio, else `policy/<name>` (what a surrogate clips, masks or gates)."""
    if key in losses.SEQ_RATIO_NAMES:
        return losses.SEQ_RATIO_NAMES[key]
    if "/" in key:
        return key
    if key.startswith("offpolicy_"):
        return "offpolicy/" + key[len("offpolicy_") :]
    return "policy/" + key


def _variant_metrics() -> tuple:
    """What the surrogates clip/mask/gate (their specs' metrics, every registered one) and the token weights,
    logged as policy/<name>."""
    surrogate_metrics = [k for keys in losses.SURROGATE_METRICS.values() for k in keys]
    return tuple(dict.fromkeys(surrogate_metrics + ["token_weight_mean", "entropy_mask_kept_frac"]))


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


def pick_device(name: str) -> str:
    if name == "cuda" and not torch.cuda.is_available():
        raise ConfigError("device=cuda but no CUDA device is visible; use device=auto or device=cpu")
    if name == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return name


# ----------------------------------------------------------------------------- the trainer
class Trainer:
    def __init__(self, cfg: DictConfig, run_dir: Path, *, splits=None, verifier=None, world: World | None = None):
        """`splits` and `verifier` default to building them from the config (run.train passes its preflight's).
        `world`: this process's rank in a data-parallel run (`rlcompare.train.parallel`); default one process.

        No process-wide side effects: torch's thread count and the malloc setting are the train entry's
        (`rlcompare.train.run.apply_process_settings`)."""
        self.cfg = cfg
        self.run_dir = run_dir
        self.world = world if world is not None else World()
        algo, train_cfg = cfg.algorithm, cfg.trainer
        self.device = pick_device(cfg.device)
        _seed_everything(cfg.seed)
        self.splits = splits if splits is not None else build_prompts(cfg.prompts)
        self.verifier = verifier if verifier is not None else build_verifier(cfg.verifier)
        self.policy: Policy = load_policy(cfg, self.splits, self.device, log=self.log)
        ctx = self.policy.context_length
        check_fits_context(cfg.budget, ctx, f"({ctx} positions)")  # the one context-length check (rlcompare.config)
        check_eval_fits_context(cfg, ctx, f"({ctx} positions)")
        self.eval_counts: dict | None = None  # the last sampled eval's per-prompt counts (`evaluate`)
        tok = self.policy.tokenizer
        enc = dict(
            chat=cfg.prompts.chat,
            system_prompt=cfg.prompts.system_prompt,
            max_prompt_tokens=cfg.budget.max_prompt_tokens,
        )
        self.train_prompts, self.dropped_train = encode_prompts(self.splits.train, tok, split="train", **enc)
        self.eval_prompts, self.dropped_eval = encode_prompts(self.splits.eval, tok, split="eval", **enc)
        self.eos_ids = torch.tensor(self.policy.eos_ids(), device=self.device)
        self.pad_id = tok.pad_token_id
        model = self.policy.model
        self.autocast = _autocast_dtype(self.device, model)
        # how the update, the reference and the recomputed old log-probs run a model over completions
        self.forward = logprobs.CompletionForward(
            cfg.trainer.group_size, cfg.rollout.temperature, self.autocast, not cfg.model.gradient_checkpointing
        )
        # what the update trains: the policy itself, or under trainer.parallel=fsdp its sharded copy, whose weights
        # are gathered into the policy after every optimizer step (rlcompare.train.sharding)
        self.update_model = sharding.shard_copy(model, self.world.comm_device) if self.world.shards else model
        self.params = [p for p in self.update_model.parameters() if p.requires_grad]
        # the first update on a batch reuses the sampler's projections where the speed layer can (rlcompare.fast)
        self._recording: fast.Recording | None = None  # the last rollout's, whose buffers the next may reuse
        self._order: torch.Tensor | None = None  # the step's mini-batch order of its groups, once drawn
        self.queue = StaleQueue(cfg.rollout.staleness)  # rollouts sampled ahead (rollout.staleness > 0)
        self.flop_observer: fast.FlopObserver | None = None  # the benchmark's FLOP count of the fast path
        self.opt = _adamw(
            self.params, lr=train_cfg.lr, betas=tuple(train_cfg.betas), weight_decay=train_cfg.weight_decay
        )
        self.sched = torch.optim.lr_scheduler.LambdaLR(
            self.opt, lambda s: min(1.0, (s + 1) / max(1, train_cfg.warmup_steps))
        )
        self.ref = ReferenceModel(self.policy) if algo.kl.coef > 0 else None
        self.teacher = self._load_teacher() if cfg.teacher.path is not None else None  # on-policy distillation
        self._teacher_cost: dict[str, float] = {}  # the last teacher pass's time/ and perf/ entries
        self.critic = self.critic_opt = None
        self.estimator = estimator_specs.spec(algo.advantage.estimator)  # what it needs from the run
        # the weights of the verifier's named reward components (verifier.name=weighted), or None: one reward
        self._component_weights = tuple(float(w) for _, w in getattr(self.verifier, "components", ())) or None
        if self.estimator.needs.critic:
            self.critic = ValueModel(model).to(self.device)
            self.critic_opt = _adamw(self.critic.parameters(), lr=algo.critic.lr, betas=tuple(train_cfg.betas))
        # over several ranks: the trained weights' gradients summed as the backward produces them
        self.grad_sum = GradientSum(self.world, self._replicated_params())
        self.gen = torch.Generator(device=self.device)
        self.gen.manual_seed(cfg.seed)
        self.shuffle_gen = torch.Generator()
        self.shuffle_gen.manual_seed(cfg.seed + 1)
        self.stream = PromptStream(self.train_prompts, cfg.prompts.data_seed)
        self.state = TrainerState()
        self.env = env_rollout.build(cfg, self.world)  # multi-turn episodes (env.name), or None: single-turn
        self.vllm, self.sampler = self._samplers()  # what samples rollouts and eval alike
        # the surrogate and its typed settings (objective.total_loss's `policy`), checked once here
        self.policy_settings = losses.PolicySettings.from_knobs(
            surrogate=algo.surrogate, ratio=algo.ratio, **dict(algo.clip)
        )

    def _load_teacher(self) -> teacher_lib.Teacher:
        """The frozen teacher, on the policy's device in the policy's dtype unless teacher.dtype says otherwise,
        checked against the student's tokenizer and embedding rows (the run's preflight checked the rest)."""
        tcfg, model = self.cfg.teacher, self.policy.model
        wanted = tcfg.device or self.device
        teacher_lib.check_same_device(pick_device(wanted) if wanted == "auto" else wanted, self.device)
        dtype = getattr(torch, tcfg.dtype) if tcfg.dtype else next(model.parameters()).dtype
        teacher = teacher_lib.load_teacher(str(tcfg.path), dtype=dtype, device=self.device, revision=tcfg.revision)
        student = self.cfg.model.name if self.cfg.model.kind == "tiny" else str(self.cfg.model.name_or_path)
        teacher_lib.check_same_tokenizer(self.policy.tokenizer, model, teacher, student)
        self.log(
            f"[rlcompare] teacher {tcfg.path} loaded ({teacher_lib.parameter_count(teacher) / 1e6:.2f}M parameters)"
        )
        return teacher

    def _samplers(self) -> tuple[VllmSampler | None, Any]:
        """(the vLLM engine or None, the sampler): `rollout.sample`, or under rollout.engine=vllm a colocated vLLM
        engine with the sampler's signature, whose weights `push_rollout_weights` refreshes."""
        engine = self._build_vllm() if self.cfg.rollout.engine == "vllm" else None
        return engine, engine if engine is not None else sample

    def _build_vllm(self) -> VllmSampler:
        """The vLLM engine on the policy's weights, sized for the largest batch and the longest sequence sampled."""
        cfg = self.cfg
        if self.world.size > 1:  # trainer.parallel=auto under torchrun (ddp / fsdp are refused by the schema)
            raise ConfigError(
                "rollout.engine=vllm runs one process; launch without torchrun or use rollout.engine=auto"
            )
        new = max(cfg.budget.max_new_tokens, cfg.eval.max_new_tokens or 0)
        ctx = self.policy.context_length
        longest = cfg.budget.max_prompt_tokens + new
        rows = max(
            cfg.trainer.prompts_per_step * cfg.trainer.group_size,
            cfg.trainer.eval_batch_size,
            cfg.eval.samples * max(1, cfg.trainer.eval_batch_size // max(1, cfg.eval.samples)),
        )
        return VllmSampler(
            self.policy.model, max_model_len=min(longest, ctx or longest), max_num_seqs=rows, seed=cfg.seed
        )

    def push_rollout_weights(self) -> float | None:
        """The vLLM engine takes the policy's current weights; the seconds it took (perf/weight_sync_s), or None
        when the sampler reads the policy itself."""
        return self.vllm.push(self.policy.model) if self.vllm is not None else None

    def weights_loaded(self) -> None:
        """The policy's weights were replaced (a checkpoint, rank 0's broadcast): the sharded copy takes them."""
        if self.world.shards:
            sharding.copy_into_shards(self.policy.model, self.update_model)

    # ------------------------------------------------------------------ helpers
    def log(self, msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    def _sample(
        self,
        prompts: list[EncodedPrompt],
        *,
        repeat: int,
        greedy: bool,
        reuse_recording: bool = False,
        streams: GroupStreams | None = None,
        trains_these: bool = False,
        width: int | None = None,
        round_: int = 0,
        groups: list[int] | None = None,
    ):
        """`repeat` completions of each prompt; returns the prompts (each repeated `repeat` times) and their mask, and
        the `Completions`. reuse_recording: the last rollout's batch is done with, so its recording's buffers may
        be rewritten. streams: one random stream per prompt (`rollout.streams=group`), else the run's generator.
        trains_these: over several ranks, whether this rank's update trains on these very groups (`collect.round_shares`);
        only then is anything recorded for the update to rebuild from, and never for fsdp's sharded copy.
        width: the prompts' padded width (the whole round's, over several ranks: the recording's then fits the
        gathered batch); else the longest of these. round_, groups: the sampling round and these prompts' indices in
        it (`collect.round_shares`), which key an episode's environment seed."""
        if self.env is not None:  # multi-turn episodes: the same sampler, turn after turn (rlcompare.train.env_rollout)
            return self.env.sample(
                self, prompts, repeat=repeat, greedy=greedy, streams=streams, round_=round_, groups=groups, width=width
            )
        prompt_ids, prompt_mask = left_pad([p.ids for p in prompts], self.pad_id, self.device, width)
        own = self.world.size == 1 or (trains_these and not self.world.shards)
        record = not greedy and repeat > 1 and bool(self.cfg.trainer.update_from_rollout) and own
        record = record and not self.cfg.rollout.staleness  # a stale rollout's activations are not the update's
        if record and reuse_recording and self._recording is not None:
            record = self._recording
        self.policy.model.eval()
        completions = self.sampler(
            self.policy.model,
            prompt_ids,
            prompt_mask,
            max_new_tokens=self.cfg.budget.max_new_tokens,
            eos_id=self.eos_ids,
            pad_id=self.pad_id,
            temperature=self.cfg.rollout.temperature,
            top_p=self.cfg.rollout.top_p,
            greedy=greedy,
            generator=self.gen,
            autocast_dtype=self.autocast,
            repeats=repeat,
            kv_cache=self.cfg.rollout.kv_cache,
            engine=self.cfg.rollout.engine,
            sync_every=self.cfg.rollout.sync_every,
            flop_observer=self.flop_observer,
            record=record,
            logprobs=not greedy and self._reads_sampler_logp(),
            streams=streams,
        )
        if completions.recording is not None:
            self._recording = completions.recording
        if repeat > 1:  # the update needs every completion's prompt
            prompt_ids, prompt_mask = prompt_ids.repeat_interleave(repeat, 0), prompt_mask.repeat_interleave(repeat, 0)
        return prompt_ids, prompt_mask, completions

    def _reads_sampler_logp(self) -> bool:
        """Whether anything reads the sampler's log-probs: the old log-probs of several updates per batch, or
        PPO's KL penalty in the reward. One update per batch is on-policy and uses its own, detached."""
        algo, train_cfg = self.cfg.algorithm, self.cfg.trainer
        old = train_cfg.updates_per_rollout > 1 and not train_cfg.recompute_old_logp
        # the mismatch correction compares the trainer's recomputed old log-probs with the sampler's
        stale = self.cfg.rollout.staleness > 0  # the behaviour policy's log-probs: only the sampler has them
        return (
            old
            or stale
            or (self.ref is not None and algo.kl.placement == "in_reward")
            or algo.mismatch.mode is not None
            or algo.off_policy.correction is not None
            or self.estimator.needs.sampler_logp  # distill: A_t = log pi_T - log pi_old, the sampler's
        )

    def _decode(self, completions) -> list[str]:
        # the tensor itself, not .tolist(): transformers converts a tensor in one call but type-checks every element
        # of nested lists (0.5 vs 0.74 ms for 128 x 16 ids)
        return self.policy.tokenizer.batch_decode(
            completions.ids.masked_fill(completions.mask == 0, self.pad_id), skip_special_tokens=True
        )

    def _score(self, prompts: list[EncodedPrompt], completions, repeat: int, *, components: bool = False):
        """(texts, rewards (B,), correct (B,), errors), and with `components` the reward components (B, K) when the
        estimator reads them (gdpo) and the verifier has them (weighted)."""
        if completions.outcome is not None:  # episodes: scored by their environment
            return env_rollout.scored(completions.outcome)
        texts = self._decode(completions)
        answers = [p.example.answer for p in prompts for _ in range(repeat)]
        scores = score_batch(self.verifier, texts, answers, timeout_s=self.cfg.verifier.timeout_s)
        rewards = torch.tensor([s.reward for s in scores], dtype=torch.float32)
        correct = torch.tensor([s.correct for s in scores], dtype=torch.bool)
        errors = sum(s.error for s in scores)
        if not (components and self.estimator.needs.reward_components and self._component_weights):
            return texts, rewards, correct, errors
        K = len(self._component_weights)  # an error scored no component: each 0, as its reward
        comps = torch.tensor([s.components or (0.0,) * K for s in scores], dtype=torch.float32).reshape(-1, K)
        return texts, rewards, correct, errors, comps

    # ------------------------------------------------------------------ one step
    def step(self) -> dict:
        """One training step: collect (sample + score), advantages, the update over mini-batches, the metrics row."""
        t_start = time.perf_counter()
        throughput.reset_peak_memory(self.device)
        self.state.step += 1
        if self.world.mode != "none":  # torch's own RNG (dropout) keyed by (seed, step, rank): resumes exactly
            torch.manual_seed(group_seed(self.cfg.seed, self.state.step, self.world.rank))
        collected, sampled_at = self._rollout_to_train()
        self.state.tokens += collected.generated_tokens
        row = self._collect_metrics(collected)
        if self.cfg.rollout.staleness:
            row["offpolicy/staleness"] = self.state.step - sampled_at  # updates between sampling and training
        t_update = time.perf_counter()
        batch, trained = collected.batch, None
        if batch is None:  # dynamic sampling kept no informative group: no update
            self.state.skipped_updates += 1
            row["optim/skipped_updates"] = self.state.skipped_updates
        else:
            row.update(self._batch_metrics(batch))
            if not bool(torch.isfinite(batch.rewards).all()):  # a verifier's nan/inf would poison the advantages
                self._skip_update_for_nonfinite_rewards(batch, row)
            else:
                targets = self.advantages(batch)
                row.update(targets.metrics)
                row.update(
                    weight_shares(
                        targets.loss_mask.cpu(),
                        batch.correct,
                        self.cfg.algorithm.aggregation,
                        self.cfg.algorithm.horizon,
                        group_size=self.cfg.trainer.group_size,
                    )
                )
                old_logp = self._old_logp(batch, targets, row)
                with self.world.lost_peers_explained():  # fsdp's own collectives: a lost peer said as ddp says it
                    up = self.update(batch, targets, old_logp)
                row.update(self._update_metrics(up))
                trained = batch
        if self.vllm is not None:  # the next rollout samples the updated weights
            row["perf/weight_sync_s"] = self.push_rollout_weights() if trained is not None else 0.0
        return self._finish_row(row, collected, t_start, t_update, trained)

    # ------------------------------------------------------------------ collect: sample + score
    def _rollout_to_train(self) -> tuple[Collected, int]:
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
            sample=lambda prompts, **kw: self._sample(prompts, repeat=G, greedy=False, **kw),
            score=lambda prompts, completions: self._score(prompts, completions, G, components=True),
            pad_id=self.pad_id,
            device=self.device,
            with_logp=self._reads_sampler_logp(),
        )
        self.state.verifier_errors += collected.verifier_errors
        return collected

    def _by_rank(self, batch: RolloutBatch, rows_fn):
        """`rows_fn(rows)` -> a (b, ...) tensor for the rows `rows` of the batch: computed by each rank for its share
        of the groups and gathered, so the whole batch's (reference log-probs, critic values) cost 1/N each."""
        if self.world.size == 1:
            return rows_fn(slice(None))
        return self.world.gather_rows(rows_fn(self.world.row_share(len(batch), self.cfg.trainer.group_size)))

    # ------------------------------------------------------------------ advantages
    def advantages(self, batch: RolloutBatch) -> Targets:
        """The loss mask, the reference's log-probs, and the advantages (with KL in the reward when so placed)."""
        algo, completions = self.cfg.algorithm, batch.completions
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
            values = self._by_rank(batch, self._values_of(batch))
        if needs.teacher:  # distillation: the teacher scores the sampled tokens, once per rollout batch
            teacher_logp = self._teacher_logp(batch)
        est = objective.advantages(
            algo.advantage.estimator,
            batch.rewards.to(self.device),
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
            components=batch.reward_components.to(self.device) if batch.reward_components is not None else None,
            component_weights=self._component_weights if needs.reward_components else None,
            **{k: algo.advantage[k] for k in self.estimator.knobs()},
        )
        targets.advantages, targets.returns, targets.old_values = est.advantages, est.returns, est.old_values
        targets.metrics = {**est.metrics, **self._teacher_cost}
        return targets

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

        out = self._by_rank(batch, logp)
        seconds = time.perf_counter() - t0
        scored = int(completions.mask.sum())
        self._teacher_cost = {"time/teacher_s": seconds, "perf/teacher_tokens_per_s": scored / max(seconds, 1e-9)}
        return out

    def _token_logp_by_rank(self, batch: RolloutBatch, run_on) -> torch.Tensor:
        """(B, T) log-probs of the batch's completions, 0 on padding, without graph, under `run_on(fn)`: `fn(model)`
        with the reference's weights (`self.ref`) or the policy's; one share of the groups per rank (`_by_rank`)."""
        completions = batch.completions

        @torch.no_grad()
        def logp(r):
            ids, mask = completions.ids[r], completions.mask[r]
            stats = run_on(lambda m: self.forward.stats(m, batch.prompt_ids[r], batch.prompt_mask[r], ids, mask))
            return stats[0] * completions.policy_mask[r]  # 0 on padding and on an episode's environment tokens

        return self._by_rank(batch, logp)

    def _values_of(self, batch: RolloutBatch):
        completions = batch.completions

        @torch.no_grad()
        def values(r):
            mask = completions.mask[r]
            return self.critic(batch.prompt_ids[r], batch.prompt_mask[r], completions.ids[r], mask) * mask

        return values

    def _old_logp(self, batch: RolloutBatch, targets: Targets, row: dict) -> torch.Tensor | None:
        """The old log-probs of the surrogate's ratio: recomputed by the trainer (and the mismatch correction's
        weights from them, into `targets`), the sampler's, or None when one update per batch is on-policy."""
        algo, train_cfg, completions = self.cfg.algorithm, self.cfg.trainer, batch.completions
        if train_cfg.recompute_old_logp:
            old_logp = self._recompute_logp(batch)
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

    # ------------------------------------------------------------------ metrics
    def _collect_metrics(self, collected: Collected) -> dict[str, Any]:
        return {
            "step": self.state.step,
            "tokens/step": collected.generated_tokens,
            "tokens/generated": self.state.tokens,
            "sampling/rounds": collected.rounds,
            "sampling/groups_drawn": collected.groups_drawn,
            "sampling/groups_dropped": collected.groups_dropped,
            **(self.env.metrics() if self.env is not None else {}),  # tokens/env, env/* (episodes)
        }

    def _batch_metrics(self, batch: RolloutBatch) -> dict[str, Any]:
        completions, rewards = batch.completions, batch.rewards
        grp = rewards.view(-1, self.cfg.trainer.group_size)
        return {
            "reward/mean": float(rewards.mean()),
            "reward/std": float(rewards.std()) if len(rewards) > 1 else 0.0,
            "accuracy/train": float(batch.correct.float().mean()),
            "groups/zero_variance_frac": float((grp.max(1).values == grp.min(1).values).float().mean()),
            **length_stats(completions.lengths.cpu(), batch.correct, completions.truncated.cpu()),
        }

    def _skip_update_for_nonfinite_rewards(self, batch: RolloutBatch, row: dict) -> None:
        """A verifier returned nan/inf: skip this step's update (and count it), the LR schedule still moves."""
        self.sched.step()
        self.state.skipped_updates += min(self.cfg.trainer.updates_per_rollout, len(batch))
        self.state.note_nonfinite("reward")
        row["optim/skipped_updates"] = self.state.skipped_updates
        row.update({"optim/nonfinite": 1, "optim/lr": self.sched.get_last_lr()[0]})

    def _update_metrics(self, up: UpdateResult) -> dict[str, Any]:
        self.state.skipped_updates += up.skipped
        if self.state.applied_updates is not None:
            self.state.applied_updates += up.n_updates - up.skipped
        self.state.note_nonfinite(up.nonfinite if up.skipped else None)
        m = up.metrics
        names = losses.ROW_NAMES
        row = {
            "optim/skipped_updates": self.state.skipped_updates,
            "optim/nonfinite": int(up.skipped > 0),
            names["objective_per_token"]: m.get("objective_per_token"),
            names["objective_per_response"]: m.get("objective_per_response"),
            "objective/optimized": -m.get("loss/policy", float("nan")),
            **{names[k]: m.get(k) for k in ("clip_frac_low", "clip_frac_high", "dual_clip_frac")},
            **{names[k]: m.get(k) for k in ("ratio_mean", "ratio_min", "ratio_max", "approx_kl")},
            "kl/ref": m.get("kl/ref"),
            "policy/entropy": m.get("policy/entropy"),
            "loss/policy": m.get("loss/policy"),
            "update/idle_rows_frac": up.idle_rows_frac,
            "loss/value": m.get("loss/value"),
            "optim/grad_norm": m.get("optim/grad_norm"),
            "optim/lr": self.sched.get_last_lr()[0],
        }
        # then everything else the update reported, by declaration, no allow-list: the surrogate's own metrics (its
        # spec's, first, in their order), the off-policy gaps, and any other name (the sequence ratio, DHPO's branch)
        first = [k for k in _variant_metrics() if k in m] + [k for k in off_policy.GAP_METRIC_KINDS if k in m]
        for k in dict.fromkeys(first + list(m)):
            if k not in names:
                row.setdefault(_row_name(k), m[k])
        return row

    def _step_tokens(self, collected: Collected, trained: RolloutBatch | None) -> throughput.StepTokens:
        """The tokens the step ran through the model, by kind of pass (for its model FLOPs)."""
        G, batch = self.cfg.trainer.group_size, collected.batch
        prompt = int(batch.prompt_mask[::G].sum()) if batch is not None else 0  # once per group
        return throughput.StepTokens(
            generated=collected.generated_tokens,
            prefilled=prompt,
            updated=int(trained.completions.mask.sum()) if trained is not None else 0,
            update_prompt=prompt if trained is not None else 0,
            extra_forwards=(self.ref is not None)
            + bool(self.cfg.trainer.recompute_old_logp)
            + (self.critic is not None),
            critic=self.critic is not None,
        )

    def _perf_metrics(self, collected: Collected, trained: RolloutBatch | None, update_s: float, step_s: float):
        """perf/ and memory/ entries of the row (docs/metrics.md); the device's peak is probed once per process."""
        tokens = self._step_tokens(collected, trained)
        dtype = self.autocast or next(self.policy.model.parameters()).dtype
        return {
            **throughput.perf_metrics(
                tokens=tokens,
                rollout_s=collected.rollout_s,
                update_s=update_s,
                step_s=step_s,
                flops=throughput.step_flops(throughput.product_params(self.policy.model), tokens),
                peak=throughput.peak_flops(str(self.device), dtype),
                ranks=self.world.size,
            ),
            "memory/peak_gib": throughput.peak_memory_gib(str(self.device)),
        }

    def _finish_row(
        self, row: dict, collected: Collected, t_start: float, t_update: float, trained: RolloutBatch | None
    ) -> dict:
        row.setdefault("optim/nonfinite", 0)
        row["verifier/errors"] = self.state.verifier_errors
        now = time.perf_counter()
        self.state.elapsed += now - t_start
        row.update(
            {
                "time/rollout_s": collected.rollout_s,
                "time/scoring_s": collected.scoring_s,
                "time/update_s": now - t_update,
                "time/step_s": now - t_start,
                "time/elapsed_s": self.state.elapsed,
                "perf/tokens_per_s": collected.generated_tokens / max(now - t_start, 1e-9),
                **self._perf_metrics(collected, trained, now - t_update, now - t_start),
            }
        )
        return row

    # ------------------------------------------------------------------ eval
    def evaluate(self) -> tuple[dict, list[dict]]:
        """The held-out eval's row metrics and sample rows: greedy (eval.samples=0, `_evaluate_greedy`), else
        eval.samples completions per prompt from the eval's own streams (`rlcompare.train.evaluation`), with the
        greedy accuracy too when eval.greedy. The per-prompt correct counts of a sampled eval are left in
        `self.eval_counts` ({"n": [...], "c": [...]}; None after a greedy one) for the run folder."""
        self.eval_counts = None
        if not self.cfg.eval.samples:
            return self._evaluate_greedy()
        row, samples, self.eval_counts = evaluation.evaluate_sampled(self)
        if self.cfg.eval.greedy:
            greedy, samples = self._evaluate_greedy()
            row["eval/accuracy"] = greedy["eval/accuracy"]
            row["eval/tokens"] += round(greedy["eval/mean_length"] * greedy["eval/n"])
        return row, samples

    def _evaluate_greedy(self) -> tuple[dict, list[dict]]:
        """Greedy held-out accuracy, over the chunks of `trainer.eval_batch_size` prompts. Over several ranks each
        rank decodes its share of every chunk's rows, padded to the chunk's width as one process pads the whole
        chunk, and the counts are summed: the default's 200 prompts are one chunk, which one rank alone would
        decode while the others wait."""
        train_cfg = self.cfg.trainer
        correct, lengths, samples = 0, 0.0, []
        for i in range(0, len(self.eval_prompts), train_cfg.eval_batch_size):
            chunk = self.eval_prompts[i : i + train_cfg.eval_batch_size]
            mine = self.world.share(len(chunk))
            part = chunk[mine]
            if not part:  # fewer prompts in the chunk than ranks
                continue
            width = max(len(p.ids) for p in chunk)
            _, _, completions = self._sample(part, repeat=1, greedy=True, width=width)
            texts, rewards, corr, _ = self._score(part, completions, 1)
            correct += int(corr.sum())
            lengths += float(completions.lengths.sum())
            for j in range(min(len(part), train_cfg.n_samples_logged - mine.start)):
                example = part[j].example
                samples.append(
                    (
                        i + mine.start + j,
                        {
                            "step": self.state.step,
                            "prompt": example.prompt[: train_cfg.sample_max_chars],
                            "completion": texts[j][: train_cfg.sample_max_chars],
                            "answer": example.answer[: train_cfg.sample_max_chars],
                            "reward": float(rewards[j]),
                            "correct": bool(corr[j]),
                        },
                    )
                )
        if self.world.size > 1:
            parts = self.world.gather_objects((correct, lengths, samples))
            correct, lengths = sum(p[0] for p in parts), sum(p[1] for p in parts)
            samples = sorted((s for p in parts for s in p[2]), key=lambda s: s[0])
        n = len(self.eval_prompts)
        samples = [s for _, s in samples[: train_cfg.n_samples_logged]]
        return {"eval/accuracy": correct / n, "eval/mean_length": lengths / n, "eval/n": n}, samples

    def _recompute_logp(self, batch: RolloutBatch) -> torch.Tensor:
        self.policy.model.eval()
        return self._token_logp_by_rank(batch, lambda fn: fn(self.policy.model))


def _autocast_dtype(device: str, model) -> torch.dtype | None:
    """bfloat16 autocast on a CUDA device that supports it, for float32 weights; else None (the weights' dtype)."""
    if device == "cuda" and torch.cuda.is_bf16_supported() and next(model.parameters()).dtype == torch.float32:
        return torch.bfloat16
    return None


def _adamw(params, **kw):
    """AdamW with the fused kernel where torch has one for these tensors (2.5x faster on the CPU), else the loop."""
    params = list(params)
    try:
        return torch.optim.AdamW(params, fused=True, **kw)
    except (RuntimeError, TypeError, ValueError):
        return torch.optim.AdamW(params, **kw)


def _seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)
