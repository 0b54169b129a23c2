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

from rlcompare.results import json_objects, parse_json, read_jsonl, scan_jsonl  # noqa: F401 - the one results reader

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
            print(
                f"[rlcompare] {path}: dropped a torn last line (the previous writer was killed mid-row)",
                file=sys.stderr,
            )
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
                row = parse_json(line)
            except ValueError:
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
        self.counts: JsonlWriter | None = None  # eval_counts.jsonl, opened by the first sampled eval

    def write_counts(self, row: dict) -> None:
        """One sampled eval's per-prompt counts: {"step", "tokens/generated", "n": [n_i], "c": [c_i]}."""
        if self.counts is None:
            self.counts = JsonlWriter(self.dir / "eval_counts.jsonl")
        self.counts.write(row)

    def write_json(self, name: str, obj: Any) -> None:
        atomic_write_json(self.dir / name, obj)

    def write_text(self, name: str, text: str) -> None:
        atomic_write_text(self.dir / name, text)

    def close(self) -> None:
        for w in (self.metrics, self.evals, self.samples, self.counts):
            if w is not None:
                w.close()


class WandbLogger:
    """Logs the same rows to W&B; offline by default. Every file W&B writes lands under the run folder: the run's
    own files (`dir`), and its cache (the core service's debug log) and data (artifact staging, e.g. the sample
    tables) folders, which default to ~/.cache/wandb and ~/.local/share/wandb; a WANDB_CACHE_DIR / WANDB_DATA_DIR
    set by the user is kept. Restored at `finish`, so runs in one process (a multirun) each keep their own.

    Resuming (`resume_id`): the same W&B run continues (`resume="allow"`), and W&B keeps every step once. Its step
    only increases, so a step it already holds cannot be logged again: the steps the interrupted process got
    into W&B (read back from the earlier segments in the run folder, `logged_through`) are not logged again, and
    rows the run folder holds that W&B lost (the W&B service writes its file in blocks, so a SIGKILL loses its
    tail) are logged from the run folder's files by `replay` before training continues.
    """

    def __init__(self, cfg: Any, run_dir: Path, run_name: str, config: dict, resume_id: str | None = None):
        import wandb

        from rlcompare.train.placement import wandb_grouping

        os.environ.setdefault("WANDB_SILENT", "true")
        self.wandb = wandb
        self._saved_env = _point_wandb_dirs_into(Path(run_dir) / "wandb")
        self.logged_through = last_step_in_wandb(Path(run_dir) / "wandb", resume_id) if resume_id else -1
        self.run = wandb.init(
            project=cfg.project,
            entity=cfg.entity,
            name=run_name,
            dir=str(run_dir),
            **wandb_grouping(cfg.group, config, run_name),  # seeds of a variant aggregate in W&B's UI
            mode=cfg.mode,
            config=config,
            id=resume_id,
            resume="allow" if resume_id else None,
            settings=wandb.Settings(console="off", x_disable_stats=True, silent=True),
        )
        self.id = self.run.id
        if self.run.resumed and self.logged_through is not None:  # online: the server's history counts too
            self.logged_through = max(self.logged_through, int(self.run.starting_step) - 1)
        self.run.define_metric("tokens/generated")
        for prefix in ("eval/*", "reward/*", "objective/*"):
            self.run.define_metric(prefix, step_metric="tokens/generated")

    def _has(self, step: int) -> bool:
        return self.logged_through is not None and step <= self.logged_through

    def log(self, row: dict, step: int) -> None:
        if self._has(step):
            return
        self.run.log({k: v for k, v in row.items() if isinstance(v, (int, float)) and v is not None}, step=step)

    def log_samples(self, rows: list[dict], step: int) -> None:
        if not rows or self._has(step):
            return
        cols = list(rows[0].keys())
        table = self.wandb.Table(columns=cols, data=[[r[c] for c in cols] for r in rows])
        self.run.log({"samples": table}, step=step)

    def replay(self, run_dir: Path, through: int) -> int:
        """Log the run folder's rows for the steps W&B does not hold, up to `through` (the step training continues
        from), in the order the run logged them: metrics, then eval and its samples. Returns the steps logged.
        When the earlier segments could not be read, nothing is replayed (W&B may then miss or drop steps)."""
        if self.logged_through is None:
            return 0
        first = self.logged_through + 1
        want = lambda r: isinstance(r.get("step"), int) and first <= r["step"] <= through  # noqa: E731
        by_step: dict[int, dict] = {}
        for kind in ("metrics", "eval", "samples"):
            for r in read_jsonl(Path(run_dir) / f"{kind}.jsonl"):
                if want(r):
                    slot = by_step.setdefault(r["step"], {"metrics": None, "eval": None, "samples": []})
                    if kind == "samples":
                        slot["samples"].append(r)
                    else:
                        slot[kind] = r
        for step in sorted(by_step):
            slot = by_step[step]
            for kind in ("metrics", "eval"):
                if slot[kind] is not None:
                    self.log(slot[kind], step=step)
            self.log_samples(slot["samples"], step=step)
        return len(by_step)

    def summary(self, values: dict) -> None:
        for k, v in values.items():
            if isinstance(v, (int, float, str)):
                self.run.summary[k] = v

    def finish(self, exit_code: int = 0) -> None:
        try:
            self.run.finish(exit_code=exit_code)
            self.wandb.teardown()  # the service keeps the dirs it started with: the next run starts its own
        finally:
            _restore_env(self._saved_env)


_WANDB_DIRS = {"WANDB_CACHE_DIR": "cache", "WANDB_DATA_DIR": "data"}


def _point_wandb_dirs_into(root: Path) -> dict:
    """Set W&B's cache and data folders to root/cache and root/data unless the user set them; returns what to
    restore."""
    saved = {}
    for var, sub in _WANDB_DIRS.items():
        if var not in os.environ:
            saved[var] = None
            os.environ[var] = str(root / sub)
    return saved


def _restore_env(saved: dict) -> None:
    for var, value in saved.items():
        if value is None:
            os.environ.pop(var, None)
        else:
            os.environ[var] = value


def wandb_segments(wandb_dir: Path, run_id: str) -> list[Path]:
    """The transaction logs (`.wandb` files) of W&B run `run_id` under a run folder's wandb/, oldest first: one per
    process that logged to it (offline-run-<time>-<id>/ or run-<time>-<id>/)."""
    found = []
    for d in sorted(Path(wandb_dir).glob(f"*run-*-{run_id}")):
        f = d / f"run-{run_id}.wandb"
        if d.is_dir() and not d.is_symlink() and f.is_file():
            found.append(f)
    return found


def wandb_records(path: Path) -> list[dict]:
    """The records of a .wandb file, read by wandb's own reader (`wandb leet inspect --json`). Raises OSError when it
    cannot be read. The file is only parsed, never executed."""
    import subprocess

    out = subprocess.run(
        [sys.executable, "-m", "wandb", "leet", "inspect", "--json", str(path)],
        capture_output=True,
        text=True,
        timeout=300,
        stdin=subprocess.DEVNULL,
    )
    if out.returncode != 0:
        raise OSError(f"wandb leet inspect {path} exited {out.returncode}: {out.stderr.strip()[-300:]}")
    return json_objects(out.stdout.splitlines())


def history_steps(records: list[dict]) -> list[int]:
    """The step of each history record, in file order."""
    steps = []
    for rec in records:
        if rec.get("type") == "history":
            hist = rec.get("history") or {}
            num = (hist.get("step") or {}).get("num", (hist.get("item") or {}).get("_step"))
            steps.append(int(num) if num is not None else 0)  # protobuf's JSON leaves a zero out
    return steps


def last_step_in_wandb(wandb_dir: Path, run_id: str) -> int | None:
    """The last step W&B holds for `run_id` from this run folder's earlier segments (-1: none), or None when a
    segment could not be read."""
    last = -1
    for seg in wandb_segments(wandb_dir, run_id):
        try:
            steps = history_steps(wandb_records(seg))
        except (OSError, ValueError) as e:
            print(
                f"[rlcompare] W&B: could not read {seg} ({e}); steps the interrupted run logged may be missing or "
                f"dropped in W&B",
                file=sys.stderr,
            )
            return None
        last = max([last, *steps])
    return last


class NullLogger:
    id = None

    def log(self, row, step):
        pass

    def log_samples(self, rows, step):
        pass

    def replay(self, run_dir, through):
        return 0

    def summary(self, values):
        pass

    def finish(self, exit_code=0):
        pass


class ConsoleLog:
    """The run's console lines (what it prints on stdout and stderr: messages, warnings, the closing line) also
    appended to `<run dir>/train.log`, so that the folder keeps what the run said. The progress bar's redraws
    (text holding a carriage return) stay on the console only: the log keeps whole lines."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self._file = None
        self._saved: tuple = ()

    def __enter__(self) -> "ConsoleLog":
        self._file = open(self.path, "a", encoding="utf-8", errors="replace")
        self._saved = (sys.stdout, sys.stderr)
        sys.stdout, sys.stderr = _Tee(sys.stdout, self), _Tee(sys.stderr, self)
        return self

    def __exit__(self, *exc) -> bool:
        for tee in (sys.stdout, sys.stderr):
            if isinstance(tee, _Tee):
                tee.flush_line()
        sys.stdout, sys.stderr = self._saved
        self._file.close()
        return False

    def note(self, line: str) -> None:
        """One line in train.log only (e.g. the closing line the CLI prints after the run)."""
        if self._file is not None and not self._file.closed:
            self._file.write(line.rstrip("\n") + "\n")
            self._file.flush()


class _Tee:
    """A console stream that also hands each complete line without a carriage return to its ConsoleLog."""

    def __init__(self, stream, log: ConsoleLog):
        self._stream = stream
        self._log = log
        self._partial = ""

    def write(self, text: str) -> int:
        n = self._stream.write(text)
        if "\r" in text:  # the progress bar redrawn (its figures are in the rows); a line printed after it is kept
            self._partial = ""
            return n
        *lines, self._partial = (self._partial + text).split("\n")
        for line in lines:
            if line:  # the blank line the progress bar leaves when it closes
                self._log.note(line)
        return n

    def flush_line(self) -> None:
        if self._partial:
            self._log.note(self._partial)
        self._partial = ""

    def flush(self) -> None:
        self._stream.flush()

    def __getattr__(self, name):  # isatty, fileno, encoding, ...: the console's own
        return getattr(self._stream, name)
