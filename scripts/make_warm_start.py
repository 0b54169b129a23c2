"""Make the warm start that ships with rlcompare (rlcompare/models/warmstart/<key>/), from a source checkout.

    python scripts/make_warm_start.py                      # the embedded default (model=tiny, prompts=arithmetic)
    python scripts/make_warm_start.py prompts.max_operand=29   # any other tiny config (Hydra overrides)

It runs the warm start with rlcompare's own code (models.warm_start_tiny, shipped weights ignored) in a fresh
cache, and writes its model.safetensors with a manifest.json (key, init_weights_hash, versions) to
rlcompare/models/warmstart/<key>/. Run it when tests/models/test_warm_start.py reports that the shipped key no longer matches
the default config (conf/model/tiny.yaml, conf/prompts/arithmetic.yaml, the prompt generator or the recipe
changed); then delete the old key's folder and put the new init_weights_hash in that test.
"""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from rlcompare.models import load as models  # noqa: E402
from rlcompare.cli import conf_dir, register_resolvers  # noqa: E402
from rlcompare.config import validate  # noqa: E402
from rlcompare.data.prompts import build_prompts  # noqa: E402


def compose(overrides: list[str]):
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    register_resolvers()
    with initialize_config_dir(config_dir=conf_dir(), version_base=None):
        return validate(hydra_compose("config", overrides=["logger=none", *overrides]))


def make(overrides: list[str]) -> Path:
    cfg = compose(overrides)
    if cfg.model.kind != "tiny":
        raise SystemExit(f"config error: model.kind={cfg.model.kind} has no warm start; only model=tiny is shipped")
    splits = build_prompts(cfg.prompts)
    with tempfile.TemporaryDirectory() as cache:
        cfg.model.cache_dir = cache
        warm = models.warm_start_tiny(cfg.model, cfg.prompts, splits, use_shipped=False)
        target = models.SHIPPED_WARM_STARTS / warm.key
        target.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(Path(warm.folder) / models.SHIPPED_WEIGHTS, target / models.SHIPPED_WEIGHTS)
    from safetensors.torch import load_file
    from transformers import LlamaForCausalLM

    model = LlamaForCausalLM(models.tiny_model_config(cfg.model, models.build_char_tokenizer()))
    model.load_state_dict(load_file(str(target / models.SHIPPED_WEIGHTS)), strict=False)
    model.tie_weights()
    import tokenizers
    import torch
    import transformers

    manifest = {
        "key": warm.key,
        "init_weights_hash": models.weights_hash(model),
        "overrides": overrides,
        "made_by": "python scripts/make_warm_start.py",
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "tokenizers": tokenizers.__version__,
    }
    (target / models.SHIPPED_MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
    _, got = models.load_shipped_warm_start(target, cfg.model)  # the run's own loader accepts it
    size = (target / models.SHIPPED_WEIGHTS).stat().st_size
    print(f"wrote {target.relative_to(REPO)} (key {warm.key}, init_weights_hash {got}, {size / 1e6:.2f} MB)")
    return target


if __name__ == "__main__":
    make(sys.argv[1:])
