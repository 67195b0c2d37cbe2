"""Greedy interval partitioning: put overlapping intervals on separate lanes.

A track of a trace viewer shows one slice at a time, so intervals that overlap in time (flows
sharing a link, compute tasks of a device running several streams) go on separate lanes of
that track. Intervals are taken in order of start time; each goes on the lowest-numbered lane
that is free at its start, opening a new lane when none is. For non-empty intervals (always
the case with ``min_length`` > 0) this uses the fewest lanes possible: the maximum number of
intervals that overlap at one instant. An empty interval with ``min_length`` 0 still needs a
lane free at its instant, so it never lands inside another interval's slice.
"""

from __future__ import annotations

import heapq

import numpy as np

__all__ = ["assign_lanes"]


def assign_lanes(starts, ends, *, min_length: float = 0) -> np.ndarray:
    """Lane (0, 1, ...) of each interval ``[starts[i], ends[i])`` so that no two intervals on one
    lane overlap. Pure and deterministic (ties: earlier end, then lower index, first).

    An interval occupies ``[start, max(end, start + min_length))``: with ``min_length`` > 0 an
    empty interval still owns its instant, so that no two slices on one lane begin together.
    ``starts`` and ``ends`` are numbers in any one unit (integer nanoseconds in traces)."""
    starts = np.asarray(starts)
    ends = np.asarray(ends)
    if starts.shape != ends.shape or starts.ndim != 1:
        raise ValueError("starts and ends must be 1-D arrays of one length")
    n = starts.shape[0]
    lanes = np.zeros(n, dtype=np.int64)
    if n < 2:
        return lanes
    occupied = np.maximum(ends, starts + min_length)
    order = np.lexsort((np.arange(n), occupied, starts))
    s_sorted = starts[order]
    e_sorted = occupied[order]
    # fast path: nothing overlaps (one task at a time on a device, one flow at a time on a link)
    if np.all(s_sorted[1:] >= np.maximum.accumulate(e_sorted)[:-1]):
        return lanes
    busy: list[tuple] = []  # (end, lane) of the interval holding each busy lane
    free: list[int] = []  # lanes free at the current start
    n_lanes = 0
    out = [0] * n
    for k, (s, e) in enumerate(zip(s_sorted.tolist(), e_sorted.tolist())):
        while busy and busy[0][0] <= s:
            heapq.heappush(free, heapq.heappop(busy)[1])
        if free:
            lane = heapq.heappop(free)
        else:
            lane = n_lanes
            n_lanes += 1
        heapq.heappush(busy, (e, lane))
        out[k] = lane
    lanes[order] = out
    return lanes

