"""The sampler and its decoders (`sampler.py`); the preallocated-cache decoder is a fast path (`rlcompare.fast`).

`from rlcompare.rollout import sample, ...` keeps working: every public name of `sampler.py` is re-exported here
(the module was `rlcompare/rollout.py`).
"""

from rlcompare.rollout.sampler import *  # noqa: F401,F403 - the old import path
