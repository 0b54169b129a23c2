"""The run's config: the typed schema and its validation (`schema.py`), nested keys as flat dotted ones (`flat.py`).

`from rlcompare.config import validate, ConfigError, ...` keeps working: every public name of `schema.py` is
re-exported here (the module was `rlcompare/config.py`).
"""

from rlcompare.config.schema import *  # noqa: F401,F403 - the documented import path (rlcompare.config.validate)
from rlcompare.config import schema as _schema


def __getattr__(name: str):
    if name in _schema._DERIVED:  # ESTIMATORS, SCALES: derived from the estimators' specs on access
        return getattr(_schema, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
