"""What a simulation returns when only its summary and task times are asked for."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from marssim.results.summary import Summary

__all__ = ["Schedule"]


@dataclass(frozen=True)
class Schedule:
    """What a search's report needs of a simulation: its :class:`Summary` and every task's start
    and end (s; ``start[t]``, ``end[t]`` as :attr:`Result.intervals` has them)."""

    summary: Summary
    start: np.ndarray
    end: np.ndarray
