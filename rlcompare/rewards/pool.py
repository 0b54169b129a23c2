"""Batch scoring under time and memory limits: `score_batch(verifier, completions, answers)` -> `Score`s.

`score_batch` bounds every call and every batch: verifiers that are cheap by construction (`bounded`: exact_match,
countdown, the default format pattern) run inline in the caller's thread; the others (math_verify, a custom
format pattern, reasoning_gym, or a weighted mix holding one) run in worker processes (`verifier.workers`, default
min(4, usable cores)) with a per-item deadline of `timeout_s` (a SIGALRM inside the worker, then a hard kill at
`timeout_s + 0.5 s`; a killed worker is replaced; `timeout_s` has a floor of 10 ms) and an address-space cap. The
whole batch gets `verifier.batch_timeout_s` (30 s) of scoring time: items still running then are killed, the rest
are not started. An exception or timeout gives `Score(0.0, False, error=True, reason=...)` (`error_counts`);
nothing raises.

A worker is a fresh interpreter: it imports, before it unpickles the verifier, every module that defines a class
the verifier's pickle names (recorded while pickling, with the module's file), so a verifier registered in a file
outside the package (examples/near_miss.py) scores in workers too. Standard library only.
"""

from __future__ import annotations

import atexit
import importlib
import importlib.util
import io
import json
import math
import os
import pickle
import sys
import threading
import time
import warnings
import weakref
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from rlcompare.rewards.text import DEFAULT_MAX_CHARS


@dataclass(frozen=True)
class Score:
    reward: float
    correct: bool
    error: bool = False  # the verifier raised or timed out (reward 0)
    # why an error scored 0 (one of ERROR_REASONS; "" when not an error). Not compared: Score(0.0, False, True)
    # equals every error whatever its reason.
    reason: str = field(default="", compare=False)
    # named reward components, in the verifier's order (verifier.name=weighted: each component's own reward,
    # before its weight); () for a verifier of one reward. GDPO normalises each within the group.
    components: tuple = field(default=(), compare=False)
    # named numbers the verifier reports about this scoring, under the names it declares (@register_verifier's
    # metrics): each is averaged over the step's trained completions as verifier/<name> in the metrics row
    metrics: dict = field(default_factory=dict, compare=False)


ERROR_REASONS = ("raised", "timeout", "batch_timeout", "worker_lost", "no_worker")
ERROR = Score(0.0, False, True, "raised")  # the verifier raised (or returned a non-finite reward)
TIMEOUT = Score(0.0, False, True, "timeout")  # past verifier.timeout_s for this completion
BATCH_TIMEOUT = Score(0.0, False, True, "batch_timeout")  # not scored within verifier.batch_timeout_s for the batch
WORKER_LOST = Score(0.0, False, True, "worker_lost")  # its worker process died or answered garbage
NO_WORKER = Score(0.0, False, True, "no_worker")  # worker processes failed to start
WRONG = Score(0.0, False)
RIGHT = Score(1.0, True)


def error_counts(scores) -> dict[str, int]:
    """How many scores are errors, by reason: {'timeout': 3, 'batch_timeout': 12} (reasons with none left out)."""
    out: dict[str, int] = {}
    for s in scores:
        if s.error:
            out[s.reason or "raised"] = out.get(s.reason or "raised", 0) + 1
    return out


# ----------------------------------------------------------------------------- bounded batch scoring
_IN_WORKER = False  # set in a worker process: its SIGALRM bounds each item (MathVerify then arms no timer of its own)
MIN_TIMEOUT_S = 0.01  # floor on verifier.timeout_s and batch_timeout_s: a shorter SIGALRM could not be armed reliably
_MAX_TIMEOUT_S = 86_400.0  # a non-finite bound reaching score_batch (no config check upstream) counts as one day
DEFAULT_BATCH_TIMEOUT_S = 30.0  # verifier.batch_timeout_s: the whole batch's bound (one trainer step's scoring)
_MAX_DEFAULT_WORKERS = 4
_HARD_GRACE_S = 0.5  # a worker past timeout_s + this is killed (SIGKILL) and replaced
_STARTUP_S = 60.0  # a worker must import and report ready within this (not counted against items)
_WORKER_EXTRA_MEMORY = 2 << 30  # address space a worker may add beyond its size when ready
_POOLS: "weakref.WeakSet[_WorkerPool]" = weakref.WeakSet()


def _default_workers() -> int:
    """min(4, usable CPU cores): the trainer waits while a batch is scored, so every core can score."""
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cores = os.cpu_count() or 1
    return max(1, min(_MAX_DEFAULT_WORKERS, cores))


def _bounded_seconds(value: Any) -> float:
    """A time bound as score_batch uses it: at least MIN_TIMEOUT_S, at most a day; NaN or junk -> the floor."""
    try:
        t = float(value)
    except (TypeError, ValueError):
        return MIN_TIMEOUT_S
    if math.isnan(t):
        return MIN_TIMEOUT_S
    return min(max(t, MIN_TIMEOUT_S), _MAX_TIMEOUT_S)


def _limit_memory() -> None:
    try:
        import resource

        with open("/proc/self/statm") as f:
            vm = int(f.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
        lim = vm + _WORKER_EXTRA_MEMORY
        resource.setrlimit(resource.RLIMIT_AS, (lim, lim))
    except Exception:
        pass


def in_worker() -> bool:
    """Whether this process is a scoring worker (its SIGALRM bounds each item)."""
    return _IN_WORKER


class _RecordingPickler(pickle.Pickler):
    """A pickler that records the module of every object's class it writes (and of classes written as such)."""

    def __init__(self, file):
        super().__init__(file, protocol=pickle.DEFAULT_PROTOCOL)
        self.modules: set[str] = set()

    def reducer_override(self, obj):
        cls = obj if isinstance(obj, type) else type(obj)
        self.modules.add(getattr(cls, "__module__", None) or "builtins")
        return NotImplemented  # pickled as usual


def pickle_with_modules(obj) -> tuple[bytes, list[tuple[str, str | None]]]:
    """(pickle of obj, [(module, its file or None)] for the modules outside the standard library that it names):
    what a fresh worker must import before it can unpickle obj. `__main__` is left out (a worker is not it)."""
    buf = io.BytesIO()
    p = _RecordingPickler(buf)
    p.dump(obj)
    out = []
    for name in sorted(p.modules):
        mod = sys.modules.get(name)
        if name == "__main__" or name in sys.stdlib_module_names or name.split(".")[0] in sys.builtin_module_names:
            continue
        out.append((name, getattr(mod, "__file__", None)))
    return buf.getvalue(), out


def import_modules(modules) -> None:
    """In a worker: import each (module, file); one not importable by name is loaded from its file (a verifier
    module loaded by path, e.g. examples/near_miss.py). A module that fails is left: unpickling then fails."""
    for name, path in modules or ():
        if name in sys.modules:
            continue
        try:
            importlib.import_module(name)
            continue
        except Exception:
            pass
        try:
            spec = importlib.util.spec_from_file_location(name, path) if path else None
            if spec is None or spec.loader is None:
                continue
            module = importlib.util.module_from_spec(spec)
            sys.modules[name] = module
            spec.loader.exec_module(module)
        except Exception:
            sys.modules.pop(name, None)


class _ItemTimeout(BaseException):  # not Exception: libraries that swallow Exception must not swallow this
    pass


def _worker_entry(fd: int) -> None:
    """Worker process (a fresh interpreter, see `_Worker`): receive the verifier, report ready, then score one
    item at a time under a SIGALRM deadline; exits when the parent's end of the socket closes."""
    global _IN_WORKER
    _IN_WORKER = True
    import signal
    from multiprocessing.connection import Connection

    def on_alarm(signum, frame):
        raise _ItemTimeout()

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's business
    signal.signal(signal.SIGALRM, on_alarm)
    try:
        _serve(Connection(fd))
    finally:
        _end_own_group()


def _serve(conn) -> None:
    verifier = _worker_ready(conn)
    if verifier is None:
        return
    while True:
        try:
            msg = conn.recv()
        except (EOFError, OSError):
            return
        if msg is None:
            return
        try:
            conn.send_bytes(_reply(_score_in_worker(verifier, *msg)))
        except (EOFError, OSError):
            return


def _end_own_group() -> None:
    """A worker leads a process group of its own (`_Worker`): on its way out, whatever the reason (the pool
    closed, the parent gone), it kills that group, itself last, so that what the verifier or environment started
    there (a tool process holding the run's stderr open) ends with it."""
    import signal

    if os.getpgrp() != os.getpid():  # not started by `_Worker`: not ours to kill
        return
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:
            pass
    os.killpg(os.getpgrp(), signal.SIGKILL)


def _worker_ready(conn):
    """Receive the verifier, warm it, cap the address space, report ready; None when the parent is gone."""
    try:
        import_modules(conn.recv())  # before the verifier's pickle: the modules its classes live in
        verifier = conn.recv()
        warm = getattr(verifier, "warm", None)
        if warm is not None:
            warm()
        _limit_memory()
        conn.send_bytes(_reply("ready"))
    except (EOFError, OSError):
        return None
    return verifier


# A worker's replies are JSON, never pickles: it parses model output, so the parent trusts nothing it sends
# (unpickling can run code). The parent's messages to it (the verifier, the items) stay pickled: it trusts them.
_REPLY_MAX_BYTES = 1 << 20


def _reply(obj) -> bytes:
    return json.dumps(obj, allow_nan=False).encode()


def _read_reply(conn):
    """A worker's reply (JSON), or None when it died or sent more than _REPLY_MAX_BYTES or something not JSON."""
    try:
        return json.loads(conn.recv_bytes(_REPLY_MAX_BYTES))
    except Exception:
        return None


def _is_score_reply(msg, i: int) -> bool:
    """[i, reward, correct, error, reason(, components(, metrics))] for item i, with a finite reward, finite
    components and metrics a mapping of names to finite numbers: what _score_in_worker returns."""
    return (
        isinstance(msg, list)
        and len(msg) in (5, 6, 7)
        and (len(msg) == 5 or _finite_numbers(msg[5]))
        and (len(msg) < 7 or _finite_metrics(msg[6]))
        and msg[0] == i
        and type(msg[1]) in (int, float)
        and math.isfinite(msg[1])
        and isinstance(msg[2], bool)
        and isinstance(msg[3], bool)
        and isinstance(msg[4], str)
    )


def _finite_numbers(xs) -> bool:
    return isinstance(xs, list) and all(type(x) in (int, float) and math.isfinite(x) for x in xs)


def _finite_metrics(d) -> bool:
    return isinstance(d, dict) and all(isinstance(k, str) for k in d) and _finite_numbers(list(d.values()))


def _finite(s: Score) -> bool:
    """A score's reward, components and metrics are finite numbers (else the verifier failed: an error)."""
    values = [s.reward, *getattr(s, "components", ()), *(getattr(s, "metrics", None) or {}).values()]
    return all(math.isfinite(float(x)) for x in values)


def _score_in_worker(verifier, i: int, completion, answer, timeout_s) -> tuple:
    """(i, reward, correct, error, reason) for one item, under a SIGALRM deadline of timeout_s: a timeout, a
    non-finite reward or anything raised (MemoryError, RecursionError, ...) scores 0 as an error."""
    import signal

    try:
        try:
            signal.setitimer(signal.ITIMER_REAL, _bounded_seconds(timeout_s))
            s = verifier.score(completion, answer)
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
        r = float(s.reward)
        comps = [float(x) for x in getattr(s, "components", ())]
        metrics = {str(k): float(v) for k, v in (getattr(s, "metrics", None) or {}).items()}
        if math.isfinite(r) and all(math.isfinite(x) for x in (*comps, *metrics.values())):
            reply = (i, r, bool(s.correct), bool(s.error), str(s.reason or ("raised" if s.error else "")))
            return reply + (comps, metrics) if metrics else (reply + (comps,) if comps else reply)
        return (i, 0.0, False, True, "raised")
    except _ItemTimeout:
        return (i, 0.0, False, True, "timeout")
    except BaseException:  # MemoryError, RecursionError, anything
        return (i, 0.0, False, True, "raised")


class _Worker:
    """One worker: `python -c ...` (a fresh interpreter: no fork of a threaded/CUDA parent, no re-import of
    the caller's __main__), over a socketpair: the parent's messages pickled (multiprocessing's framing), the
    worker's replies JSON (`_reply`, `_read_reply`). It leads a process group of its own, killed whole with it."""

    def __init__(self, verifier_blob: bytes, modules: list):
        import socket
        import subprocess
        import sys
        from multiprocessing.connection import Connection

        here, theirs = socket.socketpair()
        root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # above rlcompare/rewards/
        env = dict(os.environ)
        env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
        code = "import sys; from rlcompare.rewards.pool import _worker_entry; _worker_entry(int(sys.argv[1]))"
        try:
            self.proc = subprocess.Popen(
                [sys.executable, "-c", code, str(theirs.fileno())],
                pass_fds=(theirs.fileno(),),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                env=env,
                start_new_session=True,  # its own process group: `kill` ends what it started (an env's tool)
            )
        finally:
            theirs.close()
        self.conn = Connection(here.detach())
        self.conn.send(modules)
        self.conn.send_bytes(verifier_blob)
        self.ready = False
        self.started = time.monotonic()

    def alive(self) -> bool:
        return self.proc.poll() is None

    def kill(self) -> None:
        """Kill the worker's whole process group: the worker and whatever it started (an environment's tool
        process, which would otherwise outlive the run holding the run's stderr open: `rlcompare train | tee`)."""
        import signal

        try:
            os.killpg(self.proc.pid, signal.SIGKILL)  # the group's id is the worker's pid (start_new_session)
        except (ProcessLookupError, PermissionError, OSError):
            pass
        try:
            self.proc.kill()
            self.proc.wait(timeout=2)
        except Exception:
            pass
        try:
            self.conn.close()
        except Exception:
            pass


def _trim_for_transport(text: str, cap: int) -> str:
    """Keep the first and last `cap` characters exactly (all any verifier looks at)."""
    if not isinstance(text, str):
        text = str(text)
    return text if len(text) <= 2 * cap + 1 else text[:cap] + "\n" + text[-cap:]


class _WorkerPool:
    def __init__(self, verifier, n_workers: int):
        self.blob, self.modules = pickle_with_modules(verifier)
        self.cap = int(getattr(verifier, "max_chars", DEFAULT_MAX_CHARS) or DEFAULT_MAX_CHARS)
        self.workers: list[_Worker | None] = [None] * max(1, n_workers)
        self.lock = threading.Lock()
        self.start_failures = 0
        _POOLS.add(self)
        self._refill()

    def _refill(self) -> None:
        for k, w in enumerate(self.workers):
            if w is None or not w.alive():
                self._drop(k)
                self.workers[k] = _Worker(self.blob, self.modules)

    def _drop(self, k: int) -> None:
        w, self.workers[k] = self.workers[k], None
        if w is not None:
            w.kill()

    def score(self, completions, answers, timeout_s: float, batch_s: float) -> list[Score]:
        """Each item within timeout_s (SIGALRM in the worker, a kill at timeout_s + 0.5 s), the whole batch within
        batch_s of scoring time (time while no worker is ready yet, i.e. imports, does not count): past it, the
        items still running are killed and the rest are not sent; all of them score BATCH_TIMEOUT."""
        n = len(completions)
        results: list[Score | None] = [None] * n
        pending = deque(range(n))
        busy: dict[int, tuple[int, float]] = {}  # worker slot -> (item, hard deadline)
        spent, clock = 0.0, time.monotonic()  # scoring time used by this batch
        with self.lock:
            self.start_failures = 0
            while pending or busy:
                if pending and self.start_failures >= 3 * len(self.workers):
                    warnings.warn("verifier worker processes fail to start; scoring the rest as errors")
                    break
                now = time.monotonic()
                if any(w is not None and w.ready for w in self.workers):
                    spent += now - clock
                clock = now
                if spent >= batch_s:
                    self._stop_batch(busy, pending, results)
                    break
                self._dispatch(busy, pending, results, completions, answers, timeout_s)
                self._collect(busy, results, batch_s - spent)
            try:
                self._refill()  # replace killed workers now: they start while the trainer generates
            except Exception:
                pass
        return [r if r is not None else NO_WORKER for r in results]

    def _dispatch(self, busy, pending, results, completions, answers, timeout_s: float) -> None:
        """Give every idle ready worker its next item; start a worker in an empty or dead slot."""
        for k in range(len(self.workers)):
            w = self.workers[k]
            if w is None or (k not in busy and not w.alive()):
                if not pending:
                    continue
                self._drop(k)
                w = self.workers[k] = _Worker(self.blob, self.modules)
            if w.ready and k not in busy and pending:
                i = pending.popleft()
                try:
                    w.conn.send((i, _trim_for_transport(completions[i], self.cap), answers[i], timeout_s))
                    busy[k] = (i, time.monotonic() + timeout_s + _HARD_GRACE_S)
                except Exception:
                    results[i] = WORKER_LOST
                    self._drop(k)

    def _collect(self, busy, results, batch_left: float) -> None:
        """Wait for answers (or readiness) until the nearest deadline; kill workers past theirs."""
        from multiprocessing.connection import wait

        watch = {w.conn: k for k, w in enumerate(self.workers) if w is not None and (k in busy or not w.ready)}
        if not watch:
            return
        ends = [d for _, d in busy.values()] + [
            w.started + _STARTUP_S for w in self.workers if w is not None and not w.ready
        ]
        now = time.monotonic()
        if any(w is not None and w.ready for w in self.workers):
            ends.append(now + batch_left)
        for conn in wait(list(watch), timeout=max(0.0, min(ends) - now)):
            k = watch[conn]
            msg = _read_reply(conn)  # None: the worker died (crash, memory limit) or sent something else
            if k in busy:
                i, _ = busy.pop(k)
                ok = _is_score_reply(msg, i)
                comps = tuple(float(x) for x in msg[5]) if ok and len(msg) >= 6 else ()
                metrics = {k: float(v) for k, v in msg[6].items()} if ok and len(msg) == 7 else {}
                results[i] = Score(float(msg[1]), *msg[2:5], components=comps, metrics=metrics) if ok else WORKER_LOST
                if not ok:
                    self._drop(k)
            elif msg == "ready":
                self.workers[k].ready = True
            else:
                self.start_failures += 1
                self._drop(k)
        now = time.monotonic()
        for k, (i, d) in list(busy.items()):
            if now >= d:  # hard deadline: kill; the slot is refilled
                del busy[k]
                results[i] = TIMEOUT
                self._drop(k)
        for k, w in enumerate(self.workers):
            if w is not None and not w.ready and now >= w.started + _STARTUP_S:
                self.start_failures += 1
                self._drop(k)

    def _stop_batch(self, busy, pending, results) -> None:
        """The batch bound is spent: kill the workers still scoring, and score those items and the unsent ones 0."""
        for k, (i, _) in list(busy.items()):
            results[i] = BATCH_TIMEOUT
            self._drop(k)
        busy.clear()
        for i in pending:
            results[i] = BATCH_TIMEOUT
        pending.clear()

    def close(self) -> None:
        for k, w in enumerate(self.workers):
            if w is not None:
                try:
                    w.conn.send(None)
                    w.proc.wait(timeout=0.5)
                except Exception:
                    pass
                self._drop(k)


@atexit.register
def _close_pools() -> None:
    for p in list(_POOLS):
        p.close()


def _score_inline(verifier, completions, answers, batch_s: float) -> list[Score]:
    """In this thread, one item after another; items not started within batch_s score BATCH_TIMEOUT (an item
    already running is not interrupted: inline verifiers are cheap by construction, or bound themselves)."""
    out = []
    deadline = time.monotonic() + batch_s
    for c, a in zip(completions, answers):
        if time.monotonic() >= deadline:
            out.append(BATCH_TIMEOUT)
            continue
        try:
            s = verifier.score(c, a)
            out.append(s if _finite(s) else ERROR)  # float() of something not a number raises: an error too
        except Exception:
            out.append(ERROR)
    return out


def score_batch(
    verifier,
    completions: list[str],
    answers: list[str],
    *,
    timeout_s: float = 2.0,
    batch_timeout_s: float | None = None,
) -> list[Score]:
    """Score many completions: each within `timeout_s` (floor MIN_TIMEOUT_S = 10 ms), the whole batch within
    `batch_timeout_s` (default: the verifier's `verifier.batch_timeout_s`, else 30 s). A completion that raises,
    times out or is not reached within the batch bound scores 0 with error=True and a `reason`
    (`error_counts`). Never raises, except for mismatched lengths (a caller bug). Cheap verifiers run inline;
    others in worker processes (see module doc)."""
    if len(completions) != len(answers):
        raise ValueError(f"score_batch: {len(completions)} completions but {len(answers)} answers")
    if not completions:
        return []
    item_s = _bounded_seconds(timeout_s)
    if batch_timeout_s is None:
        batch_timeout_s = getattr(verifier, "batch_timeout_s", None) or DEFAULT_BATCH_TIMEOUT_S
    batch_s = _bounded_seconds(batch_timeout_s)
    try:
        return _score_bounded(verifier, completions, answers, item_s, batch_s)
    except Exception as e:  # noqa: BLE001 - documented never to raise: every item an error, the pool rebuilt
        warnings.warn(
            f"verifier {getattr(verifier, 'name', verifier)!r}: scoring failed ({type(e).__name__}: {e}); "
            "the batch scores 0 as errors"
        )
        pool = getattr(verifier, "__dict__", {}).pop("_pool", None)
        if pool is not None:
            try:
                pool.close()
            except Exception:
                pass
        return [ERROR] * len(completions)


def _score_bounded(verifier, completions, answers, item_s: float, batch_s: float) -> list[Score]:
    iso = getattr(verifier, "isolation", "auto")
    if iso == "inline" or (iso == "auto" and getattr(verifier, "bounded", False)):
        return _warn_batch_bound(_score_inline(verifier, completions, answers, batch_s), batch_s)
    pool = getattr(verifier, "_pool", None)
    if pool is None:
        try:
            pool = _WorkerPool(verifier, getattr(verifier, "workers", None) or _default_workers())
            verifier._pool = pool
        except Exception as e:  # cannot isolate (e.g. an object without __dict__): score inline, say so once
            warnings.warn(
                f"verifier {getattr(verifier, 'name', verifier)!r}: no worker processes ({e}); scoring inline without a hard timeout"
            )
            return _warn_batch_bound(_score_inline(verifier, completions, answers, batch_s), batch_s)
    return _warn_batch_bound(pool.score(completions, answers, item_s, batch_s), batch_s)


def _warn_batch_bound(scores: list[Score], batch_s: float) -> list[Score]:
    late = error_counts(scores).get("batch_timeout", 0)
    if late:
        warnings.warn(
            f"verifier: {late} of {len(scores)} completions were not scored within "
            f"verifier.batch_timeout_s={batch_s:g} s; they score 0 and count in verifier/errors"
        )
    return scores
