"""One declaration per surrogate, torch-free: its name, its own knobs (a settings dataclass with their defaults, help
and checks), the metrics it adds, the ratio levels it takes and whether it selects tokens over the whole batch.

Everything else is derived from :data:`SPECS`: the accepted names in ``accepted.py`` (``SURROGATES``,
``SURROGATE_KNOBS``, ...), the schema's ``algorithm.clip`` keys, defaults, help and checks (``config/sections/algorithm.py``),
the config node every preset composes onto (``train/app.py``), ``PolicySettings``' accepted keys. The math
(``surrogates.py``, ``@register_surrogate``) takes the spec's settings class. Adding a surrogate: declare its spec
and its function in one file (``examples/shifted_clip.py``, docs/api.md "Adding a surrogate").
"""

from __future__ import annotations

from dataclasses import MISSING, dataclass, fields
from typing import Any, Callable, Optional

from rlcompare import registry
from rlcompare.specs_common import knob  # noqa: F401 - every extension point's; its former home re-exports it

RATIO_LEVELS = ("token", "sequence", "sequence-token", "hybrid")
MIXES = ("mean", "entropy")  # DHPO's weight of the token branch (clip with ratio=hybrid)
# the config keys under algorithm.clip that are no surrogate's own: PPO's range (every surrogate reports its clip
# fractions, so that surrogates compare) and the dual clip (policy_loss applies it around clip)
COMMON_KEYS = ("eps_low", "eps_high", "dual_clip")
# share of the batch's real tokens Clip-Cov / KL-Cov restrict, when cov_ratio=None (the authors' 7B scripts,
# arXiv 2505.22617; verl's kl_cov_ratio default is 2e-4)
COV_RATIO_DEFAULTS = {"clip-cov": 2e-4, "kl-cov": 2e-3}


@dataclass(frozen=True)
class SurrogateSpec:
    """A surrogate's declaration. ``settings``: a frozen dataclass whose fields are its knobs (:func:`knob`; the
    common keys ``eps_low``/``eps_high`` may be fields too, read from PPO's range) and whose ``check()`` raises a
    ValueError naming ``algorithm.clip.<key>`` and the fix; ``metrics``: what it adds to the metrics dict (what it
    clips, masks or gates); ``ratio_levels``: the ratio levels it accepts; ``selects_tokens``: it restricts tokens
    chosen over the whole optimizer step (Clip-Cov / KL-Cov), computed once per step and sliced per micro-batch;
    ``doc``: one line with its source."""

    name: str
    settings: type
    metrics: tuple = ()
    ratio_levels: tuple = ("token",)
    selects_tokens: bool = False
    doc: str = ""

    def knobs(self) -> tuple:
        """Its own config keys (the settings' fields outside :data:`COMMON_KEYS`)."""
        return tuple(f.name for f in fields(self.settings) if f.name not in COMMON_KEYS)

    def build(self, values: dict) -> Any:
        """Its settings from flat config keys (absent keys take the defaults)."""
        return self.settings(**{f.name: values[f.name] for f in fields(self.settings) if f.name in values})


SPECS: dict[str, SurrogateSpec] = {}  # name -> spec, in registration order (the schema's key order)
_LISTENERS: list[Callable[[], None]] = []


def register_spec(spec: SurrogateSpec, module: Optional[str] = None) -> SurrogateSpec:
    """Register ``spec`` for ``module`` (default: the caller's). A name another module registered is refused
    (``rlcompare.registry.claim``); the same module registering it again replaces it. Its knobs may be another
    spec's too (shared keys, e.g. ``cov_ratio``), with the same default; its ratio levels must be known ones."""
    module = module or registry.caller_module()
    for f in fields(spec.settings):
        if f.default is MISSING or (f.name not in COMMON_KEYS and not f.metadata.get("help")):
            raise ValueError(
                f"surrogate {spec.name!r}: declare knob {f.name} as knob(default, help) (docs/config.md shows both)"
            )
    if not callable(getattr(spec.settings, "check", None)):
        raise ValueError(f"surrogate {spec.name!r}: {spec.settings.__name__} needs a check() method")
    unknown = [r for r in spec.ratio_levels if r not in RATIO_LEVELS]
    if unknown or not spec.ratio_levels:
        raise ValueError(
            f"surrogate {spec.name!r}: ratio_levels must be some of {RATIO_LEVELS}, got {spec.ratio_levels}"
        )
    others: dict = {}  # key -> (the first other spec declaring it, its field)
    for n, s in SPECS.items():
        for k, f in knob_fields(s).items():
            if n != spec.name:
                others.setdefault(k, (n, f))
    for key, f in knob_fields(spec).items():
        if key in others and others[key][1].default != f.default:
            raise ValueError(
                f"surrogate {spec.name!r}: knob {key} has default {f.default!r}, but surrogate {others[key][0]!r} "
                f"declares it with {others[key][1].default!r}; one key, one default (or name yours apart)"
            )
    registry.claim("surrogate", spec.name, module)
    SPECS[spec.name] = spec
    for fn in _LISTENERS:
        fn()
    return spec


def unregister(name: str) -> None:
    """Take a registered spec out again (a test's or a plugin's own surrogate)."""
    SPECS.pop(name, None)
    registry.release("surrogate", name)
    for fn in _LISTENERS:
        fn()


def on_change(fn: Callable[[], None]) -> None:
    """Call ``fn()`` now and after every registration (the Hydra app refreshes its knob defaults with it)."""
    _LISTENERS.append(fn)
    fn()


def spec(name: str) -> SurrogateSpec:
    if name not in SPECS:
        raise ValueError(f"surrogate must be one of {', '.join(repr(n) for n in SPECS)}, got {name!r}")
    return SPECS[name]


def knob_fields(s: SurrogateSpec) -> dict:
    """``key -> dataclasses.Field`` of a spec's own knobs."""
    return {f.name: f for f in fields(s.settings) if f.name not in COMMON_KEYS}


def all_knob_fields() -> dict:
    """Every registered spec's knobs, ``key -> Field`` (a shared key once, first declaration), in order."""
    out: dict = {}
    for s in SPECS.values():
        for key, f in knob_fields(s).items():
            out.setdefault(key, f)
    return out


def registry_key() -> tuple:
    """What the derived names depend on: their caches are keyed by it."""
    return tuple(SPECS.values())


# ---------------------------------------------------------------- the checks' messages
def refuse(key: str, value: Any, what: str, fix: str) -> ValueError:
    return ValueError(f"algorithm.clip.{key}={value!r} must be {what}; {fix}")


def _number(v: Any) -> bool:
    # inf passes (an unbounded range, e.g. GMPO as GSPO); nan fails every comparison; the config refuses both
    return v is not None and not isinstance(v, bool) and isinstance(v, (int, float))


def at_least_zero(key: str, value: Any, fix: str, *, allow_none: bool = False) -> None:
    if value is None and allow_none:
        return
    if not (_number(value) and value >= 0):
        raise refuse(key, value, "a number >= 0" + (" or null" if allow_none else ""), fix)


def above_zero(key: str, value: Any, fix: str, *, allow_none: bool = False) -> None:
    if value is None and allow_none:
        return
    if not (_number(value) and value > 0):
        raise refuse(key, value, "a number > 0" + (" or null" if allow_none else ""), fix)


# ---------------------------------------------------------------- the built-in surrogates
@dataclass(frozen=True)
class ClipSettings:
    eps_low: float = 0.2  # clip range of rho below 1 (the token branch for hybrid)
    eps_high: float = 0.2  # above 1 (DAPO's clip-higher when > eps_low)
    seq_eps_low: Optional[float] = knob(None, "hybrid (DHPO) ratio: the sequence branch's clip range below 1")
    seq_eps_high: Optional[float] = knob(None, "hybrid (DHPO) ratio: the sequence branch's clip range above 1")
    mix: str = knob("mean", "hybrid ratio: how token and sequence branches combine: mean | entropy")

    def check(self) -> None:
        at_least_zero("seq_eps_low", self.seq_eps_low, "e.g. 3e-4 (DHPO), or null off hybrid", allow_none=True)
        at_least_zero("seq_eps_high", self.seq_eps_high, "e.g. 4e-4 (DHPO), or null off hybrid", allow_none=True)
        if self.mix not in MIXES:
            raise refuse("mix", self.mix, f"one of {', '.join(MIXES)}", "set algorithm.clip.mix=mean")


@dataclass(frozen=True)
class CispoSettings:
    cispo_w_min: Optional[float] = knob(None, "CISPO: lower bound of the clipped IS weight; null: none")
    cispo_w_max: Optional[float] = knob(5.0, "CISPO: upper bound of the clipped IS weight (stop-gradient); null: none")

    def check(self) -> None:
        lo, hi = self.cispo_w_min, self.cispo_w_max
        at_least_zero("cispo_w_min", lo, "e.g. null (no lower bound, the paper's)", allow_none=True)
        above_zero("cispo_w_max", hi, "e.g. 5.0 (ScaleRL), or null (no upper bound)", allow_none=True)
        if lo is not None and hi is not None and lo > hi:
            raise refuse(
                "cispo_w_min", lo, f"<= algorithm.clip.cispo_w_max={hi!r}", "lower cispo_w_min or raise cispo_w_max"
            )


@dataclass(frozen=True)
class SapoSettings:
    sapo_tau_pos: float = knob(1.0, "SAPO: soft-gate temperature for positive advantages")
    sapo_tau_neg: float = knob(1.05, "SAPO: soft-gate temperature for negative advantages")

    def check(self) -> None:
        above_zero("sapo_tau_pos", self.sapo_tau_pos, "e.g. 1.0 (the paper; the gate divides by it)")
        above_zero("sapo_tau_neg", self.sapo_tau_neg, "e.g. 1.05 (the paper; the gate divides by it)")


@dataclass(frozen=True)
class GmpoSettings:
    gmpo_eps_low: float = knob(0.4, "GMPO: clip range below 0 of the log-ratio")
    gmpo_eps_high: float = knob(0.4, "GMPO: clip range above 0 of the log-ratio")

    def check(self) -> None:
        at_least_zero("gmpo_eps_low", self.gmpo_eps_low, "e.g. 0.4 (the paper)")
        at_least_zero("gmpo_eps_high", self.gmpo_eps_high, "e.g. 0.4 (the paper)")


@dataclass(frozen=True)
class DppoSettings:
    dppo_delta_low: float = knob(0.15, "DPPO: divergence bound for tokens whose probability falls")
    dppo_delta_high: float = knob(0.15, "DPPO: divergence bound for tokens whose probability rises")
    dppo_cap: float = knob(20.0, "DPPO: cap on the importance weight")

    def check(self) -> None:
        at_least_zero("dppo_delta_low", self.dppo_delta_low, "e.g. 0.15 (the paper)")
        at_least_zero("dppo_delta_high", self.dppo_delta_high, "e.g. 0.15 (the paper)")
        above_zero("dppo_cap", self.dppo_cap, "e.g. 20.0 (the paper)")


_COV_RATIO_HELP = "Clip-Cov / KL-Cov: share of tokens restricted; null: 2e-4 (clip-cov), 2e-3 (kl-cov)"


def _check_cov_ratio(ratio: Any) -> None:
    if ratio is not None and not (_number(ratio) and 0 < ratio <= 1):
        raise refuse(
            "cov_ratio",
            ratio,
            "in (0, 1] (the share of tokens restricted) or null",
            "e.g. 2e-4, or null (the authors' share)",
        )


@dataclass(frozen=True)
class ClipCovSettings:
    eps_low: float = 0.2  # PPO's range, for the clip and for "tokens PPO did not clip"
    eps_high: float = 0.2
    cov_ratio: Optional[float] = knob(None, _COV_RATIO_HELP)
    cov_lb: float = knob(1.0, "Clip-Cov: lower end of the covariance window of tokens that may be clipped")
    cov_ub: float = knob(5.0, "Clip-Cov: upper end of the covariance window")

    def check(self) -> None:
        _check_cov_ratio(self.cov_ratio)
        at_least_zero("cov_lb", self.cov_lb, "e.g. 1.0 (the authors)")
        if not (self.cov_lb < self.cov_ub):
            raise refuse(
                "cov_lb",
                self.cov_lb,
                f"< algorithm.clip.cov_ub={self.cov_ub!r} (the covariance window)",
                "lower cov_lb or raise cov_ub",
            )


@dataclass(frozen=True)
class KlCovSettings:
    cov_ratio: Optional[float] = knob(None, _COV_RATIO_HELP)
    kl_cov_coef: float = knob(1.0, "KL-Cov: coefficient of the KL penalty on the selected tokens")

    def check(self) -> None:
        _check_cov_ratio(self.cov_ratio)
        at_least_zero("kl_cov_coef", self.kl_cov_coef, "e.g. 1.0 (the authors)")


_DPPO_METRICS = ("dppo_mask_frac", "is_weight_mean", "is_clip_frac_high")
for _spec in (
    # ratio levels: the variants build on the token ratio (GMPO makes its own sequence ratio); SAPO's gate also takes
    # GSPO's sequence ratio (TRL's importance_sampling_level="sequence")
    SurrogateSpec(
        "clip",
        ClipSettings,
        ("seq_clip_frac_low", "seq_clip_frac_high", "mix_weight_mean"),  # DHPO's sequence branch (ratio=hybrid)
        RATIO_LEVELS,
        doc="PPO (arXiv 1707.06347), DAPO, GSPO, DHPO by ratio level",
    ),
    SurrogateSpec(
        "cispo",
        CispoSettings,
        ("is_weight_mean", "is_clip_frac_low", "is_clip_frac_high"),
        doc="CISPO (MiniMax-M1, arXiv 2506.13585)",
    ),
    SurrogateSpec(
        "sapo",
        SapoSettings,
        ("sapo_weight_mean",),
        ("token", "sequence", "sequence-token"),
        doc="SAPO (arXiv 2511.20347)",
    ),
    SurrogateSpec("gmpo", GmpoSettings, ("gmpo_clip_frac", "gmpo_ratio_mean"), doc="GMPO (arXiv 2507.20673)"),
    SurrogateSpec("dppo-tv", DppoSettings, _DPPO_METRICS, doc="DPPO-TV (arXiv 2602.04879)"),
    SurrogateSpec("dppo-kl", DppoSettings, _DPPO_METRICS, doc="DPPO-KL (arXiv 2602.04879)"),
    SurrogateSpec(
        "clip-cov", ClipCovSettings, ("cov_selected_frac",), selects_tokens=True, doc="Clip-Cov (arXiv 2505.22617)"
    ),
    SurrogateSpec(
        "kl-cov", KlCovSettings, ("cov_selected_frac",), selects_tokens=True, doc="KL-Cov (arXiv 2505.22617)"
    ),
):
    register_spec(_spec)
