"""Checkpoints that let a run continue exactly: weights, optimizer/scheduler, every RNG, data position, counters.

A checkpoint is `checkpoints/step_<n>/state.pt`, written under a temporary name (`.tmp_step_<n>_<pid>`) and
renamed, so a kill mid-save leaves the previous checkpoints intact; only the newest `keep` are kept.

What it holds (everything `Trainer.step()` reads that is not rebuilt identically from the config):
policy weights (only the trainable ones with LoRA), critic weights and optimizer, policy optimizer and LR
scheduler, the torch / CUDA / numpy / python RNG states, the sampler's and the minibatch shuffle's generators,
the prompt stream's position, and `Trainer.state` (step and token counters, non-finite streak, skipped
updates, verifier errors, elapsed training time, eval initial/best/last). Dynamic sampling keeps no state
across steps (each step refills its own batch), so there is nothing more to save for it. The reference model
is the initial policy, rebuilt from the same (cached) initial weights.
"""

from __future__ import annotations

import os
import random
import shutil
import sys
from pathlib import Path

import numpy as np
import torch

FORMAT_VERSION = 2


def _rng_state(tr) -> dict:
    return {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state(),
            "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None,
            "sampler": tr.gen.get_state(), "shuffle": tr.shuffle_gen.get_state()}


def _policy_weights(tr) -> dict:
    """The policy's weights; with LoRA only the trainable (adapter) tensors, the base is reloaded as it was."""
    sd = tr.policy.model.state_dict()
    if getattr(tr.policy, "lora", False):
        trainable = {n for n, p in tr.policy.model.named_parameters() if p.requires_grad}
        sd = {k: v for k, v in sd.items() if k in trainable}
    return sd


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _step_dirs(root: Path) -> list[Path]:
    return sorted(p for p in root.iterdir() if p.name.startswith("step_") and p.is_dir())


def save(tr, keep: int) -> Path:
    """Write checkpoints/step_<n>/ under a temporary name, rename, keep the newest `keep`."""
    root = tr.run_dir / "checkpoints"
    root.mkdir(exist_ok=True)
    for stale in root.glob(".tmp_step_*"):  # left by a process killed mid-save
        shutil.rmtree(stale, ignore_errors=True)
    step = tr.state["step"]
    final = root / f"step_{step:08d}"
    tmp = root / f".tmp_step_{step:08d}_{os.getpid()}"
    tmp.mkdir()
    try:
        blob = {"version": FORMAT_VERSION, "step": step, "policy": _policy_weights(tr), "opt": tr.opt.state_dict(),
                "sched": tr.sched.state_dict(), "state": dict(tr.state), "stream_position": tr.stream.position,
                "rng": _rng_state(tr), "lora": bool(getattr(tr.policy, "lora", False))}
        if tr.critic is not None:
            blob["critic"] = tr.critic.state_dict()
            blob["critic_opt"] = tr.critic_opt.state_dict()
        with open(tmp / "state.pt", "wb") as f:
            torch.save(blob, f)
            f.flush()
            os.fsync(f.fileno())
        shutil.rmtree(final, ignore_errors=True)
        os.replace(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    _fsync_dir(root)
    for old in _step_dirs(root)[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def candidates(run_dir: Path) -> list[Path]:
    """Complete checkpoints, newest first."""
    root = Path(run_dir) / "checkpoints"
    if not root.exists():
        return []
    return [p for p in reversed(_step_dirs(root)) if (p / "state.pt").exists()]


def latest(run_dir: Path) -> Path | None:
    done = candidates(run_dir)
    return done[0] if done else None


def step_of(path: Path) -> int:
    return int(Path(path).name.split("_", 1)[1])


def read(path: Path, device="cpu") -> dict:
    return torch.load(Path(path) / "state.pt", map_location=device, weights_only=False)


def load(tr, path: Path, blob: dict | None = None) -> None:
    """Put the trainer in the state saved at `path` (weights, optimizers, RNGs, data position, counters)."""
    if blob is None:
        blob = read(path, tr.device)
    if blob.get("lora"):
        missing, unexpected = tr.policy.model.load_state_dict(blob["policy"], strict=False)
        if unexpected:
            raise RuntimeError(f"checkpoint {path}: unexpected policy weights {unexpected[:5]}")
    else:
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
        torch.cuda.set_rng_state_all([s.cpu() for s in rng["cuda"]])
    tr.gen.set_state(rng["sampler"].cpu())
    tr.shuffle_gen.set_state(rng["shuffle"].cpu())


def load_latest(tr, run_dir: Path, max_step: int | None = None) -> Path | None:
    """Load the newest checkpoint at or below `max_step` that reads back; a damaged one is skipped (with a
    message) for the one before it. Returns its path, or None when there is none."""
    for path in candidates(run_dir):
        if max_step is not None and step_of(path) > max_step:
            print(f"[rlcompare] skipping checkpoint {path.name}: the run's rows stop before it", file=sys.stderr)
            continue
        try:
            blob = read(path, tr.device)
        except Exception as e:  # noqa: BLE001 - a torn or corrupt file: fall back to an older one
            print(f"[rlcompare] checkpoint {path} could not be read ({type(e).__name__}: {e}); trying an older one",
                  file=sys.stderr)
            continue
        load(tr, path, blob)  # a file that reads but does not fit the model is a real error: raise
        return path
    return None
