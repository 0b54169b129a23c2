"""On-policy distillation's teacher, checked before the run folder exists and before any model loads (torch-free,
so `rlcompare train`'s command-line check runs it): the folder (`model_folder.check_teacher_folder`), the device,
and the tokenizer against the student's. The loading and scoring are `rlcompare.train.teacher`."""

from __future__ import annotations

import os
from pathlib import Path

from rlcompare.config import ConfigError
from rlcompare.data.char_tokenizer import build_char_tokenizer


def _error(msg: str) -> Exception:
    return ConfigError(msg)


def check_same_vocab(student_tokenizer, teacher_tokenizer, teacher_name: str, student_name: str) -> None:
    """The teacher must read the student's token ids as the same strings: the same vocabulary (token -> id) and
    the same eos / bos ids. One line naming both otherwise. Needs the tokenizers only (run before the model loads)."""
    s_vocab, t_vocab = student_tokenizer.get_vocab(), teacher_tokenizer.get_vocab()
    both = f"the teacher {teacher_name!r} and the student {student_name!r}"
    if s_vocab != t_vocab:
        differ = sorted(set(s_vocab.items()) ^ set(t_vocab.items()), key=str)[:3]
        raise _error(
            f"teacher: {both} have different tokenizers ({len(t_vocab)} and {len(s_vocab)} tokens; e.g. {differ}); "
            f"on-policy distillation scores the student's token ids, so give a teacher of the same tokenizer family"
        )
    for name in ("eos_token_id", "bos_token_id"):
        s, t = getattr(student_tokenizer, name, None), getattr(teacher_tokenizer, name, None)
        if s is not None and t is not None and s != t:
            raise _error(f"teacher: {both} differ in {name} ({t} and {s}); give a teacher of the same tokenizer")


def check_same_device(teacher_device: str, policy_device: str) -> None:
    """The teacher scores the rollout where it is: it must sit on the policy's device (no copies per batch)."""
    if teacher_device.split(":")[0] != policy_device.split(":")[0]:
        raise _error(
            f"teacher.device={teacher_device!r} is not the policy's device {policy_device!r}; leave teacher.device "
            f"unset (the policy's) or set both to the same device"
        )


def is_run_folder(path: str) -> bool:
    """A run folder (results/<experiment>/<run>): its config.yaml and checkpoints/, read by `rlcompare export`'s
    reader (safetensors, shapes checked) instead of a Hugging Face folder's loader."""
    folder = Path(os.path.expanduser(path))
    return (folder / "config.yaml").is_file() and (folder / "checkpoints").is_dir()


def student_tokenizer(model_cfg):
    """The tokenizer the policy of `model_cfg` uses (model=tiny: the character tokenizer made in code)."""
    from transformers import AutoTokenizer

    if model_cfg.kind == "tiny":
        return build_char_tokenizer()
    from rlcompare.config.model_source import gguf_file_of, model_folder

    gguf = {"gguf_file": gguf_file_of(model_cfg)} if gguf_file_of(model_cfg) else {}
    return AutoTokenizer.from_pretrained(
        model_folder(model_cfg), trust_remote_code=bool(model_cfg.trust_remote_code), **gguf
    )


def teacher_tokenizer(path: str):
    """The tokenizer of the teacher at `path`: a run folder's model's (its config.yaml read as data: its
    model.trust_remote_code is never used), else the folder's (or hub id's) own."""
    from transformers import AutoTokenizer

    from rlcompare.config.foreign import read_run_config

    if is_run_folder(path):
        return student_tokenizer(read_run_config(Path(os.path.expanduser(path)) / "config.yaml", "teacher.path").model)
    full = os.path.expanduser(path)
    return AutoTokenizer.from_pretrained(full if os.path.isdir(full) else path, trust_remote_code=False)


def check_teacher(cfg) -> None:
    """Everything about `teacher` that can be refused before the run folder exists and before any model loads:
    the folder (no pickle, no code), the device, and the tokenizer against the student's."""
    from rlcompare.train.model_folder import check_teacher_folder, check_teacher_run_folder

    path = str(cfg.teacher.path)
    if is_run_folder(path):
        check_teacher_run_folder(path, key="teacher.path")
    else:
        check_teacher_folder(path, key="teacher.path")
    if cfg.teacher.device is not None and cfg.device != "auto":  # auto: the trainer compares once resolved
        check_same_device(str(cfg.teacher.device), str(cfg.device))
    try:
        teacher_tok = teacher_tokenizer(path)
    except (OSError, ValueError) as e:
        raise _error(
            f"teacher.path={path!r}: its tokenizer could not be loaded ({type(e).__name__}: {str(e)[:200]}); give "
            f"a save_pretrained folder, a run folder, a run's export/ or an `rlcompare export` folder"
        ) from None
    student = cfg.model.name if cfg.model.kind == "tiny" else str(cfg.model.name_or_path)
    check_same_vocab(student_tokenizer(cfg.model), teacher_tok, path, student)
