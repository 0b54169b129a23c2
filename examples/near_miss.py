"""A new verifier in one file (docs/api.md, "Adding a verifier (worked example)"): `verifier=near_miss`.

reward 1 for the exact answer, `partial` (a knob in [0, 1], default 0.5) for one off by one, else 0; `correct` only
for the exact one. The answer is read like exact_match's (docs/verifiers.md: `<answer>`, else `\\boxed{}`, else
`####`, else the first line holding a digit; it must state one number).

    rlcompare train verifier=near_miss verifier.partial=0.25     # conf/verifier/near_miss.yaml names this module

Importing this file registers it; a run's config check imports `verifier.module` (examples.near_miss) first. It
imports no torch (the config check runs before torch loads), and it is cheap (`bounded`), so it scores inline; with
`verifier.isolation=process` the scoring workers import it by themselves.
"""

from fractions import Fraction

from rlcompare.rewards.answers import distinct, stated_value
from rlcompare.rewards.pool import Score
from rlcompare.rewards.registry import register_verifier
from rlcompare.rewards.text import DEFAULT_MAX_CHARS, normalize_number
from rlcompare.rewards.verifiers import ExactMatch, Verifier


@register_verifier("near_miss", settings={"partial": 0.5, "max_chars": DEFAULT_MAX_CHARS})
class NearMiss(Verifier):
    bounded = True  # cheap by construction: scored inline, no worker process

    def __init__(self, partial: float = 0.5, max_chars: int = DEFAULT_MAX_CHARS):
        if not 0.0 <= float(partial) <= 1.0:
            raise ValueError(f"verifier.partial={partial!r} is not accepted; use a reward in [0, 1]")
        self.partial, self.max_chars = float(partial), int(max_chars)
        self.reader = ExactMatch(max_chars=self.max_chars)  # the final-answer rule of exact_match

    def score(self, completion: str, answer: str) -> Score:
        ref = normalize_number(str(answer))
        _, spans = self.reader.spans(completion)
        values = {stated_value(s) for s in distinct(spans)}
        if ref is None or len(values) != 1 or None in values:  # no number, or several different ones: 0
            return Score(0.0, False)
        off = abs(values.pop() - Fraction(ref))
        if off == 0:
            return Score(1.0, True)
        return Score(self.partial if off == 1 else 0.0, False)
