"""Coverage of the report's intervals, measured by simulation (pure numpy, no I/O).

The report prints four kinds of interval (``rlcompare.report.stats``): a mean (Student t: every per-variant
column), an IQM (Tukey-McLaughlin), a difference of means (Welch) and a probability of improvement
(Newcombe Method 5 with a continuity correction). Each is computed here on many simulated seed sets
whose true value is known, by the same batched functions the report's ``mean_ci`` & co. call, and
the share of intervals that contain the truth is the coverage.

Seed scores are drawn from shapes like ours (held-out accuracies near 0 or 1, skewed, bounded, on a
grid of 1/200, now and then an outlier seed) and from the normal. ``FLOORS`` are what the coverage
must reach at nominal 95% (tests/report/test_stats_coverage.py); ``LIMITS`` are shapes no interval from a
handful of seeds can cover, kept to say where the intervals stop holding (scripts/coverage.py).
True values of the skewed shapes come from one large fixed-seed sample (Monte Carlo error ~1e-3 of a
seed's spread).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterator

import numpy as np

from . import stats

NOMINAL = 0.95
SEED_COUNTS = (3, 5, 10)
IQM_SEED_COUNTS = (4, 5, 10)  # the report shows an IQM from 4 seeds (below 4 it is the mean)
FLOORS = {"normal": 0.93, "skewed": 0.90}
TRUTH_DRAWS = 500_000
EVAL_ITEMS = 200  # the default prompt set's n_eval: accuracies are multiples of 1/200

Draw = Callable[[np.random.Generator, tuple], np.ndarray]


@dataclass(frozen=True)
class Shape:
    """A distribution of one seed's score; ``family`` picks the floor ('normal' or 'skewed')."""

    name: str
    family: str
    draw: Draw


def _beta_mean_sd(mean: float, sd: float) -> tuple[float, float]:
    k = mean * (1 - mean) / sd**2 - 1
    return mean * k, (1 - mean) * k


def normal(mean: float = 0.0, sd: float = 1.0) -> Draw:
    return lambda rng, size: rng.normal(mean, sd, size)


def beta(mean: float, sd: float) -> Draw:
    a, b = _beta_mean_sd(mean, sd)
    return lambda rng, size: rng.beta(a, b, size)


def clipped_normal(mean: float, sd: float) -> Draw:
    """A normal clipped into [0, 1]: a point mass at the bound (ties), e.g. seeds at accuracy 1.0."""
    return lambda rng, size: np.clip(rng.normal(mean, sd, size), 0.0, 1.0)


def eval_accuracy(mean: float, sd: float, items: int = EVAL_ITEMS) -> Draw:
    """Accuracy on a fixed set of ``items``: the seed's skill ~ Beta(mean, sd), then k / items correct."""
    a, b = _beta_mean_sd(mean, sd)
    return lambda rng, size: rng.binomial(items, rng.beta(a, b, size)) / items


def with_outliers(base: Draw, rate: float, shift: float) -> Draw:
    """Now and then (``rate``) a seed lands ``shift`` away from where it would have (a run that went wrong)."""

    def draw(rng, size):
        x = base(rng, size)
        return np.where(rng.random(size) < rate, x + shift, x)

    return draw


SHAPES = (
    Shape("normal", "normal", normal()),
    Shape("beta near 0.9", "skewed", beta(0.90, 0.04)),
    Shape("beta near 0.05", "skewed", beta(0.05, 0.03)),
    Shape("clipped normal at 1 (23% of seeds at 1.0)", "skewed", clipped_normal(0.97, 0.04)),
    Shape("clipped normal at 0 (23% of seeds at 0.0)", "skewed", clipped_normal(0.03, 0.04)),
    Shape("accuracy k/200 near 0.9", "skewed", eval_accuracy(0.90, 0.02)),
    Shape("accuracy k/200 near 0.05", "skewed", eval_accuracy(0.05, 0.015)),
    Shape("beta near 0.85, 1 seed in 10 lower by 4 sd", "skewed", with_outliers(beta(0.85, 0.03), 0.10, -0.12)),
)

# (variant, reference): the difference and the probability of improvement are measured on pairs;
# a variant drawn like its reference ("no difference") has difference 0 and P(improvement) 0.5 exactly
PAIRS = (
    (Shape("normal, no difference", "normal", SHAPES[0].draw), SHAPES[0]),
    (Shape("normal, +1 sd", "normal", normal(1.0)), SHAPES[0]),
    (Shape("normal, +3 sd", "normal", normal(3.0)), SHAPES[0]),
    (Shape("normal, +1 sd with 3x the spread", "normal", normal(1.0, 3.0)), SHAPES[0]),
    (Shape("beta near 0.9, no difference", "skewed", SHAPES[1].draw), SHAPES[1]),
    (Shape("beta near 0.9, +0.03", "skewed", beta(0.93, 0.03)), SHAPES[1]),
    (Shape("beta near 0.05, +0.03", "skewed", beta(0.08, 0.03)), SHAPES[2]),
    (Shape("clipped at 1, no difference", "skewed", SHAPES[3].draw), SHAPES[3]),
    (Shape("clipped at 1, +0.02", "skewed", clipped_normal(0.99, 0.03)), SHAPES[3]),
    (Shape("clipped at 0, +0.02", "skewed", clipped_normal(0.05, 0.04)), SHAPES[4]),
    (Shape("k/200 near 0.9, no difference", "skewed", SHAPES[5].draw), SHAPES[5]),
    (Shape("k/200 near 0.9, +0.02", "skewed", eval_accuracy(0.92, 0.02)), SHAPES[5]),
    (Shape("k/200 near 0.05, +0.02", "skewed", eval_accuracy(0.07, 0.015)), SHAPES[6]),
    (Shape("outliers, no difference", "skewed", SHAPES[7].draw), SHAPES[7]),
    (Shape("outliers, +0.03", "skewed", with_outliers(beta(0.88, 0.03), 0.10, -0.12)), SHAPES[7]),
)

# where the intervals stop holding. A rare gross outlier moves the mean by rate x shift, and with no
# outlier among the seeds (0.95^10 = 60% of the time at 10) nothing in the data says so; the IQM's
# interval still covers the IQM. Seeds piled on a bound (a third or more at accuracy 0 or 1; a small eval
# set near 1) are often all equal, and all-equal seeds give a zero-width interval at the bound.
LIMITS = (
    Shape("beta near 0.85, 1 seed in 20 lower by 15 sd", "skewed", with_outliers(beta(0.85, 0.03), 0.05, -0.45)),
    Shape("clipped normal at 0 (31% of seeds at 0.0)", "skewed", clipped_normal(0.02, 0.04)),
    Shape("accuracy k/32 near 0.98 (seeds often all at 1.0)", "skewed", eval_accuracy(0.98, 0.01, items=32)),
)


@dataclass(frozen=True)
class Cell:
    """One measured coverage: interval kind x shape x seeds."""

    interval: str
    shape: str
    family: str
    seeds: int
    trials: int
    coverage: float
    mean_width: float

    @property
    def floor(self) -> float:
        return FLOORS[self.family]


def _truth_sample(shape: Shape, seed: int) -> np.ndarray:
    return shape.draw(np.random.default_rng(seed), (TRUTH_DRAWS,))


def population_iqm(sample: np.ndarray) -> float:
    """The IQM's target: the mean of the middle half of the distribution (25% trimmed mean)."""
    s = np.sort(sample)
    return float(s[s.size // 4 : s.size - s.size // 4].mean())


def population_poi(variant: np.ndarray, reference: np.ndarray) -> float:
    """P(X > Y) + 0.5 P(X = Y) from paired independent draws."""
    return float(np.mean((variant > reference) + 0.5 * (variant == reference)))


def _covered(interval: stats.Interval, truth: float) -> tuple[float, float]:
    # a bound equal to the truth up to rounding counts as covering it (zero-width intervals at a tie)
    tol = 1e-12 * max(1.0, abs(truth))
    inside = (interval.low <= truth + tol) & (truth - tol <= interval.high)
    return float(np.mean(inside)), float(np.mean(interval.high - interval.low))


def _rng(*keys: int) -> np.random.Generator:
    return np.random.default_rng(list(keys))


def one_sample_cells(shapes=SHAPES, trials: int = 2000, seed: int = 0) -> Iterator[Cell]:
    """Coverage of the mean's and the IQM's intervals for each shape."""
    for i, shape in enumerate(shapes):
        sample = _truth_sample(shape, seed + 1000 + i)
        truth = {"mean (Student t)": float(sample.mean()), "IQM (Tukey-McLaughlin)": population_iqm(sample)}
        for name, counts, method in (
            ("mean (Student t)", SEED_COUNTS, stats.mean_intervals),
            ("IQM (Tukey-McLaughlin)", IQM_SEED_COUNTS, stats.iqm_intervals),
        ):
            for n in counts:
                x = shape.draw(_rng(seed, i, n), (trials, n))
                coverage, width = _covered(method(x), truth[name])
                yield Cell(name, shape.name, shape.family, n, trials, coverage, width)


def two_sample_cells(pairs=PAIRS, trials: int = 2000, seed: int = 0) -> Iterator[Cell]:
    """Coverage of the difference's (Welch) and the probability of improvement's intervals per pair."""
    for i, (variant, reference) in enumerate(pairs):
        if variant.draw is reference.draw:
            difference, poi = 0.0, 0.5
        else:
            va, ref = _truth_sample(variant, seed + 2000 + i), _truth_sample(reference, seed + 3000 + i)
            difference, poi = float(va.mean() - ref.mean()), population_poi(va, ref)
        for n in SEED_COUNTS:
            rng = _rng(seed, 100 + i, n)
            a, b = variant.draw(rng, (trials, n)), reference.draw(rng, (trials, n))
            for name, interval, truth in (
                ("difference of means (Welch)", stats.welch_intervals(a, b), difference),
                ("P(improvement) (Newcombe)", stats.poi_intervals(a, b), poi),
            ):
                coverage, width = _covered(interval, truth)
                yield Cell(name, variant.name, variant.family, n, trials, coverage, width)


def all_cells(trials: int = 2000, seed: int = 0) -> list[Cell]:
    return [*one_sample_cells(trials=trials, seed=seed), *two_sample_cells(trials=trials, seed=seed)]
