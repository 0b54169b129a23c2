"""Multi-turn episodes laid out as one sequence (#51): read token by token, with a scripted policy (what each turn
"samples" is given) and environments stepped in this process, so every position can be checked by hand."""

from __future__ import annotations

import math

import pytest
import torch

from rlcompare.data.types import Example
from rlcompare.envs.base import StepResult
from rlcompare.envs.calc import CalcEnv, calc_value
from rlcompare.envs.feedback import FeedbackEnv
from rlcompare.models import build_char_tokenizer
from rlcompare.rollout import Completions, episodes

TOK = build_char_tokenizer()
EOS, PAD = TOK.eos_token_id, TOK.pad_token_id


def _settings(**kw):
    base = dict(max_turns=3, max_tokens=40, turn_tokens=8, stop=(), reward="sum", max_observation_tokens=32)
    return episodes.EpisodeSettings(**{**base, **kw})


class Scripted:
    """sample_turn that writes `script[turn][row]` (then EOS unless the text ends with '|', which is dropped: a turn
    cut by the token budget), with log-prob -0.5 on every token; records what it was asked."""

    def __init__(self, script):
        self.script, self.calls = script, []

    def __call__(self, ids, mask, *, repeats, max_new_tokens, turn, rows):
        self.calls.append(dict(turn=turn, rows=list(rows), repeats=repeats, contexts=[TOK.decode(r) for r in ids]))
        seqs = []
        for r in rows:
            text = self.script[turn][r]
            toks = TOK(text.rstrip("|"), add_special_tokens=False).input_ids + ([] if text.endswith("|") else [EOS])
            seqs.append(toks[:max_new_tokens])
        T = max(len(s) for s in seqs)
        out = torch.full((len(seqs), T), PAD)
        m = torch.zeros((len(seqs), T), dtype=torch.long)
        for i, s in enumerate(seqs):
            out[i, : len(s)], m[i, : len(s)] = torch.tensor(s), 1
        return Completions(out, m, -0.5 * m.float(), m.sum(1) == 0, m.sum(1))


class Local:
    """A Session stepping environments in this process (the pool's is tests/envs/test_runner.py's)."""

    def __init__(self, envs, examples, seeds=None):
        self.envs, self.examples = envs, examples
        self.seeds = seeds or [0] * len(envs)

    def reset(self):
        return [StepResult(e.reset(x, s), 0.0, False) for e, x, s in zip(self.envs, self.examples, self.seeds)]

    def step(self, rows, texts):
        return [self.envs[r].step(t) for r, t in zip(rows, texts)]


def _run(script, envs, examples, prompts, G, **kw):
    policy = Scripted(script)
    out = episodes.run(
        policy, TOK, prompts, Local(envs, examples), _settings(**kw), group_size=G, pad_id=PAD, device="cpu"
    )
    return policy, out


def _ids(text):
    return TOK(text, add_special_tokens=False).input_ids


def test_a_two_turn_feedback_episode_token_by_token():
    ex = Example("3+5=", "8")
    prompt = [TOK.bos_token_id] + _ids("3+5=")
    script = {0: ["9", "8"], 1: ["8"]}  # episode 0: 9 (wrong), then 8; episode 1: 8 at once
    policy, (pids, pmask, c) = _run(script, [FeedbackEnv(), FeedbackEnv()], [ex, ex], [prompt], G=2)
    # turn 0 is a single-turn rollout of the group's prompt; turn 1 re-runs episode 0's whole context
    assert policy.calls[0]["repeats"] == 2 and policy.calls[0]["rows"] == [0, 1]
    assert policy.calls[1]["rows"] == [0] and policy.calls[1]["contexts"] == ["<bos>3+5=9<eos>lower\n3+5="]
    # episode 0: "9" EOS | "lower\n3+5=" (10 environment tokens) | "8" EOS
    want = _ids("9") + [EOS] + _ids("lower\n3+5=") + _ids("8") + [EOS]
    assert c.ids[0].tolist() == want
    assert c.env_mask[0].tolist() == [0, 0] + [1] * 10 + [0, 0]
    assert c.policy_mask[0].tolist() == [1, 1] + [0] * 10 + [1, 1]
    assert c.mask[0].tolist() == [1] * 14  # the forward attends to every token
    assert c.logp[0].tolist() == [-0.5, -0.5] + [0.0] * 10 + [-0.5, -0.5]
    # episode 1: "8" EOS, then padding
    assert c.ids[1].tolist()[:2] == _ids("8") + [EOS] and c.mask[1].tolist() == [1, 1] + [0] * 12
    assert c.lengths.tolist() == [4, 2]  # the policy's tokens: what the token budget counts
    o = c.outcome
    assert o.rewards.tolist() == [1.0, 1.0] and o.correct.tolist() == [True, True]
    assert o.ends == ["done", "done"] and o.turns.tolist() == [2, 1] and o.env_tokens == 10
    assert not c.truncated.any()
    assert o.texts == ["9«lower\n3+5=»8", "8"]  # as samples.jsonl logs it: the environment's spans marked
    assert pids.shape[0] == 2 and (pids[0] == pids[1]).all()  # both members share the group's prompt


def test_the_turn_ends_at_the_stop_string_and_the_tool_answers():
    ex = Example("3+8+5=", "16")
    script = {0: ["<calc>3+8+5</calc>16"], 1: ["16"]}  # what was sampled after </calc> is dropped
    _, (_, _, c) = _run(script, [CalcEnv()], [ex], [_ids("3+8+5=")], G=1, stop=("</calc>",), turn_tokens=32)
    text = TOK.decode(c.ids[0][c.mask[0].bool()])
    assert text == "<calc>3+8+5</calc>16\n16<eos>"
    n_call = len("<calc>3+8+5</calc>")
    assert c.env_mask[0].tolist()[: n_call + 3 + 3] == [0] * n_call + [1, 1, 1] + [0, 0, 0]
    assert c.outcome.rewards.tolist() == [1.0] and c.outcome.ends == ["done"]
    assert calc_value("3+8*2-1") == 18 and calc_value("3+x") is None and calc_value("") is None


class NeverDone:
    def reset(self, example, seed):
        return ""

    def step(self, text):
        return StepResult("again\n", 0.25, False, {"correct": False})


def test_an_environment_that_never_says_done_ends_at_max_turns_with_its_rewards_summed_or_last():
    script = {t: ["1"] for t in range(3)}
    _, (_, _, c) = _run(script, [NeverDone()], [Example("1+0=", "1")], [_ids("1+0=")], G=1)
    assert c.outcome.ends == ["max_turns"] and c.outcome.turns.tolist() == [3]
    assert c.outcome.rewards.tolist() == [0.75]  # 3 turns x 0.25
    assert c.truncated.tolist() == [True]  # not ended by the environment
    # no observation after the last turn: the episode ends on the policy's tokens
    assert c.env_mask[0].tolist()[-2:] == [0, 0]
    _, (_, _, c) = _run(script, [NeverDone()], [Example("1+0=", "1")], [_ids("1+0=")], G=1, reward="last")
    assert c.outcome.rewards.tolist() == [0.25]


def test_the_episode_budget_stops_the_turns():
    # max_tokens 9: "1" EOS (2) + "again\n" (6) = 8; no room for the next policy turn's tokens beyond 1 -> budget
    script = {t: ["1"] for t in range(3)}
    _, (_, _, c) = _run(script, [NeverDone()], [Example("1+0=", "1")], [_ids("1+0=")], G=1, max_tokens=8)
    assert c.outcome.ends == ["budget"] and c.ids.shape[1] == 2


class Lying:
    def __init__(self, how):
        self.how = how

    def reset(self, example, seed):
        return ""

    def step(self, text):
        if self.how == "nan":
            return StepResult("x", float("nan"), False)
        if self.how == "huge":
            return StepResult("a" * 10_000, 0.0, False)
        return StepResult(None, 0.0, True, {"error": "timeout"})  # what the pool answers for a hung step


@pytest.mark.parametrize("how, reason", [("nan", "nan_reward"), ("huge", "huge_observation"), ("hang", "timeout")])
def test_a_lying_environment_ends_its_episode_with_the_reason_and_reward_zero(how, reason):
    script = {0: ["1", "1"], 1: ["1", "1"]}
    envs = [Lying(how), NeverDone()]
    _, (_, _, c) = _run(script, envs, [Example("1+0=", "1")] * 2, [_ids("1+0=")], G=2, max_turns=2)
    assert c.outcome.ends == [reason, "max_turns"] and c.outcome.errors == 1
    assert c.outcome.rewards.tolist()[0] == 0.0 and c.outcome.rewards.tolist()[1] == 0.5
    assert c.env_mask[0].sum() == 0  # nothing of the lie entered the context
    row = episodes.metrics([c.outcome])
    assert row[f"env/errors/{reason}"] == 1 and row["env/errors"] == 1 and row["env/ends/max_turns"] == 1
    assert row["tokens/env"] == len(_ids("again\n")) and not math.isnan(row["env/turns_mean"])


class HugeStart(NeverDone):
    def reset(self, example, seed):
        return "b" * 100


def test_a_huge_first_observation_ends_the_group_before_any_turn():
    _, (pids, _, c) = _run({}, [HugeStart(), HugeStart()], [Example("1+0=", "1")] * 2, [_ids("1+0=")], G=2)
    assert c.outcome.ends == ["huge_observation"] * 2 and c.mask.sum() == 0 and c.lengths.tolist() == [0, 0]
    assert TOK.decode(pids[0]) == "1+0="  # the prompt alone: nothing of the observation entered it


def test_the_first_observation_is_put_after_the_prompt_for_the_whole_group():
    class Opening(NeverDone):
        def reset(self, example, seed):
            return "go\n"

    _, (pids, pmask, c) = _run(
        {0: ["1", "1"]}, [Opening(), Opening()], [Example("1+0=", "1")] * 2, [_ids("1+0=")], G=2, max_turns=1
    )
    assert [TOK.decode(p[m.bool()]) for p, m in zip(pids, pmask)] == ["1+0=go\n"] * 2
    assert c.env_mask.sum() == 0  # in the prompt, not in the episode's tokens


class Counting:
    """Reports `seen` (its policy turns so far) and `said` (what the policy wrote, as a number) every step; done
    when the policy writes 8. `bad` replaces the metrics of its second step (a value the row cannot hold)."""

    def __init__(self, bad=None):
        self.bad, self.seen = bad, 0

    def reset(self, example, seed):
        return ""

    def step(self, text):
        self.seen += 1
        metrics = {"seen": self.seen, "said": float(text)} if self.seen < 2 or self.bad is None else self.bad
        done = text == "8"
        return StepResult(None if done else "no", float(done), done, {"metrics": metrics})


def test_an_environments_declared_metrics_are_the_last_value_of_each_episode_averaged_over_the_episodes():
    ex = Example("3+5=", "8")
    # episode 0: 9, 7, 8 (seen 3, said 8); episode 1: 8 (seen 1, said 8); episode 2: 1, 2, 3 (max_turns: seen 3,
    # said 3); episode 3: 4, then a reply of metrics {"seen": "many"}: bad_reply, its metrics dropped
    script = {0: ["9", "8", "1", "4"], 1: ["7", "-", "2", "5"], 2: ["8", "-", "3", "-"]}  # by row; "-": ended
    envs = [Counting(), Counting(), Counting(), Counting(bad={"seen": "many"})]
    _, (_, _, c) = _run(script, envs, [ex] * 4, [_ids("3+5=")], G=4, env="count", metrics=("seen", "said", "never"))
    o = c.outcome
    assert o.ends == ["done", "done", "max_turns", "bad_reply"]
    assert o.reported[:3] == [{"seen": 3, "said": 8.0}, {"seen": 1, "said": 8.0}, {"seen": 3, "said": 3.0}]
    assert o.reported[3] == {}  # an episode ended by an error reports nothing
    row = episodes.metrics([o], "count", ("seen", "said", "never"))
    assert row["env/count/seen"] == pytest.approx((3 + 1 + 3) / 3)  # 2.3333: three episodes reported it
    assert row["env/count/said"] == pytest.approx((8 + 8 + 3) / 3)
    assert row["env/count/never"] is None  # declared, reported by none: in the row as null, not 0
    assert row["env/errors/bad_reply"] == 1


@pytest.mark.parametrize("bad", [{"seen": math.nan}, {"seen": math.inf}, ["seen", 1], {"seen": None}])
def test_a_metric_that_is_not_a_finite_number_ends_the_episode_as_a_bad_reply(bad):
    ex = Example("3+5=", "8")
    script = {0: ["9"], 1: ["7"]}
    _, (_, _, c) = _run(script, [Counting(bad=bad)], [ex], [_ids("3+5=")], G=1, env="count", metrics=("seen", "said"))
    assert c.outcome.ends == ["bad_reply"] and c.outcome.reported == [{}]


def test_an_undeclared_metric_stops_the_run_naming_the_fix():
    ex = Example("3+5=", "8")
    with pytest.raises(ValueError) as e:
        _run({0: ["9"]}, [Counting()], [ex], [_ids("3+5=")], G=1, env="count", metrics=("seen",))
    assert str(e.value) == (
        "environment 'count' reported metric 'said', which its spec does not declare (declared: seen); "
        "add it to EnvSpec('count', ..., metrics=(...))"
    )
