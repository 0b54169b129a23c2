"""On-policy distillation's teacher, checked before the run folder exists and before any model loads (torch-free,
so `rlcompare train`'s command-line check runs it): the folder (`model_folder.check_teacher_folder`), the device,
and the tokenizer against the student's. The loading and scoring are `rlcompare.train.teacher`."""

from __future__ import annotations

import os
import re
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


_COMMIT = re.compile(r"[0-9a-f]{40}")  # a git commit hash as the hub names a snapshot


def is_local_path(path: str) -> bool:
    """`teacher.path` names something on this machine (a folder, or written as a path: absolute, ./, ../, ~, or with
    two or more '/', which no hub id has: ids are `name` or `namespace/name`, e.g. a results/ export a sweep makes
    first); else a Hugging Face hub id."""
    written_as_path = os.path.isabs(path) or path.startswith(("./", "../", "~")) or path.count("/") >= 2
    return os.path.isdir(os.path.expanduser(path)) or written_as_path


def check_hub_revision(path: str, revision) -> None:
    """A hub teacher is an input the run must pin: under a bare id the hub serves whatever its main branch holds at
    each load, so a resume (or the next arm of a comparison) could score with other weights under the same config.
    A hub id needs `teacher.revision=<commit>` (40 hex digits; a branch or tag moves too), which the run loads and
    records (rlcompare.train.inputs); a local folder's files are hashed instead, so a revision there is refused as
    meaningless. Nothing is read or downloaded here: it runs before any tokenizer or model loads."""
    if is_local_path(path):
        if revision is not None:
            raise _error(
                f"teacher.revision={revision!r} pins a hub model, but teacher.path={path!r} is a local path (its files "
                f"are what the run records); set teacher.revision=null"
            )
        return
    if revision is None:
        raise _error(
            f"teacher.path={path!r} is not a local folder, so it names a Hugging Face hub model, whose files can change "
            f"under that name between runs or between a run and its resume; pin it with teacher.revision=<its commit "
            f"hash, 40 hex digits: the model page's 'Files and versions' history>, or download it (`huggingface-cli "
            f"download {path} --local-dir <folder>`) and set teacher.path=<folder>"
        )
    if not _COMMIT.fullmatch(str(revision)):
        raise _error(
            f"teacher.revision={revision!r} is not a commit hash (40 lowercase hex digits): a branch or tag can move "
            f"between a run and its resume; give the commit it points to now (the model page's history)"
        )


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


def teacher_tokenizer(path: str, revision=None):
    """The tokenizer of the teacher at `path`: a run folder's model's (its config.yaml read as data: its
    model.trust_remote_code is never used), else the folder's (or hub id's, at `revision`) own."""
    from transformers import AutoTokenizer

    from rlcompare.config.foreign import read_run_config

    if is_run_folder(path):
        return student_tokenizer(read_run_config(Path(os.path.expanduser(path)) / "config.yaml", "teacher.path").model)
    full = os.path.expanduser(path)
    if os.path.isdir(full):
        return AutoTokenizer.from_pretrained(full, trust_remote_code=False)
    return AutoTokenizer.from_pretrained(path, revision=revision, trust_remote_code=False)


def check_teacher(cfg) -> None:
    """Everything about `teacher` that can be refused before the run folder exists and before any model loads:
    a hub id's pinned revision (before anything is downloaded), the folder (no pickle, no code), the device, and
    the tokenizer against the student's."""
    from rlcompare.train.model_folder import check_teacher_folder, check_teacher_run_folder

    path, revision = str(cfg.teacher.path), cfg.teacher.get("revision")
    check_hub_revision(path, revision)
    if is_run_folder(path):
        check_teacher_run_folder(path, key="teacher.path")
    else:
        check_teacher_folder(path, key="teacher.path")
    if cfg.teacher.device is not None and cfg.device != "auto":  # auto: the trainer compares once resolved
        check_same_device(str(cfg.teacher.device), str(cfg.device))
    try:
        teacher_tok = teacher_tokenizer(path, revision)
    except (OSError, ValueError) as e:
        raise _error(
            f"teacher.path={path!r}: its tokenizer could not be loaded ({type(e).__name__}: {str(e)[:200]}); give "
            f"a save_pretrained folder, a run folder, a run's export/ or an `rlcompare export` folder"
        ) from None
    student = cfg.model.name if cfg.model.kind == "tiny" else str(cfg.model.name_or_path)
    check_same_vocab(student_tokenizer(cfg.model), teacher_tok, path, student)
