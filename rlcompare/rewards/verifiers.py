"""The built-in verifiers: score a completion against a reference answer. Model output is untrusted input.

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

Each is declared once, with its settings, by `@register_verifier` (`registry.py`: the builder and the config check
read it); `reasoning_gym` lives in `gym_verifier.py`. Which span is the final answer, and what it must state, is
one rule for every verifier that reads an answer (docs/verifiers.md, `answers.py`): the `<answer>` content, else
`\\boxed{}`, else (exact_match) `####`, else one line; it must state ONE value: `122 or 123`, `\\boxed{124=123}`,
`between 122 and 123`, `123/0` score 0, and `-(123)`, `−123`, `- 123` are -123. `format` checks the form only;
`weighted`'s `correct` is its first component's.

Nothing is passed to eval/exec. Inputs are cut before parsing (`max_chars`, default 10_000): markers
(`<answer>`, `\\boxed{}`, `####`), math-verify and format look at the LAST `max_chars` characters;
exact_match's unmarked first line is looked for in the FIRST `max_chars`. Batches are scored under time and
memory limits by `pool.score_batch` (worker processes for the verifiers not `bounded` by construction).

This module also re-exports the names that lived here before the split (#54): `Score`, `score_batch`,
`error_counts` and the pool's internals (`pool.py`), `normalize_number` (`text.py`), `build_verifier`
(`registry.py`), the answer helpers (`answers.py`).
"""

from __future__ import annotations

import logging
import math
import re
import signal
import threading
import time
from dataclasses import dataclass
from fractions import Fraction
from typing import Optional

from rlcompare.rewards import pool, registry, text
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
from rlcompare.rewards.pool import (  # noqa: F401 - re-exported: the documented path of Score, score_batch, ...
    BATCH_TIMEOUT,
    DEFAULT_BATCH_TIMEOUT_S,
    ERROR,
    ERROR_REASONS,
    MIN_TIMEOUT_S,
    NO_WORKER,
    RIGHT,
    TIMEOUT,
    WORKER_LOST,
    WRONG,
    Score,
    error_counts,
    score_batch,
)
from rlcompare.rewards.registry import REGISTRY, build_verifier, knob, register_verifier  # noqa: F401 - re-exported
from rlcompare.rewards.text import DEFAULT_MAX_CHARS, normalize_number, tail as _tail  # noqa: F401 - re-exported

REGISTERED = REGISTRY  # the former name of the registry (name -> VerifierSpec)


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


NUMBER_LINES = ("first", "last")  # exact_match's `number`: which unmarked line holding a digit is the answer


@dataclass(frozen=True)
class ExactMatchSettings:
    number: str = knob("first", "without <answer>/\\boxed{}/#### markers: the first | last line holding a digit")
    max_chars: int = DEFAULT_MAX_CHARS

    def check(self, where: str = "verifier") -> None:
        if self.number not in NUMBER_LINES:
            raise ValueError(f"{where}.number={self.number!r} is not accepted; use one of: {', '.join(NUMBER_LINES)}")


@register_verifier("exact_match", settings=ExactMatchSettings)
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
        ExactMatchSettings(number, max_chars).check()
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


@dataclass(frozen=True)
class MathVerifySettings:
    """Run keys only (RUN_KEYS): they reach the constructor; the help is the schema's."""

    max_chars: int = DEFAULT_MAX_CHARS
    timeout_s: Optional[float] = 5.0

    def check(self, where: str = "verifier") -> None:
        pass


@register_verifier("math_verify", settings=MathVerifySettings)
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

        _quiet_math_verify()
        verify(parse("$1$"), parse("$1$"), timeout_seconds=None)

    def _own_timeout(self) -> float | None:
        if (
            pool.in_worker()
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
        t = self._own_timeout()
        if t is None:
            return self._score(completion, answer)

        def on_alarm(signum, frame):
            raise pool._ItemTimeout()

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
        except pool._ItemTimeout:
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


@dataclass(frozen=True)
class CountdownSettings:
    require_all: bool = knob(False, "every given number must be used (TinyZero); false = each at most once")
    max_chars: int = DEFAULT_MAX_CHARS

    def check(self, where: str = "verifier") -> None:
        pass  # a bool (the registry checks each value's type against its default's)


@register_verifier("countdown", settings=CountdownSettings)
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


@dataclass(frozen=True)
class FormatSettings:
    pattern: Optional[str] = knob(
        None, "regex searched in the completion; null = R1 <think>..</think><answer>..</answer>"
    )
    max_chars: int = DEFAULT_MAX_CHARS

    def check(self, where: str = "verifier") -> None:
        try:
            re.compile(self.pattern or R1_FORMAT, re.S)
        except re.error as e:
            raise ValueError(f"{where}.pattern={self.pattern!r} is not a valid regex: {e}") from None


@register_verifier("format", settings=FormatSettings)
class FormatCheck(Verifier):
    """Reward 1 when `pattern` is found (re.search, DOTALL) in the last `max_chars` characters, else 0."""

    name = "format"

    def __init__(self, pattern: str | None = None, max_chars: int = DEFAULT_MAX_CHARS):
        self.pattern = pattern or R1_FORMAT
        self.bounded = pattern is None or pattern == R1_FORMAT  # a custom regex may backtrack: run it in a worker
        self.max_chars = int(max_chars)
        FormatSettings(pattern, max_chars).check()

    def score(self, completion: str, answer: str = "") -> Score:
        ok = re.search(self.pattern, _tail(completion, self.max_chars), re.S) is not None
        return Score(1.0 if ok else 0.0, ok)


@dataclass(frozen=True)
class WeightedSettings:
    components: Optional[list] = knob(None, "list of {name, weight, ...}; the first one's `correct` is reported")

    def check(self, where: str = "verifier") -> None:
        _components({"components": self.components}, where)


@register_verifier(
    "weighted",
    settings=WeightedSettings,
    metrics=lambda d: _component_metrics(d),
    build=lambda d, where: _build_weighted(d, where),
    accepts=lambda d: _component_settings(d),
)
class Weighted(Verifier):
    """reward = sum(weight_i * reward_i); correct = the first component's; error = any component's; the components'
    own rewards travel with it (`Score.components`, what the gdpo estimator reads) and are its metrics: each
    component's own reward (before its weight) as verifier/<component name>, and what a component reports as
    verifier/<component name>/<its metric> (a name two components share gets the component's index: format_1)."""

    name = "weighted"

    def __init__(self, components: list[tuple[Verifier, float]]):
        if not components:
            raise ValueError(
                "verifier.name=weighted needs verifier.components, e.g. [{name: countdown, weight: 1.0}, {name: format, weight: 0.1}]"
            )
        self.components = components
        self.labels = component_labels([getattr(v, "name", "verifier") for v, _ in components])
        self.bounded = all(v.bounded for v, _ in components)
        self.max_chars = max(getattr(v, "max_chars", DEFAULT_MAX_CHARS) for v, _ in components)

    def warm(self) -> None:
        for v, _ in self.components:
            if hasattr(v, "warm"):
                v.warm()

    def score(self, completion: str, answer: str) -> Score:
        scores = [v.score(completion, answer) for v, _ in self.components]
        reward = sum(w * s.reward for (_, w), s in zip(self.components, scores))
        parts = tuple(float(s.reward) for s in scores)  # each component's own reward: GDPO normalises each
        metrics = dict(zip(self.labels, parts))
        for label, s in zip(self.labels, scores):
            metrics.update({f"{label}/{k}": v for k, v in (s.metrics or {}).items()})
        return Score(float(reward), scores[0].correct, any(s.error for s in scores), components=parts, metrics=metrics)


def component_labels(names: list[str]) -> list[str]:
    """Each component's metric name: its verifier's name, with its index where two components share it."""
    return [n if names.count(n) == 1 else f"{n}_{i}" for i, n in enumerate(names)]


def _component_metrics(d: dict) -> tuple:
    """weighted's declared metrics (its config checked): each component's reward, then what each declares."""
    comps = [c for c in d.get("components") or () if isinstance(c, dict)]
    labels = component_labels([str(c.get("name")) for c in comps])
    out = list(labels)
    for label, c in zip(labels, comps):
        own = registry.spec(c.get("name"), "verifier.components", c.get("module")).metric_names(c)
        out += [f"{label}/{m}" for m in own]
    return tuple(out)


def _components(d: dict, where: str) -> list[dict]:
    """verifier.components, checked: a non-empty list of mappings with a known name, a finite weight and only the
    keys that component accepts."""
    if where != "verifier":
        raise ValueError(f"{where}.name=weighted: weighted verifiers cannot nest")
    comps = d.get("components")
    if not isinstance(comps, (list, tuple)) or not comps:
        raise ValueError(
            f"{where}.name=weighted needs {where}.components, a non-empty list like "
            "[{name: countdown, weight: 1.0}, {name: format, weight: 0.1}]"
        )
    for i, c in enumerate(comps):
        key = f"{where}.components[{i}]"
        if not isinstance(c, dict) or "name" not in c:
            raise ValueError(
                f"{key} must be a mapping with a name and a weight, e.g. {{name: format, weight: 0.1}}; got {c!r}"
            )
        w = c.get("weight", 1.0)
        if not isinstance(w, (int, float)) or isinstance(w, bool) or not math.isfinite(w):
            raise ValueError(f"{key}.weight={w!r} must be a finite number")
        s, own = registry.spec(c["name"], key), {k: v for k, v in c.items() if k != "weight"}
        registry.check_keys(s, own, key)
        s.check(s.settings_from(own), key)
    return list(comps)


def _component_settings(d: dict) -> set:
    """The keys a weighted mix passes down to its components: any component's settings."""
    out: set = set()
    for c in d.get("components") or ():
        s = registry.REGISTRY.get(c.get("name")) if isinstance(c, dict) else None
        if s is not None:
            out |= set(s.knobs())
    return out


def _build_weighted(d: dict, where: str) -> Weighted:
    """Each component built from the mix's settings it accepts, overridden by its own (weight aside)."""
    base = {k: v for k, v in d.items() if k not in ("name", "components")}
    parts = []
    for i, c in enumerate(_components(d, where)):
        s = registry.spec(c["name"], f"{where}.components[{i}]")
        ok = registry.accepted_keys(s, c)
        sub = {**{k: v for k, v in base.items() if k in ok}, **{k: v for k, v in c.items() if k != "weight"}}
        parts.append((registry.build_one(sub, f"{where}.components[{i}]"), float(c.get("weight", 1.0))))
    return Weighted(parts)


def __getattr__(name: str):
    """Names that lived here before the split (#54), read from their new homes when asked: the pool's internals
    (`_WorkerPool`, `_IN_WORKER`, `_worker_entry`, ...), the registry's (`_as_dict`), the accepted names."""
    if name == "VERIFIERS":
        return registry.names()
    if name in _REGISTRY_ALIASES:
        return getattr(registry, _REGISTRY_ALIASES[name])
    for home in (pool, text):
        if hasattr(home, name):
            return getattr(home, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


_REGISTRY_ALIASES = {
    "_build_one": "build_one",
    "_as_dict": "as_dict",
    "_opt": "opt",
    "_workers_setting": "workers_setting",
    "_seconds_setting": "seconds_setting",
}
