"""What one synchronisation costs two busy CPU ranks (issue 21): gloo's one-element all-reduce (`World.any_true`,
the shared-memory gradient sum's barrier) against a flag each rank spins on in shared memory. A measurement
script, not a test.

    python scripts/collective_latency.py [--rounds 400] [--work 10]

Two gloo processes (1 thread each) run `--rounds` rounds of the same work (`--work` products of 512 x 512
matrices, about as long as a few of a training step's layers), then synchronise, alternating the two ways round by
round so the host's drift hits both alike. Prints the median, mean and 90th percentile of each rank's wait: the
median is what the mechanism itself costs; the mean adds the waits for the other rank, whose work took longer by
chance (jitter), which no mechanism removes.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

_WORKER = r"""
import os, statistics, sys, time, torch, torch.distributed as dist
rank, store, flags_path, rounds, work = int(sys.argv[1]), sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
torch.set_num_threads(1)
dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=2)
flags = torch.from_file(flags_path, shared=True, size=2, dtype=torch.int64)  # each rank writes its own slot only
a, mark = torch.randn(512, 512), torch.zeros(1, dtype=torch.int32)
waits, spins = {"gloo": [], "shared memory": []}, 0
for i in range(rounds):
    for _ in range(work):
        a @ a
    t = time.perf_counter()
    if i % 2:
        dist.all_reduce(mark, op=dist.ReduceOp.MAX)
        waits["gloo"].append(time.perf_counter() - t)
    else:
        spins += 1
        flags[rank] = spins
        while int(flags.min()) < spins:
            pass
        waits["shared memory"].append(time.perf_counter() - t)
for name, w in waits.items():
    w = sorted(w)
    print(f"rank {rank} {name:14s} median {1000 * statistics.median(w):6.3f} ms  mean {1000 * statistics.mean(w):6.3f}"
          f"  p90 {1000 * w[int(0.9 * len(w))]:6.3f}")
dist.destroy_process_group()
"""


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=400)
    p.add_argument("--work", type=int, default=10, help="512 x 512 products between synchronisations")
    a = p.parse_args()
    with tempfile.TemporaryDirectory(prefix="collective_latency-") as tmp:
        flags = Path(tmp) / "flags"
        flags.write_bytes(bytes(16))
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        cmds = [
            [sys.executable, "-c", _WORKER, str(r), str(Path(tmp) / "store"), str(flags), str(a.rounds), str(a.work)]
            for r in range(2)
        ]
        procs = [
            subprocess.Popen(c, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for c in cmds
        ]
        outs = [proc.communicate()[0] for proc in procs]
    for proc, out in zip(procs, outs):
        if proc.returncode != 0:
            sys.exit(out)
        print(out.strip())
    return 0


if __name__ == "__main__":
    sys.exit(main())
