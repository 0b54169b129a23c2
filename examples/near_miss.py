"""A new verifier in one file (docs/api.md, "Adding a verifier (worked example)"): `verifier=near_miss`.

reward 1 for the exact answer, `partial` (a knob in [0, 1], default 0.5) for one off by one, else 0; `correct` only
for the exact one. It reports one metric, `off_by_one` (1 for a near miss, else 0): the row's verifier/off_by_one is
the share of the step's completions that earned the partial reward. The answer is read like exact_match's (docs/verifiers.md: `<answer>`, else `\\boxed{}`, else
`####`, else the first line holding a digit; it must state one number).

    rlcompare train verifier=near_miss verifier.partial=0.25     # conf/verifier/near_miss.yaml names this module

Importing this file registers it; a run's config check imports `verifier.module` (examples.near_miss) first. It
imports no torch (the config check runs before torch loads), and it is cheap (`bounded`), so it scores inline; with
`verifier.isolation=process` the scoring workers import it by themselves.
"""

from dataclasses import dataclass
from fractions import Fraction

from rlcompare.rewards.answers import distinct, stated_value
from rlcompare.rewards.pool import Score
from rlcompare.rewards.registry import knob, register_verifier
from rlcompare.rewards.text import DEFAULT_MAX_CHARS, normalize_number
from rlcompare.rewards.verifiers import ExactMatch, Verifier


@dataclass(frozen=True)
class NearMissSettings:
    partial: float = knob(0.5, "reward for an answer one off the reference, in [0, 1]")
    max_chars: int = DEFAULT_MAX_CHARS  # a run key (every verifier's): listed here, it reaches the constructor

    def check(self, where: str = "verifier") -> None:  # run by the config check, before torch loads
        if not 0.0 <= self.partial <= 1.0:
            raise ValueError(f"{where}.partial={self.partial!r} is not accepted; use a reward in [0, 1]")


@register_verifier("near_miss", settings=NearMissSettings, metrics=("off_by_one",))
class NearMiss(Verifier):
    bounded = True  # cheap by construction: scored inline, no worker process

    def __init__(self, partial: float = 0.5, max_chars: int = DEFAULT_MAX_CHARS):
        NearMissSettings(partial, max_chars).check()
        self.partial, self.max_chars = float(partial), int(max_chars)
        self.reader = ExactMatch(max_chars=self.max_chars)  # the final-answer rule of exact_match

    def score(self, completion: str, answer: str) -> Score:
        ref = normalize_number(str(answer))
        _, spans = self.reader.spans(completion)
        values = {stated_value(s) for s in distinct(spans)}
        if ref is None or len(values) != 1 or None in values:  # no number, or several different ones: 0
            return Score(0.0, False, metrics={"off_by_one": 0.0})
        off = abs(values.pop() - Fraction(ref))
        near = off == 1
        return Score(1.0 if off == 0 else self.partial if near else 0.0, off == 0, metrics={"off_by_one": float(near)})
