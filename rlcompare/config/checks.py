"""What every section's check says when a setting cannot work: `ConfigError`, the two commonest checks (`one_of`,
`at_least`) and `Range`, the accepted span of a number, with the spans the sections share.

Kept apart from schema.py so that the sections (rlcompare/config/sections/) and the run-level schema speak one
language without importing each other."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any


class ConfigError(ValueError):
    """A setting that cannot work; the message names the key and what it accepts."""


def one_of(key: str, value: Any, accepted) -> None:
    if value not in accepted:
        raise ConfigError(f"{key}={value!r} is not accepted; use one of: {', '.join(map(str, accepted))}")


def at_least(key: str, value, low, fix: str = "") -> None:
    if value is None or value < low:
        raise ConfigError(f"{key}={value!r} must be >= {low}" + (f"; {fix}" if fix else ""))


@dataclass(frozen=True)
class Range:
    low: float
    high: float = math.inf
    low_open: bool = False  # low itself is refused
    high_open: bool = False

    def holds(self, v) -> bool:
        above = v > self.low if self.low_open else v >= self.low
        below = v < self.high if self.high_open else v <= self.high
        return above and below

    def __str__(self) -> str:
        if self.high == math.inf:
            return f"{'>' if self.low_open else '>='} {_num(self.low)}"
        return f"in {'(' if self.low_open else '['}{_num(self.low)}, {_num(self.high)}{')' if self.high_open else ']'}"


def _num(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else str(x)


# Seeds (seed, prompts.data_seed, model.warm_start.seed, a sweep's seeds) are 0..SEED_MAX: torch and numpy keep 32
# bits of a seed (seed 2^32 ran as seed 0, so a sweep counted one run twice), and a run also seeds with seed + 1
SEED_MAX = 2**31 - 1
SEED = Range(0, SEED_MAX)
MAX_LR = 1.0  # an AdamW step larger than the weights themselves: past it a run only diverges
NON_NEGATIVE = Range(0)  # every numeric key not in RANGES: counts, sizes, coefficients, seeds (a negative seed
# collides with its absolute value in Python's random.Random)
AT_LEAST_ONE = Range(1)
POSITIVE = Range(0, low_open=True)
PROBABILITY = Range(0, 1)
FRACTION = Range(0, 1, high_open=True)
