"""fp32 matrix products through oneDNN on the CPU, where they beat torch's default (MKL) path.

Measured on this project's 2-core AVX-512 machine (torch 2.13, interleaved repeats, GFLOP/s):

| product | torch (MKL) | oneDNN |
|---|---|---|
| decode projection, 128 rows x 512 -> 1536 (weight packed once) | 145-161 | 212-217 |
| decode projection, 128 rows x 512 -> 4096 (packed) | 111-119 | 204-212 |
| decode projection, 128 rows x 2048 -> 512 (packed) | 142-158 | 210-214 |

In the sampler (`static_decode`) that made a 25M-parameter model's rollout 1.72 s instead of 2.51 s and a
4.2M one's 0.20 s instead of 0.23 s. A weight is packed once per rollout (120-240 us), so small weights do
not pay: at 128 rows, 128 -> 128 runs in 34 us vs torch's 27 us, and 512 -> 128 (the 0.5M model's MLP output,
65,536 elements) in 92 us vs 94 us, which 15 decode steps do not turn into a packing's worth. 128 -> 1024 (the
0.5M model's gate/up, 131,072) gains 56 us a step (167 vs 223 us). Weights under `MIN_SIZE` elements keep
torch's product. The ops are `torch.ops.mkldnn._linear_pointwise`
and `_reorder_linear_weight`, the ones torch's own compiler emits for CPU linears; they are internal, so
`available()` probes them once (present, and equal to `F.linear` on a small case) and every caller falls
back to plain torch when they are not.
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F


@functools.lru_cache(maxsize=None)
def available() -> bool:
    try:
        if not torch.backends.mkldnn.is_available():
            return False
        g = torch.Generator().manual_seed(0)
        x, w, b = (torch.randn(*s, generator=g) for s in ((5, 16), (24, 16), (24,)))
        got = torch.ops.mkldnn._linear_pointwise(x, torch.ops.mkldnn._reorder_linear_weight(w, 5), b, "none", [], "")
        return bool(torch.allclose(got, F.linear(x, w, b), rtol=1e-5, atol=1e-5))
    except (AttributeError, RuntimeError, TypeError):
        return False


MIN_SIZE = 2**17


def usable(weight: torch.Tensor) -> bool:
    """oneDNN applies to this [out, in] weight: float32 on the CPU, at least `MIN_SIZE` elements, and the ops
    work in this torch build."""
    return weight.device.type == "cpu" and weight.dtype == torch.float32 and weight.numel() >= MIN_SIZE and available()


def pack(weight: torch.Tensor, rows: int) -> torch.Tensor:
    """`weight` [out, in] reordered for products with about `rows` input rows (any row count works)."""
    return torch.ops.mkldnn._reorder_linear_weight(weight.detach(), rows)


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """`F.linear(x, weight, bias)` (weight [out, in], packed or not); no autograd."""
    return torch.ops.mkldnn._linear_pointwise(x, weight, bias, "none", [], "")
