"""Which kinds of work slow each other on this machine's cores (issue 21's data-parallel efficiency): a
measurement script, not a test.

    python scripts/core_contention.py [--seconds 4] [--repeats 2]

Four 1-thread loops, each run alone and then beside another (two processes whose loops start together):
`gemm` (512 x 512 fp32 products: compute-bound), `small` (64 x 256 products and activations: per-call overhead,
data in the core's own cache), `memory` (an in-place add over two 32 MB vectors: memory bandwidth) and `decode`
(one decode step's products of the 4.2M model, 64 rows, through oneDNN's packed weights as the sampler runs them:
16.8 MB of weights per process, so one copy fits the 32 MB shared L3 of this host and two do not). Prints
each loop's rate beside the other as a share of its rate alone, `--repeats` times, alone measured again in
every repeat. Two ranks in lock-step run the same kind of work at the same moments; only the kinds that lose
here beside each other would cost them more than free processes. The rates alone also show how much the host's
own speed moves from one repeat to the next.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time

KINDS = ("gemm", "small", "memory", "decode")
PAIRS = (
    ("gemm", "gemm"),
    ("small", "small"),
    ("memory", "memory"),
    ("decode", "decode"),
    ("gemm", "memory"),
    ("small", "memory"),
    ("decode", "memory"),
)
# one layer's decode products of the 4.2M model (hidden 256, MLP 1024), [out, in]: q/k/v fused, o, gate/up fused, down
DECODE_LAYER = ((768, 256), (256, 256), (2048, 256), (256, 1024))


def loop(kind: str, seconds: float, start_at: float) -> float:
    """Iterations a second of `kind` for `seconds` from the wall-clock time `start_at`, at 1 thread."""
    import torch

    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(512, 512, generator=g), torch.randn(512, 512, generator=g)
    x, w = torch.randn(64, 256, generator=g), torch.randn(256, 256, generator=g)
    big, other = torch.randn(8_000_000, generator=g), torch.randn(8_000_000, generator=g)
    packed, inputs = [], {}
    if kind == "decode":
        from rlcompare.fast import onednn  # the sampler's products (weights packed once per rollout)

        packed = [onednn.pack(torch.randn(*s, generator=g), 64) for s in DECODE_LAYER * 4]  # 4 layers
        inputs = {n: torch.randn(64, n, generator=g) for n in (256, 1024)}
    work = {
        "gemm": lambda: torch.mm(a, b),
        "small": lambda: [torch.nn.functional.silu(x @ w) * x for _ in range(20)],
        "memory": lambda: big.add_(other, alpha=1e-9),
        "decode": lambda: [onednn.linear(inputs[p.shape[1]], p) for p in packed],
    }[kind]
    work()
    time.sleep(max(0.0, start_at - time.time()))  # every process of a pair past its imports: both loops overlap
    n, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        work()
        n += 1
    return n / (time.perf_counter() - start)


def rates(kinds: tuple[str, ...], seconds: float) -> list[float]:
    """Each of `kinds` run at once, one process each: their iterations a second."""
    start_at = time.time() + 5.0  # after both processes have imported torch
    procs = [
        subprocess.Popen(
            [sys.executable, __file__, "--loop", k, "--seconds", str(seconds), "--start-at", str(start_at)],
            stdout=subprocess.PIPE,
        )
        for k in kinds
    ]
    return [float(p.communicate()[0]) for p in procs]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seconds", type=float, default=4.0, help="each loop's length")
    p.add_argument("--repeats", type=int, default=2, help="every measurement, alone and beside, this many times")
    p.add_argument("--loop", choices=KINDS, help=argparse.SUPPRESS)  # one loop, its rate on stdout
    p.add_argument("--start-at", type=float, default=0.0, help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.loop:
        print(loop(a.loop, a.seconds, a.start_at))
        return 0
    for r in range(a.repeats):  # alone and beside measured in every repeat: the host drifts between repeats
        alone = {k: rates((k,), a.seconds)[0] for k in KINDS}
        print(f"repeat {r + 1}, alone, a second: " + ", ".join(f"{k} {alone[k]:.1f}" for k in KINDS))
        for pair in PAIRS:
            got = rates(pair, a.seconds)
            print(f"  {' beside '.join(pair)}: " + ", ".join(f"{k} {v / alone[k]:.2f}" for k, v in zip(pair, got)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
