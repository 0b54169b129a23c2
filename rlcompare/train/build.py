"""The parts a `Trainer` is built from that need the config and a decision: the device, the seeding, the
optimizer, the autocast dtype, the teacher and the sampler (the vLLM engine under rollout.engine=vllm)."""

from __future__ import annotations

import random
from typing import Any, Callable

import numpy as np
import torch

from rlcompare.config import ConfigError
from rlcompare.rollout import sample
from rlcompare.rollout.vllm_engine import VllmSampler
from rlcompare.train import teacher as teacher_lib


def pick_device(name: str) -> str:
    if name == "cuda" and not torch.cuda.is_available():
        raise ConfigError("device=cuda but no CUDA device is visible; use device=auto or device=cpu")
    if name == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return name


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def autocast_dtype(device: str, model) -> torch.dtype | None:
    """bfloat16 autocast on a CUDA device that supports it, for float32 weights; else None (the weights' dtype)."""
    if device == "cuda" and torch.cuda.is_bf16_supported() and next(model.parameters()).dtype == torch.float32:
        return torch.bfloat16
    return None


def adamw(params, **kw):
    """AdamW with the fused kernel where torch has one for these tensors (2.5x faster on the CPU), else the loop."""
    params = list(params)
    try:
        return torch.optim.AdamW(params, fused=True, **kw)
    except (RuntimeError, TypeError, ValueError):
        return torch.optim.AdamW(params, **kw)


def load_teacher(cfg: Any, policy, device: str, log: Callable[[str], None]) -> teacher_lib.Teacher:
    """The frozen teacher, on the policy's device in the policy's dtype unless teacher.dtype says otherwise,
    checked against the student's tokenizer and embedding rows (the run's preflight checked the rest)."""
    tcfg, model = cfg.teacher, policy.model
    wanted = tcfg.device or device
    teacher_lib.check_same_device(pick_device(wanted) if wanted == "auto" else wanted, device)
    dtype = getattr(torch, tcfg.dtype) if tcfg.dtype else next(model.parameters()).dtype
    teacher = teacher_lib.load_teacher(str(tcfg.path), dtype=dtype, device=device, revision=tcfg.revision)
    student = cfg.model.name if cfg.model.kind == "tiny" else str(cfg.model.name_or_path)
    teacher_lib.check_same_tokenizer(policy.tokenizer, model, teacher, student)
    log(f"[rlcompare] teacher {tcfg.path} loaded ({teacher_lib.parameter_count(teacher) / 1e6:.2f}M parameters)")
    return teacher


def samplers(cfg: Any, policy, world) -> tuple[VllmSampler | None, Callable]:
    """(the vLLM engine or None, the sampler): `rollout.sample`, or under rollout.engine=vllm a colocated vLLM
    engine with the sampler's signature, whose weights `Trainer.push_rollout_weights` refreshes."""
    engine = _build_vllm(cfg, policy, world) if cfg.rollout.engine == "vllm" else None
    return engine, engine if engine is not None else sample


def _build_vllm(cfg: Any, policy, world) -> VllmSampler:
    """The vLLM engine on the policy's weights, sized for the largest batch and the longest sequence sampled."""
    if world.size > 1:  # trainer.parallel=auto under torchrun (ddp / fsdp are refused by the schema)
        raise ConfigError("rollout.engine=vllm runs one process; launch without torchrun or use rollout.engine=auto")
    new = max(cfg.budget.max_new_tokens, cfg.eval.max_new_tokens or 0)
    ctx = policy.context_length
    longest = cfg.budget.max_prompt_tokens + new
    rows = max(
        cfg.trainer.prompts_per_step * cfg.trainer.group_size,
        cfg.trainer.eval_batch_size,
        cfg.eval.samples * max(1, cfg.trainer.eval_batch_size // max(1, cfg.eval.samples)),
    )
    return VllmSampler(policy.model, max_model_len=min(longest, ctx or longest), max_num_seqs=rows, seed=cfg.seed)
