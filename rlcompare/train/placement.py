"""Where one job of a Hydra multirun runs: its CPU threads and its CUDA device (docs/scaling.md, "The device rule").

A job shares its machine with the jobs of its launch that run at the same time (`concurrent_jobs`, read from the
launcher's settings and the number of jobs launched):

- threads: `trainer.threads` when set; else the job's own CPU allocation when the launcher gives one
  (submitit's `cpus_per_task`); else, when jobs run concurrently, cores ÷ concurrent jobs (at least 1), cores being
  the CPUs this process may run on; else torch's default (a serial multirun is unchanged);
- CUDA: when the process sees more than one device and jobs run concurrently, each worker process claims a device
  of its own, the first free one from (job number mod device count) on, through an exclusive lock per device that
  it holds until it exits (a worker that runs several jobs keeps its device); when every device is claimed, job
  number mod device count. Launchers that give each job its own GPUs (SLURM, Ray, submitit's local executor)
  show it one device, and nothing is changed.

`place_job(cfg)` applies the rule inside a job; `rlcompare train -m` and `rlcompare sweep` both go through it.
`wandb_grouping` says how W&B groups a job's run (group, job type, tags), so that seeds aggregate per variant.
"""

from __future__ import annotations

import os
import re
import sys
import tempfile
from pathlib import Path
from typing import Any, Callable, Optional

# jobs in the launch this job belongs to; set by the launching process (hydra_plugins.rlcompare_sweeper for
# `rlcompare sweep`, `note_multirun_jobs` for `rlcompare train -m`) and inherited by every job it starts
LAUNCH_JOBS_ENV = "RLCOMPARE_LAUNCH_JOBS"

_LOCK_DIR = "rlcompare-cuda-locks"
_claimed: dict[str, Any] = {}  # this process's device claim: {"index": k, "file": open lock file}


# ----------------------------------------------------------------------------- the rule (pure)
def cpu_cores() -> int:
    """CPUs this process may run on (its affinity mask: a container's or a batch job's share, not the machine's)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def joblib_workers(n_jobs: Any, cores: int) -> int:
    """joblib's worker count for `n_jobs`: None -> 1, -1 -> every core, -k -> cores + 1 - k (joblib's rule)."""
    if n_jobs is None:
        return 1
    n = int(n_jobs)
    if n < 0:
        return max(1, cores + 1 + n)
    return max(1, n)


def _launcher_kind(launcher: Optional[dict]) -> str:
    target = str((launcher or {}).get("_target_") or "")
    if target.endswith("JoblibLauncher"):
        return "joblib"
    if target.endswith("submitit_launcher.LocalLauncher"):
        return "submitit_local"
    if target.endswith("submitit_launcher.SlurmLauncher"):
        return "submitit_slurm"
    if "ray_launcher" in target:
        return "ray"
    if target.endswith("BasicLauncher") or not target:
        return "basic"
    return "other"


def concurrent_jobs(launcher: Optional[dict], launched: Optional[int], cores: int) -> int:
    """How many jobs of the launch run on this machine at the same time as this one (itself included)."""
    kind = _launcher_kind(launcher)
    n = launched if launched and launched > 0 else None
    if kind == "joblib":
        workers = joblib_workers((launcher or {}).get("n_jobs"), cores)
        return min(workers, n) if n else workers
    if kind in ("submitit_local", "other"):
        return n or 1  # submitit's local executor starts every job of a launch at once; so may an unknown launcher
    # basic: one job at a time; SLURM and Ray: each job has its own allocation (cores, CUDA_VISIBLE_DEVICES)
    return 1


def job_cpus(launcher: Optional[dict]) -> Optional[int]:
    """The CPUs the launcher allocates to each job, where it says (submitit's cpus_per_task)."""
    if _launcher_kind(launcher) in ("submitit_local", "submitit_slurm"):
        cpus = (launcher or {}).get("cpus_per_task")
        return int(cpus) if cpus else None
    return None


def job_threads(explicit: Optional[int], cores: int, concurrent: int, allocated: Optional[int] = None) -> Optional[int]:
    """trainer.threads for a job: the explicit setting, else its allocation, else cores ÷ concurrent jobs when
    jobs share the machine; None leaves torch's default."""
    if explicit:
        return int(explicit)
    if allocated:
        return int(allocated)
    if concurrent > 1:
        return max(1, cores // concurrent)
    return None


def device_order(job_num: int, n_devices: int) -> list[int]:
    """Devices a job tries, in order: job number mod device count first, then the next ones round the ring."""
    first = job_num % n_devices
    return [(first + i) % n_devices for i in range(n_devices)]


def choose_device(job_num: int, n_devices: int, try_claim: Callable[[int], bool]) -> tuple[int, bool]:
    """(device index, claimed): the first device of `device_order` that `try_claim` gets; when every device is
    taken, job number mod device count, unclaimed (jobs then share a device)."""
    for k in device_order(job_num, n_devices):
        if try_claim(k):
            return k, True
    return job_num % n_devices, False


# ----------------------------------------------------------------------------- device locks
def _device_names(n_devices: int) -> list[str]:
    """Names that identify the visible devices machine-wide: CUDA_VISIBLE_DEVICES' entries, else their indices."""
    visible = [v.strip() for v in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if v.strip()]
    names = visible if len(visible) >= n_devices else [str(k) for k in range(n_devices)]
    return [re.sub(r"[^A-Za-z0-9._-]", "_", n) for n in names[:n_devices]]


def lock_dir() -> Path:
    """Machine-local (not under results_dir, which may be shared between nodes)."""
    return Path(os.environ.get("RLCOMPARE_LOCK_DIR") or Path(tempfile.gettempdir()) / _LOCK_DIR)


def try_lock(path: Path):
    """An open file holding an exclusive flock on `path`, or None when another process holds it."""
    import fcntl

    path.parent.mkdir(parents=True, exist_ok=True)
    f = open(path, "a")
    try:
        fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        f.close()
        return None
    return f


def claim_cuda_device(job_num: int, n_devices: int) -> tuple[int, bool]:
    """This process's device (claimed once, kept for the process's later jobs); see the module docstring."""
    if "index" in _claimed and _claimed["index"] < n_devices:
        return _claimed["index"], _claimed.get("file") is not None
    names = _device_names(n_devices)

    def attempt(k: int) -> bool:
        f = try_lock(lock_dir() / f"cuda-{names[k]}.lock")
        if f is not None:
            _claimed["file"] = f  # kept open: the lock lasts as long as this process
        return f is not None

    k, claimed = choose_device(job_num, n_devices, attempt)
    _claimed["index"] = k
    return k, claimed


# ----------------------------------------------------------------------------- applying it in a job
def launched_jobs() -> Optional[int]:
    try:
        n = int(os.environ.get(LAUNCH_JOBS_ENV, ""))
    except ValueError:
        return None
    return n if n > 0 else None


def _multirun_job() -> Optional[tuple[dict, int]]:
    """(launcher settings, job number) when this process runs a job of a Hydra multirun, else None."""
    try:
        from hydra.core.hydra_config import HydraConfig
        from hydra.types import RunMode
        from omegaconf import OmegaConf

        if not HydraConfig.initialized():
            return None
        hc = HydraConfig.get()
        if hc.mode != RunMode.MULTIRUN:
            return None
        launcher = OmegaConf.to_container(hc.launcher, resolve=True) if hc.launcher is not None else {}
        return launcher, int(hc.job.num or 0)
    except Exception:  # noqa: BLE001 - outside Hydra, or an older Hydra: place nothing
        return None


def multirun_launcher() -> Optional[str]:
    """The kind of Hydra launcher running this multirun job (joblib, submitit_local, ...); None outside a multirun."""
    job = _multirun_job()
    return None if job is None else _launcher_kind(job[0])


def place_job(cfg):
    """Inside a multirun job: set trainer.threads (when unset) and the CUDA device by the rule above; returns cfg.
    Outside a multirun, cfg is returned untouched."""
    job = _multirun_job()
    if job is None:
        return cfg
    launcher, job_num = job
    stop_on_preempt_signal()
    cores = cpu_cores()
    concurrent = concurrent_jobs(launcher, launched_jobs(), cores)
    threads = job_threads(cfg.trainer.threads, cores, concurrent, job_cpus(launcher))
    if threads is not None and not cfg.trainer.threads:
        from omegaconf import OmegaConf

        OmegaConf.update(cfg, "trainer.threads", threads, merge=False)
    where = f"{threads} CPU thread(s)" if threads else "torch's default threads"
    if concurrent > 1 and str(cfg.device) in ("auto", "cuda"):
        where += _place_on_cuda(job_num)
    print(f"[rlcompare] job {job_num}: {concurrent} concurrent job(s) on this machine; {where}", file=sys.stderr)
    return cfg


def stop_on_preempt_signal() -> Optional[str]:
    """Under submitit (SUBMITIT_EXECUTOR set), its pre-timeout signal (SUBMITIT_PREEMPT_SIGNAL, USR2 by default)
    becomes a SIGTERM to this process, which the run handles as a preemption: the step in flight finishes, a
    checkpoint is saved (checkpointing on), and it ends with its closing line. submitit's own handler exited from
    inside a step (its local executor's requeue: `SystemExit: 144`), with no checkpoint. Returns the signal's name."""
    import signal
    import threading

    if "SUBMITIT_EXECUTOR" not in os.environ or threading.current_thread() is not threading.main_thread():
        return None
    name = "SIG" + os.environ.get("SUBMITIT_PREEMPT_SIGNAL", "USR2").upper().removeprefix("SIG")
    sig = getattr(signal, name, None)
    if not isinstance(sig, signal.Signals) or sig == signal.SIGTERM:
        return None

    def to_sigterm(signum, frame):
        print(
            f"[rlcompare] {name} from submitit: the job's time limit is near; stopping after this step (with a "
            f"checkpoint when trainer.checkpoint_every is on), as on SIGTERM",
            file=sys.stderr,
            flush=True,
        )
        os.kill(os.getpid(), signal.SIGTERM)

    signal.signal(sig, to_sigterm)
    return name


def _place_on_cuda(job_num: int) -> str:
    import torch

    if not torch.cuda.is_available() or torch.cuda.device_count() < 2:
        return ""
    k, claimed = claim_cuda_device(job_num, torch.cuda.device_count())
    torch.cuda.set_device(k)  # device "cuda" now means cuda:k for everything this job builds
    return f", cuda:{k}" + ("" if claimed else " (shared: every device is claimed by another job)")


def note_multirun_jobs(argv: list[str]) -> None:
    """`rlcompare train -m ...` with Hydra's basic sweeper: record how many jobs the command line makes, so that its
    jobs can split the machine (LAUNCH_JOBS_ENV). Nothing is set for another sweeper or an unparsable line."""
    if not any(a in ("-m", "--multirun") for a in argv):
        return
    if any(a.startswith("hydra/sweeper=") for a in argv):
        return  # another sweeper counts its own jobs (rlcompare_jobs sets LAUNCH_JOBS_ENV itself)
    try:
        from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
        from hydra.core.override_parser.overrides_parser import OverridesParser

        args = [a for a in argv if "=" in a and not a.startswith("-") and not a.lstrip("+~").startswith("hydra")]
        batches = BasicSweeper.split_arguments(OverridesParser.create().parse_overrides(args), None)
        os.environ[LAUNCH_JOBS_ENV] = str(sum(len(b) for b in batches))
    except Exception:  # noqa: BLE001 - glob() or anything the plain parser cannot expand: leave it to the launcher
        return


# ----------------------------------------------------------------------------- W&B grouping
WANDB_MAX_CHARS = 64  # W&B refuses tags (and job types) longer than this


def _cut(text: str, limit: int = WANDB_MAX_CHARS) -> str:
    if len(text) <= limit:
        return text
    import hashlib

    return text[: limit - 9] + "~" + hashlib.sha1(text.encode()).hexdigest()[:8]


def wandb_grouping(group: Optional[str], config: dict, run_name: str) -> dict:
    """W&B's group / job_type / tags for a run, so that its UI aggregates seeds per variant (docs/scaling.md):
    group = logger.group, else the sweep's name, else the experiment; job_type = the sweep's variant, else the run
    name without its seed (`dapo__trainer.lr=1e-05__s2` -> `dapo__trainer.lr=1e-05`); tags = the component's
    config keys (`algorithm.clip`), `base` for a sweep's base, none outside a sweep."""
    sweep = config.get("sweep") or {}
    variant = sweep.get("variant")
    job_type = variant or re.sub(r"__s-?\d+(-\d+)?$", "", run_name)
    if not sweep.get("name"):
        tags: list[str] = []
    elif sweep.get("component"):
        tags = [c.strip() for c in str(sweep["component"]).split(",") if c.strip()]
    else:
        tags = ["base"]
    return {
        "group": group or sweep.get("name") or config.get("experiment"),
        "job_type": _cut(str(job_type)),
        "tags": [_cut(t) for t in tags],
    }
