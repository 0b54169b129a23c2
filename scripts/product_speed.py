"""The update's matrix products through torch's default `mm` against oneDNN's packed product, at 1 thread, on the
4.2M model's shapes: a lead for the speed layer (docs/scaling.md, 2026-12-03). A measurement script, not a test.

    python scripts/product_speed.py [--rows 400,800] [--repeats 50]

For each [rows, in] x [in, out] product of a layer (q/k/v, the MLP's gate/up and down), the median time of
`x @ w` and of `rlcompare.fast.onednn.linear` with the weight packed once, interleaved, in GFLOP/s.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from rlcompare.fast import onednn  # noqa: E402

SHAPES = [(256, 768), (256, 2048), (1024, 256)]  # (in, out): 4.2M's q/k/v, gate/up, down (hidden 256)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", default="400,800", help="token rows, comma-separated")
    p.add_argument("--repeats", type=int, default=50)
    a = p.parse_args()
    torch.set_num_threads(1)
    if not onednn.available():
        sys.exit("oneDNN's products are not available in this torch build")
    print(f"1 thread, median of {a.repeats}, GFLOP/s")
    print(f"{'product':>26s} {'torch mm':>10s} {'oneDNN':>10s} {'ratio':>7s}")
    for rows in (int(x) for x in a.rows.split(",")):
        for k, n in SHAPES:
            x, w = torch.randn(rows, k), torch.randn(n, k)
            wt, packed = w.t().contiguous(), onednn.pack(w, rows)
            times = {"mm": [], "dnn": []}
            for _ in range(a.repeats + 3):
                for name, call in (("mm", lambda: x @ wt), ("dnn", lambda: onednn.linear(x, packed))):
                    t = time.perf_counter()
                    call()
                    times[name].append(time.perf_counter() - t)
            flops = 2 * rows * k * n
            mm, dnn = (flops / statistics.median(times[n_][3:]) / 1e9 for n_ in ("mm", "dnn"))
            print(f"{f'[{rows},{k}] x [{k},{n}]':>26s} {mm:10.1f} {dnn:10.1f} {dnn / mm:6.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
