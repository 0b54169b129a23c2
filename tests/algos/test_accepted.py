"""The accepted names live once, torch-free, so that a bad setting is refused before torch is imported."""

import subprocess
import sys

from rlcompare.algos import accepted, advantages, losses


def test_validating_a_config_imports_neither_torch_nor_transformers():
    code = (
        "import sys; from rlcompare.config import validate; "
        "print(sorted(m for m in ('torch', 'transformers') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert out == "[]"


def test_surrogate_defaults_are_the_settings_defaults():
    # every knob of SURROGATE_KNOBS is read by some surrogate's settings, with the default accepted.py states
    from dataclasses import fields

    read = {f.name: f.default for s in losses.SURROGATE_REGISTRY.values() for f in fields(s.settings)}
    assert {k: read[k] for k in accepted.SURROGATE_KNOBS} == accepted.SURROGATE_DEFAULTS
    assert set(losses.SURROGATE_REGISTRY) == set(accepted.SURROGATES)


def test_the_math_modules_re_export_the_same_objects():
    for name in ("RATIO_LEVELS", "AGGREGATIONS", "KL_ESTIMATORS", "SURROGATES", "MISMATCH_MODES"):
        assert getattr(losses, name) is getattr(accepted, name)
    assert advantages.GROUP_SCALES is accepted.GROUP_SCALES


def test_config_takes_every_math_name_from_accepted():
    # config validates against the accepted module's own objects, never a copy that could drift
    from rlcompare import config

    pairs = {
        "RATIOS": "RATIO_LEVELS",
        "AGGREGATIONS": "AGGREGATIONS",
        "ESTIMATORS": "ADVANTAGE_ESTIMATORS",
        "SCALES": "ESTIMATOR_SCALES",
        "KL_ESTIMATORS": "KL_ESTIMATORS",
        "KL_PLACEMENTS": "KL_PLACEMENTS",
        "MIXES": "MIXES",
    }
    for mine, theirs in pairs.items():
        assert getattr(config, mine) is getattr(accepted, theirs), mine
    assert config.SCALES["group"] is accepted.GROUP_SCALES


def test_no_accepted_tuple_is_written_out_again():
    # a tuple literal elsewhere in the package equal to one of accepted's tuples is a second copy of it
    import ast
    from pathlib import Path

    theirs = {v for v in vars(accepted).values() if isinstance(v, tuple) and len(v) > 1}
    pkg = Path(accepted.__file__).parent
    for path in sorted(pkg.rglob("*.py")):
        if path.name in (
            "accepted.py",
            "surrogate_specs.py",
            "estimator_specs.py",
        ):  # the torch-free homes (accepted re-exports the others')
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Tuple) and all(isinstance(e, ast.Constant) for e in node.elts):
                value = tuple(e.value for e in node.elts)
                assert value not in theirs, f"{path.name}:{node.lineno} repeats {value}"
