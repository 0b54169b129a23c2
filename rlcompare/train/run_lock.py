"""One writer per run folder: an exclusive lock on `<run dir>/.writer.lock`, held from before the run reads the
folder until it ends.

The lock is a POSIX record lock (`fcntl.lockf`), which the kernel drops when the process exits, however it ends
(SIGKILL included). A lock left by a killed run is therefore stale by construction and the next run just takes
it: nothing is guessed from pids or timestamps, and two runs racing for a folder cannot both win. POSIX locks
belong to the process, so a forked helper (a verifier worker) does not keep the folder locked after the run
dies, which `flock` would. The file also records the holder (pid, host, start time) so that a refused run can
name it; it is emptied on a clean release, so a pid found in it when the lock is taken is a writer that was
killed, and the take-over is reported. A folder the lock created and nothing wrote to (a run refused by a later
check) is removed on release.

Two POSIX-lock rules shape the code: locks never conflict within one process, and closing *any* descriptor of
the file drops the process's lock. So this process's own locks are kept in `_HELD`, checked first, and the file
is never opened a second time while held.
"""

from __future__ import annotations

import fcntl
import json
import os
import socket
import struct
import sys
import time
from pathlib import Path

from rlcompare.config import ConfigError

LOCK_FILE = ".writer.lock"
_HELD: dict[str, "RunLock"] = {}  # realpath of the run folder -> this process's lock on it


class RunFolderBusy(ConfigError):
    """Another live process is writing the run folder."""


class RunLock:
    def __init__(self, run_dir: Path, fd: int, created: list[Path]):
        self.run_dir = run_dir
        self._fd = fd
        self._created = created  # folders acquire() made, deepest first

    def release(self) -> None:
        """Empty the holder record (a clean exit), then unlock; idempotent. A folder this lock created and nothing
        else wrote to (a run refused before it started) is removed again, so a refused run leaves no trace."""
        if self._fd is None:
            return
        fd, self._fd = self._fd, None
        _HELD.pop(_key(self.run_dir), None)
        untouched = self._only_the_lock_file()
        try:
            if untouched:  # unlinked while held: a process that opened it before sees it gone and retries
                os.unlink(self.run_dir / LOCK_FILE)
            else:
                os.ftruncate(fd, 0)
        except OSError:
            pass
        try:
            fcntl.lockf(fd, fcntl.LOCK_UN)
        finally:
            os.close(fd)
        for d in self._created if untouched else ():
            try:
                d.rmdir()  # only if empty
            except OSError:
                break

    def _only_the_lock_file(self) -> bool:
        try:
            return bool(self._created) and [p.name for p in self.run_dir.iterdir()] == [LOCK_FILE]
        except OSError:
            return False

    def __enter__(self) -> "RunLock":
        return self

    def __exit__(self, *exc) -> bool:
        self.release()
        return False


def _key(run_dir: Path) -> str:
    return os.path.realpath(run_dir)


def _holder_record() -> dict:
    return {
        "pid": os.getpid(),
        "host": socket.gethostname(),
        "started": time.strftime("%Y-%m-%d %H:%M:%S"),
        "argv": sys.argv[:8],
    }


def _read_record(fd: int) -> dict:
    """The holder record in the lock file (empty when the last writer released cleanly); untrusted: only read."""
    try:
        raw = os.pread(fd, 4096, 0)
        rec = json.loads(raw.decode("utf-8", errors="replace")) if raw.strip() else {}
    except (OSError, ValueError):
        return {}
    return rec if isinstance(rec, dict) else {}


def _kernel_owner(fd: int) -> int | None:
    """The pid the kernel reports as holding a conflicting lock (F_GETLK), None when unlocked or not on Linux.
    Takes no lock itself, so it cannot make a concurrent `acquire` fail."""
    if not sys.platform.startswith("linux"):
        return None
    flock = struct.pack("hhqqi4x", fcntl.F_WRLCK, os.SEEK_SET, 0, 0, 0)  # struct flock on Linux (64-bit off_t)
    try:
        got = fcntl.fcntl(fd, fcntl.F_GETLK, flock)
    except OSError:
        return None
    l_type, _, _, _, l_pid = struct.unpack("hhqqi4x", got)
    return l_pid if l_type != fcntl.F_UNLCK else None


def _busy_message(run_dir: Path, rec: dict, pid: int | None) -> str:
    pid = pid or rec.get("pid")
    who = f"pid {pid}" if pid else "a process whose pid it could not read"
    if rec.get("host") and rec.get("host") != socket.gethostname():
        who += f" on host {rec['host']}"
    if rec.get("started"):
        who += f", started {rec['started']}"
    stop = f" (`kill {pid}`: SIGTERM saves a checkpoint when checkpointing is on)" if pid else ""
    return (
        f"{run_dir} is being written by another rlcompare process ({who}); a second writer would interleave or "
        f"lose its rows. Wait for that run to end, or stop it{stop}, then continue it with resume=true; or "
        f"write a new run elsewhere with run_name=<another name> or experiment=<another folder>"
    )


def acquire(run_dir: str | Path) -> RunLock:
    """Lock `run_dir` (created if missing) for this process, or raise RunFolderBusy naming the live writer."""
    run_dir = Path(run_dir)
    if _key(run_dir) in _HELD:
        raise RunFolderBusy(_busy_message(run_dir, {"pid": os.getpid()}, os.getpid()) + " (this same process)")
    created = [p for p in (run_dir, *run_dir.parents) if not p.exists()]
    while True:
        fd = _open_and_lock(run_dir)
        try:  # the file may have been removed by a releasing writer between our open and our lock: retry
            if os.stat(run_dir / LOCK_FILE, follow_symlinks=False).st_ino == os.fstat(fd).st_ino:
                break
        except OSError:
            pass
        os.close(fd)
    stale = _read_record(fd)
    if stale.get("pid") and stale.get("pid") != os.getpid():
        print(
            f"[rlcompare] {run_dir}: its previous writer (pid {stale['pid']}) ended without releasing the folder "
            f"(killed or crashed); its lock went with it, taking over",
            file=sys.stderr,
        )
    os.ftruncate(fd, 0)
    os.pwrite(fd, (json.dumps(_holder_record()) + "\n").encode(), 0)
    lock = RunLock(run_dir, fd, created)
    _HELD[_key(run_dir)] = lock
    return lock


def _open_and_lock(run_dir: Path) -> int:
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        fd = os.open(run_dir / LOCK_FILE, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    except OSError as e:
        raise ConfigError(
            f"the run folder {str(run_dir)!r} cannot be created or locked ({e.strerror}); choose a "
            f"folder you can write, e.g. results_dir=./results"
        ) from None
    try:
        fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:  # EAGAIN / EACCES: held by a live process
        rec, owner = _read_record(fd), _kernel_owner(fd)
        os.close(fd)
        raise RunFolderBusy(_busy_message(run_dir, rec, owner)) from None
    return fd


def holder(run_dir: str | Path) -> int | None:
    """The pid of the live process writing `run_dir`, or None. Never takes the lock."""
    run_dir = Path(run_dir)
    if _key(run_dir) in _HELD:
        return os.getpid()
    path = run_dir / LOCK_FILE
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        owner = _kernel_owner(fd)
        if owner is None and not sys.platform.startswith("linux"):
            owner = _probe(fd)
        return owner
    finally:
        os.close(fd)


def _probe(fd: int) -> int | None:
    """Where F_GETLK is not used: a shared lock fails while an exclusive one is held."""
    try:
        fcntl.lockf(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except OSError:
        return _read_record(fd).get("pid") or -1
    fcntl.lockf(fd, fcntl.LOCK_UN)
    return None
