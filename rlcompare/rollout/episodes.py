"""Multi-turn episodes (#51): policy turns sampled as any completion, environment turns appended as context.

One episode is laid out as ONE sequence after its prompt, `[policy_1, env_1, policy_2, env_2, ..., policy_k]`,
right-padded like a completion: `Completions.mask` is 1 on every real token (the forward attends to the
environment's text), `Completions.env_mask` 1 on the environment's, so that `Completions.policy_mask`, the loss
mask, has holes where the environment spoke. The sampler's log-probs are kept on the policy's tokens, 0 on the
environment's; `lengths` counts the policy's tokens (what the token budget counts).

Turn 0 is exactly a single-turn rollout: the group's prompts (with the environment's first observation, the
same for the whole group: one seed per group, so the G episodes of a group have the same start) sampled with
`repeats=G`. Later turns re-run each live episode's whole context through the same sampler (`sample_turn`: the
trainer's decoder, streams and Gumbel-max draws). A policy turn ends at EOS, at the turn's token budget, or at
the first of the environment's stop strings (the tokens sampled after it are dropped: the prefix kept is
distributed as if sampling had stopped there).

An episode ends when the environment says `done`, after `max_turns` policy turns (an environment that never
sets done), when its tokens would pass `max_tokens`, or on an environment error (a crash, a timeout, a reward
that is not a finite real number or a sum of them that overflows float32, a correctness that is not a bool, an
observation over `max_observation_tokens`, a replay that differs from what the policy saw): the reason is
recorded (`Outcome.ends`), the episode's reward is then 0 and the run goes on. An episode is correct when its
last answer's `info["correct"]` says so, else when its reward (summed or last, `reward`) is above 0.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable, Protocol

import torch

from rlcompare.envs.base import StepResult, as_bool, as_reward, finite_reward
from rlcompare.rollout.sampler import Completions, left_pad

ENDS = ("done", "max_turns", "budget")  # how an episode ends without an error
ERRORS = (  # how an environment error ends one (env/errors/<reason>)
    "raised",
    "timeout",
    "batch_timeout",
    "worker_lost",
    "no_worker",
    "bad_reply",
    "nan_reward",
    "huge_observation",
    "not_replayable",
)
REWARDS = ("sum", "last")


@dataclass(frozen=True)
class EpisodeSettings:
    max_turns: int  # policy turns at most
    max_tokens: int  # tokens after the prompt at most, the policy's and the environment's (the sequence width)
    turn_tokens: int  # tokens one policy turn generates at most (budget.max_new_tokens)
    stop: tuple[str, ...] = ()  # a policy turn also ends at the first of these (decoded text), kept in the turn
    reward: str = "sum"  # sum: the turns' rewards summed | last: the last turn's reward
    max_observation_tokens: int = 64  # an observation longer than this ends the episode (huge_observation)
    env: str = ""  # the environment's name (env.name): its metrics are logged as env/<env>/<metric>
    metrics: tuple[str, ...] = ()  # the names its spec declares (EnvSpec.metrics): the only ones it may report


class Session(Protocol):
    """The environments of one batch of episodes (`rlcompare.envs.runner.EnvSession`): one per row."""

    def reset(self) -> list[StepResult]: ...

    def step(self, rows: list[int], texts: list[str]) -> list[StepResult]: ...


# sample_turn(prompt_ids [n,P], prompt_mask, *, repeats, max_new_tokens, turn, rows) -> Completions [n*repeats, T]:
# rows are the episodes being sampled (batch rows), turn the policy turn (0 first)
SampleTurn = Callable[..., Completions]


@dataclass
class Outcome:
    """What a batch of episodes scored (CPU)."""

    rewards: torch.Tensor  # (B,) float32
    correct: torch.Tensor  # (B,) bool
    ends: list[str]  # (B,) why each episode ended: one of ENDS or ERRORS
    turns: torch.Tensor  # (B,) long: policy turns taken
    env_tokens: int  # environment tokens appended, over the batch
    # (B,) each episode decoded as samples.jsonl logs it: the environment's text between « and » (`marked_text`)
    texts: list[str] = field(default_factory=list)
    # (B,) each episode's last policy turn, decoded ("" for none): its final answer (the sampled eval's maj@k)
    finals: list[str] = field(default_factory=list)
    # (B,) what each episode's environment reported (`StepResult.info["metrics"]`, the last value of each name;
    # {} for an episode that ended in an error): `metrics` averages them into env/<env>/<metric>
    reported: list[dict] = field(default_factory=list)

    @property
    def errors(self) -> int:
        return sum(e in ERRORS for e in self.ends)


@dataclass
class _Episode:
    tokens: list[int] = field(default_factory=list)  # after the prompt
    logp: list[float] = field(default_factory=list)
    env: list[int] = field(default_factory=list)  # 1 on the environment's tokens
    reward: float = 0.0
    correct: bool = False
    end: str | None = None
    turns: int = 0
    final: str = ""  # the last policy turn's text
    reported: dict = field(default_factory=dict)  # the environment's metrics, the last value of each name


def run(
    sample_turn: SampleTurn,
    tokenizer,
    prompts: list[list[int]],
    session: Session,
    settings: EpisodeSettings,
    *,
    group_size: int,
    pad_id: int,
    device,
    width: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor, Completions]:
    """The episodes of `prompts` (n token lists, `group_size` episodes each, groups contiguous): returns the
    prompts as the batch holds them ([B,P] left-padded ids and mask, the first observation included) and the
    episodes as `Completions` (with `env_mask`, and `outcome` the `Outcome`). width: turn 0 pads the prompts to at
    least this (a rank's share of a round padded as the whole round: `sample`'s `width`)."""
    G, B = group_size, len(prompts) * group_size
    eps = [_Episode() for _ in range(B)]
    first = session.reset()
    group_prompts = []
    for g, p in enumerate(prompts):
        for r in range(g * G, (g + 1) * G):
            eps[r].end = _error_of(first[r], settings) or _unlike_the_group(first[r], first[g * G])
        opening = _opening(tokenizer, first[g * G], settings) if eps[g * G].end is None else []
        if opening is None:  # one seed per group: the group's first observation is every member's
            for r in range(g * G, (g + 1) * G):
                eps[r].end = "huge_observation"
        group_prompts.append(list(p) + (opening or []))
    for turn in range(settings.max_turns):
        live = [r for r in range(B) if eps[r].end is None]
        if not live:
            break
        turns = _sample(sample_turn, group_prompts, eps, live, turn, settings, G, pad_id, device, width)
        texts = [_policy_turn(tokenizer, eps[r], ids, lps, settings) for r, (ids, lps) in zip(live, turns)]
        for r, res in zip(live, session.step(live, texts)):
            _answer(tokenizer, eps[r], res, turn, settings)
    for e in eps:  # none left live: max_turns ran out
        e.end = e.end or "max_turns"
    prompt_ids, prompt_mask = left_pad([p for p in group_prompts for _ in range(G)], pad_id, device)
    return prompt_ids, prompt_mask, _completions(tokenizer, eps, pad_id, device)


def _unlike_the_group(res: StepResult, group_first: StepResult) -> str | None:
    """`not_replayable` when an episode's first observation is not its group's (the group's first member's: the
    one the policy sees), from one seed: a reset that does not depend on its seed alone."""
    text = res.observation or ""
    return None if text == (group_first.observation or "") else "not_replayable"


def _sample(sample_turn, group_prompts, eps, live, turn, settings, G, pad_id, device, width=None) -> list:
    """One policy turn of the episodes `live`: [(token ids, log-probs)] per live row. Turn 0 samples each group's
    prompt `repeats=G` times (a single-turn rollout); later turns each live episode's context once."""
    room = max(settings.max_tokens - len(eps[r].tokens) for r in live)
    max_new = max(1, min(settings.turn_tokens, room))
    if turn == 0:
        ids, mask = left_pad(group_prompts, pad_id, device, max([width or 0] + [len(p) for p in group_prompts]))
        c = sample_turn(ids, mask, repeats=G, max_new_tokens=max_new, turn=0, rows=list(range(len(eps))))
        at = live
    else:
        contexts = [group_prompts[r // G] + eps[r].tokens for r in live]
        ids, mask = left_pad(contexts, pad_id, device)
        c = sample_turn(ids, mask, repeats=1, max_new_tokens=max_new, turn=turn, rows=live)
        at = list(range(len(live)))
    lengths = c.lengths.tolist()
    ids_rows = c.ids.tolist()
    logp_rows = c.logp.tolist() if c.logp is not None else None
    out = []
    for i in at:
        n = lengths[i]
        out.append((ids_rows[i][:n], logp_rows[i][:n] if logp_rows is not None else [0.0] * n))
    return out


def _policy_turn(tokenizer, e: _Episode, ids: list[int], lps: list[float], settings: EpisodeSettings) -> str:
    """Append one policy turn (cut to the episode's room and at the first stop string); returns its text."""
    ids = ids[: settings.max_tokens - len(e.tokens)]
    n = stop_cut(tokenizer, ids, settings.stop)
    ids, lps = ids[:n], lps[:n]
    e.tokens += ids
    e.logp += lps
    e.env += [0] * len(ids)
    e.turns += 1
    e.final = tokenizer.decode(ids, skip_special_tokens=True)
    return e.final


def stop_cut(tokenizer, ids: list[int], stop: tuple[str, ...]) -> int:
    """How many of the turn's tokens `ids` to keep: up to the token that completes the first stop string (all of
    them when none occurs)."""
    if not stop or not any(s in tokenizer.decode(ids, skip_special_tokens=True) for s in stop):
        return len(ids)
    for n in range(1, len(ids) + 1):
        text = tokenizer.decode(ids[:n], skip_special_tokens=True)
        if any(s in text for s in stop):
            return n
    return len(ids)


def _error_of(res, settings: EpisodeSettings) -> str | None:
    """Why an environment's answer ends its episode as an error, or None: what the worker said (`info["error"]`),
    a reward that is not a real number (bad_reply) or not finite (nan_reward), an `info["correct"]` set to
    anything but a bool, an observation that is not text or None."""
    if not isinstance(res, StepResult) or not isinstance(res.info, dict):
        return "bad_reply"
    if res.info.get("error"):
        err = str(res.info["error"])
        return err if err in ERRORS else "raised"
    reward = as_reward(res.reward)
    if reward is None or (res.info.get("correct") is not None and as_bool(res.info["correct"]) is None):
        return "bad_reply"
    if not finite_reward(reward):
        return "nan_reward"
    if res.observation is not None and not isinstance(res.observation, str):
        return "bad_reply"
    return _metrics_error(res.info.get("metrics"), settings)


def _metrics_error(reported, settings: EpisodeSettings) -> str | None:
    """`bad_reply` for `info["metrics"]` that is not a mapping of names to finite real numbers. A name the
    environment's spec does not declare is its author's mistake, not a bad episode: it stops the run, naming the
    fix (as an undeclared verifier metric does), rather than vanish from the row."""
    if reported is None:
        return None
    if not isinstance(reported, dict):
        return "bad_reply"
    for name, value in reported.items():
        if name not in settings.metrics:
            declared = ", ".join(settings.metrics) or "none"
            raise ValueError(
                f"environment {settings.env!r} reported metric {name!r}, which its spec does not declare "
                f"(declared: {declared}); add it to EnvSpec({settings.env!r}, ..., metrics=(...))"
            )
        number = as_reward(value)
        if number is None or not finite_reward(number):
            return "bad_reply"
    return None


def _answer(tokenizer, e: _Episode, res, turn: int, settings: EpisodeSettings) -> None:
    """The environment's answer to the episode's last policy turn: its reward, then the episode ends (done, an
    error, max_turns, no room left) or the observation is appended as environment tokens."""
    err = _error_of(res, settings)
    reward = as_reward(res.reward) if err is None else 0.0
    total = e.reward + reward if settings.reward == "sum" else reward
    if err is None and not finite_reward(total):  # the turns' rewards sum past float32: the environment's doing
        err = "nan_reward"
    if err is not None:
        e.end, e.reward, e.correct, e.reported = err, 0.0, False, {}
        return
    e.reward = total
    e.reported.update({k: as_reward(v) for k, v in (res.info.get("metrics") or {}).items()})
    said = res.info.get("correct")  # the environment's verdict when it gives one, else the episode's reward > 0
    e.correct = as_bool(said) if said is not None else total > 0
    if res.done:
        e.end = "done"
        return
    if turn == settings.max_turns - 1:
        e.end = "max_turns"
        return
    text = res.observation or ""
    if len(text) > 16 * settings.max_observation_tokens:  # no tokenizer writes a token per 16 characters or fewer
        e.end, e.reward, e.correct, e.reported = "huge_observation", 0.0, False, {}
        return
    obs = _encode(tokenizer, text)
    if len(obs) > settings.max_observation_tokens:
        e.end, e.reward, e.correct, e.reported = "huge_observation", 0.0, False, {}
        return
    if len(e.tokens) + len(obs) >= settings.max_tokens:  # no room for the policy's next token
        e.end = "budget"
        return
    e.tokens += obs
    e.logp += [0.0] * len(obs)
    e.env += [1] * len(obs)


def _opening(tokenizer, res: StepResult, settings: EpisodeSettings) -> list[int] | None:
    """The tokens of `reset`'s observation (put after the prompt), or None when over max_observation_tokens."""
    text = res.observation or ""
    if len(text) > 16 * settings.max_observation_tokens:
        return None
    ids = _encode(tokenizer, text)
    return ids if len(ids) <= settings.max_observation_tokens else None


def _encode(tokenizer, text: str | None) -> list[int]:
    """An observation's tokens, as text: a special token's spelling in it (`<eos>`, `<|im_end|>`) is that text's
    tokens, never the control token (split_special_tokens), so the policy sees what samples.jsonl shows."""
    return list(tokenizer(text, add_special_tokens=False, split_special_tokens=True).input_ids) if text else []


def _completions(tokenizer, eps: list[_Episode], pad_id: int, device) -> Completions:
    T = max([len(e.tokens) for e in eps] + [1])
    ids = torch.tensor([e.tokens + [pad_id] * (T - len(e.tokens)) for e in eps], dtype=torch.long)
    mask = torch.tensor([[1] * len(e.tokens) + [0] * (T - len(e.tokens)) for e in eps], dtype=torch.long)
    env = torch.tensor([e.env + [0] * (T - len(e.env)) for e in eps], dtype=torch.long)
    logp = torch.tensor([e.logp + [0.0] * (T - len(e.logp)) for e in eps], dtype=torch.float32)
    outcome = Outcome(
        rewards=torch.tensor([e.reward for e in eps], dtype=torch.float32),
        correct=torch.tensor([e.correct for e in eps], dtype=torch.bool),
        ends=[e.end for e in eps],
        turns=torch.tensor([e.turns for e in eps], dtype=torch.long),
        env_tokens=int(env.sum()),
        texts=[marked_text(tokenizer, e.tokens, e.env) for e in eps],
        finals=[e.final for e in eps],
        reported=[dict(e.reported) if e.end not in ERRORS else {} for e in eps],
    )
    return Completions(
        ids.to(device),
        mask.to(device),
        logp.to(device),
        torch.tensor([e.end != "done" for e in eps], dtype=torch.bool, device=device),
        (mask * (1 - env)).sum(1).to(device),
        env_mask=env.to(device),
        outcome=outcome,
    )


def marked_text(tokenizer, tokens: list[int], env: list[int]) -> str:
    """An episode's text with each environment span between « and », so that a logged episode shows which
    tokens the loss skipped: "9«lower\n3+5=»8" (special tokens such as EOS left out, as in single-turn samples)."""
    out, start = [], 0
    for i in range(1, len(tokens) + 1):
        if i == len(tokens) or env[i] != env[start]:
            text = tokenizer.decode(tokens[start:i], skip_special_tokens=True)
            out.append(f"«{text}»" if env[start] else text)
            start = i
    return "".join(out)


def metrics(outcomes: list[Outcome], env: str = "", declared: tuple[str, ...] = ()) -> dict[str, float]:
    """A step's episode entries of the row: `tokens/env`, `env/turns_mean`, `env/ends/<reason>` and
    `env/errors/<reason>` counts, and `env/<env>/<metric>` for each metric the environment declares: the mean
    over the episodes that reported it, None when none did (docs/metrics.md)."""
    ends = [x for o in outcomes for x in o.ends]
    turns = torch.cat([o.turns for o in outcomes]) if outcomes else torch.zeros(0)
    row = {"tokens/env": sum(o.env_tokens for o in outcomes), "env/turns_mean": float(turns.float().mean())}
    row.update({f"env/ends/{k}": ends.count(k) for k in ENDS})
    row.update({f"env/errors/{k}": ends.count(k) for k in ERRORS})
    row["env/errors"] = sum(ends.count(k) for k in ERRORS)
    reported = [r for o in outcomes for r in o.reported]
    for name in declared:
        values = [r[name] for r in reported if name in r]
        row[f"env/{env}/{name}"] = math.fsum(values) / len(values) if values else None
    return row
