"""Sweeps: a sweep file read and checked (`spec.py`), its members composed and put through the one-change check
(`resolve.py`), their jobs launched as one Hydra multirun (`launch.py`) and settled (`jobs.py`), what the sweep
prints and records (`summary.py`), `rlcompare sweep` itself (`run.py`).

`from rlcompare.sweep import ...` keeps working: the public names of those modules are re-exported here (the
package was one module, `rlcompare/sweep.py`, then `sweep/runner.py`); `python -m rlcompare.sweep` runs
`__main__.py`. Monkeypatch a name in the module that holds it (`rlcompare.sweep.launch.launch_jobs`).
"""

from rlcompare.config.components import COMPONENTS, component_prefixes
from rlcompare.sweep.jobs import run_dir, run_jobs
from rlcompare.sweep.launch import (
    JOBS_FILE,
    Job,
    check_launch_settings,
    job_batch,
    launch_command,
    launch_jobs,
    read_jobs_file,
    train_command,
)
from rlcompare.sweep.resolve import Member, check_one_change, prepare, resolve_members, split_extra
from rlcompare.sweep.run import main, run_sweep
from rlcompare.sweep.spec import (
    IGNORED_KEYS,
    MODES,
    SweepError,
    SweepSpec,
    VariantSpec,
    find_sweep_file,
    load_sweep,
    parse_sweep,
)
from rlcompare.sweep.summary import member_table, write_record

__all__ = [
    "COMPONENTS",
    "IGNORED_KEYS",
    "JOBS_FILE",
    "MODES",
    "Job",
    "Member",
    "SweepError",
    "SweepSpec",
    "VariantSpec",
    "check_launch_settings",
    "check_one_change",
    "component_prefixes",
    "find_sweep_file",
    "job_batch",
    "launch_command",
    "launch_jobs",
    "load_sweep",
    "main",
    "member_table",
    "parse_sweep",
    "prepare",
    "read_jobs_file",
    "resolve_members",
    "run_dir",
    "run_jobs",
    "run_sweep",
    "split_extra",
    "train_command",
    "write_record",
]
