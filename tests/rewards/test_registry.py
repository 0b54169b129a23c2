"""The verifier registry (#54): one declaration per verifier; the builder, the config check and the workers read it."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import textwrap
from dataclasses import fields

import pytest

from rlcompare.config.schema import VerifierConfig
from rlcompare.rewards import registry
from rlcompare.rewards.pool import score_batch
from rlcompare.rewards.registry import build_verifier, check_config, register_verifier
from rlcompare.rewards.verifiers import Countdown, ExactMatch, FormatCheck, Verifier, Weighted

MODULE = """
from dataclasses import dataclass

from rlcompare.rewards.pool import Score
from rlcompare.rewards.registry import knob, register_verifier
from rlcompare.rewards.verifiers import Verifier


@dataclass(frozen=True)
class PlusSettings:
    bonus: float = knob(0.25, "added to every reward")

    def check(self):
        pass


@register_verifier("{name}", settings=PlusSettings)
class Plus(Verifier):
    bounded = False  # scored in worker processes

    def __init__(self, bonus=0.25):
        self.bonus = float(bonus)

    def score(self, completion, answer):
        return Score(self.bonus + (completion == answer), completion == answer)
"""


def test_every_builtin_is_registered_with_its_settings():
    assert set(registry.names()) >= {"exact_match", "math_verify", "countdown", "format", "weighted", "reasoning_gym"}
    assert registry.spec("exact_match").defaults() == {"number": "first", "max_chars": 10_000}
    assert registry.spec("countdown").defaults() == {"require_all": False, "max_chars": 10_000}
    assert registry.spec("format").defaults() == {"pattern": None, "max_chars": 10_000}
    assert registry.spec("math_verify").defaults() == {"max_chars": 10_000, "timeout_s": 5.0}
    assert registry.spec("reasoning_gym").defaults() == {"max_chars": 10_000, "partial_credit": False}
    assert registry.spec("weighted").defaults() == {"components": None}
    assert isinstance(build_verifier({"name": "exact_match", "number": "last"}), ExactMatch)
    # the default verifier reports no metric: a default run's rows keep their keys
    assert build_verifier({"name": "exact_match"}).declared_metrics == ()


def test_the_schema_holds_exactly_the_run_keys():
    assert {f.name for f in fields(VerifierConfig)} == set(registry.RUN_KEYS)


def test_the_config_check_imports_no_torch_and_no_heavy_package():
    code = (
        "import sys; from rlcompare.rewards import registry; "
        "registry.check_config({'name': 'math_verify', 'timeout_s': 5.0}); "
        "registry.check_config({'name': 'reasoning_gym', 'partial_credit': True}); "
        "bad = [m for m in ('torch', 'math_verify', 'sympy', 'reasoning_gym') if m in sys.modules]; "
        "assert not bad, bad"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


@pytest.mark.parametrize(
    "d, message",
    [
        ({"name": "countdown", "number": "last"}, "verifier.number is not a setting of verifier 'countdown'"),
        ({"name": "exact_match", "number": 3}, "verifier.number=3 is not accepted; verifier 'exact_match' takes a str"),
        ({"name": "countdown", "require_all": "yes"}, "verifier.require_all='yes' is not accepted"),
        ({"name": "exact_match", "number": "middle"}, "verifier.number='middle' is not accepted; use one of: first"),
        ({"name": "format", "pattern": "("}, r"verifier.pattern='\(' is not a valid regex"),
        (
            {"name": "weighted", "components": [{"name": "exact_match", "number": "middle"}]},
            r"verifier.components\[0\].number='middle' is not accepted",  # the settings' check, at its prefix
        ),
        (
            {"name": "weighted", "components": [{"name": "format", "require_all": True}]},
            r"verifier.components\[0\].require_all is not a setting of verifier 'format'",
        ),
        ({"name": "nope"}, "verifier.name='nope' is not a known verifier; use one of: exact_match, "),
        ({"name": "x", "module": "no_such_module_xyz"}, "verifier.module='no_such_module_xyz' cannot be imported"),
    ],
)
def test_bad_keys_are_refused_naming_them(d, message):
    with pytest.raises(ValueError, match=message):
        check_config(d)


def test_the_accepted_keys_are_listed():
    with pytest.raises(ValueError) as e:
        check_config({"name": "format", "patern": "x"})
    assert str(e.value).endswith(
        "accepted keys: batch_timeout_s, extra, isolation, max_chars, module, name, pattern, probe, timeout_s, workers"
    )


def test_weighted_passes_down_only_what_each_component_accepts():
    v = build_verifier(
        {
            "name": "weighted",
            "require_all": True,
            "pattern": "^a",
            "components": [{"name": "countdown", "weight": 1.0}, {"name": "format", "weight": 0.5}],
        }
    )
    assert isinstance(v, Weighted)
    (cd, w1), (fmt, w2) = v.components
    assert isinstance(cd, Countdown) and cd.require_all and (w1, w2) == (1.0, 0.5)
    assert isinstance(fmt, FormatCheck) and fmt.pattern == "^a"


def test_the_former_dict_declaration_is_refused_saying_how_to_declare():
    with pytest.raises(
        TypeError, match=r"settings=\{...\} \(a dict\) is the former declaration; declare its settings as"
    ):
        register_verifier("dict_form", settings={"bonus": 0.25})
    with pytest.raises(TypeError, match="help= is the former declaration"):
        register_verifier("help_form", help={"bonus": "x"})
    assert "dict_form" not in registry.REGISTRY and "help_form" not in registry.REGISTRY


def test_a_setting_without_help_or_an_undeclarable_metric_is_refused():
    from dataclasses import dataclass

    @dataclass(frozen=True)
    class Bare:
        bonus: float = 0.25

        def check(self):
            pass

    with pytest.raises(ValueError, match="declare setting bonus as knob"):
        register_verifier("bare", settings=Bare)
    with pytest.raises(ValueError, match="metric 'errors' is not a usable name"):
        register_verifier("clash", metrics=("errors",))  # verifier/errors is the row's own


def test_weighted_declares_each_component_and_reports_its_own_reward():
    """weighted's metrics: each component's reward before its weight (a shared name gets its index)."""
    d = {"name": "weighted", "components": [{"name": "countdown", "weight": 1.0}, {"name": "format", "weight": 0.1}]}
    v = build_verifier(d)
    assert v.declared_metrics == ("countdown", "format")
    s = v.score("<answer>3*5+8</answer>", '{"nums": [3, 5, 7], "target": 22}')  # wrong sum, R1 form missing
    assert (s.reward, s.metrics) == (0.0, {"countdown": 0.0, "format": 0.0})
    s = v.score("<think>x</think><answer>3*5+7</answer>", '{"nums": [3, 5, 7], "target": 22}')
    assert (s.reward, s.metrics) == (1.1, {"countdown": 1.0, "format": 1.0})
    twice = {"name": "weighted", "components": [{"name": "format"}, {"name": "format", "pattern": "a"}]}
    assert registry.metric_names(twice) == ("format_0", "format_1")


def test_a_name_taken_by_another_class_is_refused():
    with pytest.raises(ValueError, match="verifier name 'countdown' is registered already"):

        @register_verifier("countdown")
        class Other(Verifier):
            pass


def test_a_verifier_loaded_from_a_file_scores_in_worker_processes(tmp_path):
    """The worker imports the module its verifier's pickle names, from that module's file when the name is not
    importable (a fresh interpreter without tmp_path on its path)."""
    path = tmp_path / "plus_verifier_file.py"
    path.write_text(textwrap.dedent(MODULE.format(name="plus_file")))
    spec = importlib.util.spec_from_file_location("plus_verifier_file", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules["plus_verifier_file"] = module
    spec.loader.exec_module(module)
    v = build_verifier({"name": "plus_file", "bonus": 0.5, "workers": 1})
    try:
        got = score_batch(v, ["a", "b"], ["a", "a"], timeout_s=10.0)
    finally:
        v.close()
    assert [(s.reward, s.correct, s.error) for s in got] == [(1.5, True, False), (0.5, False, False)]


def test_verifier_module_is_imported_from_the_working_directory(tmp_path, monkeypatch):
    (tmp_path / "plus_verifier_cwd.py").write_text(textwrap.dedent(MODULE.format(name="plus_cwd")))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(tmp_path))])
    s = check_config({"name": "plus_cwd", "module": "plus_verifier_cwd", "bonus": 1.0})
    assert s.module == "plus_verifier_cwd" and s.defaults() == {"bonus": 0.25}


def test_a_run_config_from_before_the_registry_still_loads():
    """config.yaml of a run started when the schema held every verifier's keys (resume reads it back): the keys
    its verifier does not take, at their old defaults, are dropped; a changed one is still refused."""
    from rlcompare.config.schema import ConfigError, to_schema, validate

    old = {"number": "first", "require_all": False, "pattern": None, "partial_credit": False, "components": None}
    v = to_schema({"verifier": {"name": "countdown", **old}}).verifier
    assert v.require_all is False and "number" not in v and "pattern" not in v and "components" not in v
    with pytest.raises(ConfigError, match="verifier.number is not a setting of verifier 'countdown'"):
        validate({"verifier": {"name": "countdown", **old, "number": "last"}})
