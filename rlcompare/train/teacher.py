"""On-policy distillation's teacher (issue 52): a causal LM loaded frozen, checked against the student's tokenizer,
scoring the student's sampled tokens in chunks (no [B, T, V] logits when they would be large).

The folder checks that need no torch (pickle weights, code in the folder, damaged safetensors) are
`model_folder.check_teacher_folder`, run before the run folder exists; `load_teacher` loads with
`use_safetensors=True` and `trust_remote_code=False` on top, so nothing is unpickled and no folder code runs
even when the check is skipped. The advantage the log-probs feed is `rlcompare.algos.distill`.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import torch

from rlcompare.train.teacher_check import (  # noqa: F401 - re-exported: the checks' import path here too
    check_hub_revision,
    check_same_device,
    check_same_vocab,
    check_teacher,
    is_run_folder,
)
from rlcompare.rollout.sampler import grouped_sequence_logits, lm_head_of, sequence_logits
from rlcompare.train import logprobs

__all__ = [
    "Teacher",
    "check_same_device",
    "check_same_tokenizer",
    "check_same_vocab",
    "check_teacher",
    "is_run_folder",
    "load_teacher",
    "teacher_token_logp",
]


@dataclass
class Teacher:
    model: torch.nn.Module  # eval mode, no parameter requires grad
    tokenizer: object
    source: str  # the path or hub id it was loaded from (named in errors and logs)
    checkpoint_step: int | None = None  # a run folder's: the step of the checkpoint loaded (its newest)


def _error(msg: str) -> Exception:
    from rlcompare.config import ConfigError  # a one-line error at the CLI

    return ConfigError(msg)


def parameter_count(teacher: Teacher) -> int:
    return sum(p.numel() for p in teacher.model.parameters())


def _vocab_size(model: torch.nn.Module) -> int:
    return int(model.get_input_embeddings().weight.shape[0])


def check_same_tokenizer(student_tokenizer, student_model, teacher: Teacher, student_name: str) -> None:
    """`check_same_vocab`, and the teacher's embedding rows cover every id the student can sample. More rows are
    fine (Qwen2.5-7B pads to 152,064 where 0.5B has 151,936; the extra rows are part of the teacher's softmax)."""
    check_same_vocab(student_tokenizer, teacher.tokenizer, teacher.source, student_name)
    rows, needed = _vocab_size(teacher.model), _vocab_size(student_model)
    if rows < needed:
        raise _error(
            f"teacher: the teacher {teacher.source!r} has {rows} embedding rows and the student {student_name!r} "
            f"{needed}: the student can sample ids the teacher cannot score"
        )


def load_teacher(path: str, *, dtype: torch.dtype, device: str, revision: str | None = None) -> Teacher:
    """The causal LM at `path` (a local folder: save_pretrained output, a run's `export/`, an `rlcompare export`
    folder; a run folder, from its newest checkpoint; or a hub id at its pinned commit `revision`), frozen, in
    `dtype` on `device`. Safetensors only; no code from the folder."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    check_hub_revision(path, revision)  # a hub id unpinned is refused before anything downloads
    if is_run_folder(path):
        return _teacher_from_run(path, dtype=dtype, device=device)
    full = os.path.expanduser(path)
    source = full if os.path.isdir(full) else path
    pinned = {} if os.path.isdir(full) else {"revision": revision}
    try:
        tokenizer = AutoTokenizer.from_pretrained(source, trust_remote_code=False, **pinned)
        model = AutoModelForCausalLM.from_pretrained(
            source, dtype=dtype, trust_remote_code=False, use_safetensors=True, **pinned
        )
    except (OSError, ValueError) as e:
        raise _error(
            f"teacher={path!r} could not be loaded as a causal LM with safetensors weights ({type(e).__name__}: "
            f"{str(e)[:200]}); give a save_pretrained folder, a run's export/ or an `rlcompare export` folder"
        ) from None
    model.eval().requires_grad_(False)
    return Teacher(model.to(device), tokenizer, path)


def _teacher_from_run(path: str, *, dtype: torch.dtype, device: str) -> Teacher:
    """A run folder's newest checkpoint through `rlcompare export`'s reader (its config.yaml read as data), LoRA
    adapters folded in; a run folder holding code or pickles is refused even when the run's check was skipped."""
    from rlcompare.train.export import _merged, load_checkpoint_policy
    from rlcompare.train.inputs import newest_checkpoint
    from rlcompare.train.model_folder import check_teacher_run_folder

    check_teacher_run_folder(path, key="teacher.path")
    folder = Path(os.path.expanduser(path))
    step, _ = newest_checkpoint(folder)  # the one the run's fingerprint records (rlcompare.train.inputs)
    _, policy, _ = load_checkpoint_policy(folder, step)
    model = _merged(policy.model) if policy.lora else policy.model
    model.eval().requires_grad_(False)
    return Teacher(model.to(device=device, dtype=dtype), policy.tokenizer, path, checkpoint_step=step)


@torch.no_grad()
def teacher_token_logp(
    teacher: Teacher,
    prompt_ids: torch.Tensor,
    prompt_mask: torch.Tensor,
    comp_ids: torch.Tensor,
    comp_mask: torch.Tensor,
    *,
    group_size: int = 1,
    temperature: float = 1.0,
    autocast_dtype=None,
    max_logits: int | None = None,
) -> torch.Tensor:
    """log pi_T(y_t | prompt, y_<t) [B, T] of the sampled completion tokens, once per rollout batch; rows in
    whole groups of `group_size` share their prompt's forward; the LM head runs in chunks of positions where the
    whole logits would pass `max_logits` elements (`logprobs.completion_stats`). Padding positions hold values
    the caller masks out."""
    if comp_ids.shape != comp_mask.shape or prompt_ids.shape != prompt_mask.shape or len(prompt_ids) != len(comp_ids):
        raise ValueError(
            f"teacher_token_logp: prompt {tuple(prompt_ids.shape)}/{tuple(prompt_mask.shape)} and completion "
            f"{tuple(comp_ids.shape)}/{tuple(comp_mask.shape)} shapes disagree"
        )
    model = teacher.model
    grouped = group_size > 1 and len(comp_ids) % group_size == 0

    def forward(hidden: bool) -> torch.Tensor:
        if grouped:
            return grouped_sequence_logits(
                model,
                prompt_ids,
                prompt_mask,
                comp_ids,
                comp_mask,
                group_size=group_size,
                autocast_dtype=autocast_dtype,
                hidden=hidden,
            )
        return sequence_logits(
            model, prompt_ids, prompt_mask, comp_ids, comp_mask, autocast_dtype=autocast_dtype, hidden=hidden
        )

    logp, _ = logprobs.completion_stats(
        forward,
        lm_head_of(model),
        comp_ids,
        temperature=temperature,
        autocast_dtype=autocast_dtype,
        max_logits=max_logits,
    )
    return logp
