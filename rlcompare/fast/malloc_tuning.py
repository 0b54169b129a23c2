"""Keep freed memory in the process (glibc malloc) instead of handing it back to the operating system.

glibc serves a block above its mmap threshold (128 KiB at start, raised up to 32 MiB as such blocks are freed)
with a fresh `mmap` and unmaps it on free, and it returns the top of the heap to the system once more than its
trim threshold is free there. An RL step allocates and frees the same activations every time, so on the CPU
they come back as fresh pages, each 4 KiB page a fault the kernel zero-fills: 1,000-7,000 faults a step at
the benchmark's 0.5M size. With the settings below the heap keeps what it had at its peak: a handful of faults
a step (`tests/fast/test_malloc_tuning.py`). Process against process, `rlcompare bench --sizes 0.5M --tools rlcompare`
with `--rlcompare-set trainer.keep_freed_memory=false` against the default: 1.03x faster with the setting at
0.5M (median of four alternated pairs), nothing measurable at 4.2M, the same peak memory. PyTorch's CPU
tuning guide gets the same effect by preloading jemalloc or tcmalloc; this needs neither.

The cost is that resident memory stays at the run's peak instead of shrinking between steps.
"""

from __future__ import annotations

import ctypes
import sys

# mallopt parameters (glibc's malloc.h)
M_TRIM_THRESHOLD, M_TOP_PAD, M_MMAP_THRESHOLD = -1, -2, -3
# blocks up to this size come from the heap (glibc's largest allowed threshold on 64-bit systems)
MMAP_THRESHOLD = 32 * 2**20
# free memory kept at the top of the heap before any is returned (the largest value mallopt takes)
TRIM_THRESHOLD = 2**31 - 1
# extra bytes asked of the system whenever the heap grows, so that growing is rare
TOP_PAD = 64 * 2**20


def keep_freed_memory() -> bool:
    """Set glibc's malloc to reuse freed memory (see the module doc). True when set; False where the C library
    is not glibc (no `mallopt`, e.g. macOS) or refuses a setting; then nothing changes."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt  # the C library this process already uses
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return all(
        mallopt(param, value) == 1
        for param, value in (
            (M_MMAP_THRESHOLD, MMAP_THRESHOLD),
            (M_TRIM_THRESHOLD, TRIM_THRESHOLD),
            (M_TOP_PAD, TOP_PAD),
        )
    )
