"""Invariants of the simulator on random task graphs (hypothesis), and the memory policies."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from marssim.errors import CapacityError
from marssim.sim import simulate
from marssim.taskgraph import TaskGraphBuilder
from support import make_system

SYSTEMS = {n: make_system(n, topology="ring", bandwidth="20 GB/s", latency="0.5 us", memory_bandwidth="30 GB/s")
           for n in (2, 3, 5)}


@st.composite
def task_graphs(draw):
    n_dev = draw(st.sampled_from(sorted(SYSTEMS)))
    system = SYSTEMS[n_dev]
    b = TaskGraphBuilder(system)
    n_tasks = draw(st.integers(1, 40))
    for t in range(n_tasks):
        preds = draw(st.lists(st.integers(0, t - 1), max_size=3, unique=True)) if t else []
        if draw(st.booleans()):
            dev = draw(st.integers(0, n_dev - 1))
            b.compute(f"acc{dev}", draw(st.floats(0, 1e-4)), preds=preds, out_bytes=draw(st.integers(0, 10**6)),
                      priority=draw(st.integers(0, 5)))
        else:
            src = draw(st.integers(0, n_dev - 1))
            dst = (src + draw(st.integers(1, n_dev - 1))) % n_dev
            b.transfer(f"acc{src}", f"acc{dst}", float(draw(st.integers(0, 5 * 10**6))), preds=preds)
    return b.build(), system


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(task_graphs())
def test_random_task_graph_invariants(case):
    tg, system = case
    r = simulate(tg, system, setup=False)
    log = r.intervals.set_index("task").sort_index()
    start = log["start"].to_numpy()
    end = log["end"].to_numpy()
    # 1. no task starts before all its predecessors end
    for t in range(tg.n_tasks):
        for p in tg.preds(t):
            assert start[t] >= end[p] - 1e-15
    # 2. compute intervals last exactly their duration; transfers are never faster than alone
    compute = tg.kind == 0
    assert np.allclose((end - start)[compute], tg.duration[compute], rtol=1e-12, atol=1e-18)
    for t in np.flatnonzero(~compute):
        route = tg.routes[tg.route[t]]
        fastest = route.latency + tg.nbytes[t] / system.resource_capacity[list(route.resources)].min()
        assert end[t] - start[t] >= fastest * (1 - 1e-9)
    # 3. no resource carries more than its bandwidth at any instant
    cap = dict(zip(system.resource_names, system.resource_capacity))
    for row in r.link_timeline.itertuples():
        assert row.rate <= cap[row.resource] * (1 + 1e-9)
    # 4. bytes sent = bytes received, per node, as seen by the memory ports
    sent = log[log.kind == "transfer"].groupby("src")["bytes"].sum()
    received = log[log.kind == "transfer"].groupby("dst")["bytes"].sum()
    for node in system.accelerator_ids:
        port = r.links.loc[f"{node}:mem", "bytes"]
        assert port == pytest.approx(sent.get(node, 0.0) + received.get(node, 0.0), rel=1e-12, abs=1e-6)
    assert sent.sum() == pytest.approx(received.sum())
    # 5. memory: never above capacity, never negative, back to the resident weights at the end
    for node, grp in r.memory_timeline.groupby("node"):
        assert grp["bytes"].max() <= system.memory_capacity(node)
        assert grp["bytes"].min() >= -1e-6
        assert grp["bytes"].iloc[-1] == pytest.approx(tg.resident.get(node, 0.0), abs=1e-6)
    # 6. determinism: the same task graph gives the identical interval log
    again = simulate(tg, system, setup=False)
    assert again.intervals.equals(r.intervals)
    assert again.makespan == r.makespan


def _overflowing_graph():
    system = make_system(2, topology="chain", capacity="1 MiB", bandwidth="10 GB/s")
    b = TaskGraphBuilder(system)
    first = b.compute("acc0", 1e-5, out_bytes=700 * 1024, op="producer")
    second = b.compute("acc0", 1e-5, preds=(first,), out_bytes=700 * 1024, op="consumer")
    b.transfer("acc0", "acc1", 1000.0, preds=(second,))
    return b.build(), system


def test_memory_overflow_error_names_device_time_peak_capacity():
    tg, system = _overflowing_graph()
    with pytest.raises(CapacityError) as info:
        simulate(tg, system)
    err = info.value
    assert err.device == "acc0"
    assert err.capacity_bytes == 1024 * 1024
    assert err.peak_bytes == 1400 * 1024
    assert err.time_s == pytest.approx(1e-5)
    assert "acc0" in str(err) and "consumer" in str(err)


def test_spill_policy_moves_the_buffer_over_the_host_link():
    tg, system = _overflowing_graph()
    r = simulate(tg, system, memory_policy="spill")
    kinds = r.intervals["kind"].value_counts()
    assert kinds.get("spill_out", 0) == 1 and kinds.get("spill_in", 0) == 1
    assert r.memories.loc["acc0", "peak_bytes"] <= 1024 * 1024
    spill = r.intervals[r.intervals.kind.str.startswith("spill")]
    assert (spill["bytes"] == 700 * 1024).all()
    # the spilled output goes to the host after it is produced and comes back before its reader
    out = spill[spill.kind == "spill_out"].iloc[0]
    back = spill[spill.kind == "spill_in"].iloc[0]
    assert out["dst"] == "host0" and back["src"] == "host0"
    reader = r.intervals[(r.intervals.kind == "transfer")].iloc[0]
    assert back["end"] <= reader["start"] + 1e-15



def test_a_spilled_buffer_nobody_reads_is_not_written_to_the_host():
    # a compute output and a received transfer, each larger than its device's memory and read by
    # no task: both spill (placed in host memory), and neither costs a write-back over the host link
    system = make_system(2, topology="chain", capacity="1 MiB", bandwidth="10 GB/s")
    b = TaskGraphBuilder(system)
    b.compute("acc0", 1e-5, out_bytes=2 * 1024 * 1024, op="unread-output")
    b.transfer("acc0", "acc1", 2.0 * 1024 * 1024, op="unread-transfer")
    r = simulate(b.build(), system, memory_policy="spill")
    assert r.meta["spills"] == 0
    assert set(r.intervals["kind"]) == {"compute", "transfer"}
    assert r.makespan == pytest.approx(max(1e-5, r.intervals.loc[r.intervals.kind == "transfer", "end"].max()))

def test_weights_that_do_not_fit_are_rejected_at_the_start():
    system = make_system(1, topology="chain", capacity="1 MiB")
    b = TaskGraphBuilder(system)
    b.compute("acc0", 1e-6)
    b.resident["acc0"] = 2 * 1024 * 1024
    with pytest.raises(CapacityError, match="acc0"):
        simulate(b.build(), system)


def test_two_streams_run_independent_tasks_concurrently():
    system = make_system(1, topology="chain")
    b = TaskGraphBuilder(system)
    for _ in range(4):
        b.compute("acc0", 1e-3)
    assert simulate(b.build(), system, streams=1).makespan == pytest.approx(4e-3)
    r2 = simulate(b.build(), system, streams=2)
    assert r2.makespan == pytest.approx(2e-3)
    assert r2.devices.loc["acc0", "busy_s"] == pytest.approx(2e-3)
