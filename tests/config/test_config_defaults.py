"""Every default lives in one place: the YAML under conf/ is what users get, and the schema (rlcompare/config/schema.py
and sections/, which fills keys a saved run predates, and types every key) says the same."""

from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from rlcompare.train.app import conf_dir
from rlcompare.config import RunConfig
from rlcompare.config.flat import flatten

CONF = Path(conf_dir())
GROUPS = sorted(p.name for p in CONF.iterdir() if p.is_dir())


def _schema() -> dict:
    return flatten(OmegaConf.to_container(OmegaConf.structured(RunConfig)))


def _composed(*overrides: str) -> dict:
    with initialize_config_dir(config_dir=str(CONF), version_base=None):
        cfg = compose("config", overrides=list(overrides))
    return flatten(OmegaConf.to_container(cfg, resolve=False))


def _under_a_dict_key(key: str, schema: dict) -> bool:
    # keys inside a free-form dict field (prompts.fields.question): the field's default is the whole dict
    parts = key.split(".")
    return any(".".join(parts[:i]) in schema for i in range(1, len(parts)))


def _differences(composed: dict, schema: dict) -> list[str]:
    out = []
    for key, value in composed.items():
        if key in schema:
            if schema[key] != value:
                out.append(f"{key}: schema {schema[key]!r}, YAML {value!r}")
        elif not _under_a_dict_key(key, schema):
            out.append(f"{key}: in the YAML, not in the schema")
    return out


def test_every_schema_default_equals_the_composed_default_config():
    assert _differences(_composed(), _schema()) == []


@pytest.mark.parametrize("group", GROUPS)
def test_a_key_every_option_of_a_group_sets_alike_has_that_default(group):
    # keys shared by every option of a group with one value: the schema must not say another
    schema = _schema()
    options = [flatten(OmegaConf.to_container(OmegaConf.load(p))) for p in sorted((CONF / group).glob("*.yaml"))]
    shared = set.intersection(*(set(o) for o in options))
    for key in sorted(shared):
        values = {repr(o[key]) for o in options}
        full = f"{group}.{key}"
        if len(values) == 1 and full in schema:
            assert repr(schema[full]) in values, f"{full}: schema {schema[full]!r}, every {group} option {values}"
