"""A two-process gloo world for tests/train/test_audit3_ranks.py (not a test module itself).

    RANK=r WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=p python tests/train/lost_peer_worker.py OUT

Both ranks shard a small model with FSDP2 (`fully_shard`, as trainer.parallel=fsdp does) and run one forward and
backward together; then rank 1 exits, and rank 0 runs another inside `World.lost_peers_explained()`, the block the
trainer's update runs in. Rank 0 writes what that raised to OUT as JSON (type and message). Started without
torchrun, so that no agent stops rank 0 before it writes.
"""

from __future__ import annotations

import json
import os
import sys

import torch
import torch.distributed as dist
from torch.distributed.fsdp import fully_shard

from rlcompare.train.parallel import World


def main(out: str) -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    world = World(rank=rank, size=2, mode="fsdp")
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 1))
    for layer in model:
        fully_shard(layer)
    fully_shard(model)
    x = torch.ones(4, 8)
    model(x).sum().backward()  # together: the sharded model works
    dist.barrier()
    if rank == 1:
        os._exit(0)  # the peer stops (a kill, an OOM) without a word
    raised = {"type": None, "message": ""}
    try:
        with world.lost_peers_explained():
            for _ in range(3):
                model(x).sum().backward()
    except Exception as e:  # noqa: BLE001 - what reaches the run is what the test checks
        raised = {"type": type(e).__name__, "message": str(e)}
    with open(out, "w") as f:
        json.dump(raised, f)
    os._exit(0)  # the group cannot be destroyed cleanly without its peer


if __name__ == "__main__":
    main(sys.argv[1])
