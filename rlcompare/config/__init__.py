"""The run's config: the typed schema and its validation (`schema.py`), nested keys as flat dotted ones (`flat.py`).

`from rlcompare.config import validate, ConfigError, ...` keeps working: every public name of `schema.py` is
re-exported here (the module was `rlcompare/config.py`).
"""

from rlcompare.config.schema import *  # noqa: F401,F403 - the documented import path (rlcompare.config.validate)
