"""Verifiers: score a completion against a reference answer. Model output is untrusted input.

Every verifier has `score(completion, answer) -> Score(reward, correct, error)` and is usable alone:

    from rlcompare.verifiers import build_verifier, score_batch
    v = build_verifier({"name": "countdown"})
    v.score("<answer>3*5+7</answer>", '{"nums": [3, 5, 7], "target": 22}')   # Score(1.0, True, False)

| name          | reward                                                                         | answer (reference)       |
|---------------|--------------------------------------------------------------------------------|--------------------------|
| `exact_match` | 1 when the extracted number equals the reference (`1,000` == `1000.0` == `+1000`) | a number (or exact text) |
| `math_verify` | 1 when math-verify finds the answer equivalent (LaTeX, `\\boxed{}`, expressions) | LaTeX / number           |
| `countdown`   | 1 when the expression uses the given numbers (at most once each) and hits the target | JSON `{"nums", "target"}` |
| `format`      | 1 when the completion matches a regex (default: R1 `<think>..</think><answer>..</answer>`) | ignored          |
| `weighted`    | sum of weight * reward of sub-verifiers; `correct` is the first component's    | the first's              |

Nothing is passed to eval/exec. Inputs are cut before parsing (`max_chars`, default 10_000): markers
(`<answer>`, `\\boxed{}`, `####`), math-verify and format look at the LAST `max_chars` characters;
exact_match's plain "first number" fallback looks at the FIRST `max_chars`.

`score_batch` bounds every call: verifiers that are cheap by construction (exact_match, countdown,
the default format pattern) run inline in the caller's thread; the others (math_verify, a custom
format pattern, or a weighted mix holding one) run in worker processes (`verifier.workers`) with a
per-item deadline of `timeout_s` (a SIGALRM inside the worker, then a hard kill at `timeout_s + 0.5 s`;
a killed worker is replaced). An exception or timeout gives `Score(0.0, False, error=True)`; nothing raises.
"""

from __future__ import annotations

import atexit
import logging
import math
import os
import pickle
import re
import threading
import time
import warnings
import weakref
from collections import deque
from dataclasses import dataclass
from typing import Any

from rlcompare.countdown_expr import ExprError, decode_countdown, evaluate, normalize as _normalize_ops, uses_numbers


@dataclass(frozen=True)
class Score:
    reward: float
    correct: bool
    error: bool = False  # the verifier raised or timed out (reward 0)


ERROR = Score(0.0, False, True)
DEFAULT_MAX_CHARS = 10_000
VERIFIERS = ("exact_match", "math_verify", "countdown", "format", "weighted")

# ----------------------------------------------------------------------------- text helpers
# ASCII digits only: '١٢٣' / '１２３' are not numbers. Commas count only as thousands separators (groups of
# exactly 3: '1,000,000'); the former `[0-9][0-9,]*` read the list '1,2,3' as 123. (Groups of 2, as in
# '10,00,000', are not read: allowing them made the search quadratic on '12,12,12,...'.) The sign may be the
# math minus U+2212 ('−5'): without it '−5' read as 5 and scored correct against the answer 5. A number may
# start with its decimal point ('.5'; before, it read as 5), but not right after a digit ('1.2.3').
_DIGITS = r"(?:[0-9]{1,3}(?:,[0-9]{3})+(?![0-9])|[0-9]+)(?:\.[0-9]+)?|(?<![0-9])\.[0-9]+"
_NUMBER = re.compile(rf"[-+\u2212]?(?:{_DIGITS})")
_PLAIN_NUMBER = re.compile(rf"[-+]?(?:{_DIGITS})")


def normalize_number(text: str) -> str | None:
    """'1,000', '1000.0', '+1000' -> '1000'; None when not a plain decimal number (ASCII digits)."""
    t = text.strip().replace("\u2212", "-")  # '−5' (U+2212 MINUS SIGN) is -5
    if len(t) > 100 or not _PLAIN_NUMBER.fullmatch(t):
        return None
    t = t.replace(",", "")
    neg = t.startswith("-")
    t = t.lstrip("+-")
    if "." in t:
        t = t.rstrip("0").rstrip(".")
    t = t.lstrip("0") or "0"
    return ("-" + t) if neg and t != "0" else t


def last_tag(text: str, tag: str = "answer") -> str | None:
    """Content of the last `<tag>...</tag>` (linear time), or None; with nested tags the innermost
    (`<answer><answer>5</answer></answer>` -> '5', not '5</answer>')."""
    close = text.rfind(f"</{tag}>")
    if close < 0:
        return None
    start = text.rfind(f"<{tag}>", 0, close)
    if start < 0:
        return None
    start += len(tag) + 2
    return text[start : text.find(f"</{tag}>", start)]  # the first close after the last open (found: <= close)


def last_boxed(text: str) -> str | None:
    """Content of the last `\\boxed{...}` (or `\\fbox{...}`), nested braces kept; `\\boxed 5` form too."""
    i = max(text.rfind("\\boxed"), text.rfind("\\fbox"))
    if i < 0:
        return None
    j = i + (6 if text.startswith("\\boxed", i) else 5)
    if j < len(text) and text[j] == " ":  # "\boxed 5"
        m = re.match(r" +([^\s$]+)", text[j : j + 200])
        return m.group(1) if m else None
    if j >= len(text) or text[j] != "{":
        return None
    depth = 0
    for k in range(j, len(text)):
        ch = text[k]
        if ch == "{":
            depth += 1
        elif ch == "}":
            depth -= 1
            if depth == 0:
                return text[j + 1 : k]
    return None  # unbalanced


def after_hashes(text: str) -> str | None:
    """Text after the last `####` (GSM8K style), up to the end of that line."""
    i = text.rfind("####")
    return None if i < 0 else text[i + 4 :].strip().split("\n", 1)[0]


def _tail(text: str, n: int) -> str:
    return text[-n:] if len(text) > n else text


def _as_dict(cfg: Any) -> dict:
    """A verifier config (DictConfig, dict, or an object with attributes) as a plain, picklable dict."""
    if cfg is None:
        return {}
    if isinstance(cfg, dict):
        return dict(cfg)
    try:
        from omegaconf import DictConfig, OmegaConf

        if isinstance(cfg, DictConfig):
            return OmegaConf.to_container(cfg, resolve=True)
    except ImportError:  # pragma: no cover
        pass
    return {k: v for k, v in vars(cfg).items() if not k.startswith("_")}


def _opt(d: dict, key: str, default: Any) -> Any:
    v = d.get(key)
    return default if v is None else v


# ----------------------------------------------------------------------------- verifiers
class Verifier:
    """Base: `score(completion, answer) -> Score`. `bounded` verifiers are cheap by construction and run inline."""

    name = "verifier"
    bounded = True
    isolation = "auto"  # auto | process | inline (set from verifier.isolation)
    workers: int | None = None  # worker processes (set from verifier.workers)

    def score(self, completion: str, answer: str) -> Score:  # pragma: no cover
        raise NotImplementedError

    def __call__(self, completion: str, answer: str) -> Score:
        return self.score(completion, answer)

    def __getstate__(self):  # caches and the worker pool stay behind
        return {k: v for k, v in self.__dict__.items() if not k.startswith("_")}

    def close(self) -> None:
        pool = self.__dict__.pop("_pool", None)
        if pool is not None:
            pool.close()


class ExactMatch(Verifier):
    """Numeric exact match.

    The answer is taken from, in order: the last `<answer>...</answer>`, the last `\\boxed{...}`, the text
    after the last `####` (each in the last `max_chars`); inside that region the whole text if it is a number,
    else its LAST number. Without any marker: the FIRST number of the completion (`number: first`, the
    embedded arithmetic task, "17" or "17 and more") or the last (`number: last`).
    A non-numeric reference is compared as whitespace-collapsed text.
    """

    name = "exact_match"

    def __init__(self, number: str = "first", max_chars: int = DEFAULT_MAX_CHARS):
        if number not in ("first", "last"):
            raise ValueError(f"verifier.number={number!r} is not accepted; use one of: first, last")
        self.number, self.max_chars = number, int(max_chars)

    def extract(self, completion: str) -> tuple[str | None, bool]:
        """(answer text, whether it came from a marker)."""
        tail = _tail(completion, self.max_chars)
        for f in (last_tag, last_boxed, after_hashes):
            region = f(tail)
            if region is not None:
                return region, True
        return None, False

    def score(self, completion: str, answer: str) -> Score:
        answer = str(answer)
        ref = normalize_number(answer)
        region, marked = self.extract(completion)
        if marked:
            got = normalize_number(region)
            if got is None and ref is not None:
                nums = _NUMBER.findall(region)
                got = normalize_number(nums[-1]) if nums else None
            ok = (got == ref) if ref is not None else " ".join(region.split()) == " ".join(answer.split())
        else:
            if self.number == "first":
                m = _NUMBER.search(completion[: self.max_chars])
                got_text = m.group(0) if m else None
            else:
                nums = _NUMBER.findall(_tail(completion, self.max_chars))
                got_text = nums[-1] if nums else None
            if ref is not None:
                ok = got_text is not None and normalize_number(got_text) == ref
            else:
                ok = completion[: self.max_chars].strip() == answer.strip()
        return Score(1.0 if ok else 0.0, ok)


class MathVerify(Verifier):
    """math-verify equivalence (`\\frac{1}{2}` == `0.5`, `\\sqrt{2}/2` == `\\frac{\\sqrt{2}}{2}`).

    The prediction is the last `<answer>...</answer>` content when present, else the last `max_chars`
    characters (math-verify then prefers the last `\\boxed{}`). The reference is parsed as LaTeX
    (`$answer$`, then as given, then `\\boxed{answer}`). Not bounded by construction (sympy): score_batch
    runs it in worker processes; a call in the main thread outside a worker (direct, `isolation: inline`) has
    one SIGALRM deadline of `timeout_s` and reports a timeout as `error`.
    """

    name = "math_verify"
    bounded = False

    def __init__(self, max_chars: int = DEFAULT_MAX_CHARS, strict: bool = True, float_rounding: int = 6,
                 timeout_s: float | None = 5.0):
        try:
            import math_verify  # noqa: F401
        except ImportError as e:
            raise ValueError("verifier.name=math_verify needs the math-verify package: pip install 'math-verify[antlr4_13_2]'") from e
        self.max_chars, self.strict, self.float_rounding = int(max_chars), bool(strict), int(float_rounding)
        self.timeout_s = timeout_s  # one SIGALRM deadline per call, used only inline in the main thread

    def warm(self) -> None:
        """Import math-verify (and sympy) up front, e.g. in a fresh worker before it reports ready."""
        from math_verify import parse, verify

        verify(parse("$1$"), parse("$1$"), timeout_seconds=None)

    def _own_timeout(self) -> float | None:
        import signal

        if (_IN_WORKER or threading.current_thread() is not threading.main_thread() or not self.timeout_s
                or not hasattr(signal, "setitimer")):
            return None  # the worker's SIGALRM / the caller bounds time instead
        return float(self.timeout_s)

    def _gold(self, answer: str):
        from math_verify import parse

        cache = self.__dict__.setdefault("_gold_cache", {})
        if answer in cache:
            return cache[answer]
        forms = [answer] if ("$" in answer or "\\boxed" in answer) else [f"${answer}$", answer, f"\\boxed{{{answer}}}"]
        gold = []
        for f in forms:
            gold = parse(f, parsing_timeout=None)
            if gold:
                break
        if not gold:
            raise ValueError(f"math_verify could not parse the reference answer {answer[:80]!r}")
        if len(cache) > 4096:
            cache.clear()
        cache[answer] = gold
        return gold

    def score(self, completion: str, answer: str) -> Score:
        """Inline in the main thread (a direct call, `isolation: inline`): ONE deadline of `timeout_s` for the
        whole call, and a timeout is `error=True` (counted in verifier/errors). math-verify's own timeouts were
        per parse/verify call (up to 6 x timeout_s in all) and turned a timeout into a plain wrong answer."""
        import signal

        t = self._own_timeout()
        if t is None:
            return self._score(completion, answer)

        def on_alarm(signum, frame):
            raise _ItemTimeout()

        old_handler = signal.getsignal(signal.SIGALRM)
        old_delay, old_interval = signal.getitimer(signal.ITIMER_REAL)  # a caller's own timer: never pushed back
        start = time.monotonic()
        try:
            try:
                signal.signal(signal.SIGALRM, on_alarm)
                signal.setitimer(signal.ITIMER_REAL, min(t, old_delay) if old_delay > 0 else t)
                return self._score(completion, answer)
            finally:
                signal.setitimer(signal.ITIMER_REAL, 0)
        except _ItemTimeout:
            return ERROR
        finally:
            signal.signal(signal.SIGALRM, old_handler if old_handler is not None else signal.SIG_DFL)
            if old_delay > 0:  # give back a caller's own timer, less the time spent here
                signal.setitimer(signal.ITIMER_REAL, max(1e-3, old_delay - (time.monotonic() - start)), old_interval)

    def _score(self, completion: str, answer: str) -> Score:
        from math_verify import parse, verify

        _quiet_math_verify()  # math-verify's own timeouts stay off (None): its signal.alarm would reset ours
        gold = self._gold(str(answer).strip())
        tail = _tail(completion, self.max_chars)
        tagged = last_tag(tail)
        pred = parse(tagged if tagged is not None else tail, parsing_timeout=None)
        if not pred and tagged is not None and tagged.strip():
            pred = parse(f"${tagged.strip()}$", parsing_timeout=None)
        ok = bool(pred) and bool(verify(gold, pred, float_rounding=self.float_rounding, strict=self.strict, timeout_seconds=None))
        return Score(1.0 if ok else 0.0, ok)


def _quiet_math_verify() -> None:
    # math-verify warns once when its own timeout is off; ours (worker SIGALRM + kill) replaces it
    for n in ("math_verify.parser", "math_verify.grader"):
        logging.getLogger(n).setLevel(logging.ERROR)


class Countdown(Verifier):
    """Countdown: the expression must use the given numbers (each at most once; `require_all`: exactly once),
    only `+ - * /` and parentheses, and equal the target exactly (rational arithmetic, `countdown_expr`).

    The expression is the last `<answer>...</answer>` content, else the last line with a digit. `$`, `\\(`
    `\\)`, `\\[` `\\]` and a trailing `.` are dropped; with `=` the first side holding an operator is the
    expression (`3*5+7 = 22` and `22 = 3*5+7` both read `3*5+7`), and every other side must be a valid
    expression of the same value (`3*5+7 = 23` scores 0: a false equation). The reference is the JSON string
    `{"nums": [...], "target": N}` (`countdown_expr.encode_countdown`). An invalid expression scores 0
    without `error` (error is for verifier faults).
    """

    name = "countdown"

    def __init__(self, require_all: bool = False, max_chars: int = DEFAULT_MAX_CHARS):
        self.require_all, self.max_chars = bool(require_all), int(max_chars)

    def extract(self, completion: str) -> str | None:
        sides = self._sides(completion)
        return None if sides is None else sides[0]

    def _sides(self, completion: str) -> list[str] | None:
        """The expression, then the other sides of its equation (if any)."""
        tail = _tail(completion, self.max_chars)
        text = last_tag(tail)
        if text is None:
            lines = [ln for ln in tail.splitlines() if any("0" <= ch <= "9" for ch in ln)]
            if not lines:
                return None
            text = lines[-1]
        for junk in ("$", "\\(", "\\)", "\\[", "\\]"):
            text = text.replace(junk, " ")
        text = text.strip().rstrip(".").strip()
        parts = [p.strip() for p in text.split("=") if p.strip()]
        if not parts:
            return None
        for k, p in enumerate(parts):
            if any(op in _normalize_ops(p) for op in "+-*/"):
                return [p] + parts[:k] + parts[k + 1 :]
        return parts

    def score(self, completion: str, answer: str) -> Score:
        nums, target = decode_countdown(answer)  # a bad reference raises -> error=True in score_batch
        sides = self._sides(completion)
        if sides is None:
            return Score(0.0, False)
        try:
            ev = evaluate(sides[0])
            # The other sides must hold too: '3*5+7 = 23' (or '= 3*5+8') states a false equation and scored 1
            # when only the first side was read. Each is a checked expression (<= 512 chars), so this stays cheap.
            if any(evaluate(p).value != ev.value for p in sides[1:]):
                return Score(0.0, False)
        except ExprError:
            return Score(0.0, False)
        ok = uses_numbers(ev.numbers, nums, require_all=self.require_all) and ev.value == target
        return Score(1.0 if ok else 0.0, ok)


R1_FORMAT = r"^(?:(?!</think>).)*</think>\s*<answer>(?:(?!</answer>).)*</answer>\s*\Z"
# The opening <think> is optional because the r1 prompt template ends with "<think>": the first tempered token
# ((?!x).)* takes leading whitespace and an opening <think> too. Tempered tokens keep the match linear in the
# input length. A former leading `\s*(?:<think>)?` matched the same texts but overlapped the tempered token on
# whitespace, so a completion of n leading blanks (no </think>) backtracked O(n^2): ~1 s at 10_000 characters,
# inline, outside any timeout.


class FormatCheck(Verifier):
    """Reward 1 when `pattern` is found (re.search, DOTALL) in the last `max_chars` characters, else 0."""

    name = "format"

    def __init__(self, pattern: str | None = None, max_chars: int = DEFAULT_MAX_CHARS):
        self.pattern = pattern or R1_FORMAT
        self.bounded = pattern is None or pattern == R1_FORMAT  # a custom regex may backtrack: run it in a worker
        self.max_chars = int(max_chars)
        try:
            re.compile(self.pattern, re.S)
        except re.error as e:
            raise ValueError(f"verifier.pattern={self.pattern!r} is not a valid regex: {e}") from None

    def score(self, completion: str, answer: str = "") -> Score:
        ok = re.search(self.pattern, _tail(completion, self.max_chars), re.S) is not None
        return Score(1.0 if ok else 0.0, ok)


class Weighted(Verifier):
    """reward = sum(weight_i * reward_i); correct = the first component's; error = any component's."""

    name = "weighted"

    def __init__(self, components: list[tuple[Verifier, float]]):
        if not components:
            raise ValueError("verifier.name=weighted needs verifier.components, e.g. [{name: countdown, weight: 1.0}, {name: format, weight: 0.1}]")
        self.components = components
        self.bounded = all(v.bounded for v, _ in components)
        self.max_chars = max(getattr(v, "max_chars", DEFAULT_MAX_CHARS) for v, _ in components)

    def warm(self) -> None:
        for v, _ in self.components:
            if hasattr(v, "warm"):
                v.warm()

    def score(self, completion: str, answer: str) -> Score:
        scores = [v.score(completion, answer) for v, _ in self.components]
        reward = sum(w * s.reward for (_, w), s in zip(self.components, scores))
        return Score(float(reward), scores[0].correct, any(s.error for s in scores))


def _build_one(d: dict, where: str = "verifier") -> Verifier:
    name = d.get("name")
    max_chars = int(_opt(d, "max_chars", DEFAULT_MAX_CHARS))
    if name == "exact_match":
        return ExactMatch(number=_opt(d, "number", "first"), max_chars=max_chars)
    if name == "math_verify":
        return MathVerify(max_chars=max_chars, timeout_s=_opt(d, "timeout_s", 5.0))
    if name == "countdown":
        return Countdown(require_all=bool(_opt(d, "require_all", False)), max_chars=max_chars)
    if name == "format":
        return FormatCheck(pattern=d.get("pattern"), max_chars=max_chars)
    if name == "weighted":
        if where != "verifier":
            raise ValueError(f"{where}.name=weighted: weighted verifiers cannot nest")
        comps = d.get("components")
        if not isinstance(comps, (list, tuple)) or not comps:
            raise ValueError(f"{where}.name=weighted needs {where}.components, a non-empty list like "
                             "[{name: countdown, weight: 1.0}, {name: format, weight: 0.1}]")
        base = {k: v for k, v in d.items() if k not in ("name", "components")}
        parts = []
        for i, c in enumerate(comps):
            key = f"{where}.components[{i}]"
            if not isinstance(c, dict) or "name" not in c:
                raise ValueError(f"{key} must be a mapping with a name and a weight, e.g. {{name: format, weight: 0.1}}; got {c!r}")
            w = c.get("weight", 1.0)
            if not isinstance(w, (int, float)) or isinstance(w, bool) or not math.isfinite(w):
                raise ValueError(f"{key}.weight={w!r} must be a finite number")
            sub = {**base, **{k: v for k, v in c.items() if k != "weight"}}
            parts.append((_build_one(sub, key), float(w)))
        return Weighted(parts)
    raise ValueError(f"{where}.name={name!r} is not a known verifier; use one of: {', '.join(VERIFIERS)}")


def build_verifier(cfg: Any) -> Verifier:
    """Build from the `verifier` config group (DictConfig, dict or any object with attributes)."""
    d = _as_dict(cfg)
    v = _build_one(d)
    iso = _opt(d, "isolation", "auto")
    if iso not in ("auto", "process", "inline"):
        raise ValueError(f"verifier.isolation={iso!r} is not accepted; use one of: auto, process, inline")
    v.isolation = iso
    workers = d.get("workers")
    v.workers = int(workers) if workers else None
    return v


# ----------------------------------------------------------------------------- bounded batch scoring
_IN_WORKER = False
_HARD_GRACE_S = 0.5  # a worker past timeout_s + this is killed (SIGKILL) and replaced
_STARTUP_S = 60.0  # a worker must import and report ready within this (not counted against items)
_WORKER_EXTRA_MEMORY = 2 << 30  # address space a worker may add beyond its size when ready
_POOLS: "weakref.WeakSet[_WorkerPool]" = weakref.WeakSet()


def _default_workers() -> int:
    return min(4, max(1, (os.cpu_count() or 2) // 2))


def _limit_memory() -> None:
    try:
        import resource

        with open("/proc/self/statm") as f:
            vm = int(f.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
        lim = vm + _WORKER_EXTRA_MEMORY
        resource.setrlimit(resource.RLIMIT_AS, (lim, lim))
    except Exception:
        pass


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
    _quiet_math_verify()
    conn = Connection(fd)
    try:
        verifier = conn.recv()
        warm = getattr(verifier, "warm", None)
        if warm is not None:
            warm()
        _limit_memory()
        conn.send("ready")
    except (EOFError, OSError):
        return
    while True:
        try:
            msg = conn.recv()
        except (EOFError, OSError):
            return
        if msg is None:
            return
        i, completion, answer, timeout_s = msg
        try:
            try:
                signal.setitimer(signal.ITIMER_REAL, max(0.01, float(timeout_s)))
                s = verifier.score(completion, answer)
            finally:
                signal.setitimer(signal.ITIMER_REAL, 0)
            r = float(s.reward)
            out = (i, r if math.isfinite(r) else 0.0, bool(s.correct), bool(s.error) or not math.isfinite(r))
        except BaseException:  # timeout, MemoryError, RecursionError, anything
            out = (i, 0.0, False, True)
        try:
            conn.send(out)
        except (EOFError, OSError):
            return


class _Worker:
    """One worker: `python -c ...` (a fresh interpreter: no fork of a threaded/CUDA parent, no re-import of
    the caller's __main__), talking over a socketpair with multiprocessing's pickle framing."""

    def __init__(self, verifier_blob: bytes):
        import socket
        import subprocess
        import sys
        from multiprocessing.connection import Connection

        here, theirs = socket.socketpair()
        root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        env = dict(os.environ)
        env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
        code = "import sys; from rlcompare.verifiers import _worker_entry; _worker_entry(int(sys.argv[1]))"
        try:
            self.proc = subprocess.Popen([sys.executable, "-c", code, str(theirs.fileno())], pass_fds=(theirs.fileno(),),
                                         stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, env=env)
        finally:
            theirs.close()
        self.conn = Connection(here.detach())
        self.conn.send_bytes(verifier_blob)
        self.ready = False
        self.started = time.monotonic()

    def alive(self) -> bool:
        return self.proc.poll() is None

    def kill(self) -> None:
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
        self.blob = pickle.dumps(verifier)
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
                self.workers[k] = _Worker(self.blob)

    def _drop(self, k: int) -> None:
        w, self.workers[k] = self.workers[k], None
        if w is not None:
            w.kill()

    def score(self, completions, answers, timeout_s: float) -> list[Score]:
        from multiprocessing.connection import wait

        n = len(completions)
        results: list[Score | None] = [None] * n
        pending = deque(range(n))
        busy: dict[int, tuple[int, float]] = {}  # worker slot -> (item, hard deadline)
        with self.lock:
            self.start_failures = 0
            while pending or busy:
                if pending and self.start_failures >= 3 * len(self.workers):
                    warnings.warn("verifier worker processes fail to start; scoring the rest as errors")
                    break
                for k in range(len(self.workers)):
                    w = self.workers[k]
                    if w is None or (k not in busy and not w.alive()):
                        if not pending:
                            continue
                        self._drop(k)
                        w = self.workers[k] = _Worker(self.blob)
                    if w.ready and k not in busy and pending:
                        i = pending.popleft()
                        try:
                            w.conn.send((i, _trim_for_transport(completions[i], self.cap), answers[i], timeout_s))
                            busy[k] = (i, time.monotonic() + timeout_s + _HARD_GRACE_S)
                        except Exception:
                            results[i] = ERROR
                            self._drop(k)
                watch = {w.conn: k for k, w in enumerate(self.workers) if w is not None and (k in busy or not w.ready)}
                if not watch:
                    continue
                ends = [d for _, d in busy.values()] + [w.started + _STARTUP_S for w in self.workers if w is not None and not w.ready]
                for conn in wait(list(watch), timeout=max(0.0, min(ends) - time.monotonic())):
                    k = watch[conn]
                    try:
                        msg = conn.recv()
                    except Exception:  # the worker died (crash, memory limit)
                        msg = None
                    if k in busy:
                        i, _ = busy.pop(k)
                        ok = isinstance(msg, tuple) and msg[0] == i
                        results[i] = Score(msg[1], msg[2], msg[3]) if ok else ERROR
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
                        results[i] = ERROR
                        self._drop(k)
                for k, w in enumerate(self.workers):
                    if w is not None and not w.ready and now >= w.started + _STARTUP_S:
                        self.start_failures += 1
                        self._drop(k)
            try:
                self._refill()  # replace killed workers now: they start while the trainer generates
            except Exception:
                pass
        return [r if r is not None else ERROR for r in results]

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


def _score_inline(verifier, completions, answers) -> list[Score]:
    out = []
    for c, a in zip(completions, answers):
        try:
            s = verifier.score(c, a)
            r = float(s.reward)
            out.append(s if math.isfinite(r) else ERROR)
        except Exception:
            out.append(ERROR)
    return out


def score_batch(verifier, completions: list[str], answers: list[str], *, timeout_s: float = 2.0) -> list[Score]:
    """Score many completions, each within `timeout_s`; an exception or timeout gives reward 0 with
    error=True, never a crash. Cheap verifiers run inline; others in worker processes (see module doc)."""
    if len(completions) != len(answers):
        raise ValueError(f"score_batch: {len(completions)} completions but {len(answers)} answers")
    if not completions:
        return []
    iso = getattr(verifier, "isolation", "auto")
    if iso == "inline" or (iso == "auto" and getattr(verifier, "bounded", False)):
        return _score_inline(verifier, completions, answers)
    pool = getattr(verifier, "_pool", None)
    if pool is None:
        try:
            pool = _WorkerPool(verifier, getattr(verifier, "workers", None) or _default_workers())
            verifier._pool = pool
        except Exception as e:  # cannot isolate (e.g. an object without __dict__): score inline, say so once
            warnings.warn(f"verifier {getattr(verifier, 'name', verifier)!r}: no worker processes ({e}); scoring inline without a hard timeout")
            return _score_inline(verifier, completions, answers)
    return pool.score(completions, answers, float(timeout_s))
