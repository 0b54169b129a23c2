"""A small, safe arithmetic parser for Countdown answers. Model output is untrusted input.

Nothing here calls eval/exec. The grammar is tiny and evaluated with exact rationals
(`fractions.Fraction`):

    expr   := term   (('+' | '-') term)*
    term   := factor (('*' | '/') factor)*
    factor := INTEGER | '(' expr ')'

Accepted symbols: ASCII digits, `+ - * /`, parentheses and spaces; `×`, `·`, `∗`, `\\times`, `\\cdot`
read as `*`, `÷`, `\\div` as `/`, and `−` (U+2212), `–` (en dash) as `-`. Everything else is refused:
unary minus/plus, `**` (power), decimals, unicode digits (`١٢٣`, `１２３`), names, calls.

Hard limits keep every evaluation cheap: at most `max_len` characters (512), parenthesis depth
`max_depth` (32), integer literals up to `max_literal` (10**6), and every intermediate result's
numerator and denominator up to `max_abs` (10**12). Division by zero is an `ExprError`, like every
other refusal; callers catch `ExprError` (a `ValueError`) and nothing else escapes.

Countdown references travel as a JSON string: `encode_countdown([3, 5, 7], 22)` ->
`'{"nums": [3, 5, 7], "target": 22}'`; `decode_countdown` reads it back.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass
from fractions import Fraction

MAX_LEN = 512
MAX_DEPTH = 32
MAX_LITERAL = 10**6
MAX_ABS = 10**12

_ALIASES = (
    ("\\times", "*"), ("\\cdot", "*"), ("\\div", "/"),
    ("×", "*"), ("·", "*"), ("∗", "*"), ("⋅", "*"), ("÷", "/"), ("−", "-"), ("–", "-"),
)
_OPS = "+-*/()"


class ExprError(ValueError):
    """The text is not a valid Countdown expression (or breaks a limit)."""


@dataclass(frozen=True)
class Evaluation:
    value: Fraction
    numbers: tuple[int, ...]  # integer literals in the order they appear


def normalize(text: str) -> str:
    for a, b in _ALIASES:
        text = text.replace(a, b)
    return text


def tokenize(text: str, *, max_len: int = MAX_LEN, max_literal: int = MAX_LITERAL) -> list[str | int]:
    """Integers and single-character operators; raises ExprError on anything else."""
    if len(text) > max_len:
        raise ExprError(f"expression longer than {max_len} characters")
    text = normalize(text)
    out: list[str | int] = []
    i, n = 0, len(text)
    while i < n:
        ch = text[i]
        if ch in " \t\r\n":
            i += 1
        elif "0" <= ch <= "9":
            j = i
            while j < n and "0" <= text[j] <= "9":
                j += 1
            if j - i > 7:  # longer than any literal we accept; do not even build the int
                raise ExprError(f"number literal larger than {max_literal}")
            v = int(text[i:j])
            if v > max_literal:
                raise ExprError(f"number literal {v} larger than {max_literal}")
            if j < n and text[j] == ".":
                raise ExprError("decimal numbers are not allowed")
            out.append(v)
            i = j
        elif ch in _OPS:
            if ch == "*" and i + 1 < n and text[i + 1] == "*":
                raise ExprError("'**' (power) is not allowed")
            out.append(ch)
            i += 1
        else:
            raise ExprError(f"character {ch!r} is not allowed")
    if not out:
        raise ExprError("empty expression")
    return out


class _Parser:
    def __init__(self, tokens, max_depth: int, max_abs: int):
        self.toks, self.pos, self.depth = tokens, 0, 0
        self.max_depth, self.max_abs = max_depth, max_abs
        self.numbers: list[int] = []

    def peek(self):
        return self.toks[self.pos] if self.pos < len(self.toks) else None

    def take(self):
        t = self.peek()
        self.pos += 1
        return t

    def check(self, v: Fraction) -> Fraction:
        if abs(v.numerator) > self.max_abs or v.denominator > self.max_abs:
            raise ExprError(f"intermediate result beyond {self.max_abs}")
        return v

    def expr(self) -> Fraction:
        v = self.term()
        while self.peek() in ("+", "-"):
            op = self.take()
            r = self.term()
            v = self.check(v + r if op == "+" else v - r)
        return v

    def term(self) -> Fraction:
        v = self.factor()
        while self.peek() in ("*", "/"):
            op = self.take()
            r = self.factor()
            if op == "*":
                v = self.check(v * r)
            else:
                if r == 0:
                    raise ExprError("division by zero")
                v = self.check(v / r)
        return v

    def factor(self) -> Fraction:
        t = self.take()
        if isinstance(t, int):
            self.numbers.append(t)
            return Fraction(t)
        if t == "(":
            self.depth += 1
            if self.depth > self.max_depth:
                raise ExprError(f"parentheses nested deeper than {self.max_depth}")
            v = self.expr()
            if self.take() != ")":
                raise ExprError("unbalanced parentheses")
            self.depth -= 1
            return v
        if t is None:
            raise ExprError("expression ends early")
        if t in ("+", "-"):
            raise ExprError("unary plus/minus is not allowed")
        raise ExprError(f"unexpected {t!r}")


def evaluate(text: str, *, max_len: int = MAX_LEN, max_depth: int = MAX_DEPTH,
             max_literal: int = MAX_LITERAL, max_abs: int = MAX_ABS) -> Evaluation:
    """Exact value of `text` and the integer literals it uses; ExprError when invalid."""
    if not isinstance(text, str):
        raise ExprError("expression must be a string")
    p = _Parser(tokenize(text, max_len=max_len, max_literal=max_literal), max_depth, max_abs)
    v = p.expr()
    if p.pos != len(p.toks):
        raise ExprError(f"unexpected {p.toks[p.pos]!r} after the expression")
    return Evaluation(v, tuple(p.numbers))


def uses_numbers(used, nums, *, require_all: bool = False) -> bool:
    """Each given number used at most once (require_all: exactly once), counting duplicates."""
    have, want = Counter(used), Counter(nums)
    if any(have[k] > want[k] for k in have):
        return False
    return have == want if require_all else True


def encode_countdown(nums, target) -> str:
    return json.dumps({"nums": [int(n) for n in nums], "target": int(target)})


def decode_countdown(answer) -> tuple[list[int], int]:
    """The reference `{"nums": [...], "target": N}` (JSON string or dict) -> (nums, target)."""
    d = json.loads(answer) if isinstance(answer, str) else answer
    if not isinstance(d, dict) or "nums" not in d or "target" not in d:
        raise ValueError(f"countdown reference must be JSON {{\"nums\": [...], \"target\": N}}, got {str(answer)[:80]!r}")
    nums, target = d["nums"], d["target"]
    if not isinstance(nums, list) or not all(isinstance(n, int) and not isinstance(n, bool) for n in nums):
        raise ValueError(f"countdown reference 'nums' must be a list of integers, got {nums!r}"[:200])
    if not isinstance(target, int) or isinstance(target, bool):
        raise ValueError(f"countdown reference 'target' must be an integer, got {target!r}"[:200])
    return nums, target
