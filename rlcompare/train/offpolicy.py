"""The trainer's side of the corrections for stale rollouts (`algorithm.off_policy.*`, docs/algorithms.md §8): the
chosen correction's weights folded into the update's token weights, and the metrics `offpolicy/...`
(docs/metrics.md). The math is `rlcompare.algos.offpolicy`'s."""

from __future__ import annotations

import torch

from rlcompare.algos import offpolicy
from rlcompare.train.batch import Targets

# the metrics every micro-step adds (`offpolicy_<name>`, logged as `offpolicy/<name>`) and how they reduce
GAP_METRIC_KINDS = {"offpolicy_log_ratio_abs_mean": "weighted", "offpolicy_log_ratio_abs_max": "max"}


def logs_gap(algo, rollout) -> bool:
    """Whether the update is off-policy by design (stale rollouts or a correction): then it logs its gap."""
    return rollout.staleness > 0 or algo.off_policy.correction is not None


def gap_metrics(logp: torch.Tensor, behaviour_logp: torch.Tensor | None, mask: torch.Tensor) -> dict:
    """Mean and max |log(pi_theta / pi_behav)| over one micro-batch's tokens, pi_theta the policy being updated (on
    the first mini-batch, the proximal policy); {} without the sampler's log-probs."""
    if behaviour_logp is None:
        return {}
    gap = offpolicy.behaviour_gap(logp, behaviour_logp, mask)
    return {"offpolicy_" + k: v for k, v in gap.items()}


def apply_correction(algo, prox_logp: torch.Tensor, behaviour_logp: torch.Tensor, targets: Targets, row: dict) -> None:
    """`algorithm.off_policy.correction`'s weights (computed once on the whole rollout batch, before the update)
    multiply `targets.token_weight` (the mismatch weights, if any); its metrics go to `row` as
    `offpolicy/<correction>_<metric>`."""
    op = algo.off_policy
    knobs = {k: op[k] for k in offpolicy.OFF_POLICY_DEFAULTS}
    weight, metrics = offpolicy.correction_weights(
        op.correction, prox_logp, behaviour_logp, targets.advantages, targets.loss_mask, **knobs
    )
    targets.token_weight = weight if targets.token_weight is None else targets.token_weight * weight
    name = op.correction.replace("-", "_")
    row.update({f"offpolicy/{name}_{k}": v for k, v in metrics.items()})
