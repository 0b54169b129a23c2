"""The gradient sum through shared memory (rlcompare.train.shared_sum, trainer.grad_sum), for real: gloo processes
on this machine, each with its own gradients, and the sums checked against numbers written out by hand."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from rlcompare.config import ConfigError
from rlcompare.train.parallel import grad_sum_through_shared_memory

REPO = Path(__file__).resolve().parents[2]

# Rank r's gradients are r + 1 times a fixed pattern, so every sum is (1 + 2 + ... + size) times it: 3x for 2 ranks,
# 6x for 3. Parameters of 5, 3 (no gradient on rank 1: zeros there), 7, 1 and 2 (bfloat16) elements, chunks of 4
# elements: the first and third parameters straddle chunks, and the 18 elements take 5 chunks, so both parities' slots are
# written twice and a rank's chunk k+1 lands beside a slower rank's chunk k. A second round with other gradients
# (minus rank + 1 times the pattern, +0.5 on p[3]) reuses the slots; both results are exact in float32. The flag
# `finish` carries (a rank's non-finite loss) comes back as whether any rank raised it.
_WORKER = r"""
import os, sys, torch, torch.distributed as dist
from pathlib import Path
from rlcompare.train import shared_sum
from rlcompare.train.parallel import GradientSum, World

F32, BF16 = torch.float32, torch.bfloat16
rank, size, store, shm = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], Path(sys.argv[4])
shared_sum.SHM_DIR = shm  # a folder of the test's own: what is left in it afterwards is this test's
dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=size)
w = World(rank=rank, size=size, mode="ddp", shared_memory=True)
# a bfloat16 parameter last (LoRA on a bf16 model): added in the float32 window, its gradient bf16 again
params = [torch.nn.Parameter(torch.zeros(n, dtype=d)) for n, d in ((5, F32), (3, F32), (7, F32), (1, F32), (2, BF16))]
pattern = [torch.arange(1.0, p.numel() + 1, dtype=p.dtype) * (10**i if p.dtype == F32 else 1) for i, p in enumerate(params)]
shared_sum.CHUNK_ELEMENTS = 4  # read when the first `finish` opens the window
gs = GradientSum(w, params)
total = sum(range(1, size + 1))
for p, x in zip(params, pattern):
    p.grad = None if (rank == 1 and p.numel() == 3) else (rank + 1) * x
gs.arm()
# the flag (a non-finite loss) rides the first chunk's barrier: none raised it here
assert gs.finish(False) is False
assert gs.shared.chunk == 4 and gs.shared.n == 18
for p, x in zip(params, pattern):
    want = (total - (2 if p.numel() == 3 else 0)) * x  # rank 1 had no gradient for the 3-element parameter
    assert p.grad.dtype == p.dtype and torch.equal(p.grad, want), (rank, p.numel(), p.grad, want)
assert list(shm.iterdir()) == [], list(shm.iterdir())  # the window's name is gone once every rank mapped it
for p, x in zip(params, pattern):
    p.grad = -(rank + 1) * x + (0.5 if p.numel() == 1 else 0.0)
assert gs.finish(rank == size - 1) is True  # the last rank alone raised it: every rank learns it
for p, x in zip(params, pattern):
    assert torch.equal(p.grad, -total * x + (0.5 * size if p.numel() == 1 else 0.0)), (rank, p.grad)
# the gradients are views of this rank's own sum: scaling one in place (the clip) leaves the other ranks' alone
params[0].grad.mul_(0.0)
dist.barrier()
assert gs.shared.total[5:8].abs().sum() > 0
dist.destroy_process_group()
print("ok", rank)
"""


@pytest.mark.parametrize("size", [2, 3])
@pytest.mark.slow
def test_ranks_sum_gradients_through_shared_memory_exactly(tmp_path, size):
    shm = tmp_path / "shm"
    shm.mkdir()
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _WORKER, str(r), str(size), str(tmp_path / "store"), str(shm)],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for r in range(size)
    ]
    outs = [p.communicate(timeout=120)[0] for p in procs]
    assert [p.returncode for p in procs] == [0] * size, outs
    assert [o.strip().splitlines()[-1] for o in outs] == [f"ok {r}" for r in range(size)]


@pytest.mark.parametrize(
    "grad_sum,cuda,local_size,want",
    [
        ("auto", False, 2, True),  # CPU ranks all on this machine
        ("auto", False, 1, False),  # 2 machines of 1 rank each: only the backend reaches the other
        ("auto", True, 2, False),  # GPUs: NCCL
        ("backend", False, 2, False),
        ("shared_memory", False, 2, True),
    ],
)
def test_grad_sum_takes_shared_memory_only_where_every_rank_can_map_it(grad_sum, cuda, local_size, want):
    assert grad_sum_through_shared_memory(grad_sum, cuda=cuda, size=2, local_size=local_size) is want


@pytest.mark.parametrize("cuda,local_size,why", [(False, 1, "only 1 of the 2 ranks"), (True, 2, "on GPUs")])
def test_shared_memory_asked_where_it_cannot_work_is_refused_naming_the_setting(cuda, local_size, why):
    with pytest.raises(ConfigError, match=f"trainer.grad_sum=shared_memory.*{why}.*trainer.grad_sum=auto"):
        grad_sum_through_shared_memory("shared_memory", cuda=cuda, size=2, local_size=local_size)


@pytest.mark.parametrize(
    "free_mib,want_dir,want_chunk",
    [
        (24 * 1024, "shm", 1 << 23),  # plenty: the whole chunk (2 x 2 ranks x 32 MiB = 128 MiB, under half)
        (64, "shm", 1 << 21),  # a container's default: 2 x 2 x 8 MiB = 32 MiB, half of 64
        (1, "tmp", 1 << 18),  # no room even at the smallest chunk: the temporary folder
    ],
)
def test_the_window_fits_in_half_of_dev_shm_or_goes_to_the_temporary_folder(
    monkeypatch, tmp_path, free_mib, want_dir, want_chunk
):
    from collections import namedtuple

    from rlcompare.train import shared_sum

    monkeypatch.setattr(shared_sum, "SHM_DIR", tmp_path)
    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(shared_sum.shutil, "disk_usage", lambda _: usage(0, 0, free_mib * 2**20))
    folder, chunk = shared_sum.window_layout(100_000_000, 2)
    assert (folder == tmp_path) is (want_dir == "shm") and chunk == want_chunk


def test_a_model_smaller_than_a_chunk_is_one_chunk_of_its_size(monkeypatch, tmp_path):
    from rlcompare.train import shared_sum

    monkeypatch.setattr(shared_sum, "SHM_DIR", tmp_path)
    assert shared_sum.window_layout(1000, 2) == (tmp_path, 1000)


def test_float64_gradients_are_summed_by_the_backend_not_the_float32_window():
    import torch

    from rlcompare.train.parallel import GradientSum, World

    shared = World(rank=0, size=2, mode="ddp", shared_memory=True)
    assert GradientSum(shared, [torch.nn.Parameter(torch.zeros(3))]).shared_params is not None
    in_float64 = GradientSum(shared, [torch.nn.Parameter(torch.zeros(3, dtype=torch.float64))])
    assert in_float64.shared_params is None and len(in_float64.buckets) == 1
