"""A torchrun worker for tests/train/test_parallel.py (not a test module itself).

    python -m torch.distributed.run --nproc_per_node=N tests/train/dp_worker.py CASES.json OUT_DIR

For every case (a name, a list of Hydra overrides, optionally a parallel "mode", ddp by default, or fsdp, and a
"nan_rank" whose step-1 losses are made NaN)
every rank builds a Trainer in one data-parallel world and runs the case's steps; rank 0 writes `<name>.json` (the
metrics rows, the eval rows, the fraction of the training state it held, how many held-out prompts each rank
decoded, every rank's sum of the trained weights at the end, and how many update rows all ranks rebuilt from
their own rollouts) and `<name>.grads.safetensors` (the
gradient every optimizer step applied, after the reduction, whole: `s<step>.p<parameter>`). With `--reference`,
rank 0 then runs each case again as a world of one process (what `torchrun --nproc_per_node=1` gives) and writes
`<name>.ref.json` and `<name>.ref.grads.safetensors`; a case with `"reference": false` has none of its own (it
shares another case's).
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
from pathlib import Path
from rlcompare.train.trainer import TIMING_PREFIXES  # what varies with the machine, not the run


def _compose(overrides: list[str], results: Path):
    from hydra import compose, initialize_config_dir

    from rlcompare.train.app import conf_dir, register_resolvers

    register_resolvers()
    with initialize_config_dir(config_dir=conf_dir(), version_base=None):
        return compose("config", overrides=[f"results_dir={results}"] + overrides)


def _run(cfg, world, run_dir: Path, steps: int, nan_rank: int | None = None) -> tuple[list, list, dict]:
    from rlcompare.config import validate
    from rlcompare.train.run import _weights
    from rlcompare.train.sharding import full_tensor
    from rlcompare.train.trainer import Trainer

    import torch.distributed as dist

    tr = None
    if world.rank == 0:  # as run.train: rank 0 builds (and caches the warm start) before the others
        tr = Trainer(validate(cfg), run_dir, world=world)
    if world.size > 1:
        dist.barrier()
    if tr is None:
        tr = Trainer(validate(cfg), run_dir, world=world)
    world.broadcast_tensors(_weights(tr))  # as run.train does: rank 0's weights on every rank
    tr.weights_loaded()
    # AdamW's first steps are about lr * g / (|g| + eps): with eps = 1e-8 a gradient element at the rounding floor
    # (|g| near 1e-9, its sign set by the summation order) moves its weight by a full +-lr, so two summation orders
    # part after one step by up to 2 lr per such element. eps = 1e-6 leaves the signal's steps (elements of 1e-5 and up) and shrinks those a thousandfold.
    for opt in (tr.opt, tr.critic_opt):
        for group in opt.param_groups if opt is not None else []:
            group["eps"] = 1e-6
    grads: list = []
    step = tr.opt.step

    def recording_step(*a, **kw):  # every optimizer step's gradient, after the all-reduce and the clip
        # whole under fsdp (a collective: every rank records)
        grads.append({f"s{len(grads)}.p{i}": full_tensor(p.grad.detach()).clone() for i, p in enumerate(tr.params)})
        return step(*a, **kw)

    tr.opt.step = recording_step
    eval_rows, sample_rows = [0], tr.rollouts.sample

    def counted_sample(prompts, *, greedy, **kw):  # the held-out prompts this rank decodes
        eval_rows[0] += len(prompts) if greedy else 0
        return sample_rows(prompts, greedy=greedy, **kw)

    object.__setattr__(tr.rollouts, "sample", counted_sample)  # on this frozen context instance alone
    if nan_rank == world.rank:  # this rank alone sees a NaN loss in step 1 (its gradients stay finite)
        from rlcompare.train import update as update_lib

        micro_step = update_lib.micro_step  # run_update's call, looked up at each micro-batch

        def nan_micro_step(*a, **kw):
            total = micro_step(*a, **kw)
            return float("nan") if tr.state.step == 1 else total

        update_lib.micro_step = nan_micro_step  # this worker process's alone
    with _counted_rebuilt_rows() as rebuilt:
        evals = [tr.evaluate()[0]]
        rows = [tr.step() for _ in range(steps)]
        evals.append(tr.evaluate()[0])
    weight_sum = sum(float(full_tensor(p.detach()).double().sum()) for p in tr.params)  # whole under fsdp too
    counts = {
        "rebuilt_rows": sum(world.gather_objects(rebuilt[0])),
        "eval_rows": world.gather_objects(eval_rows[0]),
        "weight_sums": world.gather_objects(weight_sum),
    }
    return rows, evals, {k: v for g in grads for k, v in g.items()}, _held(tr), counts


@contextlib.contextmanager
def _counted_rebuilt_rows():
    """Counts, into the yielded one-element list, the update rows whose logits the speed layer rebuilt from this
    rank's own rollout (`fast.recorded_update_forward` not declining)."""
    from rlcompare import fast

    count, rebuild = [0], fast.recorded_update_forward

    def counted(model, recording, rows, *a, **kw):
        logits = rebuild(model, recording, rows, *a, **kw)
        count[0] += 0 if logits is None else len(rows)
        return logits

    fast.recorded_update_forward = counted
    try:
        yield count
    finally:
        fast.recorded_update_forward = rebuild


def _held(tr) -> dict:
    """The fraction of the policy's trained weights, and of their AdamW moments, that this rank holds: 1 unless
    sharded."""

    def local(t) -> int:
        return (t.to_local() if hasattr(t, "to_local") else t).numel()

    moments = [v for p in tr.params for k, v in tr.opt.state[p].items() if k in ("exp_avg", "exp_avg_sq")]
    return {
        "weights": sum(local(p) for p in tr.params) / sum(p.numel() for p in tr.params),
        "moments": sum(local(m) for m in moments) / sum(m.numel() for m in moments),
    }


def _write(out: Path, name: str, rows, evals, grads, held, counts) -> None:
    from safetensors.torch import save_file

    keep = [{k: v for k, v in r.items() if not k.startswith(TIMING_PREFIXES)} for r in rows]
    (out / f"{name}.json").write_text(json.dumps({"rows": keep, "evals": evals, "held": held, **counts}))
    save_file({k: v.contiguous() for k, v in grads.items()}, str(out / f"{name}.grads.safetensors"))


def main(argv: list[str]) -> int:
    import torch
    import torch.distributed as dist

    from rlcompare.train.parallel import World, grad_sum_through_shared_memory

    from rlcompare.fast import static_decode
    from tests.conftest import nan_filled

    static_decode.unwritten = nan_filled  # as in the test session: a read of an unwritten position fails here
    cases = json.loads(Path(argv[0]).read_text())
    out = Path(argv[1])
    reference = "--reference" in argv
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    for case in cases:
        # a case's "mode": ddp, or fsdp (the policy's training state sharded over the ranks)
        cfg = _compose(case["overrides"], out / "results")
        size = dist.get_world_size()  # trainer.grad_sum as init_world resolves it: these ranks share one machine
        shared = grad_sum_through_shared_memory(cfg.trainer.grad_sum, cuda=False, size=size, local_size=size)
        world = World(rank=dist.get_rank(), size=size, mode=case.get("mode", "ddp"), shared_memory=shared)
        ran = _run(cfg, world, out / "runs" / case["name"], case["steps"], case.get("nan_rank"))
        if world.rank == 0:
            _write(out, case["name"], *ran)
    if reference and world.rank == 0:
        for case in (c for c in cases if c.get("reference", True)):  # a case may share another's reference
            cfg = _compose(case["overrides"], out / "results")
            _write(
                out, case["name"] + ".ref", *_run(cfg, World(mode="ddp"), out / "runs" / case["name"], case["steps"])
            )
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.path.insert(0, os.getcwd())
    sys.exit(main(sys.argv[1:]))
