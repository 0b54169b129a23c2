"""What every report figure shares: the band drawn around a mean curve (the tables' 95% Student t interval over
seeds, cut to the quantity's range) and how a figure is saved (a PNG, and a vector copy beside it on request)."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from . import stats

FIGURE_FORMATS = ("png", "svg", "pdf")  # --format: png alone, or png and a vector copy
BAND_LABEL = "band = 95% t interval over seeds"  # the tables' interval, drawn at each point of the curve


def seed_band(ys: np.ndarray, lower: float = -math.inf, upper: float = math.inf):
    """(mean, low, high) at each column of ``ys`` (rows: seeds, at least 2): the mean over seeds and its 95%
    Student t interval, as the tables compute it (stats.mean_intervals), cut to [lower, upper]."""
    iv = stats.mean_intervals(np.asarray(ys, dtype=float).T)
    return iv.point, np.clip(iv.low, lower, upper), np.clip(iv.high, lower, upper)


def save(fig, png: Path, figure_format: str = "png") -> str:
    """Write ``fig`` to ``png`` and, for svg or pdf, to the same name with that suffix (vector_copy); the PNG's
    path."""
    fig.savefig(png, dpi=100)
    if figure_format != "png":
        fig.savefig(vector_copy(png, figure_format))
    return str(png)


def vector_copy(png, figure_format: str) -> Path:
    """Where ``save`` writes a PNG's svg or pdf copy: beside it, the same name."""
    return Path(png).with_suffix("." + figure_format)
