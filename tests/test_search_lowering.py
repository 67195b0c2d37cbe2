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


@pytest.mark.parametrize("graph", [two_models(batch=8), load_workload("resnet50:batch=4")], ids=lambda g: g.name)
def test_copied_micro_batches_equal_lowered_ones(graph):
    """Micro-batches after the first are copied from it when every op splits evenly; lowering
    each one instead gives the same TaskGraph (uneven splits are always lowered one by one)."""
    from marssim.lower import _Lowering

    sys_, cost = system(4), RooflineCost()
    space = MappingSpace(graph, sys_, micro_batch_choices=(2, 3, 4))
    rng = np.random.default_rng(11)
    mappings = [space.decode(space.random(rng)) for _ in range(10)]
    assert {m.micro_batches for m in mappings} >= {2, 4}
    for m in mappings:
        copied = lower(graph, sys_, m, cost)
        lowered = _Lowering(graph, sys_, m, cost, LoweringCache(graph, sys_, cost), repeat=False).run()
        assert_same_taskgraph(copied, lowered)
        assert set(copied.micro_batch.tolist()) == set(range(m.micro_batches))


def test_repeat_tail_copies_a_period_by_hand():
    """Three periods added one by one equal one period and two copies: compute ``a`` (after
    the previous period's transfer), transfer ``x`` of a collective (after ``a``), compute
    ``b`` (after ``x``)."""
    from marssim.taskgraph import Collective, TaskGraphBuilder

    sys_ = system(2)

    def period(builder, k, prev_x):
        a = builder.compute("acc0", 1.0 + k, preds=prev_x, priority=10 * k, op="a", micro_batch=k, out_bytes=8)
        c = builder.add_collective(Collective("p2p", "direct", ("acc0", "acc1"), 8.0, "x", 1))
        x = builder.transfer("acc0", "acc1", 8.0, preds=[a], collective=c, op="x", micro_batch=k)
        builder.compute("acc1", 2.0, preds=[x], priority=10 * k + 1, op="b", micro_batch=k)
        return [x]

    by_hand = TaskGraphBuilder(sys_)
    prev: list[int] = []
    for k in range(3):
        prev = period(by_hand, k, prev)
    copied = TaskGraphBuilder(sys_)
    x0 = period(copied, 0, [])
    copied.repeat_tail(0, 2, priority_step=10, collectives_from=0, carried={0: x0})
    want, got = by_hand.build(), copied.build()
    # durations are per period in the hand-built graph: the copy repeats period 0's
    assert np.array_equal(want.duration[[0, 3, 6]], [1.0, 2.0, 3.0])
    assert np.array_equal(got.duration[[0, 3, 6]], [1.0, 1.0, 1.0])
    for name in COLUMNS:
        if name != "duration":
            assert np.array_equal(getattr(want, name), getattr(got, name), equal_nan=name == "energy"), name
    assert want.collectives == got.collectives and len(got) == 9


def test_a_ring_all_gather_waits_as_the_schedule_says():
    """Ring all-gather on three ranks, worked out by hand: step 0 sends 0->1, 1->2, 2->0 (tasks
    0-2); step 1 the same (tasks 3-5), each send after the rank's initial data, its receive and
    its send of step 0."""
    from marssim.lower import expand_collective
    from marssim.taskgraph import TaskGraphBuilder

    sys_ = system(3)
    b = TaskGraphBuilder(sys_)
    init = [b.compute(f"acc{i}", 1.0) for i in range(3)]  # tasks 0-2
    steps = [[(0, 1, 1.0), (1, 2, 2.0), (2, 0, 3.0)], [(0, 1, 3.0), (1, 2, 1.0), (2, 0, 0.0)]]
    ready = expand_collective(b, "all_gather", "ring", ("acc0", "acc1", "acc2"), steps, [(t,) for t in init], 6.0)
    tg = b.build()
    assert tg.n_tasks == 3 + 5  # the zero-byte flow 2->0 of step 1 is skipped
    assert [tuple(tg.preds(t)) for t in range(3, 8)] == [(0,), (1,), (2,), (0, 5, 3), (1, 3, 4)]
    assert tg.nbytes[3:].tolist() == [1.0, 2.0, 3.0, 3.0, 1.0]
    # ready: initial data, last receives, last sends (rank 2 sent nothing in step 1: its step-0 send)
    assert ready == [(0, 5, 6), (1, 6, 7), (2, 7, 5)]


def test_a_cache_cleared_between_lowerings_changes_no_taskgraph():
    """A cache small enough to be cleared before most lowerings (its numbered signatures
    included) still gives the TaskGraph a fresh lowering gives."""
    graph, sys_, cost = load_workload("resnet50:batch=2"), system(4), RooflineCost()
    space = MappingSpace(graph, sys_)
    rng = np.random.default_rng(3)
    mappings = [space.decode(space.random(rng)) for _ in range(6)]
    cache = LoweringCache(graph, sys_, cost, limit=80)
    for m in mappings + mappings[:2]:
        assert_same_taskgraph(lower(graph, sys_, m, cost, cache=cache), lower(graph, sys_, m, cost))
        assert len(cache.pieces) + len(cache.shards) > 0
