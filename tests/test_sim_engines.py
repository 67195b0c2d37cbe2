"""The compiled engine (numba) against the SimPy engine: the same Result to the last bit (every
interval, memory peak and timeline row, link timeline and busy second, the event and recompute
counts) on random task graphs (priorities, several streams, stepped transfers, zero-latency and
empty transfers, contention), folded parallel lowerings, and the same CapacityError."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from marssim.errors import CapacityError
from marssim.progress import SimulationProgress
from marssim.sim import simulate, simulate_summary
from marssim.sim.fast import available
from marssim.taskgraph import TaskGraphBuilder
from support import make_system

pytestmark = pytest.mark.skipif(not available(), reason="the compiled engine needs numba")

SYSTEMS = {
    (n, lat): make_system(n, topology="ring", bandwidth="20 GB/s", latency=lat, memory_bandwidth="30 GB/s",
                          capacity="64 MiB")
    for n in (2, 3, 5) for lat in ("0.5 us", "0 us")
}


def _same(a, b) -> None:
    """Two Results are equal in every table and figure."""
    assert a.makespan == b.makespan
    pd.testing.assert_frame_equal(a.intervals, b.intervals)
    pd.testing.assert_frame_equal(a.memories, b.memories)
    pd.testing.assert_frame_equal(a.memory_timeline, b.memory_timeline)
    pd.testing.assert_frame_equal(a.link_timeline, b.link_timeline)
    pd.testing.assert_frame_equal(a.links, b.links)
    pd.testing.assert_frame_equal(a.devices, b.devices)
    assert a.throughput == b.throughput or (a.throughput != a.throughput and b.throughput != b.throughput)
    for key in ("events", "network_recomputes", "tasks"):
        assert a.meta[key] == b.meta[key]


@st.composite
def task_graphs(draw):
    key = draw(st.sampled_from(sorted(SYSTEMS)))
    system = SYSTEMS[key]
    n_dev = key[0]
    b = TaskGraphBuilder(system)
    n_tasks = draw(st.integers(1, 40))
    kinds = []
    for t in range(n_tasks):
        preds = draw(st.lists(st.integers(0, t - 1), max_size=3, unique=True)) if t else []
        if draw(st.booleans()):
            dev = draw(st.integers(0, n_dev - 1))
            b.compute(f"acc{dev}", draw(st.sampled_from([0.0, 1e-6, 2e-6, draw(st.floats(0, 1e-4))])), preds=preds,
                      out_bytes=draw(st.integers(0, 10**6)), priority=draw(st.integers(0, 5)))
            kinds.append(0)
        else:
            src = draw(st.integers(0, n_dev - 1))
            dst = (src + draw(st.integers(1, n_dev - 1))) % n_dev
            b.transfer(f"acc{src}", f"acc{dst}", float(draw(st.sampled_from([0, 10**5, draw(st.integers(0, 5 * 10**6))]))),
                       preds=preds, hold=draw(st.booleans()))
            kinds.append(1)
    tg = b.build()
    if draw(st.booleans()):  # some transfers as several back-to-back steps
        steps = np.asarray([draw(st.integers(1, 3)) if k else 1 for k in kinds], dtype=np.int32)
        tg = replace(tg, steps=steps)
    return tg, system, draw(st.integers(1, 2)), draw(st.booleans())


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(task_graphs())
def test_compiled_engine_equals_simpy_on_random_task_graphs(case):
    tg, system, streams, record = case
    a = simulate(tg, system, setup=False, streams=streams, record=record, memory_policy="ignore", engine="simpy")
    b = simulate(tg, system, setup=False, streams=streams, record=record, memory_policy="ignore", engine="compiled")
    _same(a, b)
    sa = simulate_summary(tg, system, streams=streams, memory_policy="ignore", engine="simpy")
    sb = simulate_summary(tg, system, streams=streams, memory_policy="ignore", engine="compiled")
    assert sa == sb or (sa.makespan == sb.makespan and sa.throughput != sa.throughput)


@pytest.mark.parametrize("config,folding", [("tp=4,pp=2,dp=2,global_batch=8", True),
                                            ("tp=4,pp=2,dp=2,global_batch=8", False),
                                            ("tp=2,pp=2,dp=4,schedule=interleaved,virtual_stages=2,sp=true,zero=1,"
                                             "global_batch=8", True)])
def test_compiled_engine_equals_simpy_on_folded_parallel_runs(config, folding):
    """An oversubscribed fabric (the rings and pipeline transfers contend), folded routes with
    weights, rings of several steps in one transfer."""
    from marssim.cost import default_cost_model
    from marssim.parallel import lower_parallel, parse_parallel
    from marssim.workload import load_workload

    from support import small_gpu_cluster

    system = small_gpu_cluster(nodes=4, per_leaf=1, gpus=4, oversubscription=4.0)
    graph = load_workload("gpt:layers=4,hidden=512,heads=8,vocab=1000,seq=128,mode=train,max_positions=128")
    tg = lower_parallel(graph, system, parse_parallel(config), default_cost_model(), folding=folding)
    for record in (True, False):
        _same(simulate(tg, system, record=record, engine="simpy"), simulate(tg, system, record=record,
                                                                             engine="compiled"))


def test_both_engines_raise_the_same_capacity_error():
    system = make_system(2, topology="chain", capacity="1 MiB", bandwidth="10 GB/s")
    b = TaskGraphBuilder(system)
    a = b.compute("acc0", 1e-6, out_bytes=600 * 1024)
    b.compute("acc0", 1e-6, out_bytes=600 * 1024)
    b.transfer("acc0", "acc1", 2.0**20, preds=[a])
    tg = b.build()
    errors = []
    for engine in ("simpy", "compiled"):
        with pytest.raises(CapacityError) as info:
            simulate(tg, system, engine=engine)
        e = info.value
        errors.append((e.device, e.time_s, e.peak_bytes, e.capacity_bytes, e.detail))
    assert errors[0] == errors[1]


def test_progress_is_reported_to_the_end_by_both_engines():
    system = SYSTEMS[(3, "0.5 us")]
    b = TaskGraphBuilder(system)
    prev = []
    for i in range(200):
        t = b.compute(f"acc{i % 3}", 1e-6, preds=prev)
        prev = [b.transfer(f"acc{i % 3}", f"acc{(i + 1) % 3}", 1e5, preds=[t])]
    tg = b.build()
    for engine in ("simpy", "compiled"):
        calls: list[SimulationProgress] = []
        r = simulate(tg, system, engine=engine, progress=calls.append)
        assert calls, engine
        assert all(type(c) is SimulationProgress for c in calls), engine
        done = [c.tasks_done for c in calls]
        assert done == sorted(done) and done[-1] == calls[-1].tasks == tg.n_tasks
        assert calls[-1].time_s == pytest.approx(r.makespan, rel=1e-12)


def test_the_spill_policy_runs_on_simpy_and_the_compiled_engine_says_so():
    system = make_system(2, topology="chain")
    b = TaskGraphBuilder(system)
    b.compute("acc0", 1e-6)
    tg = b.build()
    assert simulate(tg, system, memory_policy="spill").makespan == pytest.approx(1e-6)
    with pytest.raises(RuntimeError, match="spill"):
        simulate(tg, system, memory_policy="spill", engine="compiled")
