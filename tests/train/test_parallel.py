"""Data-parallel training (issue #21), for real: torch.distributed with gloo over 2 processes started by torchrun.

A 2-rank run must compute what one process computes on the same global batch: the same samples (one random
stream per prompt group), the same advantages and per-token weights (every normalizer the whole batch's), the
same gradient (summed over ranks), the same metrics rows, and a run killed and resumed equals an uninterrupted
one; with rollout.staleness too (the queue of rollouts sampled ahead is every rank's, whole). Rows are compared
to float tolerance: a batch split differently is summed in another order.
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from rlcompare.algos.accepted import AGGREGATIONS
from rlcompare.config import ConfigError
from rlcompare.results import read_jsonl
from rlcompare.rollout.sampler import left_pad, sample
from rlcompare.rollout.streams import GroupStreams, group_seed
from rlcompare.train.parallel import World, init_world, resolve_mode
from rlcompare.train.run import train
from tests.conftest import FAST
from rlcompare.train.trainer import TIMING_PREFIXES  # what varies with the machine, not the run

REPO = Path(__file__).resolve().parents[2]
TIMING = TIMING_PREFIXES
# another summation order. Measured worst cases: 4e-4 relative on kl/rollout (a mean of log-prob differences
# near 1e-3, each log-prob rounded near 1e-7: 3e-6 absolute), under 1e-5 relative on the rest
RTOL, ATOL = 1e-4, 1e-5
# the shipped warm start (held-out accuracy 0.215): rewards vary within groups, so the gradients are the
# signal's, not rounding noise that AdamW would scale up to a full step
GROUPS = ["rollout.streams=group", "trainer.eval_every=1000", "model.warm_start.steps=300"]


def _env(tmp_path: Path) -> dict:
    path = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p)
    return {**os.environ, "PYTHONPATH": path, "OMP_NUM_THREADS": "1", "TMPDIR": str(tmp_path)}


def _torchrun(n: int, *args: str) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={n}", *args]


def _close(a, b, where: str) -> None:
    """Two metrics rows (or values) equal to float tolerance; None and NaN equal only themselves."""
    if isinstance(a, dict):
        assert a.keys() == b.keys(), where
        for k in a:
            if not k.startswith(TIMING):
                _close(a[k], b[k], f"{where} {k}")
    elif isinstance(a, float) or isinstance(b, float):
        assert (math.isnan(a) and math.isnan(b)) or abs(a - b) <= ATOL + RTOL * abs(b), f"{where}: {a} != {b}"
    else:
        assert a == b, f"{where}: {a!r} != {b!r}"


# ----------------------------------------------------------------------------- no process group needed
@pytest.mark.parametrize(
    "n,size,shares",
    [(4, 2, [(0, 2), (2, 4)]), (3, 2, [(0, 2), (2, 3)]), (1, 2, [(0, 1), (1, 1)]), (5, 3, [(0, 2), (2, 4), (4, 5)])],
)
def test_share_splits_units_contiguously_with_sizes_differing_by_at_most_one(n, size, shares):
    got = [World(rank=r, size=size).share(n) for r in range(size)]
    assert [(s.start, s.stop) for s in got] == shares


def test_share_rows_keeps_whole_groups():
    rows = torch.tensor([8, 9, 10, 11, 0, 1, 2, 3, 4, 5, 6, 7])  # 3 groups of 4, shuffled
    assert World(rank=0, size=2).share_rows(rows, 4).tolist() == [8, 9, 10, 11, 0, 1, 2, 3]
    assert World(rank=1, size=2).share_rows(rows, 4).tolist() == [4, 5, 6, 7]
    assert World(rank=1, size=4).share_rows(rows, 4).tolist() == [0, 1, 2, 3]
    assert World(rank=3, size=4).share_rows(rows, 4).tolist() == []  # fewer groups than ranks: an empty share


def test_group_shares_give_each_rank_the_groups_it_trains_on_in_every_mini_batch():
    # 6 groups in the update's order 3 0 2 | 1 5 4 (2 mini-batches); in each, share_rows gives rank 0 the first
    # 2 groups and rank 1 the last (3 = 2 + 1), so rank 0 samples 3 0 1 5 and rank 1 samples 2 4
    order = torch.tensor([3, 0, 2, 1, 5, 4])
    assert World(rank=1, size=2).group_shares(order, 2) == [[3, 0, 1, 5], [2, 4]]
    for r in range(2):  # the same rows share_rows hands that rank in each mini-batch, groups of 4 rows
        mine = set(World(rank=r, size=2).group_shares(order, 2)[r])
        for mb in torch.tensor_split(order, 2):
            rows = (mb[:, None] * 4 + torch.arange(4)).reshape(-1)
            assert {int(x) // 4 for x in World(rank=r, size=2).share_rows(rows, 4)} <= mine
    assert World(size=3).group_shares(order, 1) == [[3, 0], [2, 1], [5, 4]]
    assert World(size=2).shares(3) == [[0, 1], [2]]


def test_gradient_buckets_follow_the_backward_and_start_in_their_order(monkeypatch):
    """GradientSum's buckets: the parameters in reverse (the backward's order), cut at BUCKET_ELEMENTS, a larger
    one alone; armed, a bucket starts once its last gradient is accumulated and every earlier bucket has started,
    so the ranks' collectives match whatever order the gradients arrive in; unarmed, nothing starts."""
    from rlcompare.train import parallel

    monkeypatch.setattr(parallel, "BUCKET_ELEMENTS", 10)
    params = [torch.nn.Parameter(torch.zeros(n)) for n in (6, 6, 3, 20)]
    gs = parallel.GradientSum(World(rank=0, size=2), params)
    assert [[len(p) for p in b] for b in gs.buckets] == [[20], [3, 6], [6]]
    # the real start records the bucket's collective in gs._started; the fake one records the bucket's number
    monkeypatch.setattr(gs, "_start", lambda i: gs._started.append(i))
    (params[0].sum() + params[1].sum()).backward()  # not armed: an earlier micro-batch's backward
    assert gs._started == []
    gs.arm()
    params[0].grad = params[1].grad = None
    params[2].sum().backward()  # bucket 1 half done, bucket 0 not yet: nothing may start
    assert gs._started == []
    (params[0].sum() * params[3].sum()).backward()  # bucket 0 done: it starts, bucket 1 still waits for params[1]
    assert gs._started == [0]
    params[1].sum().backward()
    assert gs._started == [0, 1, 2]  # bucket 2 (params[0]) was complete: it starts right after


def test_group_seeds_differ_for_swapped_or_nearby_keys():
    seeds = {group_seed(0, s, 0, g) for s in range(1, 4) for g in range(4)}
    assert len(seeds) == 12 and group_seed(0, 1, 0, 2) != group_seed(0, 2, 0, 1)
    assert group_seed(3, 1, 0, 2) == group_seed(3, 1, 0, 2) and 0 <= group_seed(3, 1, 0, 2) < 2**63


def _tiny_model():
    """tests/rollout/test_rollout.py's model, with EOS made likelier (logit about 3 where the others are about 0.1 at
    the prompts' ends), so that rows end at different steps."""
    from tests.rollout.test_rollout import _model

    model, tok = _model()
    ids, mask = left_pad([[tok.bos_token_id] + tok(t).input_ids for t in PROMPTS], tok.pad_token_id, "cpu")
    with torch.no_grad():
        h = model.model(input_ids=ids, attention_mask=mask).last_hidden_state[:, -1].mean(0)
        model.lm_head.weight[tok.eos_token_id] = h * (3 / h.norm() ** 2)
    return model, tok


PROMPTS = ["12+7=", "3+4=", "100+1=", "5="]


def test_group_streams_sample_the_same_tokens_whatever_the_split():
    model, tok = _tiny_model()
    texts = PROMPTS
    G, keys = 3, [(0, 1, 0, j) for j in range(4)]

    def draw(idx):
        ids, mask = left_pad([[tok.bos_token_id] + tok(texts[j]).input_ids for j in idx], tok.pad_token_id, "cpu")
        return sample(
            model,
            ids,
            mask,
            max_new_tokens=12,
            eos_id=tok.eos_token_id,
            pad_id=tok.pad_token_id,
            repeats=G,
            streams=GroupStreams([keys[j] for j in idx], G, "cpu"),
        )

    whole = draw([0, 1, 2, 3])
    halves = [draw([0]), draw([1, 2, 3])]  # another split, other prompt padding, rows ending at other steps
    assert len(set(whole.lengths.tolist())) > 1  # rows did end at different steps
    T = whole.ids.shape[1]
    joined = torch.cat(
        [torch.nn.functional.pad(h.ids, (0, T - h.ids.shape[1]), value=tok.pad_token_id) for h in halves]
    )
    assert torch.equal(joined, whole.ids)
    other = sample(
        model,
        *left_pad([[tok.bos_token_id] + tok(t).input_ids for t in texts], tok.pad_token_id, "cpu"),
        max_new_tokens=12,
        eos_id=tok.eos_token_id,
        pad_id=tok.pad_token_id,
        repeats=G,
        streams=GroupStreams([(0, 2, 0, j) for j in range(4)], G, "cpu"),
    )
    assert not torch.equal(other.ids, whole.ids)  # another step's keys: other draws (the check can fail)


def test_fsdp_shards_each_transformer_block_transformers_names():
    from torch import nn

    from rlcompare.train.sharding import blocks
    from tests.rollout.test_rollout import _model

    model, _ = _model()  # a 2-layer Llama: _no_split_modules = ["LlamaDecoderLayer"]
    assert blocks(model) == list(model.model.layers)
    plain = nn.Sequential(nn.Embedding(4, 8), nn.ModuleList([nn.Linear(8, 8)]), nn.ModuleList([nn.Linear(8, 8)] * 3))
    assert blocks(plain) == list(plain[2])  # no transformers names: the longest ModuleList's members


def _cfg(compose, *overrides):
    from rlcompare.config import validate

    return validate(compose(*overrides))


@pytest.mark.slow  # over ~1.5 s on 2 idle cores: out of the quick subset (issue 63), in CI's whole suite
def test_torchrun_settings_that_would_change_the_run_are_refused_before_anything_heavy(compose, monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("LOCAL_RANK", "0")
    with pytest.raises(ConfigError, match=r"trainer\.parallel=ddp over 2 processes needs rollout\.streams=group"):
        init_world(_cfg(compose))
    with pytest.raises(ConfigError, match=r"trainer\.parallel=fsdp over 2 processes needs rollout\.streams=group"):
        init_world(_cfg(compose, "trainer.parallel=fsdp"))
    with pytest.raises(ConfigError, match=r"trainer\.parallel=none under torchrun with 2 processes"):
        init_world(_cfg(compose, "trainer.parallel=none", "rollout.streams=group"))
    assert resolve_mode("auto") == "ddp"
    from rlcompare.cli import main

    assert main(["train", "-m", "seed=0,1"]) == 2  # a multirun on every rank: refused before Hydra starts
    monkeypatch.delenv("WORLD_SIZE")
    monkeypatch.delenv("LOCAL_RANK")
    monkeypatch.delenv("TORCHELASTIC_RUN_ID", raising=False)
    assert resolve_mode("auto") == "none" and init_world(_cfg(compose)) == World()
    with pytest.raises(ConfigError, match=r"trainer\.parallel='zero3' must be auto .* or fsdp"):
        _cfg(compose, "trainer.parallel=zero3")


def test_leave_ends_the_group_the_run_started_and_no_other(tmp_path):
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        World(owns_group=False).leave()  # a caller's group (a test worker's): left alone
        assert dist.is_initialized()
        World(owns_group=True).leave()
        assert not dist.is_initialized()
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


# rank r's payload: sizes differ (the gather pads), non-ASCII text, NaN, exact floats, a 0-d tensor and a tuple
_OBJECTS_WORKER = r"""
import math, sys, torch, torch.distributed as dist
from rlcompare.train.parallel import World

rank, store = int(sys.argv[1]), sys.argv[2]
dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=2)
def refused(*a, **k):
    raise AssertionError("a pickling collective was called")
dist.all_gather_object = dist.broadcast_object_list = refused
w = World(rank=rank, size=2, mode="ddp")
mine = {"rank": rank, "text": "r\u00e9sum\u00e9 " * (1 + 40 * rank), "x": 0.1 + rank, "nan": float("nan"),
        "t": torch.tensor(2.5 * rank), "pair": (rank, None, True)}
got = w.gather_objects(mine)
assert [g["rank"] for g in got] == [0, 1], got
assert got[1]["text"] == "r\u00e9sum\u00e9 " * 41 and got[0]["x"] == 0.1 and got[1]["x"] == 1.1
assert all(math.isnan(g["nan"]) for g in got) and got[1]["t"] == 2.5 and got[0]["pair"] == [0, None, True]
start = w.broadcast_object({"config": "a: 1\n" * 500, "checkpoint": None} if rank == 0 else "ignored")
assert start == {"config": "a: 1\n" * 500, "checkpoint": None}, start
assert w.broadcast_object(None if rank == 0 else {"x": 1}) is None
# gather_many: what gather_rows gives tensor by tensor, in two collectives: widths and row counts that differ by
# rank (rank 1 has an empty [0, 0] share, as a rank with no groups in a round), None, a vector, bools, exact values
ids = torch.tensor([[5, 2**52 + 1, 7]]) if rank == 0 else torch.zeros((0, 0), dtype=torch.long)
logp = torch.tensor([[0.1, float("nan"), -float("inf"), 1e-30]]) if rank == 0 else torch.zeros((0, 0))
flags = torch.tensor([True, False]) if rank == 0 else torch.tensor([True])
counts = torch.tensor([3 + rank])
pads = [-1, 0.0, None, False, 0]
got = w.gather_many([ids, logp, None, flags, counts], pads)
want = [w.gather_rows(x, p) if x is not None else None for x, p in zip([ids, logp, None, flags, counts], pads)]
assert got[2] is None and all(g.dtype == r.dtype and g.shape == r.shape for g, r in zip(got, want) if r is not None)
assert all(torch.equal(g, r) for g, r in zip(got, want) if r is not None and not r.is_floating_point()), got
assert torch.allclose(got[1], want[1], rtol=0, atol=0, equal_nan=True) and got[0][0, 1] == 2**52 + 1, got
assert got[3].tolist() == [True, False, True] and got[4].tolist() == [3, 4]
# any_true: a flag one rank raised (a SIGTERM, a NaN loss) holds on both; one no rank raised on neither
assert [w.any_true(rank == 1), w.any_true(rank == 0), w.any_true(False), w.any_true(True)] == [True, True, False, True]
dist.destroy_process_group()
print("ok", rank)
"""


@pytest.mark.slow
def test_object_collectives_carry_json_between_ranks_and_never_unpickle(tmp_path):
    """What ranks exchange besides tensors (metrics, counts, rank 0's config) travels as JSON text in a uint8
    tensor, not through torch's object collectives, which unpickle what a peer sends; `gather_many` gathers
    several tensors exactly as `gather_rows` does one by one; `any_true` is one all-reduce of a flag."""
    env = _env(tmp_path)
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _OBJECTS_WORKER, str(r), str(tmp_path / "store")],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for r in range(2)
    ]
    outs = [p.communicate(timeout=120)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    assert [o.strip().splitlines()[-1] for o in outs] == ["ok 0", "ok 1"]


def test_object_collectives_refuse_what_json_would_change_or_cannot_carry():
    from rlcompare.train.parallel import _from_json_bytes, _json_bytes

    with pytest.raises(TypeError, match="must be a string"):
        _json_bytes({"metrics": {3: 1.0}})  # JSON would hand the peers the key "3"
    with pytest.raises(TypeError, match="not JSON data"):
        _json_bytes([Path("/tmp")])
    with pytest.raises(TypeError, match="not JSON data"):
        _json_bytes(torch.ones(2))  # a tensor goes through gather_rows, not as text
    padded = torch.cat([_json_bytes([1.5, "x"]), torch.zeros(3, dtype=torch.uint8)])  # a gather's padding
    assert _from_json_bytes(padded) == [1.5, "x"]


@pytest.mark.parametrize(
    "ends, leaves",
    [("returns", True), ("terminated", True), ("fails", False)],
)
def test_a_rank_leaves_the_group_after_a_finished_run_or_a_stop_but_not_mid_collective(
    compose, monkeypatch, ends, leaves
):
    """train() ends the process group before the interpreter exits (pytorch/pytorch#179291: an exit with gloo's
    asynchronous work still held can abort), except after an error, where a collective may still be in flight."""
    from rlcompare.train import run

    left = []
    monkeypatch.setattr(World, "leave", lambda self: left.append(self.rank))
    monkeypatch.setattr(run, "init_world", lambda cfg: World(rank=1, size=2, mode="ddp", owns_group=True))

    def as_rank(cfg, world):
        if ends == "terminated":
            raise run.Terminated()
        if ends == "fails":
            raise RuntimeError("a rank's step failed")
        return {"rank": world.rank, "status": "completed"}

    monkeypatch.setattr(run, "_train_as_rank", as_rank)
    cfg = compose("rollout.streams=group")
    if ends == "returns":
        assert train(cfg) == {"rank": 1, "status": "completed"}
    else:
        with pytest.raises(run.Terminated if ends == "terminated" else RuntimeError):
            train(cfg)
    assert left == ([1] if leaves else [])


# ----------------------------------------------------------------------------- 2 ranks against 1, case by case
# DAPO's soft overlong punishment (lengths 3 to 6 of the 6-token budget lose 0 to 0.75): rewards differ within
# almost every group, so every mini-batch's gradient carries signal
SIGNAL = ["algorithm.overlong.soft_punishment=true", "algorithm.overlong.cache_len=4"]
# GRPO without its KL term but in one case: with policy = reference, k3's gradient is 0 analytically and at the
# rounding floor numerically, so an optimizer step whose rows all have zero advantage would compare noise
NO_KL = "algorithm.kl.coef=0"
CASES = [
    {"name": f"agg_{a}", "overrides": [f"algorithm.aggregation={a}", "algorithm.horizon=6", NO_KL]}
    for a in AGGREGATIONS
] + [
    {"name": "batch_std", "overrides": ["algorithm.advantage.scale=batch", NO_KL]},
    {"name": "kl_in_loss", "overrides": []},  # GRPO as shipped: k3 in the loss, the reference's log-probs gathered
    # DAPO: dynamic sampling refills the global batch; overlong filter and shaping; clip-higher
    {"name": "dapo", "overrides": ["algorithm=dapo"]},
    # PPO: the critic's values gathered, its gradient all-reduced; GAE whitened over the whole batch; KL in reward
    {"name": "ppo", "overrides": ["algorithm=ppo", "algorithm.kl.coef=0.05"]},
    # statistics of a whole optimizer step across ranks and micro-batches (the top-entropy threshold)
    {
        "name": "top_entropy_micro",
        "overrides": ["algorithm.top_entropy_quantile=0.5", "trainer.micro_batch_size=4", NO_KL],
    },
    # 3 groups over 2 ranks (2 + 1), mini-batches of 2 and 1 groups: a rank with no rows in one of them
    {"name": "uneven", "overrides": ["trainer.prompts_per_step=3", "trainer.recompute_old_logp=true", NO_KL]},
]
# rollout.staleness=2 (issue 44): every rank holds the whole queue (each rollout gathered before it is queued) and
# trains on the oldest; 4 steps, so that step 4 trains on a rollout sampled after an update (staleness 0 1 2 2)
DECOUPLED = ["algorithm.off_policy.correction=decoupled", "trainer.recompute_old_logp=true"]
STALE_CASES = [
    {"name": "stale2", "overrides": ["rollout.staleness=2", NO_KL]},
    # the proximal log-probs recomputed over row shares, weighed against the queued sampler's: 3 groups (uneven)
    {"name": "stale2_decoupled", "overrides": ["rollout.staleness=2", "trainer.prompts_per_step=3", *DECOUPLED, NO_KL]},
    # dynamic sampling: each queued rollout refilled (contiguous shares, no mini-batch order drawn before sampling)
    {"name": "stale2_dapo", "overrides": ["rollout.staleness=2", "algorithm=dapo"]},
]
STALE_STEPS = 4


@pytest.mark.parametrize("case", ["nan_on_rank1", "fsdp_nan_on_rank1"])
@pytest.mark.slow
def test_a_nan_loss_on_one_rank_skips_the_update_on_every_rank(two_rank_cases, case):
    """Rank 1 alone sees NaN losses in step 1 (its gradients finite): the NaN guard's decision is every rank's (the
    flag the gradient sum's barrier carries; `World.any_true` under fsdp), so both skip every optimizer step of
    step 1 and step normally in step 2, and the ranks' weights stay equal. Were the check local, rank 0 would step
    on its own and the weights would part."""
    got = json.loads((two_rank_cases / f"{case}.json").read_text())
    first, second = got["rows"]
    # conf/config.yaml's trainer.updates_per_rollout: 2 optimizer steps a step, both skipped, no gradient norm kept
    assert first["optim/nonfinite"] == 1 and first["optim/skipped_updates"] == 2, first
    assert first["optim/grad_norm"] is None and second["optim/grad_norm"] > 0
    assert second["optim/nonfinite"] == 0 and second["optim/skipped_updates"] == 2
    assert got["weight_sums"][0] == got["weight_sums"][1], got["weight_sums"]


def _lora_case(tmp: Path) -> dict:
    """LoRA on a from-scratch Llama saved with save_pretrained (`model=hf`): only the adapters' gradients are
    all-reduced; rewarded for a lowercase first letter (tests/models/test_hf_models.py's REWARDED)."""
    from tests.models.test_hf_models import REWARDED, TASKS, _save

    path = _save(tmp / "llama", "llama", chat=False)
    prompts, _ = TASKS["gsm8k"]
    return {
        "name": "lora_hf",
        "steps": 2,
        "overrides": [
            "logger=none",
            "trainer.progress=false",
            "trainer.threads=1",
            "model=hf",
            f"model.name_or_path={path}",
            *prompts,
            "prompts.template=plain",
            "budget=tiny",
            "budget.max_prompt_tokens=200",
            "budget.max_new_tokens=8",
            "trainer.prompts_per_step=4",
            "prompts.n_eval=4",
            "trainer.lr=1e-2",
            "model.lora.enabled=true",
            *REWARDED,
            "rollout.streams=group",
            "trainer.eval_every=1000",
            NO_KL,
        ],
    }


def _hf_full_case(lora: dict) -> dict:
    """Full fine-tuning of the saved Llama with gradient checkpointing: what FSDP is for (every weight trained,
    activations recomputed in the backward, whose forwards all-gather the shards again)."""
    overrides = [o for o in lora["overrides"] if not o.startswith("model.lora")] + ["model.gradient_checkpointing=true"]
    return {**lora, "name": "hf_full_gc", "overrides": overrides}


# trainer.parallel=fsdp: the cases where sharding could change what is computed (how the gradient is reduced,
# a rank with fewer micro-batches or none, frozen weights beside trained ones, a critic or a reference beside the
# shards, a refilled batch), each against its ddp case's 1-process reference. The aggregations and normalizers
# are computed before the update, from the gathered batch, the same in both modes
# the ddp cases whose 1-process run rebuilds its first update from the rollout, and whose ranks then do too
REBUILDS = {c["name"] for c in CASES} - {"dapo"}
FSDP_CASES = ["agg_token-mean", "kl_in_loss", "dapo", "ppo", "uneven", "lora_hf", "hf_full_gc", "stale2_decoupled"]
# trainer.grad_sum=backend (the cases above sum through shared memory, as CPU ranks on one machine do by default)
BACKEND_CASES = ["ppo", "uneven"]


@pytest.fixture(scope="module")
def two_rank_cases(tmp_path_factory):
    """Every case run once over 2 ranks and once as a world of one process (the worker's --reference), and the
    FSDP_CASES again over 2 ranks with trainer.parallel=fsdp (as fsdp_<name>)."""
    tmp = tmp_path_factory.mktemp("dp_cases")
    lora = _lora_case(tmp)
    cases = [{**c, "overrides": FAST + GROUPS + SIGNAL + c["overrides"], "steps": 2} for c in CASES]
    cases += [{**c, "overrides": FAST + GROUPS + SIGNAL + c["overrides"], "steps": STALE_STEPS} for c in STALE_CASES]
    cases += [lora, _hf_full_case(lora)]
    by_name = {c["name"]: c for c in cases}
    cases += [{**by_name[n], "name": f"fsdp_{n}", "mode": "fsdp", "reference": False} for n in FSDP_CASES]
    # the gradients summed by the backend's bucketed all-reduce instead of shared memory (what GPUs and several
    # machines get): a critic beside the policy, and a rank with no rows in a mini-batch
    backend = ["trainer.grad_sum=backend"]
    cases += [
        {**by_name[n], "name": f"backend_{n}", "overrides": by_name[n]["overrides"] + backend, "reference": False}
        for n in BACKEND_CASES
    ]
    nan_case = {**by_name["agg_token-mean"], "nan_rank": 1, "reference": False}
    cases += [{**nan_case, "name": "nan_on_rank1"}, {**nan_case, "name": "fsdp_nan_on_rank1", "mode": "fsdp"}]
    return run_dp_cases(tmp, cases, timeout=900)


def run_dp_cases(tmp: Path, cases: list[dict], *, timeout: int) -> Path:
    """Every case of `cases` through dp_worker.py on 2 gloo ranks (and its one-process reference), into `tmp`."""
    (tmp / "cases.json").write_text(json.dumps(cases))
    out = subprocess.run(
        _torchrun(2, str(REPO / "tests" / "train" / "dp_worker.py"), str(tmp / "cases.json"), str(tmp), "--reference"),
        env=_env(tmp),
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert out.returncode == 0, out.stderr[-4000:]
    return tmp


@pytest.mark.parametrize(
    "case",
    [c["name"] for c in CASES + STALE_CASES]
    + ["lora_hf", "hf_full_gc"]
    + [f"fsdp_{n}" for n in FSDP_CASES]
    + [f"backend_{n}" for n in BACKEND_CASES],
)
@pytest.mark.slow
def test_two_ranks_give_one_process_rows_and_gradient(two_rank_cases, case):
    ref = case.removeprefix("fsdp_").removeprefix("backend_")
    got = json.loads((two_rank_cases / f"{case}.json").read_text())
    want = json.loads((two_rank_cases / f"{ref}.ref.json").read_text())
    assert len(got["rows"]) == len(want["rows"]) >= 2 and got["rows"][0]["tokens/step"] > 0
    if ref.startswith("stale2"):  # the queue did hold rollouts of earlier weights
        assert [r["offpolicy/staleness"] for r in got["rows"]] == [0, 1, 2, 2]
    # fsdp: rank 0 held half of the trained weights and of their AdamW moments (FSDP2 pads a shard to whole rows:
    # near, not exactly, a half); ddp: all of them
    held = [got["held"]["weights"], got["held"]["moments"]]
    assert all(0.45 <= h <= 0.55 for h in held) if case.startswith("fsdp_") else held == [1.0, 1.0], held
    for i, (a, b) in enumerate(zip(got["rows"], want["rows"])):
        _close(a, b, f"{case} step {i + 1}")
    _close(got["evals"], want["evals"], f"{case} evals")
    # the held-out prompts (one chunk) split over the ranks: each decodes half of every eval's, one process all
    n_evals = len(want["evals"])
    assert sum(want["eval_rows"]) == sum(got["eval_rows"]) and len(want["eval_rows"]) == 1
    assert got["eval_rows"][0] == got["eval_rows"][1] == want["eval_rows"][0] // 2 and n_evals == 2
    # the speed layer's first update rebuilt from the rollout (rlcompare.fast): under ddp each rank samples the
    # groups it trains on, so the ranks rebuild as many rows in all as one process does; not for fsdp's sharded
    # copy, and not where the model refuses it (LoRA, gradient checkpointing); dynamic sampling's refilled batch
    # (dapo) is known only after sampling, so its ranks sample contiguous shares and rebuild nothing; a stale
    # rollout's activations are not the update's (rollout.staleness): nothing rebuilt from it
    if ref in REBUILDS and not case.startswith("fsdp_"):
        assert got["rebuilt_rows"] == want["rebuilt_rows"] > 0
    else:
        assert got["rebuilt_rows"] == 0
    # the gradient each optimizer step applied: after the all-reduce, the 1-process gradient (a step whose rows all
    # have zero advantage has none: exactly 0 without KL, the rounding floor with it)
    g, w = (
        load_file(str(two_rank_cases / name)) for name in (f"{case}.grads.safetensors", f"{ref}.ref.grads.safetensors")
    )
    assert g.keys() == w.keys() and g
    steps = sorted({k.split(".")[0] for k in w})
    compared = 0
    for s in steps:
        scale = max(float(t.abs().max()) for k, t in w.items() if k.startswith(s + "."))
        if scale < 1e-6:
            continue
        compared += 1
        for k in (k for k in w if k.startswith(s + ".")):
            assert float((g[k] - w[k]).abs().max()) <= 2e-5 * scale, k  # measured: 3e-6 at most
    assert compared >= 1


# ----------------------------------------------------------------------------- the CLI under torchrun
def _cli_run(tmp_path: Path, n: int, *overrides: str, timeout=600) -> subprocess.CompletedProcess:
    return subprocess.run(
        _torchrun(n, "-m", "rlcompare.cli", "train", *FAST, *GROUPS, *overrides),
        env=_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=tmp_path,
    )


def _start_cli(tmp_path: Path, *overrides: str, stdout, stderr) -> subprocess.Popen:
    """`torchrun` with 2 ranks of `rlcompare train` (FAST, group streams) in the background."""
    cmd = _torchrun(2, "-m", "rlcompare.cli", "train", *FAST, *GROUPS, *overrides)
    return subprocess.Popen(cmd, env=_env(tmp_path), cwd=tmp_path, stdout=stdout, stderr=stderr, text=True)


def _rows(run: Path, name: str) -> list[dict]:
    return read_jsonl(run / name)


@pytest.mark.slow
def test_torchrun_two_ranks_equal_one_process_and_rank0_alone_writes(compose, tmp_path):
    results = tmp_path / "results"
    setting = [*SIGNAL, NO_KL, "budget.max_steps=4"]
    out = _cli_run(tmp_path, 2, f"results_dir={results}", "run_name=dp2", *setting)
    assert out.returncode == 0, out.stderr[-4000:]
    assert out.stdout.count("held-out accuracy") == 1  # one closing line (stdout), rank 0's
    one = train(compose(*GROUPS, "run_name=one", *setting))
    run, ref = results / "default" / "dp2", Path(one["run_dir"])
    for name in ("metrics.jsonl", "eval.jsonl"):
        got, want = _rows(run, name), _rows(ref, name)
        assert len(got) == len(want) > 0
        for a, b in zip(got, want):
            _close(a, b, name)
    s = json.loads((run / "summary.json").read_text())
    assert s["status"] == "completed" and s["world_size"] == 2 and s["parallel"] == "ddp"
    assert s["grad_sum"] == "shared_memory"  # trainer.grad_sum=auto: CPU ranks on one machine
    assert one["world_size"] == 1 and one["parallel"] == "none" and one["grad_sum"] is None
    # parallelism never changes what is computed: the fingerprints agree
    assert json.loads((run / "fingerprint.json").read_text()) == json.loads((ref / "fingerprint.json").read_text())
    # rank 1 wrote nothing: no other run folder, and its scratch Hydra folder is gone
    assert sorted(p.name for p in (results / "default").iterdir()) == ["dp2", "one"]
    assert not list(tmp_path.glob("rlcompare-rank1-*"))


def _wait_rows(proc, metrics: Path, k: int, timeout: float = 300.0) -> None:
    t0 = time.time()
    while time.time() - t0 < timeout:
        if len(read_jsonl(metrics)) >= k:
            return
        if proc.poll() is not None:
            out = (proc.stderr or proc.stdout).read()
            pytest.fail(f"torchrun exited ({proc.returncode}) before {k} rows: {out[-3000:]}")
        time.sleep(0.01)
    proc.kill()
    pytest.fail(f"no {k} rows within {timeout} s")


RESUME = ["algorithm=dapo", "budget.max_steps=12", "trainer.checkpoint_every=2", "trainer.eval_every=3"]


@pytest.mark.parametrize("mode, staleness", [("ddp", 0), ("fsdp", 0), ("ddp", 2)], ids=["ddp", "fsdp", "ddp_stale2"])
@pytest.mark.slow
def test_two_ranks_sigtermed_then_resumed_equal_an_uninterrupted_two_rank_run(tmp_path, mode, staleness, compose):
    """fsdp: the checkpoint gathers the sharded AdamW moments whole from both ranks, and the resume shards them
    again (and the weights), so the resumed run is the uninterrupted one exactly. Its checkpoint is the format of
    every mode: a copy of the cut run resumed in one process continues it too. rollout.staleness=2: every checkpoint
    holds the 2 queued rollouts, which rank 0 saves and every rank loads."""
    results = tmp_path / "results"
    steps = 12 if (mode, staleness) == ("ddp", 0) else 8  # fewer steps, the same checks (CI's time)
    stale = [f"rollout.staleness={staleness}"] if staleness else []
    setting = [*RESUME, *stale, f"budget.max_steps={steps}", f"trainer.parallel={mode}"]
    ref = _cli_run(tmp_path, 2, *setting, f"results_dir={results}", "run_name=whole")
    assert ref.returncode == 0, ref.stderr[-4000:]
    run = results / "default" / "cut"
    proc = _start_cli(
        tmp_path, *setting, f"results_dir={results}", "run_name=cut", stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )
    _wait_rows(proc, run / "metrics.jsonl", 3)
    proc.send_signal(signal.SIGTERM)  # torchrun passes it to both ranks: they agree on the step to stop after
    proc.wait(timeout=120)
    assert proc.returncode != 0
    s = json.loads((run / "summary.json").read_text())
    assert s["status"] == "failed" and s["error"].startswith("terminated (SIGTERM)"), s
    assert 3 <= s["steps"] < steps and (run / "checkpoints").is_dir()
    copy = tmp_path / "copy"
    shutil.copytree(run, copy)
    again = _cli_run(tmp_path, 2, *setting, f"results_dir={results}", "run_name=cut", "resume=true")
    assert again.returncode == 0, again.stderr[-4000:]
    assert "resuming" in again.stderr
    assert json.loads((run / "summary.json").read_text())["parallel"] == mode
    for name in ("metrics.jsonl", "eval.jsonl", "samples.jsonl"):
        got = [{k: v for k, v in r.items() if not k.startswith(TIMING)} for r in _rows(run, name)]
        want = [
            {k: v for k, v in r.items() if not k.startswith(TIMING)} for r in _rows(results / "default" / "whole", name)
        ]
        assert got == want, name  # the same processes, the same split: equal, not only close
    assert [r["step"] for r in _rows(run, "metrics.jsonl")] == list(range(1, steps + 1))
    if mode == "fsdp":  # the fsdp checkpoint resumed by one process (trainer.parallel=none): to rounding
        one = train(compose(*GROUPS, *setting[:-1], "trainer.parallel=none", "run_name=cut", f"resume={copy}"))
        assert one["status"] == "completed" and one["parallel"] == "none"
        rows, whole = _rows(copy, "metrics.jsonl"), _rows(results / "default" / "whole", "metrics.jsonl")
        assert [r["step"] for r in rows] == list(range(1, steps + 1))
        # the first step samples with the restored weights; the second with those the restored moments stepped to
        for k in range(s["steps"], min(s["steps"] + 2, steps)):
            _close(rows[k], whole[k], f"step {k + 1}, resumed in one process")


def _rank_pid(parent: int, rank: int) -> int | None:
    """The pid of torchrun's worker of `rank` (its RANK environment variable)."""
    for child in Path(f"/proc/{parent}/task/{parent}/children").read_text().split():
        try:
            env = Path(f"/proc/{child}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if f"RANK={rank}".encode() in env:
            return int(child)
    return None


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="finds the rank's process through /proc")
@pytest.mark.slow
def test_a_killed_rank_takes_the_run_down_and_is_named(tmp_path):
    results = tmp_path / "results"
    run = results / "default" / "dies"
    proc = _start_cli(
        tmp_path,
        "budget.max_steps=200",
        f"results_dir={results}",
        "run_name=dies",
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    _wait_rows(proc, run / "metrics.jsonl", 2)
    victim = _rank_pid(proc.pid, 1)
    assert victim is not None
    os.kill(victim, signal.SIGKILL)
    output, _ = proc.communicate(timeout=180)
    assert proc.returncode != 0
    # torchrun's failure summary: the first observed failure is rank 1, killed by signal 9
    root = output[output.index("Root Cause (first observed failure)") :]
    assert re.search(r"rank\s*:\s*1 \(local_rank: 1\)", root) and "Signal 9 (SIGKILL)" in root, output[-3000:]
    s = json.loads((run / "summary.json").read_text())
    assert s["status"] == "failed" and s["steps"] < 200, (s, output[-4000:])
