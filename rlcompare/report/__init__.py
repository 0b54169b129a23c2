"""`rlcompare report`: reads results/ only (`build.py`), with the seed statistics (`stats.py`), their simulated
coverage (`coverage.py`) and ScaleRL's compute fit (`compute_fit.py`). Never imports torch.

`from rlcompare.report import build_report, main` keeps working: every public name of `build.py` is re-exported here
(the module was `rlcompare/report.py`); `python -m rlcompare.report` runs `__main__.py`.
"""

from rlcompare.report.build import *  # noqa: F401,F403 - the old import path
from rlcompare.report.build import (  # noqa: F401 - public too, outside its __all__
    ALPHA,
    ComputeFitReport,
    DEFAULT_METRIC,
    DEFAULT_MIN_SEEDS,
    DEFAULT_REPS,
    DIFF_QUANTITIES,
    FIT_BOOT_SHARE_SHOWN,
    FIT_CURVE_POINTS,
    FIT_METRIC,
    FIT_SECONDS,
    NO_DIFFERENCE,
    QUANTITIES,
    RUN_MARKERS,
    Run,
    SKIP_DIRS,
    STEP_MEANS,
    TOKENS,
    TOO_FEW_SEEDS,
    fingerprint_diff,
    load_run,
    strip_seed,
    tokens_to_reach,
    verdict,
)
