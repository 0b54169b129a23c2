"""`train(cfg)`: one run from config to results/ (and W&B), with budget, evals, checkpoints and failure capture.

Order of work, so that a bad setting fails in seconds with one message naming the key:

1. `validate(cfg)`: schema (unknown keys, types), values, combinations, results_dir writable;
2. the run folder: locked for this process (`run_lock`: one writer per folder; a live writer is named), resume
   checks (a differing config names the keys; resume=true under a derived name that matches no run but a run of
   the same preset and seed names how they differ), an occupied folder is refused, the checkpoint to resume
   from is read (none usable: refused);
3. `preflight`: builds the prompt set (missing file or field), the verifier (unknown name), reads the model's
   context length from its config.json (hf) without loading weights, probes the verifier with a few of the prompt
   set's reference answers written as correct completions (rlcompare.train.verifier_probe), checks the run folder is
   writable;
4. only then the heavy part: `Trainer(...)` (warm start, model load) and the loop.

Failure capture: summary.json says "running" from the start, "completed" at the end, "failed" (with the error)
on any exception, and on SIGTERM (preemption): with checkpointing on, the step in flight finishes, a checkpoint is
saved, and the process exits 143; without it, it stops at once. Rows already written stay readable.

Resume (`resume=true` with the same overrides, or `resume=<run dir>`): `rlcompare.train.resume` checks the
folder and the config, reads the checkpoint before the model loads and loads it after. summary.json's counters are
those of the last row written to metrics.jsonl, so the two agree however the run stops.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import shlex
import signal
import sys
import threading
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from rlcompare.config import operational
from rlcompare import health
from rlcompare.train import checkpoint, provenance, resume, run_lock
from rlcompare.train.failure import PluginFailed, plugin_failure
from rlcompare.train.export import export_final
from rlcompare.train.inputs import check_teacher_loaded, external_inputs
from rlcompare.train.parallel import World, init_world
from rlcompare.config import ConfigError, check_fits_context, context_from, estimator_needs, validate, why_not_creatable
from rlcompare.train.env_room import check_env_room
from rlcompare.train.tracking import (
    ConsoleLog,
    NullLogger,
    RunWriter,
    WandbLogger,
    atomic_write_json,
    atomic_write_text,
    read_jsonl,
)

FINGERPRINT_SAMPLING_KEYS = ("temperature", "top_p")
SIGTERM_ERROR = "terminated (SIGTERM)"
SIGTERM_EXIT = 143  # 128 + SIGTERM, what a shell reports for a process killed by SIGTERM
SIGINT_ERROR = "interrupted (Ctrl-C)"
SIGINT_EXIT = 130  # 128 + SIGINT
INTERRUPTED = "interrupted"  # summary.json's status after a Ctrl-C: no error, the user stopped it


class Terminated(SystemExit):
    """SIGTERM (e.g. preemption): the run recorded its state (summary failed, a checkpoint when on) and exits 143.

    A SystemExit, so Hydra and the CLI pass it through and the process exits with that status."""

    status, error, exit_code, by = "failed", SIGTERM_ERROR, SIGTERM_EXIT, "SIGTERM"

    def __init__(self, checkpoint_step: int | None = None):
        super().__init__(self.exit_code)
        self.checkpoint_step = checkpoint_step
        self.run_dir: Path | None = None  # set by the run that stopped

    def __str__(self) -> str:
        return self.error

    def closing_line(self) -> str:
        """The one line the CLI prints (stdout): where the run stopped and the command that continues it."""
        where = f"{self.run_dir.name}: " if self.run_dir is not None else ""
        again = f"rlcompare train resume={shlex.quote(shown_path(self.run_dir))}" if self.run_dir else "resume=true"
        if self.checkpoint_step is not None:
            return f"[rlcompare] {where}stopped by {self.by} after step {self.checkpoint_step} (checkpoint saved); continue with: {again}"
        return (
            f"[rlcompare] {where}stopped by {self.by}; continue with: {again} (from its newest checkpoint, else step 0)"
        )


class Interrupted(Terminated):
    """Ctrl-C (SIGINT): handled as SIGTERM is (the step in flight finishes and is checkpointed when checkpointing is
    on, one closing line with the command that continues), but summary.json says "interrupted" and it exits 130."""

    status, error, exit_code, by = INTERRUPTED, SIGINT_ERROR, SIGINT_EXIT, "Ctrl-C"


STOPS = {signal.SIGTERM: Terminated, signal.SIGINT: Interrupted}  # the signals a run stops on, and how


def fingerprint(cfg: DictConfig, tr, used: dict | None = None) -> dict:
    """What compared runs must share: initial weights, prompts and split, verifier, budget, sampling, eval, and
    `used`, the external inputs (`rlcompare.train.inputs`: the teacher, plug-in modules), when there are any."""
    c = OmegaConf.to_container(cfg, resolve=True)
    prompts = _computing(c, "prompts")
    prompts.update(
        n_train_used=len(tr.train_prompts), n_eval_used=len(tr.eval_prompts), eval_hash=tr.splits.eval_hash()
    )
    return {
        "init_weights_hash": tr.policy.init_hash,
        "warm_start_key": tr.policy.warm_start_key,
        "model": tr.policy.source if c["model"]["kind"] == "hf" else c["model"]["name"],
        "prompts": prompts,
        # operational keys (verifier.probe, rollout.kv_cache, ...) never change what is computed: runs that differ
        # only there compare
        "verifier": _computing(c, "verifier"),
        "budget": _computing(c, "budget"),
        "sampling": {
            **_computing(c, "rollout"),
            "group_size": c["trainer"]["group_size"],
            "prompts_per_step": c["trainer"]["prompts_per_step"],
            "dynamic_sampling": c["algorithm"]["dynamic_sampling"],
        },
        # how the held-out prompts are decoded: greedy or sampled, with which settings and eval seed (arXiv
        # 2504.07086: decoding settings move scores as much as algorithms do)
        "eval": _computing(c, "eval"),
        # multi-turn episodes (issue 51): only when an environment is set, so single-turn fingerprints stay as they were
        **({"env": _computing(c, "env")} if c.get("env", {}).get("name", "none") != "none" else {}),
        # what changes the run beyond its config, keyed by the config key naming it; only when there is any, so
        # that a run without a teacher or plug-in has the fingerprint it had
        **({"inputs": used} if used else {}),
    }


def _computing(c: dict, section: str) -> dict:
    """One config section without its operational keys (rlcompare.config.operational)."""
    return {k: v for k, v in c[section].items() if not operational.is_operational(f"{section}.{k}")}


# ----------------------------------------------------------------------------- preflight
def model_context_length(cfg: DictConfig) -> int | None:
    """The model's context (positions) from its config alone, without loading weights; None when unknown.

    tiny: model.max_position_embeddings. hf: config.json of the local folder, or AutoConfig for a hub id
    (from the local HF cache when offline). A name that resolves to nothing is a ConfigError."""
    m = cfg.model
    if m.kind == "tiny":
        return int(m.max_position_embeddings)
    from rlcompare.config.model_source import gguf_context_length, gguf_file_of, model_folder, no_config_hint

    path = model_folder(m)
    if gguf_file_of(m) is not None:
        return gguf_context_length(m)
    if os.path.isdir(path):
        cfg_file = Path(path) / "config.json"
        if not cfg_file.exists():
            if (Path(path) / "adapter_config.json").exists():
                return None  # a PEFT adapter folder: the base model's context is checked after loading
            raise ConfigError(
                f"model.name_or_path={path!r} is a folder without config.json; point it at a saved "
                f"model (save_pretrained output) or a hub id{no_config_hint(path)}"
            )
        try:
            return context_from(json.loads(cfg_file.read_text()))
        except (OSError, ValueError) as e:
            raise ConfigError(f"model.name_or_path={path!r}: config.json could not be read ({e})") from None
    if os.path.exists(path):
        raise ConfigError(f"model.name_or_path={path!r} is a file; give a model folder or a hub id")
    try:
        from transformers import AutoConfig

        conf = AutoConfig.from_pretrained(path, trust_remote_code=bool(m.trust_remote_code))
    except Exception as e:  # noqa: BLE001 - not found, offline without a cache, gated, ...
        raise ConfigError(
            f"model.name_or_path={path!r} could not be resolved (not a local folder, and its config "
            f"could not be fetched from the hub or the local cache): {type(e).__name__}: {str(e)[:300]}"
        ) from None
    return context_from(conf.to_dict())


def _check_writable(path: Path, what: str) -> None:
    why = why_not_creatable(str(path))  # the one writability check (rlcompare.config), as validate's for results_dir
    if why is not None:
        raise ConfigError(
            f"{what} {str(path)!r} is not writable ({why}); choose a folder you can write, e.g. results_dir=./results"
        )


def _resolved_device(name: str) -> str:
    """`device=auto` as the trainer resolves it (`build.pick_device`: cuda when one is visible)."""
    import torch

    return ("cuda" if torch.cuda.is_available() else "cpu") if name == "auto" else name


def preflight(cfg: DictConfig, run_dir: Path | None = None):
    """Checks that need more than the config but nothing heavy: build the prompt set and the verifier, read the
    model's context length, check the run folder is writable. Raises ConfigError naming the key.
    Returns (prompt splits, verifier) so that the trainer does not build them again."""
    from rlcompare.train.verifier_probe import build_prompt_set, build_run_verifier

    from rlcompare.train.model_folder import check_chat_template, check_model

    check_model(cfg.model)  # no model code to run, no pickle weights, safetensors headers that read
    if cfg.teacher.path is not None:  # on-policy distillation's teacher: its folder, device and tokenizer
        from rlcompare.train.teacher_check import check_same_device, check_teacher

        check_teacher(cfg)  # torch-free (the command line's check runs it): device=auto is left to this one
        if cfg.teacher.device is not None and "auto" in (cfg.device, cfg.teacher.device):
            check_same_device(_resolved_device(str(cfg.teacher.device)), _resolved_device(str(cfg.device)))
    splits = build_prompt_set(cfg)  # its own settings' errors first: they name the key to fix
    check_chat_template(cfg)  # before the warm start: prompts.chat=true on a tokenizer without a template
    verifier = build_run_verifier(cfg)
    ctx = model_context_length(cfg)
    check_fits_context(
        cfg.budget, ctx, f"({ctx} positions, from model.name_or_path={cfg.model.name_or_path!r}'s config)"
    )
    _probe_verifier(cfg, splits, verifier)
    check_env_room(cfg)  # a tool-use environment's turns hold a tool call
    if run_dir is not None:
        _check_writable(run_dir, "the run folder")
    return splits, verifier


def _probe_verifier(cfg: DictConfig, splits, verifier) -> None:
    """The verifier must score a few of the prompt set's reference answers correct (rlcompare.train.verifier_probe)."""
    from rlcompare.train.verifier_probe import check_verifier_reads_prompts

    try:
        warning = check_verifier_reads_prompts(cfg, splits, verifier)
    except ConfigError:
        verifier.close()  # its worker processes, if the probe started any
        raise
    if warning:
        print(f"[rlcompare] {warning}", file=sys.stderr)


# ----------------------------------------------------------------------------- SIGTERM
class _SigtermGuard:
    """SIGTERM -> Terminated, SIGINT (Ctrl-C) -> Interrupted (`STOPS`). While `defer` is on (inside the loop, checkpointing on), the handler only records the
    termination (summary failed) and sets `requested`; the loop saves a checkpoint at the end of the step in flight
    and raises. A second SIGTERM raises at once. Inside `no_interrupt()` nothing is raised until the block ends.
    Once `quiet` is on (the run is recording its failure and will exit), a SIGTERM is only counted."""

    def __init__(self, on_signal):
        self.requested = False
        self.defer = False
        self.quiet = False
        self.received = 0  # SIGTERMs so far
        self._held = False
        self._on_signal = on_signal  # called with the exception class of the first signal (records it at once)
        self.stop = Terminated  # the exception class of the first signal received
        self._prev: dict = {}

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():
            for sig in STOPS:
                if sig == signal.SIGINT and signal.getsignal(sig) is signal.SIG_IGN:
                    continue  # started with Ctrl-C ignored (a background job of a shell): leave it so
                self._prev[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc):
        for sig, prev in self._prev.items():
            signal.signal(sig, prev if prev is not None else signal.SIG_DFL)
        return False

    @contextlib.contextmanager
    def no_interrupt(self):
        """A block SIGTERM does not cut (writing a row and the counters that go with it): a SIGTERM in it is acted
        on when it ends, as it would have been at once (deferred only for a first one while `defer` is on)."""
        before = self.received
        self._held = True
        try:
            yield
        finally:
            self._held = False
        if self.received > before and (not self.defer or self.received > 1):
            raise self.stop()

    def _handle(self, signum, frame):
        self.received += 1
        if self.received == 1:
            self.stop = STOPS.get(signum, Terminated)
        if self.quiet:
            return
        if self._held or (self.defer and not self.requested):
            if not self.requested:
                self.requested = True
                try:
                    self._on_signal(self.stop)
                except Exception:  # noqa: BLE001 - recording is best effort; the loop will record again
                    pass
            return
        raise self.stop()


# ----------------------------------------------------------------------------- the run
def _quiet_libraries() -> None:
    """transformers' per-load progress bars drown our own; its warnings still show."""
    try:
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
    except Exception:
        pass


def apply_process_settings(cfg: DictConfig, world: World | None = None) -> None:
    """The process-wide settings of a training job, applied by its entry (`train`, the benchmark's worker), never
    by constructing a `Trainer`: torch's CPU thread count (`trainer.threads`; null keeps torch's default, and
    under torchrun splits the cores between the machine's ranks) and, on the CPU, glibc malloc keeping freed memory
    for reuse (`trainer.keep_freed_memory`, `rlcompare.fast.keep_freed_memory`; false opts out and leaves malloc as
    it is)."""
    import torch

    from rlcompare.fast import keep_freed_memory
    from rlcompare.train.placement import cpu_cores

    if cfg.trainer.threads:
        torch.set_num_threads(int(cfg.trainer.threads))
    elif world is not None and world.local_size > 1:
        torch.set_num_threads(max(1, cpu_cores() // world.local_size))
    on_cpu = cfg.device == "cpu" or (cfg.device == "auto" and not torch.cuda.is_available())
    if cfg.trainer.keep_freed_memory and on_cpu:
        keep_freed_memory()


def train(cfg: DictConfig | dict) -> dict:
    """Run one training job; returns the summary dict (also written to summary.json)."""
    _quiet_libraries()
    cfg = validate(cfg)
    world = init_world(cfg)  # torchrun: joins the process group; refuses a split that would change the run
    try:
        summary = _train_as_rank(cfg, world)
    except Terminated:  # stopped at a step's end, every rank agreed: nothing in flight
        world.leave()
        raise
    world.leave()  # not after another error: a collective may be in flight; the process exits non-zero anyway
    return summary


def _train_as_rank(cfg: DictConfig, world: World) -> dict:
    """train() on this process: rank 0 (or the only process) writes the run, the others follow it."""
    from rlcompare.train.trainer import resolve_run_dir

    apply_process_settings(cfg, world)
    if not world.is_writer:
        return _follow(world)
    run_dir = resolve_run_dir(cfg)
    if resume.resume_requested(cfg):
        if resume.resume_is_path(cfg) and not run_dir.is_dir():
            raise ConfigError(
                f"resume={cfg.resume!r}: no run folder there; pass the folder of the run to continue "
                f"(results/<experiment>/<run name>) or resume=true with the run's overrides"
            )
        resume.refuse_resuming_another_run(cfg, run_dir)
    followers = _Followers(world)
    try:
        with run_lock.acquire(run_dir):  # one writer per run folder, from before anything in it is read
            return _train_locked(cfg, run_dir, followers)
    finally:
        followers.release()


def _train_locked(cfg: DictConfig, run_dir: Path, followers: "_Followers") -> dict:
    """train() once this process holds the run folder."""
    resuming = resume.resume_requested(cfg)
    cfg, done = resume.check_folder(cfg, run_dir, resuming)
    if done is not None:  # nothing left to do: keep the results as they are
        return done
    splits, verifier = preflight(cfg, run_dir)
    found = [resume.checkpoint_to_resume(run_dir) if resuming else None]  # before the model loads: refuse early
    used = external_inputs(cfg)  # the teacher's and the plug-ins' identity (fingerprint.json's `inputs`)
    if found[0] is not None:  # continuing: what the run computed with must not have changed under its name
        resume.check_inputs(run_dir, used)
    run_dir.mkdir(parents=True, exist_ok=True)
    with ConsoleLog(run_dir / "train.log") as console:
        summary = _run(cfg, run_dir, followers, (splits, verifier, used), found, console)
        console.note(closing_line(summary))
    return summary


def _opening_summary(cfg: DictConfig, run_dir: Path, world: World) -> dict:
    """summary.json as a run starts: "running", what ran, where, and how many processes share each step."""
    return {
        "status": "running",
        "error": None,
        "run_name": run_dir.name,
        "experiment": cfg.experiment,
        "algorithm": cfg.algorithm.name,
        "seed": cfg.seed,
        "run_dir": str(run_dir),
        "sweep": OmegaConf.to_container(cfg.sweep, resolve=True),
        "pid": os.getpid(),
        # how many processes shared each step: never changes what is computed
        "world_size": world.size,
        "parallel": world.mode,
        # how the ranks summed the gradients of the weights each holds whole (trainer.grad_sum resolved; fsdp
        # reduce-scatters its shards itself); none on one process
        "grad_sum": None if world.size == 1 else ("shared_memory" if world.shared_memory else "backend"),
        **_teacher_record(cfg),
    }


def _teacher_record(cfg: DictConfig) -> dict:
    """On-policy distillation's teacher as given (config.yaml keeps teacher.path as typed, often relative to where
    the run started) and, for a local folder, its absolute path: the run folder alone then says which one it was."""
    path = cfg.teacher.path
    if path is None:
        return {}
    local = Path(os.path.expanduser(str(path)))
    return {"teacher": {"path": str(path), "absolute_path": str(local.resolve()) if local.exists() else None}}


def _run(cfg: DictConfig, run_dir: Path, followers: "_Followers", built, found: list, console) -> dict:
    """The run itself, once its folder is checked: summary.json "running", the trainer, the loop, the record of how
    it ended. `found`: [the checkpoint to resume from, read], emptied once loaded (its tensors are freed)."""
    from rlcompare.train.trainer import Trainer

    resuming = resume.resume_requested(cfg)
    t_wall = time.time()
    resolved = {**OmegaConf.to_container(cfg, resolve=True), "provenance": provenance.of_this_process(cfg.device)}
    summary: dict[str, Any] = _opening_summary(cfg, run_dir, followers.world)
    if built[2]:
        summary["inputs"] = built[2]  # what changes the run beyond its config (rlcompare.train.inputs)
    summary["provenance"] = resolved["provenance"]  # code, libraries, device, threads, launcher (W&B's config too)
    before = resume.run_files(run_dir) if resuming else {}  # put back as they were if the checkpoint is refused
    atomic_write_text(run_dir / "config.yaml", OmegaConf.to_yaml(cfg, resolve=True))
    atomic_write_json(run_dir / "summary.json", summary)

    tr = writer = None
    out = _Outputs()

    def record_stop(stop: type[Terminated]):
        atomic_write_json(run_dir / "summary.json", {**summary, "status": stop.status, "error": stop.error})

    with _SigtermGuard(record_stop) as term:
        try:
            splits, verifier, used = built
            tr = Trainer(
                cfg, run_dir, splits=splits, verifier=verifier, world=followers.world
            )  # heavy: warm start, model load
            check_teacher_loaded(used, tr.teacher)
            ckpt = resume.restore(tr, run_dir, found.pop(), resuming)
            if ckpt is not None and (synced := tr.push_rollout_weights()) is not None:  # vLLM's copy of them
                tr.log(f"[rlcompare] the checkpoint's weights pushed to vLLM in {synced:.3f}s (perf/weight_sync_s)")
            followers.start(cfg, run_dir, ckpt, tr)  # the other ranks join with this config, checkpoint and weights
            writer = out.writer = RunWriter(run_dir)
            writer.write_json("fingerprint.json", fingerprint(cfg, tr, used))
            if cfg.logger.name == "wandb" and cfg.logger.mode != "disabled":
                out.logger = _wandb_logger(cfg, run_dir, resolved, tr, writer, resumed=ckpt is not None)
            out.recorded = tr.state.as_dict()  # the counters as of the last row written: what summary.json reports
            # a resumed run's rows so far, checked as its estimator's declaration says (a teacher, a group baseline)
            out.health = health.of_rows(read_jsonl(run_dir / "metrics.jsonl"), cfg, estimator_needs(cfg.algorithm))
            out.pbar = _progress(cfg, tr)
            _steps(cfg, tr, followers.world, term, out)
            export_final(cfg, tr.policy, run_dir)  # trainer.export_final: <run dir>/export
            _warn_if_no_update(summary, out.recorded)
            _check_health(cfg, summary, out)
            summary.update(status="completed")
        except resume.ResumeRefused:  # nothing of the run changed: its files stay as they were (summary "running" too)
            resume.put_back(run_dir, before)
            raise
        except BaseException as e:  # record the failure, keep everything written so far, re-raise
            # a SIGTERM from here on must not cut the recording short (torchrun stops every rank once one failed)
            term.quiet = True
            if isinstance(e, Terminated):
                e.run_dir = run_dir
            plugin = plugin_failure(cfg, e)  # a plug-in's own error, named (a one-line message, no traceback)
            summary.update(status="failed", error=plugin or _failure(e))
            summary["traceback"] = None if isinstance(e, health.UnhealthyRun) else traceback.format_exc(limit=8)
            if isinstance(e, Interrupted):  # the user stopped it: no error to trace
                summary.update(status=INTERRUPTED, traceback=None)
            try:
                _finish(run_dir, writer, out.logger, tr, summary, t_wall, out.pbar, exit_code=1, state=out.recorded)
            except Exception as fe:  # noqa: BLE001 - never hide the run's own error behind a bookkeeping one
                print(
                    f"[rlcompare] could not record the failure in {run_dir}: {type(fe).__name__}: {fe}", file=sys.stderr
                )
            console.note(e.closing_line() if isinstance(e, Terminated) else f"[rlcompare] failed: {summary['error']}")
            if plugin:
                raise PluginFailed(plugin) from e
            raise
    _finish(run_dir, writer, out.logger, tr, summary, t_wall, out.pbar, exit_code=0, state=out.recorded)
    return summary


def _check_health(cfg, summary: dict, out: "_Outputs") -> None:
    """summary.json's `health` (rlcompare.health); a run that broke an invariant at every step raises
    UnhealthyRun, recorded as its failure (`trainer.unhealthy=warn`: a warning, and the run completes)."""
    broken = out.health.verdict(out.recorded)
    summary["health"] = out.health.record(broken)
    if broken and cfg.trainer.unhealthy == "warn":  # completed, the break in `health` (the report still flags it)
        print(f"[rlcompare] warning: {health.reason(broken)}", file=sys.stderr, flush=True)
    elif broken:
        raise health.UnhealthyRun(health.reason(broken))


def _failure(e: BaseException) -> str:
    """summary.json's `error` for a run that stopped on `e`; a SIGTERM says where its checkpoint is."""
    if isinstance(e, health.UnhealthyRun):
        return str(e)
    if not isinstance(e, Terminated):
        return f"{type(e).__name__}: {e}"
    saved = e.checkpoint_step is not None
    return e.error + (f"; checkpoint saved at step {e.checkpoint_step}, continue with resume=true" if saved else "")


def shown_path(path: Path | str) -> str:
    """`path` relative to the working folder when it lies below it (what a user types next), else absolute."""
    try:
        rel = os.path.relpath(path)
    except ValueError:  # another drive
        return str(path)
    return str(path) if rel.startswith("..") else rel


def closing_line(summary: dict) -> str:
    """The line a finished run prints (stdout): held-out accuracy before and after, tokens, time, where it is."""
    acc0, acc1 = summary.get("eval/accuracy_initial"), summary.get("eval/accuracy_final")
    return (
        f"[rlcompare] {summary['run_name']}: held-out accuracy {_num(acc0):.3f} -> {_num(acc1):.3f} "
        f"({summary.get('tokens/generated')} generated tokens, {summary.get('wall_time_s', 0):.0f} s); "
        f"results in {shown_path(summary['run_dir'])}"
    )


@dataclass
class _Outputs:
    """Rank 0's side of the loop: the run folder's writer, W&B, the progress line, and the counters as of the last
    row written (what summary.json reports)."""

    writer: Any = None
    logger: Any = field(default_factory=NullLogger)
    pbar: Any = None
    recorded: dict | None = None
    health: Any = None  # rlcompare.health.Health: the invariants, checked on each row written

    def write_row(self, row: dict, tr, term) -> None:
        with term.no_interrupt():  # the row and the counters summary.json reports go together
            self.writer.metrics.write(row)
            self.recorded = tr.state.as_dict()
        self.logger.log(row, step=tr.state.step)
        for warning in self.health.check(row):  # once per invariant, naming the metric that shows it
            print(f"[rlcompare] warning: {warning}", file=sys.stderr, flush=True)

    def show_progress(self, row: dict, st, total: int | None) -> None:
        if self.pbar is not None:
            self.pbar.total = total
            self.pbar.update(1)
            self.pbar.set_postfix(
                reward=f"{_num(row.get('reward/mean')):.3f}",
                acc=f"{_num(st.eval_last):.3f}",
                tok_s=f"{row['perf/tokens_per_s']:.0f}",
                tokens=st.tokens,
            )


def _wandb_logger(cfg, run_dir: Path, resolved: dict, tr, writer, *, resumed: bool):
    """The run's W&B mirror; a resumed run continues its W&B run (wandb_id.txt) and logs the rows it had lost."""
    prev = {}
    if resumed and (run_dir / "wandb_id.txt").exists():
        prev = {"resume_id": (run_dir / "wandb_id.txt").read_text().strip()}
    logger = WandbLogger(cfg.logger, run_dir, run_dir.name, resolved, **prev)
    writer.write_text("wandb_id.txt", logger.id + "\n")
    if prev and logger.replay(run_dir, through=tr.state.step):
        tr.log(f"[rlcompare] W&B: logged the rows it had lost up to step {tr.state.step} from the run folder")
    return logger


def _steps(cfg, tr, world: World, term, out: _Outputs | None) -> None:
    """The training loop. Every rank of a data-parallel run runs it, so that all make the same collectives in the
    same order; `out` is rank 0's writing side, None on the others (they write nothing)."""
    st = tr.state
    if st.step == 0:
        _eval_step(tr, out)
    every = checkpoint_every(cfg)
    term.defer = bool(every)
    while not resume.budget_spent(cfg, st.step, st.tokens):
        row = tr.step()
        if out is not None:
            out.write_row(row, tr, term)
        if st.step % cfg.trainer.eval_every == 0 or resume.budget_spent(cfg, st.step, st.tokens):
            _eval_step(tr, out)
        if out is not None:
            out.show_progress(row, st, _steps_in_budget(cfg, st.step, st.tokens))
        if st.bad_in_row >= cfg.trainer.max_bad_steps:
            raise FloatingPointError(_bad_steps_message(cfg, st))
        saved = False
        if every and st.step % every == 0:
            _checkpoint(cfg, tr, world, out)
            saved = True
        if world.any_true(term.requested):  # a SIGTERM any rank received: all stop after this step
            if not saved:
                _checkpoint(cfg, tr, world, out)
            raise term.stop(checkpoint_step=st.step)
    if every and st.step % every:  # a completed run keeps its last step, so `rlcompare export` works on it (#49)
        _checkpoint(cfg, tr, world, out)
    term.defer = False


def checkpoint_every(cfg) -> int:
    """Steps between checkpoints: trainer.checkpoint_every, null meaning at each eval (trainer.eval_every); 0: none."""
    every = cfg.trainer.checkpoint_every
    return cfg.trainer.eval_every if every is None else every


def _steps_in_budget(cfg, step: int, tokens: int) -> int | None:
    """The progress bar's total: the steps the run will take, by whichever budget binds first. With a token budget,
    the steps left are estimated from the tokens per step so far; once a budget is spent, the steps taken."""
    if resume.budget_spent(cfg, step, tokens):
        return step
    b = cfg.budget
    estimate = None
    if b.total_tokens is not None and step > 0 and tokens > 0:
        estimate = step + math.ceil((b.total_tokens - tokens) * step / tokens)
    if b.max_steps is not None:
        estimate = b.max_steps if estimate is None else min(estimate, b.max_steps)
    return estimate


def _checkpoint(cfg, tr, world: World, out: _Outputs | None) -> None:
    """Rank 0 writes the checkpoint; under fsdp every rank takes part (the optimizer state is gathered whole)."""
    if out is not None or world.shards:
        checkpoint.save(tr, cfg.trainer.keep_checkpoints, write=out is not None)


def _eval_step(tr, out: _Outputs | None) -> None:
    if out is not None:
        _evaluate(tr, out.writer, out.logger, out.recorded)
    else:
        tr.state.note_eval(headline(tr.evaluate()[0]))


# ----------------------------------------------------------------------------- data parallelism: ranks > 0
class _Followers:
    """Rank 0's hand-off to the other ranks (rlcompare.train.parallel): once it holds the run folder, has checked
    the config and built its trainer, it sends them the resolved config, the run folder and the checkpoint to
    resume from, then its weights. `release` tells them not to start when rank 0 stopped before that."""

    def __init__(self, world: World):
        self.world = world
        self.sent = False

    def start(self, cfg, run_dir: Path, ckpt: Path | None, tr) -> None:
        if self.world.size == 1:
            return
        self.world.broadcast_object(
            {
                "config": OmegaConf.to_yaml(cfg, resolve=True),
                "run_dir": str(run_dir),
                "checkpoint": str(ckpt) if ckpt is not None else None,
            }
        )
        self.sent = True
        self.world.broadcast_tensors(_weights(tr))
        tr.weights_loaded()

    def release(self) -> None:
        if self.world.size > 1 and not self.sent:
            self.sent = True
            self.world.broadcast_object(None)


def _weights(tr) -> list:
    """Every tensor of the policy and the critic, in a fixed order (rank 0's are broadcast to the others)."""
    tensors = list(tr.policy.model.state_dict().values())
    if tr.critic is not None:
        tensors += list(tr.critic.state_dict().values())
    return tensors


def _follow(world: World) -> dict:
    """Rank > 0 of a data-parallel run: joins the run rank 0 set up, computes its share of every step and eval,
    and writes nothing (no folder, no rows, no checkpoint, no W&B)."""
    from rlcompare.train.trainer import Trainer

    start = world.broadcast_object(None)
    if start is None:  # rank 0 stopped before training (a config error, a completed run): nothing to do
        return {"rank": world.rank, "status": "not started"}
    cfg = validate(OmegaConf.create(start["config"]))
    splits, verifier = preflight(cfg)
    tr = Trainer(cfg, Path(start["run_dir"]), splits=splits, verifier=verifier, world=world)
    if start["checkpoint"] is not None:
        path = Path(start["checkpoint"])
        checkpoint.load(tr, path, checkpoint.read(path))
    world.broadcast_tensors(_weights(tr))
    tr.weights_loaded()
    try:
        with _SigtermGuard(lambda: None) as term:
            _steps(cfg, tr, world, term, None)
    except Terminated:
        return {"rank": world.rank, "status": "terminated"}
    except BaseException as e:  # name this rank: torchrun's summary gives its exit code, this says why
        print(f"[rlcompare] rank {world.rank} failed: {type(e).__name__}: {e}", file=sys.stderr, flush=True)
        raise
    return {"rank": world.rank, "status": "completed"}


def _evaluate(tr, writer, logger, recorded: dict) -> float:
    """One eval: its row and samples written and logged, the trainer's eval counters updated, and `recorded`
    (the counters summary.json reports) given the new eval figures."""
    st = tr.state
    ev, samples = tr.evaluate()
    row = {"step": st.step, "tokens/generated": st.tokens, **ev, "time/elapsed_s": st.elapsed}
    writer.evals.write(row)
    if tr.eval_counts is not None:  # a sampled eval's per-prompt correct counts (docs/internals.md)
        writer.write_counts({"step": st.step, "tokens/generated": st.tokens, **tr.eval_counts})
    for s in samples:
        writer.samples.write(s)
    logger.log(row, step=st.step)
    logger.log_samples(samples, step=st.step)
    st.note_eval(headline(ev))
    recorded.update(eval_initial=st.eval_initial, eval_best=st.eval_best, eval_last=st.eval_last)
    return headline(ev)


def headline(ev: dict) -> float:
    """The eval's one number for the trainer's counters (summary.json's eval/accuracy_*, the progress line): the
    greedy eval/accuracy when the eval decoded greedily, else eval/avg@n."""
    return ev["eval/accuracy"] if "eval/accuracy" in ev else ev["eval/avg@n"]


def _num(v) -> float:
    return float("nan") if v is None else float(v)


def _bad_steps_message(cfg, state) -> str:
    step, what = state.last_bad or (state.step, "value")
    n = state.bad_in_row
    first = step - n + 1
    where = f"step {step}" if n == 1 else f"steps {first}-{step}"
    return (
        f"training stopped at step {step}: non-finite {what} ({where}: {n} update(s) in a row skipped; "
        f"trainer.max_bad_steps={cfg.trainer.max_bad_steps}). The rows before are in metrics.jsonl. "
        f"Lower trainer.lr, check the verifier's rewards, or raise trainer.max_bad_steps"
    )


def no_update_warning(state: dict) -> str | None:
    """The warning for a run whose every update was skipped (its weights are still the initial ones), else None.
    `state`: the trainer's counters (TrainerState.as_dict)."""
    if state.get("applied_updates") != 0 or not state.get("skipped_updates"):
        return None
    last = f"; the last for a non-finite {state['last_bad'][1]} at step {state['last_bad'][0]}"
    return (
        f"no update was applied: all {state['skipped_updates']} were skipped"
        + (last if state.get("last_bad") else "")
        + ", so the policy is its initial weights. Updates are skipped for a non-finite loss, gradient or reward, or "
        "when dynamic sampling keeps no informative group: check trainer.lr, algorithm.kl.coef and the algorithm's "
        "other coefficients, and the verifier's rewards (optim/skipped_updates, optim/nonfinite in metrics.jsonl)"
    )


def _warn_if_no_update(summary: dict, state: dict) -> None:
    """A completed run that trained nothing says so: one line on stderr (and train.log), `warnings` in summary.json."""
    warning = no_update_warning(state)
    if warning:
        summary["warnings"] = [warning]
        print(f"[rlcompare] warning: {warning}", file=sys.stderr)


def _finish(run_dir, writer, logger, tr, summary, t_wall, pbar, exit_code, state=None):
    """`state`: the trainer's counters as of the last metrics row written (default: its current ones)."""
    if pbar is not None:
        try:
            pbar.close()
        except Exception:  # noqa: BLE001
            pass
    summary["wall_time_s"] = time.time() - t_wall
    if tr is not None:
        s = state if state is not None else tr.state.as_dict()
        summary.update(
            {
                "steps": s["step"],
                "tokens/generated": s["tokens"],
                "train_time_s": s["elapsed"],
                "eval/accuracy_initial": s["eval_initial"],
                "eval/accuracy_final": s["eval_last"],
                "eval/accuracy_best": s["eval_best"],
                "optim/skipped_updates": s["skipped_updates"],
                "optim/applied_updates": s.get("applied_updates"),  # null: resumed from an older checkpoint
                "verifier/errors": s["verifier_errors"],
                "init_weights_hash": tr.policy.init_hash,
            }
        )
        summary["warm_start_origin"] = tr.policy.warm_start_origin  # shipped | cached | computed; null for hf
    summary.pop("pid", None)
    atomic_write_json(Path(run_dir) / "summary.json", summary)
    if writer is not None:
        writer.close()
    try:
        logger.summary({k: v for k, v in summary.items() if k not in ("traceback",)})
        logger.finish(exit_code=exit_code)
    except Exception:  # noqa: BLE001
        pass


def _progress(cfg, tr):
    if not cfg.trainer.progress:
        return None
    from tqdm.auto import tqdm

    total = _steps_in_budget(cfg, tr.state.step, tr.state.tokens)
    interactive = sys.stderr.isatty()
    return tqdm(
        total=total,
        initial=tr.state.step,
        desc=f"{cfg.algorithm.name} s{cfg.seed}",
        unit="step",
        file=sys.stderr,
        dynamic_ncols=True,
        leave=True,
        mininterval=0.5 if interactive else 30.0,
    )
