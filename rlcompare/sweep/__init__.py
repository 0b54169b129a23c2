"""Sweeps: sweep files, the one-change check, the multirun launch (`runner.py`).

`from rlcompare.sweep import ...` keeps working: every public name of `runner.py` is re-exported here (the module
was `rlcompare/sweep.py`); `python -m rlcompare.sweep` runs `__main__.py`.
"""

from rlcompare.sweep.runner import *  # noqa: F401,F403 - the old import path
from rlcompare.sweep.runner import (  # noqa: F401 - public too, outside its __all__
    JOBS_FILE,
    MODES,
    check_launch_settings,
    find_sweep_file,
    job_batch,
    launch_command,
    launch_jobs,
    member_table,
    parse_sweep,
    prepare,
    read_jobs_file,
    run_dir,
    split_extra,
    train_command,
    write_record,
)
