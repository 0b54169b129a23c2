"""The results writer (results/<experiment>/<run>/) and the W&B logger.

Rows are appended and flushed as they come; files that are replaced are written to a temporary
name and renamed, so a killed run never leaves a half-written file.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any


def atomic_write_text(path: str | Path, text: str) -> None:
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


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
    """Rows of a jsonl file; a torn last line (a kill mid-write) is dropped."""
    rows = []
    p = Path(path)
    if not p.exists():
        return rows
    with open(p) as f:
        for line in f:
            if not line.endswith("\n"):
                break  # torn last line
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError:
                break
    return rows


class JsonlWriter:
    def __init__(self, path: Path):
        self.path = path
        self._f = open(path, "a")

    def write(self, row: dict) -> None:
        self._f.write(json.dumps({k: _clean(v) for k, v in row.items()}, default=_jsonable) + "\n")
        self._f.flush()

    def close(self) -> None:
        self._f.close()


def truncate_jsonl(path: Path, keep) -> None:
    """Rewrite `path` keeping complete rows for which keep(row) is true (used on resume)."""
    rows = [r for r in read_jsonl(path) if keep(r)]
    atomic_write_text(path, "".join(json.dumps(r) + "\n" for r in rows))


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

        os.environ.setdefault("WANDB_SILENT", "true")
        self.wandb = wandb
        self.run = wandb.init(
            project=cfg.project, entity=cfg.entity, group=cfg.group, name=run_name, dir=str(run_dir),
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
