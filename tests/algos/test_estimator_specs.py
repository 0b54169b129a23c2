"""The advantage estimators' specs (algos/estimator_specs.py): one declaration each, the schema's knobs agree with
it, a taken name is refused naming both modules, and the config check asks the declared needs."""

from __future__ import annotations

from dataclasses import MISSING, fields

import pytest

from rlcompare.algos import accepted, estimator_specs
from rlcompare.algos.advantage import ESTIMATOR_REGISTRY, register_estimator
from rlcompare.algos.estimator_specs import EstimatorSpec, Needs, NoKnobs
from rlcompare.config import ConfigError, validate
from rlcompare.config.sections.algorithm import AdvantageConfig


def test_every_builtin_has_a_spec_a_function_and_schema_keys_with_the_specs_defaults():
    assert set(estimator_specs.SPECS) == set(ESTIMATOR_REGISTRY) == set(accepted.ADVANTAGE_ESTIMATORS)
    schema = {f.name: f.default for f in fields(AdvantageConfig)}
    for spec in estimator_specs.SPECS.values():
        assert accepted.ESTIMATOR_SCALES[spec.name] == spec.scales
        for f in fields(spec.settings):
            assert f.default is not MISSING and schema[f.name] == f.default, (spec.name, f.name)


def test_a_taken_name_is_refused_naming_both_modules():
    with pytest.raises(
        ValueError,
        match=r"advantage estimator name 'group' is registered already \(by "
        r"rlcompare.algos.estimator_specs\); \S*test_estimator_specs cannot",
    ):
        estimator_specs.register_estimator_spec(EstimatorSpec("group", NoKnobs, ("none",)))
    with pytest.raises(ValueError, match=r"'rloo' is registered already \(by rlcompare.algos.advantage.rloo\)"):
        register_estimator("rloo")(lambda x, s: None)
    assert ESTIMATOR_REGISTRY["rloo"].__module__ == "rlcompare.algos.advantage.rloo"


def test_the_same_module_may_register_its_name_again():
    spec = EstimatorSpec("toy-est", NoKnobs, ("none",), Needs(groups=True))
    try:
        estimator_specs.register_estimator_spec(spec)
        estimator_specs.register_estimator_spec(spec)  # a module imported twice re-runs its registrations
    finally:
        estimator_specs.unregister("toy-est")
    assert "toy-est" not in accepted.ADVANTAGE_ESTIMATORS


@pytest.mark.parametrize(
    "overrides, message",
    [
        (
            ["algorithm.advantage.estimator=gdpo", "algorithm.advantage.scale=whiten", "trainer.group_size=1"],
            "trainer.group_size=1 with algorithm.advantage.estimator=gdpo",
        ),
        (
            ["algorithm.advantage.estimator=gdpo", "algorithm.advantage.scale=group"],
            "algorithm.advantage.scale (estimator=gdpo)='group' is not accepted",
        ),
        (
            ["algorithm=reinforce_pp_baseline", "trainer.group_size=1"],
            "trainer.group_size=1 with algorithm.advantage.estimator=reinforce_pp",
        ),
        (
            ["algorithm=ppo", "algorithm.advantage.estimator=gdpo", "algorithm.advantage.scale=whiten"],
            "algorithm.kl.placement=in_reward with algorithm.advantage.estimator=gdpo",
        ),
    ],
)
def test_the_config_check_asks_the_declared_needs(compose, overrides, message):
    with pytest.raises(ConfigError) as e:
        validate(compose(*overrides))
    assert message in str(e.value)


def test_ppo_with_group_size_one_and_rloo_with_groups_pass(compose):
    validate(compose("algorithm=ppo", "trainer.group_size=1"))  # GAE needs no groups
    validate(
        compose("algorithm=reinforce_pp_baseline", "algorithm.advantage.baseline=none", "trainer.group_size=1")
    )  # REINFORCE++ without its group baseline needs none
