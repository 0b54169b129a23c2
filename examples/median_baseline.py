"""A new advantage estimator in one file: the group's median as the baseline.

    A_i = R_i - median_g(R)        every token of response i gets A_i

A median is robust where a mean is not: one outlying reward in a group (a lucky long answer scored 10 where the
rest score 0 or 1) moves GRPO's mean baseline for every other member, not the median. With an even group the median
is the lower of the two middle values (torch.median's). No knob of its own: the common key
``algorithm.advantage.scale`` must be ``none`` (nothing divides).

What this file declares is all there is (docs/api.md, "Adding an advantage estimator"): the spec gives the config
its name, the scale it accepts, what it needs from the run (groups: ``trainer.group_size=1`` is refused) and its
metric; the function is the math. From the repository's root: ``rlcompare train
algorithm.module=examples.median_baseline algorithm.advantage.estimator=median algorithm.advantage.scale=none``
(tests/test_api_example_estimator.py).
"""

from __future__ import annotations


from rlcompare.algos.advantage import AdvantageInputs, AdvantageResult, register_estimator
from rlcompare.algos.estimator_specs import EstimatorSpec, Needs, NoKnobs

SPEC = EstimatorSpec(
    name="median",
    settings=NoKnobs,
    scales=("none",),
    needs=Needs(groups=True),
    metrics=("median/zero_frac",),  # in the row under this name
    doc="R - median of the group (an example: examples/median_baseline.py)",
)


@register_estimator(SPEC)  # registers the spec (what the config accepts) and the math
def median_advantages(x: AdvantageInputs, settings: NoKnobs) -> AdvantageResult:
    grouped = x.sequence_rewards().float().view(-1, x.group_size)
    adv = (grouped - grouped.median(dim=1, keepdim=True).values).reshape(-1)
    return AdvantageResult(adv, metrics={"median/zero_frac": float((adv == 0).float().mean())})
