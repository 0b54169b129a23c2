"""`rlcompare report`: reads results/ only. `build.py` is the entry (`build_report`, `main`); it reads run folders
(`load.py`), cuts their curves at the comparison point (`curves.py`), checks runs are matched (`matching.py`),
compares variants (`compare.py`, with the seed statistics of `stats.py` and their simulated coverage in
`coverage.py`), wires ScaleRL's compute fit (`fit_section.py`, the math in `compute_fit.py`), draws the plots
(`plots.py`) and writes report.md and the CSVs (`markdown.py`, numbers formatted by `text.py`). Never imports torch.

`from rlcompare.report import build_report, main` keeps working: every public name of `build.py` is re-exported here
(the module was `rlcompare/report.py`); `python -m rlcompare.report` runs `__main__.py`.
"""

from rlcompare.report.build import *  # noqa: F401,F403 - the old import path
from rlcompare.report.compare import (  # noqa: F401 - public too, outside build's __all__
    ALPHA,
    DEFAULT_METRIC,
    DEFAULT_MIN_SEEDS,
    DEFAULT_REPS,
    DIFF_QUANTITIES,
    NO_DIFFERENCE,
    QUANTITIES,
    STEP_MEANS,
    TOO_FEW_SEEDS,
    verdict,
)
from rlcompare.report.curves import tokens_to_reach  # noqa: F401
from rlcompare.report.fit_section import (  # noqa: F401
    FIT_BOOT_SHARE_SHOWN,
    FIT_CURVE_POINTS,
    FIT_METRIC,
    FIT_SECONDS,
    ComputeFitReport,
)
from rlcompare.report.load import RUN_MARKERS, SKIP_DIRS, TOKENS, Run, load_run, strip_seed  # noqa: F401
from rlcompare.report.matching import fingerprint_diff  # noqa: F401
