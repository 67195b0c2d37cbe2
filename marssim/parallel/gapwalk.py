"""The walk behind the parallel report's exposed-time attribution (:mod:`.report`): from the end
of each idle gap of a GPU's compute stream back along the predecessors that ended last, each
second of the gap charged to what it waited for (a collective's group, a pipeline transfer, or
the pipeline bubble).

One loop of scalar steps per gap (hundreds of thousands of gaps on the largest runs), so it is
compiled with numba where numba is installed (``MARSSIM_NO_NUMBA=1``: plain Python, the same
floats: the same additions in the same order). Units: seconds.
"""

from __future__ import annotations

import os

import numpy as np

__all__ = ["walk_gaps"]

_EPS = 1e-15  # s: a gap or a remainder shorter than this is none


def _walk(gap_lo: np.ndarray, gap_hi: np.ndarray, first: np.ndarray, start: np.ndarray, end: np.ndarray,
          is_compute: np.ndarray, collective: np.ndarray, code: np.ndarray, latest: np.ndarray, sums: np.ndarray,
          bubble: int) -> None:
    for k in range(len(gap_lo)):
        lo = gap_lo[k]
        cursor = gap_hi[k]
        p = first[k]
        guard = 0
        while cursor > lo + _EPS and guard < 10_000:
            guard += 1
            if p < 0:
                sums[bubble] += cursor - lo
                break
            e = end[p]
            if e < cursor - _EPS:  # the last predecessor ended before: nothing to wait for in between
                edge = max(lo, e)
                sums[bubble] += cursor - edge
                cursor = edge
                if cursor <= lo + _EPS:
                    break
            if is_compute[p]:  # another GPU's kernel: from here back, the wait is the pipeline's
                sums[bubble] += cursor - lo
                break
            s = start[p]
            seg_start = max(lo, s)
            sums[code[collective[p]]] += cursor - seg_start  # a collective's group (-1: the last code)
            cursor = seg_start
            p = latest[p]


_COMPILED = None


def _kernel():
    global _COMPILED
    if _COMPILED is None:
        _COMPILED = _walk
        if os.environ.get("MARSSIM_NO_NUMBA", "") in ("", "0"):
            try:
                from numba import njit
            except ImportError:
                pass
            else:
                _COMPILED = njit(cache=True)(_walk)
    return _COMPILED


def walk_gaps(gap_lo: np.ndarray, gap_hi: np.ndarray, first: np.ndarray, start: np.ndarray, end: np.ndarray,
              is_compute: np.ndarray, collective: np.ndarray, code: np.ndarray, latest: np.ndarray,
              sums: np.ndarray, bubble: int) -> None:
    """Charge each gap ``gap_lo[k]..gap_hi[k]`` (s) of one compute stream, gap by gap: from its end
    back along ``first[k]`` (the task it waited for last, -1: none), then each transfer's own
    ``latest`` predecessor, ``cursor - max(lo, start)`` of each transfer ``p`` to
    ``sums[code[collective[p]]]`` (``code``: a category per collective, then one for the
    transfers of none, index -1), the rest (no predecessor, time between predecessors, another
    GPU's kernel) to ``sums[bubble]``. ``start``, ``end``: per task (s); ``is_compute``,
    ``collective``, ``latest``: per task. Adds into ``sums`` in place."""
    _kernel()(np.ascontiguousarray(gap_lo, dtype=np.float64), np.ascontiguousarray(gap_hi, dtype=np.float64),
              np.ascontiguousarray(first, dtype=np.int64), np.ascontiguousarray(start, dtype=np.float64),
              np.ascontiguousarray(end, dtype=np.float64), np.ascontiguousarray(is_compute, dtype=np.bool_),
              np.ascontiguousarray(collective, dtype=np.int32), np.ascontiguousarray(code, dtype=np.int64),
              np.ascontiguousarray(latest, dtype=np.int64), sums, int(bubble))
