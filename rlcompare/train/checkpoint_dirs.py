"""Where a run folder's checkpoints lie and how their folders are named (`checkpoints/step_<n>/state.safetensors`),
torch-free: `rlcompare.train.checkpoint` writes and reads them; a sweep's `--resume` and a teacher's identity
(`rlcompare.train.inputs`) only need to find the newest one, without loading torch."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Optional

FILE = "state.safetensors"  # a checkpoint folder's one file
STEP_DIR = re.compile(r"step_(\d{1,18})")  # what save() names a checkpoint folder; anything else is not one


def step_dirs(root: Path) -> list[Path]:
    """The checkpoint folders `save` wrote (step_<digits>) under `root`, oldest first; other names (a `step_5.bak`
    copy, a `step_-1`) are neither read nor deleted by rotation."""
    found = [p for p in root.iterdir() if STEP_DIR.fullmatch(p.name) and p.is_dir()]
    return sorted(found, key=lambda p: int(STEP_DIR.fullmatch(p.name).group(1)))


def candidates(run_dir: Path) -> list[Path]:
    """Checkpoint folders (complete ones were renamed into place), newest first, whatever their format."""
    root = Path(run_dir) / "checkpoints"
    if not root.exists():
        return []
    return list(reversed(step_dirs(root)))


def newest(run_dir: Path) -> tuple[Optional[int], Optional[Path]]:
    """(step, state file) of the run folder's newest complete checkpoint, or (None, None)."""
    for path in candidates(run_dir):
        return int(STEP_DIR.fullmatch(path.name).group(1)), path / FILE
    return None, None
