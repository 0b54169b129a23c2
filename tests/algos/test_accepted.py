"""The accepted names live once, torch-free, so that a bad setting is refused before torch is imported."""

import inspect
import subprocess
import sys

from rlcompare.algos import accepted, advantages, losses


def test_validating_a_config_imports_neither_torch_nor_transformers():
    code = ("import sys; from rlcompare.config import validate; "
            "print(sorted(m for m in ('torch', 'transformers') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert out == "[]"


def test_surrogate_defaults_are_policy_losss_keyword_defaults():
    params = inspect.signature(losses.policy_loss).parameters
    assert {k: params[k].default for k in accepted.SURROGATE_KNOBS} == accepted.SURROGATE_DEFAULTS


def test_the_math_modules_re_export_the_same_objects():
    for name in ("RATIO_LEVELS", "AGGREGATIONS", "KL_ESTIMATORS", "SURROGATES", "MISMATCH_MODES"):
        assert getattr(losses, name) is getattr(accepted, name)
    assert advantages.GROUP_SCALES is accepted.GROUP_SCALES
