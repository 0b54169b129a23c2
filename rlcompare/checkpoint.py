"""Checkpoints that let a run continue exactly: weights, optimizer/scheduler, every RNG, data position, counters."""

from __future__ import annotations

import os
import random
import shutil
from pathlib import Path

import numpy as np
import torch


def _rng_state(tr) -> dict:
    return {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state(),
            "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None,
            "sampler": tr.gen.get_state(), "shuffle": tr.shuffle_gen.get_state()}


def save(tr, keep: int) -> Path:
    """Write checkpoints/step_<n>/ under a temporary name, rename, keep the newest `keep`."""
    root = tr.run_dir / "checkpoints"
    root.mkdir(exist_ok=True)
    step = tr.state["step"]
    final = root / f"step_{step:08d}"
    tmp = root / f".tmp_step_{step:08d}_{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    trainable = {k: v for k, v in tr.policy.model.state_dict().items()}
    blob = {"policy": trainable, "opt": tr.opt.state_dict(), "sched": tr.sched.state_dict(),
            "state": dict(tr.state), "stream_position": tr.stream.position, "rng": _rng_state(tr)}
    if tr.critic is not None:
        blob["critic"] = tr.critic.state_dict()
        blob["critic_opt"] = tr.critic_opt.state_dict()
    torch.save(blob, tmp / "state.pt")
    with open(tmp / "state.pt", "rb+") as f:
        os.fsync(f.fileno())
    shutil.rmtree(final, ignore_errors=True)
    os.replace(tmp, final)
    for old in sorted(p for p in root.iterdir() if p.name.startswith("step_"))[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def latest(run_dir: Path) -> Path | None:
    root = Path(run_dir) / "checkpoints"
    if not root.exists():
        return None
    done = sorted(p for p in root.iterdir() if p.name.startswith("step_") and (p / "state.pt").exists())
    return done[-1] if done else None


def load(tr, path: Path) -> None:
    blob = torch.load(path / "state.pt", map_location=tr.device, weights_only=False)
    tr.policy.model.load_state_dict(blob["policy"])
    tr.opt.load_state_dict(blob["opt"])
    tr.sched.load_state_dict(blob["sched"])
    if tr.critic is not None:
        tr.critic.load_state_dict(blob["critic"])
        tr.critic_opt.load_state_dict(blob["critic_opt"])
    tr.state.update(blob["state"])
    tr.stream.position = blob["stream_position"]
    rng = blob["rng"]
    random.setstate(rng["python"])
    np.random.set_state(rng["numpy"])
    torch.set_rng_state(rng["torch"].cpu())
    if rng["cuda"] is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(rng["cuda"])
    tr.gen.set_state(rng["sampler"].cpu())
    tr.shuffle_gen.set_state(rng["shuffle"].cpu())
