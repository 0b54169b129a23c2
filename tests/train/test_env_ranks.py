"""Multi-turn episodes over 2 ranks (#51): each rank runs the episodes of its share of every round's groups, the
shares are gathered with their environment masks, and the run is one process's. Run as the single-turn cases of
tests/train/test_parallel.py are: gloo over 2 processes started by torchrun (tests/train/dp_worker.py), against
the same cases run as a world of one process.

Compared as the single-turn 2-rank rows are (test_parallel's `_close`: integers, token counts, end reasons and
every env/* count exactly; floats to RTOL 1e-4, ATOL 1e-5): a batch split over ranks is summed in another order,
and an episode's later turns pad the live contexts to the longest on the rank, not in the whole batch, which can
move a forward's rounding (never, in these cases, a sampled token: the token counts are equal exactly).
"""

from __future__ import annotations

import json

import pytest
from safetensors.torch import load_file

from tests.conftest import FAST
from tests.train.test_parallel import DECOUPLED, NO_KL, _close, run_dp_cases

GROUPS = ["rollout.streams=group", "trainer.eval_every=1000", "prompts.n_eval=6"]
FEEDBACK = ["env=feedback", "model.warm_start.steps=300"]  # the shipped warm start: rewards vary within groups
# its own warm start (400 steps, computed on first use: about 3 minutes, then cached), which writes the tool's
# syntax; 24-token turns hold a call
CALC = ["env=calc", "prompts=chain_calc", "budget.max_new_tokens=24"]
COUNTING = "tests.envs.hostile_envs:Counting"
CASES = [
    {"name": "feedback", "overrides": [*FEEDBACK, NO_KL]},
    # 3 groups over 2 ranks (2 + 1): later turns padded to each rank's own longest context; KL in the loss
    {"name": "feedback_uneven", "overrides": [*FEEDBACK, "trainer.prompts_per_step=3"]},
    # dynamic sampling refills the batch round after round: a refill of one group leaves a rank with no episodes
    {"name": "feedback_dapo", "overrides": [*FEEDBACK, "algorithm=dapo"]},
    {"name": "calc", "overrides": [*CALC, NO_KL]},
    # the sampled eval's episodes (eval.samples) split over the ranks by prompt, gathered as JSON
    {"name": "feedback_sampled_eval", "overrides": [*FEEDBACK, NO_KL, "eval.samples=4", "eval.greedy=true"]},
    # an environment whose first observation (`reset`'s "s<seed digit>\n") is put after each group's prompt: the
    # gathered batch holds the prompts as the ranks ran them, openings included
    {"name": "opening", "overrides": ["env=feedback", "env.name=custom", f"env.target={COUNTING}", NO_KL]},
    # a queue of rollouts sampled ahead (each gathered whole before it is queued), the decoupled correction
    {
        "name": "feedback_stale",
        "overrides": [*FEEDBACK, NO_KL, "rollout.staleness=1", *DECOUPLED],
    },
]
# the policy's training state sharded over the ranks (trainer.parallel=fsdp), against the ddp case's reference
FSDP = [{**CASES[0], "name": "fsdp_feedback", "mode": "fsdp", "reference": False}]
STEPS = 3


@pytest.fixture(scope="module")
def env_rank_cases(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("env_ranks")
    cases = [{**c, "overrides": FAST + GROUPS + c["overrides"], "steps": STEPS} for c in CASES + FSDP]
    return run_dp_cases(tmp, cases, timeout=1200)


@pytest.mark.parametrize("case", [c["name"] for c in CASES + FSDP])
@pytest.mark.slow
def test_two_ranks_run_one_process_episodes(env_rank_cases, case):
    got = json.loads((env_rank_cases / f"{case}.json").read_text())
    want = json.loads((env_rank_cases / f"{case.removeprefix('fsdp_')}.ref.json").read_text())
    assert len(got["rows"]) == len(want["rows"]) == STEPS
    for i, (a, b) in enumerate(zip(got["rows"], want["rows"])):
        _close(a, b, f"{case} step {i + 1}")
    # the episodes did have holes: environment tokens in the batches, and episodes of several turns
    assert sum(r["tokens/env"] for r in want["rows"]) > 0 and max(r["env/turns_mean"] for r in want["rows"]) > 1
    _close(got["evals"], want["evals"], f"{case} evals")
    if case == "feedback_sampled_eval":
        assert all(0 < e["eval/tokens"] and "eval/pass@4" in e for e in got["evals"])
    # the held-out episodes split over the ranks: each ran half of the 6 of each of the 2 evals (before, after)
    assert got["eval_rows"] == [6, 6] and want["eval_rows"] == [12]
    assert got["weight_sums"][0] == got["weight_sums"][1]  # the ranks' weights stayed equal
    g, w = (
        load_file(str(env_rank_cases / f"{name}.grads.safetensors"))
        for name in (case, f"{case.removeprefix('fsdp_')}.ref")
    )
    assert g.keys() == w.keys() and g
    for s in sorted({k.split(".")[0] for k in w}):
        scale = max(float(t.abs().max()) for k, t in w.items() if k.startswith(s + "."))
        for k in (k for k in w if k.startswith(s + ".")):
            assert float((g[k] - w[k]).abs().max()) <= 2e-5 * max(scale, 1e-6), k  # test_parallel's bound
