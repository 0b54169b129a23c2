"""Random streams keyed by prompt group, so that what is sampled does not depend on how a batch is split.

With `rollout.streams=group` every prompt group draws its tokens from a generator of its own, seeded from the
key (run seed, step, sampling round, group index in the round). Rank r of a data-parallel run samples only its
share of the groups, yet each group's completions are the ones a single process would sample (up to the
floating-point rounding of a batch of another shape): docs/scaling.md.
"""

from __future__ import annotations

import hashlib

import torch


def group_seed(*key: int) -> int:
    """A 63-bit seed for `key` (e.g. seed, step, round, group): the first 8 bytes of its BLAKE2b digest, so that
    nearby keys give unrelated streams (seeding with seed + step + group would make (step 1, group 2) and
    (step 2, group 1) share one)."""
    data = b"".join((int(k) % 2**64).to_bytes(8, "little") for k in key)
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "little") >> 1


class GroupStreams:
    """One torch generator per prompt group of `group_size` contiguous rows.

    `uniform(vocab)` is called once per decode position and draws each group's (group_size, vocab) uniforms,
    for every row of the group whether or not it is still decoding: the draw a row gets at position t is then a
    function of its key and t alone, not of which other rows share the batch or when they stopped."""

    def __init__(self, keys: list[tuple[int, ...]], group_size: int, device):
        self.group_size = group_size
        self.keys = [tuple(k) for k in keys]  # each group's key (multi-turn episodes key their later turns by it)
        self.device = torch.device(device)
        self.generators = []
        for key in keys:
            g = torch.Generator(device=self.device)
            g.manual_seed(group_seed(*key))
            self.generators.append(g)

    def __len__(self) -> int:
        return len(self.generators) * self.group_size

    def uniform(self, vocab: int, dtype=torch.float32) -> torch.Tensor:
        """(len(self), vocab) U[0, 1) draws: the next position's, group by group."""
        return torch.cat(
            [
                torch.rand((self.group_size, vocab), generator=g, device=self.device, dtype=dtype)
                for g in self.generators
            ]
        )

    def uniform_(self, out: torch.Tensor) -> torch.Tensor:
        """`uniform(out.shape[1], out.dtype)` written into `out` (`[len(self), vocab]`, contiguous) in place, group by
        group: the same draws (`torch.rand` fills its new tensor with `uniform_` from the generator) without a new
        `[rows, vocab]` tensor each position (the graph engine's preallocated buffer)."""
        if out.shape[0] != len(self) or not out.is_contiguous():
            raise ValueError(f"uniform_ needs a contiguous [{len(self)}, vocab] tensor, got {tuple(out.shape)}")
        for i, g in enumerate(self.generators):
            out[i * self.group_size : (i + 1) * self.group_size].uniform_(0.0, 1.0, generator=g)
        return out
