"""The run's config: the typed schema and its validation (`schema.py`, composing the sections in `sections/`), what
their checks say (`checks.py`), older run folders' configs (`legacy.py`), nested keys as flat dotted ones (`flat.py`).

`from rlcompare.config import validate, ConfigError, ...` keeps working: every public name of `schema.py`, `checks.py`
and the section modules is re-exported here (the module was `rlcompare/config.py`; the sections were in schema.py).
"""

from rlcompare.config.checks import *  # noqa: F401,F403 - the documented import path (rlcompare.config.ConfigError)
from rlcompare.config.sections.prompts import *  # noqa: F401,F403
from rlcompare.config.sections.model import *  # noqa: F401,F403
from rlcompare.config.sections.rollout import *  # noqa: F401,F403
from rlcompare.config.sections.algorithm import *  # noqa: F401,F403
from rlcompare.config.sections.trainer import *  # noqa: F401,F403
from rlcompare.config.sections.evaluation import *  # noqa: F401,F403
from rlcompare.config.schema import *  # noqa: F401,F403 - last: its RANGES is every section's
from rlcompare.config.sections import algorithm as _algorithm

del check  # noqa: F821 - each section's own (sections.<name>.check), not one name here


def __getattr__(name: str):
    if name in _algorithm._DERIVED:  # ESTIMATORS, SCALES: derived from the estimators' specs on access
        return getattr(_algorithm, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
