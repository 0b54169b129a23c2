"""One training step's metrics row (metrics.jsonl; names in docs/metrics.md), assembled from what the step's
parts report: the collection (`collect_entries`), the rollout batch (`batch_entries`), the update
(`update_entries`: whatever the loss reports, by declaration, no allow-list) and the clock and the device
(`timing_entries`, `perf_entries`). Pure of the trainer: each takes the values it reads.
"""

from __future__ import annotations

from typing import Any

from rlcompare.algos import losses
from rlcompare.algos.batch_stats import length_stats, reported_means
from rlcompare.train import offpolicy as off_policy
from rlcompare.train import throughput
from rlcompare.train.batch import Collected, RolloutBatch
from rlcompare.train.update import UpdateResult


def row_name(key: str) -> str:
    """A metric's name in the row: its own when namespaced (`loss/value`), `offpolicy/<kind>` for the off-policy
    gaps, `ratio/seq_*` for GSPO's sequence ratio, else `policy/<name>` (what a surrogate clips, masks or gates)."""
    if key in losses.SEQ_RATIO_NAMES:
        return losses.SEQ_RATIO_NAMES[key]
    if "/" in key:
        return key
    if key.startswith("offpolicy_"):
        return "offpolicy/" + key[len("offpolicy_") :]
    return "policy/" + key


def variant_metrics() -> tuple:
    """What the surrogates clip/mask/gate (their specs' metrics, every registered one) and the token weights,
    logged as policy/<name>."""
    surrogate_metrics = [k for keys in losses.SURROGATE_METRICS.values() for k in keys]
    return tuple(dict.fromkeys(surrogate_metrics + ["token_weight_mean", "entropy_mask_kept_frac"]))


def collect_entries(step: int, tokens_generated: int, collected: Collected, env) -> dict[str, Any]:
    """The row's head: the step, its tokens and sampling rounds, and the episodes' entries (tokens/env, env/*)
    when `env` (an `EnvRollout`) runs them (a collective over several ranks: every rank calls it)."""
    return {
        "step": step,
        "tokens/step": collected.generated_tokens,
        "tokens/generated": tokens_generated,
        "sampling/rounds": collected.rounds,
        "sampling/groups_drawn": collected.groups_drawn,
        "sampling/groups_dropped": collected.groups_dropped,
        **(env.metrics() if env is not None else {}),
    }


def batch_entries(batch: RolloutBatch, group_size: int) -> dict[str, Any]:
    """Rewards, train accuracy, the zero-variance groups and the completions' lengths of the rollout batch."""
    completions, rewards = batch.completions, batch.rewards
    grp = rewards.view(-1, group_size)
    return {
        "reward/mean": float(rewards.mean()),
        "reward/std": float(rewards.std()) if len(rewards) > 1 else 0.0,
        "accuracy/train": float(batch.correct.float().mean()),
        "groups/zero_variance_frac": float((grp.max(1).values == grp.min(1).values).float().mean()),
        **length_stats(completions.lengths.cpu(), batch.correct, completions.truncated.cpu()),
    }


def verifier_entries(batch: RolloutBatch, names: tuple[str, ...]) -> dict[str, Any]:
    """verifier/<name>: each metric the verifier declares (`names`), its mean over the batch's completions that
    reported it (docs/metrics.md)."""
    if batch.verifier_metrics is None:
        return {}
    return {f"verifier/{n}": m for n, m in zip(names, reported_means(batch.verifier_metrics))}


def update_entries(up: UpdateResult, skipped_updates: int, lr: float) -> dict[str, Any]:
    """The update's entries: the fixed ones first (objective, clipping, ratio, KL, entropy, losses, optimizer),
    then everything else the update reported under its own name (`row_name`). skipped_updates: the run's count
    so far, this update's included; lr: the learning rate after it."""
    m = up.metrics
    names = losses.ROW_NAMES
    row = {
        "optim/skipped_updates": skipped_updates,
        "optim/nonfinite": int(up.skipped > 0),
        names["objective_per_token"]: m.get("objective_per_token"),
        names["objective_per_response"]: m.get("objective_per_response"),
        "objective/optimized": -m.get("loss/policy", float("nan")),
        **{names[k]: m.get(k) for k in ("clip_frac_low", "clip_frac_high", "dual_clip_frac")},
        **{names[k]: m.get(k) for k in ("ratio_mean", "ratio_min", "ratio_max", "approx_kl")},
        "kl/ref": m.get("kl/ref"),
        "policy/entropy": m.get("policy/entropy"),
        "loss/policy": m.get("loss/policy"),
        "update/idle_rows_frac": up.idle_rows_frac,
        "loss/value": m.get("loss/value"),
        "optim/grad_norm": m.get("optim/grad_norm"),
        "optim/lr": lr,
    }
    # then everything else the update reported, by declaration, no allow-list: the surrogate's own metrics (its
    # spec's, first, in their order), the off-policy gaps, and any other name (the sequence ratio, DHPO's branch)
    first = [k for k in variant_metrics() if k in m] + [k for k in off_policy.GAP_METRIC_KINDS if k in m]
    for k in dict.fromkeys(first + list(m)):
        if k not in names:
            row.setdefault(row_name(k), m[k])
    return row


def timing_entries(collected: Collected, update_s: float, step_s: float, elapsed_s: float) -> dict[str, float]:
    """The step's seconds by phase, the run's so far, and its generated tokens per second."""
    return {
        "time/rollout_s": collected.rollout_s,
        "time/scoring_s": collected.scoring_s,
        "time/update_s": update_s,
        "time/step_s": step_s,
        "time/elapsed_s": elapsed_s,
        "perf/tokens_per_s": collected.generated_tokens / max(step_s, 1e-9),
    }


def step_tokens(
    collected: Collected, trained: RolloutBatch | None, group_size: int, extra_forwards: int, critic: bool
) -> throughput.StepTokens:
    """The tokens the step ran through the model, by kind of pass (for its model FLOPs). extra_forwards: the
    no-grad passes over the batch (reference, recomputed old log-probs, critic values)."""
    batch = collected.batch
    prompt = int(batch.prompt_mask[::group_size].sum()) if batch is not None else 0  # once per group
    return throughput.StepTokens(
        generated=collected.generated_tokens,
        prefilled=prompt,
        updated=int(trained.completions.mask.sum()) if trained is not None else 0,
        update_prompt=prompt if trained is not None else 0,
        extra_forwards=extra_forwards,
        critic=critic,
    )


def perf_entries(
    tokens: throughput.StepTokens, collected: Collected, update_s: float, step_s: float, *, model, dtype, device, ranks
) -> dict[str, float]:
    """perf/ and memory/ entries of the row (docs/metrics.md); the device's peak is probed once per process."""
    return {
        **throughput.perf_metrics(
            tokens=tokens,
            rollout_s=collected.rollout_s,
            update_s=update_s,
            step_s=step_s,
            flops=throughput.step_flops(throughput.product_params(model), tokens),
            peak=throughput.peak_flops(str(device), dtype),
            ranks=ranks,
        ),
        "memory/peak_gib": throughput.peak_memory_gib(str(device)),
    }
