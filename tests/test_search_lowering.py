"""The search's fast evaluation path changes no result: a lowering cache shared by many lowerings
gives the TaskGraph a fresh lowering gives, array for array."""

from __future__ import annotations

import numpy as np
import pytest

from marssim.lower import LoweringCache, lower
from marssim.mapping import Mapping
from marssim.search.space import MappingSpace
from marssim.sim import simulate
from marssim.workload import load_workload
from test_mapping import GRAPH
from test_search_support import system, two_models
from support import RooflineCost

COLUMNS = ("kind", "device", "duration", "src", "dst", "nbytes", "route", "flops", "energy", "mem_node", "mem_bytes",
           "priority", "op", "micro_batch", "collective", "pred_ptr", "pred_idx")


def assert_same_taskgraph(a, b):
    for name in COLUMNS:
        x, y = getattr(a, name), getattr(b, name)
        assert x.dtype == y.dtype and np.array_equal(x, y, equal_nan=x.dtype.kind == "f"), name
    assert a.routes == b.routes and a.collectives == b.collectives and a.op_names == b.op_names
    assert a.resident == b.resident and a.setup == b.setup and a.meta == b.meta


@pytest.mark.parametrize("graph", [GRAPH, two_models(), load_workload("resnet50:batch=2")], ids=lambda g: g.name)
def test_a_shared_cache_changes_no_taskgraph(graph):
    sys_ = system(4)
    cost = RooflineCost()
    space = MappingSpace(graph, sys_)
    rng = np.random.default_rng(5)
    mappings = [space.decode(space.random(rng)) for _ in range(12)]
    mappings += [Mapping.single_set(graph, sys_, sharding=s) for s in ("dp", ("oc", "dp"), ("ic", "dp"))]
    mappings += mappings[:3]  # again, now with everything cached
    cache = LoweringCache(graph, sys_, cost)
    for m in mappings:
        assert_same_taskgraph(lower(graph, sys_, m, cost, cache=cache), lower(graph, sys_, m, cost))
    assert cache.moves and cache.shards


def test_a_cache_for_other_objects_is_refused():
    graph, sys_, cost = two_models(), system(3), RooflineCost()
    cache = LoweringCache(graph, sys_, cost)
    m = Mapping.single_set(graph, sys_)
    with pytest.raises(ValueError, match="another graph"):
        lower(graph, sys_, m, RooflineCost(), cache=cache)
    assert lower(graph, sys_, m, cache=cache).n_tasks > 0  # the cost model comes with the cache


def test_memory_peaks_are_reported_as_before():
    """Memory pools are plain accounting: the peak of a one-device run is the weights plus the
    largest set of live buffers, computed here by hand from the interval log."""
    graph, sys_, cost = two_models(batch=2), system(2), RooflineCost()
    m = Mapping.single_set(graph, sys_, devices=("acc0",), sharding="none")
    tg = lower(graph, sys_, m, cost)
    r = simulate(tg, sys_, setup=False)
    # replay allocations (start) and frees (when the last successor ends) of acc0's buffers
    node = sys_.node_index["acc0"]
    succ_ptr, succ_idx = tg.successors
    events = []
    for t in range(tg.n_tasks):
        if tg.mem_node[t] == node and tg.mem_bytes[t] > 0:
            readers = succ_idx[succ_ptr[t]:succ_ptr[t + 1]]
            freed = max(r.intervals.set_index("task").loc[list(readers), "end"]) if len(readers) else \
                r.intervals.set_index("task").loc[t, "end"]
            events.append((r.intervals.set_index("task").loc[t, "start"], 1, tg.mem_bytes[t]))
            events.append((freed, 0, -tg.mem_bytes[t]))
    level = peak = tg.resident["acc0"]
    for _, _, delta in sorted(events):
        level += delta
        peak = max(peak, level)
    assert r.memories.loc["acc0", "peak_bytes"] == pytest.approx(peak, rel=1e-12)
    assert r.memories.loc["acc0", "resident_bytes"] == tg.resident["acc0"]
