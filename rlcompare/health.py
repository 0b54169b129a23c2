"""Run health: the invariants a run that trained anything holds, checked on each metrics row and over the run.

A run can finish its budget without having trained on anything: every episode failed, the teacher scored nothing,
every update was skipped. Its rows look like a run's; its comparison would be a verdict on nothing. Each invariant
below has a name, the per-step condition that breaks it (its threshold) and the metric that shows it. A step that
breaks one is warned about once; a run that broke one at every step it took ends `"status": "failed"` with the
reason (rlcompare.train.run; docs/metrics.md, "Run health"). The report reads the same rows (rlcompare.report).

Pure: no I/O, no torch, no RNG. Fed the rows of metrics.jsonl as written (plain dicts) and the run's config (a
mapping or a DictConfig), so that a test hands it hand-made rows and the report re-checks a finished folder.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping, Optional


@dataclass(frozen=True)
class Invariant:
    name: str
    threshold: str  # the per-step condition that breaks it
    metric: str  # the row entries that show it
    meaning: str  # what a run that broke it at every step did


INVARIANTS = (
    Invariant(
        "no_policy_tokens",
        "tokens/step == 0",
        "tokens/step",
        "the policy generated no token: nothing was sampled, scored or trained",
    ),
    Invariant(
        "all_errors",
        "every episode (env/errors == episodes) or every scoring (verifier/errors grew by the samples scored) "
        "ended in an error",
        "env/errors, verifier/errors",
        "every reward was an error's 0: the environment or the verifier never scored a sample",
    ),
    Invariant(
        "teacher_nonfinite",
        "distill/teacher_nonfinite > 0 and no finite teacher term (the count covers tokens/step, or "
        "distill/distill_term_abs_per_token == 0)",
        "distill/teacher_nonfinite",
        "every teacher log-prob was NaN or infinite: every distillation term was set to 0",
    ),
    Invariant(
        "no_update",
        "the step's updates were all skipped (optim/skipped_updates grew by trainer.updates_per_rollout, or the "
        "step kept no batch)",
        "optim/skipped_updates, optim/nonfinite",
        "no update was applied: the policy is its initial weights",
    ),
    Invariant(
        "env_single_turn",
        "an environment is set (env.max_turns > 1) and env/turns_mean <= 1: no episode went past its first turn",
        "env/turns_mean",
        "no episode went past its first turn: the environment never acted, the run trained single-turn",
    ),
    Invariant(
        "no_learning_signal",
        "groups/zero_variance_frac == 1 (group baselines: every group's advantage 0), or reward/std == 0 (batch "
        "baselines: ppo, reinforce_pp without a group baseline), or no batch kept",
        "groups/zero_variance_frac, reward/std, reward/mean",
        "every advantage was zero (all rewards of each group equal): the reward taught nothing",
    ),
)
BY_NAME = {i.name: i for i in INVARIANTS}


@dataclass(frozen=True)
class Context:
    """What of the run's config the checks read."""

    group_size: int = 1
    updates_per_rollout: int = 1
    env: bool = False  # an environment is configured (env.name != none)
    env_max_turns: int = 1
    # what the advantage estimator declares (its spec's needs: the caller reads them, this module imports nothing):
    teacher: bool = False  # it reads a teacher, whose terms are its signal (distill)
    group_baseline: bool = True  # it compares the completions of one prompt (else a batch baseline: gae, ...)

    @classmethod
    def of(cls, cfg: Any, needs: Optional[Mapping] = None) -> "Context":
        """From a run's config (DictConfig or the dict of its config.yaml) and what its estimator needs (`needs`:
        {"teacher": bool, "groups": bool}, `rlcompare.config.estimator_needs`; None: the defaults, a group
        estimator without a teacher); missing keys take the defaults."""

        def get(path: str, default):
            node = cfg
            for part in path.split("."):
                try:
                    node = node[part] if isinstance(node, Mapping) or hasattr(node, "keys") else None
                except (KeyError, TypeError):
                    node = None
                if node is None:
                    return default
            return node

        return cls(
            group_size=int(get("trainer.group_size", 1)),
            updates_per_rollout=int(get("trainer.updates_per_rollout", 1)),
            env=str(get("env.name", "none")) != "none",
            env_max_turns=int(get("env.max_turns", 1)),
            teacher=bool((needs or {}).get("teacher", False)),
            group_baseline=bool((needs or {}).get("groups", True)),
        )

    def applies(self, name: str) -> bool:
        if name == "teacher_nonfinite":
            return self.teacher
        if name == "env_single_turn":
            return self.env and self.env_max_turns > 1
        if name == "no_learning_signal":  # distillation's signal is the teacher's (teacher_nonfinite)
            return not self.teacher
        return True


def _num(row: Mapping, key: str) -> Optional[float]:
    v = row.get(key)
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        return None
    return float(v)


def _no_policy_tokens(row, prev, ctx) -> Optional[str]:
    n = _num(row, "tokens/step")
    return "tokens/step = 0" if n == 0 else None


def _all_errors(row, prev, ctx) -> Optional[str]:
    if ctx.env:
        errors = _num(row, "env/errors")
        ends = sum(v for k, v in row.items() if k.startswith("env/ends/") and _num(row, k) is not None)
        if errors and ends == 0:
            return f"env/errors = {errors:g} of {errors + ends:g} episodes"
        return None
    drawn = _num(row, "sampling/groups_drawn")
    now = _num(row, "verifier/errors")
    if not drawn or now is None:
        return None
    new = now - (_num(prev or {}, "verifier/errors") or 0.0)
    scored = drawn * ctx.group_size
    return f"verifier/errors grew by {new:g} of {scored:g} samples scored" if new >= scored else None


def _teacher_nonfinite(row, prev, ctx) -> Optional[str]:
    bad = _num(row, "distill/teacher_nonfinite")
    if not bad:
        return None
    tokens, term = _num(row, "tokens/step"), _num(row, "distill/distill_term_abs_per_token")
    if (tokens is not None and bad >= tokens) or term == 0:
        return f"distill/teacher_nonfinite = {bad:g} (tokens/step {tokens if tokens is None else f'{tokens:g}'})"
    return None


def _no_update(row, prev, ctx) -> Optional[str]:
    now = _num(row, "optim/skipped_updates")
    if now is None:
        return None
    new = now - (_num(prev or {}, "optim/skipped_updates") or 0.0)
    kept_no_batch = "reward/mean" not in row
    if new > 0 and (new >= ctx.updates_per_rollout or kept_no_batch):
        why = "no batch kept" if kept_no_batch else f"optim/nonfinite = {row.get('optim/nonfinite')}"
        return f"optim/skipped_updates grew by {new:g} ({why})"
    return None


def _env_single_turn(row, prev, ctx) -> Optional[str]:
    turns = _num(row, "env/turns_mean")
    return (
        f"env/turns_mean = {turns:g} (env.max_turns {ctx.env_max_turns})" if turns is not None and turns <= 1 else None
    )


def _no_learning_signal(row, prev, ctx) -> Optional[str]:
    if "reward/mean" not in row:
        return "no batch kept (sampling/groups_dropped = sampling/groups_drawn)"
    reward = f"reward/mean = {row.get('reward/mean')}"
    if not ctx.group_baseline:  # a batch baseline (gae, reinforce_pp without a group baseline): the batch's spread
        return f"reward/std = 0, {reward}" if _num(row, "reward/std") == 0 else None
    return f"groups/zero_variance_frac = 1, {reward}" if _num(row, "groups/zero_variance_frac") == 1 else None


_CHECKS = {
    "no_policy_tokens": _no_policy_tokens,
    "all_errors": _all_errors,
    "teacher_nonfinite": _teacher_nonfinite,
    "no_update": _no_update,
    "env_single_turn": _env_single_turn,
    "no_learning_signal": _no_learning_signal,
}


def step_breaks(row: Mapping, prev: Optional[Mapping], ctx: Context) -> dict[str, str]:
    """The invariants this row breaks, name -> the evidence (the metric and its value). `prev`: the row before it
    (None at step 1): cumulative counters are read as this step's growth."""
    out = {}
    for inv in INVARIANTS:
        if ctx.applies(inv.name):
            why = _CHECKS[inv.name](row, prev, ctx)
            if why is not None:
                out[inv.name] = why
    return out


@dataclass
class Broken:
    name: str
    evidence: str  # the first step's evidence
    steps: int

    def line(self) -> str:
        inv = BY_NAME[self.name]
        return f"{self.name}: {inv.meaning} (at all {self.steps} step(s); step 1: {self.evidence})"


@dataclass
class Health:
    """The run's health so far: fed each row in order (`check`), it warns once per invariant and says at the end
    which invariants the run broke at every step (`verdict`)."""

    ctx: Context
    steps: int = 0
    counts: dict = field(default_factory=dict)  # name -> steps that broke it
    first: dict = field(default_factory=dict)  # name -> (step, evidence) of the first step that broke it
    prev: Optional[dict] = None

    def check(self, row: Mapping) -> list[str]:
        """Take one row; returns the warnings of invariants it is the first row to break."""
        found = step_breaks(row, self.prev, self.ctx)
        self.steps += 1
        self.prev = dict(row)
        new = []
        for name, why in found.items():
            self.counts[name] = self.counts.get(name, 0) + 1
            if name not in self.first:
                self.first[name] = (row.get("step"), why)
                new.append(f"step {row.get('step')}: {name}: {why} ({BY_NAME[name].meaning})")
        return new

    def verdict(self, counters: Optional[Mapping] = None) -> list[Broken]:
        """The invariants broken at every step (none when no step ran). `counters`: the trainer's (TrainerState
        .as_dict), whose applied_updates, when known, decides `no_update` exactly."""
        if self.steps == 0:
            return []
        out = []
        for inv in INVARIANTS:
            n = self.counts.get(inv.name, 0)
            broken = n == self.steps
            if inv.name == "no_update" and counters and counters.get("applied_updates") is not None:
                broken = counters["applied_updates"] == 0 and bool(counters.get("skipped_updates"))
            if broken:
                step, why = self.first.get(inv.name, (None, "applied_updates = 0"))
                out.append(Broken(inv.name, why if step == 1 else f"step {step}: {why}", n))
        return out

    def record(self, broken: list[Broken]) -> dict:
        """summary.json's `health`."""
        return {
            "checked": [i.name for i in INVARIANTS if self.ctx.applies(i.name)],
            "steps": self.steps,
            "broken": [{"name": b.name, "evidence": b.evidence, "steps": b.steps} for b in broken],
            "warned": {name: {"step": s, "evidence": why} for name, (s, why) in self.first.items()},
        }


def of_rows(rows: Iterable[Mapping], cfg: Any, needs: Optional[Mapping] = None) -> Health:
    """A run's health from its rows (metrics.jsonl), config and its estimator's needs (`Context.of`), without
    warnings."""
    h = Health(Context.of(cfg, needs))
    for row in rows:
        h.check(row)
    return h


class UnhealthyRun(RuntimeError):
    """A run that broke an invariant at every step: recorded as failed (summary.json `health`), exit status 1."""


def reason(broken: list[Broken]) -> str:
    """The one line summary.json's `error` and the closing line give for an unhealthy run."""
    text = "; ".join(b.line() for b in broken)
    hint = ""
    if any(b.name == "no_learning_signal" for b in broken):
        hint = (
            ". If reward/mean is 0 at every step no sample solved a task (or 1: every sample did): a result about "
            "this model and task, not a fault; docs/metrics.md, 'Run health'"
        )
    return f"unhealthy run: {text}{hint}"
