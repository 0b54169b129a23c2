"""`hydra/sweeper=rlcompare_jobs`: launch an explicit list of jobs, each with its own overrides, as one batch of the
configured launcher (joblib, submitit, Ray, ...), so that a launcher with N workers runs N of them at once.

`rlcompare sweep` needs this: its jobs are members x seeds, and members differ in whole override sets, which the
basic sweeper's cartesian product cannot express. The list is a YAML file written by `rlcompare sweep`
(`hydra.sweeper.jobs_file=<path>`, `jobs: [[override, ...], ...]`); overrides given on the command line apply to
every job, a job's own override of the same key winning. Like Hydra's basic sweeper, a job that raises does not
stop the others and the first failure is raised once every job has returned.

Plugin classes must live under the `hydra_plugins` namespace for Hydra to instantiate them; the rest is in rlcompare.
"""

# no `from __future__ import annotations`: Hydra imports plugin modules outside sys.modules, where dataclass
# cannot resolve string annotations
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, List, Optional

from hydra.core.config_store import ConfigStore
from hydra.core.plugins import Plugins
from hydra.plugins.sweeper import Sweeper
from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig, OmegaConf


@dataclass
class JobListSweeperConf:
    _target_: str = "hydra_plugins.rlcompare_sweeper.JobListSweeper"
    jobs_file: Optional[str] = None


ConfigStore.instance().store(
    group="hydra/sweeper", name="rlcompare_jobs", node=JobListSweeperConf, provider="rlcompare"
)


def register() -> None:
    """Make this sweeper known to Hydra in this process (`rlcompare train` and `rlcompare sweep` call it first).
    Hydra finds plugins by listing the `hydra_plugins` folders on sys.path, and an editable install lists none
    of rlcompare's: setuptools' import hook maps `hydra_plugins.rlcompare_sweeper` by name, which pkgutil cannot
    list. Without this, `rlcompare sweep` worked only with `python -m` from the checkout's folder. Importing this
    module has stored the config node; `Plugins.register` adds the class (a no-op when the scan found it)."""
    Plugins.instance().register(JobListSweeper)


class JobListSweeper(Sweeper):
    def __init__(self, jobs_file: Optional[str] = None) -> None:
        self.jobs_file = jobs_file
        self.config: Optional[DictConfig] = None
        self.launcher = None
        self.hydra_context: Optional[HydraContext] = None

    def setup(self, *, hydra_context: HydraContext, task_function: TaskFunction, config: DictConfig) -> None:
        from rlcompare.sweep.launch import STOP_FILE, UnlessInterrupted

        self.config = config
        self.hydra_context = hydra_context
        if self.jobs_file:  # the sweep's folder: a job taken up after the sweep was interrupted is not started
            task_function = UnlessInterrupted(task_function, str(Path(self.jobs_file).parent / STOP_FILE))
        self.launcher = Plugins.instance().instantiate_launcher(
            hydra_context=hydra_context, task_function=task_function, config=config
        )

    def sweep(self, arguments: List[str]) -> Any:
        from rlcompare.config.user_modules import import_modules_in_overrides
        from rlcompare.train.placement import LAUNCH_JOBS_ENV
        from rlcompare.sweep.launch import job_batch, read_jobs_file

        assert self.config is not None and self.launcher is not None
        batch = job_batch(arguments, read_jobs_file(self.jobs_file))
        # a plug-in surrogate's knobs are config keys once its module is imported (the launcher's workers get this
        # process's config store); `rlcompare sweep` imported them before it composed the members
        import_modules_in_overrides([o for job in batch for o in job])
        sweep_dir = Path(str(self.config.hydra.sweep.dir))
        sweep_dir.mkdir(parents=True, exist_ok=True)
        OmegaConf.save(self.config, sweep_dir / "multirun.yaml")
        # no validate_batch_is_legal: `rlcompare sweep` composed and checked every member before writing the list
        # (resolve_members), and composing every job again here cost 0.15 s a job before the first one started
        os.environ[LAUNCH_JOBS_ENV] = str(len(batch))  # inherited by the launcher's workers (rlcompare.train.placement)
        results = self.launcher.launch(batch, initial_job_idx=0)
        for r in results:
            _ = r.return_value  # raises the first job's failure, as Hydra's basic sweeper does
        return [results]
