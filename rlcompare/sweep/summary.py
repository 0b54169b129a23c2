"""What a sweep says and records: the member table, the plan and the dry run's commands, sweep.yaml (the file
as given, the members' overrides and diffs, each run's status), and the outcome after the runs."""

from __future__ import annotations

import datetime as _dt
import os
from pathlib import Path
from typing import Any, Optional

import yaml
from rlcompare.config.components import component_prefixes
from rlcompare.sweep.jobs import run_dir
from rlcompare.sweep.launch import _shell, train_command
from rlcompare.sweep.resolve import Member
from rlcompare.sweep.spec import _MISSING, SweepSpec, _fmt


def _comp_text(m: Member) -> str:
    return "-" if not m.component else ",".join(m.component)


def member_table(spec: SweepSpec, members: list[Member]) -> str:
    """label, component, reference, the member's own overrides (one a line) and the keys that differ."""
    header = ["label", "component", "reference", "overrides", "differs from reference"]
    rows = []
    for m in members:
        own = list(m.own_overrides) or ["(none)"]
        if spec.mode == "ladder" and m.reference not in (None, spec.base.label):
            own = ["+ " + o for o in own]
        diffs = [f"{k}: {_fmt(a)} -> {_fmt(b)}" for k, a, b in m.diff] or ["-"]
        rows.append(([m.name], [_comp_text(m)], [m.reference or "-"], own, diffs))
    widths = [max([len(header[i])] + [len(x) for r in rows for x in r[i]]) for i in range(4)]
    out = [
        "  ".join(h.ljust(widths[i]) for i, h in enumerate(header[:4])) + "  " + header[4],
        "  ".join("-" * w for w in widths) + "  " + "-" * len(header[4]),
    ]
    for r in rows:
        for j in range(max(len(c) for c in r)):
            cells = [c[j] if j < len(c) else "" for c in r]
            out.append(("  ".join(cells[i].ljust(widths[i]) for i in range(4)) + "  " + cells[4]).rstrip())
    return "\n".join(out)


def _literal_str(dumper, data):
    if "\n" in data:
        return dumper.represent_scalar("tag:yaml.org,2002:str", data, style="|")
    return dumper.represent_scalar("tag:yaml.org,2002:str", data)


class _Dumper(yaml.SafeDumper):
    pass


_Dumper.add_representer(str, _literal_str)


def write_record(
    root: Path,
    spec: SweepSpec,
    members: list[Member],
    extra: list[str],
    argv: list[str],
    runs: Optional[dict] = None,
    created: Optional[str] = None,
) -> Path:
    """<root>/sweep.yaml: the file as given, resolved member overrides and diffs, extra overrides, timestamps,
    and (at the end) each run's status."""
    rec = {
        "name": spec.name,
        "question": spec.question,
        "mode": spec.mode,
        "seeds": spec.seeds,
        "source": str(spec.path) if spec.path else None,
        "created": created or _now(),
        "command": "rlcompare sweep " + " ".join(argv),
        "extra_overrides": list(extra),
        "members": [
            {
                "label": m.name,
                "reference": m.reference,
                "component": m.component,
                "component_keys": component_prefixes(m.component) if m.component else [],
                "own_overrides": m.own_overrides,
                "overrides": m.overrides,
                "differs": [{"key": k, "reference": _plain(a), "value": _plain(b)} for k, a, b in m.diff],
            }
            for m in members
        ],
        "file": spec.text,
    }
    if runs is not None:
        rec["finished"] = _now()
        rec["runs"] = runs
    root.mkdir(parents=True, exist_ok=True)
    out = root / "sweep.yaml"
    tmp = root / ".sweep.yaml.tmp"
    tmp.write_text(yaml.dump(rec, Dumper=_Dumper, sort_keys=False, allow_unicode=True, width=120))
    os.replace(tmp, out)
    return out


def _now() -> str:
    return _dt.datetime.now().astimezone().isoformat(timespec="seconds")


def _plain(v: Any) -> Any:
    return "<absent>" if v is _MISSING else v


def _runs_record(
    root: Path, members: list[Member], seeds: list[int], settled: dict, existing: dict, interrupted: bool = False
) -> dict[str, dict]:
    """{label: {seed: result}} for sweep.yaml: this launch's results, and runs kept from an earlier one (an
    interrupted sweep records only the runs it settled)."""
    runs: dict[str, dict] = {}
    for m in members:
        for s in seeds:
            if (m.name, s) in settled:
                res = settled[(m.name, s)]
            elif existing.get((m.name, s)) == "completed":
                res = {
                    "status": "completed",
                    "error": None,
                    "dir": str(run_dir(root, m.name, s)),
                    "note": "kept from an earlier launch",
                }
            elif interrupted:
                continue
            else:  # run_jobs settles every job it is given
                raise AssertionError(f"{m.name}__s{s} was neither run nor kept")
            runs.setdefault(m.name, {})[str(s)] = res
    return runs


def _print_plan(spec: SweepSpec, members: list[Member], extra: list[str], root: Path, n_runs: int, out) -> None:
    """The sweep's size, question, extra overrides, results folder and member table."""
    print(
        f"sweep {spec.name} ({spec.mode}, {len(members)} members x {len(spec.seeds)} seeds = {n_runs} runs; "
        f"seeds {', '.join(map(str, spec.seeds))})" + (f"\nquestion: {spec.question}" if spec.question else ""),
        file=out,
    )
    if extra:
        print(f"extra overrides (all members): {' '.join(extra)}", file=out)
    print(f"results: {root}/<label>__s<seed>/\n", file=out)
    print(member_table(spec, members), file=out)


def _print_dry_run(
    spec: SweepSpec, members: list[Member], hydra_extra: list[str], launcher: str, n_runs: int, out
) -> None:
    print(f"\nthe {n_runs} runs are the jobs of one Hydra multirun ({launcher}); member by member they are:", file=out)
    for m in members:
        print("  " + _shell(train_command(spec, m, spec.seeds, hydra_extra)), file=out)
    print("\none-change check passed; nothing was run (--dry-run)", file=out)


def _print_outcome(spec: SweepSpec, root: Path, runs: dict[str, dict], n_runs: int, out) -> int:
    """How many runs completed, the failed ones with their errors, the report command; the exit code."""
    failed = [(lb, int(s), r["error"]) for lb, rs in runs.items() for s, r in rs.items() if r["status"] != "completed"]
    done = sum(1 for rs in runs.values() for r in rs.values() if r["status"] == "completed")
    print(f"\nsweep {spec.name}: {done} of {n_runs} runs completed; definition in {root / 'sweep.yaml'}", file=out)
    if failed:
        print(f"failed members ({len({f[0] for f in failed})}):", file=out)
        for lb, s, err in failed:
            print(f"  - {lb} (seed {s}): {err}", file=out)
    print(f"build the report with:\n  rlcompare report {root}", file=out)
    return 1 if failed else 0
