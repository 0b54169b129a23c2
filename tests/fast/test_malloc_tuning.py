"""`trainer.keep_freed_memory` (`rlcompare.fast.malloc_tuning`): a training step's freed activations are reused, not
faulted in again page by page.

Each case runs in a fresh interpreter (malloc settings are process-wide) and trains the benchmark's 0.5M model
(`rlcompare bench`'s config, one thread) for a few steps, counting the minor page faults of each of the last five (the median: a step that reaches a new peak, e.g. the
longest completions so far, faults its new pages in once whatever the setting). With
glibc's defaults such a step faults in thousands of 4 KiB pages (4,000-7,000 measured on this project's
machine): its activations come from fresh mmaps or from heap memory that was given back to the system.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

WORKLOAD = """
import resource, sys
from pathlib import Path
from rlcompare.bench import against_trl as bench
from rlcompare.config import validate
from rlcompare.train.run import apply_process_settings
from rlcompare.train.trainer import Trainer
out = Path(sys.argv[2])
bench.ensure_weights(out / "weights", "0.5M", log=lambda *a: None)
spec = bench.model_spec("0.5M")
cfg = bench.compose_config(bench.rlcompare_overrides(str(out / "weights"), max_new_tokens=spec["max_new_tokens"],
                                                     device="cpu", threads=int(sys.argv[3]), out=str(out))
                           + ["trainer.keep_freed_memory=" + sys.argv[1]])
cfg = validate(cfg)
apply_process_settings(cfg)  # the train entry's process-wide settings (a Trainer makes none)
trainer = Trainer(cfg, out / sys.argv[1])
for _ in range(3):
    trainer.step()
faults = []
for _ in range(5):
    r0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    trainer.step()
    faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - r0)
print(sorted(faults)[2])
"""


def _median_faults_per_step(keep: bool, tmp_path, threads: int = 2) -> float:
    out = subprocess.run(
        [sys.executable, "-c", WORKLOAD, str(keep).lower(), str(tmp_path), str(threads)],
        capture_output=True,
        text=True,
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return float(out.stdout.split()[-1])


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc malloc settings")
@pytest.mark.slow
def test_a_training_step_reuses_freed_memory_instead_of_faulting_it_in(tmp_path):
    default = _median_faults_per_step(False, tmp_path)
    kept = _median_faults_per_step(True, tmp_path)
    if default < 400:
        pytest.skip(f"this C library keeps the memory by default too ({default:.0f} faults a step)")
    # measured: 965-5,188 faults a step by default, 2-7 kept
    assert kept < 200, (kept, default)


def test_constructing_a_trainer_changes_no_process_wide_setting(compose, tmp_path, monkeypatch):
    """Threads and malloc belong to the process: the train entry sets them (`train.run.apply_process_settings`), a
    Trainer does not."""
    import torch

    from rlcompare import fast
    from rlcompare.config import validate
    from rlcompare.train.run import apply_process_settings
    from rlcompare.train.trainer import Trainer

    calls = []
    # the train entry reaches malloc through the fast/ door (`rlcompare.fast.keep_freed_memory`, read at each call)
    monkeypatch.setattr(fast, "keep_freed_memory", lambda: calls.append(1) or True)
    cfg = validate(compose("trainer.threads=3", "trainer.keep_freed_memory=true", "device=cpu"))
    threads = torch.get_num_threads()
    try:
        Trainer(cfg, tmp_path / "run")
        assert torch.get_num_threads() == threads and not calls
        apply_process_settings(cfg)
        assert torch.get_num_threads() == 3 and calls == [1]
        apply_process_settings(validate(compose("trainer.keep_freed_memory=false", "device=cpu")))
        assert calls == [1]  # the opt-out leaves malloc alone
    finally:
        torch.set_num_threads(threads)


def test_only_the_speed_layer_reaches_its_internals():
    """static_decode, rebuild and onednn are imported inside rlcompare/fast/ (speed.py, the graph engine, the rollout
    copy of the weights, each other), nowhere else in the package: everything else goes through `fast.decoder_for` /
    `fast.recorded_update_forward`."""
    import ast
    from pathlib import Path

    internals = {"static_decode", "recorded_update", "onednn"}
    package = Path(__file__).parents[2] / "rlcompare"
    offenders = []
    for path in package.rglob("*.py"):
        if path.parent.name == "fast":  # the speed layer itself
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            if any(n.split(".")[-1] in internals for n in names):
                offenders.append(f"{path.relative_to(package)}:{node.lineno}")
    assert not offenders, offenders
