"""A local model folder checked before anything of it is loaded, and before the run folder exists (torch-free).

`rlcompare train`'s precheck and the run's preflight call `check_model_folder`: a folder that transformers would
refuse only after the run folder existed (code it would have to run, pickle weights, a damaged safetensors
header) is refused here in one line naming model.name_or_path and the fix. Reads config.json and the first bytes
of each safetensors file (its header), nothing else.
"""

from __future__ import annotations

import functools
import json
import math
import os
from pathlib import Path

from rlcompare.config import PICKLE_SUFFIXES, ConfigError

MAX_HEADER = 100_000_000  # bytes of a safetensors header (JSON); the format's own readers refuse more
_DTYPE_BYTES = {
    "BOOL": 1, "U8": 1, "I8": 1, "F8_E5M2": 1, "F8_E4M3": 1, "I16": 2, "U16": 2, "F16": 2, "BF16": 2,
    "I32": 4, "U32": 4, "F32": 4, "I64": 8, "U64": 8, "F64": 8,
}  # fmt: skip


def _error(msg: str) -> Exception:
    return ConfigError(msg)


def check_model(model_cfg) -> None:
    """`check_model_folder` for the config's model when it is a Hugging Face one (model.kind=hf)."""
    if model_cfg.kind == "hf":
        from rlcompare.config.model_source import check_gguf, model_folder

        check_gguf(model_cfg)  # model.gguf_file (and a package:<distribution> installed) before the folder
        check_model_folder(model_folder(model_cfg), bool(model_cfg.trust_remote_code))


def check_chat_template(cfg) -> None:
    """prompts.chat=true needs a tokenizer with a chat template: refused here, before the warm start or the model
    load, for the tiny model (its character tokenizer has none) and for a local folder whose tokenizer files hold
    none (a hub id is checked once its tokenizer loads, `prompt_ids.encode_prompts`)."""
    if not cfg.prompts.chat:
        return
    chat = f"prompts.chat=true (prompts={cfg.prompts.name})"
    if cfg.model.kind == "tiny":
        raise _error(
            f"{chat}: the tiny model's character tokenizer has no chat template; add prompts.chat=false "
            f"prompts.template=plain, or use a chat model (model=hf model.name_or_path=<an instruct model>)"
        )
    folder = Path(os.path.expanduser(str(cfg.model.name_or_path)))
    if folder.is_dir() and not _has_chat_template(folder):
        raise _error(
            f"{chat}: the tokenizer of model.name_or_path={str(cfg.model.name_or_path)!r} has no chat template; add "
            f"prompts.chat=false (with a plain prompts.template), or use a chat (instruct) model"
        )


def _has_chat_template(folder: Path) -> bool:
    """Whether transformers would find a chat template in the tokenizer files of `folder` (tokenizer_config.json's
    chat_template, or chat_template.jinja / .json beside it); a folder without tokenizer_config.json passes."""
    if (folder / "chat_template.jinja").is_file() or (folder / "chat_template.json").is_file():
        return True
    if (folder / "additional_chat_templates").is_dir():
        return True
    try:
        conf = json.loads((folder / "tokenizer_config.json").read_text(encoding="utf-8"))
    except FileNotFoundError:
        return True  # nothing to read here: the tokenizer's own load decides
    except (OSError, ValueError, RecursionError):
        return True  # an unreadable file is the loader's to report
    return not isinstance(conf, dict) or bool(conf.get("chat_template"))


def check_model_folder(path: str, trust_remote_code: bool) -> None:
    """Raise ConfigError when the local folder `path` cannot be loaded safely; a hub id (not a folder) passes."""
    folder = Path(os.path.expanduser(path))
    if not folder.is_dir():
        return
    key = f"model.name_or_path={path!r}"
    if (folder / "config.json").is_file():
        _check_config(folder / "config.json", key, trust_remote_code)
    files = sorted(p for p in folder.iterdir() if p.is_file())
    safetensors = [p for p in files if p.suffix == ".safetensors"]
    pickles = [p.name for p in files if p.suffix.lower() in PICKLE_SUFFIXES]
    if pickles and not safetensors:
        raise _error(
            f"{key} holds its weights only as pickle files {pickles[:4]}, which can run code when loaded and which "
            f"rlcompare never loads; save the model as safetensors (save_pretrained(..., safe_serialization=True))"
        )
    for p in safetensors:
        why = safetensors_header_problem(p)
        if why is not None:
            raise _error(f"{key}: {p.name} is not a readable safetensors file ({why}); save the model again")


def _check_config(config_file: Path, key: str, trust_remote_code: bool) -> None:
    try:
        conf = json.loads(config_file.read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError) as e:
        raise _error(f"{key}: config.json could not be read ({type(e).__name__}: {str(e)[:200]})") from None
    if not isinstance(conf, dict):
        raise _error(f"{key}: config.json is not a JSON object")
    model_type = conf.get("model_type")
    known = known_model_types()
    if trust_remote_code or known is None or (isinstance(model_type, str) and model_type in known):
        return
    if "auto_map" in conf:
        raise _error(
            f"{key}: its config.json names model_type {model_type!r}, which transformers does not know, and maps "
            f"it to code in the folder (auto_map); rlcompare runs no model code from a folder unless "
            f"model.trust_remote_code=true (only for a folder you trust)"
        )


@functools.lru_cache(maxsize=1)
def known_model_types() -> frozenset[str] | None:
    """The model types transformers builds without code from the folder (its CONFIG_MAPPING_NAMES, from the module
    that holds just that table: importing its config classes would import torch); None when this transformers
    keeps it elsewhere (the check is then left to transformers)."""
    try:
        from transformers.models.auto.auto_mappings import CONFIG_MAPPING_NAMES
    except ImportError:
        return None
    return frozenset(CONFIG_MAPPING_NAMES)


def safetensors_header_problem(path: Path) -> str | None:
    """What is wrong with the header of the safetensors file `path` (None: nothing): its 8-byte length, its JSON,
    each tensor's dtype, shape and byte range within the file."""
    try:
        size = path.stat().st_size
        with open(path, "rb") as f:
            n = int.from_bytes(f.read(8), "little")
            if size < 8 or n > min(size - 8, MAX_HEADER):
                return f"its header claims {n} bytes, the file holds {max(size - 8, 0)} after the length"
            header = json.loads(f.read(n).decode("utf-8"))
    except (OSError, ValueError, RecursionError) as e:
        return f"its header is not JSON: {type(e).__name__}"
    if not isinstance(header, dict):
        return "its header is not a JSON object"
    data = size - 8 - n
    for name, t in header.items():
        if name == "__metadata__":
            continue
        if not isinstance(t, dict) or t.get("dtype") not in _DTYPE_BYTES:
            return f"tensor {name[:80]!r} has no known dtype"
        shape, offsets = t.get("shape"), t.get("data_offsets")
        if not isinstance(shape, list) or not all(type(d) is int and d >= 0 for d in shape):
            return f"tensor {name[:80]!r} has a malformed shape"
        if not (isinstance(offsets, list) and len(offsets) == 2 and all(type(o) is int for o in offsets)):
            return f"tensor {name[:80]!r} has malformed data offsets"
        start, end = offsets
        if not 0 <= start <= end <= data or end - start != math.prod(shape) * _DTYPE_BYTES[t["dtype"]]:
            return f"tensor {name[:80]!r}'s bytes do not fit its shape or the file"
    return None


def check_teacher_folder(path: str, key: str = "teacher") -> None:
    """On-policy distillation's teacher (rlcompare.train.teacher), stricter than the policy's folder: a teacher is
    only scored, so a folder holding any pickle file or code (auto_map, *.py) is refused even beside safetensors,
    and trust_remote_code is never on. A hub id (not a folder) passes to the loader."""
    folder = Path(os.path.expanduser(path))
    if not folder.is_dir():
        if os.path.isabs(path) or path.startswith(("./", "../", "~")):
            raise _error(
                f"{key}={path!r} is not a folder; give a save_pretrained, export/ or `rlcompare export` folder"
            )
        return
    files = sorted(p for p in folder.iterdir() if p.is_file())
    pickles = [p.name for p in files if p.suffix.lower() in PICKLE_SUFFIXES]
    code = [p.name for p in files if p.suffix == ".py"]
    if pickles or code:
        raise _error(
            f"{key}={path!r} holds {'pickle files ' + str(pickles[:4]) if pickles else 'code ' + str(code[:4])}, "
            f"which rlcompare never loads for a teacher; save it with save_pretrained(safe_serialization=True) into "
            f"a folder of its own (or use `rlcompare export`)"
        )
    if not (folder / "config.json").is_file():
        raise _error(f"{key}={path!r} is a folder without config.json; point it at a save_pretrained folder")
    try:
        conf = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError) as e:
        raise _error(f"{key}: {path}/config.json could not be read ({type(e).__name__})") from None
    if isinstance(conf, dict) and "auto_map" in conf:
        raise _error(
            f"{key}={path!r}: its config.json maps the model to code (auto_map); rlcompare runs no teacher code"
        )
    for p in files:
        why = safetensors_header_problem(p) if p.suffix == ".safetensors" else None
        if why is not None:
            raise _error(f"{key}={path!r}: {p.name} is not a readable safetensors file ({why}); save the model again")


def check_teacher_run_folder(path: str, key: str = "teacher") -> None:
    """A run folder as the teacher (its newest checkpoint, read through `rlcompare export`'s reader): refused when
    any file in it, at any depth, is code (*.py) or a pickle, as a model folder is. A run rlcompare wrote holds
    neither; a folder that does was changed by someone, and its config.yaml is read only as data anyway."""
    folder = Path(os.path.expanduser(path))
    found = []
    for root, _dirs, names in os.walk(folder):
        found += [
            str(Path(root, n).relative_to(folder))
            for n in names
            if n.endswith(".py") or Path(n).suffix.lower() in PICKLE_SUFFIXES
        ]
        if len(found) >= 4:
            break
    if found:
        raise _error(
            f"{key}={path!r} is a run folder holding code or pickle files ({', '.join(sorted(found)[:4])}), which "
            f"rlcompare never loads for a teacher; export the run (`rlcompare export <run> --out <dir>`) and give "
            f"that folder, or remove those files if you made them"
        )
