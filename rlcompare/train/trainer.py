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

from rlcompare.algos import advantages as adv_lib
from rlcompare.algos import losses
from rlcompare.algos.batch_stats import length_stats, weight_shares
from rlcompare.config import ConfigError
from rlcompare.models import Policy, ReferenceModel, ValueModel, load_policy
from rlcompare.data.prompts import Example, PromptStream, build_prompts
from rlcompare.fast import can_replay, keep_freed_memory, replay_logits
from rlcompare.rollout import grouped_sequence_logits, left_pad, sample, sequence_logits, token_logp
from rlcompare.rewards.verifiers import build_verifier, score_batch

TIMING_PREFIXES = ("time/", "perf/")
# what the surrogates clip/mask/gate and the token weights, logged as policy/<name>
_VARIANT_METRICS = tuple(dict.fromkeys(
    [k for keys in losses.SURROGATE_METRICS.values() for k in keys] + ["token_weight_mean", "entropy_mask_kept_frac"]))


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


def encode_prompts(examples: list[Example], tokenizer, *, chat: bool, system_prompt: str | None,
                   max_prompt_tokens: int, split: str) -> tuple[list[EncodedPrompt], int]:
    """Tokenize once up front; prompts longer than budget.max_prompt_tokens are dropped (and counted)."""
    if chat and not getattr(tokenizer, "chat_template", None):
        raise ConfigError("prompts.chat=true but the tokenizer has no chat template; set prompts.chat=false or use a chat model")
    add_bos = tokenizer.bos_token_id is not None and not _tokenizer_adds_bos(tokenizer)
    out, dropped = [], 0
    for ex in examples:
        if chat:
            msgs = ([{"role": "system", "content": system_prompt}] if system_prompt else []) + [{"role": "user", "content": ex.prompt}]
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
    def __init__(self, cfg: DictConfig, run_dir: Path, *, splits=None, verifier=None):
        """`splits` and `verifier` default to building them from the config (run.train passes its preflight's)."""
        self.cfg = cfg
        self.run_dir = run_dir
        a, t = cfg.algorithm, cfg.trainer
        self.device = pick_device(cfg.device)
        if t.threads:
            torch.set_num_threads(int(t.threads))
        if t.keep_freed_memory and self.device == "cpu":
            keep_freed_memory()
        _seed_everything(cfg.seed)
        self.splits = splits if splits is not None else build_prompts(cfg.prompts)
        self.verifier = verifier if verifier is not None else build_verifier(cfg.verifier)
        self.policy: Policy = load_policy(cfg, self.splits, self.device, log=self.log)
        ctx = self.policy.context_length
        need = cfg.budget.max_prompt_tokens + cfg.budget.max_new_tokens
        if ctx is not None and need > ctx:
            raise ConfigError(f"budget.max_prompt_tokens + budget.max_new_tokens = {need} exceeds the model's context ({ctx} positions); lower the budget")
        tok = self.policy.tokenizer
        enc = dict(chat=cfg.prompts.chat, system_prompt=cfg.prompts.system_prompt, max_prompt_tokens=cfg.budget.max_prompt_tokens)
        self.train_prompts, self.dropped_train = encode_prompts(self.splits.train, tok, split="train", **enc)
        self.eval_prompts, self.dropped_eval = encode_prompts(self.splits.eval, tok, split="eval", **enc)
        self.eos_ids = torch.tensor(self.policy.eos_ids(), device=self.device)
        self.pad_id = tok.pad_token_id
        model = self.policy.model
        self.autocast = (torch.bfloat16 if self.device == "cuda" and torch.cuda.is_bf16_supported()
                         and next(model.parameters()).dtype == torch.float32 else None)
        self.params = [p for p in model.parameters() if p.requires_grad]
        # the first update on a batch reuses the sampler's projections (rlcompare.fast.replay) where that is exact
        self._last_record = None
        self.replay_off = ("trainer.update_from_rollout=false" if not t.update_from_rollout else
                           can_replay(model, cfg.budget.max_prompt_tokens + cfg.budget.max_new_tokens, autocast_dtype=self.autocast,
                                      gradient_checkpointing=bool(cfg.model.gradient_checkpointing)))
        self.opt = _adamw(self.params, lr=t.lr, betas=tuple(t.betas), weight_decay=t.weight_decay)
        self.sched = torch.optim.lr_scheduler.LambdaLR(self.opt, lambda s: min(1.0, (s + 1) / max(1, t.warmup_steps)))
        self.ref = ReferenceModel(self.policy) if a.kl.coef > 0 else None
        self.critic = self.critic_opt = None
        if a.advantage.estimator == "gae":
            self.critic = ValueModel(model).to(self.device)
            self.critic_opt = _adamw(self.critic.parameters(), lr=a.critic.lr, betas=tuple(t.betas))
        self.gen = torch.Generator(device=self.device)
        self.gen.manual_seed(cfg.seed)
        self.shuffle_gen = torch.Generator()
        self.shuffle_gen.manual_seed(cfg.seed + 1)
        self.stream = PromptStream(self.train_prompts, cfg.prompts.data_seed)
        self.state = {"step": 0, "tokens": 0, "bad_in_row": 0, "last_bad": None, "skipped_updates": 0, "elapsed": 0.0,
                      "eval_initial": None, "eval_best": None, "eval_last": None, "verifier_errors": 0}

    # ------------------------------------------------------------------ helpers
    def log(self, msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    def _sample(self, prompts: list[EncodedPrompt], *, repeat: int, greedy: bool, reuse_record: bool = False):
        """reuse_record: the last rollout's batch is done with, so its `ProjectionRecord` buffers may be rewritten."""
        pi, pm = left_pad([p.ids for p in prompts], self.pad_id, self.device)
        record = not greedy and self.replay_off is None and repeat > 1
        if record and reuse_record and self._last_record is not None:
            record = self._last_record
        self.policy.model.eval()
        comp = sample(self.policy.model, pi, pm, max_new_tokens=self.cfg.budget.max_new_tokens,
                      eos_id=self.eos_ids, pad_id=self.pad_id, temperature=self.cfg.rollout.temperature,
                      top_p=self.cfg.rollout.top_p, greedy=greedy, generator=self.gen, autocast_dtype=self.autocast,
                      repeats=repeat, kv_cache=self.cfg.rollout.kv_cache,
                      record=record, logprobs=not greedy and self._reads_sampler_logp())
        if comp.record is not None:
            self._last_record = comp.record
        if repeat > 1:  # the update needs every completion's prompt
            pi, pm = pi.repeat_interleave(repeat, 0), pm.repeat_interleave(repeat, 0)
        return pi, pm, comp

    def _reads_sampler_logp(self) -> bool:
        """Whether anything reads the sampler's log-probs: the old log-probs of several updates per batch, or
        PPO's KL penalty in the reward. One update per batch is on-policy and uses its own, detached."""
        a, t = self.cfg.algorithm, self.cfg.trainer
        old = t.updates_per_rollout > 1 and not t.recompute_old_logp
        # the mismatch correction compares the trainer's recomputed old log-probs with the sampler's
        return old or (self.ref is not None and a.kl.placement == "in_reward") or a.mismatch.mode is not None

    def _score(self, prompts: list[EncodedPrompt], comp, repeat: int):
        # the tensor itself, not .tolist(): transformers converts a tensor in one call but type-checks every element
        # of nested lists (0.5 vs 0.74 ms for 128 x 16 ids)
        texts = self.policy.tokenizer.batch_decode(comp.ids.masked_fill(comp.mask == 0, self.pad_id), skip_special_tokens=True)
        answers = [p.example.answer for p in prompts for _ in range(repeat)]
        scores = score_batch(self.verifier, texts, answers, timeout_s=self.cfg.verifier.timeout_s)
        rewards = torch.tensor([s.reward for s in scores], dtype=torch.float32)
        correct = torch.tensor([s.correct for s in scores], dtype=torch.bool)
        errors = sum(s.error for s in scores)
        return texts, rewards, correct, errors

    # ------------------------------------------------------------------ one rollout batch
    def collect(self) -> dict:
        """Sample, score and (with dynamic sampling) refill until the batch holds informative groups."""
        cfg, a = self.cfg, self.cfg.algorithm
        G, n_prompts = cfg.trainer.group_size, cfg.trainer.prompts_per_step
        kept, rounds, drawn, dropped, gen_tokens = [], 0, 0, 0, 0
        t_roll = t_score = 0.0
        need = n_prompts
        while need > 0:
            prompts = self.stream.take(need)
            t0 = time.perf_counter()
            pi, pm, comp = self._sample(prompts, repeat=G, greedy=False, reuse_record=rounds == 0)
            t1 = time.perf_counter()
            texts, raw_rewards, correct, errors = self._score(prompts, comp, G)
            self.state["verifier_errors"] += errors
            t_score += time.perf_counter() - t1
            t_roll += t1 - t0
            rounds += 1
            drawn += len(prompts)
            gen_tokens += int(comp.lengths.sum())
            rewards = raw_rewards.clone()
            if a.overlong.soft_punishment:
                rewards = rewards + losses.overlong_penalty(comp.lengths.cpu(), max_len=cfg.budget.max_new_tokens,
                                                            cache_len=a.overlong.cache_len, factor=a.overlong.factor)
            part = dict(pi=pi, pm=pm, comp=comp, texts=texts, rewards=rewards, raw=raw_rewards, correct=correct,
                        prompts=prompts, record_rows=torch.arange(len(rewards)))
            if a.dynamic_sampling.enabled:
                info = adv_lib.informative_groups(rewards, G)
                dropped += int((~info).sum())
                rows = info.repeat_interleave(G)
                if info.any():
                    kept.append(_select(part, rows, G))
                need = n_prompts - sum(len(k["prompts"]) for k in kept)
                if rounds > a.dynamic_sampling.max_rounds:
                    break
            else:
                kept.append(part)
                need = 0
        batch = _concat(kept, self.pad_id) if kept else None
        if batch is not None and len(batch["prompts"]) > n_prompts:
            batch = _select(batch, torch.arange(len(batch["prompts"]) * G) < n_prompts * G, G)
        return dict(batch=batch, rounds=rounds, drawn=drawn, dropped=dropped, gen_tokens=gen_tokens,
                    t_roll=t_roll, t_score=t_score)

    def _logits(self, model, pi, pm, ids, cm, grouped: bool = True):
        """Completion logits; rows in whole groups share their prompt's forward (and backward)."""
        G = self.cfg.trainer.group_size
        if grouped and G > 1 and ids.shape[0] % G == 0 and not self.cfg.model.gradient_checkpointing:
            return grouped_sequence_logits(model, pi, pm, ids, cm, group_size=G, autocast_dtype=self.autocast)
        return sequence_logits(model, pi, pm, ids, cm, autocast_dtype=self.autocast)

    # ------------------------------------------------------------------ advantages
    def advantages(self, b: dict) -> dict:
        a, G = self.cfg.algorithm, self.cfg.trainer.group_size
        comp = b["comp"]
        loss_mask = comp.mask.clone()
        if a.overlong.filter:
            loss_mask[comp.truncated] = 0  # DAPO overlong filtering
        out = {"loss_mask": loss_mask}
        if self.ref is not None:
            with torch.no_grad():
                logits = self.ref(lambda m: self._logits(m, b["pi"], b["pm"], comp.ids, comp.mask))
                out["ref_logp"] = token_logp(logits, comp.ids, self.cfg.rollout.temperature) * comp.mask
                del logits
        rewards = b["rewards"].to(self.device)
        # KL in the reward, for every estimator: -beta * sg(kl_t) on each real token (sampler's log-probs);
        # group estimators centre the summed reward score - beta * sum_t kl_t (as verl's token_level_rewards.sum(-1))
        kl_r = None
        if "ref_logp" in out and a.kl.placement == "in_reward":
            kl_r = losses.kl_divergence(comp.logp, out["ref_logp"], estimator=a.kl.estimator, mask=comp.mask).detach()
        beta = a.kl.coef if kl_r is not None else 0.0
        if a.advantage.estimator in ("group", "rloo") and kl_r is not None:
            rewards = adv_lib.outcome_token_rewards(rewards, comp.mask, kl=kl_r, beta=beta).sum(-1)
        if a.advantage.estimator == "group":
            out["adv"] = adv_lib.group_advantages(rewards, G, scale=a.advantage.scale, std_ddof=a.advantage.std_ddof, eps=a.advantage.eps)
        elif a.advantage.estimator == "rloo":
            out["adv"] = adv_lib.rloo_advantages(rewards, G)
        elif a.advantage.estimator == "reinforce_pp":
            out["adv"] = adv_lib.reinforce_pp_advantages(
                rewards, comp.mask, kl=kl_r, beta=beta, gamma=a.advantage.gamma, baseline=a.advantage.baseline,
                group_size=G, std_ddof=a.advantage.std_ddof, eps=a.advantage.eps)
        else:  # PPO: critic values, outcome reward on the last real token, KL-in-reward, GAE
            with torch.no_grad():
                values = self.critic(b["pi"], b["pm"], comp.ids, comp.mask) * comp.mask
            token_rewards = adv_lib.outcome_token_rewards(rewards, comp.mask, kl=kl_r, beta=beta)
            advs, returns = adv_lib.gae_advantages(token_rewards, values, comp.mask, gamma=a.critic.gamma, lam=a.critic.lam)
            if a.advantage.scale == "whiten":
                advs = adv_lib.whiten(advs, comp.mask)
            out.update(adv=advs, returns=returns, old_values=values)
        return out

    # ------------------------------------------------------------------ updates
    def update(self, b: dict, av: dict, old_logp: torch.Tensor | None) -> dict:
        cfg, a, t = self.cfg, self.cfg.algorithm, self.cfg.trainer
        comp = b["comp"]
        B = comp.ids.shape[0]
        loss_mask = av["loss_mask"]
        total_tokens = float(loss_mask.sum())
        horizon = a.horizon
        # prompt-mean-token-mean: each row's group token count over the whole batch (mini-batches may split groups)
        group_tokens = losses.group_token_counts(loss_mask, t.group_size) if a.aggregation == "prompt-mean-token-mean" else None
        need_entropy = a.entropy_coef > 0 or (a.ratio == "hybrid" and a.clip.mix == "entropy")
        log_v = math.log(len(self.policy.tokenizer))
        G = t.group_size
        n_groups = B // G
        # Mini-batches hold whole groups, so each prompt's forward/backward is shared by its completions
        # (grouped_sequence_logits); with fewer groups than updates, fall back to rows.
        grouped = G > 1 and n_groups * G == B and n_groups >= t.updates_per_rollout
        if grouped:
            gperm = torch.randperm(n_groups, generator=self.shuffle_gen)
            minibatches = [(g[:, None] * G + torch.arange(G)).reshape(-1) for g in torch.tensor_split(gperm, t.updates_per_rollout)]
        else:
            perm = torch.randperm(B, generator=self.shuffle_gen)
            minibatches = [mb for mb in torch.tensor_split(perm, t.updates_per_rollout) if len(mb)]
        micro_rows = t.micro_batch_size and (max(G, t.micro_batch_size // G * G) if grouped else t.micro_batch_size)
        acc: dict[str, list] = {}
        skipped, nonfinite = 0, None
        model = self.policy.model
        model.train()
        idle = self._idle_rows(av, G if grouped else 1)  # rows whose loss is exactly 0 (skip_zero_advantage)
        replay = grouped and comp.record is not None
        n_idle = int(idle.sum()) if idle is not None else 0
        for mb_i, mb in enumerate(minibatches):
            mb = mb.to(self.device)
            self.opt.zero_grad(set_to_none=True)
            if self.critic_opt is not None:
                self.critic_opt.zero_grad(set_to_none=True)
            if idle is not None:
                idle_mb = mb[idle[mb]]
                mb = mb[~idle[mb]]  # whole groups go (idle is a group property when grouped)
                if len(idle_mb):  # their objective is exactly 0: count their tokens in the token means
                    w0 = float(comp.mask[idle_mb].sum())
                    for k in ("objective_per_token", "objective_per_response"):
                        _add(acc, f"_pm/{k}", 0.0, weight=w0)
                if not len(mb):
                    # nothing to compute, but AdamW must still step on zero gradients (its moments move) as it
                    # would have without the skip
                    for p_ in self.params:
                        p_.grad = torch.zeros_like(p_)
            micro = [] if not len(mb) else ([mb] if not micro_rows else list(torch.split(mb, micro_rows)))
            # statistics of the whole optimizer step (top-entropy threshold, Cov selection): from a forward
            # without graph when the step is split in micro-batches, else from the step's own forward
            step_sel = self._step_selection(b, av, micro, old_logp, grouped) if len(micro) > 1 else None
            first = 0
            for idx in micro:
                ids, cm = comp.ids[idx], comp.mask[idx]
                lm = loss_mask[idx]
                if replay and mb_i == 0:  # the sampling weights: rebuild the forward from the sampler's projections
                    logits = replay_logits(model, comp.record, b["record_rows"][idx.cpu()].to(self.device), b["pi"][idx],
                                           b["pm"][idx], ids, group_size=G)
                else:
                    logits = self._logits(model, b["pi"][idx], b["pm"][idx], ids, cm, grouped=grouped)
                logp = token_logp(logits, ids, cfg.rollout.temperature) * cm
                # the entropy bonus needs its gradient; otherwise it is a metric (and DHPO's mix weight): no graph
                with torch.set_grad_enabled(a.entropy_coef > 0):
                    temp = cfg.rollout.temperature
                    ent = losses.entropy_from_logits(logits / temp if temp != 1.0 else logits, chunk_size=1024)
                del logits
                olp = old_logp[idx] if old_logp is not None else logp.detach()
                advs = av["adv"][idx]
                agg = dict(horizon=horizon, total_tokens=total_tokens, total_seqs=B, group_size=G)
                if group_tokens is not None:
                    agg["group_tokens"] = group_tokens[idx]
                if step_sel is None:
                    sel = self._token_selection(av, idx, logp.detach(), olp, ent.detach())
                else:
                    sel = {k: v[first:first + len(idx)] for k, v in step_sel.items()}
                first += len(idx)
                token_weight, extra_pm = self._token_weight(av, idx, lm, sel.get("keep"))
                ploss, pm = losses.policy_loss(
                    logp, olp, advs, lm, surrogate=a.surrogate, ratio=a.ratio, eps_low=a.clip.eps_low,
                    eps_high=a.clip.eps_high, dual_clip=a.clip.dual_clip, aggregation=a.aggregation,
                    seq_eps_low=a.clip.seq_eps_low, seq_eps_high=a.clip.seq_eps_high, mix=a.clip.mix,
                    entropy=(ent.detach() / log_v) if need_entropy else None, token_weight=token_weight,
                    cov_selected=sel.get("cov_selected"), **{k: a.clip[k] for k in losses.SURROGATE_KNOBS}, **agg)
                pm.update(extra_pm)
                loss = ploss
                if "ref_logp" in av:
                    kl = losses.kl_divergence(logp, av["ref_logp"][idx], estimator=a.kl.estimator)
                    kl_ref = float((kl.detach() * cm).sum() / cm.sum().clamp(min=1))
                    _add(acc, "kl/ref", kl_ref)
                    if a.kl.placement == "in_loss":
                        loss = loss + a.kl.coef * losses.aggregate(kl, lm, a.aggregation, **agg)
                if a.entropy_coef > 0:
                    loss = loss - a.entropy_coef * losses.aggregate(ent, lm, a.aggregation, **agg)
                if self.critic is not None:
                    values = self.critic(b["pi"][idx], b["pm"][idx], ids, cm)
                    vloss, vm = losses.value_loss(values, av["old_values"][idx], av["returns"][idx], lm,
                                                  clip=a.critic.value_clip, aggregation="token-mean", total_tokens=total_tokens)
                    loss = loss + a.critic.coef * vloss
                    _add(acc, "loss/value", float(vloss.detach()))
                if t.inject_nan_at_step is not None and self.state["step"] == t.inject_nan_at_step:
                    loss = loss * float("nan")
                _add(acc, "_loss_total", float(loss.detach()))
                loss.backward()
                w = float(cm.sum())
                _add(acc, "loss/policy", float(ploss.detach()))
                for k, v in pm.items():
                    _add(acc, f"_pm/{k}", v, weight=w)
                _add(acc, "policy/entropy", float((ent.detach() * cm).sum() / cm.sum().clamp(min=1)), weight=w)
            gnorm = torch.nn.utils.clip_grad_norm_(self.params, t.max_grad_norm if t.max_grad_norm else float("inf"))
            cnorm = None
            if self.critic is not None:
                cnorm = torch.nn.utils.clip_grad_norm_(self.critic.parameters(), t.max_grad_norm if t.max_grad_norm else float("inf"))
            bad = _nonfinite(acc["_loss_total"][-len(micro):] if micro else [], gnorm, cnorm)
            if bad:
                skipped += 1  # a NaN/inf loss or gradient: skip this update (policy and critic)
                nonfinite = nonfinite or bad
                self.opt.zero_grad(set_to_none=True)
                if self.critic_opt is not None:
                    self.critic_opt.zero_grad(set_to_none=True)
                continue
            self.opt.step()
            if self.critic_opt is not None:
                self.critic_opt.step()
            _add(acc, "optim/grad_norm", float(gnorm))
        self.sched.step()
        out = {}
        for k, vals in acc.items():
            if k.startswith(("_pm/", "_loss_total")):
                continue
            out[k] = sum(v for v, _ in vals) / max(1, len(vals)) if k not in ("loss/policy", "loss/value") else sum(v for v, _ in vals)
        pm_keys = {k[4:] for k in acc if k.startswith("_pm/")}
        for k in pm_keys:
            vals = acc["_pm/" + k]
            if k == "ratio_min":
                out[k] = min(v for v, _ in vals)
            elif k == "ratio_max":
                out[k] = max(v for v, _ in vals)
            else:
                tw = sum(w for _, w in vals)
                out[k] = sum(v * w for v, w in vals) / tw if tw else float("nan")
        out["update/idle_rows_frac"] = n_idle / B
        out["_skipped"] = skipped
        out["_nonfinite"] = nonfinite  # which quantity made an update skip: "loss" | "gradient norm" | None
        out["_n_updates"] = len(minibatches)
        return out

    def _reads_step_statistics(self) -> bool:
        """Whether the loss reads statistics of all the tokens of one optimizer step: the top-entropy threshold
        (arXiv 2506.01939) or Clip-Cov / KL-Cov's covariance selection (arXiv 2505.22617)."""
        a = self.cfg.algorithm
        return a.top_entropy_quantile is not None or a.surrogate in losses.COV_SURROGATES

    def _token_selection(self, av: dict, rows, logp, old_logp, ent) -> dict:
        """For `rows` (every row of one optimizer step): `keep`, the top-entropy tokens, and `cov_selected`, the
        tokens Clip-Cov removes / KL-Cov penalises; only those the config asks for."""
        a = self.cfg.algorithm
        lm = av["loss_mask"][rows]
        out = {}
        if a.top_entropy_quantile is not None:
            out["keep"] = losses.entropy_mask(ent, lm, quantile=a.top_entropy_quantile)
        if a.surrogate in losses.COV_SURROGATES:
            # the shuffle generator: seeded by the run and saved in checkpoints, so a resumed run draws the same
            out["cov_selected"] = losses.cov_selection(
                logp, old_logp, av["adv"][rows], lm, surrogate=a.surrogate, eps_low=a.clip.eps_low,
                eps_high=a.clip.eps_high, cov_ratio=a.clip.cov_ratio, cov_lb=a.clip.cov_lb, cov_ub=a.clip.cov_ub,
                generator=self.shuffle_gen)
        return out

    @torch.no_grad()
    def _step_selection(self, b: dict, av: dict, micro: list, old_logp, grouped: bool) -> dict:
        """_token_selection over all the micro-batches of one optimizer step, from a forward without graph (the
        weights do not change before the step); rows in the order of `micro`."""
        if not self._reads_step_statistics():
            return {}
        comp, temp = b["comp"], self.cfg.rollout.temperature
        logps, ents = [], []
        for idx in micro:
            ids, cm = comp.ids[idx], comp.mask[idx]
            logits = self._logits(self.policy.model, b["pi"][idx], b["pm"][idx], ids, cm, grouped=grouped)
            logps.append(token_logp(logits, ids, temp) * cm)
            ents.append(losses.entropy_from_logits(logits / temp if temp != 1.0 else logits, chunk_size=1024))
            del logits
        rows = torch.cat(micro)
        logp = torch.cat(logps)
        return self._token_selection(av, rows, logp, old_logp[rows] if old_logp is not None else logp, torch.cat(ents))

    def _token_weight(self, av: dict, idx, lm, keep) -> tuple[torch.Tensor | None, dict]:
        """policy_loss's token_weight: the rollout-mismatch weights times the top-entropy mask (None if neither)."""
        weight, extra = av.get("token_weight"), {}
        weight = None if weight is None else weight[idx]
        if keep is not None:
            extra["entropy_mask_kept_frac"] = float(keep.sum() / lm.bool().sum().clamp(min=1))
            weight = keep.to(torch.float32) if weight is None else weight * keep
        return weight, extra

    def _idle_rows(self, av: dict, unit: int) -> torch.Tensor | None:
        """With trainer.skip_zero_advantage: a [B] bool mask of rows whose policy loss is exactly 0 (every
        advantage 0, in whole groups of `unit` rows), or None when skipping them would change the update:
        a KL term in the loss, an entropy bonus or a critic make every row count."""
        a, t = self.cfg.algorithm, self.cfg.trainer
        if not t.skip_zero_advantage or self.ref is not None or a.entropy_coef > 0 or self.critic is not None:
            return None
        if self._reads_step_statistics():  # the entropy threshold and the covariance are over every row
            return None
        adv = av["adv"]
        zero = (adv.reshape(adv.shape[0], -1) == 0).all(1).to(self.device)
        return zero.view(-1, unit).all(1).repeat_interleave(unit) if unit > 1 else zero

    # ------------------------------------------------------------------ eval
    def evaluate(self) -> tuple[dict, list[dict]]:
        t = self.cfg.trainer
        correct, lengths, samples = 0, 0.0, []
        for i in range(0, len(self.eval_prompts), t.eval_batch_size):
            chunk = self.eval_prompts[i:i + t.eval_batch_size]
            _, _, comp = self._sample(chunk, repeat=1, greedy=True)
            texts, rewards, corr, _ = self._score(chunk, comp, 1)
            correct += int(corr.sum())
            lengths += float(comp.lengths.sum())
            for j in range(len(chunk)):
                if len(samples) < t.n_samples_logged:
                    samples.append({"step": self.state["step"], "prompt": chunk[j].example.prompt[: t.sample_max_chars],
                                    "completion": texts[j][: t.sample_max_chars], "answer": chunk[j].example.answer[: t.sample_max_chars],
                                    "reward": float(rewards[j]), "correct": bool(corr[j])})
        n = len(self.eval_prompts)
        return {"eval/accuracy": correct / n, "eval/mean_length": lengths / n, "eval/n": n}, samples

    # ------------------------------------------------------------------ one step
    def step(self) -> dict:
        a, t = self.cfg.algorithm, self.cfg.trainer
        t_start = time.perf_counter()
        self.state["step"] += 1
        col = self.collect()
        self.state["tokens"] += col["gen_tokens"]
        row: dict[str, Any] = {"step": self.state["step"], "tokens/step": col["gen_tokens"],
                               "tokens/generated": self.state["tokens"],
                               "sampling/rounds": col["rounds"], "sampling/groups_drawn": col["drawn"],
                               "sampling/groups_dropped": col["dropped"]}
        b = col["batch"]
        t_up = time.perf_counter()
        if b is None:
            self.state["skipped_updates"] += 1
            row["optim/skipped_updates"] = self.state["skipped_updates"]
        else:
            comp, G = b["comp"], t.group_size
            rewards = b["rewards"]
            grp = rewards.view(-1, G)
            row.update({"reward/mean": float(rewards.mean()), "reward/std": float(rewards.std()) if len(rewards) > 1 else 0.0,
                        "accuracy/train": float(b["correct"].float().mean()),
                        "groups/zero_variance_frac": float((grp.max(1).values == grp.min(1).values).float().mean())})
            row.update(length_stats(comp.lengths.cpu(), b["correct"], comp.truncated.cpu()))
            if not bool(torch.isfinite(rewards).all()):
                # A verifier returned nan/inf: advantages would be poisoned. Skip this step's update (and count it).
                n_up = min(t.updates_per_rollout, len(rewards))
                self.sched.step()
                self.state["skipped_updates"] += n_up
                self._note_nonfinite("reward")
                row["optim/skipped_updates"] = self.state["skipped_updates"]
                row.update({"optim/nonfinite": 1, "optim/lr": self.sched.get_last_lr()[0]})
                return self._finish_row(row, col, t_start, t_up)
            av = self.advantages(b)
            row.update(weight_shares(av["loss_mask"].cpu(), b["correct"], a.aggregation, a.horizon, group_size=G))
            if t.recompute_old_logp:
                old_logp = self._recompute_logp(b)
                if a.mismatch.mode is not None:  # same weights, two engines: TIS / IcePop / TRL's modes
                    av["token_weight"], mm = losses.mismatch_weights(
                        old_logp, comp.logp, av["loss_mask"], mode=a.mismatch.mode, c_min=a.mismatch.c_min,
                        c_max=a.mismatch.c_max)
                    row.update({"mismatch/" + k[len("mismatch_"):]: v for k, v in mm.items()})
            elif t.updates_per_rollout > 1:
                old_logp = comp.logp  # the sampler's log-probs: same weights, temperature applied
            else:
                old_logp = None  # one update per batch is on-policy: old = current (detached) is exact
            up = self.update(b, av, old_logp)
            self.state["skipped_updates"] += up["_skipped"]
            self._note_nonfinite(up["_nonfinite"] if up["_skipped"] else None)
            row["optim/skipped_updates"] = self.state["skipped_updates"]
            row["optim/nonfinite"] = int(up["_skipped"] > 0)
            row.update({"objective/per_token": up.get("objective_per_token"), "objective/per_response": up.get("objective_per_response"),
                        "objective/optimized": -up.get("loss/policy", float("nan")),
                        "clip/frac_low": up.get("clip_frac_low"), "clip/frac_high": up.get("clip_frac_high"),
                        "clip/dual_frac": up.get("dual_clip_frac"), "ratio/mean": up.get("ratio_mean"),
                        "ratio/min": up.get("ratio_min"), "ratio/max": up.get("ratio_max"),
                        "kl/rollout": up.get("approx_kl"), "kl/ref": up.get("kl/ref"),
                        "policy/entropy": up.get("policy/entropy"), "loss/policy": up.get("loss/policy"),
                        "update/idle_rows_frac": up.get("update/idle_rows_frac"),
                        "loss/value": up.get("loss/value"), "optim/grad_norm": up.get("optim/grad_norm"),
                        "optim/lr": self.sched.get_last_lr()[0]})
            row.update({"policy/" + k: up[k] for k in _VARIANT_METRICS if k in up})
        return self._finish_row(row, col, t_start, t_up)

    def _note_nonfinite(self, what: str | None) -> None:
        """Track the run of consecutive steps whose update was skipped for a non-finite value (run.py stops the
        run at trainer.max_bad_steps); `last_bad` = [step, quantity] names where it broke."""
        if what is None:
            self.state["bad_in_row"] = 0
        else:
            self.state["bad_in_row"] += 1
            self.state["last_bad"] = [self.state["step"], what]

    def _finish_row(self, row: dict, col: dict, t_start: float, t_up: float) -> dict:
        row.setdefault("optim/nonfinite", 0)
        row["verifier/errors"] = self.state["verifier_errors"]
        now = time.perf_counter()
        self.state["elapsed"] += now - t_start
        row.update({"time/rollout_s": col["t_roll"], "time/scoring_s": col["t_score"], "time/update_s": now - t_up,
                    "time/step_s": now - t_start, "time/elapsed_s": self.state["elapsed"],
                    "perf/tokens_per_s": col["gen_tokens"] / max(now - t_start, 1e-9)})
        return row

    def _recompute_logp(self, b) -> torch.Tensor:
        comp = b["comp"]
        self.policy.model.eval()
        with torch.no_grad():
            logits = self._logits(self.policy.model, b["pi"], b["pm"], comp.ids, comp.mask)
            return token_logp(logits, comp.ids, self.cfg.rollout.temperature) * comp.mask


def _adamw(params, **kw):
    """AdamW with the fused kernel where torch has one for these tensors (2.5x faster on the CPU), else the loop."""
    params = list(params)
    try:
        return torch.optim.AdamW(params, fused=True, **kw)
    except (RuntimeError, TypeError, ValueError):
        return torch.optim.AdamW(params, **kw)


def _add(acc, k, v, weight=1.0):
    acc.setdefault(k, []).append((v, weight))


def _nonfinite(losses_, gnorm, cnorm) -> str | None:
    """Which quantity of one update is NaN/inf: "loss", "gradient norm", or None when all are finite."""
    if any(not math.isfinite(v) for v, _ in losses_):
        return "loss"
    if not torch.isfinite(gnorm) or (cnorm is not None and not torch.isfinite(cnorm)):
        return "gradient norm"
    return None


def _select(part: dict, rows: torch.Tensor, G: int) -> dict:
    """Keep the completions where `rows` is true (whole groups)."""
    rows_d = rows.to(part["pi"].device)
    comp = part["comp"]
    from rlcompare.rollout import Completions

    groups = rows.view(-1, G)[:, 0].tolist()
    return dict(pi=part["pi"][rows_d], pm=part["pm"][rows_d],
                comp=Completions(comp.ids[rows_d], comp.mask[rows_d], comp.logp[rows_d] if comp.logp is not None else None,
                                 comp.truncated[rows_d], comp.lengths[rows_d], record=comp.record),
                record_rows=part["record_rows"][rows],
                texts=[x for x, r in zip(part["texts"], rows.tolist()) if r], rewards=part["rewards"][rows],
                raw=part["raw"][rows], correct=part["correct"][rows],
                prompts=[p for p, g in zip(part["prompts"], groups) if g])


def _pad_right(x, width, value):
    return torch.nn.functional.pad(x, (0, width - x.shape[1]), value=value)


def _pad_left(x, width, value):
    return torch.nn.functional.pad(x, (width - x.shape[1], 0), value=value)


def _concat(parts: list[dict], pad_id: int) -> dict:
    if len(parts) == 1:
        return parts[0]
    from rlcompare.rollout import Completions

    P = max(p["pi"].shape[1] for p in parts)
    T = max(p["comp"].ids.shape[1] for p in parts)
    cat = lambda key, f, w, v: torch.cat([f(p[key], w, v) for p in parts])
    cc = lambda attr, v: torch.cat([_pad_right(getattr(p["comp"], attr), T, v) for p in parts])
    return dict(pi=cat("pi", _pad_left, P, pad_id), pm=cat("pm", _pad_left, P, 0),
                comp=Completions(cc("ids", pad_id), cc("mask", 0), cc("logp", 0.0) if parts[0]["comp"].logp is not None else None,
                                 torch.cat([p["comp"].truncated for p in parts]), torch.cat([p["comp"].lengths for p in parts])),
                record_rows=torch.arange(sum(len(p["rewards"]) for p in parts)),  # no record: several rollouts
                texts=sum((p["texts"] for p in parts), []), rewards=torch.cat([p["rewards"] for p in parts]),
                raw=torch.cat([p["raw"] for p in parts]), correct=torch.cat([p["correct"] for p in parts]),
                prompts=sum((p["prompts"] for p in parts), []))


def _seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)
