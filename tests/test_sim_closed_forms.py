"""The simulator against closed forms: transfers, fair sharing, collectives, chains, pipelines."""

from __future__ import annotations

import math

import pytest

from marssim.lower import expand_collective
from marssim.collectives.schedules import schedule
from marssim.sim import max_min_rates, simulate
from marssim.system import system_from_dict
from marssim.taskgraph import TaskGraphBuilder
from support import make_system

GB = 1e9


def _sim(b: TaskGraphBuilder):
    return simulate(b.build(), b.system, setup=False)


def test_one_transfer_is_latency_plus_serialisation():
    system = make_system(2, topology="chain", bandwidth="50 GB/s", latency="2 us")
    b = TaskGraphBuilder(system)
    b.transfer("acc0", "acc1", 1e6)
    r = _sim(b)
    assert math.isclose(r.makespan, 2e-6 + 1e6 / (50 * GB), rel_tol=1e-12)


def test_multi_hop_route_latency_and_bottleneck():
    system = make_system(3, topology="chain", bandwidth="40 GB/s", latency="1 us")
    b = TaskGraphBuilder(system)
    b.transfer("acc0", "acc2", 4e6)
    r = _sim(b)
    assert math.isclose(r.makespan, 2e-6 + 4e6 / (40 * GB), rel_tol=1e-12)


@pytest.mark.parametrize("k", [1, 2, 3, 7])
def test_k_flows_on_one_link_share_it(k):
    system = make_system(2, topology="chain", bandwidth="25 GB/s", latency="0 s")
    b = TaskGraphBuilder(system)
    size = 3e6
    for _ in range(k):
        b.transfer("acc0", "acc1", size)
    r = _sim(b)
    ends = r.intervals["end"].to_numpy()
    assert all(math.isclose(e, k * size / (25 * GB), rel_tol=1e-12) for e in ends)


def test_unequal_flows_finish_in_processor_sharing_order():
    # Two flows on one link: the small one finishes at 2*s/B, the big one at (s + L)/B.
    system = make_system(2, topology="chain", bandwidth="10 GB/s", latency="0 s")
    b = TaskGraphBuilder(system)
    small, large = 1e6, 5e6
    t_small = b.transfer("acc0", "acc1", small)
    t_large = b.transfer("acc0", "acc1", large)
    r = _sim(b).intervals.set_index("task")
    assert math.isclose(r.loc[t_small, "end"], 2 * small / (10 * GB), rel_tol=1e-12)
    assert math.isclose(r.loc[t_large, "end"], (small + large) / (10 * GB), rel_tol=1e-12)


def test_parking_lot_max_min_rates():
    # Links L0 (cap 1) and L1 (cap 2); flow A crosses both, B only L0, C only L1.
    rates = max_min_rates([(0, 1), (0,), (1,)], [1.0, 2.0])
    assert rates == pytest.approx([0.5, 0.5, 1.5], rel=1e-15)
    # Every resource is saturated or all its flows are limited elsewhere (max-min optimality).
    assert rates[0] + rates[1] == pytest.approx(1.0)


def test_parking_lot_in_simulation():
    # chain acc0 - acc1 - acc2; A: acc0->acc2, B: acc0->acc1, C: acc1->acc2; all links 10 GB/s.
    system = make_system(3, topology="chain", bandwidth="10 GB/s", latency="0 s")
    b = TaskGraphBuilder(system)
    s = 2e6
    a = b.transfer("acc0", "acc2", s)
    bb = b.transfer("acc0", "acc1", s)
    c = b.transfer("acc1", "acc2", s)
    r = _sim(b).intervals.set_index("task")
    # Each link carries two flows at 5 GB/s each: all three finish at 2s/B together.
    for t in (a, bb, c):
        assert math.isclose(r.loc[t, "end"], 2 * s / (10 * GB), rel_tol=1e-12)


def test_switch_latency_and_backplane_limit():
    system = make_system(4, topology="switch", bandwidth="100 GB/s", latency="1 us", switch_latency="500 ns",
                         backplane="100 GB/s")
    b = TaskGraphBuilder(system)
    s = 1e6
    b.transfer("acc0", "acc1", s)
    b.transfer("acc2", "acc3", s)
    r = _sim(b)
    # Two disjoint port pairs, but one 100 GB/s backplane: each flow gets 50 GB/s.
    assert math.isclose(r.makespan, 2e-6 + 0.5e-6 + s / (50 * GB), rel_tol=1e-12)


@pytest.mark.parametrize("n", [2, 3, 4, 8])
def test_ring_all_reduce_closed_form(n):
    alpha, bw, size = 1e-6, 50 * GB, 8e6
    system = make_system(n, topology="ring", bandwidth="50 GB/s", latency="1 us")
    b = TaskGraphBuilder(system)
    devices = tuple(f"acc{i}" for i in range(n))
    steps = schedule("all_reduce", "ring", [size / n] * n)
    expand_collective(b, "all_reduce", "ring", devices, steps, [()] * n, size)
    r = _sim(b)
    assert len(steps) == 2 * (n - 1)
    assert math.isclose(r.makespan, 2 * (n - 1) * (alpha + size / (n * bw)), rel_tol=1e-9)


@pytest.mark.parametrize("n", [4, 8])
def test_halving_doubling_all_reduce_on_a_switch(n):
    # Non-blocking switch: each step k moves S/2^(k+1) (reduce-scatter) then doubles back.
    alpha, bw, size = 1e-6, 100 * GB, 16e6
    system = make_system(n, topology="switch", bandwidth="100 GB/s", latency="0.5 us")
    b = TaskGraphBuilder(system)
    devices = tuple(f"acc{i}" for i in range(n))
    steps = schedule("all_reduce", "halving_doubling", [size / n] * n)
    expand_collective(b, "all_reduce", "halving_doubling", devices, steps, [()] * n, size)
    r = _sim(b)
    logn = int(math.log2(n))
    expected = 2 * logn * alpha + 2 * sum(size / 2 ** (k + 1) for k in range(logn)) / bw
    assert len(steps) == 2 * logn
    assert math.isclose(r.makespan, expected, rel_tol=1e-9)


def test_chain_of_compute_sums_exactly():
    system = make_system(1, topology="chain")
    b = TaskGraphBuilder(system)
    durations = [1.5e-6, 2.25e-5, 3e-7, 4.125e-6, 1e-3]
    prev = ()
    for d in durations:
        prev = (b.compute("acc0", d, preds=prev),)
    r = _sim(b)
    assert r.makespan == pytest.approx(sum(durations), rel=1e-15)
    assert r.devices.loc["acc0", "busy_s"] == pytest.approx(sum(durations), rel=1e-15)


@pytest.mark.parametrize("stages,micro", [(2, 1), (3, 4), (4, 8), (5, 3)])
def test_pipeline_of_equal_stages(stages, micro):
    system = make_system(stages, topology="chain")
    b = TaskGraphBuilder(system)
    t_stage = 1e-4
    for m in range(micro):
        prev = ()
        for s in range(stages):
            prev = (b.compute(f"acc{s}", t_stage, preds=prev, priority=m, micro_batch=m),)
    r = _sim(b)
    assert math.isclose(r.makespan, (stages + micro - 1) * t_stage, rel_tol=1e-12)


def test_compute_overlaps_communication():
    # A device sends a buffer while computing something independent: no serialisation between them.
    system = make_system(2, topology="chain", bandwidth="1 GB/s", latency="0 s")
    b = TaskGraphBuilder(system)
    first = b.compute("acc0", 1e-3)
    b.transfer("acc0", "acc1", 1e6, preds=(first,))  # 1 ms
    b.compute("acc0", 1e-3, preds=(first,))
    r = _sim(b)
    assert math.isclose(r.makespan, 2e-3, rel_tol=1e-12)


def test_memory_bandwidth_limits_transfers_touching_it():
    system = make_system(3, topology="full", bandwidth="100 GB/s", latency="0 s", memory_bandwidth="60 GB/s")
    b = TaskGraphBuilder(system)
    b.transfer("acc0", "acc1", 6e6)
    b.transfer("acc0", "acc2", 6e6)
    r = _sim(b)
    # Both flows read acc0's memory (60 GB/s shared): 30 GB/s each.
    assert math.isclose(r.makespan, 6e6 / (30 * GB), rel_tol=1e-12)


def test_half_duplex_link_shares_both_directions():
    data = {
        "name": "hd", "designs": {"d": {"dataflow": "os", "pe_rows": 4, "pe_cols": 4, "clock": "1 GHz",
                                         "sram": "1 MiB", "sram_bandwidth": "1 TB/s"}},
        "accelerators": [{"id": "acc[0-1]", "design": "d", "memory": {"capacity": "1 GiB", "bandwidth": "10 TB/s"}}],
        "hosts": [{"id": "h", "dram": {"capacity": "1 GiB", "bandwidth": "1 TB/s"}}],
        "links": [{"between": ["acc0", "acc1"], "bandwidth": "10 GB/s", "duplex": "half"},
                  {"between": ["h", "acc0"], "bandwidth": "10 GB/s"}],
    }
    system = system_from_dict(data, "<hd>")
    b = TaskGraphBuilder(system)
    b.transfer("acc0", "acc1", 1e6)
    b.transfer("acc1", "acc0", 1e6)
    r = _sim(b)
    assert math.isclose(r.makespan, 2e6 / (10 * GB), rel_tol=1e-12)


def test_pipelined_throughput_never_beats_the_busiest_device():
    # Two micro-batches that finish 0.1 s apart on different devices: their finish times alone
    # suggest 4 samples / 0.1 s, but each of acc1 and acc2 works 1 s, so the steady-state rate of
    # a batch of 8 is at most 8 samples per second.
    system = make_system(3, topology="chain")
    b = TaskGraphBuilder(system)
    a0 = b.compute("acc0", 0.1, micro_batch=0)
    a1 = b.compute("acc0", 0.1, micro_batch=1, priority=1)
    b.compute("acc1", 1.0, preds=[a0], micro_batch=0)
    b.compute("acc2", 1.0, preds=[a1], micro_batch=1)
    r = simulate(b.build(batch=8), system, setup=False)
    assert math.isclose(r.makespan, 1.2, rel_tol=1e-12)
    assert math.isclose(r.throughput, 8 / 1.0, rel_tol=1e-12)


@pytest.mark.parametrize("stages,micro", [(2, 4), (3, 6)])
def test_pipelined_throughput_of_equal_stages_is_one_micro_batch_per_stage_time(stages, micro):
    system = make_system(stages, topology="chain")
    b = TaskGraphBuilder(system)
    t = 0.5
    for mb in range(micro):
        prev = None
        for s in range(stages):
            prev = b.compute(f"acc{s}", t, preds=[prev] if prev is not None else [], micro_batch=mb, priority=mb)
    r = simulate(b.build(batch=2 * micro), system, setup=False)
    assert math.isclose(r.throughput, 2 / t, rel_tol=1e-12)  # 2 samples per micro-batch, one every t
