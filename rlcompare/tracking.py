"""The results writer (results/<experiment>/<run>/) and the W&B logger.

Rows are appended and flushed as they come; files that are replaced are written to a temporary
name and renamed, so a killed run never leaves a half-written file.
"""

from __future__ import annotations

import itertools
import json
import math
import os
import sys
from pathlib import Path
from typing import Any

_TMP_IDS = itertools.count()


def atomic_write_text(path: str | Path, text: str) -> None:
    """Write to a temporary name, fsync, rename: readers see the old file or the new one, never half of one.

    The temporary name is unique per call, so a write from a signal handler cannot collide with one it interrupted.
    """
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}.{next(_TMP_IDS)}")
    try:
        with open(tmp, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            tmp.unlink()
        except OSError:
            pass
        raise


def atomic_write_json(path: str | Path, obj: Any) -> None:
    atomic_write_text(path, json.dumps(obj, indent=2, sort_keys=True, default=_jsonable) + "\n")


def _jsonable(x):
    if hasattr(x, "item"):
        return x.item()
    return str(x)


def _clean(v):
    """JSON has no NaN/inf: write them as null so every reader can parse the row."""
    if isinstance(v, float) and not math.isfinite(v):
        return None
    return v


def read_jsonl(path: str | Path) -> list[dict]:
    """Rows of a jsonl file; a torn last line (a kill mid-write, no newline) is dropped, as is any line that
    does not parse as a JSON object."""
    rows = []
    p = Path(path)
    if not p.exists():
        return rows
    with open(p, encoding="utf-8", errors="replace") as f:
        for line in f:
            if not line.endswith("\n"):
                break  # torn last line
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(row, dict):
                rows.append(row)
    return rows


def drop_torn_tail(path: str | Path) -> bool:
    """Cut a torn last line (bytes after the last newline) off `path`; True when something was cut."""
    p = Path(path)
    if not p.exists():
        return False
    with open(p, "rb+") as f:
        f.seek(0, os.SEEK_END)
        size = f.tell()
        if size == 0:
            return False
        # find the last newline, reading backwards in blocks
        pos, keep = size, 0
        while pos > 0:
            step = min(65536, pos)
            pos -= step
            f.seek(pos)
            block = f.read(step)
            i = block.rfind(b"\n")
            if i >= 0:
                keep = pos + i + 1
                break
        if keep == size:
            return False
        f.truncate(keep)
    return True


class JsonlWriter:
    """Appends one JSON row per line, flushed per row. A torn line left by a killed writer is cut first,
    so a new row never glues onto it."""

    def __init__(self, path: Path):
        self.path = path
        if drop_torn_tail(path):
            print(f"[rlcompare] {path}: dropped a torn last line (the previous writer was killed mid-row)", file=sys.stderr)
        self._f = open(path, "a")

    def write(self, row: dict) -> None:
        self._f.write(json.dumps({k: _clean(v) for k, v in row.items()}, default=_jsonable) + "\n")
        self._f.flush()

    def close(self) -> None:
        self._f.close()


def truncate_jsonl(path: Path, keep) -> int:
    """Rewrite `path` keeping complete rows for which keep(row) is true (used on resume); returns rows dropped.

    Lines are kept byte for byte (not re-serialized), so kept rows read back exactly as written.
    """
    p = Path(path)
    if not p.exists():
        return 0
    kept, dropped = [], 0
    with open(p, encoding="utf-8", errors="replace") as f:
        for line in f:
            if not line.endswith("\n"):
                dropped += 1  # torn last line
                break
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                dropped += 1
                continue
            if isinstance(row, dict) and keep(row):
                kept.append(line)
            else:
                dropped += 1
    atomic_write_text(p, "".join(kept))
    return dropped


class RunWriter:
    """Owns one run folder: config, fingerprint, metrics/eval/samples rows, summary."""

    def __init__(self, run_dir: str | Path):
        self.dir = Path(run_dir)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.metrics = JsonlWriter(self.dir / "metrics.jsonl")
        self.evals = JsonlWriter(self.dir / "eval.jsonl")
        self.samples = JsonlWriter(self.dir / "samples.jsonl")

    def write_json(self, name: str, obj: Any) -> None:
        atomic_write_json(self.dir / name, obj)

    def write_text(self, name: str, text: str) -> None:
        atomic_write_text(self.dir / name, text)

    def close(self) -> None:
        for w in (self.metrics, self.evals, self.samples):
            w.close()


class WandbLogger:
    """Logs the same rows to W&B; offline by default, files under the run folder."""

    def __init__(self, cfg: Any, run_dir: Path, run_name: str, config: dict, resume_id: str | None = None):
        import wandb

        from rlcompare.placement import wandb_grouping

        os.environ.setdefault("WANDB_SILENT", "true")
        self.wandb = wandb
        self.run = wandb.init(
            project=cfg.project, entity=cfg.entity, name=run_name, dir=str(run_dir),
            **wandb_grouping(cfg.group, config, run_name),  # seeds of a variant aggregate in W&B's UI
            mode=cfg.mode, config=config, id=resume_id, resume="allow" if resume_id else None,
            settings=wandb.Settings(console="off", x_disable_stats=True, silent=True),
        )
        self.id = self.run.id
        self.run.define_metric("tokens/generated")
        for prefix in ("eval/*", "reward/*", "objective/*"):
            self.run.define_metric(prefix, step_metric="tokens/generated")

    def log(self, row: dict, step: int) -> None:
        self.run.log({k: v for k, v in row.items() if isinstance(v, (int, float)) and v is not None}, step=step)

    def log_samples(self, rows: list[dict], step: int) -> None:
        if not rows:
            return
        cols = list(rows[0].keys())
        table = self.wandb.Table(columns=cols, data=[[r[c] for c in cols] for r in rows])
        self.run.log({"samples": table}, step=step)

    def summary(self, values: dict) -> None:
        for k, v in values.items():
            if isinstance(v, (int, float, str)):
                self.run.summary[k] = v

    def finish(self, exit_code: int = 0) -> None:
        self.run.finish(exit_code=exit_code)


class NullLogger:
    id = None

    def log(self, row, step):
        pass

    def log_samples(self, rows, step):
        pass

    def summary(self, values):
        pass

    def finish(self, exit_code=0):
        pass
