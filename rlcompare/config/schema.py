"""Typed schema for every config key, and validation with messages that name the key and the fix.

Hydra composes YAML files from conf/; `validate(cfg)` merges the result onto this schema
(unknown keys and wrong types fail) and then checks the values (modes, ranges, combinations)
before anything heavy runs.

This module is the run-level schema: `RunConfig` (the run's own keys and one field per section), `validate`
composing the sections' checks, and the checks that read more than one section. The sections' dataclasses, accepted
values, ranges and checks are in rlcompare/config/sections/ (its docstring says why there), but for the env and
verifier sections, here; configs of older run folders are upgraded in one place, legacy.py.
"""

from __future__ import annotations

import functools
import importlib.util
import math
import os
import tempfile
from dataclasses import dataclass, field, fields, is_dataclass
from typing import Any, Optional, Union, get_args, get_origin, get_type_hints

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import ConfigKeyError, ValidationError as OmegaValidationError

from rlcompare.algos import surrogate_specs  # algorithm.clip's knobs: a signed one is bounded by its own check
from rlcompare.config import legacy  # configs of older run folders, upgraded before the merge
from rlcompare.config.checks import AT_LEAST_ONE, NON_NEGATIVE, POSITIVE, SEED, ConfigError, Range
from rlcompare.config.checks import at_least as _at_least, one_of as _one_of
from rlcompare.config.flat import flatten
from rlcompare.config.sections import algorithm, evaluation, model, prompts, rollout, trainer
from rlcompare.config.sections.algorithm import AlgorithmConfig, clip_config, section_type
from rlcompare.config.sections.algorithm import estimator as _estimator
from rlcompare.config.sections.evaluation import EvalConfig
from rlcompare.config.sections.model import DTYPES, ModelConfig, TeacherConfig
from rlcompare.config.sections.prompts import PromptsConfig
from rlcompare.config.sections.rollout import RolloutConfig
from rlcompare.config.sections.trainer import TrainerConfig
from rlcompare.config import user_modules  # algorithm.module, imported before the config is checked
from rlcompare.config import env_check  # env.module, env.name and env.settings against the environments' specs
from rlcompare import env_specs  # one declaration per environment: env.name's accepted values


# ----------------------------------------------------------------------------- schema
@dataclass
class VerifierConfig:
    """The keys every verifier takes (= rlcompare.rewards.registry.RUN_KEYS). A verifier's own settings (exact_match's
    `number`, countdown's `require_all`, format's `pattern`, weighted's `components`, ...) are declared where it is
    registered (`@register_verifier`, docs/verifiers.md) and checked against that declaration."""

    name: str = "exact_match"  # the reward: a registered verifier (exact_match | math_verify | countdown | format | weighted | reasoning_gym, or one verifier.module registers)
    module: Optional[str] = (
        None  # the module that registers verifier.name (@register_verifier), imported first; null: a built-in
    )
    timeout_s: float = 2.0  # seconds allowed to score one completion (at most 3600); over it scores 0
    max_chars: int = 10000  # completions are cut to their last max_chars characters before parsing
    isolation: str = "auto"  # auto | process | inline: auto runs math_verify / custom patterns in worker processes
    workers: Optional[int] = None  # worker processes for isolated verifiers; null = min(4, usable CPU cores)
    batch_timeout_s: float = 30.0  # bound on scoring one batch (one step); completions not scored in time get 0 (error)
    probe: bool = True  # before training, a few reference answers written as correct completions must score correct
    extra: Any = field(default_factory=dict)  # verifier-specific settings


@dataclass
class BudgetConfig:
    name: str = "smoke"  # the budget preset's name (a label)
    max_new_tokens: int = 8  # tokens generated per completion at most
    max_prompt_tokens: int = 16  # prompt tokens at most; longer prompts are dropped
    total_tokens: Optional[int] = 40000  # stop after this many generated completion tokens; null: no token limit
    max_steps: Optional[int] = 100  # stop after this many steps; null: no step limit


@dataclass
class LoggerConfig:
    name: str = "wandb"  # where metrics are mirrored: wandb | none (results/ holds them either way)
    mode: str = "offline"  # W&B: offline | online | disabled
    project: str = "rlcompare"  # W&B project
    entity: Optional[str] = None  # W&B entity; null: the default one
    group: Optional[str] = None  # W&B group; null: none


@dataclass
class EnvConfig:
    name: str = "none"  # none: single-turn | a registered environment (rlcompare/env_specs.py's, or one env.module registers) | custom: env.target
    module: Optional[str] = (
        None  # the module that registers env.name (@register_environment), imported first; null: a built-in
    )
    target: Optional[str] = (
        None  # custom: "module:attribute", the environment's class or factory (called with settings)
    )
    max_turns: int = 3  # policy turns per episode at most; an environment that never says done ends there
    max_tokens: int = 40  # tokens after the prompt per episode at most, the policy's and the environment's
    reward: str = "sum"  # sum: the turns' rewards summed | last: the last turn's reward
    stop: Any = field(default_factory=list)  # strings a policy turn also ends at, kept in the turn (calc: </calc>)
    max_observation_tokens: int = 32  # a longer observation ends its episode (env/errors/huge_observation)
    settings: Any = field(default_factory=dict)  # the environment's knobs (custom: env.target's keyword arguments)


@dataclass
class SweepTags:
    name: Optional[str] = None  # set by rlcompare sweep: the sweep's name
    variant: Optional[str] = None  # set by rlcompare sweep: this member's label
    reference: Optional[str] = None  # set by rlcompare sweep: the label it is compared with
    component: Optional[str] = None  # set by rlcompare sweep: the component it changes


@dataclass
class RunConfig:
    seed: int = 0  # policy/sampling seed, 0..SEED_MAX (2^31 - 1) (data order is prompts.data_seed)
    experiment: str = "default"  # results sub-folder: <results_dir>/<experiment>/<run name>/
    results_dir: str = "results"  # where run folders land
    run_name: Optional[str] = None  # the run folder's name; null: derived from preset, key overrides and seed
    device: str = "auto"  # auto | cpu | cuda
    resume: Any = False  # false | true (same overrides) | <run dir>
    algorithm: AlgorithmConfig = field(default_factory=AlgorithmConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    prompts: PromptsConfig = field(default_factory=PromptsConfig)
    verifier: VerifierConfig = field(default_factory=VerifierConfig)
    budget: BudgetConfig = field(default_factory=BudgetConfig)
    logger: LoggerConfig = field(default_factory=LoggerConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    teacher: TeacherConfig = field(default_factory=TeacherConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    env: EnvConfig = field(default_factory=EnvConfig)
    sweep: SweepTags = field(default_factory=SweepTags)


# ----------------------------------------------------------------------------- accepted values
DEVICES = ("auto", "cpu", "cuda")
LOGGERS = ("wandb", "none")
LOGGER_MODES = ("offline", "online", "disabled")


MAX_TIMEOUT_S = 3600.0  # seconds per completion: an hour is already far past any verifier's need


def to_schema(cfg: DictConfig | dict) -> DictConfig:
    """Merge a composed config onto the schema: unknown keys and wrong types raise ConfigError."""
    schema = OmegaConf.structured(RunConfig)
    OmegaConf.set_struct(schema.verifier, False)  # a verifier's own settings: checked by _check_verifier
    user = cfg if isinstance(cfg, DictConfig) else OmegaConf.create(cfg)
    user = OmegaConf.masked_copy(user, [k for k in user.keys() if k != "hydra"]) if "hydra" in user else user
    user = legacy.upgrade(user)  # the one place an older run folder's config is upgraded
    try:
        merged = OmegaConf.merge(schema, user)
    except ConfigKeyError as e:
        key = e.full_key or e.key
        parent = ".".join(str(key).split(".")[:-1])
        node = OmegaConf.select(schema, parent) if parent else schema
        accepted = ", ".join(sorted(node.keys())) if isinstance(node, DictConfig) else "?"
        raise ConfigError(f"unknown config key '{key}'; accepted keys here: {accepted}") from None
    except OmegaValidationError as e:
        first = str(e.msg).strip().splitlines()[0] if str(e.msg).strip() else str(e)
        raise ConfigError(
            f"{e.full_key}={getattr(e, 'value', None)!r} is not accepted (bad value for '{e.full_key}'): {first}"
        ) from None
    return merged


# (registry state, defaults): a plug-in surrogate's knobs have defaults once it is registered
_FLAT_DEFAULTS: list = [None, {}]


def flat_defaults() -> dict:
    """Every key's default, as flat dotted keys (legacy.with_missing_defaults fills a key an older config lacks with
    it). Cached per surrogate registry state: do not mutate."""
    key = surrogate_specs.registry_key()
    if _FLAT_DEFAULTS[0] != key:
        _FLAT_DEFAULTS[:] = [key, flatten(OmegaConf.to_container(OmegaConf.structured(RunConfig), resolve=False))]
    return _FLAT_DEFAULTS[1]


def validate(cfg: DictConfig | dict) -> DictConfig:
    """Return the schema-typed config, or raise ConfigError naming the key and the fix."""
    _import_algorithm_module(cfg)  # first: a plug-in surrogate's knobs are schema keys once it is registered
    c = to_schema(cfg)
    try:
        OmegaConf.resolve(c)
    except Exception as e:  # a bad interpolation
        raise ConfigError(f"config interpolation failed: {e}") from None
    _check_finite(OmegaConf.to_container(c, resolve=True))  # first: nan passes every comparison below
    _one_of("device", c.device, DEVICES)
    algorithm.check(c.algorithm)
    trainer.check(c.trainer)
    rollout.check(c.rollout)
    _check_algorithm_needs(c)
    evaluation.check(c.eval)
    _check_env(c)
    _check_vllm(c)
    _check_budget(c)
    _check_ranges(c)  # every numeric key the checks above did not cover (the model's sizes divide below)
    model.check(c.model)
    _check_context(c)
    prompts.check(c.prompts)
    _check_inputs_and_places(c)
    _check_verifier(c)
    return c


def _import_algorithm_module(cfg: DictConfig | dict) -> None:
    user = cfg if isinstance(cfg, DictConfig) else OmegaConf.create(cfg)
    try:
        module = OmegaConf.select(user, user_modules.KEY, default=None)
    except Exception:  # noqa: BLE001 - an interpolation that cannot resolve: the checks below name it
        return
    try:
        user_modules.import_surrogate_module(module)
    except ValueError as e:
        raise ConfigError(str(e)) from None


def _check_verifier(c: DictConfig) -> None:
    """verifier.name is registered and every verifier key is one it declares (rewards/registry.py: the built-ins
    and verifier.module's import nothing heavy)."""
    from rlcompare.rewards import registry

    try:
        registry.check_config(OmegaConf.to_container(c.verifier, resolve=True))
    except ValueError as e:
        raise ConfigError(str(e)) from None


def _check_algorithm_needs(c: DictConfig) -> None:
    """What the algorithm needs of the rest of the run: groups to compare, the recomputed log-probs its corrections
    weigh, a teacher (and none without distillation), a budget longer than the overlong window."""
    a, t, b = c.algorithm, c.trainer, c.budget
    spec, settings = _estimator(a)
    if t.group_size < 2 and spec.uses_groups(settings):
        raise ConfigError(
            f"trainer.group_size={t.group_size} with algorithm.advantage.estimator={a.advantage.estimator}: group advantages compare completions of one prompt, so they need trainer.group_size >= 2 (or use algorithm=ppo)"
        )
    if a.mismatch.mode is not None and not t.recompute_old_logp:
        raise ConfigError(
            f"algorithm.mismatch.mode={a.mismatch.mode} corrects recomputed old log-probs against the "
            "sampler's; set trainer.recompute_old_logp=true (or algorithm.mismatch.mode=null)"
        )
    if a.off_policy.correction is not None and not t.recompute_old_logp:
        raise ConfigError(
            f"algorithm.off_policy.correction={a.off_policy.correction} compares the proximal policy (the old "
            "log-probs recomputed with the current weights) with the sampler's; set trainer.recompute_old_logp=true "
            "(or algorithm.off_policy.correction=null)"
        )
    _check_teacher(c)
    if a.overlong.soft_punishment and a.overlong.cache_len >= b.max_new_tokens:
        raise ConfigError(
            f"algorithm.overlong.cache_len={a.overlong.cache_len} must be < budget.max_new_tokens={b.max_new_tokens}"
        )


def _check_teacher(c: DictConfig) -> None:
    """On-policy distillation (issue 52): the distill estimator and the teacher come together."""
    a, teacher = c.algorithm, c.teacher
    distill = _estimator(a)[0].needs.teacher
    if distill and teacher.path is None:
        raise ConfigError(
            "algorithm.advantage.estimator=distill scores the student's tokens with a teacher: set teacher.path=<a "
            "model folder, run folder or hub id> (docs/algorithms.md section 9)"
        )
    if not distill and teacher.path is not None:
        raise ConfigError(
            f"teacher.path={teacher.path!r} is set but algorithm.advantage.estimator={a.advantage.estimator} reads no "
            "teacher: use algorithm=opd (or algorithm.advantage.estimator=distill), or teacher.path=null"
        )
    if teacher.dtype is not None:
        _one_of("teacher.dtype", teacher.dtype, DTYPES[1:])
    if teacher.device is not None:
        _one_of("teacher.device", teacher.device, DEVICES)


def _check_vllm(c: DictConfig) -> None:
    """rollout.engine=vllm (rlcompare.rollout.vllm_engine): what it cannot honour, refused before torch loads."""
    if c.rollout.engine != "vllm":
        return
    why = None
    spec = importlib.util.find_spec("vllm")
    if spec is None or spec.origin in (None, "namespace"):  # a bare folder named vllm on the path is not it
        why = 'vllm is not installed; pip install -e ".[vllm]" (the CPU build: docs/vllm.md) or use rollout.engine=auto'
    elif c.env.name != "none":
        why = f"env.name={c.env.name}: multi-turn episodes are not supported by this engine; set env=none or rollout.engine=auto"
    elif c.rollout.top_p < 1:
        # vLLM's processed log-probs are renormalised over the nucleus, rlcompare's over the whole vocabulary
        why = (
            f"rollout.top_p={c.rollout.top_p}: vLLM's log-probs would be over the nucleus, the trainer's over the whole "
            f"vocabulary (the mismatch weights would compare two distributions); set rollout.top_p=1.0 or rollout.engine=auto"
        )
    elif c.model.lora.enabled:
        why = "model.lora.enabled=true: the engine loads whole weights, not adapters; set model.lora.enabled=false or rollout.engine=auto"
    elif c.trainer.parallel in ("ddp", "fsdp"):
        why = f"trainer.parallel={c.trainer.parallel}: one engine per process is not wired for several ranks; set trainer.parallel=none or rollout.engine=auto"
    if why is not None:
        raise ConfigError(f"rollout.engine=vllm: {why}")


ENV_REWARDS = ("sum", "last")
# ENV_NAMES (none, every registered environment, custom) is read from rlcompare/env_specs.py on access (__getattr__)


def _check_env(c: DictConfig) -> None:
    """The env group (issue 51): a known environment with settings a multi-turn rollout can run; its name,
    settings and needs checked against its spec (config/env_check.py, after importing env.module)."""
    e = c.env
    try:
        env_check.import_env_module(e.module)  # first: it registers env.name
        env_check.check_name(e.name, e.module)
    except ValueError as err:
        raise ConfigError(str(err)) from None
    if e.name == "none":
        return
    _one_of("env.reward", e.reward, ENV_REWARDS)
    _at_least("env.max_turns", e.max_turns, 1)
    _at_least("env.max_tokens", e.max_tokens, 1, "it bounds the policy's and the environment's tokens per episode")
    _at_least("env.max_observation_tokens", e.max_observation_tokens, 1)
    if e.max_tokens < c.budget.max_new_tokens:
        raise ConfigError(
            f"env.max_tokens={e.max_tokens} is below budget.max_new_tokens={c.budget.max_new_tokens}: an episode "
            f"could not hold one full policy turn; raise env.max_tokens or lower budget.max_new_tokens"
        )
    stops = list(e.stop) if OmegaConf.is_list(e.stop) or isinstance(e.stop, (list, tuple)) else None
    if stops is None or not all(isinstance(x, str) and x for x in stops):
        raise ConfigError(f"env.stop={e.stop!r} must be a list of non-empty strings (e.g. ['</calc>']) or []")
    try:
        env_check.check_environment(e)
    except ValueError as err:
        raise ConfigError(str(err)) from None
    if env_check.multi_turn(e.name) and not _estimator(c.algorithm)[0].needs.multi_turn:
        raise ConfigError(
            f"env.name is not supported with the {c.algorithm.advantage.estimator} estimator (distill: the teacher "
            "would score the environment's tokens); set env=none"
        )


def _check_budget(c: DictConfig) -> None:
    """A budget that stops, and holds at least one step."""
    t, b = c.trainer, c.budget
    n_seqs = t.prompts_per_step * t.group_size
    _at_least("budget.max_new_tokens", b.max_new_tokens, 1)
    _at_least("budget.max_prompt_tokens", b.max_prompt_tokens, 1)
    if b.total_tokens is None and b.max_steps is None:
        raise ConfigError("budget needs budget.total_tokens (generated tokens) or budget.max_steps; set at least one")
    if b.max_steps is not None:
        _at_least("budget.max_steps", b.max_steps, 1)
    if b.total_tokens is not None:
        one_step = n_seqs  # every completion generates at least one token
        if b.total_tokens < one_step:
            raise ConfigError(
                f"budget.total_tokens={b.total_tokens} is smaller than one step ({t.prompts_per_step} prompts x {t.group_size} completions = at least {one_step} tokens); raise budget.total_tokens or lower trainer.prompts_per_step"
            )


def _check_context(c: DictConfig) -> None:
    """The tiny model's context holds a prompt and its completion, an eval completion, and an episode."""
    if c.model.kind == "tiny":
        where = f"model.max_position_embeddings={c.model.max_position_embeddings}"
        check_fits_context(c.budget, c.model.max_position_embeddings, where, "lower the budget or raise the context")
        check_eval_fits_context(c, c.model.max_position_embeddings, where)


def _check_inputs_and_places(c: DictConfig) -> None:
    """Verifier, resume, logger, and the folders the run writes."""
    if c.verifier.timeout_s is None or c.verifier.timeout_s <= 0:
        raise ConfigError(f"verifier.timeout_s={c.verifier.timeout_s} must be > 0 (seconds per completion)")
    if c.verifier.timeout_s > MAX_TIMEOUT_S:  # 1e300 overflowed the workers' timers: score_batch raised
        raise ConfigError(
            f"verifier.timeout_s={c.verifier.timeout_s} must be <= {MAX_TIMEOUT_S:g} (seconds per completion)"
        )
    if not (isinstance(c.resume, (bool, str)) and c.resume != ""):
        raise ConfigError(
            f"resume={c.resume!r} is not accepted; use false, true (same overrides) or the path of a run folder"
        )
    _one_of("logger.name", c.logger.name, LOGGERS)
    _one_of("logger.mode", c.logger.mode, LOGGER_MODES)
    _check_folder_name("experiment", c.experiment)
    if c.run_name is not None:
        _check_folder_name("run_name", c.run_name)
    _check_results_dir(c.results_dir)
    if c.model.cache_dir is not None:
        check_creatable("model.cache_dir", c.model.cache_dir)


def check_fits_context(budget, ctx: int | None, where: str, fix: str = "lower the budget") -> None:
    """The one context-length check: a prompt of budget.max_prompt_tokens plus budget.max_new_tokens generated must
    fit in the model's `ctx` positions (None: unknown, not checked). `where` says where ctx came from."""
    need = budget.max_prompt_tokens + budget.max_new_tokens
    if ctx is not None and need > ctx:
        raise ConfigError(
            f"budget.max_prompt_tokens + budget.max_new_tokens = {need} exceeds the model's context {where}; {fix}"
        )


def check_eval_fits_context(c, ctx: int | None, where: str) -> None:
    """eval.max_new_tokens, when set, must fit beside budget.max_prompt_tokens in the model's `ctx` positions; so
    must a whole episode, env.max_tokens, when an environment is set."""
    env = c.get("env")
    if env is not None and env.name != "none" and ctx is not None and c.budget.max_prompt_tokens + env.max_tokens > ctx:
        raise ConfigError(
            f"budget.max_prompt_tokens + env.max_tokens = {c.budget.max_prompt_tokens + env.max_tokens} exceeds the "
            f"model's context {where}; lower env.max_tokens"
        )
    e = c.eval.max_new_tokens
    need = c.budget.max_prompt_tokens + (e or 0)
    if e is not None and ctx is not None and need > ctx:
        raise ConfigError(
            f"budget.max_prompt_tokens + eval.max_new_tokens = {need} exceeds the model's context {where}; "
            f"lower eval.max_new_tokens (null: budget.max_new_tokens)"
        )


def _check_results_dir(path: str) -> None:
    check_creatable("results_dir", path)


def check_creatable(key: str, path: str) -> None:
    """`path` is a folder, or can be made one (by Hydra, or the run) with its parents; else ConfigError naming `key`."""
    why = why_not_creatable(str(path))
    if why is not None:
        raise ConfigError(
            f"{key}={str(path)!r} is not writable ({why}); choose a folder you can write"
            + (", e.g. results_dir=./results" if key == "results_dir" else "")
        )


def why_not_creatable(path: str) -> str | None:
    """None when `path` is a folder one can write in, or can be made one; else why not. The one writability
    check: validate (results_dir, model.cache_dir), the pre-check and the run's preflight all call it."""
    if not path.strip() or "\0" in path:
        return "an empty path or one holding a NUL character"
    full = os.path.abspath(path)
    missing = []
    while not os.path.lexists(full):  # lexists: a dangling symlink is in the way, not missing
        full, name = os.path.dirname(full), os.path.basename(full)
        missing.append(name)
    too_long = [n for n in missing if len(os.fsencode(n)) > _NAME_MAX]
    if too_long:
        return f"the folder name {too_long[0][:40]!r}... is longer than {_NAME_MAX} bytes"
    if not os.path.isdir(full):
        return f"checked {full}: not a folder"
    try:  # os.access says yes to root on read-only mounts and /proc: make (and remove) a folder there instead
        os.rmdir(tempfile.mkdtemp(prefix=".rlcompare-write-check-", dir=full))
    except OSError as e:
        return f"checked {full}: {e.strerror or e}"
    return None


_NAME_MAX = 255  # bytes in one folder name on Linux and macOS file systems


def _check_folder_name(key: str, value: Any) -> None:
    """`experiment` and `run_name` name one folder under results_dir: no separators, no `..`, nothing absolute."""
    name = str(value)
    bad = (
        not name.strip()
        or name in (".", "..")
        or any(ch in name for ch in "/\\\0")
        or len(os.fsencode(name)) > _NAME_MAX
    )
    if bad:
        raise ConfigError(
            f"{key}={value!r} must be one folder name inside results_dir: not empty, not '.' or '..', no "
            f"'/' or '\\', at most {_NAME_MAX} bytes; e.g. {key}=my_{key}"
        )


# ----------------------------------------------------------------------------- numbers: finite, within range
def numeric_keys(schema: type = None, prefix: str = "") -> dict[str, type]:
    """Every int and float key of the schema (dotted path -> int | float), walked from the dataclasses: a key added
    to the schema is covered by `_check_ranges` without being listed anywhere. (Cached: do not mutate.)"""
    return _numeric_keys(RunConfig if schema is None else schema, prefix, clip_config())


@functools.lru_cache(maxsize=None)
def _numeric_keys(schema: type, prefix: str, _clip: type) -> dict[str, type]:
    out: dict[str, type] = {}
    hints = get_type_hints(schema)
    for f in fields(schema):
        tp = section_type(_unwrap_optional(hints[f.name]))
        if is_dataclass(tp):
            out.update(_numeric_keys(tp, f"{prefix}{f.name}.", _clip))
        elif tp in (int, float):
            out[prefix + f.name] = tp
    return out


def _unwrap_optional(tp):
    if get_origin(tp) is Union:
        args = [a for a in get_args(tp) if a is not type(None)]
        return args[0] if len(args) == 1 else tp
    return tp


# Keys whose accepted range is narrower than NON_NEGATIVE: the run's own, the verifier's and the budget's here, every
# other section's in its module. Optional keys are checked when set.
RANGES: dict[str, Range] = {
    **algorithm.RANGES,
    "seed": SEED,
    **prompts.RANGES,
    **model.RANGES,
    "verifier.timeout_s": POSITIVE,  # and at most MAX_TIMEOUT_S
    "verifier.max_chars": AT_LEAST_ONE,
    "verifier.workers": AT_LEAST_ONE,
    "budget.max_new_tokens": AT_LEAST_ONE,
    "budget.max_prompt_tokens": AT_LEAST_ONE,
    "budget.total_tokens": AT_LEAST_ONE,
    "budget.max_steps": AT_LEAST_ONE,
    **trainer.RANGES,
    **rollout.RANGES,
    **evaluation.RANGES,
}


def _signed_knobs() -> set[str]:
    """algorithm.clip's knobs whose spec takes negative values (its own check bounds them)."""
    return {f"algorithm.clip.{k}" for k, f in surrogate_specs.all_knob_fields().items() if f.metadata.get("signed")}


def _check_ranges(c: DictConfig) -> None:
    signed = _signed_knobs()
    for key in numeric_keys():
        if key in signed:
            continue
        value = OmegaConf.select(c, key)
        rule = RANGES.get(key, NON_NEGATIVE)
        if value is not None and not rule.holds(value):
            raise ConfigError(f"{key}={value!r} must be {rule}")


def _check_finite(node: Any, key: str = "") -> None:
    """Every float anywhere in the config (typed keys, lists such as trainer.betas, verifier.components) is finite:
    nan passes every comparison (kl.coef=nan silently turned KL off) and inf poisons the weights."""
    if isinstance(node, dict):
        for k, v in node.items():
            _check_finite(v, f"{key}.{k}" if key else str(k))
    elif isinstance(node, (list, tuple)):
        for i, v in enumerate(node):
            _check_finite(v, f"{key}[{i}]")
    elif isinstance(node, float) and not math.isfinite(node):
        rule = RANGES.get(key, NON_NEGATIVE) if key in numeric_keys() and key not in _signed_knobs() else None
        raise ConfigError(f"{key}={node} is not a finite number; use a finite number" + (f" {rule}" if rule else ""))


def __getattr__(name: str):
    if name == "ENV_NAMES":  # none, every registered environment, custom: read from rlcompare/env_specs.py on access
        return env_specs.names()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
