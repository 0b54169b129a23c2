"""Checkpoints that let a run continue exactly: weights, optimizer/scheduler, every RNG, data position, counters.

A checkpoint is `checkpoints/step_<n>/state.safetensors`, written under a temporary name (`.tmp_step_<n>_<pid>`)
and renamed, so a kill mid-save leaves the previous checkpoints intact; only the newest `keep` are kept.

Loading one never runs code: every tensor (weights, optimizer moments, RNG states) is a safetensors tensor, and
everything else (scheduler, counters, the python/numpy RNG's integers, optimizer hyperparameters) is JSON in the
file's metadata, with tensors referenced by name. No pickle is read: an older `state.pt` (torch.save, which
unpickles on load and so can execute code) is refused like a damaged file, with a message saying why.

What it holds (everything `Trainer.step()` reads that is not rebuilt identically from the config):
policy weights (only the trainable ones with LoRA), critic weights and optimizer, policy optimizer and LR
scheduler, the torch / CUDA / numpy / python RNG states, the sampler's and the minibatch shuffle's generators,
the prompt stream's position, and `Trainer.state` (step and token counters, non-finite streak, skipped
updates, verifier errors, elapsed training time, eval initial/best/last). Dynamic sampling keeps no state
across steps (each step refills its own batch), so there is nothing more to save for it. The reference model
is the initial policy, rebuilt from the same (cached) initial weights.

Which one a resume loads: the newest that reads back and is at or below the last step in metrics.jsonl; a damaged
or refused one is skipped (with a message) for the one before it. When there are checkpoints but none can be
used, `read_latest` raises `NoUsableCheckpoint` (the run is refused, nothing is deleted) instead of letting the
run restart from step 0.
"""

from __future__ import annotations

import json
import math
import os
import random
import shutil
import sys
from pathlib import Path

import numpy as np
import torch

from rlcompare.train import sharding
from rlcompare.train.batch import TrainerState
from rlcompare.train.checkpoint_dirs import FILE, candidates  # noqa: F401 - re-exported: the readers' names here
from rlcompare.train.checkpoint_dirs import STEP_DIR as _STEP_DIR
from rlcompare.train.checkpoint_dirs import step_dirs as _step_dirs

FORMAT = "rlcompare-checkpoint"
FORMAT_VERSION = 3  # 3: safetensors + JSON (2 was a pickled state.pt)
PICKLE_FILE = "state.pt"  # the format before version 3: never read
_TREE_KEY = "tree"  # the metadata entry holding the JSON tree
_NUMPY_DTYPES = {"uint32", "int64", "int32", "float64", "float32"}  # what an RNG state array may be


class CheckpointError(ValueError):
    """A checkpoint that cannot be read back safely (damaged, another format, or one that needs pickle)."""


class NoUsableCheckpoint(CheckpointError):
    """The run folder holds checkpoints, but none can be resumed from."""


# ----------------------------------------------------------------------------- JSON + tensors encoding
def _encode(obj, path: str, tensors: dict, seen: dict):
    """The JSON form of `obj`; its tensors go to `tensors` under their path. Only plain data is accepted, so that
    decoding needs no code: dicts, lists, tuples, str, int, float (non-finite ones marked), bool, None, tensors,
    numpy arrays and numpy scalars."""
    if isinstance(obj, torch.Tensor):
        return {"__tensor__": _store(obj, path, tensors, seen)}
    if isinstance(obj, np.ndarray):
        if str(obj.dtype) not in _NUMPY_DTYPES:
            raise TypeError(f"checkpoint: numpy array of dtype {obj.dtype} at {path} is not supported")
        key = _store(
            torch.from_numpy(obj.astype(np.int64 if obj.dtype.kind in "ui" else np.float64)), path, tensors, seen
        )
        return {"__ndarray__": key, "dtype": str(obj.dtype)}
    if isinstance(obj, np.generic):
        obj = obj.item()
    if isinstance(obj, bool) or obj is None or isinstance(obj, (int, str)):
        return obj
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else {"__float__": repr(obj)}  # 'nan', 'inf', '-inf'
    if isinstance(obj, dict):
        if all(isinstance(k, str) and not k.startswith("__") for k in obj):
            return {k: _encode(v, f"{path}/{k}", tensors, seen) for k, v in obj.items()}
        return {
            "__dict__": [
                [_encode(k, f"{path}/key{i}", tensors, seen), _encode(v, f"{path}/{k}", tensors, seen)]
                for i, (k, v) in enumerate(obj.items())
            ]
        }  # optimizer state: integer keys
    if isinstance(obj, tuple):
        return {"__tuple__": [_encode(v, f"{path}/{i}", tensors, seen) for i, v in enumerate(obj)]}
    if isinstance(obj, list):
        return [_encode(v, f"{path}/{i}", tensors, seen) for i, v in enumerate(obj)]
    raise TypeError(f"checkpoint: cannot store a {type(obj).__name__} at {path} (only plain data and tensors)")


def _store(t: torch.Tensor, path: str, tensors: dict, seen: dict) -> str:
    """Add `t` under `path`; the same tensor twice (tied weights) is stored once and referenced twice. safetensors
    refuses tensors that share memory, so a view of another stored tensor is copied."""
    t = t.detach().cpu()
    ident = (t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape), tuple(t.stride()), t.dtype)
    if t.numel() and ident in seen["views"]:
        return seen["views"][ident]
    storage = t.untyped_storage().data_ptr()
    if not t.is_contiguous() or (t.numel() and storage in seen["storages"]):
        t = t.clone(memory_format=torch.contiguous_format)
    if t.numel():
        seen["views"][ident] = path
        seen["storages"].add(storage)
    tensors[path] = t
    return path


def _decode(obj, tensors: dict):
    if isinstance(obj, list):
        return [_decode(v, tensors) for v in obj]
    if not isinstance(obj, dict):
        return obj
    marks = [k for k in obj if k.startswith("__")]
    if not marks:
        return {k: _decode(v, tensors) for k, v in obj.items()}
    kind = marks[0]
    if kind == "__tensor__" and set(obj) == {kind}:
        return _tensor(tensors, obj[kind])
    if kind == "__ndarray__" and set(obj) == {kind, "dtype"} and obj["dtype"] in _NUMPY_DTYPES:
        return _tensor(tensors, obj[kind]).numpy().astype(obj["dtype"])
    if kind == "__float__" and set(obj) == {kind} and obj[kind] in ("nan", "inf", "-inf"):
        return float(obj[kind])
    if kind == "__tuple__" and set(obj) == {kind} and isinstance(obj[kind], list):
        return tuple(_decode(v, tensors) for v in obj[kind])
    if kind == "__dict__" and set(obj) == {kind} and isinstance(obj[kind], list):
        if not all(isinstance(kv, list) and len(kv) == 2 for kv in obj[kind]):
            raise CheckpointError("malformed __dict__ entry")
        return {_decode(k, tensors): _decode(v, tensors) for k, v in obj[kind]}
    raise CheckpointError(f"unknown entry {sorted(obj)[:3]} in the checkpoint's JSON")


def _tensor(tensors: dict, key) -> torch.Tensor:
    if not isinstance(key, str) or key not in tensors:
        raise CheckpointError(f"the checkpoint's JSON names a tensor {key!r} that its file does not hold")
    return tensors[key]


# ----------------------------------------------------------------------------- what is saved
def _rng_state(tr) -> dict:
    return {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None,
        "sampler": tr.gen.get_state(),
        "shuffle": tr.shuffle_gen.get_state(),
    }


def _policy_weights(tr) -> dict:
    """The policy's weights; with LoRA only the trainable (adapter) tensors, the base is reloaded as it was."""
    sd = tr.policy.model.state_dict()
    if getattr(tr.policy, "lora", False):
        trainable = {n for n, p in tr.policy.model.named_parameters() if p.requires_grad}
        sd = {k: v for k, v in sd.items() if k in trainable}
    return sd


def _blob(tr) -> dict:
    blob = {
        "version": FORMAT_VERSION,
        "step": tr.state.step,
        "policy": _policy_weights(tr),
        # the full tensors whatever the parallel mode: a checkpoint resumes under any
        "opt": sharding.full_optimizer_state(tr.opt),
        "sched": tr.sched.state_dict(),
        "state": tr.state.as_dict(),
        "stream_position": tr.stream.position,
        "rng": _rng_state(tr),
        "lora": bool(getattr(tr.policy, "lora", False)),
    }
    if tr.critic is not None:
        blob["critic"] = tr.critic.state_dict()
        blob["critic_opt"] = tr.critic_opt.state_dict()
    if tr.cfg.rollout.staleness:  # the rollouts sampled ahead: a resumed run trains on the same batches
        blob["pending"] = tr.queue.state(tr.train_prompts)
    return blob


def write_file(blob: dict, path: Path) -> None:
    """`blob` (plain data and tensors) as one safetensors file: tensors by path, the rest as JSON metadata."""
    from safetensors.torch import save_file

    tensors: dict = {}
    tree = _encode(blob, "", tensors, {"views": {}, "storages": set()})
    meta = {"format": FORMAT, "version": str(FORMAT_VERSION), _TREE_KEY: json.dumps(tree, allow_nan=False)}
    save_file(tensors, str(path), metadata=meta)


def read_file(path: Path) -> dict:
    """The blob `write_file` wrote; raises CheckpointError for anything else. Reads tensors and JSON only."""
    from safetensors import safe_open

    try:
        with safe_open(str(path), framework="pt", device="cpu") as f:
            meta = f.metadata() or {}
            if meta.get("format") != FORMAT or meta.get("version") != str(FORMAT_VERSION):
                raise CheckpointError(
                    f"not an rlcompare checkpoint of format {FORMAT_VERSION} "
                    f"(format={meta.get('format')!r}, version={meta.get('version')!r})"
                )
            tree = json.loads(meta[_TREE_KEY])
            tensors = {k: f.get_tensor(k) for k in f.keys()}
        blob = _decode(tree, tensors)
    except CheckpointError:
        raise
    except Exception as e:  # noqa: BLE001 - torn, truncated, not safetensors, bad or too deep JSON: "unreadable"
        raise CheckpointError(f"{type(e).__name__}: {str(e)[:200]}") from None
    if not isinstance(blob, dict) or blob.get("version") != FORMAT_VERSION:
        raise CheckpointError("its JSON is not a checkpoint of this format")
    return blob


# ----------------------------------------------------------------------------- files
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


def _fsync_file(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def save(tr, keep: int, *, write: bool = True) -> Path | None:
    """Write checkpoints/step_<n>/ under a temporary name, rename, keep the newest `keep`. Under fsdp every rank
    calls it (the optimizer state is gathered from all) and the writer alone passes write=True."""
    blob = _blob(tr)
    if not write:
        return None
    root = tr.run_dir / "checkpoints"
    root.mkdir(exist_ok=True)
    for stale in root.glob(".tmp_step_*"):  # left by a process killed mid-save
        shutil.rmtree(stale, ignore_errors=True)
    step = tr.state.step
    final = root / f"step_{step:08d}"
    tmp = root / f".tmp_step_{step:08d}_{os.getpid()}"
    tmp.mkdir()
    try:
        write_file(blob, tmp / FILE)
        _fsync_file(tmp / FILE)
        shutil.rmtree(final, ignore_errors=True)
        os.replace(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    _fsync_dir(root)
    for old in _step_dirs(root)[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def latest(run_dir: Path) -> Path | None:
    done = candidates(run_dir)
    return done[0] if done else None


def step_of(path: Path) -> int:
    m = _STEP_DIR.fullmatch(Path(path).name)
    if m is None:
        raise CheckpointError(f"{Path(path).name} is not a checkpoint folder name (step_<n>)")
    return int(m.group(1))


def read(path: Path) -> dict:
    """The checkpoint in folder `path`; CheckpointError when it is damaged or not in the safe format."""
    path = Path(path)
    if not (path / FILE).exists():
        if (path / PICKLE_FILE).exists():
            raise CheckpointError(
                f"it is a pickled {PICKLE_FILE} (the format before version {FORMAT_VERSION}); loading "
                f"one can execute code, so it is not read"
            )
        raise CheckpointError(f"it holds no {FILE}")
    blob = read_file(path / FILE)
    if blob.get("step") != step_of(path):
        raise CheckpointError(f"it records step {blob.get('step')!r}, not the step in its name")
    _check_shape(blob)
    return blob


def _check_shape(blob: dict) -> None:
    """What `load` reads has the types it expects (a crafted file fails here, before the model loads)."""

    def need(ok: bool, what: str) -> None:
        if not ok:
            raise CheckpointError(f"its {what} is malformed")

    tensors = lambda d: (
        isinstance(d, dict)
        and all(
            isinstance(k, str) and isinstance(v, torch.Tensor)  # noqa: E731
            for k, v in d.items()
        )
    )
    optim = lambda d: (
        isinstance(d, dict)
        and isinstance(d.get("state"), dict)  # noqa: E731
        and isinstance(d.get("param_groups"), list)
        and all(isinstance(g, dict) for g in d["param_groups"])
    )
    need(tensors(blob.get("policy")), "policy weights")
    need(optim(blob.get("opt")), "optimizer state")
    need(isinstance(blob.get("sched"), dict), "scheduler state")
    st = blob.get("state")
    need(isinstance(st, dict) and st.get("step") == blob["step"] and _counters_in_range(st), "trainer state")
    need(isinstance(blob.get("stream_position"), int) and blob["stream_position"] >= 0, "data position")
    rng = blob.get("rng")
    need(
        isinstance(rng, dict) and isinstance(rng.get("python"), tuple) and isinstance(rng.get("numpy"), tuple),
        "RNG state",
    )
    byte_state = lambda t: isinstance(t, torch.Tensor) and t.dtype == torch.uint8  # noqa: E731
    need(all(byte_state(rng.get(k)) for k in ("torch", "sampler", "shuffle")), "RNG state")
    need(
        rng.get("cuda") is None or (isinstance(rng["cuda"], list) and all(map(byte_state, rng["cuda"]))),
        "CUDA RNG state",
    )
    if "critic" in blob or "critic_opt" in blob:
        need(tensors(blob.get("critic")) and optim(blob.get("critic_opt")), "critic state")
    for part in ("policy", "critic", "opt", "critic_opt"):
        need(_all_finite(blob.get(part)), f"{part} tensors (not all finite)")


def _counters_in_range(st: dict) -> bool:
    """The trainer's counters as a run can hold them: a step >= 1 (a checkpoint is saved after a step), counts
    that are non-negative ints (steps skipped in a row: at most the steps), times finite, accuracies in [0, 1]."""
    ints = ("step", "tokens", "bad_in_row", "skipped_updates", "verifier_errors")
    if not all(type(st.get(k)) is int and st[k] >= 0 for k in ints) or st["step"] < 1:
        return False
    if st["bad_in_row"] > st["step"]:
        return False
    applied = st.get("applied_updates")  # absent in checkpoints written before it was counted
    if applied is not None and not (type(applied) is int and applied >= 0):
        return False
    elapsed = st.get("elapsed")
    if not isinstance(elapsed, (int, float)) or isinstance(elapsed, bool) or not 0 <= elapsed < math.inf:
        return False
    accuracies = [st.get(k) for k in ("eval_initial", "eval_best", "eval_last")]
    return all(
        a is None or (isinstance(a, (int, float)) and not isinstance(a, bool) and 0 <= a <= 1) for a in accuracies
    )


def _all_finite(tree) -> bool:
    """Every floating-point tensor in `tree` (nested dicts and lists) is finite: a NaN or inf weight or moment
    would train silently into NaN."""
    if isinstance(tree, torch.Tensor):
        return not tree.is_floating_point() or bool(torch.isfinite(tree).all())
    if isinstance(tree, dict):
        return all(_all_finite(v) for v in tree.values())
    if isinstance(tree, (list, tuple)):
        return all(_all_finite(v) for v in tree)
    return True


def check_fits(tr, blob: dict) -> None:
    """The checkpoint's tensors fit this trainer exactly, before any of them is loaded: every weight (policy,
    critic) has the name, shape and dtype of the model's own, and every optimizer state has one entry per
    parameter with moments shaped and typed like it. A short moment (a crafted file) would otherwise be written
    past its end by the fused AdamW kernel. Raises CheckpointError naming the first misfit."""
    fits_weights("policy", blob["policy"], _policy_weights(tr), partial=bool(blob.get("lora")))
    _fits_optimizer("optimizer", blob["opt"], tr.opt)
    if (tr.critic is None) != ("critic" not in blob):
        raise CheckpointError("it was written by a run with a different critic setting")
    if tr.critic is not None:
        fits_weights("critic", blob["critic"], tr.critic.state_dict())
        _fits_optimizer("critic optimizer", blob["critic_opt"], tr.critic_opt)


def fits_weights(what: str, saved: dict, model: dict, partial: bool = False) -> None:
    """`saved` weights have the names (all of them unless `partial`), shapes and dtypes of `model`'s state dict;
    CheckpointError naming the first misfit (also `rlcompare export`'s check)."""
    missing = sorted(set(model) - set(saved))
    extra = sorted(set(saved) - set(model))
    if extra or (missing and not partial):
        raise CheckpointError(f"its {what} weights do not match the model's (missing {missing[:3]}, extra {extra[:3]})")
    for name, t in saved.items():
        if tuple(t.shape) != tuple(model[name].shape) or t.dtype != model[name].dtype:
            raise CheckpointError(
                f"its {what} weight {name} is {tuple(t.shape)} {t.dtype}, the model's is "
                f"{tuple(model[name].shape)} {model[name].dtype}"
            )


def _fits_optimizer(what: str, saved: dict, opt: torch.optim.Optimizer) -> None:
    """`saved` (a state_dict) against the optimizer `opt` of this run's parameters (AdamW: exp_avg, exp_avg_sq,
    and max_exp_avg_sq with amsgrad, each the parameter's shape and dtype; `step` a finite scalar >= 0)."""
    params = [p for g in opt.param_groups for p in g["params"]]
    groups = [g.get("params") for g in saved["param_groups"]]
    start, want = 0, []
    for g in opt.param_groups:
        want.append(list(range(start, start + len(g["params"]))))
        start += len(g["params"])
    if groups != want:
        raise CheckpointError(f"its {what} has parameter groups {_short(groups)}, this run's are {_short(want)}")
    for index, entry in saved["state"].items():
        if type(index) is not int or not 0 <= index < len(params) or not isinstance(entry, dict):
            raise CheckpointError(f"its {what} holds a state for parameter {index!r}, which this run does not have")
        _fits_moments(f"{what} state of parameter {index}", entry, params[index], opt)


def _fits_moments(what: str, entry: dict, p: torch.Tensor, opt: torch.optim.Optimizer) -> None:
    amsgrad = any(g.get("amsgrad") for g in opt.param_groups)
    names = {"step", "exp_avg", "exp_avg_sq"} | ({"max_exp_avg_sq"} if amsgrad else set())
    if set(entry) != names:
        raise CheckpointError(f"its {what} holds {sorted(entry)}, not {sorted(names)}")
    step = entry["step"]
    if isinstance(step, torch.Tensor):
        ok = step.dim() == 0 and step.is_floating_point() and bool(torch.isfinite(step)) and float(step) >= 0
    else:
        ok = isinstance(step, (int, float)) and not isinstance(step, bool) and 0 <= step < math.inf
    if not ok:
        raise CheckpointError(f"its {what}: `step` is not a finite scalar >= 0")
    for name in sorted(names - {"step"}):
        t = entry[name]
        if not isinstance(t, torch.Tensor) or tuple(t.shape) != tuple(p.shape) or t.dtype != p.dtype:
            got = f"{tuple(t.shape)} {t.dtype}" if isinstance(t, torch.Tensor) else type(t).__name__
            raise CheckpointError(f"its {what}: {name} is {got}, the parameter is {tuple(p.shape)} {p.dtype}")


def _short(groups: list) -> str:
    return str([f"{len(g)} params" if isinstance(g, list) else repr(g) for g in groups])


def read_latest(
    run_dir: Path, max_step: int | None = None, tokens_at: dict[int, int] | None = None
) -> tuple[Path, dict] | None:
    """The newest checkpoint at or below `max_step` that reads back, with its contents; a damaged or refused one
    is skipped (with a message) for the one before it. `tokens_at` (step -> generated tokens, from the run's rows):
    a checkpoint whose token counter differs from its step's row is refused too. None when there are no
    checkpoints; NoUsableCheckpoint when there are some but none can be used."""
    found = candidates(run_dir)
    why = []
    for path in found:
        if max_step is not None and step_of(path) > max_step:
            why.append(f"{path.name}: after the last row in metrics.jsonl (step {max_step})")
            print(f"[rlcompare] skipping checkpoint {path.name}: the run's rows stop before it", file=sys.stderr)
            continue
        try:
            blob = read(path)
            if tokens_at is not None and tokens_at.get(blob["step"]) != blob["state"]["tokens"]:
                raise CheckpointError(
                    f"its counters disagree with metrics.jsonl ({blob['state']['tokens']} generated tokens at step "
                    f"{blob['step']}, the row says {tokens_at.get(blob['step'])})"
                )
            return path, blob
        except CheckpointError as e:
            why.append(f"{path.name}: {e}")
            print(f"[rlcompare] checkpoint {path} could not be used ({e}); trying an older one", file=sys.stderr)
    if not found:
        return None
    raise NoUsableCheckpoint("; ".join(why))


def load(tr, path: Path, blob: dict) -> None:
    """Put the trainer in the state saved at `path` (weights, optimizers, RNGs, data position, counters), once
    `check_fits` has found every tensor fitting (nothing is loaded otherwise)."""
    check_fits(tr, blob)
    if blob.get("lora"):
        missing, unexpected = tr.policy.model.load_state_dict(blob["policy"], strict=False)
        if unexpected:
            raise RuntimeError(f"checkpoint {path}: unexpected policy weights {unexpected[:5]}")
    else:
        tr.policy.model.load_state_dict(blob["policy"])
    sharding.load_optimizer_state(tr.opt, blob["opt"])
    tr.sched.load_state_dict(blob["sched"])
    if tr.critic is not None:
        tr.critic.load_state_dict(blob["critic"])
        tr.critic_opt.load_state_dict(blob["critic_opt"])
    if tr.cfg.rollout.staleness:
        try:
            tr.queue.load(blob.get("pending", []), tr.train_prompts, tr.cfg.trainer.group_size, tr.device)
        except ValueError as e:
            raise CheckpointError(str(e)) from None
    # a checkpoint written before `applied_updates` was counted: unknown, not 0 (no "no update applied" warning)
    tr.state = TrainerState.from_dict({**tr.state.as_dict(), "applied_updates": None, **blob["state"]})
    tr.stream.position = blob["stream_position"]
    rng = blob["rng"]
    random.setstate(rng["python"])
    np.random.set_state(rng["numpy"])
    torch.set_rng_state(rng["torch"])
    if rng["cuda"] is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(list(rng["cuda"]))
    tr.gen.set_state(rng["sampler"])
    tr.shuffle_gen.set_state(rng["shuffle"])


def load_latest(tr, run_dir: Path, max_step: int | None = None) -> Path | None:
    """read_latest + load: the path loaded, or None when the run has no checkpoint."""
    found = read_latest(run_dir, max_step)
    if found is None:
        return None
    load(tr, *found)
    return found[0]
