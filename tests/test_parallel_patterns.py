"""Communication pattern names (marssim/parallel/patterns.py): a pattern is its name, so maps keyed
by patterns order and hash as before; its group and step are read from it."""

from __future__ import annotations

import pytest

from marssim.parallel import parse_parallel
from marssim.parallel.patterns import PULL_NEXT, PULL_PREV, PULLS, TP_RING, Pattern, ep_peer
from marssim.parallel.placement import direct_patterns, place
from marssim.system import load_system


@pytest.mark.parametrize("group, step, name", [("tp", 1, "tp+1"), ("ep", 7, "ep+7"), ("pull", -1, "pull-1"),
                                               ("edp", 1, "edp+1"), ("ep", 12, "ep+12")])
def test_a_pattern_is_its_name_and_reads_back_its_group_and_step(group, step, name):
    p = Pattern.of(group, step)
    assert p == name and hash(p) == hash(name) and isinstance(p, str)
    assert (p.group, p.step) == (group, step)
    assert {name: 1}[p] == 1 and {p: 1}[name] == 1


def test_the_named_patterns():
    assert (TP_RING, PULL_NEXT, PULL_PREV) == ("tp+1", "pull+1", "pull-1")
    assert PULLS == ("pull+1", "pull-1")
    assert sorted([ep_peer(2), ep_peer(10), TP_RING]) == sorted(["ep+2", "ep+10", "tp+1"])  # as strings


def test_a_placements_patterns_and_its_direct_ones():
    """Every pattern a placement names reads back as a group and a step; the direct ones are
    the expert-parallel peers ep+1 .. ep+(ep-1)."""
    system = load_system("dgx-a100-cluster:nodes=2")
    where = place(system, parse_parallel("tp=2,pp=2,dp=4,ep=4,global_batch=8"))
    patterns = where.patterns()
    assert {TP_RING, "dp+1", PULL_NEXT, PULL_PREV} <= set(patterns)
    for name in patterns:
        p = Pattern(name)
        assert Pattern.of(p.group, p.step) == name
    assert sorted(direct_patterns(patterns)) == sorted(f"ep+{k}" for k in range(1, 4))
