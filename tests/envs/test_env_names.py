"""env.name's accepted values derive from the environments' specs (rlcompare/env_specs.py; issue 64: they were a
hand copy no test checked): none, every registered environment, custom; every conf/env/ file names one of them, and
a registered environment's settings are checked against its knobs before anything heavy."""

from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from rlcompare import env_specs
from rlcompare.config import schema
from rlcompare.env_specs import EnvNeeds, EnvSpec, knob

REPO = Path(__file__).resolve().parents[2]


def test_env_names_are_the_registered_environments_between_none_and_custom():
    assert schema.ENV_NAMES == ("none", *env_specs.SPECS, "custom")
    assert {"feedback", "calc", "verifiers"} <= set(env_specs.SPECS)


def test_every_shipped_env_file_names_an_accepted_env():
    names = {yaml.safe_load(p.read_text())["name"] for p in (REPO / "conf" / "env").glob("*.yaml")}
    assert names <= set(schema.ENV_NAMES) and len(names) == len(list((REPO / "conf" / "env").glob("*.yaml")))


def test_calc_declares_the_stop_and_the_call_it_reads():
    assert env_specs.spec("calc").needs == EnvNeeds(stop=("</calc>",), shortest_call="<calc>1+1</calc>")


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["env=feedback", "+env.settings.turns=2"], "env.settings.turns is not a setting of env.name=feedback; "),
        (["env=verifiers", "env.settings.module=x", "env.settings.turn_timeout_s=soon"], "turn_timeout_s='soon' must"),
        (["env=verifiers", "env.settings.module=x", "+env.settings.retries=2"], "accepted: module, env_id, env_args"),
        (["env=calc", "env.stop=[]"], "env.stop=[]: env=calc reads a tool call at the end of a turn"),
        (["env.name=nope"], "env.name='nope' must be one of none, feedback, calc, verifiers"),
        (["env=feedback", "env.module=no_such_env_module"], "env.module='no_such_env_module' cannot be imported"),
    ],
)
def test_bad_env_settings_are_refused_naming_the_key(compose, overrides, message):
    with pytest.raises(schema.ConfigError, match=None) as e:
        schema.validate(compose(*overrides))
    assert message in str(e.value), str(e.value)


@dataclass(frozen=True)
class _One:
    n: int = knob(1, "a knob")

    def check(self) -> None:
        pass


def test_a_taken_name_is_refused_naming_both_modules():
    with pytest.raises(ValueError) as e:
        env_specs.register_spec(EnvSpec("calc", _One, factory="x:Y"), module="someone.elses")
    assert str(e.value) == (
        "environment name 'calc' is registered already (by rlcompare.env_specs); someone.elses cannot register it "
        "again: pick another name for yours"
    )
    assert env_specs.spec("calc").settings is env_specs.NoSettings  # the built-in kept


def test_a_spec_declares_its_knobs_its_check_and_its_metrics_under_its_name():
    @dataclass(frozen=True)
    class Bare:
        n: int = 1

        def check(self) -> None:
            pass

    with pytest.raises(ValueError, match="declare knob n as knob"):
        env_specs.register_spec(EnvSpec("bare", Bare, factory="x:Y"), module="tests.x")
    # a metric is one segment of its row key env/<name>/<metric>: a '/' in it could write over another key
    with pytest.raises(ValueError, match="metric 'other/x' is not a usable name.*logged as env/m/<name>"):
        env_specs.register_spec(EnvSpec("m", _One, factory="x:Y", metrics=("other/x",)), module="tests.x")
    with pytest.raises(ValueError, match="metric 'tries' is not a usable name"):  # a string, not a tuple of them
        env_specs.register_spec(EnvSpec("m", _One, factory="x:Y", metrics="tries"), module="tests.x")
    with pytest.raises(ValueError, match=r"its metrics \('a', 'a'\) name one twice"):
        env_specs.register_spec(EnvSpec("m", _One, factory="x:Y", metrics=("a", "a")), module="tests.x")
    # env/errors/<metric> would write over the row's own error counts: the row's env/ names are taken
    for taken in ("custom", "none", "errors", "ends", "turns_mean", "a/b", ""):
        with pytest.raises(ValueError, match="pick a name of letters, digits"):
            env_specs.register_spec(EnvSpec(taken, _One, factory="x:Y"), module="tests.x")
    assert "bare" not in env_specs.SPECS and "m" not in env_specs.SPECS
