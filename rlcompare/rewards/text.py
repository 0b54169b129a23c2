"""Text helpers the verifiers share: a reference read as a plain number, the tail of a completion they look at.

Which span of a completion is its final answer, and the one value it states, is `answers.py` (docs/verifiers.md);
this module reads a reference and cuts inputs. Standard library only.
"""

from __future__ import annotations

import re

from rlcompare.rewards.answers import normalize_signs

DEFAULT_MAX_CHARS = 10_000  # verifier.max_chars: completions are cut to this many characters before parsing

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


def tail(text: str, n: int) -> str:
    """The last n characters (markers, math-verify and format look there)."""
    return text[-n:] if len(text) > n else text
