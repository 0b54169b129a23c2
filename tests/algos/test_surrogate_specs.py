"""One declaration per surrogate (issue 54): the names the rest of the code reads derive from the specs, and a
spec that would make two facts of one is refused when registered."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

import pytest

from rlcompare.algos import accepted, surrogate_specs
from rlcompare.algos.surrogate_specs import SurrogateSpec, knob
from tests.plugin_state import builtins_only


def test_the_derived_names_are_the_ones_written_out_before():
    with builtins_only():  # a plug-in another test on this worker imported (examples.shifted_clip) set aside
        _the_derived_names_are_the_ones_written_out_before()


def _the_derived_names_are_the_ones_written_out_before():
    # the literals accepted.py held before the specs (plus clip's own hybrid knobs, now its spec's)
    assert accepted.SURROGATES == ("clip", "cispo", "sapo", "gmpo", "dppo-tv", "dppo-kl", "clip-cov", "kl-cov")
    assert accepted.SURROGATE_DEFAULTS == {
        "seq_eps_low": None,
        "seq_eps_high": None,
        "mix": "mean",
        "cispo_w_min": None,
        "cispo_w_max": 5.0,
        "sapo_tau_pos": 1.0,
        "sapo_tau_neg": 1.05,
        "gmpo_eps_low": 0.4,
        "gmpo_eps_high": 0.4,
        "dppo_delta_low": 0.15,
        "dppo_delta_high": 0.15,
        "dppo_cap": 20.0,
        "cov_ratio": None,
        "cov_lb": 1.0,
        "cov_ub": 5.0,
        "kl_cov_coef": 1.0,
    }
    assert accepted.SURROGATE_KNOBS == tuple(accepted.SURROGATE_DEFAULTS)
    assert accepted.SURROGATE_RATIOS["clip"] == accepted.RATIO_LEVELS
    assert accepted.SURROGATE_RATIOS["sapo"] == ("token", "sequence", "sequence-token")
    assert {n for n, r in accepted.SURROGATE_RATIOS.items() if r == ("token",)} == set(accepted.SURROGATES) - {
        "clip",
        "sapo",
    }
    assert accepted.SURROGATE_METRICS["dppo-kl"] == ("dppo_mask_frac", "is_weight_mean", "is_clip_frac_high")
    assert accepted.COV_SURROGATES == ("clip-cov", "kl-cov")
    assert accepted.SURROGATES is accepted.SURROGATES  # cached while the registry is unchanged


@dataclass(frozen=True)
class _Own:
    toy_gain: float = knob(2.0, "toy: a gain")

    def check(self) -> None:
        surrogate_specs.above_zero("toy_gain", self.toy_gain, "e.g. 2.0")


@pytest.fixture
def toy():
    yield SurrogateSpec("toy", _Own, ("toy_frac",), doc="a test's")
    surrogate_specs.unregister("toy")


def test_a_spec_registered_late_is_everywhere_its_names_are_read(toy):
    from rlcompare.config import schema  # imported before the registration

    surrogate_specs.register_spec(toy)
    assert accepted.SURROGATES[-1] == "toy" and accepted.SURROGATE_DEFAULTS["toy_gain"] == 2.0
    assert accepted.SURROGATE_METRICS["toy"] == ("toy_frac",) and accepted.SURROGATE_RATIOS["toy"] == ("token",)
    assert schema.clip_config()().toy_gain == 2.0 and "algorithm.clip.toy_gain" in schema.numeric_keys()
    with pytest.raises(ValueError, match=r"^algorithm\.clip\.toy_gain=0 must be a number > 0; e\.g\. 2\.0$"):
        accepted.check_surrogate_knobs("toy", {"toy_gain": 0})
    surrogate_specs.unregister("toy")
    assert "toy" not in accepted.SURROGATES and not hasattr(schema.clip_config()(), "toy_gain")


def test_a_shared_knob_has_one_default():
    @dataclass(frozen=True)
    class Other:
        cov_ratio: Optional[float] = knob(0.5, "another default for Clip-Cov's key")

        def check(self) -> None:
            pass

    with pytest.raises(ValueError, match=r"knob cov_ratio has default 0\.5, but surrogate 'clip-cov' declares it"):
        surrogate_specs.register_spec(SurrogateSpec("other", Other))
    assert "other" not in surrogate_specs.SPECS


@pytest.mark.parametrize(
    "settings_field, extra, says",
    [
        (("toy_gain", float, field(default=1.0)), {}, r"declare knob toy_gain as knob\(default, help\)"),
        (("toy_gain", float, knob(1.0, "x")), {"ratio_levels": ("tokens",)}, r"ratio_levels must be some of"),
        (("toy_gain", float, knob(1.0, "x")), {"ratio_levels": ()}, r"ratio_levels must be some of"),
    ],
)
def test_a_spec_that_cannot_work_is_refused(settings_field, extra, says):
    from dataclasses import make_dataclass

    cls = make_dataclass("Bad", [settings_field], namespace={"check": lambda self: None}, frozen=True)
    with pytest.raises(ValueError, match=says):
        surrogate_specs.register_spec(SurrogateSpec("bad", cls, **extra))
    assert "bad" not in surrogate_specs.SPECS


def test_settings_without_a_check_are_refused():
    Plain = dataclass(frozen=True)(
        type("Plain", (), {"__annotations__": {"toy_gain": float}, "toy_gain": knob(1.0, "x")})
    )
    with pytest.raises(ValueError, match=r"Plain needs a check\(\) method"):
        surrogate_specs.register_spec(SurrogateSpec("plain", Plain))


@pytest.mark.parametrize(
    "name, values, says",
    [
        (
            "cispo",
            {"cispo_w_min": -1.0},
            r"^algorithm\.clip\.cispo_w_min=-1\.0 must be a number >= 0 or null; e\.g\. null",
        ),
        ("sapo", {"sapo_tau_pos": 0.0}, r"^algorithm\.clip\.sapo_tau_pos=0\.0 must be a number > 0; e\.g\. 1\.0"),
        ("clip-cov", {"cov_ratio": 1.5}, r"^algorithm\.clip\.cov_ratio=1\.5 must be in \(0, 1\]"),
        (
            "clip",
            {"mix": "max"},
            r"^algorithm\.clip\.mix='max' must be one of mean, entropy; set algorithm\.clip\.mix=mean",
        ),
        ("kl-cov", {"cov_ratio": float("inf")}, r"^algorithm\.clip\.cov_ratio=inf must be in \(0, 1\]"),
    ],
)
def test_each_check_names_the_key_its_value_and_the_fix(name, values, says):
    with pytest.raises(ValueError, match=says):
        accepted.check_surrogate_knobs(name, values)


def test_an_unbounded_range_is_accepted_by_the_library():
    # GMPO with an infinite range is GSPO unclipped (tests/algos/test_losses_variants.py): inf passes the checks
    accepted.check_surrogate_knobs("gmpo", {"gmpo_eps_low": float("inf"), "gmpo_eps_high": float("inf")})
