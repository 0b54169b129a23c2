"""The operational keys: config keys that name, place or display a run, or tune its speed, and never change what
it computes. Defined here once, each with its reason; plain Python (no torch, no omegaconf).

Who reads them:

- resume (`rlcompare.train.resume`): a resumed run may differ from the original in `RESUME_IGNORED` only (every operational
  key but `RESUME_FIXED`, which would move the run to another folder, W&B run or comparison);
- the derived run name (conf/config.yaml's `hydra.job.config.override_dirname.exclude_keys`, which cannot import
  Python; tests/config/test_operational.py keeps it equal to `RUN_NAME_EXCLUDED`);
- sweeps (`rlcompare.sweep.spec`): a variant changing only `SWEEP_IGNORED` keys changes nothing;
- fingerprints (`run.fingerprint` leaves them out) and the report (`report.fingerprint_diff` skips them in
  fingerprint.json files written before they were left out).

`seed` is not operational: it changes what a run computes. It is left out of run names and sweep diffs for its
own reasons (`NAME_ONLY`, `SWEEP_ONLY`) and is never in a fingerprint, since compared runs differ in it.
"""

from __future__ import annotations

# key -> why it never changes what the run computes. Leaf keys (dotted paths of the schema), so that resume
# (flattened keys), sweeps (prefixes) and Hydra (exact override keys) all read the same strings.
OPERATIONAL: dict[str, str] = {
    "resume": "whether to continue a run, not a setting of it",
    "results_dir": "where run folders land",
    "experiment": "the results sub-folder the run lands in",
    "run_name": "the run folder's name",
    "device": "where the run executes (cpu or cuda): the same settings, up to floating-point rounding",
    "algorithm.name": "the preset's name: a label (the run name starts with it)",
    "algorithm.paper": "a citation shown in reports",
    "trainer.threads": "CPU threads: speed only",
    "trainer.keep_freed_memory": "how malloc keeps freed memory: speed and resident memory only",
    "trainer.progress": "the progress line on the terminal",
    "trainer.checkpoint_every": "when checkpoints are saved; a resumed run's rows equal an uninterrupted run's",
    "trainer.keep_checkpoints": "how many checkpoints are kept on disk",
    "trainer.export_final": "writes the trained policy as a Hugging Face folder after the last step",
    "trainer.max_bad_steps": "when a run gives up on non-finite steps; a run that finishes computed the same",
    "trainer.unhealthy": "whether a run that broke a run-health invariant ends failed or completed: the same rows",
    "trainer.parallel": "how many processes share each step: the same rows up to rounding (tests/train/test_parallel.py)",
    "trainer.grad_sum": "how ranks add their gradients: the same sums (tests/train/test_parallel.py)",
    "rollout.kv_cache": "how decoding stores its cache: the same tokens (tests/fast/test_static_decode.py)",
    "verifier.probe": "a check of the verifier before training, not part of the reward",
    "logger.name": "where metrics are mirrored (W&B or nowhere); results/ holds them either way",
    "logger.mode": "whether W&B syncs online, offline or not at all",
    "logger.project": "the W&B project the run is mirrored to",
    "logger.entity": "the W&B entity the run is mirrored to",
    "logger.group": "the W&B group shown in its UI",
    "sweep.name": "a tag the report groups runs by, set by `rlcompare sweep`",
    "sweep.variant": "a tag the report groups runs by, set by `rlcompare sweep`",
    "sweep.reference": "a tag the report groups runs by, set by `rlcompare sweep`",
    "sweep.component": "a tag the report groups runs by, set by `rlcompare sweep`",
}
# Not operational, though close: trainer.micro_batch_size and trainer.update_from_rollout give the same gradient up
# to floating-point rounding of another summation order / recomputation, and trainer.skip_zero_advantage changes
# which rows the update diagnostics cover. Runs that differ in them are kept apart (a sweep's `updates` component).

# Operational keys a resume may not change: they would move the run to another folder, W&B run or comparison.
RESUME_FIXED: dict[str, str] = {
    "experiment": "names the folder the run lives in; resume=<run dir> says which run",
    "run_name": "names the folder the run lives in; resume=<run dir> says which run",
    "algorithm.name": "the run name's first part, and how resume finds runs of the same preset and seed",
    "logger.name": "the W&B run continued across a resume (wandb_id.txt) must exist on both sides",
    "logger.project": "the W&B run continued across a resume lives in one project",
    "logger.entity": "the W&B run continued across a resume lives in one entity",
    "logger.group": "the continued W&B run keeps its group",
    "sweep.name": "a resumed run keeps its place in its sweep's comparison",
    "sweep.variant": "a resumed run keeps its place in its sweep's comparison",
    "sweep.reference": "a resumed run keeps its place in its sweep's comparison",
    "sweep.component": "a resumed run keeps its place in its sweep's comparison",
}
RESUME_IGNORED: frozenset[str] = frozenset(OPERATIONAL) - frozenset(RESUME_FIXED)

# Left out of the derived run name's key=value part besides the operational keys. Deliberate differences with
# OPERATIONAL: seed and the algorithm preset are in the name in their own form (<algorithm.name>__...__s<seed>);
# `logger` is a group every key of which is operational; hydra.run.dir / hydra.sweep.dir are Hydra's own folders.
NAME_ONLY: dict[str, str] = {
    "seed": "the name ends in __s<seed>",
    "algorithm": "the name starts with the preset's name (algorithm=<preset> on the command line)",
    "logger": "the logger preset (logger=none): every key of it is operational",
    "hydra.run.dir": "Hydra's own output folder",
    "hydra.sweep.dir": "Hydra's own output folder",
}
RUN_NAME_EXCLUDED: tuple[str, ...] = tuple(OPERATIONAL) + tuple(NAME_ONLY)

# Keys a sweep's one-change check never counts besides the operational ones.
SWEEP_ONLY: dict[str, str] = {
    "seed": "the replicate axis: every member runs over the same seeds",
}
SWEEP_IGNORED: tuple[str, ...] = tuple(OPERATIONAL) + tuple(SWEEP_ONLY)


# Fields of fingerprint.json's `inputs` (rlcompare.train.inputs) that say where an input lies, not what it is: the
# teacher's absolute path differs between machines and working folders while its content hash is the same.
# Resume and the report compare the content, not these.
INPUT_LOCATIONS = ("path",)


def is_operational(key: str) -> bool:
    """True for an operational key, or a key below one."""
    return any(key == k or key.startswith(k + ".") for k in OPERATIONAL)
