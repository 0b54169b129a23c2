"""`train(cfg)`: one run from config to results/ (and W&B), with budget, evals, checkpoints and failure capture."""

from __future__ import annotations

import json
import math
import os
import signal
import sys
import time
import traceback
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from rlcompare import checkpoint
from rlcompare.config import ConfigError, validate
from rlcompare.tracking import NullLogger, RunWriter, WandbLogger, read_jsonl, truncate_jsonl

FINGERPRINT_SAMPLING_KEYS = ("temperature", "top_p")


def fingerprint(cfg: DictConfig, tr) -> dict:
    """What compared runs must share: initial weights, prompts and split, verifier, budget, sampling."""
    c = OmegaConf.to_container(cfg, resolve=True)
    prompts = {k: v for k, v in c["prompts"].items()}
    prompts.update(n_train_used=len(tr.train_prompts), n_eval_used=len(tr.eval_prompts), eval_hash=tr.splits.eval_hash())
    return {
        "init_weights_hash": tr.policy.init_hash,
        "warm_start_key": tr.policy.warm_start_key,
        "model": tr.policy.source if c["model"]["kind"] == "hf" else c["model"]["name"],
        "prompts": prompts,
        "verifier": c["verifier"],
        "budget": c["budget"],
        "sampling": {**c["rollout"], "group_size": c["trainer"]["group_size"],
                     "prompts_per_step": c["trainer"]["prompts_per_step"],
                     "dynamic_sampling": c["algorithm"]["dynamic_sampling"]},
    }


def _budget_spent(cfg, state) -> bool:
    b = cfg.budget
    if b.max_steps is not None and state["step"] >= b.max_steps:
        return True
    return b.total_tokens is not None and state["tokens"] >= b.total_tokens


def _resume_requested(cfg) -> bool:
    r = cfg.resume
    return r is True or (isinstance(r, str) and r.lower() not in ("false", "0", "no", ""))


def _check_resume_config(run_dir: Path, cfg: DictConfig) -> None:
    saved_path = run_dir / "config.yaml"
    if not saved_path.exists():
        raise ConfigError(f"resume: {run_dir} holds no config.yaml; it is not a run folder")
    saved = OmegaConf.to_container(OmegaConf.load(saved_path), resolve=True)
    now = OmegaConf.to_container(cfg, resolve=True)
    ignore = {"resume", "trainer.progress", "logger.mode", "device", "trainer.threads", "trainer.inject_nan_at_step"}
    diffs = sorted(k for k in set(_flat(saved)) | set(_flat(now)) if k not in ignore and _flat(saved).get(k) != _flat(now).get(k))
    if diffs:
        raise ConfigError(f"resume: the config differs from the run being resumed in: {', '.join(diffs)}; "
                          f"resume with the same overrides, or start a new run")


def _flat(d: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(_flat(v, key + "."))
        else:
            out[key] = v
    return out


def train(cfg: DictConfig | dict) -> dict:
    """Run one training job; returns the summary dict (also written to summary.json)."""
    from rlcompare.trainer import Trainer, resolve_run_dir

    cfg = validate(cfg)
    run_dir = resolve_run_dir(cfg)
    resuming = _resume_requested(cfg)
    if resuming:
        if not run_dir.exists():
            raise ConfigError(f"resume: no run folder at {run_dir}; check the overrides or pass resume=<run dir>")
        _check_resume_config(run_dir, cfg)
    elif (run_dir / "metrics.jsonl").exists() and read_jsonl(run_dir / "metrics.jsonl"):
        raise ConfigError(f"{run_dir} already holds a run; pass resume=true to continue it, or set run_name/experiment for a new one")

    t_wall = time.time()
    tr = Trainer(cfg, run_dir)  # heavy: warm start, model load
    writer = None
    logger = NullLogger()
    summary: dict[str, Any] = {}
    try:
        ckpt = checkpoint.latest(run_dir) if resuming else None
        if ckpt is not None:
            checkpoint.load(tr, ckpt)
            step = tr.state["step"]
            tr.log(f"[rlcompare] resuming {run_dir} from step {step}")
            truncate_jsonl(run_dir / "metrics.jsonl", lambda r: r.get("step", 0) <= step)
            truncate_jsonl(run_dir / "eval.jsonl", lambda r: r.get("step", 0) <= step)
            truncate_jsonl(run_dir / "samples.jsonl", lambda r: r.get("step", 0) <= step)
        elif resuming:
            for name in ("metrics.jsonl", "eval.jsonl", "samples.jsonl"):
                (run_dir / name).unlink(missing_ok=True)
        writer = RunWriter(run_dir)
        resolved = OmegaConf.to_container(cfg, resolve=True)
        writer.write_text("config.yaml", OmegaConf.to_yaml(cfg, resolve=True))
        writer.write_json("fingerprint.json", fingerprint(cfg, tr))
        summary = {"status": "running", "error": None, "run_name": run_dir.name, "experiment": cfg.experiment,
                   "algorithm": cfg.algorithm.name, "seed": cfg.seed, "run_dir": str(run_dir),
                   "sweep": resolved["sweep"], "pid": os.getpid()}
        writer.write_json("summary.json", summary)
        if cfg.logger.name == "wandb" and cfg.logger.mode != "disabled":
            prev = {}
            if (run_dir / "wandb_id.txt").exists():
                prev = {"resume_id": (run_dir / "wandb_id.txt").read_text().strip()}
            logger = WandbLogger(cfg.logger, run_dir, run_dir.name, resolved, **prev)
            writer.write_text("wandb_id.txt", logger.id + "\n")

        def do_eval():
            ev, samples = tr.evaluate()
            row = {"step": tr.state["step"], "tokens/generated": tr.state["tokens"], **ev, "time/elapsed_s": tr.state["elapsed"]}
            writer.evals.write(row)
            for s in samples:
                writer.samples.write(s)
            logger.log(row, step=tr.state["step"])
            logger.log_samples(samples, step=tr.state["step"])
            acc = ev["eval/accuracy"]
            if tr.state["eval_initial"] is None:
                tr.state["eval_initial"] = acc
            tr.state["eval_best"] = acc if tr.state["eval_best"] is None else max(tr.state["eval_best"], acc)
            tr.state["eval_last"] = acc
            return acc

        if tr.state["step"] == 0:
            do_eval()
        pbar = _progress(cfg, tr)
        while not _budget_spent(cfg, tr.state):
            row = tr.step()
            writer.metrics.write(row)
            logger.log(row, step=tr.state["step"])
            last = _budget_spent(cfg, tr.state)
            if tr.state["step"] % cfg.trainer.eval_every == 0 or last:
                do_eval()
            if pbar is not None:
                pbar.update(1)
                pbar.set_postfix(reward=f"{row.get('reward/mean', float('nan')):.3f}", acc=f"{tr.state['eval_last']:.3f}",
                                 tok_s=f"{row['perf/tokens_per_s']:.0f}", tokens=tr.state["tokens"])
            if tr.state["bad_in_row"] >= cfg.trainer.max_bad_steps:
                raise FloatingPointError(
                    f"{tr.state['bad_in_row']} steps in a row had a non-finite loss, gradient norm or reward "
                    f"(last at step {tr.state['step']}); trainer.max_bad_steps={cfg.trainer.max_bad_steps}. "
                    f"Lower trainer.lr, check the verifier's rewards, or raise trainer.max_bad_steps")
            if cfg.trainer.checkpoint_every and tr.state["step"] % cfg.trainer.checkpoint_every == 0:
                checkpoint.save(tr, cfg.trainer.keep_checkpoints)
        if pbar is not None:
            pbar.close()
        summary.update(status="completed")
    except BaseException as e:  # record the failure, keep everything written so far, re-raise
        summary.update(status="failed", error=f"{type(e).__name__}: {e}", traceback=traceback.format_exc(limit=8))
        if writer is not None:
            _finish(writer, logger, tr, summary, t_wall, exit_code=1)
        raise
    _finish(writer, logger, tr, summary, t_wall, exit_code=0)
    return summary


def _finish(writer, logger, tr, summary, t_wall, exit_code):
    s = tr.state
    summary.update({"steps": s["step"], "tokens/generated": s["tokens"], "wall_time_s": time.time() - t_wall,
                    "train_time_s": s["elapsed"], "eval/accuracy_initial": s["eval_initial"],
                    "eval/accuracy_final": s["eval_last"], "eval/accuracy_best": s["eval_best"],
                    "optim/skipped_updates": s["skipped_updates"], "verifier/errors": s["verifier_errors"],
                    "init_weights_hash": tr.policy.init_hash})
    summary.pop("pid", None)
    writer.write_json("summary.json", summary)
    writer.close()
    try:
        logger.summary({k: v for k, v in summary.items() if k not in ("traceback",)})
        logger.finish(exit_code=exit_code)
    except Exception:
        pass


def _progress(cfg, tr):
    if not cfg.trainer.progress:
        return None
    from tqdm.auto import tqdm

    total = cfg.budget.max_steps
    interactive = sys.stderr.isatty()
    return tqdm(total=total, initial=tr.state["step"], desc=f"{cfg.algorithm.name} s{cfg.seed}", unit="step",
                file=sys.stderr, dynamic_ncols=True, leave=True, mininterval=0.5 if interactive else 30.0)
