"""Leave-one-seed-out: does a single seed decide a verdict? (issue 50)

Every decided row of the differences frame is judged again with each seed left out in turn: from either arm when
the row is Welch's (the variant's seed alone, or the reference's), the seed's pair when the row is paired (both arms
of seed s share its random numbers, so they go together). Where a reduced set decides otherwise (better, worse, or
no detectable difference), the row is *fragile* and names every such seed and the arm(s) it was dropped from
(issue 65: every one, not only the first).

* the interval's verdict (``verdict``): the reduced row's own interval, the seed-count rule (``--min-seeds``) left
  aside, since leaving a seed out of 5 always falls below 5;
* Holm's verdict (``verdict_holm``): the reduced run set is the folder without that run, so every decided row of
  the family that holds it is recomputed (a reference seed is in every row) and the family adjusted again; a seed
  of another variant can decide a row through the adjustment, and is named so.

Decisions are signs here: +1 better, -1 worse, 0 no detectable difference. Pure numpy on the per-seed values the
rows carry (``seeds_*`` / ``values_*``).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from . import stats

Runs = frozenset  # of (arm name, seed): the runs a candidate leaves out


def interval_sign(low: float, high: float) -> int:
    return 1 if low > 0 else -1 if high < 0 else 0


def holm_sign(p_holm: float, diff: float, alpha: float) -> int:
    return 0 if not p_holm <= alpha else (1 if diff > 0 else -1)


def _arms(r) -> tuple[list[int], np.ndarray, list[int], np.ndarray]:
    """(variant seeds, values, reference seeds, values); a paired row's reference in the variant's seed order."""
    sa = [int(s) for s in str(r.seeds_variant).split()]
    sb = [int(s) for s in str(r.seeds_reference).split()]
    xa = np.array([float(v) for v in str(r.values_variant).split()])
    xb = np.array([float(v) for v in str(r.values_reference).split()])
    if r.method == "paired":
        by_seed = dict(zip(sb, xb))
        sb, xb = list(sa), np.array([by_seed[s] for s in sa])
    return sa, xa, sb, xb


def _who(runs, variant: str, reference: str, paired: bool) -> str:
    """'seed 3 of `g4`' or, for a paired row that loses the seed's pair, 'seed 3 of `g4` and `base`'."""
    seed = next(iter(runs))[1]
    arms = [a for a in (variant, reference) if (a, seed) in runs] or sorted({a for a, _ in runs})
    if paired and arms != [variant, reference] and any(a in (variant, reference) for a in arms):
        arms = [variant, reference]  # one run of the pair gone: the pair goes
    return f"seed {seed} of " + " and ".join(f"`{a}`" for a in arms)


def join(whos: list[str]) -> str:
    """Deciding seeds in one phrase, grouped by the arms they leave: ['seed 1 of `a` and `b`', 'seed 3 of `a` and
    `b`', 'seed 2 of `c`'] -> 'seeds 1 and 3 of `a` and `b`; seed 2 of `c`'."""
    groups: dict[str, list[str]] = {}
    for who in dict.fromkeys(whos):
        seed, _, arms = who.removeprefix("seed ").partition(" of ")
        groups.setdefault(arms, []).append(seed)
    parts = []
    for arms, seeds in groups.items():
        listed = seeds[0] if len(seeds) == 1 else ", ".join(seeds[:-1]) + " and " + seeds[-1]
        parts.append(f"seed{'s' if len(seeds) > 1 else ''} {listed} of {arms}")
    return "; ".join(parts)


def words(who: str) -> str:
    """'fragile (seed 3 of `g4` decides it)'; several: 'fragile (seeds 1 and 3 of `a` each decide it)'."""
    plural = who.startswith("seeds ") or ";" in who
    return f"fragile ({who} {'each decide' if plural else 'decides'} it)"


def _interval_fragile(r, alpha: float) -> str:
    """Every seed (or seed pair) whose removal alone changes the row's interval verdict, in seed order."""
    sa, xa, sb, xb = _arms(r)
    paired = r.method == "paired"
    found = []
    for arm, i, ci, _ in stats.leave_one_out(xa, xb, paired, alpha):
        if interval_sign(ci.low, ci.high) != interval_sign(r.diff_low, r.diff_high):
            if arm == "variant":
                runs = {(r.variant, sa[i])}
            elif arm == "reference":
                runs = {(r.reference, sb[i])}
            else:
                runs = {(r.variant, sa[i]), (r.reference, sa[i])}
            found.append(_who(runs, r.variant, r.reference, paired))
    return join(found)


def _reduced(r, arms, runs) -> tuple[float, float]:
    """(p-value, difference) of row r without the runs; a paired row drops a seed's pair when either run goes."""
    sa, xa, sb, xb = arms
    if r.method == "paired":
        keep = np.array([(r.variant, s) not in runs and (r.reference, s) not in runs for s in sa])
        a, b = xa[keep], xb[keep]
        p = stats.paired_p_value(a, b)
    else:
        a = xa[[(r.variant, s) not in runs for s in sa]]
        b = xb[[(r.reference, s) not in runs for s in sb]]
        p = stats.welch_p_value(a, b)
    diff = float(np.mean(a) - np.mean(b)) if a.size and b.size else float("nan")
    return p, diff


def _candidates(rows, arms) -> list:
    """Each run (or seed pair) of the family once, in row and seed order."""
    out: dict = {}
    for r in rows:
        sa, _, sb, _ = arms[r.Index]
        if r.method == "paired":
            for s in sa:
                out.setdefault(Runs({(r.variant, s), (r.reference, s)}), None)
        else:
            for s in sa:
                out.setdefault(Runs({(r.variant, s)}), None)
            for s in sb:
                out.setdefault(Runs({(r.reference, s)}), None)
    return list(out)


def _holm_fragile(family: pd.DataFrame, alpha: float) -> dict:
    rows = list(family.itertuples())
    arms = {r.Index: _arms(r) for r in rows}
    found: dict = {r.Index: [] for r in rows}
    for runs in _candidates(rows, arms):
        reduced = [_reduced(r, arms[r.Index], runs) for r in rows]
        adjusted = stats.holm_adjusted([p for p, _ in reduced])
        for r, ph, (_, diff) in zip(rows, adjusted, reduced):
            if holm_sign(ph, diff, alpha) != holm_sign(r.p_holm, r.diff, alpha):
                found[r.Index].append(_who(runs, r.variant, r.reference, r.method == "paired"))
    return {i: join(who) for i, who in found.items()}  # every deciding seed, each once


def fragility(differences: pd.DataFrame, decided: pd.Series, alpha: float) -> tuple[pd.Series, pd.Series]:
    """(fragile, fragile_holm): per row, '' or every seed that decides its interval's / Holm's verdict ('seed 3 of
    `g4`'; several: 'seeds 1 and 3 of `g4`'); '' for the rows not decided (too few seeds, bimodal)."""
    fragile = pd.Series("", index=differences.index, dtype=object)
    fragile_holm = pd.Series("", index=differences.index, dtype=object)
    for r in differences[decided].itertuples():
        fragile[r.Index] = _interval_fragile(r, alpha)
    for _, family in differences[decided].groupby(["reference", "quantity"], sort=False):
        for i, who in _holm_fragile(family, alpha).items():
            fragile_holm[i] = who
    return fragile, fragile_holm
