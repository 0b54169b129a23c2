"""Typed schema for every config key, and validation with messages that name the key and the fix.

Hydra composes YAML files from conf/; `validate(cfg)` merges the result onto this schema
(unknown keys and wrong types fail) and then checks the values (modes, ranges, combinations)
before anything heavy runs.
"""

from __future__ import annotations

import functools
import importlib.util
import math
import os
import tempfile
from dataclasses import dataclass, field, fields, is_dataclass, make_dataclass
from typing import Any, Callable, Optional, Union, get_args, get_origin, get_type_hints

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import ConfigKeyError, ValidationError as OmegaValidationError

from rlcompare.algos import accepted  # the math layer's accepted names, torch-free (losses/advantages re-export them)
from rlcompare.algos import surrogate_specs  # one declaration per surrogate: algorithm.clip's knobs
from rlcompare.algos import estimator_specs  # one declaration per advantage estimator: its knobs and needs
from rlcompare.config.flat import flatten
from rlcompare.passk import MAX_SAMPLES
from rlcompare.config import user_modules  # algorithm.module, imported before the config is checked


class ConfigError(ValueError):
    """A setting that cannot work; the message names the key and what it accepts."""


# ----------------------------------------------------------------------------- schema
@dataclass
class AdvantageConfig:
    estimator: str = "group"  # advantage estimator: one registered in algos/estimator_specs.py (group | rloo | gae | reinforce_pp | distill (needs teacher.path) | gdpo)
    scale: str = "group"  # advantage scale: group | batch | batch-centered | none (group); none (rloo); whiten | none (gae, gdpo); whiten (reinforce_pp)
    std_ddof: int = 1  # delta degrees of freedom of the std that scales advantages: 1 (torch.std, TRL, verl) | 0
    eps: float = 1e-6  # added to the std before dividing (keeps it finite for groups of equal rewards)
    baseline: str = "none"  # reinforce_pp: none (REINFORCE++) | group (REINFORCE++-baseline)
    gamma: float = 1.0  # reinforce_pp: discount of the return to go
    reward_coef: float = (
        0.0  # distill: weight of the reward's group advantage beside the teacher's term; 0: distillation alone
    )
    distill_discount: float = (
        0.0  # distill: discount over later tokens' teacher terms, in [0, 1]; 0: per token (Tinker)
    )


@dataclass
class ClipConfig:
    eps_low: float = 0.2  # PPO clip range below 1: ratios under 1 - eps_low are clipped
    eps_high: float = 0.2  # PPO clip range above 1 (DAPO's clip-higher raises it, e.g. 0.28)
    dual_clip: Optional[float] = None  # dual-clip bound c > 1 on negative-advantage tokens (verl 3); null: off
    # then every surrogate's own knobs, derived from its spec (algos/surrogate_specs.py): clip_config()


_CLIP_CONFIGS: dict = {}


def clip_config() -> type:
    """`algorithm.clip`'s schema: :class:`ClipConfig` and every registered surrogate's knobs (their specs' settings
    fields, with their defaults, types and help), built from the registry as it is now, so that a surrogate
    registered after this module was imported has its keys (cached per registry state)."""
    key = surrogate_specs.registry_key()
    if key not in _CLIP_CONFIGS:
        knobs = surrogate_specs.all_knob_fields()
        hints = {}
        for s in surrogate_specs.SPECS.values():
            hints.update({k: v for k, v in get_type_hints(s.settings).items() if k in knobs and k not in hints})
        cls = make_dataclass(
            "ClipConfigWithKnobs",
            [(k, hints[k], field(default=f.default, metadata=f.metadata)) for k, f in knobs.items()],
            bases=(ClipConfig,),
        )
        cls.__module__ = __name__  # pickled by reference (the newest one)
        globals()["ClipConfigWithKnobs"] = cls
        _CLIP_CONFIGS[key] = cls
    return _CLIP_CONFIGS[key]


def _section(tp: type) -> type:
    """The dataclass that stands for a schema section: algorithm.clip's derived one for ClipConfig."""
    return clip_config() if tp is ClipConfig else tp


@dataclass
class MismatchConfig:
    mode: Optional[str] = (
        None  # rollout/trainer mismatch correction: null (off) | token-truncate | token-mask | sequence-truncate | sequence-mask | icepop
    )
    c_min: Optional[float] = None  # lower bound of the mismatch weight; null: the mode's default (none; icepop 0.5)
    c_max: Optional[float] = None  # upper bound of the mismatch weight; null: the mode's default (2.0; icepop 5.0)


@dataclass
class OffPolicyConfig:
    correction: Optional[str] = (
        None  # correction for stale rollouts (rollout.staleness): null (off) | decoupled | geo-mask | m2po; needs trainer.recompute_old_logp=true
    )
    decoupled_cap: Optional[float] = accepted.OFF_POLICY_DEFAULTS[
        "decoupled_cap"
    ]  # decoupled: cap on the weight pi_prox/pi_behav; null: uncapped (AReaL's default; it recommends 5)
    decoupled_cap_mode: str = accepted.OFF_POLICY_DEFAULTS[
        "decoupled_cap_mode"
    ]  # decoupled: mask (weight 0 above the cap, AReaL's behav_imp_weight_cap) | truncate (min(weight, cap))
    geo_delta: float = accepted.OFF_POLICY_DEFAULTS[
        "geo_delta"
    ]  # geo-mask: a sequence is dropped when its geometric-mean ratio leaves [1 - delta, 1 + delta] (SkyRL 0.01)
    m2po_threshold: float = accepted.OFF_POLICY_DEFAULTS[
        "m2po_threshold"
    ]  # m2po: tau_M2, the mean (log r)^2 the kept tokens must not exceed (arXiv 2510.01161: 0.04)
    m2po_tokens: str = accepted.OFF_POLICY_DEFAULTS[
        "m2po_tokens"
    ]  # m2po: which tokens the second moment is over: trust-region (the paper's) | all (AReaL's)


@dataclass
class KLConfig:
    coef: float = 1e-3  # KL penalty coefficient against the reference model; 0: off (no reference model loaded)
    estimator: str = "k3"  # KL estimator: k1 | k2 | k3 | k3+
    placement: str = "in_loss"  # where the KL enters: in_loss (a loss term) | in_reward (subtracted from the reward)


@dataclass
class DynamicSamplingConfig:
    enabled: bool = False  # DAPO dynamic sampling: drop groups whose rewards are all equal and refill the batch
    max_rounds: int = 3  # extra generation rounds allowed to refill the batch


@dataclass
class OverlongConfig:
    filter: bool = False  # mask truncated completions out of the loss (DAPO overlong filtering)
    soft_punishment: bool = False  # DAPO Eq. 13: a length penalty over the last cache_len tokens of the budget
    cache_len: int = 4  # soft punishment: tokens before budget.max_new_tokens where the penalty ramps up
    factor: float = 1.0  # soft punishment: the penalty at the full length


@dataclass
class CriticConfig:
    gamma: float = 1.0  # GAE discount
    lam: float = 1.0  # GAE lambda
    value_clip: Optional[float] = 0.2  # value-loss clip range around the old values; null: off
    coef: float = 0.5  # value-loss coefficient
    lr: float = 1e-3  # the critic's learning rate


@dataclass
class AlgorithmConfig:
    name: str = "grpo"  # the preset's name (a label; the run name starts with it)
    paper: str = "DeepSeekMath (arXiv 2402.03300)"  # the paper the preset follows (shown in reports)
    advantage: AdvantageConfig = field(default_factory=AdvantageConfig)
    ratio: str = "token"  # importance-ratio level: token | sequence | sequence-token | hybrid
    surrogate: str = "clip"  # per-token policy surrogate: one registered in algos/surrogate_specs.py (clip | cispo | sapo | gmpo | dppo-tv | dppo-kl | clip-cov | kl-cov)
    clip: ClipConfig = field(default_factory=lambda: clip_config()())  # with every surrogate's knobs
    module: Optional[str] = (
        None  # the module that registers algorithm.surrogate (@register_surrogate), imported first; null: a built-in
    )
    aggregation: str = "seq-mean-token-mean"  # how token losses reduce to one number: token-mean | token-sum | seq-mean-token-mean | seq-mean-token-sum | seq-mean-token-sum-norm | prompt-mean-token-mean
    horizon: Optional[int] = None  # H for seq-mean-token-sum-norm (Dr. GRPO: budget.max_new_tokens)
    kl: KLConfig = field(default_factory=KLConfig)
    entropy_coef: float = 0.0  # entropy bonus coefficient; 0: off
    top_entropy_quantile: Optional[float] = None  # train only on the top-rho entropy tokens, rho in [0, 1]; null: off
    mismatch: MismatchConfig = field(default_factory=MismatchConfig)  # rollout/trainer mismatch correction
    off_policy: OffPolicyConfig = field(default_factory=OffPolicyConfig)  # corrections for stale rollouts
    dynamic_sampling: DynamicSamplingConfig = field(default_factory=DynamicSamplingConfig)
    overlong: OverlongConfig = field(default_factory=OverlongConfig)
    critic: CriticConfig = field(default_factory=CriticConfig)


@dataclass
class LoraConfig:
    enabled: bool = False  # train LoRA adapters instead of every weight
    r: int = 8  # LoRA rank
    alpha: int = 16  # LoRA alpha (the update is scaled by alpha / r)
    dropout: float = 0.0  # LoRA dropout
    target_modules: Any = "all-linear"  # modules given adapters: all-linear or a list of names


@dataclass
class WarmStartConfig:
    steps: int = 300  # tiny model: supervised warm-start steps before RL
    batch_size: int = 64  # tiny model: warm-start batch size
    lr: float = 3e-3  # tiny model: warm-start learning rate
    noisy_label_frac: float = 0.5  # share of SFT labels off by one or two
    noise_offsets: Any = field(default_factory=lambda: [1, 2])  # how noisy labels are off (a shared bias RL can undo)
    seed: int = 0  # tiny model: the warm start's seed (its weights are shared by every run seed)


@dataclass
class ModelConfig:
    kind: str = "tiny"  # tiny (a small Llama built in code) | hf (any causal LM)
    name: str = "tiny-llama"  # the model's name (tiny: its identity in fingerprints)
    # tiny: a Llama built from a transformers config, char tokenizer built in code
    hidden_size: int = 128  # tiny: hidden size
    num_layers: int = 2  # tiny: decoder layers
    num_heads: int = 4  # tiny: attention heads (hidden_size / num_heads must be even)
    intermediate_size: int = 256  # tiny: MLP width
    max_position_embeddings: int = 64  # tiny: context length in positions
    warm_start: WarmStartConfig = field(default_factory=WarmStartConfig)
    cache_dir: Optional[str] = None  # warm-start cache folder; null: $RLCOMPARE_CACHE or ~/.cache/rlcompare
    # hf: any causal LM, hub id or local folder
    name_or_path: Optional[str] = None  # hf: a hub id, a local folder, or package:<distribution> (its GGUF file)
    gguf_file: Optional[str] = None  # hf: a .gguf file in that folder, read by transformers (gguf package); null: none
    dtype: str = "auto"  # hf: weights dtype: auto | bfloat16 | float32 | float16
    attn_implementation: Optional[str] = (
        None  # hf: transformers' attn_implementation (e.g. sdpa, flash_attention_2); null: its default
    )
    gradient_checkpointing: bool = False  # hf: recompute activations in the backward (less memory, slower)
    trust_remote_code: bool = False  # hf: run the model repository's own code (only for repositories you trust)
    disable_dropout: bool = True  # zero every dropout probability of the loaded model (LoRA's own dropout kept)
    lora: LoraConfig = field(default_factory=LoraConfig)


@dataclass
class PromptsConfig:
    name: str = "arithmetic"  # the prompt set's name (a label)
    kind: str = "arithmetic"  # where prompts come from: arithmetic | chain | countdown | file | hf | reasoning_gym
    data_seed: int = 0  # seed of the data order and the train/eval split, 0..SEED_MAX (2^31 - 1)
    n_train: int = 2000  # training prompts used (generated sets: built; files: at most); null: all
    n_eval: int = 200  # held-out prompts evaluated
    max_operand: int = 19  # arithmetic: operands drawn from 0..max_operand
    path: Optional[str] = None  # file: the prompt file (.jsonl, .json, .csv or .parquet)
    eval_path: Optional[str] = None  # file: a separate eval file; null: hold out eval_fraction of path
    hf_id: Optional[str] = None  # hf: the dataset id on the Hugging Face hub
    hf_config: Optional[str] = None  # hf: the dataset's config name
    train_split: str = "train"  # hf: the split trained on
    eval_split: Optional[str] = "test"  # hf: the split evaluated; null: hold out eval_fraction of train_split
    eval_fraction: float = 0.1  # share held out for eval when there is no separate eval file/split
    fields: Any = field(
        default_factory=lambda: {"question": "question", "answer": "answer"}
    )  # the dataset's column names for question and answer
    answer_extractor: Optional[str] = (
        None  # how the reference answer is read from the answer column: gsm8k | boxed | none
    )
    template: str = "{question}"  # a literal with {question}, or a named template: plain | boxed | r1 | r1_chat
    chat: bool = False  # wrap prompts in the tokenizer's chat template
    system_prompt: Optional[str] = None  # chat: a system message; null: none
    min_numbers: int = 3  # countdown generator: fewest numbers per puzzle
    max_numbers: int = 4  # countdown generator: most numbers per puzzle
    max_number: int = 99  # countdown generator: numbers drawn from 1..max_number
    max_target: int = 100  # countdown generator: targets in 1..max_target
    min_terms: int = 2  # chain (the lab task): fewest single-digit terms per sum
    max_terms: int = 6  # chain: most terms per sum
    max_term: int = 9  # chain: terms drawn from 1..max_term
    task: Optional[str] = None  # reasoning_gym: the dataset's name (any reasoning-gym lists)
    task_config: Any = field(default_factory=dict)  # reasoning_gym: the dataset's settings (its config fields)
    train_seed: int = 1  # reasoning_gym: the seed the train split is generated from
    eval_seed: int = 1000000  # reasoning_gym: the held-out split's seed (entry i uses seed + i: keep the ranges apart)
    warm_start: Any = None  # a prompt set's own warm-start recipe for model=tiny: keys replace model.warm_start's
    extra: Any = field(default_factory=dict)  # prompt-set specific settings


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
class TrainerConfig:
    prompts_per_step: int = 16  # prompts sampled per step
    group_size: int = 8  # completions sampled per prompt
    lr: float = 3e-5  # policy learning rate (AdamW)
    weight_decay: float = 0.0  # AdamW weight decay
    betas: Any = field(default_factory=lambda: [0.9, 0.99])  # AdamW betas
    warmup_steps: int = 0  # linear learning-rate warmup steps; 0: none
    max_grad_norm: Optional[float] = 1.0  # gradient-norm clip; null: off
    updates_per_rollout: int = (
        2  # optimizer steps per rollout batch (mini-batches); > 1 makes ratio and clipping matter
    )
    micro_batch_size: Optional[int] = (
        None  # sequences per forward inside a mini-batch (gradient accumulation); null: whole mini-batch
    )
    eval_every: int = 5  # steps between evaluations
    eval_batch_size: int = 256  # prompts per evaluation forward
    n_samples_logged: int = 4  # sample completions written per step to samples.jsonl
    sample_max_chars: int = 400  # characters kept of each logged sample
    recompute_old_logp: bool = (
        False  # false: reuse the sampler's log-probs (same weights) as old_logp; true: recompute them
    )
    skip_zero_advantage: bool = False  # true: no forward/backward for groups whose advantages are all 0 (when exact)
    update_from_rollout: bool = (
        True  # the first update on a batch reuses the sampler's projections (rlcompare.fast.recorded_update)
    )
    checkpoint_every: Optional[int] = None  # steps between checkpoints (and the last step); null: at each eval; 0: off
    keep_checkpoints: int = 2  # newest checkpoints kept on disk
    export_final: bool = False  # at the end of the run, write the policy as a Hugging Face folder in <run dir>/export
    max_bad_steps: int = 5  # non-finite steps (skipped) in a row before the run fails
    unhealthy: str = "fail"  # a run that broke a run-health invariant at every step: fail (exit 1) | warn (completed)
    threads: Optional[int] = None  # CPU threads for torch; null: torch's default
    keep_freed_memory: bool = True  # CPU: malloc keeps freed memory for reuse (rlcompare.fast.malloc_tuning)
    progress: bool = True  # print a progress line
    inject_nan_at_step: Optional[int] = None  # testing hook: makes that step's loss NaN; null: off
    parallel: str = "auto"  # data parallelism: auto (ddp under torchrun, else none) | none | ddp | fsdp
    grad_sum: str = (
        "auto"  # how ranks sum gradients: auto (shared memory for CPU ranks on one machine) | shared_memory | backend
    )


@dataclass
class RolloutConfig:
    temperature: float = 1.0  # sampling temperature (>= 1e-6)
    top_p: float = 1.0  # nucleus sampling: keep the smallest token set with this probability; 1: off
    kv_cache: str = (
        "auto"  # auto: preallocated cache for Llama/Qwen2/Qwen3/Mistral (same tokens) | dynamic: transformers' cache
    )
    streams: str = "batch"  # batch: one random stream per batch | group: one per prompt group (torchrun needs it)
    staleness: int = (
        0  # train step t on the rollout sampled by step t-k's weights (first k: initial ones); 0: on-policy
    )
    engine: str = "auto"  # auto: eager until the graph engine has run on a GPU | eager: step by step | graphs: CUDA-graph decode | vllm: a colocated vLLM engine ([vllm] extra; docs/vllm.md)
    sync_every: int = 16  # graphs engine: tokens between checks for finished rows (the only host syncs)


@dataclass
class TeacherConfig:
    path: Optional[str] = (
        None  # on-policy distillation's teacher: a causal LM folder, hub id, export or run folder; null: none
    )
    dtype: Optional[str] = None  # the teacher's weights dtype: bfloat16 | float32 | float16; null: the policy's
    device: Optional[str] = None  # the teacher's device; null: the policy's (another device is refused)
    revision: Optional[str] = (
        None  # a hub teacher's commit (40 hex digits), required with a hub id; null: a local folder
    )


@dataclass
class EnvConfig:
    name: str = (
        "none"  # none: single-turn (one completion per prompt) | feedback | calc | custom (docs/environments.md)
    )
    target: Optional[str] = (
        None  # custom: "module:attribute", the environment's class or factory (called with settings)
    )
    max_turns: int = 3  # policy turns per episode at most; an environment that never says done ends there
    max_tokens: int = 40  # tokens after the prompt per episode at most, the policy's and the environment's
    reward: str = "sum"  # sum: the turns' rewards summed | last: the last turn's reward
    stop: Any = field(default_factory=list)  # strings a policy turn also ends at, kept in the turn (calc: </calc>)
    max_observation_tokens: int = 32  # a longer observation ends its episode (env/errors/huge_observation)
    settings: Any = field(default_factory=dict)  # keyword arguments of the environment's class


@dataclass
class EvalConfig:
    # when and in how big forwards: trainer.eval_every and trainer.eval_batch_size (kept there)
    samples: int = 0  # completions sampled per held-out prompt (n); 0: one greedy completion (eval/accuracy only)
    temperature: float = 1.0  # samples > 0: the eval sampler's temperature (>= 1e-6)
    top_p: float = 1.0  # samples > 0: the eval sampler's nucleus; 1: off
    max_new_tokens: Optional[int] = None  # tokens generated per eval completion at most; null: budget.max_new_tokens
    k: Any = (
        None  # samples > 0: the k of eval/pass@k, pass^k, maj@k (each in 1..samples); null: 1, 2, 4, ... <= samples
    )
    seed: int = 0  # seed of the eval's own streams, keyed by (seed, prompt): the same samples for every arm at a policy
    greedy: bool = False  # samples > 0: also decode greedily and log eval/accuracy (greedy) besides the samples


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
RATIOS = accepted.RATIO_LEVELS
AGGREGATIONS = accepted.AGGREGATIONS
KL_ESTIMATORS = accepted.KL_ESTIMATORS
KL_PLACEMENTS = accepted.KL_PLACEMENTS
MIXES = accepted.MIXES
MODEL_KINDS = ("tiny", "hf")
DTYPES = ("auto", "bfloat16", "float32", "float16")
DEVICES = ("auto", "cpu", "cuda")
LOGGERS = ("wandb", "none")
LOGGER_MODES = ("offline", "online", "disabled")
PROMPT_KINDS = ("arithmetic", "chain", "countdown", "file", "hf", "reasoning_gym")
KV_CACHES = ("auto", "dynamic")
# rlcompare.fast.ENGINES (tests/config/test_schema.py), and vllm: rlcompare.rollout.vllm_engine
ROLLOUT_ENGINES = ("auto", "eager", "graphs", "vllm")
STREAMS = ("batch", "group")
PARALLEL_MODES = ("auto", "none", "ddp", "fsdp")
UNHEALTHY = ("fail", "warn")  # trainer.unhealthy (docs/metrics.md, "Run health")
GRAD_SUMS = ("auto", "shared_memory", "backend")


MAX_TIMEOUT_S = 3600.0  # seconds per completion: an hour is already far past any verifier's need


def _one_of(key: str, value: Any, accepted) -> None:
    if value not in accepted:
        raise ConfigError(f"{key}={value!r} is not accepted; use one of: {', '.join(map(str, accepted))}")


def _at_least(key: str, value, low, fix: str = "") -> None:
    if value is None or value < low:
        raise ConfigError(f"{key}={value!r} must be >= {low}" + (f"; {fix}" if fix else ""))


def to_schema(cfg: DictConfig | dict) -> DictConfig:
    """Merge a composed config onto the schema: unknown keys and wrong types raise ConfigError."""
    schema = OmegaConf.structured(RunConfig)
    OmegaConf.set_struct(schema.verifier, False)  # a verifier's own settings: checked by _check_verifier
    user = cfg if isinstance(cfg, DictConfig) else OmegaConf.create(cfg)
    user = OmegaConf.masked_copy(user, [k for k in user.keys() if k != "hydra"]) if "hydra" in user else user
    user = _without_old_verifier_defaults(user)
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


# Verifier keys every config held before the verifiers declared their own settings (#54), with the defaults they
# held: a run folder's config.yaml from then still loads (and resumes) where its verifier does not take them.
OLD_VERIFIER_DEFAULTS = {
    "number": "first",
    "require_all": False,
    "pattern": None,
    "partial_credit": False,
    "components": None,
}


def with_missing_defaults(fa: dict, fb: dict, encode: Callable[[Any], Any] = lambda v: v) -> tuple[dict, dict]:
    """Two flat configs (dotted keys) where a key one lacks and the other holds is filled with what a config
    written without it held: the schema's default (a key is added with the default that keeps the rows as they
    were: `algorithm.module`, `verifier.module`, the `env` group), or for a verifier key a verifier no longer takes,
    its old default (OLD_VERIFIER_DEFAULTS). Run folders from before a key existed then compare with later ones
    (the report's config check, a sweep's --resume) on real differences only. `encode`: how the caller's flat
    values are written (the report JSON-encodes lists)."""
    defaults = _flat_defaults()
    fill_a = {k: encode(defaults[k]) for k in fb.keys() - fa.keys() if k in defaults}
    fill_b = {k: encode(defaults[k]) for k in fa.keys() - fb.keys() if k in defaults}
    return ({**fa, **fill_a} if fill_a else fa), ({**fb, **fill_b} if fill_b else fb)


# (registry state, defaults): a plug-in surrogate's knobs have defaults once it is registered
_FLAT_DEFAULTS: list = [None, {}]


def _flat_defaults() -> dict:
    key = surrogate_specs.registry_key()
    if _FLAT_DEFAULTS[0] != key:
        flat = flatten(OmegaConf.to_container(OmegaConf.structured(RunConfig), resolve=False))
        flat.update({f"verifier.{k}": v for k, v in OLD_VERIFIER_DEFAULTS.items()})
        _FLAT_DEFAULTS[:] = [key, flat]
    return _FLAT_DEFAULTS[1]


def _without_old_verifier_defaults(user: DictConfig) -> DictConfig:
    v = user.get("verifier") if isinstance(user, DictConfig) else None
    if not isinstance(v, DictConfig):
        return user
    stale = [k for k, d in OLD_VERIFIER_DEFAULTS.items() if k in v and _value(v, k) == d]
    if not stale:
        return user
    from rlcompare.rewards import registry

    registry.names()  # the built-ins registered (a verifier.module's is not imported here: dropping is neutral)
    s = registry.REGISTRY.get(_value(v, "name"))
    try:
        d = OmegaConf.to_container(v, resolve=True)
    except Exception:  # noqa: BLE001 - an interpolation into the rest of the config: weighted's components unread
        d = {}
    stale = [k for k in stale if s is None or k not in registry.accepted_keys(s, d)]
    if not stale:
        return user
    user = user.copy()
    user.verifier = OmegaConf.masked_copy(v, [k for k in v.keys() if k not in stale])
    return user


def _value(node: DictConfig, key: str) -> Any:
    try:
        return node[key]
    except Exception:  # noqa: BLE001 - an interpolation that cannot resolve here: not a stale default
        return object()


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
    _check_algorithm(c)
    _check_trainer(c)
    _one_of("trainer.unhealthy", c.trainer.unhealthy, UNHEALTHY)
    _check_eval(c)
    _check_env(c)
    _check_vllm(c)
    _check_budget(c)
    _check_model(c)
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


def _check_algorithm(c: DictConfig) -> None:
    """The algorithm's names, ranges and combinations."""
    a, t, b = c.algorithm, c.trainer, c.budget
    _one_of("algorithm.ratio", a.ratio, RATIOS)
    _one_of("algorithm.aggregation", a.aggregation, AGGREGATIONS)
    spec, _ = _estimator(a)
    _one_of(f"algorithm.advantage.scale (estimator={spec.name})", a.advantage.scale, spec.scales)
    _one_of("algorithm.advantage.std_ddof", a.advantage.std_ddof, (0, 1))
    if a.advantage.eps < 0:
        raise ConfigError(f"algorithm.advantage.eps={a.advantage.eps} must be >= 0 (it keeps the std division finite)")
    _one_of("algorithm.kl.estimator", a.kl.estimator, KL_ESTIMATORS)
    _one_of("algorithm.kl.placement", a.kl.placement, KL_PLACEMENTS)
    for k in ("eps_low", "eps_high"):
        _at_least(f"algorithm.clip.{k}", a.clip[k], 0, "a clipping range cannot be negative")
    if a.clip.dual_clip is not None and a.clip.dual_clip <= 1:
        raise ConfigError(
            f"algorithm.clip.dual_clip={a.clip.dual_clip} must be > 1 (verl uses 3, DAPO scripts 10), or null to turn it off"
        )
    if a.ratio == "hybrid":
        for k in ("seq_eps_low", "seq_eps_high"):
            if a.clip[k] is None:
                raise ConfigError(
                    f"algorithm.clip.{k} is required with algorithm.ratio=hybrid (the sequence branch's range, e.g. 3e-4 / 4e-4)"
                )
            _at_least(f"algorithm.clip.{k}", a.clip[k], 0, "a clipping range cannot be negative")
    elif a.clip.mix == "entropy":
        raise ConfigError(
            "algorithm.clip.mix=entropy only applies to algorithm.ratio=hybrid, where it weighs token vs sequence ratios; set algorithm.clip.mix=mean"
        )
    if a.aggregation == "seq-mean-token-sum-norm" and (a.horizon is None or a.horizon <= 0):
        raise ConfigError(
            "algorithm.aggregation=seq-mean-token-sum-norm needs algorithm.horizon > 0 (Dr. GRPO's constant H, usually budget.max_new_tokens); set algorithm.horizon=${budget.max_new_tokens}"
        )
    if a.kl.coef < 0:
        raise ConfigError(f"algorithm.kl.coef={a.kl.coef} must be >= 0 (0 turns KL off and loads no reference model)")
    _at_least("algorithm.dynamic_sampling.max_rounds", a.dynamic_sampling.max_rounds, 0)
    if spec.needs.critic:
        for k in ("gamma", "lam"):
            if not 0 <= a.critic[k] <= 1:
                raise ConfigError(f"algorithm.critic.{k}={a.critic[k]} must be in [0, 1]")
        if a.critic.lr <= 0:
            raise ConfigError(f"algorithm.critic.lr={a.critic.lr} must be > 0")
        _at_least("algorithm.critic.coef", a.critic.coef, 0)
        if a.critic.value_clip is not None and a.critic.value_clip <= 0:
            raise ConfigError(
                f"algorithm.critic.value_clip={a.critic.value_clip} must be > 0, or null to turn value clipping off"
            )
    _check_variants(a, t)
    _check_off_policy(a, t)
    _check_distill(c)
    if a.overlong.soft_punishment:
        _at_least("algorithm.overlong.cache_len", a.overlong.cache_len, 1)
        if a.overlong.cache_len >= b.max_new_tokens:
            raise ConfigError(
                f"algorithm.overlong.cache_len={a.overlong.cache_len} must be < budget.max_new_tokens={b.max_new_tokens}"
            )


def _estimator(a: DictConfig) -> tuple:
    """The advantage estimator's spec and its settings, checked (algos/estimator_specs.py): a ConfigError naming
    algorithm.advantage.<key> and the fix."""
    _one_of("algorithm.advantage.estimator", a.advantage.estimator, tuple(estimator_specs.SPECS))
    spec = estimator_specs.SPECS[a.advantage.estimator]
    try:
        settings = spec.build(a.advantage)
        settings.check()
    except ValueError as e:
        raise ConfigError(f"{e} (algorithm.advantage.estimator={spec.name})") from None
    return spec, settings


def _check_distill(c: DictConfig) -> None:
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
    if not _estimator(a)[0].needs.reward_kl and a.kl.coef > 0 and a.kl.placement == "in_reward":
        raise ConfigError(
            f"algorithm.kl.placement=in_reward with algorithm.advantage.estimator={a.advantage.estimator}: it takes "
            "no KL in the reward (distill: its term already is a per-token KL, to the teacher); set "
            "algorithm.kl.placement=in_loss or algorithm.kl.coef=0"
        )


def _check_off_policy(a: DictConfig, t: DictConfig) -> None:
    """The corrections for stale rollouts (issue 44): their knobs, and the proximal policy they compare."""
    op = a.off_policy
    try:  # the messages start with the knob's name: shown as key=value, as every range check
        accepted.check_off_policy_knobs(dict(op))
    except ValueError as e:
        knob, rest = str(e).split(" ", 1)
        raise ConfigError(f"algorithm.off_policy.{knob}={op[knob]!r} {rest}") from None
    if op.correction is None:
        return
    if not t.recompute_old_logp:
        raise ConfigError(
            f"algorithm.off_policy.correction={op.correction} compares the proximal policy (the old log-probs "
            "recomputed with the current weights) with the sampler's; set trainer.recompute_old_logp=true "
            "(or algorithm.off_policy.correction=null)"
        )
    if op.correction == "decoupled" and a.mismatch.mode is not None:
        raise ConfigError(
            f"algorithm.off_policy.correction=decoupled already weighs every token by pi_prox/pi_behav, as "
            f"algorithm.mismatch.mode={a.mismatch.mode} does: set algorithm.mismatch.mode=null (decoupled_cap "
            "and decoupled_cap_mode give its cap)"
        )


def _check_trainer(c: DictConfig) -> None:
    """The trainer's and the sampler's settings."""
    a, t = c.algorithm, c.trainer
    _at_least("trainer.prompts_per_step", t.prompts_per_step, 1)
    _at_least("trainer.group_size", t.group_size, 1)
    spec, settings = _estimator(a)
    if t.group_size < 2 and spec.uses_groups(settings):
        raise ConfigError(
            f"trainer.group_size={t.group_size} with algorithm.advantage.estimator={a.advantage.estimator}: group advantages compare completions of one prompt, so they need trainer.group_size >= 2 (or use algorithm=ppo)"
        )
    _at_least("trainer.updates_per_rollout", t.updates_per_rollout, 1)
    n_seqs = t.prompts_per_step * t.group_size
    if t.updates_per_rollout > n_seqs:
        raise ConfigError(
            f"trainer.updates_per_rollout={t.updates_per_rollout} exceeds the rollout batch of {n_seqs} completions; each update needs at least one"
        )
    if t.lr <= 0:
        raise ConfigError(f"trainer.lr={t.lr} must be > 0")
    if t.micro_batch_size is not None:
        _at_least("trainer.micro_batch_size", t.micro_batch_size, 1)
    _at_least("trainer.eval_every", t.eval_every, 1)
    _at_least("trainer.max_bad_steps", t.max_bad_steps, 1)
    _at_least("trainer.keep_checkpoints", t.keep_checkpoints, 1)
    if t.checkpoint_every is not None:
        _at_least("trainer.checkpoint_every", t.checkpoint_every, 0, "0 turns checkpoints off, null saves at each eval")
    _at_least("trainer.eval_batch_size", t.eval_batch_size, 1)
    _at_least("trainer.n_samples_logged", t.n_samples_logged, 0, "0 logs no sample completions")
    _at_least("trainer.sample_max_chars", t.sample_max_chars, 1)
    _at_least("trainer.warmup_steps", t.warmup_steps, 0)
    _at_least("trainer.weight_decay", t.weight_decay, 0)
    if t.max_grad_norm is not None and t.max_grad_norm <= 0:
        raise ConfigError(f"trainer.max_grad_norm={t.max_grad_norm} must be > 0, or null to turn clipping off")
    betas = list(t.betas) if not isinstance(t.betas, (int, float, str)) else None
    if betas is None or len(betas) != 2 or not all(isinstance(x, (int, float)) and 0 <= x < 1 for x in betas):
        raise ConfigError(f"trainer.betas={t.betas!r} must be two numbers in [0, 1), e.g. [0.9, 0.99]")
    if t.threads is not None:
        _at_least("trainer.threads", t.threads, 1, "null uses torch's default")
    if t.inject_nan_at_step is not None:
        _at_least("trainer.inject_nan_at_step", t.inject_nan_at_step, 1, "a testing hook: null turns it off")
    if c.rollout.temperature <= 0:
        raise ConfigError(
            f"rollout.temperature={c.rollout.temperature} must be > 0 (sampling needs a positive temperature)"
        )
    if not 0 < c.rollout.top_p <= 1:
        raise ConfigError(f"rollout.top_p={c.rollout.top_p} must be in (0, 1]")
    _at_least("rollout.staleness", c.rollout.staleness, 0, "0 trains on-policy; k trains on rollouts k updates old")
    # the first step samples k + 1 rollouts: 10**6 sampled for hours, and SIGTERM waits for that step to end
    if c.rollout.staleness > MAX_STALENESS:
        raise ConfigError(
            f"rollout.staleness={c.rollout.staleness} must be <= {MAX_STALENESS} (the first step samples k + 1 "
            f"rollouts ahead and keeps them in memory and in every checkpoint); lower it"
        )
    if t.parallel not in PARALLEL_MODES:
        raise ConfigError(
            f"trainer.parallel={t.parallel!r} must be auto (ddp when launched by torchrun), none, ddp, or "
            f"fsdp (ddp with the policy's training state sharded over the ranks; docs/scaling.md)"
        )
    if t.grad_sum not in GRAD_SUMS:
        raise ConfigError(
            f"trainer.grad_sum={t.grad_sum!r} must be auto (shared memory when every rank is a CPU process on this "
            f"machine, else the backend), shared_memory, or backend (gloo or NCCL's all-reduce)"
        )
    if c.rollout.streams not in STREAMS:
        raise ConfigError(
            f"rollout.streams={c.rollout.streams!r} must be batch (one random stream for the batch) or "
            f"group (one per prompt group, as data-parallel runs need)"
        )
    if c.rollout.engine not in ROLLOUT_ENGINES:
        raise ConfigError(
            f"rollout.engine={c.rollout.engine!r} must be auto (graphs on CUDA, eager on the CPU), eager (one decode "
            f"step at a time), graphs (CUDA-graph decode steps; docs/speed.md) or vllm (colocated vLLM; docs/vllm.md)"
        )
    _at_least("rollout.sync_every", c.rollout.sync_every, 1)
    if c.rollout.kv_cache not in KV_CACHES:
        raise ConfigError(
            f"rollout.kv_cache={c.rollout.kv_cache!r} must be auto (a preallocated cache where the "
            f"architecture allows) or dynamic (transformers' cache)"
        )


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


MAX_EVAL_SAMPLES = MAX_SAMPLES  # completions per held-out prompt (rlcompare.passk: the counts reader's bound too)


def _check_eval(c: DictConfig) -> None:
    """The eval group (issue 50): greedy (samples=0) or n samples per held-out prompt, and the k reported."""
    e = c.eval
    _at_least("eval.samples", e.samples, 0, "0 decodes one greedy completion per prompt")
    if e.samples > MAX_EVAL_SAMPLES:
        raise ConfigError(f"eval.samples={e.samples} must be <= {MAX_EVAL_SAMPLES} (completions per held-out prompt)")
    if e.max_new_tokens is not None:
        _at_least("eval.max_new_tokens", e.max_new_tokens, 1, "null uses budget.max_new_tokens")
    if e.samples == 0:
        if e.k is not None:
            raise ConfigError(
                f"eval.k={e.k!r} applies to sampled evaluation only; set eval.samples (e.g. 16) or eval.k=null"
            )
        return
    if e.temperature < 1e-6:
        raise ConfigError(f"eval.temperature={e.temperature} must be >= 1e-6 (sampling needs a positive temperature)")
    if not 0 < e.top_p <= 1:
        raise ConfigError(f"eval.top_p={e.top_p} must be in (0, 1]")
    if e.k is None:
        return
    ks = None if isinstance(e.k, (str, bytes, float, bool)) else ([e.k] if isinstance(e.k, int) else list(e.k))
    if not ks or not all(isinstance(k, int) and not isinstance(k, bool) and 1 <= k <= e.samples for k in ks):
        raise ConfigError(
            f"eval.k={e.k!r} must be a list of integers in 1..eval.samples={e.samples} (e.g. [1, 4, 16]), "
            f"or null for the powers of two up to eval.samples"
        )


# none, the built-ins of rlcompare/envs/builtin.py (its _CLASSES; config may not import envs), custom: checked
# against both and conf/env/ by tests/envs/test_env_names.py
ENV_NAMES = ("none", "feedback", "calc", "custom")
ENV_REWARDS = ("sum", "last")


def _check_env(c: DictConfig) -> None:
    """The env group (issue 51): a known environment with settings a multi-turn rollout can run."""
    e = c.env
    _one_of("env.name", e.name, ENV_NAMES)
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
    if e.name == "custom":
        if not isinstance(e.target, str) or ":" not in e.target:
            raise ConfigError(
                f"env.target={e.target!r}: env.name=custom needs env.target='module:attribute' (the environment's class)"
            )
        _check_env_target(e.target, e.settings)
    elif e.target is not None:
        raise ConfigError(f"env.target={e.target!r} applies to env.name=custom only; set env.target=null")
    if not _estimator(c.algorithm)[0].needs.multi_turn:
        raise ConfigError(
            f"env.name is not supported with the {c.algorithm.advantage.estimator} estimator (distill: the teacher "
            "would score the environment's tokens); set env=none"
        )


def _check_env_target(target: str, settings: Any) -> None:
    """The target loads and is callable; a target with a `check(settings)` (the verifiers adapter's) refuses bad
    `env.settings` here, before anything heavy, instead of in every episode's worker."""
    import importlib

    module, _, attr = target.partition(":")
    try:
        obj = importlib.import_module(module)
        for part in attr.split("."):
            obj = getattr(obj, part)
    except Exception as err:
        raise ConfigError(
            f"env.target={target!r} cannot be loaded ({type(err).__name__}: {err}); give an importable "
            f"'module:attribute' (the module on PYTHONPATH)"
        ) from None
    if not callable(obj):
        raise ConfigError(f"env.target={target!r} is not callable; name the environment's class or factory")
    check = getattr(obj, "check", None)
    if callable(check):
        plain = OmegaConf.to_container(settings) if OmegaConf.is_config(settings) else dict(settings or {})
        try:
            check(plain)
        except ValueError as err:  # the target's own one-line message names the env.settings key
            raise ConfigError(str(err).splitlines()[0]) from None


def eval_ks(e) -> list[int]:
    """The k reported for the eval settings `e` (eval.k sorted, or the powers of two up to eval.samples)."""
    if e.samples == 0:
        return []
    if e.k is None:
        ks, k = [], 1
        while k <= e.samples:
            ks.append(k)
            k *= 2
        return ks
    return sorted({int(k) for k in ([e.k] if isinstance(e.k, int) else e.k)})


MAX_STALENESS = 256  # the largest staleness M2PO (arXiv 2510.01161) trains at; the first step samples k + 1 rollouts


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


def _check_model(c: DictConfig) -> None:
    """Every numeric range, then the model: its kind, dtype and (tiny) shape, within its context."""
    b = c.budget
    _check_ranges(c)  # every numeric key the checks above did not cover (the model's sizes divide below)
    _one_of("model.kind", c.model.kind, MODEL_KINDS)
    _one_of("model.dtype", c.model.dtype, DTYPES)
    if c.model.kind == "hf" and not c.model.name_or_path:
        raise ConfigError("model.kind=hf needs model.name_or_path (a hub id or a local folder)")
    if c.model.kind == "tiny":
        check_fits_context(
            b,
            c.model.max_position_embeddings,
            f"model.max_position_embeddings={c.model.max_position_embeddings}",
            "lower the budget or raise the context",
        )
        check_eval_fits_context(
            c, c.model.max_position_embeddings, f"model.max_position_embeddings={c.model.max_position_embeddings}"
        )
        if c.model.hidden_size % c.model.num_heads:
            raise ConfigError(
                f"model.hidden_size={c.model.hidden_size} must be divisible by model.num_heads={c.model.num_heads}"
            )
        if (c.model.hidden_size // c.model.num_heads) % 2:  # RoPE rotates pairs of dimensions of every head
            raise ConfigError(
                f"model.hidden_size={c.model.hidden_size} / model.num_heads={c.model.num_heads} = "
                f"{c.model.hidden_size // c.model.num_heads} dimensions per head must be even (rotary "
                f"embeddings rotate pairs); e.g. model.hidden_size=128 model.num_heads=4"
            )
        _check_warm_start(c.model.warm_start)
        _at_least("model.num_layers", c.model.num_layers, 1)


def _check_inputs_and_places(c: DictConfig) -> None:
    """Prompts, verifier, resume, logger, and the folders the run writes."""
    _one_of("prompts.kind", c.prompts.kind, PROMPT_KINDS)
    _at_least("prompts.n_eval", c.prompts.n_eval, 1)
    if c.prompts.n_train is not None:
        _at_least("prompts.n_train", c.prompts.n_train, 0)
    if c.prompts.kind == "file" and not c.prompts.path:
        raise ConfigError("prompts.kind=file needs prompts.path (a .jsonl, .json, .csv or .parquet file)")
    if c.prompts.kind == "hf" and not c.prompts.hf_id:
        raise ConfigError("prompts.kind=hf needs prompts.hf_id (a dataset id on the Hugging Face hub)")
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
    if c.prompts.kind == "arithmetic":
        _check_arithmetic_template(c.prompts.template)
    _check_generated_size(c.prompts)
    _check_folder_name("experiment", c.experiment)
    if c.run_name is not None:
        _check_folder_name("run_name", c.run_name)
    _check_results_dir(c.results_dir)
    if c.model.cache_dir is not None:
        check_creatable("model.cache_dir", c.model.cache_dir)


# model config.json keys that give the context length (positions), in the order architectures use them
CONTEXT_KEYS = ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length", "n_ctx", "max_seq_len")


def context_from(d: dict) -> int | None:
    """The context length a model's config (config.json as a dict; a multimodal one's text part) gives, or None."""
    for k in CONTEXT_KEYS:
        v = d.get(k)
        if isinstance(v, int) and v > 0:
            return v
    for sub in ("text_config", "llm_config", "language_config"):
        if isinstance(d.get(sub), dict):
            v = context_from(d[sub])
            if v:
                return v
    return None


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


def _check_arithmetic_template(template: str) -> None:
    """The embedded arithmetic set formats its template with str.format: it must hold {question} and no other field."""
    try:
        ok = "{question}" in template and template.format(question="") is not None
    except (KeyError, IndexError, ValueError):
        ok = False
    if not ok:
        raise ConfigError(
            f"prompts.template={template!r} does not work with prompts.kind=arithmetic: it needs a string "
            f"holding {{question}} and no other {{...}} field (doubled braces {{{{ }}}} stay literal); "
            f"e.g. prompts.template='{{question}}'"
        )


# Examples a generated prompt set may hold, each side: a few seconds to build on 2 cores (10^8 arithmetic examples
# filled the memory; 10^6 Countdown puzzles took over a minute, built again by the job).
MAX_GENERATED = {"arithmetic": 1_000_000, "chain": 1_000_000, "countdown": 100_000, "reasoning_gym": 100_000}
MAX_OPERAND = 999  # arithmetic: (max_operand + 1)^2 pairs are built, a million at 999


def _check_generated_size(p) -> None:
    """Generated sets (arithmetic, countdown without a file) are built in memory before training: bounded sizes."""
    generated = p.kind in ("arithmetic", "chain", "reasoning_gym") or (p.kind == "countdown" and not p.path)
    if not generated:
        return
    for key in ("n_train", "n_eval"):
        if (p[key] or 0) > MAX_GENERATED[p.kind]:
            raise ConfigError(
                f"prompts.{key}={p[key]} must be <= {MAX_GENERATED[p.kind]} for a generated prompt set "
                f"(prompts.kind={p.kind}); the set is built in memory before training"
            )
    if p.kind == "arithmetic" and p.max_operand > MAX_OPERAND:
        raise ConfigError(
            f"prompts.max_operand={p.max_operand} must be <= {MAX_OPERAND}: every pair a+b is built in "
            f"memory ({MAX_OPERAND + 1}^2 = {(MAX_OPERAND + 1) ** 2} pairs at most)"
        )


def _check_warm_start(ws) -> None:
    """The tiny model's supervised warm start draws noisy labels from `noise_offsets` (integers added to answers)."""
    offsets = ws.noise_offsets
    seq = None if isinstance(offsets, (str, bytes, int, float)) else list(offsets)
    ints = seq is not None and all(isinstance(x, int) and not isinstance(x, bool) for x in seq)
    if not ints or (ws.noisy_label_frac > 0 and not seq):
        raise ConfigError(
            f"model.warm_start.noise_offsets={offsets!r} must be a list of integers (how far noisy labels "
            f"are off), non-empty while model.warm_start.noisy_label_frac > 0; e.g. [1, 2]"
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
        tp = _section(_unwrap_optional(hints[f.name]))
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


@dataclass(frozen=True)
class Range:
    low: float
    high: float = math.inf
    low_open: bool = False  # low itself is refused
    high_open: bool = False

    def holds(self, v) -> bool:
        above = v > self.low if self.low_open else v >= self.low
        below = v < self.high if self.high_open else v <= self.high
        return above and below

    def __str__(self) -> str:
        if self.high == math.inf:
            return f"{'>' if self.low_open else '>='} {_num(self.low)}"
        return f"in {'(' if self.low_open else '['}{_num(self.low)}, {_num(self.high)}{')' if self.high_open else ']'}"


def _num(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else str(x)


# Weight files that unpickle on load (can run code): never loaded (rlcompare.models.load, rlcompare.train.model_folder)
PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".pkl", ".pickle", ".ckpt")
# Seeds (seed, prompts.data_seed, model.warm_start.seed, a sweep's seeds) are 0..SEED_MAX: torch and numpy keep 32
# bits of a seed (seed 2^32 ran as seed 0, so a sweep counted one run twice), and a run also seeds with seed + 1
SEED_MAX = 2**31 - 1
SEED = Range(0, SEED_MAX)
MAX_LR = 1.0  # an AdamW step larger than the weights themselves: past it a run only diverges
MAX_KL_COEF = 1e3  # a KL penalty that large leaves no reward signal (and overflows into skipped updates)
NON_NEGATIVE = Range(0)  # every numeric key not in RANGES: counts, sizes, coefficients, seeds (a negative seed
# collides with its absolute value in Python's random.Random)
AT_LEAST_ONE = Range(1)
POSITIVE = Range(0, low_open=True)
PROBABILITY = Range(0, 1)
FRACTION = Range(0, 1, high_open=True)

# Keys whose accepted range is narrower than NON_NEGATIVE. Optional keys are checked when set.
RANGES: dict[str, Range] = {
    "algorithm.horizon": AT_LEAST_ONE,
    "algorithm.clip.dual_clip": Range(1, low_open=True),
    "algorithm.critic.gamma": PROBABILITY,
    "algorithm.critic.lam": PROBABILITY,
    "algorithm.critic.value_clip": POSITIVE,
    "algorithm.critic.lr": Range(0, MAX_LR, low_open=True),
    "algorithm.kl.coef": Range(0, MAX_KL_COEF),
    "algorithm.off_policy.decoupled_cap": POSITIVE,
    "algorithm.off_policy.m2po_threshold": POSITIVE,
    "algorithm.off_policy.geo_delta": Range(0, 1, low_open=True, high_open=True),
    "seed": SEED,
    "prompts.data_seed": SEED,
    "model.warm_start.seed": SEED,
    "model.hidden_size": AT_LEAST_ONE,
    "model.num_layers": AT_LEAST_ONE,
    "model.num_heads": AT_LEAST_ONE,
    "model.intermediate_size": AT_LEAST_ONE,
    "model.max_position_embeddings": AT_LEAST_ONE,
    "model.lora.r": AT_LEAST_ONE,
    "model.lora.alpha": AT_LEAST_ONE,
    "model.lora.dropout": FRACTION,
    "model.warm_start.steps": AT_LEAST_ONE,  # the schedule divides by it; a start from scratch solves nothing
    "model.warm_start.batch_size": AT_LEAST_ONE,
    "model.warm_start.lr": Range(0, MAX_LR, low_open=True),
    "model.warm_start.noisy_label_frac": PROBABILITY,
    "prompts.n_eval": AT_LEAST_ONE,
    "prompts.eval_fraction": FRACTION,
    "prompts.min_numbers": Range(2),
    "prompts.max_numbers": Range(2),
    "prompts.max_number": AT_LEAST_ONE,
    "prompts.max_target": AT_LEAST_ONE,
    "verifier.timeout_s": POSITIVE,  # and at most MAX_TIMEOUT_S
    "verifier.max_chars": AT_LEAST_ONE,
    "verifier.workers": AT_LEAST_ONE,
    "budget.max_new_tokens": AT_LEAST_ONE,
    "budget.max_prompt_tokens": AT_LEAST_ONE,
    "budget.total_tokens": AT_LEAST_ONE,
    "budget.max_steps": AT_LEAST_ONE,
    "trainer.prompts_per_step": AT_LEAST_ONE,
    "trainer.group_size": AT_LEAST_ONE,
    "trainer.lr": Range(0, MAX_LR, low_open=True),
    "trainer.max_grad_norm": POSITIVE,
    "trainer.updates_per_rollout": AT_LEAST_ONE,
    "trainer.micro_batch_size": AT_LEAST_ONE,
    "trainer.eval_every": AT_LEAST_ONE,
    "trainer.eval_batch_size": AT_LEAST_ONE,
    "trainer.sample_max_chars": AT_LEAST_ONE,
    "trainer.keep_checkpoints": AT_LEAST_ONE,
    "trainer.max_bad_steps": AT_LEAST_ONE,
    "trainer.threads": AT_LEAST_ONE,
    "trainer.inject_nan_at_step": AT_LEAST_ONE,
    "rollout.temperature": Range(1e-6),  # float32 logits / 1e-320 are inf (the scalar rounds to 0): nan log-probs
    "rollout.top_p": Range(0, 1, low_open=True),
    "algorithm.advantage.distill_discount": Range(0, 1),
    "eval.temperature": Range(1e-6),
    "eval.top_p": Range(0, 1, low_open=True),
    "eval.max_new_tokens": AT_LEAST_ONE,
    "eval.seed": SEED,
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


def _check_variants(a: DictConfig, t: DictConfig) -> None:
    """The knobs of issue 19: surrogate, REINFORCE++, rollout-mismatch correction, top-entropy mask."""
    try:
        _one_of("algorithm.surrogate", a.surrogate, tuple(surrogate_specs.SPECS))
    except ConfigError as e:  # not built in, and no algorithm.module registered it
        raise ConfigError(
            f"{e}; or a surrogate of your own: algorithm.module=<the module that registers {a.surrogate!r}> "
            f"(docs/api.md)"
        ) from None
    spec = surrogate_specs.SPECS[a.surrogate]
    ratios = spec.ratio_levels
    if a.ratio not in ratios:
        raise ConfigError(
            f"algorithm.ratio={a.ratio} does not go with algorithm.surrogate={a.surrogate}; "
            f"use one of: {', '.join(ratios)} (or algorithm.surrogate=clip)"
        )
    if a.clip.dual_clip is not None and a.surrogate != "clip":
        raise ConfigError(
            f"algorithm.clip.dual_clip={a.clip.dual_clip} applies to algorithm.surrogate=clip only; "
            f"set algorithm.clip.dual_clip=null with algorithm.surrogate={a.surrogate}"
        )
    try:  # the surrogate's own knobs, by its spec: the messages name algorithm.clip.<knob> and the fix
        spec.build(dict(a.clip)).check()
    except ValueError as e:
        raise ConfigError(f"{e} (algorithm.surrogate={a.surrogate})") from None
    mm = a.mismatch
    if mm.mode is not None:
        if mm.mode not in accepted.MISMATCH_MODES:
            raise ConfigError(
                f"algorithm.mismatch.mode={mm.mode!r} is not accepted; use one of: "
                f"{', '.join(accepted.MISMATCH_MODES)}, or null (off)"
            )
        if not t.recompute_old_logp:
            raise ConfigError(
                f"algorithm.mismatch.mode={mm.mode} corrects recomputed old log-probs against the "
                "sampler's; set trainer.recompute_old_logp=true (or algorithm.mismatch.mode=null)"
            )
        try:
            accepted.check_mismatch_bounds(mm.mode, mm.c_min, mm.c_max)
        except ValueError as e:
            raise ConfigError(f"algorithm.mismatch.{e} (algorithm.mismatch.mode={mm.mode})") from None
    q = a.top_entropy_quantile
    if q is not None and not 0 <= q <= 1:
        raise ConfigError(
            f"algorithm.top_entropy_quantile={q} must be in [0, 1] (the share of highest-entropy "
            "tokens trained on; 0.2 in arXiv 2506.01939), or null to turn it off"
        )


# the advantage estimators' names and scales are derived from their specs (accepted.py): read on access, so that an
# estimator a plug-in registers after this module was imported is named here too (a copy taken at import would drift)
_DERIVED = {"ESTIMATORS": "ADVANTAGE_ESTIMATORS", "SCALES": "ESTIMATOR_SCALES"}


def __getattr__(name: str):
    if name in _DERIVED:
        return getattr(accepted, _DERIVED[name])
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
