"""Data parallelism: one run over the N processes torchrun starts (gloo on the CPU, NCCL on GPUs).

What a rank does (docs/scaling.md has the whole picture):

- it samples and scores its share of each round's prompt groups (`share`; on a step's first round, when the
  update's order of the groups is drawn already, the groups it will train on: `group_shares`), with one random
  stream per group (`rollout.streams=group`), and the shares are gathered (`gather_rows`), so that every rank
  holds the whole batch, sampled as one process would have sampled it;
- everything computed from the whole batch (advantages, the batch standard deviation, every aggregation's token,
  sequence and horizon totals, dynamic sampling's refill) is therefore the global quantity on every rank;
- each optimizer step's mini-batch is split again by whole groups (`share`); a rank backpropagates its rows
  with the global normalizers, and the gradients are summed over ranks (`GradientSum`, in buckets overlapped
  with the backward) before the step, as DDP sums them. The optimizer steps are then the same on every rank and the weights stay equal;
- update metrics are merged over ranks before they are reduced (`merge_metrics`); rank 0 alone writes.

Not `torch.nn.parallel.DistributedDataParallel`: its backward hooks need every rank to run a backward on every
step, and a mini-batch of fewer groups than ranks leaves some ranks with no rows; and the first update's forward
may not run through the model at all (the speed layer rebuilds it from the rollout). The all-reduce here is
DDP's bucketed one on the last micro-batch's backward (DDP with `no_sync` over micro-batches communicates the
same sum).

Every collective is a no-op on a world of one process.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import os
import sys
from dataclasses import dataclass

import torch

from rlcompare.config import ConfigError

# a collective waiting longer than this fails the run (a rank hung). Long: the other ranks wait in the first one
# while rank 0 checks the config and loads the model
TIMEOUT = datetime.timedelta(minutes=30)


class RankLost(RuntimeError):
    """A collective failed: another rank stopped (torchrun's summary names it and its exit code)."""


def launched_by_torchrun() -> bool:
    return "TORCHELASTIC_RUN_ID" in os.environ or ("WORLD_SIZE" in os.environ and "LOCAL_RANK" in os.environ)


def resolve_mode(parallel: str) -> str:
    """trainer.parallel: auto -> ddp under torchrun, else none; none, ddp and fsdp as they are."""
    if parallel == "auto":
        return "ddp" if launched_by_torchrun() else "none"
    return parallel


@dataclass(frozen=True)
class World:
    """This process's place in the run: rank `rank` of `size`; `mode` is trainer.parallel resolved."""

    rank: int = 0
    size: int = 1
    mode: str = "none"
    local_size: int = 1  # ranks on this machine (torchrun's LOCAL_WORLD_SIZE)
    comm_device: str = "cpu"  # where the backend's tensors must be: cpu (gloo) | cuda (NCCL)
    shared_memory: bool = False  # gradients summed through shared memory (`train.shared_sum`), not the backend
    owns_group: bool = False  # init_world started the process group (so `leave` ends it)

    @property
    def shards(self) -> bool:
        """Whether the policy's training state is sharded over the ranks (FSDP2, `rlcompare.train.sharding`)."""
        return self.mode == "fsdp" and self.size > 1

    @property
    def is_writer(self) -> bool:
        """Rank 0 alone writes results, checkpoints and W&B, and prints the closing line."""
        return self.rank == 0

    # ------------------------------------------------------------------ splitting
    def share(self, n: int) -> slice:
        """This rank's contiguous share of `n` units (prompt groups): sizes differ by at most one, rank order."""
        return _share(n, self.rank, self.size)

    def shares(self, n: int) -> list[list[int]]:
        """Every rank's `share` of `n` units, as the units' indices, in rank order."""
        return [list(range(n))[_share(n, r, self.size)] for r in range(self.size)]

    def group_shares(self, order: torch.Tensor, n_minibatches: int) -> list[list[int]]:
        """Every rank's prompt groups to sample, in rank order, when the step's mini-batch order of the groups
        (`order`) is drawn before sampling: in each mini-batch (`torch.tensor_split(order, n_minibatches)`, as the
        update splits it) the block `share_rows` will give that rank. Each rank then trains on the groups it
        sampled (what the speed layer's recorded first update needs), and the shares differ by at most one group
        per mini-batch."""
        parts = torch.tensor_split(order, n_minibatches)
        return [[int(g) for mb in parts for g in mb[_share(len(mb), r, self.size)]] for r in range(self.size)]

    def row_share(self, n_rows: int, unit: int, rank: int | None = None) -> slice:
        """The positions of a rank's share (this rank's by default) of `n_rows` rows, in whole units of `unit` rows
        (a group)."""
        part = _share(n_rows // unit, self.rank if rank is None else rank, self.size)
        return slice(part.start * unit, part.stop * unit)

    def share_rows(self, rows: torch.Tensor, unit: int, rank: int | None = None) -> torch.Tensor:
        """A rank's share of `rows` (whole units of `unit` rows: a group when the mini-batch holds groups)."""
        return rows if self.size == 1 else rows[self.row_share(len(rows), unit, rank)]

    # ------------------------------------------------------------------ collectives
    def gather_rows(self, x: torch.Tensor | None, pad_value=0) -> torch.Tensor | None:
        """The ranks' (b_r, ...) tensors as one (sum b_r, ...) in rank order; dim 1 (if any) padded on the right to
        the widest with `pad_value` (completions of different lengths)."""
        if self.size == 1 or x is None:
            return x
        if x.dtype == torch.bool:  # NCCL does not move bool
            return self.gather_rows(x.to(torch.uint8), pad_value=int(pad_value)).bool()
        if str(x.device.type) != self.comm_device:
            return self.gather_rows(x.to(self.comm_device), pad_value).to(x.device)
        import torch.distributed as dist

        shape = torch.tensor([x.shape[0], x.shape[1] if x.dim() > 1 else 0], dtype=torch.long, device=x.device)
        shapes = [torch.zeros_like(shape) for _ in range(self.size)]
        _collective(dist.all_gather, shapes, shape)
        rows = max(int(s[0]) for s in shapes)
        width = max(int(s[1]) for s in shapes)
        padded = x
        if x.dim() > 1 and x.shape[1] < width:
            padded = torch.nn.functional.pad(x, (0, width - x.shape[1]), value=pad_value)
        if x.shape[0] < rows:  # all_gather needs one shape on every rank
            fill = torch.full((rows - x.shape[0], *padded.shape[1:]), pad_value, dtype=x.dtype, device=x.device)
            padded = torch.cat([padded, fill])
        out = [torch.empty_like(padded) for _ in range(self.size)]
        _collective(dist.all_gather, out, padded.contiguous())
        return torch.cat([o[: int(s[0])] for o, s in zip(out, shapes)])

    def gather_many(self, xs: list, pad_values: list) -> list:
        """`gather_rows` of several tensors (None passes through) in two collectives instead of two each: their
        shapes in one, their values in another, as float64, which holds every value here exactly (floats of up to
        32 bits, bools, and integers below 2**53: token ids, lengths, counts). Every rank passes the same tensors
        by position, with the same dtypes."""
        if self.size == 1:
            return list(xs)
        import torch.distributed as dist

        present = [i for i, x in enumerate(xs) if x is not None]
        for i in present:
            x = xs[i]
            integer = not x.is_floating_point() and x.dtype != torch.bool
            if x.dim() > 2 or (integer and x.numel() and int(x.abs().max()) >= 2**53):
                raise ValueError(f"gather_many: tensor {i} ({x.dtype}, {tuple(x.shape)}) is not exact in float64")
        dev = self.comm_device
        shape = torch.tensor(
            [[xs[i].shape[0], xs[i].shape[1] if xs[i].dim() > 1 else 0] for i in present], dtype=torch.long, device=dev
        )
        shapes = [torch.zeros_like(shape) for _ in range(self.size)]
        _collective(dist.all_gather, shapes, shape)
        # each tensor travels as [widest rows, widest width (1 for a vector)] on any rank, padded
        widest = [(int(n), max(int(w), 1)) for n, w in torch.stack(shapes).amax(0).tolist()]
        parts = []
        for i, (n, w) in zip(present, widest):
            x = xs[i].to(dev)
            full = torch.full((n, w), float(pad_values[i]), dtype=torch.float64, device=dev)
            full[: x.shape[0], : x.shape[1] if x.dim() > 1 else 1] = x if x.dim() > 1 else x[:, None]
            parts.append(full.reshape(-1))
        packed = torch.cat(parts) if parts else torch.zeros(0, dtype=torch.float64, device=dev)
        out = [torch.empty_like(packed) for _ in range(self.size)]
        _collective(dist.all_gather, out, packed)
        gathered, at = list(xs), 0
        for j, (i, (n, w)) in enumerate(zip(present, widest)):
            whole = torch.cat([buf[at : at + n * w].view(n, w)[: int(sh[j, 0])] for buf, sh in zip(out, shapes)])
            whole = whole[:, : max(int(sh[j, 1]) for sh in shapes)] if xs[i].dim() > 1 else whole[:, 0]
            gathered[i] = whole.to(xs[i].dtype).to(xs[i].device)
            at += n * w
        return gathered

    def gather_objects(self, obj) -> list:
        """Every rank's `obj`, in rank order. `obj` is JSON data (numbers, strings, bools, None, lists and dicts
        with string keys; tuples come back as lists) and travels as JSON text, never pickled: torch's
        `all_gather_object` unpickles what a peer sends, which can run code (its documentation warns)."""
        if self.size == 1:
            return [obj]
        texts = self.gather_rows(_json_bytes(obj)[None, :])  # (size, widest): right-padded with 0 bytes
        return [_from_json_bytes(row) for row in texts]

    def broadcast_object(self, obj=None):
        """Rank 0's `obj` (JSON data, as for `gather_objects`) on every rank."""
        if self.size == 1:
            return obj
        import torch.distributed as dist

        dev = self.comm_device
        data = _json_bytes(obj if self.rank == 0 else None).to(dev)
        length = torch.tensor([data.numel()], dtype=torch.long, device=dev)
        _collective(dist.broadcast, length, src=0)
        if self.rank != 0:
            data = torch.empty(int(length), dtype=torch.uint8, device=dev)
        _collective(dist.broadcast, data, src=0)
        return _from_json_bytes(data)

    def broadcast_tensors(self, tensors: list[torch.Tensor]) -> None:
        """Rank 0's values of `tensors` (the weights) copied into every rank's, in place."""
        if self.size == 1:
            return
        import torch.distributed as dist

        with torch.no_grad():
            for t in tensors:
                moved = t.data if t.device.type == self.comm_device else t.data.to(self.comm_device)
                _collective(dist.broadcast, moved, src=0)
                if moved is not t.data:
                    t.data.copy_(moved)

    def leave(self) -> None:
        """End the process group this run started, once no collective is in flight (a finished run, a stop at a
        step's end). Without it the interpreter's exit can abort the process: gloo's worker threads may still
        release the last asynchronous work (the gradient buckets' all-reduces) and its tensors while Python
        finalizes, which aborts with SIGABRT (pytorch/pytorch#179291). torch's documentation asks for it too."""
        if not self.owns_group:
            return
        import torch.distributed as dist

        if dist.is_initialized():
            dist.destroy_process_group()

    @contextlib.contextmanager
    def lost_peers_explained(self):
        """A block whose collectives are not ours: under fsdp the sharded model's own (FSDP's all-gathers and
        reduce-scatters inside the forward and backward, the gradient norm's all-reduce). A peer that stops makes
        them fail with the backend's raw error, which becomes the RankLost our own collectives raise."""
        try:
            yield
        except RuntimeError as e:
            if self.size == 1 or isinstance(e, RankLost) or not _from_the_backend(e):
                raise
            raise _rank_lost(e) from None

    def barrier(self) -> None:
        """Wait until every rank is here: `any_true`'s one-element all-reduce (gloo's own barrier took 0.55 ms
        against 0.44 between 2 idle processes here)."""
        self.any_true(False)

    def any_true(self, flag: bool) -> bool:
        """Whether `flag` holds on some rank (a SIGTERM one rank received, a non-finite loss)."""
        if self.size == 1:
            return bool(flag)
        import torch.distributed as dist

        mark = torch.tensor([int(bool(flag))], dtype=torch.int32, device=self.comm_device)
        _collective(dist.all_reduce, mark, op=dist.ReduceOp.MAX)  # one collective, not gather_objects' two
        return bool(mark.item())


# the gradient sum's bucket size (elements): small enough that the first buckets' all-reduces run while the
# backward computes the rest (4 MiB of fp32 each; DDP's first bucket is 1 MiB, the others 25)
BUCKET_ELEMENTS = 1 << 20


class GradientSum:
    """Every trained parameter's gradient summed over the ranks, in place, overlapped with the backward that
    produces it, as DDP's buckets are: the parameters are cut into fixed buckets (in reverse order, the order the
    backward reaches them), and once the last micro-batch's backward has accumulated every gradient of a bucket
    (a post-accumulate-grad hook), that bucket's all-reduce starts, asynchronously. Buckets start in their order
    on every rank, whatever order the gradients arrive in, so the ranks' collectives always match. `finish`
    starts the buckets the backward did not complete (a rank with no rows, a parameter no loss reached: zeros),
    waits for all and makes each gradient a view of its bucket's sum (no copy back; a copy where the backend's
    device is not the gradient's). For two ranks each element is one sum, a + b, whatever the
    bucketing. The losses are normalized by the whole batch's totals, so the sum is the gradient one process
    computes on the whole mini-batch. A no-op on one process."""

    def __init__(self, world: World, params: list[torch.nn.Parameter]):
        self.world, self.armed = world, False
        self.buckets: list[list[torch.nn.Parameter]] = []
        self.shared = None  # the shared-memory sum, opened by the first `finish` (a collective; see there)
        self.shared_params: list[torch.nn.Parameter] | None = None  # what it sums; None: the backend's buckets
        if world.size == 1 or not params:
            return
        from rlcompare.train.shared_sum import carries

        if world.shared_memory and carries(params):  # ranks on one host's CPUs: one shared-memory sum in `finish`
            self.shared_params = params
            return
        size = BUCKET_ELEMENTS
        for p in reversed(params):
            if size + p.numel() > BUCKET_ELEMENTS and (not self.buckets or self.buckets[-1]):
                self.buckets.append([])
                size = 0
            self.buckets[-1].append(p)
            size += p.numel()
        self._bucket_of = {id(p): i for i, b in enumerate(self.buckets) for p in b}
        for p in params:
            p.register_post_accumulate_grad_hook(self._accumulated)
        self._missing: list[int] = []
        self._started: list = []

    def arm(self) -> None:
        """The next backward is this rank's last of the optimizer step: its gradients are final once accumulated."""
        if self.world.size > 1 and self.shared_params is None:
            self.armed, self._missing, self._started = True, [len(b) for b in self.buckets], []

    def _accumulated(self, p: torch.nn.Parameter) -> None:
        if not self.armed:
            return
        self._missing[self._bucket_of[id(p)]] -= 1
        while len(self._started) < len(self.buckets) and self._missing[len(self._started)] == 0:
            self._start(len(self._started))

    def _start(self, i: int) -> None:
        import torch.distributed as dist

        bucket = self.buckets[i]
        for p in bucket:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        flat = torch.cat([p.grad.reshape(-1) for p in bucket]).to(self.world.comm_device)
        self._started.append((_collective(dist.all_reduce, flat, op=dist.ReduceOp.SUM, async_op=True), flat))

    def finish(self, flag: bool = False) -> bool:
        """Start what the backward did not, wait for every bucket's sum and write it into the gradients. Returns
        whether `flag` (this rank's non-finite loss) holds on some rank: the shared-memory sum's barrier carries it,
        so the optimizer step's check costs no collective of its own there (`World.any_true` otherwise)."""
        if self.shared_params is not None:
            if self.shared is None:  # opened here, where every rank is, not in Trainer(): rank 0 builds its trainer
                from rlcompare.train.shared_sum import SharedMemorySum  # before the other ranks start theirs

                self.shared = SharedMemorySum(self.world, self.shared_params)
            return self.shared.sum_into_grads(flag)
        if self.world.size == 1 or not self.buckets:
            return self.world.any_true(flag)
        if not self.armed:  # no backward on this rank since the last step (no rows): every bucket from here
            self.arm()
        self.armed = False
        while len(self._started) < len(self.buckets):
            self._start(len(self._started))
        for bucket, (work, flat) in zip(self.buckets, self._started):
            _collective(work.wait)
            at = 0
            for p in bucket:
                n = p.numel()
                summed = flat[at : at + n].view_as(p.grad)
                if summed.device == p.grad.device and summed.dtype == p.grad.dtype:
                    p.grad = summed  # the optimizer reads it in place; the next step's zero_grad drops it
                else:
                    p.grad.copy_(summed)
                at += n
        self._started = []
        return self.world.any_true(flag)


def _share(n: int, rank: int, size: int) -> slice:
    base, extra = divmod(n, size)
    lo = rank * base + min(rank, extra)
    return slice(lo, lo + base + (1 if rank < extra else 0))


def _collective(fn, *args, **kwargs):
    try:
        return fn(*args, **kwargs)
    except RuntimeError as e:  # gloo / NCCL: a peer's socket closed, or the TIMEOUT passed
        raise _rank_lost(e) from None


def _from_the_backend(e: RuntimeError) -> bool:
    """A communication error (torch's DistError, or the plain RuntimeError gloo raises, which names itself)."""
    import torch.distributed as dist

    text = str(e)
    return isinstance(e, dist.DistError) or "gloo" in text or "NCCL" in text or "Connection reset by peer" in text


def _rank_lost(e: RuntimeError) -> RankLost:
    """The RankLost for a failed collective; rank 0 also prints it at once. torchrun stops the surviving ranks
    with SIGTERM right after a rank dies, which cut rank 0's own report short: its reason reached only
    summary.json, and the console showed Hydra's "Error executing job" without it."""
    lost = RankLost(
        f"a collective with the other ranks failed ({type(e).__name__}: {str(e)[:200]}): another "
        f"rank stopped or hung; torchrun's failure summary names it"
    )
    import torch.distributed as dist

    if not dist.is_initialized() or dist.get_rank() == 0:
        print(f"[rlcompare] rank 0: {lost}", file=sys.stderr, flush=True)
    return lost


def init_world(cfg) -> World:
    """The world trainer.parallel asks for, with the process group initialised under torchrun. Refuses, before
    anything heavy, settings under which ranks would not compute one run."""
    mode = resolve_mode(cfg.trainer.parallel)
    size = int(os.environ.get("WORLD_SIZE", "1")) if launched_by_torchrun() else 1
    if mode == "none":
        if size > 1:
            raise ConfigError(
                f"trainer.parallel=none under torchrun with {size} processes: each would train and write "
                f"the same run; set trainer.parallel=ddp (or auto), or run without torchrun"
            )
        return World()
    if size > 1 and cfg.rollout.streams != "group":
        raise ConfigError(
            f"trainer.parallel={mode} over {size} processes needs rollout.streams=group: with one random "
            f"stream for the batch, what is sampled would depend on how the batch is split. Add "
            f"rollout.streams=group (the run then equals a single process's with that setting)"
        )
    if size == 1:
        return World(mode=mode)
    import torch.distributed as dist

    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    cuda = str(cfg.device) in ("auto", "cuda") and torch.cuda.is_available()
    local_size = int(os.environ.get("LOCAL_WORLD_SIZE", str(size)))
    shared_memory = grad_sum_through_shared_memory(cfg.trainer.grad_sum, cuda=cuda, size=size, local_size=local_size)
    if cuda:
        torch.cuda.set_device(local_rank)  # device "cuda" now means this rank's GPU
    owns_group = not dist.is_initialized()  # else the caller's group (a test's worker): theirs to end
    if owns_group:
        dist.init_process_group("nccl" if cuda else "gloo", timeout=TIMEOUT)
    return World(
        rank=dist.get_rank(),
        size=dist.get_world_size(),
        mode=mode,
        local_size=local_size,
        comm_device="cuda" if cuda else "cpu",
        owns_group=owns_group,
        shared_memory=shared_memory,
    )


def grad_sum_through_shared_memory(grad_sum: str, *, cuda: bool, size: int, local_size: int) -> bool:
    """trainer.grad_sum resolved: whether the ranks sum gradients through shared memory (`shared_sum`), which
    needs every rank on this machine (torchrun's LOCAL_WORLD_SIZE equal to WORLD_SIZE) and the gradients on the
    CPU; `auto` takes it where it can, `shared_memory` where it cannot is refused before anything is loaded."""
    possible = not cuda and local_size == size
    if grad_sum == "shared_memory" and not possible:
        why = (
            "the gradients are on GPUs (NCCL sums them there)"
            if cuda
            else (f"only {local_size} of the {size} ranks run on this machine")
        )
        raise ConfigError(
            f"trainer.grad_sum=shared_memory needs every rank to be a CPU process on one machine, but {why}; "
            f"set trainer.grad_sum=auto (or backend)"
        )
    return possible and grad_sum != "backend"


def _json_bytes(obj) -> torch.Tensor:
    """`obj` as JSON text in a uint8 tensor. ASCII only (`ensure_ascii`), so no byte is 0 and a gather's zero
    padding is stripped safely. Dict keys must be strings (JSON would turn others into strings silently)."""
    _check_keys(obj)
    text = json.dumps(obj, ensure_ascii=True, allow_nan=True, separators=(",", ":"), default=_json_number)
    return torch.frombuffer(bytearray(text.encode("ascii")), dtype=torch.uint8)


def _from_json_bytes(data: torch.Tensor):
    return json.loads(data.cpu().numpy().tobytes().rstrip(b"\0").decode("ascii"))


def _json_number(x):
    """A 0-d tensor or a numpy scalar as its Python number; anything else is refused (TypeError)."""
    if isinstance(x, torch.Tensor) and x.numel() == 1:
        return x.item()
    if type(x).__module__ == "numpy" and hasattr(x, "item"):
        return x.item()
    raise TypeError(f"not JSON data, cannot be sent to the other ranks: {type(x).__name__}")


def _check_keys(obj) -> None:
    if isinstance(obj, dict):
        for k, v in obj.items():
            if not isinstance(k, str):
                raise TypeError(f"a dict key sent to the other ranks must be a string, not {type(k).__name__}")
            _check_keys(v)
    elif isinstance(obj, (list, tuple)):
        for v in obj:
            _check_keys(v)


def merge_metrics(world: World, values: dict, kinds: dict) -> tuple[dict, dict]:
    """A MetricsAccumulator's (name -> [(value, weight)], name -> kind) with every rank's entries, in rank order."""
    if world.size == 1:
        return values, kinds
    merged: dict = {}
    merged_kinds: dict = {}
    for vals, ks in world.gather_objects((values, kinds)):
        for name, entries in vals.items():
            merged.setdefault(name, []).extend(entries)
        merged_kinds.update(ks)
    return merged, merged_kinds
