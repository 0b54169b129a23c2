"""`rlcompare bench`: the benchmark against TRL's GRPOTrainer (`against_trl.py`).

`from rlcompare.bench import ...` keeps working: every public name of `against_trl.py` is re-exported here (the
module was `rlcompare/bench.py`); `python -m rlcompare.bench` (its worker processes) runs `__main__.py`.
"""

from rlcompare.bench.against_trl import *  # noqa: F401,F403 - the old import path
