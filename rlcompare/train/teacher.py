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

import torch

from rlcompare.rollout.sampler import grouped_sequence_logits, lm_head_of, sequence_logits
from rlcompare.train import logprobs

__all__ = ["Teacher", "check_same_tokenizer", "check_same_device", "load_teacher", "teacher_token_logp"]


@dataclass
class Teacher:
    model: torch.nn.Module  # eval mode, no parameter requires grad
    tokenizer: object
    source: str  # the path or hub id it was loaded from (named in errors and logs)


def _error(msg: str) -> Exception:
    from rlcompare.config import ConfigError  # a one-line error at the CLI

    return ConfigError(msg)


def _vocab_size(model: torch.nn.Module) -> int:
    return int(model.get_input_embeddings().weight.shape[0])


def check_same_tokenizer(student_tokenizer, student_model, teacher: Teacher, student_name: str) -> None:
    """The teacher must score the student's token ids as the same strings: the same vocabulary (token -> id), the
    same special tokens and the same embedding rows. One line naming both otherwise."""
    s_vocab, t_vocab = student_tokenizer.get_vocab(), teacher.tokenizer.get_vocab()
    both = f"the teacher {teacher.source!r} and the student {student_name!r}"
    if s_vocab != t_vocab:
        differ = sorted(set(s_vocab.items()) ^ set(t_vocab.items()), key=str)[:3]
        raise _error(
            f"teacher: {both} have different tokenizers ({len(t_vocab)} and {len(s_vocab)} tokens; e.g. {differ}); "
            f"on-policy distillation scores the student's token ids, so give a teacher of the same tokenizer family"
        )
    for name in ("eos_token_id", "pad_token_id", "bos_token_id"):
        s, t = getattr(student_tokenizer, name, None), getattr(teacher.tokenizer, name, None)
        if s is not None and t is not None and s != t:
            raise _error(f"teacher: {both} differ in {name} ({t} and {s}); give a teacher of the same tokenizer")
    if _vocab_size(teacher.model) != _vocab_size(student_model):
        raise _error(
            f"teacher: {both} have {_vocab_size(teacher.model)} and {_vocab_size(student_model)} embedding rows; "
            f"the log-probs of one are not comparable with the other's"
        )


def check_same_device(teacher_device: str, policy_device: str) -> None:
    """The teacher scores the rollout where it is: it must sit on the policy's device (no copies per batch)."""
    if torch.device(teacher_device).type != torch.device(policy_device).type:
        raise _error(
            f"teacher.device={teacher_device!r} is not the policy's device {policy_device!r}; leave teacher.device "
            f"unset (the policy's) or set both to the same device"
        )


def load_teacher(path: str, *, dtype: torch.dtype, device: str) -> Teacher:
    """The causal LM at `path` (a local folder: save_pretrained output, a run's `export/`, an `rlcompare export`
    folder; or a hub id), frozen, in `dtype` on `device`. Safetensors only; no code from the folder."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    full = os.path.expanduser(path)
    source = full if os.path.isdir(full) else path
    try:
        tokenizer = AutoTokenizer.from_pretrained(source, trust_remote_code=False)
        model = AutoModelForCausalLM.from_pretrained(source, dtype=dtype, trust_remote_code=False, use_safetensors=True)
    except (OSError, ValueError) as e:
        raise _error(
            f"teacher={path!r} could not be loaded as a causal LM with safetensors weights ({type(e).__name__}: "
            f"{str(e)[:200]}); give a save_pretrained folder, a run's export/ or an `rlcompare export` folder"
        ) from None
    model.eval().requires_grad_(False)
    return Teacher(model.to(device), tokenizer, path)


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
