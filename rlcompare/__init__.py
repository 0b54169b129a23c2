"""rlcompare: matched comparisons of RL post-training algorithms for language models.

Kept import-free on purpose: `rlcompare.report` must load without torch.
"""

import importlib
import importlib.abc
import importlib.util
import sys

__version__ = "0.1.0"

# The documented import paths (docs/api.md, the README's "Library API") of modules that moved into subpackages:
# `import rlcompare.losses` is the module rlcompare.algos.losses itself (one object, so monkeypatching either name
# patches both). No file stands at an old path, so that git's rename detection carries edits made to the old files
# on other branches into the moved ones. Code inside rlcompare imports the new paths (tests/test_layers.py).
MOVED = {
    "rlcompare.advantages": "rlcompare.algos.advantages",
    "rlcompare.losses": "rlcompare.algos.losses",
    "rlcompare.verifiers": "rlcompare.rewards.verifiers",
    "rlcompare.countdown_expr": "rlcompare.rewards.countdown_expr",
    "rlcompare.stats": "rlcompare.report.stats",
    "rlcompare.compute_fit": "rlcompare.report.compute_fit",
}
_SPECS: dict = {}


class _MovedModules(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Imports an old path in MOVED as the module at its new path."""

    def find_spec(self, name, path=None, target=None):
        return importlib.util.spec_from_loader(name, self) if name in MOVED else None

    def create_module(self, spec):
        module = importlib.import_module(MOVED[spec.name])
        _SPECS[spec.name] = module.__spec__  # the import system sets the alias's spec on the module next
        return module

    def exec_module(self, module):
        module.__spec__ = _SPECS.pop(module.__spec__.name)  # executed under its new name already; keep its own spec


if not any(type(f).__name__ == "_MovedModules" for f in sys.meta_path):
    sys.meta_path.insert(0, _MovedModules())  # first: an old path is this alias, whatever else is on sys.path
