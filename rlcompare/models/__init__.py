"""Models: build/load the policy and tokenizer, the reference, the critic, the warm start (`load.py`; the shipped
warm start is in `warmstart/`).

`from rlcompare.models import ...` keeps working: every public name of `load.py` is re-exported here (the module
was `rlcompare/models.py`). Monkeypatch `rlcompare.models.load`, where the names are used.
"""

from rlcompare.models.load import *  # noqa: F401,F403 - the old import path
