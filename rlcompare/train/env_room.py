"""Whether a tool-use environment's episodes leave the policy room to use the tool (#62), checked before anything
heavy (`rlcompare train`'s command-line check and `train()`'s preflight): with an environment whose spec declares a
shortest tool call (`env_specs.EnvNeeds.shortest_call`; env=calc: `<calc>1+1</calc>`) a policy turn must be able
to hold it, the turn must end at the stop strings it declares (env=calc: `</calc>`, where the environment reads a
call), and an episode must hold the call, the tool's answer and one more token. Otherwise no episode could ever
call the tool and the run would train single-turn without a word. Tokens are counted with the model's own
tokenizer (the tiny model's character tokenizer counts characters), so only a tokenizer's load is needed, never
the model."""

from __future__ import annotations

from typing import Any

from rlcompare import env_specs
from rlcompare.config import ConfigError
from rlcompare.envs import build


def _tool_spec(cfg: Any):
    """The spec of `cfg.env.name` when it declares a tool call, else None."""
    s = env_specs.SPECS.get(cfg.env.name)
    return s if s is not None and s.needs.shortest_call else None


def check_env_room(cfg: Any) -> None:
    """`check_tool_room` with the tokenizer of `cfg.model`, loaded only for a tool-use environment (torch-free)."""
    if _tool_spec(cfg) is not None:
        from rlcompare.train.teacher_check import student_tokenizer

        check_tool_room(cfg, student_tokenizer(cfg.model))


def check_tool_room(cfg: Any, tokenizer) -> None:
    """Refuse (ConfigError naming the setting and the fix) a tool-use environment whose policy turns or episodes
    could not hold one call; nothing for other environments."""
    spec = _tool_spec(cfg)
    if spec is None:
        return
    name = spec.name  # its stop strings are in env.stop: the config check (config/env_check.py)
    call = spec.needs.shortest_call
    need = _count(tokenizer, call)
    turns = [
        ("budget.max_new_tokens", cfg.budget.max_new_tokens, "train", " (budget=lab, prompts=chain_calc's, gives 48)")
    ]
    if cfg.eval.get("max_new_tokens") is not None:  # the eval's episodes' turns
        turns.append(("eval.max_new_tokens", cfg.eval.max_new_tokens, "evaluate", " (null: budget.max_new_tokens)"))
    for key, value, does, hint in turns:
        if value < need:
            raise ConfigError(
                f"{key}={value}: env={name}'s shortest tool call {call!r} is {need} tokens of this model's tokenizer, "
                f"so no policy turn could call the tool and the run would {does} single-turn; raise {key} to at "
                f"least {need}{hint}"
            )
    env = build.build(build.worker_spec({"name": name, "settings": _plain(cfg.env.get("settings"))}))
    try:
        answer = env.step(call).observation or ""
    except Exception:  # noqa: BLE001 - a tool that needs reset's example first: its answer's room is not counted
        answer = ""
    episode = need + _count(tokenizer, answer) + 1  # the call, the tool's answer, one token of the final answer
    if cfg.env.max_tokens < episode:
        raise ConfigError(
            f"env.max_tokens={cfg.env.max_tokens}: an episode of env={name} must hold the shortest call {call!r}, "
            f"the tool's answer {answer!r} and a final answer ({episode} tokens of this model's tokenizer); raise "
            f"env.max_tokens to at least {episode}"
        )


def _count(tokenizer, text: str) -> int:
    return len(tokenizer(text, add_special_tokens=False, split_special_tokens=True).input_ids)


def _plain(settings: Any) -> dict:
    from omegaconf import OmegaConf

    return OmegaConf.to_container(settings, resolve=True) if OmegaConf.is_config(settings) else dict(settings or {})
