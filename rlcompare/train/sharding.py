"""FSDP2 (`trainer.parallel=fsdp`): the policy's training state sharded over the ranks.

The layout is a hybrid engine, as verl's FSDP actor beside its rollout engine:

- the *trained copy* is a deep copy of the policy with `torch.distributed.fsdp.fully_shard` on every transformer
  block and on the root. Its weights, gradients and AdamW moments are 1/N per rank, which is where training's
  memory goes (about 16 bytes per parameter in fp32 with AdamW, against 4 for the weights alone);
- the *full policy* (`Policy.model`) holds the whole weights on every rank. It samples, computes the
  reference's and the recomputed old log-probs and the step statistics, evaluates, and is what checkpoints
  save. Each rank decodes its own share of the groups with it, with no collective per decode step;
- after every optimizer step the trained copy's weights are gathered into the full policy (`copy_into_full`):
  one all-gather per trained tensor, the cost of one FSDP forward.

Gradients are reduce-scattered as a sum (divide factor 1): every loss is already normalized by the whole batch's
totals, so the sum over ranks is the gradient one process computes, as `parallel.GradientSum` gives DDP.

FSDP's collectives run inside every forward and backward of the trained copy, so every rank must run the same
number of them: the trainer pads a rank with fewer micro-batches with zero-weight ones (`update._pad_micro_steps`).

Checkpoints hold the full weights and the full optimizer state (`full_optimizer_state`), the format every
parallel mode reads: a run checkpointed under fsdp resumes under ddp or in one process, and back.
"""

from __future__ import annotations

import copy

import torch
from torch import nn

from rlcompare.models import base_model_of


def blocks(model: nn.Module) -> list[nn.Module]:
    """The transformer blocks to shard one by one: the modules whose class transformers names as not to be split
    (`_no_split_modules`, what Accelerate's FSDP wrapping reads), else the members of the longest ModuleList."""
    base = base_model_of(model)
    names = set(getattr(base, "_no_split_modules", None) or [])
    found = [m for m in model.modules() if type(m).__name__ in names]
    if found:
        return found
    lists = [m for m in model.modules() if isinstance(m, nn.ModuleList)]
    return list(max(lists, key=len)) if lists else []


def shard_copy(model: nn.Module, comm_device: str) -> nn.Module:
    """A deep copy of `model` with every block and the root under `fully_shard` on a 1-D mesh of every rank, its
    gradients reduced as a sum. The full `model` is left as it is."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import FSDPModule, fully_shard

    import torch.distributed as dist

    trained = copy.deepcopy(model)
    mesh = init_device_mesh(comm_device, (dist.get_world_size(),))
    for block in reversed(blocks(trained)):  # bottom-up, as FSDP2 asks, should a listed block hold another
        fully_shard(block, mesh=mesh)
    fully_shard(trained, mesh=mesh)
    for m in trained.modules():
        if isinstance(m, FSDPModule):
            m.set_gradient_divide_factor(1.0)  # a sum: the losses carry the whole batch's normalizers
            m.set_force_sum_reduction_for_comms(True)  # ReduceOp.SUM (gloo has no PREMUL_SUM, NCCL's factor is 1)
    return trained


def _pairs(trained: nn.Module, full: nn.Module, *, trainable_only: bool):
    full_params = dict(full.named_parameters())
    for name, p in trained.named_parameters():  # fully_shard keeps the parameter names
        if p.requires_grad or not trainable_only:
            yield p, full_params[name]


@torch.no_grad()
def copy_into_full(trained: nn.Module, full: nn.Module) -> None:
    """The trained copy's weights (the trainable ones: the frozen never change) into the full policy. A collective:
    every rank calls it, in the same order."""
    for sharded, whole in _pairs(trained, full, trainable_only=True):
        whole.copy_(sharded.full_tensor())


@torch.no_grad()
def copy_into_shards(full: nn.Module, trained: nn.Module) -> None:
    """The full policy's weights (restored from a checkpoint, or rank 0's) into each rank's shards."""
    for sharded, whole in _pairs(trained, full, trainable_only=False):
        sharded.copy_(_local_shard(whole, sharded))


def _local_shard(whole: torch.Tensor, like):
    """`whole` sharded as the DTensor `like`, each rank cutting its own shard from its own copy (every rank holds the
    same whole: a checkpoint they all read, or rank 0's broadcast weights), so no collective runs: a rank may call
    it while another is elsewhere (rank 0 restores before the others are told which checkpoint to read)."""
    from torch.distributed.tensor import distribute_tensor

    return distribute_tensor(whole.to(like.device), like.device_mesh, like.placements, src_data_rank=None)


def full_tensor(x):
    """A DTensor's whole value (a collective); any other value as it is."""
    return x.full_tensor() if hasattr(x, "full_tensor") else x


def full_optimizer_state(opt: torch.optim.Optimizer) -> dict:
    """`opt.state_dict()` with every sharded state tensor (AdamW's moments) gathered whole: the format of an
    optimizer over full tensors, which an optimizer over full tensors (none, ddp) gives as it is. Under fsdp a
    collective: every rank calls it."""
    sd = opt.state_dict()
    return {
        "state": {i: {k: full_tensor(v) for k, v in s.items()} for i, s in sd["state"].items()},
        "param_groups": sd["param_groups"],
    }


def load_optimizer_state(opt: torch.optim.Optimizer, sd: dict) -> None:
    """`opt.load_state_dict` of a full-tensor state (any parallel mode's checkpoint), each moment then sharded like
    its parameter where the parameter is sharded (fsdp); no collective."""
    from torch.distributed.tensor import DTensor

    opt.load_state_dict(sd)
    for group in opt.param_groups:
        for p in group["params"]:
            if not isinstance(p, DTensor):
                continue
            state = opt.state.get(p, {})
            for k, v in state.items():
                if torch.is_tensor(v) and not isinstance(v, DTensor) and v.shape == p.shape:
                    state[k] = _local_shard(v, p)
