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
from rlcompare.rewards.pool import Score
from rlcompare.rewards.registry import register_verifier
from rlcompare.rewards.verifiers import Verifier


@register_verifier("{name}", settings={{"bonus": 0.25}})
class Plus(Verifier):
    bounded = False  # scored in worker processes

    def __init__(self, bonus=0.25):
        self.bonus = float(bonus)

    def score(self, completion, answer):
        return Score(self.bonus + (completion == answer), completion == answer)
"""


def test_every_builtin_is_registered_with_its_settings():
    assert set(registry.names()) >= {"exact_match", "math_verify", "countdown", "format", "weighted", "reasoning_gym"}
    assert registry.spec("exact_match").settings == {"number": "first", "max_chars": 10_000}
    assert registry.spec("countdown").settings == {"require_all": False, "max_chars": 10_000}
    assert isinstance(build_verifier({"name": "exact_match", "number": "last"}), ExactMatch)


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
    assert s.module == "plus_verifier_cwd" and s.settings == {"bonus": 0.25}


def test_a_run_config_from_before_the_registry_still_loads():
    """config.yaml of a run started when the schema held every verifier's keys (resume reads it back): the keys
    its verifier does not take, at their old defaults, are dropped; a changed one is still refused."""
    from rlcompare.config.schema import ConfigError, to_schema, validate

    old = {"number": "first", "require_all": False, "pattern": None, "partial_credit": False, "components": None}
    v = to_schema({"verifier": {"name": "countdown", **old}}).verifier
    assert v.require_all is False and "number" not in v and "pattern" not in v and "components" not in v
    with pytest.raises(ConfigError, match="verifier.number is not a setting of verifier 'countdown'"):
        validate({"verifier": {"name": "countdown", **old, "number": "last"}})
