"""Degenerate runs in a report: runs that broke a run-health invariant at every step (rlcompare.health)
are named by arm (`✗ degenerate`) and left out of the statistics, except those a user kept with
trainer.unhealthy=warn (compared, still flagged).

A run made since run health records it in summary.json (`health.broken`, status failed). A run folder from before
(status completed) is checked here again from its own rows and config.yaml, with the same checks, so an arm that
learned nothing is caught whichever version wrote it.
"""

from __future__ import annotations

import math

from rlcompare.report.load import Run
from rlcompare import health
from rlcompare.config import estimator_needs


def _rows(r: Run) -> list[dict]:
    """metrics.jsonl's rows as the run wrote them (the frame's NaN fill of keys a row lacked taken out)."""
    if r.metrics is None or r.metrics.empty:
        return []
    records = r.metrics.to_dict("records")
    return [{k: v for k, v in rec.items() if not (isinstance(v, float) and math.isnan(v))} for rec in records]


def _recorded(r: Run) -> list[str]:
    broken = ((r.summary or {}).get("health") or {}).get("broken") if isinstance(r.summary, dict) else None
    if not isinstance(broken, list):
        return []
    return [f"{b.get('name')}: {b.get('evidence')}" for b in broken if isinstance(b, dict)]


def mark_degenerate(runs: list[Run]) -> None:
    """Fill each run's `degenerate` (the invariants it broke: recorded, or found in a completed run's rows). A run
    that ended failed on one is left out as failed; one that completed under trainer.unhealthy=warn (the user's
    choice) is compared and flagged; one from before run health found degenerate in its rows is left out."""
    for r in runs:
        r.degenerate = _recorded(r)
        if r.status != "completed":
            continue
        if r.degenerate:  # completed under trainer.unhealthy=warn: the user kept it, so it is compared and flagged
            continue
        try:
            cfg = r.config or {}
            verdict = health.of_rows(_rows(r), cfg, estimator_needs(cfg.get("algorithm"))).verdict(_counters(r))
        except (TypeError, ValueError):  # a malformed row or config: the other checks of the report say so
            continue
        if verdict:
            r.degenerate = [f"{b.name}: {b.evidence}" for b in verdict]
            r.status = "failed"
            r.error = "degenerate (re-checked by the report): " + health.reason(verdict)


def _counters(r: Run) -> dict | None:
    s = r.summary if isinstance(r.summary, dict) else {}
    applied, skipped = s.get("optim/applied_updates"), s.get("optim/skipped_updates")
    if isinstance(applied, int) and isinstance(skipped, int):
        return {"applied_updates": applied, "skipped_updates": skipped}
    return None


def degenerate_flag(runs: list[Run]) -> str | None:
    """The flag naming each arm with degenerate runs, and the runs, with what each broke."""
    bad = [r for r in runs if r.degenerate]
    if not bad:
        return None
    arms: dict[str, list[Run]] = {}
    for r in bad:
        arms.setdefault(r.variant or "?", []).append(r)
    parts = [
        f"arm `{arm}`: " + "; ".join(f"`{r.name}` ({', '.join(r.degenerate)})" for r in rs) for arm, rs in arms.items()
    ]
    return (
        f"**✗ degenerate: {len(bad)} run(s)** broke a run-health invariant at every step (excluded from "
        f"statistics unless it completed under trainer.unhealthy=warn; docs/metrics.md, 'Run health'): "
        + " | ".join(parts)
    )
