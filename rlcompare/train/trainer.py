"""The training loop: rollout -> verifier -> advantages -> clipped-surrogate updates, under a token budget.

`train(cfg)` is the whole run; the CLI is a thin Hydra wrapper around it, and tests call it on
configs built with Hydra's compose API.
"""

from __future__ import annotations

import math
import random
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from omegaconf import DictConfig

from rlcompare import fast  # the speed layer's door: recorded_update_forward, Recording, FlopObserver
from rlcompare.algos import advantages as adv_lib
from rlcompare.algos import losses, objective
from rlcompare.algos.batch_stats import length_stats, weight_shares
from rlcompare.config import ConfigError, check_eval_fits_context, check_fits_context
from rlcompare.data.prompts import Example, PromptStream, build_prompts
from rlcompare.models import Policy, ReferenceModel, ValueModel, load_policy
from rlcompare.rewards.verifiers import build_verifier, score_batch
from rlcompare.rollout import Completions, grouped_sequence_logits, left_pad, lm_head_of, sample, sequence_logits
from rlcompare.rollout.streams import GroupStreams, group_seed
from rlcompare.train import env_rollout, evaluation, logprobs, sharding, throughput
from rlcompare.train.batch import Collected, RolloutBatch, Targets, TrainerState
from rlcompare.train.parallel import GradientSum, World, merge_metrics
from rlcompare.train import offpolicy as off_policy
from rlcompare.train import teacher as teacher_lib
from rlcompare.train.stale_queue import Queued, StaleQueue

TIMING_PREFIXES = ("time/", "perf/", "memory/")  # what varies with the machine, not with the run
# what the surrogates clip/mask/gate and the token weights, logged as policy/<name>
_VARIANT_METRICS = tuple(
    dict.fromkeys(
        [k for keys in losses.SURROGATE_METRICS.values() for k in keys]
        + ["token_weight_mean", "entropy_mask_kept_frac"]
    )
)


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


# ----------------------------------------------------------------------------- prompts -> token ids
@dataclass
class EncodedPrompt:
    example: Example
    ids: list[int]


def encode_prompts(
    examples: list[Example], tokenizer, *, chat: bool, system_prompt: str | None, max_prompt_tokens: int, split: str
) -> tuple[list[EncodedPrompt], int]:
    """Tokenize once up front; prompts longer than budget.max_prompt_tokens are dropped (and counted)."""
    if chat and not getattr(tokenizer, "chat_template", None):
        raise ConfigError(
            "prompts.chat=true but the tokenizer has no chat template; set prompts.chat=false or use a chat model"
        )
    add_bos = tokenizer.bos_token_id is not None and not _tokenizer_adds_bos(tokenizer)
    out, dropped = [], 0
    for ex in examples:
        if chat:
            msgs = ([{"role": "system", "content": system_prompt}] if system_prompt else []) + [
                {"role": "user", "content": ex.prompt}
            ]
            text = tokenizer.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
            ids = tokenizer(text, add_special_tokens=False).input_ids
        else:
            ids = tokenizer(ex.prompt).input_ids
            if add_bos:
                ids = [tokenizer.bos_token_id] + ids
        if len(ids) > max_prompt_tokens:
            dropped += 1
            continue
        out.append(EncodedPrompt(ex, ids))
    if not out:
        raise ConfigError(f"every {split} prompt is longer than budget.max_prompt_tokens={max_prompt_tokens}; raise it")
    return out, dropped


def _tokenizer_adds_bos(tokenizer) -> bool:
    ids = tokenizer("1").input_ids
    return bool(ids) and ids[0] == tokenizer.bos_token_id


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
        self.autocast = (
            torch.bfloat16
            if self.device == "cuda"
            and torch.cuda.is_bf16_supported()
            and next(model.parameters()).dtype == torch.float32
            else None
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
        if algo.advantage.estimator == "gae":
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
        # the surrogate and its typed settings (objective.total_loss's `policy`), checked once here
        self.policy_settings = losses.PolicySettings.from_knobs(
            surrogate=algo.surrogate,
            ratio=algo.ratio,
            eps_low=algo.clip.eps_low,
            eps_high=algo.clip.eps_high,
            dual_clip=algo.clip.dual_clip,
            seq_eps_low=algo.clip.seq_eps_low,
            seq_eps_high=algo.clip.seq_eps_high,
            mix=algo.clip.mix,
            **{k: algo.clip[k] for k in losses.SURROGATE_KNOBS},
        )

    def _load_teacher(self) -> teacher_lib.Teacher:
        """The frozen teacher, on the policy's device in the policy's dtype unless teacher.dtype says otherwise,
        checked against the student's tokenizer and embedding rows (the run's preflight checked the rest)."""
        tcfg, model = self.cfg.teacher, self.policy.model
        wanted = tcfg.device or self.device
        teacher_lib.check_same_device(pick_device(wanted) if wanted == "auto" else wanted, self.device)
        dtype = getattr(torch, tcfg.dtype) if tcfg.dtype else next(model.parameters()).dtype
        teacher = teacher_lib.load_teacher(str(tcfg.path), dtype=dtype, device=self.device)
        student = self.cfg.model.name if self.cfg.model.kind == "tiny" else str(self.cfg.model.name_or_path)
        teacher_lib.check_same_tokenizer(self.policy.tokenizer, model, teacher, student)
        self.log(
            f"[rlcompare] teacher {tcfg.path} loaded ({teacher_lib.parameter_count(teacher) / 1e6:.2f}M parameters)"
        )
        return teacher

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
    ):
        """`repeat` completions of each prompt; returns the prompts (each repeated `repeat` times) and their mask, and
        the `Completions`. reuse_recording: the last rollout's batch is done with, so its recording's buffers may
        be rewritten. streams: one random stream per prompt (`rollout.streams=group`), else the run's generator.
        trains_these: over several ranks, whether this rank's update trains on these very groups (`_round_shares`);
        only then is anything recorded for the update to rebuild from, and never for fsdp's sharded copy.
        width: the prompts' padded width (the whole round's, over several ranks: the recording's then fits the
        gathered batch); else the longest of these."""
        if self.env is not None:  # multi-turn episodes: the same sampler, turn after turn (rlcompare.train.env_rollout)
            return self.env.sample(self, prompts, repeat=repeat, greedy=greedy, streams=streams)
        prompt_ids, prompt_mask = left_pad([p.ids for p in prompts], self.pad_id, self.device, width)
        own = self.world.size == 1 or (trains_these and not self.world.shards)
        record = not greedy and repeat > 1 and bool(self.cfg.trainer.update_from_rollout) and own
        record = record and not self.cfg.rollout.staleness  # a stale rollout's activations are not the update's
        if record and reuse_recording and self._recording is not None:
            record = self._recording
        self.policy.model.eval()
        completions = sample(
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
            or algo.advantage.estimator == "distill"  # A_t = log pi_T - log pi_old, the sampler's
        )

    def _decode(self, completions) -> list[str]:
        # the tensor itself, not .tolist(): transformers converts a tensor in one call but type-checks every element
        # of nested lists (0.5 vs 0.74 ms for 128 x 16 ids)
        return self.policy.tokenizer.batch_decode(
            completions.ids.masked_fill(completions.mask == 0, self.pad_id), skip_special_tokens=True
        )

    def _score(self, prompts: list[EncodedPrompt], completions, repeat: int):
        if completions.outcome is not None:  # episodes: scored by their environment
            return env_rollout.scored(completions.outcome)
        texts = self._decode(completions)
        answers = [p.example.answer for p in prompts for _ in range(repeat)]
        scores = score_batch(self.verifier, texts, answers, timeout_s=self.cfg.verifier.timeout_s)
        rewards = torch.tensor([s.reward for s in scores], dtype=torch.float32)
        correct = torch.tensor([s.correct for s in scores], dtype=torch.bool)
        errors = sum(s.error for s in scores)
        return texts, rewards, correct, errors

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
        return self._finish_row(row, collected, t_start, t_update, trained)

    # ------------------------------------------------------------------ collect: sample + score
    def _rollout_to_train(self) -> tuple[Collected, int]:
        """This step's rollout and the step whose weights sampled it: its own (rollout.staleness=0), else the
        oldest queued one, after sampling what the queue needs with the current weights (`StaleQueue`)."""
        if not self.cfg.rollout.staleness:
            self._order = self._group_order()
            return self.collect(), self.state.step
        for _ in range(self.queue.needs()):
            self._order = self._group_order()
            self.queue.push(Queued(self.collect(), self.state.step, self._order))
        q = self.queue.pop()
        self._order = q.order  # the update walks the batch in the order drawn with it
        return q.collected, q.sampled_at

    def collect(self) -> Collected:
        """Sample, score and (with dynamic sampling) refill until the batch holds informative groups."""
        cfg, algo = self.cfg, self.cfg.algorithm
        G, n_prompts = cfg.trainer.group_size, cfg.trainer.prompts_per_step
        kept, rounds, drawn, dropped, gen_tokens = [], 0, 0, 0, 0
        t_roll = t_score = 0.0
        need = n_prompts
        while need > 0:
            prompts = self.stream.take(need)
            t0 = time.perf_counter()
            shares, trains_these = self._round_shares(len(prompts), rounds)
            mine = [prompts[j] for j in shares[self.world.rank]]  # this rank's groups (all of them on one process)
            if mine:
                prompt_ids, prompt_mask, completions = self._sample(
                    mine,
                    repeat=G,
                    greedy=False,
                    reuse_recording=rounds == 0,
                    streams=self._streams(rounds, shares[self.world.rank]),
                    trains_these=trains_these,
                    width=max(len(p.ids) for p in prompts),
                )
            else:  # a refill of fewer groups than ranks: nothing for this one
                prompt_ids = prompt_mask = None
                completions = _no_completions(self.device, with_logp=self._reads_sampler_logp())
            t1 = time.perf_counter()
            _, verifier_rewards, correct, errors = self._score(mine, completions, G)
            t_score += time.perf_counter() - t1
            t_roll += t1 - t0
            if self.world.size > 1:  # every rank holds the whole round, in group order
                prompt_ids, prompt_mask, completions, verifier_rewards, correct, errors = self._gather_round(
                    prompts, shares, completions, verifier_rewards, correct, errors
                )
            self.state.verifier_errors += errors
            rounds += 1
            drawn += len(prompts)
            gen_tokens += int(completions.lengths.sum())
            rewards = verifier_rewards.clone()
            if algo.overlong.soft_punishment:
                lengths, max_len = env_rollout.overlong_lengths(completions, cfg)
                rewards = rewards + losses.overlong_penalty(
                    lengths,
                    max_len=max_len,
                    cache_len=algo.overlong.cache_len,
                    factor=algo.overlong.factor,
                )
            part = RolloutBatch(prompt_ids, prompt_mask, completions, rewards, verifier_rewards, correct, prompts)
            if algo.dynamic_sampling.enabled:
                info = adv_lib.informative_groups(rewards, G)
                dropped += int((~info).sum())
                if info.any():
                    kept.append(part.select(info.repeat_interleave(G), G))
                need = n_prompts - sum(len(k.prompts) for k in kept)
                if rounds > algo.dynamic_sampling.max_rounds:
                    break
            else:
                kept.append(part)
                need = 0
        batch = RolloutBatch.concat(kept, self.pad_id) if kept else None
        if batch is not None and len(batch.prompts) > n_prompts:
            batch = batch.select(torch.arange(len(batch.prompts) * G) < n_prompts * G, G)
        return Collected(batch, rounds, drawn, dropped, gen_tokens, t_roll, t_score)

    def _group_order(self) -> torch.Tensor | None:
        """The step's mini-batch order of its prompt groups (`_plan_update`'s), drawn before sampling where the
        batch is sure to be whole groups (no dynamic sampling), so that over several ranks each can sample the
        groups it will train on (`_round_shares`); the same draw, from the same generator, as one drawn later."""
        n = self.cfg.trainer.prompts_per_step
        if self.cfg.algorithm.dynamic_sampling.enabled or not self._splits_by_groups(n):
            return None
        return torch.randperm(n, generator=self.shuffle_gen)

    def _splits_by_groups(self, n_groups: int) -> bool:
        """Whether a batch of `n_groups` whole groups is cut into mini-batches of whole groups (`_plan_update`)."""
        return self.cfg.trainer.group_size > 1 and n_groups >= self.cfg.trainer.updates_per_rollout

    def _round_shares(self, n: int, round_: int) -> tuple[list[list[int]], bool]:
        """Every rank's prompt groups of a sampling round of `n`, and whether each rank's update trains on its own:
        on a step's first round with the mini-batch order drawn (`_group_order`), the groups each rank trains on
        in every mini-batch (`World.group_shares`), so the first update can be rebuilt from the rank's own
        rollout; else contiguous shares. What is sampled is the same either way (one stream per group)."""
        w = self.world
        if w.size > 1 and round_ == 0 and self._order is not None and len(self._order) == n:
            return w.group_shares(self._order, self.cfg.trainer.updates_per_rollout), True
        return w.shares(n), False

    def _streams(self, round_: int, mine: list[int]) -> GroupStreams | None:
        """rollout.streams=group: one stream per prompt group of this round, keyed by (seed, step, round, group)."""
        if self.cfg.rollout.streams != "group":
            return None
        # keyed by the rollout's index: the step's own, or with staleness the step plus the rollouts queued before
        rollout = self.state.step + len(self.queue.pending)
        keys = [(self.cfg.seed, rollout, round_, j) for j in mine]
        return GroupStreams(keys, self.cfg.trainer.group_size, self.device)

    def _gather_round(
        self,
        prompts: list[EncodedPrompt],
        shares: list[list[int]],
        completions: Completions,
        verifier_rewards,
        correct,
        errors,
    ):
        """The ranks' shares of one sampling round (`shares`: each rank's groups) as the whole round in group
        order, the same on every rank; this rank's recording (if any) placed at its rows."""
        w, G = self.world, self.cfg.trainer.group_size
        prompt_ids, prompt_mask = left_pad([p.ids for p in prompts], self.pad_id, self.device)
        prompt_ids, prompt_mask = prompt_ids.repeat_interleave(G, 0), prompt_mask.repeat_interleave(G, 0)

        # gathered rows come in rank order: group g's sit at the position of g in sum(shares, [])
        in_order = _group_rows(torch.argsort(torch.as_tensor(sum(shares, []), dtype=torch.long)), G)

        c = completions
        tensors, pads = zip(  # each with the value that pads a shorter share
            (c.ids, self.pad_id),
            (c.mask, 0),
            (c.logp, 0.0),
            (c.truncated, False),
            (c.lengths, 0),
            (verifier_rewards, 0.0),
            (correct, False),
            (torch.tensor([errors]), 0),
        )
        *rows, n_errors = w.gather_many(list(tensors), list(pads))
        ids, mask, logp, truncated, lengths, rewards, correct = (
            None if x is None else x[in_order.to(x.device)] for x in rows
        )
        whole = Completions(
            ids,
            mask,
            logp,
            truncated,
            lengths,
            recording=(
                completions.recording.placed(
                    _group_rows(torch.as_tensor(shares[w.rank], dtype=torch.long), G), len(prompts) * G
                )
                if completions.recording is not None
                else None
            ),
        )
        return prompt_ids, prompt_mask, whole, rewards, correct, int(n_errors.sum())

    def _by_rank(self, batch: RolloutBatch, rows_fn):
        """`rows_fn(rows)` -> a (b, ...) tensor for the rows `rows` of the batch: computed by each rank for its share
        of the groups and gathered, so the whole batch's (reference log-probs, critic values) cost 1/N each."""
        if self.world.size == 1:
            return rows_fn(slice(None))
        return self.world.gather_rows(rows_fn(self.world.row_share(len(batch), self.cfg.trainer.group_size)))

    def _logits(self, model, prompt_ids, prompt_mask, ids, mask, grouped: bool = True, hidden: bool = False):
        """Completion logits (or with `hidden` the final hidden states); rows in whole groups share their prompt's
        forward (and backward)."""
        G = self.cfg.trainer.group_size
        if grouped and G > 1 and ids.shape[0] % G == 0 and not self.cfg.model.gradient_checkpointing:
            return grouped_sequence_logits(
                model, prompt_ids, prompt_mask, ids, mask, group_size=G, autocast_dtype=self.autocast, hidden=hidden
            )
        return sequence_logits(model, prompt_ids, prompt_mask, ids, mask, autocast_dtype=self.autocast, hidden=hidden)

    def _completion_stats(
        self,
        model,
        prompt_ids,
        prompt_mask,
        ids,
        mask,
        *,
        grouped=True,
        entropy=False,
        entropy_grad=False,
        rebuilt=None,
    ):
        """(log p [b,T], entropy [b,T] or None) of the completions `ids`, temperature applied, through the LM head
        in chunks of positions where the whole logits would be large (`logprobs.completion_stats`); rebuilt(hidden):
        the speed layer's forward from the rollout's record, or None where it declines (then the plain forward)."""

        def forward(hidden: bool) -> torch.Tensor:
            out = rebuilt(hidden) if rebuilt is not None else None
            return out if out is not None else self._logits(model, prompt_ids, prompt_mask, ids, mask, grouped, hidden)

        return logprobs.completion_stats(
            forward,
            lm_head_of(model),
            ids,
            temperature=self.cfg.rollout.temperature,
            entropy=entropy,
            entropy_grad=entropy_grad,
            autocast_dtype=self.autocast,
        )

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
        if algo.advantage.estimator == "gae":  # PPO: the critic's values at rollout time
            values = self._by_rank(batch, self._values_of(batch))
        if algo.advantage.estimator == "distill":  # the teacher scores the sampled tokens, once per rollout batch
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
            gamma=algo.advantage.gamma,
            baseline=algo.advantage.baseline,
            values=values,
            gae_gamma=algo.critic.gamma,
            gae_lam=algo.critic.lam,
            teacher_logp=teacher_logp,
            old_logp=completions.logp,
            reward_coef=algo.advantage.reward_coef,
            distill_discount=algo.advantage.distill_discount,
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
            return (
                run_on(lambda m: self._completion_stats(m, batch.prompt_ids[r], batch.prompt_mask[r], ids, mask))[0]
                * completions.policy_mask[r]  # 0 on padding and on an episode's environment tokens
            )

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
        """`trainer.updates_per_rollout` optimizer steps, one per mini-batch, each summed over micro-batches. Which
        rows this rank computes is decided once, by `_plan_update`; the loop only reads the plan."""
        plan = self._plan_update(batch, targets)
        metrics = MetricsAccumulator()
        skipped, nonfinite = 0, None
        self.update_model.train()
        for i, step in enumerate(plan.steps):
            self._zero_grad()
            self._count_idle_rows(step.idle, batch, metrics)
            if plan.idle is not None and not len(step.mine):  # all idle: zero gradients, so AdamW steps as unskipped
                for p in self.params:
                    p.grad = torch.zeros_like(p)
            # statistics of the whole optimizer step (top-entropy threshold, Cov selection): from a forward
            # without graph when the step is split in micro-batches or across ranks, else from the step's own forward
            selection = (
                self._shared_selection(batch, targets, step, old_logp, plan)
                if len(step.micro) > 1 or self.world.size > 1
                else None
            )
            totals, first = [], 0
            for j, idx in enumerate(step.micro):
                sel = None if selection is None else {k: v[first : first + len(idx)] for k, v in selection.items()}
                first += len(idx)
                if j == len(step.micro) - 1:
                    self.grad_sum.arm()  # this backward's gradients are the step's: their sums start as they come
                totals.append(
                    self._micro_step(
                        batch, targets, old_logp, idx, plan, first_minibatch=i == 0, selection=sel, metrics=metrics
                    )
                )
            self._pad_micro_steps(batch, step.rows, step.n_micro - len(step.micro), plan.grouped)
            # the sum over ranks (the mini-batch's gradient), and whether any rank's loss was NaN/inf: one flag
            # that rides the sum's barrier, not every rank's totals
            nonfinite_loss = self.grad_sum.finish(not all(math.isfinite(v) for v in totals))
            bad = self._optimizer_step(nonfinite_loss, metrics)
            if bad:
                skipped += 1  # a NaN/inf loss or gradient: this update (policy and critic) skipped
                nonfinite = nonfinite or bad
        self.sched.step()
        metrics.merge_ranks(self.world)
        return UpdateResult(
            metrics.reduced(),
            skipped=skipped,
            nonfinite=nonfinite,
            idle_rows_frac=plan.n_idle / len(batch),
            n_updates=len(plan.steps),
        )

    def _replicated_params(self) -> list:
        """The trained weights every rank holds whole, whose gradients are summed here (`grad_sum`): the policy's and
        the critic's, but for the policy's under fsdp (FSDP reduce-scatters those itself)."""
        policy = [] if self.world.shards else self.params
        return policy + (list(self.critic.parameters()) if self.critic is not None else [])

    def _pad_micro_steps(self, batch: RolloutBatch, step_rows, missing: int, grouped: bool) -> None:
        """Under fsdp every rank must run as many forwards and backwards of the sharded copy as the others (each
        one all-gathers the weights and reduce-scatters the gradients): a rank with fewer micro-batches runs
        `missing` zero-weight ones on the step's first group (or row), the same forwards as a real one, which add
        nothing to any gradient."""
        for _ in range(missing):
            r = step_rows[: self.cfg.trainer.group_size if grouped else 1].to(self.device)
            ids, mask = batch.completions.ids[r], batch.completions.mask[r]
            logits = self._logits(self.update_model, batch.prompt_ids[r], batch.prompt_mask[r], ids, mask, grouped)
            (logits.sum() * 0.0).backward()

    def _shared_selection(self, batch: RolloutBatch, targets: Targets, step: StepPlan, old_logp, plan) -> dict:
        """_step_selection over every row of the optimizer step (each rank computes it whole: a quantile and a
        covariance over all the step's tokens), then this rank's rows of it (`step.share` of `step.rows`)."""
        if not self._reads_step_statistics() or not len(step.mine):
            return {}
        rows = step.rows.to(self.device)
        everything = [rows] if not plan.micro_rows else list(torch.split(rows, plan.micro_rows))
        selection = self._step_selection(batch, targets, everything, old_logp, plan.grouped)
        return {k: v[step.share] for k, v in selection.items()}

    def _plan_update(self, batch: RolloutBatch, targets: Targets) -> UpdatePlan:
        """Mini-batch partitioning: whole groups per mini-batch where there are enough groups, so each prompt's
        forward/backward is shared by its completions (grouped_sequence_logits); else rows. Then, for each
        optimizer step, the rows this rank computes and their micro-batches (`_plan_step`)."""
        algo, train_cfg = self.cfg.algorithm, self.cfg.trainer
        B, G = len(batch), train_cfg.group_size
        n_groups = B // G
        grouped = n_groups * G == B and self._splits_by_groups(n_groups)
        if grouped:
            drawn = self._order is not None and len(self._order) == n_groups
            order = self._order if drawn else torch.randperm(n_groups, generator=self.shuffle_gen)
            minibatches = [_group_rows(g, G) for g in torch.tensor_split(order, train_cfg.updates_per_rollout)]
        else:
            order = torch.randperm(B, generator=self.shuffle_gen)
            minibatches = [mb for mb in torch.tensor_split(order, train_cfg.updates_per_rollout) if len(mb)]
        idle = self._idle_rows(targets, G if grouped else 1)
        micro_rows = train_cfg.micro_batch_size and (
            max(G, train_cfg.micro_batch_size // G * G) if grouped else train_cfg.micro_batch_size
        )
        # prompt-mean-token-mean: each row's group token count over the whole batch (mini-batches may split groups)
        group_tokens = (
            losses.group_token_counts(targets.loss_mask, G) if algo.aggregation == "prompt-mean-token-mean" else None
        )
        return UpdatePlan(
            steps=[self._plan_step(rows, G if grouped else 1, idle, micro_rows) for rows in minibatches],
            grouped=grouped,
            micro_rows=micro_rows,
            idle=idle,
            n_idle=int(idle.sum()) if idle is not None else 0,
            total_tokens=float(targets.loss_mask.sum()),
            group_tokens=group_tokens,
        )

    def _plan_step(self, rows: torch.Tensor, unit: int, idle, micro_rows) -> StepPlan:
        """One optimizer step's rows on this rank: its share of `rows` (whole units of `unit` rows), less the idle
        rows (trainer.skip_zero_advantage), in micro-batches of `micro_rows`. Under fsdp every rank runs as many
        micro-batches as the rank with the most: the batch and the idle rows are the same on every rank, so each
        rank counts them all here rather than asking the others."""

        def computed(rank: int | None) -> tuple[torch.Tensor, torch.Tensor]:
            share = self.world.share_rows(rows, unit, rank).to(self.device)
            if idle is None:
                return share, share[:0]
            return share[~idle[share]], share[idle[share]]  # whole groups when grouped

        def n_micro(m: torch.Tensor) -> int:
            return 0 if not len(m) else 1 if not micro_rows else math.ceil(len(m) / micro_rows)

        mine, idle_rows = computed(None)
        micro = [] if not len(mine) else ([mine] if not micro_rows else list(torch.split(mine, micro_rows)))
        ranks = range(self.world.size) if self.world.shards else ()
        return StepPlan(
            rows=rows,
            share=self.world.row_share(len(rows), unit),
            mine=mine,
            idle=idle_rows,
            micro=micro,
            n_micro=max([len(micro)] + [n_micro(computed(r)[0]) for r in ranks]),
        )

    def _zero_grad(self) -> None:
        self.opt.zero_grad(set_to_none=True)
        if self.critic_opt is not None:
            self.critic_opt.zero_grad(set_to_none=True)

    def _count_idle_rows(self, idle_rows: torch.Tensor, batch: RolloutBatch, metrics: MetricsAccumulator) -> None:
        """Idle-row skipping (trainer.skip_zero_advantage): the rows not computed still count, with objective 0, in
        the token means."""
        if len(idle_rows):
            idle_mask = batch.completions.policy_mask[idle_rows]
            metrics.add("objective_per_token", 0.0, weight=float(idle_mask.sum()), kind="weighted")
            metrics.add("objective_per_response", 0.0, weight=_responses(idle_mask), kind="weighted")

    def _micro_step(
        self,
        batch: RolloutBatch,
        targets: Targets,
        old_logp,
        idx,
        plan: UpdatePlan,
        *,
        first_minibatch: bool,
        selection: dict | None,
        metrics: MetricsAccumulator,
    ) -> float:
        """Forward, total_loss and backward of the micro-batch `idx`; returns its total loss."""
        algo, train_cfg = self.cfg.algorithm, self.cfg.trainer
        completions = batch.completions
        ids, mask, loss_mask = completions.ids[idx], completions.mask[idx], targets.loss_mask[idx]
        own = completions.policy_mask[idx]  # the policy's tokens (mask less the environment's, in episodes)
        # the entropy bonus needs its gradient; otherwise it is a metric (and DHPO's mix weight): no graph
        logp, entropy = self._update_stats(batch, idx, plan.grouped, first_minibatch, algo.entropy_coef > 0)
        logp = logp * own
        old = old_logp[idx] if old_logp is not None else logp.detach()
        if selection is None:
            selection = self._token_selection(targets, idx, logp.detach(), old, entropy.detach())
        token_weight, extra = self._token_weight(targets, idx, loss_mask, selection.get("keep"))
        if off_policy.logs_gap(algo, self.cfg.rollout):  # |log pi_theta / pi_behav| of the policy being updated
            extra.update(
                off_policy.gap_metrics(logp, completions.logp[idx] if completions.logp is not None else None, own)
            )
        mixes_entropy = algo.ratio == "hybrid" and algo.clip.mix == "entropy"
        values = (
            self.critic(batch.prompt_ids[idx], batch.prompt_mask[idx], ids, mask) if self.critic is not None else None
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
            policy=self.policy_settings,
            token_weight=token_weight,
            cov_selected=selection.get("cov_selected"),
            mix_entropy=(entropy.detach() / math.log(len(self.policy.tokenizer))) if mixes_entropy else None,
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
        if train_cfg.inject_nan_at_step is not None and self.state.step == train_cfg.inject_nan_at_step:
            loss = loss * float("nan")
        total = float(loss.detach())
        loss.backward()
        _add_micro_metrics(metrics, parts, extra, own, entropy.detach())
        return total

    def _update_stats(self, batch: RolloutBatch, idx, grouped: bool, first_minibatch: bool, entropy_grad: bool):
        """(log p, entropy) of the micro-batch `idx` under autograd. On the first mini-batch the weights are the
        sampler's, so the speed layer may rebuild the forward from the rollout's projections
        (`fast.recorded_update_forward`); else, or where it declines, the plain forward."""
        completions = batch.completions
        prompt_ids, prompt_mask = batch.prompt_ids[idx], batch.prompt_mask[idx]
        rebuilt = None
        if grouped and first_minibatch:

            def rebuilt(hidden: bool):
                return fast.recorded_update_forward(
                    self.update_model,
                    completions.recording,
                    idx,
                    prompt_ids,
                    prompt_mask,
                    completions.ids[idx],
                    group_size=self.cfg.trainer.group_size,
                    flop_observer=self.flop_observer,
                    hidden=hidden,
                )

        return self._completion_stats(
            self.update_model,
            prompt_ids,
            prompt_mask,
            completions.ids[idx],
            completions.mask[idx],
            grouped=grouped,
            entropy=True,
            entropy_grad=entropy_grad,
            rebuilt=rebuilt,
        )

    def _optimizer_step(self, nonfinite_loss: bool, metrics: MetricsAccumulator) -> str | None:
        """Clip the gradients and step (policy and critic), unless a loss or gradient norm is NaN/inf (the NaN
        guard): then the gradients are dropped and the quantity named."""
        max_norm = self.cfg.trainer.max_grad_norm or float("inf")
        gnorm = sharding.full_tensor(torch.nn.utils.clip_grad_norm_(self.params, max_norm))  # global under fsdp
        cnorm = torch.nn.utils.clip_grad_norm_(self.critic.parameters(), max_norm) if self.critic is not None else None
        bad = _nonfinite(nonfinite_loss, gnorm, cnorm)
        if bad:
            self._zero_grad()
            return bad
        self.opt.step()
        if self.critic_opt is not None:
            self.critic_opt.step()
        if self.world.shards:
            sharding.copy_into_full(self.update_model, self.policy.model)  # the sampler's weights: the new ones
        metrics.add("optim/grad_norm", float(gnorm))
        return None

    def _reads_step_statistics(self) -> bool:
        """Whether the loss reads statistics of all the tokens of one optimizer step: the top-entropy threshold
        (arXiv 2506.01939) or Clip-Cov / KL-Cov's covariance selection (arXiv 2505.22617)."""
        algo = self.cfg.algorithm
        return algo.top_entropy_quantile is not None or algo.surrogate in losses.COV_SURROGATES

    def _token_selection(self, targets: Targets, rows, logp, old_logp, entropy) -> dict:
        """For `rows` (every row of one optimizer step): `keep`, the top-entropy tokens, and `cov_selected`, the
        tokens Clip-Cov removes / KL-Cov penalises; only those the config asks for."""
        algo = self.cfg.algorithm
        loss_mask = targets.loss_mask[rows]
        out = {}
        if algo.top_entropy_quantile is not None:
            out["keep"] = losses.entropy_mask(entropy, loss_mask, quantile=algo.top_entropy_quantile)
        if algo.surrogate in losses.COV_SURROGATES:
            # the shuffle generator: seeded by the run and saved in checkpoints, so a resumed run draws the same
            out["cov_selected"] = losses.cov_selection(
                logp, old_logp, targets.advantages[rows], loss_mask, self.policy_settings, generator=self.shuffle_gen
            )
        return out

    @torch.no_grad()
    def _step_selection(self, batch: RolloutBatch, targets: Targets, micro: list, old_logp, grouped: bool) -> dict:
        """_token_selection over all the micro-batches of one optimizer step, from a forward without graph (the
        weights do not change before the step); rows in the order of `micro`."""
        if not self._reads_step_statistics():
            return {}
        completions = batch.completions
        logps, entropies = [], []
        for idx in micro:
            ids, mask = completions.ids[idx], completions.mask[idx]
            logp, entropy = self._completion_stats(
                self.policy.model,
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
        return self._token_selection(
            targets, rows, logp, old_logp[rows] if old_logp is not None else logp, torch.cat(entropies)
        )

    def _token_weight(self, targets: Targets, idx, loss_mask, keep) -> tuple[torch.Tensor | None, dict]:
        """policy_loss's token_weight: the rollout-mismatch weights times the top-entropy mask (None if neither)."""
        weight, extra = targets.token_weight, {}
        weight = None if weight is None else weight[idx]
        if keep is not None:
            extra["entropy_mask_kept_frac"] = float(keep.sum() / loss_mask.bool().sum().clamp(min=1))
            weight = keep.to(torch.float32) if weight is None else weight * keep
        return weight, extra

    def _idle_rows(self, targets: Targets, unit: int) -> torch.Tensor | None:
        """With trainer.skip_zero_advantage: a [B] bool mask of rows whose policy loss is exactly 0 (every
        advantage 0, in whole groups of `unit` rows), or None when skipping them would change the update:
        a KL term in the loss, an entropy bonus or a critic make every row count."""
        algo, train_cfg = self.cfg.algorithm, self.cfg.trainer
        if (
            not train_cfg.skip_zero_advantage
            or self.ref is not None
            or algo.entropy_coef > 0
            or self.critic is not None
        ):
            return None
        if self._reads_step_statistics():  # the entropy threshold and the covariance are over every row
            return None
        adv = targets.advantages
        zero = (adv.reshape(adv.shape[0], -1) == 0).all(1).to(self.device)
        return zero.view(-1, unit).all(1).repeat_interleave(unit) if unit > 1 else zero

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
        return {
            "optim/skipped_updates": self.state.skipped_updates,
            "optim/nonfinite": int(up.skipped > 0),
            "objective/per_token": m.get("objective_per_token"),
            "objective/per_response": m.get("objective_per_response"),
            "objective/optimized": -m.get("loss/policy", float("nan")),
            "clip/frac_low": m.get("clip_frac_low"),
            "clip/frac_high": m.get("clip_frac_high"),
            "clip/dual_frac": m.get("dual_clip_frac"),
            "ratio/mean": m.get("ratio_mean"),
            "ratio/min": m.get("ratio_min"),
            "ratio/max": m.get("ratio_max"),
            "kl/rollout": m.get("approx_kl"),
            "kl/ref": m.get("kl/ref"),
            "policy/entropy": m.get("policy/entropy"),
            "loss/policy": m.get("loss/policy"),
            "update/idle_rows_frac": up.idle_rows_frac,
            "loss/value": m.get("loss/value"),
            "optim/grad_norm": m.get("optim/grad_norm"),
            "optim/lr": self.sched.get_last_lr()[0],
            **{"policy/" + k: m[k] for k in _VARIANT_METRICS if k in m},
            **{"offpolicy/" + k[len("offpolicy_") :]: m[k] for k in off_policy.GAP_METRIC_KINDS if k in m},
        }

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


# ----------------------------------------------------------------------------- the update's pieces
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


# how each policy metric reduces over micro-batches (and ranks); the rest are token-weighted means, but for the
# means over responses, weighted by responses
_POLICY_METRIC_KINDS = {"ratio_min": "min", "ratio_max": "max", **off_policy.GAP_METRIC_KINDS}
_PER_RESPONSE_METRICS = {"objective_per_response"}


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


def _group_rows(groups: torch.Tensor, group_size: int) -> torch.Tensor:
    """The batch rows of the groups `groups` ([g] long), group by group."""
    return (groups[:, None] * group_size + torch.arange(group_size)).reshape(-1)


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


def _no_completions(device, *, with_logp: bool) -> Completions:
    """A rank's empty share of a sampling round (0 rows), in the shapes the gather pads."""
    empty = torch.zeros((0, 0), dtype=torch.long, device=device)
    return Completions(
        empty,
        empty.clone(),
        torch.zeros((0, 0), device=device) if with_logp else None,
        torch.zeros(0, dtype=torch.bool, device=device),
        torch.zeros(0, dtype=torch.long, device=device),
    )


def _adamw(params, **kw):
    """AdamW with the fused kernel where torch has one for these tensors (2.5x faster on the CPU), else the loop."""
    params = list(params)
    try:
        return torch.optim.AdamW(params, fused=True, **kw)
    except (RuntimeError, TypeError, ValueError):
        return torch.optim.AdamW(params, **kw)


def _nonfinite(nonfinite_loss: bool, gnorm, cnorm) -> str | None:
    """Which quantity of one update is NaN/inf: "loss", "gradient norm", or None when all are finite."""
    if nonfinite_loss:
        return "loss"
    if not torch.isfinite(gnorm) or (cnorm is not None and not torch.isfinite(cnorm)):
        return "gradient norm"
    return None


def _seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)
