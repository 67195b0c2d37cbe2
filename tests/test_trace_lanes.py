"""Greedy interval partitioning into lanes, against brute force."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from marssim.trace import assign_lanes


def _occupied(s, e, min_length):
    return s, max(e, s + min_length)


def _depth(starts, ends, min_length):
    """Brute force: the most intervals covering one instant (checked at every start)."""
    spans = [_occupied(s, e, min_length) for s, e in zip(starts, ends)]
    return max((sum(1 for a, b in spans if a <= t < b) for t, _ in spans), default=0)


intervals = st.lists(st.tuples(st.integers(0, 60), st.integers(0, 25)), max_size=60).map(
    lambda pairs: ([s for s, _ in pairs], [s + d for s, d in pairs]))


@settings(max_examples=200, deadline=None)
@given(intervals, st.sampled_from([0, 1]))
def test_no_overlap_on_a_lane_and_fewest_lanes(case, min_length):
    starts, ends = case
    lanes = assign_lanes(np.asarray(starts), np.asarray(ends), min_length=min_length)
    spans = [_occupied(s, e, min_length) for s, e in zip(starts, ends)]
    for i in range(len(spans)):
        for j in range(i + 1, len(spans)):
            if lanes[i] == lanes[j]:
                (a, b), (c, d) = spans[i], spans[j]
                assert b <= c or d <= a, (spans[i], spans[j])
    n_lanes = int(lanes.max()) + 1 if len(lanes) else 0
    if min_length > 0 or all(e > s for s, e in zip(starts, ends)):
        # the fewest lanes possible: as many as intervals overlap at one instant
        assert n_lanes == _depth(starts, ends, min_length)
    assert set(lanes.tolist()) == set(range(n_lanes))  # lanes are numbered densely from 0


def test_back_to_back_intervals_share_a_lane_and_empty_ones_at_one_instant_do_not():
    assert assign_lanes(np.array([0, 5, 9]), np.array([5, 9, 12]), min_length=1).tolist() == [0, 0, 0]
    assert assign_lanes(np.array([3, 3]), np.array([3, 3]), min_length=1).tolist() == [0, 1]
    assert assign_lanes(np.array([3, 3]), np.array([3, 3]), min_length=0).tolist() == [0, 0]


def test_lowest_free_lane_is_reused_and_result_is_deterministic():
    starts = np.array([0, 0, 0, 4, 6])
    ends = np.array([10, 5, 6, 8, 7])
    # by hand: at t=0 the earliest-ending take lanes 0, 1, 2 (ends 5, 6, 10); at t=4 all are
    # busy -> lane 3; at t=6 lanes 0 (free since 5) and 1 (since 6) are free -> the lowest, 0
    lanes = assign_lanes(starts, ends)
    assert lanes.tolist() == [2, 0, 1, 3, 0]
    perm = np.array([4, 2, 0, 3, 1])
    assert assign_lanes(starts[perm], ends[perm]).tolist() == lanes[perm].tolist()


def test_bad_shapes_are_rejected():
    with pytest.raises(ValueError):
        assign_lanes(np.zeros(3), np.zeros(2))
