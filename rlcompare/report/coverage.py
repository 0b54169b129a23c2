"""Coverage of the report's intervals, measured by simulation (pure numpy, no I/O).

The report prints five kinds of interval (``rlcompare.report.stats``): a mean (Student t: every per-variant
column), an IQM (Tukey-McLaughlin), a difference of means (Welch; paired when the arms share their seeds) and
a probability of improvement (Newcombe Method 5 with a continuity correction). Each is computed here on many simulated seed sets
whose true value is known, by the same batched functions the report's ``mean_ci`` & co. call, and
the share of intervals that contain the truth is the coverage.

Seed scores are drawn from shapes like ours (held-out accuracies near 0 or 1, skewed, bounded, on a
grid of 1/200 or a coarse one, now and then an outlier seed, heavy tails, seeds that learned or collapsed)
and from the normal. A cell's floor (tests/report/test_stats_coverage.py) is the nominal 95% minus three
Monte Carlo standard errors of a share at 95% over its trials (0.015 at 2,000), minus the shape's documented
known shortfall (``Shape.shortfall``: 0 for the normal, the measured gap, rounded up, for a shape the
intervals do not fully cover, with the reason beside it). ``LIMITS`` are shapes no interval from a handful of
seeds can cover, kept to say where the intervals stop holding (scripts/coverage.py).

Paired cells (``PAIRED``) draw both arms of a seed from shared randomness (a seed effect common to both arms,
as the same warm start, data order and sampling streams give) and measure the paired t interval of the
per-seed differences; the truth is the mean difference.
True values of the skewed shapes come from one large fixed-seed sample (Monte Carlo error ~1e-3 of a
seed's spread).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterator, Optional

import numpy as np

from . import stats

NOMINAL = 0.95
SEED_COUNTS = (3, 5, 10)
IQM_SEED_COUNTS = (4, 5, 10)  # the report shows an IQM from 4 seeds (below 4 it is the mean)
MC_SIGMAS = 3.0  # a floor sits this many Monte Carlo standard errors below the nominal level
TRUTH_DRAWS = 500_000
EVAL_ITEMS = 200  # the default prompt set's n_eval: accuracies are multiples of 1/200

Draw = Callable[[np.random.Generator, tuple], np.ndarray]


@dataclass(frozen=True)
class Shape:
    """A distribution of one seed's score; ``family`` groups the table's rows (normal, skewed, discrete, heavy,
    bimodal)."""

    name: str
    family: str
    draw: Draw


@dataclass(frozen=True)
class PairedShape:
    """Both arms of a seed drawn together: ``draw(rng, size)`` gives (variant, reference), seed s of one arm
    sharing its randomness with seed s of the other."""

    name: str
    family: str
    draw: Callable[[np.random.Generator, tuple], tuple[np.ndarray, np.ndarray]]
    difference: Optional[float] = None  # the true mean difference where exact; else from TRUTH_DRAWS pairs


def monte_carlo_margin(trials: int) -> float:
    """MC_SIGMAS standard errors of a coverage share at the nominal level over ``trials`` sets."""
    return MC_SIGMAS * float(np.sqrt(NOMINAL * (1 - NOMINAL) / trials))


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


def student_t(df: float, scale: float = 1.0) -> Draw:
    """Heavy tails: Student t with ``df`` degrees of freedom (finite variance from 3), scaled."""
    return lambda rng, size: scale * rng.standard_t(df, size)


def discrete(values, probs) -> Draw:
    """A score that takes one of a few values (a small eval set, or runs that end on a handful of outcomes)."""
    v, p = np.asarray(values, float), np.asarray(probs, float)
    return lambda rng, size: rng.choice(v, size=size, p=p)


def on_grid(base: Draw, items: int = EVAL_ITEMS) -> Draw:
    """A seed's accuracy rounded to k / items: greedy decoding of a fixed eval set, the seeds' spread tight."""
    return lambda rng, size: np.clip(np.round(base(rng, size) * items), 0, items) / items


LEARNED = on_grid(beta(0.45, 0.005))  # c7's g8: 0.459, sd 0.005 over seeds
COLLAPSED = on_grid(beta(0.28, 0.005))  # back at the warm start (0.280), as g4's seed 3


def learned_or_collapsed(learned: Draw, collapsed: Draw, collapse_rate: float) -> Draw:
    """Bimodal seeds: a seed collapses (``collapse_rate``) or learns, as c7's g4 seed 3 did."""

    def draw(rng, size):
        up, down = learned(rng, size), collapsed(rng, size)
        return np.where(rng.random(size) < collapse_rate, down, up)

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
    Shape("accuracy k/20 near 0.5 (a 20-item eval set)", "discrete", eval_accuracy(0.5, 0.05, items=20)),
    Shape("three outcomes 0.40 / 0.45 / 0.50 (20 / 50 / 30%)", "discrete", discrete([0.4, 0.45, 0.5], [0.2, 0.5, 0.3])),
    Shape("heavy tails: Student t, 3 df", "heavy", student_t(3)),
    Shape("heavy right tail: lognormal, sigma 0.75", "heavy", lambda rng, size: rng.lognormal(0.0, 0.75, size)),
    Shape(
        "learned (0.45, sd 0.005) or collapsed (0.28), 1 seed in 5",
        "bimodal",
        learned_or_collapsed(LEARNED, COLLAPSED, 0.2),
    ),
    Shape(
        "learned or collapsed, 1 seed in 10",
        "bimodal",
        learned_or_collapsed(LEARNED, COLLAPSED, 0.1),
    ),
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
    (Shape("k/20 near 0.5, no difference", "discrete", SHAPES[8].draw), SHAPES[8]),
    (Shape("three outcomes, no difference", "discrete", SHAPES[9].draw), SHAPES[9]),
    (Shape("t 3 df, +1", "heavy", lambda rng, size: 1.0 + rng.standard_t(3, size)), SHAPES[10]),
    (Shape("learned or collapsed (1 in 5), no difference", "bimodal", SHAPES[12].draw), SHAPES[12]),
    (
        Shape(
            "learned or collapsed, 1 in 10 against 1 in 5",
            "bimodal",
            learned_or_collapsed(LEARNED, COLLAPSED, 0.1),
        ),
        SHAPES[12],
    ),
)


def _shared_normal(shift: float, seed_sd: float, noise_sd: float):
    def draw(rng, size):
        seed_effect = rng.normal(0.0, seed_sd, size)
        return shift + seed_effect + rng.normal(0.0, noise_sd, size), seed_effect + rng.normal(0.0, noise_sd, size)

    return draw


def _shared_accuracy(shift: float, mean: float, sd: float, items: int = EVAL_ITEMS):
    """A seed's skill ~ Beta(mean, sd) is shared; each arm scores k / items, the variant with skill + shift."""
    a, b = _beta_mean_sd(mean, sd)

    def draw(rng, size):
        skill = rng.beta(a, b, size)
        return rng.binomial(items, np.clip(skill + shift, 0, 1)) / items, rng.binomial(items, skill) / items

    return draw


def _collapse(shared: bool, gain: float):
    """Seeds that learn (~0.45, the variant ``gain`` higher) or collapse (~0.28), 1 in 5: the collapse either
    shared by both arms of a seed (it came from the seed's warm start or data) or drawn per arm."""
    learned, collapsed, better = LEARNED, COLLAPSED, on_grid(beta(0.45 + gain, 0.005))

    def draw(rng, size):
        down_a = rng.random(size) < 0.2
        down_b = down_a if shared else rng.random(size) < 0.2
        a = np.where(down_a, collapsed(rng, size), better(rng, size))
        return a, np.where(down_b, collapsed(rng, size), learned(rng, size))

    return draw


def _identical(rng, size):
    x = rng.normal(0.0, 1.0, size)
    return x, x.copy()


# both arms of a seed drawn together (common random numbers); the paired t interval's coverage of the mean
# difference. Identical arms (c4 of docs/claims.md) give a zero-width interval at 0.
PAIRED = (
    PairedShape("identical arms (a mechanism identity)", "normal", _identical, 0.0),
    PairedShape("normal, shared seed effect, +0.5", "normal", _shared_normal(0.5, 1.0, 0.5), 0.5),
    PairedShape("normal, shared seed effect, no difference", "normal", _shared_normal(0.0, 1.0, 0.5), 0.0),
    PairedShape("k/200, shared skill near 0.45, +0.01", "discrete", _shared_accuracy(0.01, 0.45, 0.02), 0.01),
    PairedShape("k/200, shared skill near 0.9, no difference", "discrete", _shared_accuracy(0.0, 0.9, 0.02), 0.0),
    PairedShape(
        "heavy tails: t 3 df seed effect and noise, +0.5",
        "heavy",
        lambda rng, size: (lambda u: (0.5 + u + rng.standard_t(3, size), u + rng.standard_t(3, size)))(
            rng.standard_t(3, size)
        ),
        0.5,
    ),
    PairedShape("learned or collapsed, the collapse shared, +0.02", "bimodal", _collapse(True, 0.02)),
    PairedShape("learned or collapsed, the collapse per arm, +0.02", "bimodal", _collapse(False, 0.02)),
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


# Known shortfalls below nominal, (interval, shape) -> the worst gap below 0.95 measured at 3, 5 and 10 seeds
# (python scripts/coverage.py, seed 0: 10,000 trials for the first eight shapes, 4,000 for the others),
# rounded up to the next 0.01; the floor subtracts it. Why:
# * skewed or bounded shapes (beta near 0 or 1, clipped at a bound): the t interval's tails are equal, the
#   seeds' are not, and 3 to 5 seeds cannot show the skew;
# * heavy tails: a seed far out widens s more than it moves the mean, so coverage errs high, except
#   that at 3 seeds the lognormal's long right tail is rarely sampled;
# * bimodal seeds (learned at 0.45 with sd 0.005, or collapsed at 0.28): with 1 seed in 5 collapsed, 3 seeds
#   hold no collapsed run 51% of the time and the interval is then narrow around the learned mode: the mean's
#   interval covers 0.47 at 3 seeds, 0.67 at 5, 0.89 at 10 (1 in 10: 0.41, 0.41, 0.66). The IQM's covers its
#   own target (the learned mode). Pairing helps when a seed collapses in both arms. The report flags such
#   sets by the gap rule (stats.looks_bimodal) and recommends more seeds;
# * discrete scores on a few levels: all seeds on one level give a zero-width interval.
SHORTFALLS: dict[tuple[str, str], object] = {  # a number for every seed count, or {seeds: number}
    ("IQM (Tukey-McLaughlin)", "normal"): 0.02,
    ("mean (Student t)", "beta near 0.9"): 0.01,
    ("IQM (Tukey-McLaughlin)", "beta near 0.9"): 0.02,
    ("mean (Student t)", "beta near 0.05"): 0.03,
    ("IQM (Tukey-McLaughlin)", "beta near 0.05"): 0.02,
    ("mean (Student t)", "clipped normal at 1 (23% of seeds at 1.0)"): 0.04,
    ("IQM (Tukey-McLaughlin)", "clipped normal at 1 (23% of seeds at 1.0)"): 0.04,
    ("mean (Student t)", "clipped normal at 0 (23% of seeds at 0.0)"): 0.04,
    ("IQM (Tukey-McLaughlin)", "clipped normal at 0 (23% of seeds at 0.0)"): 0.04,
    ("IQM (Tukey-McLaughlin)", "accuracy k/200 near 0.9"): 0.02,
    ("mean (Student t)", "accuracy k/200 near 0.05"): 0.01,
    ("IQM (Tukey-McLaughlin)", "accuracy k/200 near 0.05"): 0.01,
    ("mean (Student t)", "beta near 0.85, 1 seed in 10 lower by 4 sd"): 0.04,
    # 0.935 at 4 seeds over 2,000 trials (the test's draw), 0.944 or more over 10,000
    ("IQM (Tukey-McLaughlin)", "beta near 0.85, 1 seed in 10 lower by 4 sd"): {4: 0.01},
    ("mean (Student t)", "three outcomes 0.40 / 0.45 / 0.50 (20 / 50 / 30%)"): {3: 0.11, 5: 0.04, 10: 0.02},
    ("IQM (Tukey-McLaughlin)", "three outcomes 0.40 / 0.45 / 0.50 (20 / 50 / 30%)"): 0.03,
    ("IQM (Tukey-McLaughlin)", "heavy tails: Student t, 3 df"): 0.01,
    ("mean (Student t)", "heavy right tail: lognormal, sigma 0.75"): 0.08,
    ("IQM (Tukey-McLaughlin)", "heavy right tail: lognormal, sigma 0.75"): 0.03,
    ("mean (Student t)", "learned (0.45, sd 0.005) or collapsed (0.28), 1 seed in 5"): {3: 0.49, 5: 0.29, 10: 0.07},
    ("IQM (Tukey-McLaughlin)", "learned (0.45, sd 0.005) or collapsed (0.28), 1 seed in 5"): {10: 0.02},
    ("mean (Student t)", "learned or collapsed, 1 seed in 10"): {3: 0.55, 5: 0.55, 10: 0.31},
    ("difference of means (Welch)", "learned or collapsed, 1 in 10 against 1 in 5"): {3: 0.24, 5: 0.15, 10: 0.03},
    ("P(improvement) (Newcombe)", "normal, +1 sd with 3x the spread"): 0.02,
    ("paired difference (t)", "learned or collapsed, the collapse shared, +0.02"): 0.03,
}


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
    def shortfall(self) -> float:
        known = SHORTFALLS.get((self.interval, self.shape), 0.0)
        return float(known.get(self.seeds, 0.0) if isinstance(known, dict) else known)

    @property
    def floor(self) -> float:
        """Nominal, less the Monte Carlo margin of this cell's trials, less the shape's known shortfall."""
        return NOMINAL - monte_carlo_margin(self.trials) - self.shortfall


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


PAIRED_INTERVAL = "paired difference (t)"


def paired_cells(shapes=PAIRED, trials: int = 2000, seed: int = 0) -> Iterator[Cell]:
    """Coverage of the paired t interval of per-seed differences, for arms drawn with shared seed randomness."""
    for i, shape in enumerate(shapes):
        truth = shape.difference
        if truth is None:
            a, b = shape.draw(np.random.default_rng(seed + 4000 + i), (TRUTH_DRAWS,))
            truth = float(np.mean(a - b))
        for n in SEED_COUNTS:
            a, b = shape.draw(_rng(seed, 500 + i, n), (trials, n))
            coverage, width = _covered(stats.paired_intervals(a, b), truth)
            yield Cell(PAIRED_INTERVAL, shape.name, shape.family, n, trials, coverage, width)


# The seed count below which a bimodal arm's verdict is withheld (stats.BIMODAL_MIN_SEEDS), measured on the bimodal
# shapes of PAIRS (Welch) and PAIRED (the paired t interval), the two intervals verdicts use, at these counts. A
# count qualifies when at it and every larger count each shape covers at least NOMINAL less BIMODAL_TOLERANCE and
# the Monte Carlo margin: the paired interval on a collapse shared by both arms stays near 0.94 at every count (its
# documented shortfall; no seed count removes it), which the tolerance admits.
BIMODAL_SEED_COUNTS = (5, 8, 10, 15, 20)
BIMODAL_TOLERANCE = 0.01
FLAGGED = ", sets the gap rule flags"  # suffix of the cells measured only on the sets whose verdict is withheld
VERDICT = ", sets that get a verdict"  # ... only on the sets the rule lets through (no arm with two modes)
OUTLIER = ", sets with one outlier"  # ... only on the sets where the rule sets one seed of an arm apart
NO_ALARM = ", sets with no alarm"  # ... only on the sets where the rule sees nothing (before issue 65: the verdicts)


def flagged_rows(x: np.ndarray) -> np.ndarray:
    """stats.looks_bimodal row by row on (trials, n) seed sets: the alarm, with two seeds or more on each side."""
    return np.asarray(stats.gap_alarm(x)) & (np.asarray(stats.smaller_group(x)) >= 2)


def outlier_rows(x: np.ndarray) -> np.ndarray:
    """stats.lone_outlier row by row: the alarm with a single seed on one side of the gap."""
    return np.asarray(stats.gap_alarm(x)) & (np.asarray(stats.smaller_group(x)) == 1)


def _subsets(name: str, shape: str, n: int, interval: stats.Interval, truth: float, flagged, outlier):
    """The cell over every set, then over the withheld sets, the sets that get a verdict, those with one outlier
    and those with no alarm (the last two split the ones that get a verdict); a subset with no set is left out.
    From stats.BIMODAL_MIN_SEEDS on every set gets a verdict: the subsets are not measured there."""
    trials = flagged.size
    coverage, width = _covered(interval, truth)
    yield Cell(name, shape, "bimodal", n, trials, coverage, width)
    if n >= stats.BIMODAL_MIN_SEEDS:
        return
    subsets = (FLAGGED, flagged), (VERDICT, ~flagged), (OUTLIER, outlier & ~flagged), (NO_ALARM, ~flagged & ~outlier)
    for suffix, rows in subsets:
        if rows.any():
            sub = stats.Interval(interval.point[rows], interval.low[rows], interval.high[rows])
            coverage, width = _covered(sub, truth)
            yield Cell(name + suffix, shape, "bimodal", n, int(rows.sum()), coverage, width)


def _bimodal_means(trials: int, seed: int, counts) -> list[Cell]:
    """The mean's t interval on SHAPES' bimodal shapes (one arm: the report's per-variant interval)."""
    cells: list[Cell] = []
    for i, shape in enumerate(SHAPES):
        if shape.family != "bimodal":
            continue
        truth = float(_truth_sample(shape, seed + 1000 + i).mean())
        for n in counts:
            x = shape.draw(_rng(seed, 700 + i, n), (trials, n))
            cells += _subsets("mean (Student t)", shape.name, n, stats.mean_intervals(x), truth, flagged_rows(x),
                              outlier_rows(x))  # fmt: skip
    return cells


def bimodal_cells(trials: int = 2000, seed: int = 0, counts=BIMODAL_SEED_COUNTS) -> list[Cell]:
    """Welch's interval on PAIRS' bimodal pairs and the paired one on PAIRED's bimodal shapes at each count (and the
    mean's on SHAPES' bimodal ones): coverage over every set, over the sets whose verdict the gap rule withholds,
    over the sets that still get one, and over those with one outlier."""
    cells: list[Cell] = []
    for i, (variant, reference) in enumerate(PAIRS):
        if variant.family != "bimodal":
            continue
        va, ref = _truth_sample(variant, seed + 2000 + i), _truth_sample(reference, seed + 3000 + i)
        truth = 0.0 if variant.draw is reference.draw else float(va.mean() - ref.mean())
        for n in counts:
            rng = _rng(seed, 100 + i, n)
            a, b = variant.draw(rng, (trials, n)), reference.draw(rng, (trials, n))
            flagged, outlier = flagged_rows(a) | flagged_rows(b), outlier_rows(a) | outlier_rows(b)
            welch = stats.welch_intervals(a, b)
            cells += _subsets("difference of means (Welch)", variant.name, n, welch, truth, flagged, outlier)
    for i, shape in enumerate(PAIRED):
        if shape.family != "bimodal":
            continue
        a, b = shape.draw(np.random.default_rng(seed + 4000 + i), (TRUTH_DRAWS,))
        truth = float(np.mean(a - b)) if shape.difference is None else shape.difference
        for n in counts:
            a, b = shape.draw(_rng(seed, 500 + i, n), (trials, n))
            flagged, outlier = flagged_rows(a) | flagged_rows(b), outlier_rows(a) | outlier_rows(b)
            cells += _subsets(PAIRED_INTERVAL, shape.name, n, stats.paired_intervals(a, b), truth, flagged, outlier)
    return cells + _bimodal_means(trials, seed, counts)


# How the gap rule reads seed sets of known kind (issue 65: one outlier is not two modes). Per process and seed
# count: the share of sets it calls two modes (looks_bimodal), and the share where it sets one seed apart.
RULE_PROCESSES = (
    ("normal seeds", normal(0.45, 0.01)),
    ("normal seeds, one seed 8 sd low", None),  # built in gap_rule_rates: exactly one outlier per set
    ("learned or collapsed, 1 seed in 5", learned_or_collapsed(LEARNED, COLLAPSED, 0.2)),
    ("learned or collapsed, 1 seed in 2", learned_or_collapsed(LEARNED, COLLAPSED, 0.5)),
)


def gap_rule_rates(trials: int = 2000, seed: int = 0, counts=(5, 10)) -> list[tuple[str, int, float, float]]:
    """(process, seeds, share called two modes, share with one outlier) for RULE_PROCESSES."""
    out = []
    for i, (name, draw) in enumerate(RULE_PROCESSES):
        for n in counts:
            rng = _rng(seed, 900 + i, n)
            if draw is None:
                x = rng.normal(0.45, 0.01, (trials, n))
                x[:, 0] -= 0.08
            else:
                x = draw(rng, (trials, n))
            out.append((name, n, float(np.mean(flagged_rows(x))), float(np.mean(outlier_rows(x)))))
    return out


def bimodal_seed_count(cells: list[Cell]) -> Optional[int]:
    """The smallest count from which every bimodal cell over all sets covers NOMINAL - BIMODAL_TOLERANCE - the Monte
    Carlo margin (None when no measured count does): stats.BIMODAL_MIN_SEEDS."""
    every = [
        c
        for c in cells
        if not c.interval.endswith((FLAGGED, VERDICT, OUTLIER, NO_ALARM)) and not c.interval.startswith("mean")
    ]
    ok = {n: all(c.coverage >= NOMINAL - BIMODAL_TOLERANCE - monte_carlo_margin(c.trials) for c in every if c.seeds == n)
          for n in sorted({c.seeds for c in every})}  # fmt: skip
    counts = sorted(ok)
    for k, n in enumerate(counts):
        if all(ok[m] for m in counts[k:]):
            return n
    return None


def all_cells(trials: int = 2000, seed: int = 0) -> list[Cell]:
    return [
        *one_sample_cells(trials=trials, seed=seed),
        *two_sample_cells(trials=trials, seed=seed),
        *paired_cells(trials=trials, seed=seed),
    ]


# shapes named on the command line (scripts/coverage.py --shape): name(number, ...), no code evaluated
SHAPE_MAKERS: dict[str, tuple[Callable[..., Draw], str, str]] = {
    "normal": (normal, "normal", "normal(mean, sd)"),
    "beta": (beta, "skewed", "beta(mean, sd)"),
    "clipped": (clipped_normal, "skewed", "clipped(mean, sd): a normal clipped into [0, 1]"),
    "accuracy": (
        lambda m, sd, items=EVAL_ITEMS: eval_accuracy(m, sd, int(items)),
        "discrete",
        "accuracy(mean, sd, items)",
    ),
    "t": (lambda df, scale=1.0: student_t(df, scale), "heavy", "t(df[, scale])"),
    "lognormal": (lambda sigma: lambda rng, size: rng.lognormal(0.0, sigma, size), "heavy", "lognormal(sigma)"),
    "bimodal": (
        lambda up, down, sd, rate: learned_or_collapsed(on_grid(beta(up, sd)), on_grid(beta(down, sd)), rate),
        "bimodal",
        "bimodal(learned mean, collapsed mean, sd, collapse rate)",
    ),
}


def parse_shape(spec: str) -> Shape:
    """'beta(0.45, 0.02)' -> a Shape; a clear error naming the forms otherwise."""
    forms = "; ".join(m[2] for m in SHAPE_MAKERS.values())
    name, _, rest = spec.strip().partition("(")
    if name not in SHAPE_MAKERS or not rest.endswith(")"):
        raise ValueError(f"--shape {spec!r}: use one of {forms}")
    try:
        args = [float(a) for a in rest[:-1].split(",") if a.strip()]
        make, family, _ = SHAPE_MAKERS[name]
        draw = make(*args)
        draw(np.random.default_rng(0), (2,))
    except (TypeError, ValueError, ZeroDivisionError) as err:
        raise ValueError(f"--shape {spec!r}: {err} (forms: {forms})") from None
    return Shape(spec.strip(), family, draw)


def custom_cells(shape: Shape, trials: int = 2000, seed: int = 0) -> list[Cell]:
    """One shape's mean and IQM cells, and Welch's and the paired interval's with both arms drawn from it (no
    difference; paired: the arms independent, the weakest case for pairing)."""
    cells = list(one_sample_cells(shapes=(shape,), trials=trials, seed=seed))
    cells += list(two_sample_cells(pairs=((shape, shape),), trials=trials, seed=seed))
    same = PairedShape(shape.name, shape.family, lambda rng, size: (shape.draw(rng, size), shape.draw(rng, size)), 0.0)
    return cells + list(paired_cells(shapes=(same,), trials=trials, seed=seed))
