"""Issue #41, item 20: a lost peer under fsdp is explained as under ddp (RankLost, not the backend's raw error),
and rank 0's reason reaches the console, not only summary.json."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.train.test_parallel import _rank_pid
from rlcompare.train.parallel import RankLost, World
from tests.conftest import FAST

REPO = Path(__file__).resolve().parents[2]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow  # two processes importing torch and sharding a model (about 30 s on a busy 2-core machine)
def test_a_lost_peer_inside_fsdps_own_collectives_is_explained_as_under_ddp(tmp_path):
    """FSDP2's all-gathers and reduce-scatters (in the sharded model's forward and backward) are not the run's
    collectives: a peer that stopped surfaced as gloo's raw RuntimeError. Inside `lost_peers_explained` (where the
    trainer runs its update) it is the RankLost the run's own collectives raise, and rank 0 prints it."""
    out = tmp_path / "raised.json"
    env = {
        **os.environ,
        "WORLD_SIZE": "2",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(_free_port()),
        "OMP_NUM_THREADS": "1",
        "PYTHONPATH": os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p),
    }
    worker = [sys.executable, str(REPO / "tests" / "train" / "lost_peer_worker.py"), str(out)]
    procs = [subprocess.Popen(worker, env={**env, "RANK": str(r)}, stderr=subprocess.PIPE, text=True) for r in (0, 1)]
    errs = [p.communicate(timeout=300)[1] for p in procs]
    raised = json.loads(out.read_text())
    assert raised["type"] == "RankLost", (raised, errs[0][-3000:])
    assert "another rank stopped or hung" in raised["message"]
    assert "[rlcompare] rank 0: a collective with the other ranks failed" in errs[0]


def test_errors_that_are_not_the_backends_pass_through():
    world = World(rank=0, size=2, mode="fsdp")
    with pytest.raises(RuntimeError, match="mat1 and mat2 shapes cannot be multiplied") as e:
        with world.lost_peers_explained():
            raise RuntimeError("mat1 and mat2 shapes cannot be multiplied (4x8 and 7x1)")
    assert not isinstance(e.value, RankLost)
    with pytest.raises(ValueError):
        with world.lost_peers_explained():
            raise ValueError("x")


GROUPS = ["rollout.streams=group", "trainer.eval_every=1000", "model.warm_start.steps=300"]


@pytest.mark.slow  # torchrun with two ranks of a real run (a minute on a busy 2-core machine)
@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="finds the rank's process through /proc")
def test_when_a_rank_dies_rank_0s_reason_reaches_the_console(tmp_path):
    """torchrun stops the surviving ranks with SIGTERM right after one dies, which cut rank 0's own report short:
    its reason (RankLost) reached summary.json only, the console showing Hydra's "Error executing job" without it."""
    results = tmp_path / "results"
    run = results / "default" / "dies"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TMPDIR": str(tmp_path), "WANDB_MODE": "offline"}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"]
    cmd += ["-m", "rlcompare.cli", "train", *FAST, *GROUPS, "budget.max_steps=200", f"results_dir={results}"]
    proc = subprocess.Popen(
        cmd + ["run_name=dies"], env=env, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    try:
        while len(_lines(run / "metrics.jsonl")) < 2:
            assert proc.poll() is None, proc.communicate()[0][-3000:]
            time.sleep(0.01)
        victim = _rank_pid(proc.pid, 1)
        assert victim is not None
        os.kill(victim, signal.SIGKILL)
        output, _ = proc.communicate(timeout=180)
    finally:
        if proc.poll() is None:
            proc.kill()
    summary = json.loads((run / "summary.json").read_text())
    assert summary["error"].startswith("RankLost: a collective with the other ranks failed"), summary["error"]
    line = re.search(r"\[rlcompare\] rank 0: a collective with the other ranks failed .*", output)
    assert line and "another rank stopped or hung" in line.group(0), output[-4000:]


def _lines(path: Path) -> list[str]:
    try:
        return path.read_text().splitlines()
    except OSError:
        return []
