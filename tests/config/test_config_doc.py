"""Every config key has a one-line help in one place (its field's comment in rlcompare/config/schema.py or the section's
module in rlcompare/config/sections/), and docs/config.md, generated from it (scripts/config_doc.py), is in step with
the schema."""

from pathlib import Path

from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from rlcompare.config import doc as config_doc
from rlcompare.train.app import conf_dir
from rlcompare.config.flat import flatten
from tests.plugin_state import builtins_only

ROOT = Path(__file__).resolve().parents[2]
CONF = Path(conf_dir())


def _documented(key: str, keys: set[str]) -> bool:
    # a key inside a free-form field (prompts.fields.question) is documented by that field
    parts = key.split(".")
    return any(".".join(parts[:i]) in keys for i in range(1, len(parts) + 1))


def test_every_schema_key_has_a_one_line_help():
    missing = [k for k, h in config_doc.key_help().items() if not h.strip()]
    assert missing == [], f"add a comment after these fields (rlcompare/config/schema.py, sections/): {missing}"


def test_docs_config_md_is_in_step_with_the_schema():
    text = (ROOT / "docs" / "config.md").read_text()
    # docs/config.md shows the built-ins' keys, not those of a plug-in another test on this worker imported
    with builtins_only():
        rendered = config_doc.render()
    assert text == rendered, "docs/config.md is stale: run python scripts/config_doc.py"


def test_every_key_of_the_default_config_and_of_every_algorithm_preset_is_documented():
    keys = set(config_doc.key_help())
    with initialize_config_dir(config_dir=str(CONF), version_base=None):
        composed = flatten(OmegaConf.to_container(compose("config"), resolve=False))
    found = [k for k in composed if not k.startswith("hydra.")]
    for preset in sorted((CONF / "algorithm").glob("*.yaml")):
        found += ["algorithm." + k for k in flatten(OmegaConf.to_container(OmegaConf.load(preset)))]
    assert [k for k in found if not _documented(k, keys)] == []


def test_the_doc_names_each_key_with_its_default_and_help():
    rows = {key: (default, help_) for key, default, help_ in config_doc.rows()}
    assert rows["trainer.lr"] == ("3e-05", "policy learning rate (AdamW)")
    assert rows["rollout.kv_cache"][0] == "auto"
    text = config_doc.render()
    assert "| `trainer.lr` | `3e-05` | policy learning rate (AdamW) |" in text
