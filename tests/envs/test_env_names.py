"""schema.ENV_NAMES (the config check's, torch-free) is none, the built-in environments and custom, and every
conf/env/ file names one of them (issue 64: it was a hand copy no test checked)."""

from pathlib import Path

import yaml

from rlcompare.config.schema import ENV_NAMES
from rlcompare.envs import builtin

REPO = Path(__file__).resolve().parents[2]


def test_env_names_are_the_builtins_between_none_and_custom():
    assert ENV_NAMES == ("none", *builtin._CLASSES, "custom")


def test_every_shipped_env_file_names_an_accepted_env():
    names = {yaml.safe_load(p.read_text())["name"] for p in (REPO / "conf" / "env").glob("*.yaml")}
    assert names <= set(ENV_NAMES) and len(names) == len(list((REPO / "conf" / "env").glob("*.yaml")))
