"""`algorithm.*`: what the loss computes (advantages, ratios, clipping, KL, entropy, the corrections for mismatched
and stale rollouts, the critic) and its checks. The names it accepts come from the math layer (algos/accepted.py);
`algorithm.clip`'s keys and `algorithm.advantage`'s knobs from the surrogates' and estimators' specs.

What the algorithm needs of the rest of the run (recomputed log-probs, a teacher, groups, a budget longer than the
overlong window) is checked by rlcompare/config/schema.py, which sees every section.
"""

from __future__ import annotations

from dataclasses import dataclass, field, make_dataclass
from typing import Any, Optional, get_type_hints

from omegaconf import DictConfig

from rlcompare.algos import accepted  # the math layer's accepted names, torch-free (losses/advantages re-export them)
from rlcompare.algos import surrogate_specs  # one declaration per surrogate: algorithm.clip's knobs
from rlcompare.algos import estimator_specs  # one declaration per advantage estimator: its knobs and needs
from rlcompare.config.checks import AT_LEAST_ONE, MAX_LR, POSITIVE, PROBABILITY, ConfigError, Range, at_least, one_of

RATIOS = accepted.RATIO_LEVELS
AGGREGATIONS = accepted.AGGREGATIONS
KL_ESTIMATORS = accepted.KL_ESTIMATORS
KL_PLACEMENTS = accepted.KL_PLACEMENTS
MIXES = accepted.MIXES
MAX_KL_COEF = 1e3  # a KL penalty that large leaves no reward signal (and overflows into skipped updates)


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


def section_type(tp: type) -> type:
    """The dataclass that stands for a schema section: algorithm.clip's derived one for ClipConfig (the schema's
    walks, numeric_keys and config/doc.py, go through it)."""
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


# Keys whose accepted range is narrower than NON_NEGATIVE (schema.py's RANGES holds every section's). Optional keys
# are checked when set.
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
    "algorithm.advantage.distill_discount": Range(0, 1),
}


def check(a: DictConfig) -> None:
    """The algorithm's names, ranges and combinations."""
    one_of("algorithm.ratio", a.ratio, RATIOS)
    one_of("algorithm.aggregation", a.aggregation, AGGREGATIONS)
    spec, _ = estimator(a)
    one_of(f"algorithm.advantage.scale (estimator={spec.name})", a.advantage.scale, spec.scales)
    one_of("algorithm.advantage.std_ddof", a.advantage.std_ddof, (0, 1))
    if a.advantage.eps < 0:
        raise ConfigError(f"algorithm.advantage.eps={a.advantage.eps} must be >= 0 (it keeps the std division finite)")
    one_of("algorithm.kl.estimator", a.kl.estimator, KL_ESTIMATORS)
    one_of("algorithm.kl.placement", a.kl.placement, KL_PLACEMENTS)
    for k in ("eps_low", "eps_high"):
        at_least(f"algorithm.clip.{k}", a.clip[k], 0, "a clipping range cannot be negative")
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
            at_least(f"algorithm.clip.{k}", a.clip[k], 0, "a clipping range cannot be negative")
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
    at_least("algorithm.dynamic_sampling.max_rounds", a.dynamic_sampling.max_rounds, 0)
    if spec.needs.critic:
        for k in ("gamma", "lam"):
            if not 0 <= a.critic[k] <= 1:
                raise ConfigError(f"algorithm.critic.{k}={a.critic[k]} must be in [0, 1]")
        if a.critic.lr <= 0:
            raise ConfigError(f"algorithm.critic.lr={a.critic.lr} must be > 0")
        at_least("algorithm.critic.coef", a.critic.coef, 0)
        if a.critic.value_clip is not None and a.critic.value_clip <= 0:
            raise ConfigError(
                f"algorithm.critic.value_clip={a.critic.value_clip} must be > 0, or null to turn value clipping off"
            )
    _check_variants(a)
    _check_off_policy(a)
    if not estimator(a)[0].needs.reward_kl and a.kl.coef > 0 and a.kl.placement == "in_reward":
        raise ConfigError(
            f"algorithm.kl.placement=in_reward with algorithm.advantage.estimator={a.advantage.estimator}: it takes "
            "no KL in the reward (distill: its term already is a per-token KL, to the teacher); set "
            "algorithm.kl.placement=in_loss or algorithm.kl.coef=0"
        )
    if a.overlong.soft_punishment:
        at_least("algorithm.overlong.cache_len", a.overlong.cache_len, 1)


def estimator(a: DictConfig) -> tuple:
    """The advantage estimator's spec and its settings, checked (algos/estimator_specs.py): a ConfigError naming
    algorithm.advantage.<key> and the fix."""
    one_of("algorithm.advantage.estimator", a.advantage.estimator, tuple(estimator_specs.SPECS))
    spec = estimator_specs.SPECS[a.advantage.estimator]
    try:
        settings = spec.build(a.advantage)
        settings.check()
    except ValueError as e:
        raise ConfigError(f"{e} (algorithm.advantage.estimator={spec.name})") from None
    return spec, settings


def estimator_needs(algorithm: Any) -> Optional[dict]:
    """What run health asks of a run's advantage estimator (`rlcompare.health.Context`), from its spec: whether it
    reads a teacher, and whether it compares the completions of one prompt with these settings (`uses_groups`).
    `algorithm`: the config's section (a DictConfig or config.yaml's dict). None for an estimator this process
    has not registered (a plug-in's, in a report): health then takes a group estimator's defaults."""
    advantage = (algorithm or {}).get("advantage") or {}
    spec = estimator_specs.SPECS.get(str(advantage.get("estimator", "group")))
    if spec is None:
        return None
    try:
        groups = spec.uses_groups(spec.build(advantage))
    except (TypeError, ValueError):  # a malformed config.yaml: the declaration's own default
        groups = spec.needs.groups
    return {"teacher": spec.needs.teacher, "groups": groups}


def _check_off_policy(a: DictConfig) -> None:
    """The corrections for stale rollouts (issue 44): their knobs (the recomputed log-probs they need: schema.py)."""
    op = a.off_policy
    try:  # the messages start with the knob's name: shown as key=value, as every range check
        accepted.check_off_policy_knobs(dict(op))
    except ValueError as e:
        knob, rest = str(e).split(" ", 1)
        raise ConfigError(f"algorithm.off_policy.{knob}={op[knob]!r} {rest}") from None
    if op.correction == "decoupled" and a.mismatch.mode is not None:
        raise ConfigError(
            f"algorithm.off_policy.correction=decoupled already weighs every token by pi_prox/pi_behav, as "
            f"algorithm.mismatch.mode={a.mismatch.mode} does: set algorithm.mismatch.mode=null (decoupled_cap "
            "and decoupled_cap_mode give its cap)"
        )


def _check_variants(a: DictConfig) -> None:
    """The knobs of issue 19: surrogate, REINFORCE++, rollout-mismatch correction, top-entropy mask."""
    try:
        one_of("algorithm.surrogate", a.surrogate, tuple(surrogate_specs.SPECS))
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
