"""Summaries of repeated kernel timings: median and inter-quartile range (seconds).

Shared by the measurement harness and the SIP tuner; pure numpy.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

__all__ = ["TimingStats", "summarize"]


@dataclass(frozen=True, slots=True)
class TimingStats:
    """Summary of repeated timings (seconds): median, inter-quartile range, min, max, count."""

    median: float
    iqr: float
    minimum: float
    maximum: float
    samples: int

    @property
    def spread(self) -> float:
        """Relative spread: IQR / median."""
        return self.iqr / self.median if self.median else float("nan")


def summarize(times: Sequence[float]) -> TimingStats:
    """Median, IQR (p75 - p25, linear interpolation), min, max and count of ``times``."""
    a = np.asarray(times, dtype=float)
    if a.size == 0:
        raise ValueError("no timings to summarize")
    q1, med, q3 = np.percentile(a, [25, 50, 75])
    return TimingStats(float(med), float(q3 - q1), float(a.min()), float(a.max()), int(a.size))
