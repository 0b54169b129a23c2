"""Verifiers: score a completion against a reference answer. Model output is untrusted input.

Every verifier has `score(completion, answer) -> Score(reward, correct, error)` and is usable alone:

    from rlcompare.rewards.verifiers import build_verifier, score_batch
    v = build_verifier({"name": "countdown"})
    v.score("<answer>3*5+7</answer>", '{"nums": [3, 5, 7], "target": 22}')   # Score(1.0, True, False)

| name          | reward                                                                         | answer (reference)       |
|---------------|--------------------------------------------------------------------------------|--------------------------|
| `exact_match` | 1 when the final answer states one number equal to the reference (`1,000` == `1000.0`) | a number (or exact text) |
| `math_verify` | 1 when math-verify finds the final answer equivalent (LaTeX, `\\boxed{}`, expressions) | LaTeX / number           |
| `countdown`   | 1 when the expression uses the given numbers (at most once each) and hits the target | JSON `{"nums", "target"}` |
| `format`      | 1 when the completion matches a regex (default: R1 `<think>..</think><answer>..</answer>`) | ignored          |
| `weighted`    | sum of weight * reward of sub-verifiers; `correct` is the first component's    | the first's              |

Which span is the final answer, and what it must state, is one rule for every verifier that reads an answer
(docs/verifiers.md, `rlcompare/rewards/answers.py`): the `<answer>` content, else `\\boxed{}`, else (exact_match) `####`,
else one line; it must state ONE value: `122 or 123`, `\\boxed{124=123}`, `between 122 and 123`, `123/0` score 0,
and `-(123)`, `−123`, `- 123` are -123. `format` checks the form only; `weighted`'s `correct` is its first component's.

Nothing is passed to eval/exec. Inputs are cut before parsing (`max_chars`, default 10_000): markers
(`<answer>`, `\\boxed{}`, `####`), math-verify and format look at the LAST `max_chars` characters;
exact_match's unmarked first line is looked for in the FIRST `max_chars`.

`score_batch` bounds every call and every batch: verifiers that are cheap by construction (exact_match,
countdown, the default format pattern) run inline in the caller's thread; the others (math_verify, a custom
format pattern, or a weighted mix holding one) run in worker processes (`verifier.workers`, default min(4, usable
cores)) with a per-item deadline of `timeout_s` (a SIGALRM inside the worker, then a hard kill at `timeout_s +
0.5 s`; a killed worker is replaced; `timeout_s` has a floor of 10 ms). The whole batch gets
`verifier.batch_timeout_s` (30 s) of scoring time: items still running then are killed, the rest are not
started. An exception or timeout gives `Score(0.0, False, error=True, reason=...)` (`error_counts`); nothing raises.
"""

from __future__ import annotations

import atexit
import json
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
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

from rlcompare.rewards.answers import (  # noqa: F401 - last_tag, last_boxed, after_hashes: re-exported (datasets.py, callers)
    DIGIT,
    DIGIT_OR_BACKSLASH,
    MAX_CANDIDATES,
    after_hashes,
    distinct,
    has_dash_like,
    last_boxed,
    last_tag,
    line_with,
    marked_spans,
    math_statement,
    lists_values,
    double_superscript,
    normalize_signs,
    stated_value,
)
from rlcompare.rewards.countdown_expr import (
    ExprError,
    decode_countdown,
    evaluate,
    normalize as _normalize_ops,
    uses_numbers,
)


@dataclass(frozen=True)
class Score:
    reward: float
    correct: bool
    error: bool = False  # the verifier raised or timed out (reward 0)
    # why an error scored 0 (one of ERROR_REASONS; "" when not an error). Not compared: Score(0.0, False, True)
    # equals every error whatever its reason.
    reason: str = field(default="", compare=False)


ERROR_REASONS = ("raised", "timeout", "batch_timeout", "worker_lost", "no_worker")
ERROR = Score(0.0, False, True, "raised")  # the verifier raised (or returned a non-finite reward)
TIMEOUT = Score(0.0, False, True, "timeout")  # past verifier.timeout_s for this completion
BATCH_TIMEOUT = Score(0.0, False, True, "batch_timeout")  # not scored within verifier.batch_timeout_s for the batch
WORKER_LOST = Score(0.0, False, True, "worker_lost")  # its worker process died or answered garbage
NO_WORKER = Score(0.0, False, True, "no_worker")  # worker processes failed to start
WRONG = Score(0.0, False)
RIGHT = Score(1.0, True)
DEFAULT_MAX_CHARS = 10_000
VERIFIERS = ("exact_match", "math_verify", "countdown", "format", "weighted", "reasoning_gym")


# name -> build(verifier config as a dict): verifiers defined in their own module, which registers them (importing
# that module from here would be a cycle: it builds on this one)
REGISTERED: dict[str, Any] = {}


def error_counts(scores) -> dict[str, int]:
    """How many scores are errors, by reason: {'timeout': 3, 'batch_timeout': 12} (reasons with none left out)."""
    out: dict[str, int] = {}
    for s in scores:
        if s.error:
            out[s.reason or "raised"] = out.get(s.reason or "raised", 0) + 1
    return out


# ----------------------------------------------------------------------------- text helpers
# ASCII digits only: '١٢٣' / '１２３' are not numbers. Commas count only as thousands separators (groups of
# exactly 3: '1,000,000'); the former `[0-9][0-9,]*` read the list '1,2,3' as 123. (Groups of 2, as in
# '10,00,000', are not read: allowing them made the search quadratic on '12,12,12,...'.) A number may start with
# its decimal point ('.5'), but not right after a digit ('1.2.3'). Reading a completion's final answer is
# answers.stated_value; this reads a reference.
_DIGITS = r"(?:[0-9]{1,3}(?:,[0-9]{3})+(?![0-9])|[0-9]+)(?:\.[0-9]+)?|(?<![0-9])\.[0-9]+"
_PLAIN_NUMBER = re.compile(rf"[-+]?(?:{_DIGITS})")


def normalize_number(text: str) -> str | None:
    """'1,000', '1000.0', '+1000' -> '1000'; None when not a plain decimal number (ASCII digits). Sign
    look-alikes are signs: '−5' (U+2212), '–5', '－5' are -5."""
    t = normalize_signs(text.strip())
    if len(t) > 100 or not _PLAIN_NUMBER.fullmatch(t):
        return None
    t = t.replace(",", "")
    neg = t.startswith("-")
    t = t.lstrip("+-")
    if "." in t:
        t = t.rstrip("0").rstrip(".")
    t = t.lstrip("0") or "0"
    return ("-" + t) if neg and t != "0" else t


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
    """Numeric exact match on the completion's final answer (docs/verifiers.md, `answers.py`).

    The final-answer spans: the `<answer>...</answer>` contents, else the `\\boxed{...}` contents, else the text
    after `####` (each in the last `max_chars`); without any marker, one line: the first line holding a digit
    (`number: first`, the embedded arithmetic task: "17") or the last (`number: last`). Each span must state one
    number equal to the reference (`answers.stated_value`: `123`, `The answer is 123.`, `x = 123`, `3 + 120 = 123`;
    never `122 or 123`, `124=123`, `-(123)`, `123/0`); with several non-empty markers every one must.
    A non-numeric reference is compared as whitespace-collapsed text.
    """

    name = "exact_match"

    def __init__(self, number: str = "first", max_chars: int = DEFAULT_MAX_CHARS):
        if number not in ("first", "last"):
            raise ValueError(f"verifier.number={number!r} is not accepted; use one of: first, last")
        self.number, self.max_chars = number, int(max_chars)

    def spans(self, completion: str) -> tuple[bool, list[str]]:
        """(whether a marker was found, the final-answer spans)."""
        kind, spans = marked_spans(_tail(completion, self.max_chars), ("answer", "boxed", "hashes"))
        if kind is not None:
            return True, spans
        text = completion[: self.max_chars] if self.number == "first" else _tail(completion, self.max_chars)
        line = line_with(text, DIGIT, last=self.number == "last")
        return False, [] if line is None else [line]

    def score(self, completion: str, answer: str) -> Score:
        answer = str(answer)
        ref = normalize_number(answer)
        marked, spans = self.spans(completion)
        spans = distinct(spans)
        if ref is None:  # a text reference ("A"): the span as text, or the whole unmarked completion
            texts = spans if marked else [completion[: self.max_chars]]
            ok = bool(texts) and all(" ".join(t.split()) == " ".join(answer.split()) for t in texts)
        else:
            want = Fraction(ref)
            ok = 0 < len(spans) <= MAX_CANDIDATES and all(stated_value(t) == want for t in spans)
        return RIGHT if ok else WRONG


class MathVerify(Verifier):
    """math-verify equivalence (`\\frac{1}{2}` == `0.5`, `\\sqrt{2}/2` == `\\frac{\\sqrt{2}}{2}`).

    The final-answer spans (docs/verifiers.md): the `<answer>...</answer>` contents, else the `\\boxed{}` contents,
    else the last line holding a digit or a `\\` (in the last `max_chars`). Against a single-valued reference a
    span must state one value (`answers.math_statement`: no `122 or 123`, `122, 123`, `\\pm`, `\\approx`, `<`; an
    equation's sides must all be equivalent, so `\\boxed{124=123}` is false, `\\boxed{x = 123}` is 123); with
    several non-empty markers every one must match. The reference is parsed as LaTeX (`$answer$`, then as given,
    then `\\boxed{answer}`); a set, tuple, interval or relation reference is compared whole. Not bounded by construction (sympy): score_batch
    runs it in worker processes; a call in the main thread outside a worker (direct, `isolation: inline`) has
    one SIGALRM deadline of `timeout_s` and reports a timeout as `error`.
    """

    name = "math_verify"
    bounded = False

    def __init__(
        self,
        max_chars: int = DEFAULT_MAX_CHARS,
        strict: bool = True,
        float_rounding: int = 6,
        timeout_s: float | None = 5.0,
    ):
        try:
            import math_verify  # noqa: F401
        except ImportError as e:
            raise ValueError(
                "verifier.name=math_verify needs the math-verify package: pip install 'math-verify[antlr4_13_2]'"
            ) from e
        self.max_chars, self.strict, self.float_rounding = int(max_chars), bool(strict), int(float_rounding)
        self.timeout_s = timeout_s  # one SIGALRM deadline per call, used only inline in the main thread

    def warm(self) -> None:
        """Import math-verify (and sympy) up front, e.g. in a fresh worker before it reports ready."""
        from math_verify import parse, verify

        verify(parse("$1$"), parse("$1$"), timeout_seconds=None)

    def _own_timeout(self) -> float | None:
        import signal

        if (
            _IN_WORKER
            or threading.current_thread() is not threading.main_thread()
            or not self.timeout_s
            or not hasattr(signal, "setitimer")
        ):
            return None  # the worker's SIGALRM / the caller bounds time instead
        return float(self.timeout_s)

    def _gold(self, answer: str) -> tuple[list, str]:
        """The parsed reference and its shape: 'value' (one value), 'many' (a set, tuple, interval, or a list
        such as `1, 2` / `1 \\pm \\sqrt{2}`) or 'relation' (`x = 2`, `x > 1`)."""
        from math_verify import parse

        cache = self.__dict__.setdefault("_gold_cache", {})
        if answer in cache:
            return cache[answer]
        answer_text = normalize_signs(answer)
        forms = (
            [answer_text]
            if ("$" in answer_text or "\\boxed" in answer_text)
            else [f"${answer_text}$", answer_text, f"\\boxed{{{answer_text}}}"]
        )
        gold = []
        for f in forms:
            gold = parse(f, parsing_timeout=None)
            if gold:
                break
        if not gold:
            raise ValueError(f"math_verify could not parse the reference answer {answer[:80]!r}")
        if len(cache) > 4096:
            cache.clear()
        cache[answer] = (gold, _shape(gold[0], answer_text))
        return cache[answer]

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
            return TIMEOUT
        finally:
            signal.signal(signal.SIGALRM, old_handler if old_handler is not None else signal.SIG_DFL)
            if old_delay > 0:  # give back a caller's own timer, less the time spent here
                signal.setitimer(signal.ITIMER_REAL, max(1e-3, old_delay - (time.monotonic() - start)), old_interval)

    def _score(self, completion: str, answer: str) -> Score:
        _quiet_math_verify()  # math-verify's own timeouts stay off (None): its signal.alarm would reset ours
        gold, shape = self._gold(str(answer).strip())
        tail = _tail(completion, self.max_chars)
        kind, spans = marked_spans(tail, ("answer", "boxed"))
        if kind is None:  # no marker: the last line that may hold math
            line = line_with(tail, DIGIT_OR_BACKSLASH, last=True)
            spans = [] if line is None else [line]
        spans = distinct(spans)
        ok = 0 < len(spans) <= MAX_CANDIDATES and all(
            self._span_matches(t, kind == "boxed", gold, shape) for t in spans
        )
        return RIGHT if ok else WRONG

    def _span_matches(self, span: str, boxed: bool, gold, shape: str) -> bool:
        """Whether one final-answer span states the reference (docs/verifiers.md)."""
        from math_verify import verify

        if shape != "value":  # a set, tuple, interval or relation: math-verify compares the whole statement
            text = normalize_signs(span)
            pred = [] if double_superscript(text) or has_dash_like(text) else self._parse(text, latex=boxed)
            return bool(pred) and self._verify(gold, pred)
        sides = math_statement(span)
        if sides is None:
            return False  # several values, another relation, a LaTeX error
        preds = [self._parse(text, latex=True) for text in sides]
        if not all(preds) or any(_relation_or_set(p[0]) for p in preds):
            return False
        last = preds[-1]
        # every side of an equation states the same value: `\\boxed{124=123}` is false, not 123
        if any(
            not verify(p, last, float_rounding=self.float_rounding, strict=self.strict, timeout_seconds=None)
            for p in preds[:-1]
        ):
            return False
        return self._verify(gold, last)

    def _verify(self, gold, pred) -> bool:
        from math_verify import verify

        return bool(verify(gold, pred, float_rounding=self.float_rounding, strict=self.strict, timeout_seconds=None))

    @staticmethod
    def _parse(text: str, latex: bool) -> list:
        """math-verify's parse of one side: LaTeX as `$text$`; other text as given, then as `$text$`."""
        from math_verify import parse

        if latex:
            return parse(f"${text}$", parsing_timeout=None)
        return parse(text, parsing_timeout=None) or parse(f"${text.strip()}$", parsing_timeout=None)


def _shape(gold, answer_text: str) -> str:
    if _is_relation(gold):
        return "relation"
    if _is_set(gold) or lists_values(answer_text):
        return "many"
    return "value"


def _is_relation(x) -> bool:
    from sympy.core.relational import Relational

    return isinstance(x, Relational)


def _is_set(x) -> bool:
    from sympy import Set, Tuple

    return isinstance(x, (Set, Tuple, list, tuple))


def _relation_or_set(x) -> bool:
    return _is_relation(x) or _is_set(x)


def _quiet_math_verify() -> None:
    # math-verify warns once when its own timeout is off; ours (worker SIGALRM + kill) replaces it
    for n in ("math_verify.parser", "math_verify.grader"):
        logging.getLogger(n).setLevel(logging.ERROR)


class Countdown(Verifier):
    """Countdown: the expression must use the given numbers (each at most once; `require_all`: exactly once),
    only `+ - * /` and parentheses, and equal the target exactly (rational arithmetic, `countdown_expr`).

    The expression is the `<answer>...</answer>` content (several different non-empty ones: each must be right),
    else the last line with a digit. `$`, `\\(`
    `\\)`, `\\[` `\\]` and a trailing `.` are dropped; with `=` the first side holding an operator is the
    expression (`3*5+7 = 22` and `22 = 3*5+7` both read `3*5+7`), and every other side must be a valid
    expression of the same value (`3*5+7 = 23` scores 0: a false equation). The reference is the JSON string
    `{"nums": [...], "target": N}` (`countdown_expr.encode_countdown`). An invalid expression scores 0
    without `error` (error is for verifier faults).
    """

    name = "countdown"

    def __init__(self, require_all: bool = False, max_chars: int = DEFAULT_MAX_CHARS):
        self.require_all, self.max_chars = bool(require_all), int(max_chars)

    def spans(self, completion: str) -> list[str]:
        """The final-answer spans: every non-empty `<answer>` content, else the last line holding a digit."""
        tail = _tail(completion, self.max_chars)
        kind, spans = marked_spans(tail, ("answer",))
        if kind is not None:
            return spans
        line = line_with(tail, DIGIT, last=True)
        return [] if line is None else [line]

    def extract(self, completion: str) -> str | None:
        spans = self.spans(completion)
        sides = self._sides(spans[-1]) if spans else None
        return None if sides is None else sides[0]

    @staticmethod
    def _sides(text: str) -> list[str] | None:
        """The expression, then the other sides of its equation (if any)."""
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
        spans = distinct(self.spans(completion))
        # several different answers: each must be right (a hedge across <answer> tags scores 0)
        ok = 0 < len(spans) <= MAX_CANDIDATES and all(self._hits(t, nums, target) for t in spans)
        return RIGHT if ok else WRONG

    def _hits(self, text: str, nums: list[int], target: int) -> bool:
        sides = self._sides(text)
        if sides is None:
            return False
        try:
            ev = evaluate(sides[0])
            # The other sides must hold too: '3*5+7 = 23' (or '= 3*5+8') states a false equation and scored 1
            # when only the first side was read. Each is a checked expression (<= 512 chars), so this stays cheap.
            if any(evaluate(p).value != ev.value for p in sides[1:]):
                return False
        except ExprError:
            return False
        return uses_numbers(ev.numbers, nums, require_all=self.require_all) and ev.value == target


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
            raise ValueError(
                "verifier.name=weighted needs verifier.components, e.g. [{name: countdown, weight: 1.0}, {name: format, weight: 0.1}]"
            )
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
    if name in REGISTERED:  # defined in another module (gym_verifier.py), registered on import of rlcompare.rewards
        return REGISTERED[name](d)
    if name == "weighted":
        if where != "verifier":
            raise ValueError(f"{where}.name=weighted: weighted verifiers cannot nest")
        comps = d.get("components")
        if not isinstance(comps, (list, tuple)) or not comps:
            raise ValueError(
                f"{where}.name=weighted needs {where}.components, a non-empty list like "
                "[{name: countdown, weight: 1.0}, {name: format, weight: 0.1}]"
            )
        base = {k: v for k, v in d.items() if k not in ("name", "components")}
        parts = []
        for i, c in enumerate(comps):
            key = f"{where}.components[{i}]"
            if not isinstance(c, dict) or "name" not in c:
                raise ValueError(
                    f"{key} must be a mapping with a name and a weight, e.g. {{name: format, weight: 0.1}}; got {c!r}"
                )
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
    v.workers = _workers_setting(d.get("workers"))
    v.batch_timeout_s = _seconds_setting(
        "verifier.batch_timeout_s", _opt(d, "batch_timeout_s", DEFAULT_BATCH_TIMEOUT_S)
    )
    return v


def _workers_setting(workers: Any) -> int | None:
    if workers is None:
        return None
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise ValueError(
            f"verifier.workers={workers!r} is not accepted; use an integer >= 1, or null for "
            f"min({_MAX_DEFAULT_WORKERS}, usable CPU cores)"
        )
    return workers


def _seconds_setting(key: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise ValueError(
            f"{key}={value!r} is not accepted; use a finite number of seconds > 0 "
            f"(values under {MIN_TIMEOUT_S} count as {MIN_TIMEOUT_S})"
        )
    return float(value)


# ----------------------------------------------------------------------------- bounded batch scoring
_IN_WORKER = False
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


def _worker_ready(conn):
    """Receive the verifier, warm it, cap the address space, report ready; None when the parent is gone."""
    try:
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
    """[i, reward, correct, error, reason] for item i, with a finite reward: what _score_in_worker returns."""
    return (
        isinstance(msg, list)
        and len(msg) == 5
        and msg[0] == i
        and type(msg[1]) in (int, float)
        and math.isfinite(msg[1])
        and isinstance(msg[2], bool)
        and isinstance(msg[3], bool)
        and isinstance(msg[4], str)
    )


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
        if math.isfinite(r):
            return (i, r, bool(s.correct), bool(s.error), str(s.reason or ("raised" if s.error else "")))
        return (i, 0.0, False, True, "raised")
    except _ItemTimeout:
        return (i, 0.0, False, True, "timeout")
    except BaseException:  # MemoryError, RecursionError, anything
        return (i, 0.0, False, True, "raised")


class _Worker:
    """One worker: `python -c ...` (a fresh interpreter: no fork of a threaded/CUDA parent, no re-import of
    the caller's __main__), over a socketpair: the parent's messages pickled (multiprocessing's framing), the
    worker's replies JSON (`_reply`, `_read_reply`)."""

    def __init__(self, verifier_blob: bytes):
        import socket
        import subprocess
        import sys
        from multiprocessing.connection import Connection

        here, theirs = socket.socketpair()
        root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # above rlcompare/rewards/
        env = dict(os.environ)
        env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
        code = "import sys; from rlcompare.rewards.verifiers import _worker_entry; _worker_entry(int(sys.argv[1]))"
        try:
            self.proc = subprocess.Popen(
                [sys.executable, "-c", code, str(theirs.fileno())],
                pass_fds=(theirs.fileno(),),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                env=env,
            )
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
                w = self.workers[k] = _Worker(self.blob)
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
                results[i] = Score(float(msg[1]), msg[2], msg[3], msg[4]) if ok else WORKER_LOST
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
            r = float(s.reward)
            out.append(s if math.isfinite(r) else ERROR)
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
