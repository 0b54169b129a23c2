"""The gradient sum over ranks that share one machine's memory: CPU processes of one torchrun on one host.

gloo sums a CPU all-reduce through TCP over the loopback: on the 2-core test machine the 4.2M model's 17 MB take
19 ms a sum with both cores idle, and during a step the transfer's copies run on the cores the ranks compute on.
Here each rank instead copies its gradients into its slot of a shared-memory window, waits at one barrier (a
one-element all-reduce, the only thing that crosses a socket), and adds every rank's slot in rank order into its
own buffer. Every rank adds the same numbers in the same order, so the ranks' sums are bitwise equal, as the
weights must stay.

The window holds a chunk of floats per rank (`window_layout`), twice (two parities): a model larger than a chunk
is summed a chunk at a time, one barrier each, each chunk in the other parity's slots, so that a rank writing
chunk k+1 never overwrites what a slower rank is still adding of chunk k (it reads only chunk k's parity; a rank
can be at most one chunk ahead, since the barrier of chunk k+1 waits for every rank to finish chunk k).

The window is a file in /dev/shm (the temporary folder where it has no room) that rank 0 creates (mode 0600, a
random name) and unlinks as soon as every rank has mapped it, so that nothing is left behind when a run ends or
is killed. What is in it is raw float32, written and read by this run's ranks alone: nothing is parsed.
"""

from __future__ import annotations

import itertools
import os
import secrets
import shutil
import tempfile
from pathlib import Path

import torch

# floats of each rank's slot: up to 32 MiB, so a model of up to 8M parameters is summed behind one barrier; a
# larger one goes through in chunks. Halved (down to MIN_CHUNK) until the window (2 parities x ranks x slot) takes at
# most half of /dev/shm's free space: a container's default /dev/shm is 64 MiB
CHUNK_ELEMENTS = 1 << 23
MIN_CHUNK = 1 << 18
SHM_DIR = Path("/dev/shm")


def window_layout(n: int, size: int, chunk_elements: int = CHUNK_ELEMENTS) -> tuple[Path, int]:
    """Where the window's file goes and each slot's length in floats, for `n` floats summed over `size` ranks:
    /dev/shm (memory) with the largest chunk whose window takes at most half its free space, else the temporary
    folder (a file the page cache holds) at the smallest chunk."""
    chunk = max(1, min(n, chunk_elements))
    usable = SHM_DIR.is_dir() and os.access(SHM_DIR, os.W_OK)
    free = shutil.disk_usage(SHM_DIR).free if usable else 0
    while chunk > MIN_CHUNK and 2 * (4 * 2 * size * chunk) > free:
        chunk //= 2
    if 2 * (4 * 2 * size * chunk) <= free:
        return SHM_DIR, chunk
    return Path(tempfile.gettempdir()), chunk


def carries(params) -> bool:
    """Whether the float32 window holds these parameters' gradients exactly: float32, bfloat16 or float16 (a
    float64 parameter is summed by the backend instead)."""
    return all(p.dtype in (torch.float32, torch.bfloat16, torch.float16) for p in params)


class SharedMemorySum:
    """`sum_into_grads()` makes every parameter's `.grad` the sum of every rank's, for ranks of `world` (a
    `rlcompare.train.parallel.World` of CPU processes on one host). The window is float32: bfloat16 and float16
    gradients are added in float32 and rounded back once (`carries`). Construct it on every rank at once: it is a
    collective (rank 0 creates the window and tells the others where it is)."""

    def __init__(self, world, params: list[torch.nn.Parameter]):
        self.world, self.params = world, list(params)
        sizes = [p.numel() for p in self.params]
        self.n = sum(sizes)
        self.offsets = [0, *itertools.accumulate(sizes)][:-1]  # each parameter's start in the flat gradient
        path = None
        try:
            if world.rank == 0:
                folder, chunk = window_layout(self.n, world.size, CHUNK_ELEMENTS)
                path = folder / f"rlcompare-gradsum-{os.getpid()}-{secrets.token_hex(8)}"
                fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
                try:
                    os.ftruncate(fd, 4 * 2 * world.size * chunk)
                finally:
                    os.close(fd)
            where, self.chunk = world.broadcast_object(None if path is None else [str(path), chunk])
            n_floats = 2 * world.size * self.chunk
            self.slots = torch.from_file(where, shared=True, size=n_floats, dtype=torch.float32).view(
                2, world.size, self.chunk
            )
            world.barrier()  # every rank has mapped it: the name can go
        finally:  # and goes whatever happened (a rank that failed to map it fails the run at the barrier)
            if path is not None:
                path.unlink(missing_ok=True)
        self.total = torch.zeros(self.n)  # this rank's copy of the sum; each gradient becomes a view of it
        self.parity = 0

    def sum_into_grads(self, flag: bool = False) -> bool:
        """Every rank's gradients summed (a parameter without one counts as zeros), in rank order, into each
        parameter's `.grad`, which becomes a view of this rank's `total`. Returns whether `flag` holds on some
        rank: the first chunk's barrier is `World.any_true(flag)`, so a caller's flag costs no collective."""
        grads = [None if p.grad is None else p.grad.reshape(-1) for p in self.params]
        if self.n == 0:
            return self.world.any_true(flag)
        anywhere = False
        for lo in range(0, self.n, self.chunk):
            hi = min(lo + self.chunk, self.n)
            mine = self.slots[self.parity, self.world.rank, : hi - lo]
            self._copy_in(grads, lo, hi, mine)
            if lo == 0:  # every rank's slot of this chunk is written (the first barrier also carries the flag)
                anywhere = self.world.any_true(flag)
            else:
                self.world.barrier()
            every = self.slots[self.parity, :, : hi - lo]
            out = self.total[lo:hi]
            torch.add(every[0], every[1], out=out)
            for r in range(2, self.world.size):
                out.add_(every[r])
            self.parity ^= 1
        for p, at in zip(self.params, self.offsets):
            summed = self.total[at : at + p.numel()].view_as(p)
            p.grad = summed if p.dtype == torch.float32 else summed.to(p.dtype)  # bf16 / fp16: added in fp32
        return anywhere

    def _copy_in(self, grads: list, lo: int, hi: int, slot: torch.Tensor) -> None:
        """The flat gradient's elements [lo, hi) into `slot` (zeros for parameters without a gradient)."""
        for g, at, p in zip(grads, self.offsets, self.params):
            a, b = max(lo, at), min(hi, at + p.numel())
            if a >= b:
                continue
            if g is None:
                slot[a - lo : b - lo].zero_()
            else:
                slot[a - lo : b - lo].copy_(g[a - at : b - at])
