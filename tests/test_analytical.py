"""The analytical estimate against closed forms and against the simulator where nothing contends.

Each case is built so that no two flows share a bandwidth resource at once (or share only one that
is not their bottleneck); the estimate must then equal the simulation task by task to rounding."""

from __future__ import annotations

import math

import numpy as np
import pytest

from marssim.analytical import estimate, have_numba, transfer_durations
from marssim.lower import expand_collective, lower
from marssim.mapping import AcceleratorSet, Mapping
from marssim.collectives.schedules import schedule
from marssim.search.evaluate import Problem, estimate_mapping
from marssim.sim import simulate
from marssim.taskgraph import COMPUTE, TaskGraphBuilder
from marssim.workload import GraphBuilder
from support import RooflineCost, make_system

GB = 1e9
REL = 1e-12


def _both(b: TaskGraphBuilder):
    tg = b.build()
    return tg, estimate(tg, b.system), simulate(tg, b.system, record=False, setup=False)


def _assert_same_schedule(tg, est, sim, rel: float = REL) -> None:
    log = sim.intervals.set_index("task").sort_index()
    assert math.isclose(est.makespan, sim.makespan, rel_tol=rel, abs_tol=1e-18)
    scale = max(sim.makespan, 1e-18)
    np.testing.assert_allclose(est.start, log["start"].to_numpy(), rtol=0, atol=rel * scale)
    np.testing.assert_allclose(est.end, log["end"].to_numpy(), rtol=0, atol=rel * scale)
    busy = sim.devices["busy_s"]
    np.testing.assert_allclose(est.devices.loc[busy.index, "busy_s"], busy, rtol=rel, atol=1e-18)


# ---------------------------------------------------------------------- single transfers
def test_one_transfer_is_latency_plus_bytes_over_bottleneck():
    system = make_system(3, topology="chain", bandwidth="40 GB/s", latency="1.5 us")
    b = TaskGraphBuilder(system)
    b.transfer("acc0", "acc2", 4e6)
    tg, est, sim = _both(b)
    assert math.isclose(est.makespan, 2 * 1.5e-6 + 4e6 / (40 * GB), rel_tol=REL)
    _assert_same_schedule(tg, est, sim)


def test_memory_is_the_bottleneck_when_slower_than_the_link():
    system = make_system(2, topology="chain", bandwidth="100 GB/s", latency="0 s", memory_bandwidth="25 GB/s")
    b = TaskGraphBuilder(system)
    b.transfer("acc0", "acc1", 5e6)
    tg, est, sim = _both(b)
    assert math.isclose(est.makespan, 5e6 / (25 * GB), rel_tol=REL)
    _assert_same_schedule(tg, est, sim)


def test_empty_transfer_takes_its_latency():
    system = make_system(2, topology="chain", latency="3 us")
    b = TaskGraphBuilder(system)
    b.transfer("acc0", "acc1", 0.0)
    tg, est, sim = _both(b)
    assert math.isclose(est.makespan, 3e-6, rel_tol=REL)
    _assert_same_schedule(tg, est, sim)


# ---------------------------------------------------------------------- chains and trees
def test_chain_of_compute_on_one_device_sums():
    system = make_system(1, topology="chain")
    b = TaskGraphBuilder(system)
    durations = [1.5e-6, 2.25e-5, 3e-7, 4.125e-6, 1e-3]
    prev = ()
    for d in durations:
        prev = (b.compute("acc0", d, preds=prev),)
    tg, est, sim = _both(b)
    assert est.makespan == pytest.approx(sum(durations), rel=1e-15)
    _assert_same_schedule(tg, est, sim)


def test_chain_across_devices_alternates_compute_and_transfers():
    system = make_system(4, topology="chain", bandwidth="20 GB/s", latency="2 us")
    b = TaskGraphBuilder(system)
    rng = np.random.default_rng(3)
    prev: tuple = ()
    expected = 0.0
    for i in range(4):
        d = float(rng.uniform(1e-5, 1e-4))
        prev = (b.compute(f"acc{i}", d, preds=prev),)
        expected += d
        if i < 3:
            size = float(rng.uniform(1e5, 1e6))
            prev = (b.transfer(f"acc{i}", f"acc{i + 1}", size, preds=prev),)
            expected += 2e-6 + size / (20 * GB)
    tg, est, sim = _both(b)
    assert math.isclose(est.makespan, expected, rel_tol=REL)
    _assert_same_schedule(tg, est, sim)


@pytest.mark.parametrize("fan", [2, 3, 5])
def test_fan_out_and_back_on_a_full_mesh(fan):
    # acc0 scatters to `fan` devices over distinct links (they share acc0's memory, which is far
    # from being their bottleneck), each computes, and all send back to acc0.
    system = make_system(fan + 1, topology="full", bandwidth="10 GB/s", latency="1 us", memory_bandwidth="10 TB/s")
    b = TaskGraphBuilder(system)
    root = b.compute("acc0", 2e-5)
    backs = []
    times = []
    for k in range(1, fan + 1):
        size = 1e5 * k
        t = b.transfer("acc0", f"acc{k}", size, preds=(root,))
        work = 1e-5 * (1 + 0.3 * k)
        c = b.compute(f"acc{k}", work, preds=(t,))
        backs.append(b.transfer(f"acc{k}", "acc0", size / 2, preds=(c,)))
        times.append(2e-5 + 1e-6 + size / (10 * GB) + work + 1e-6 + size / 2 / (10 * GB))
    sink = b.compute("acc0", 1e-6, preds=tuple(backs))
    tg, est, sim = _both(b)
    assert math.isclose(est.makespan, max(times) + 1e-6, rel_tol=REL)
    assert est.end[sink] == est.makespan
    _assert_same_schedule(tg, est, sim)


def test_binary_reduction_tree():
    # 8 leaves on 8 devices reduce pairwise up a tree: partners at distance 1, 2, 4 on a full mesh.
    system = make_system(8, topology="full", bandwidth="25 GB/s", latency="1 us")
    b = TaskGraphBuilder(system)
    ready = {i: b.compute(f"acc{i}", 1e-5 * (1 + i / 10)) for i in range(8)}
    step = 1
    while step < 8:
        for i in range(0, 8, 2 * step):
            j = i + step
            t = b.transfer(f"acc{j}", f"acc{i}", 2e6 / step, preds=(ready[j],))
            ready[i] = b.compute(f"acc{i}", 5e-6, preds=(ready[i], t))
        step *= 2
    tg, est, sim = _both(b)
    _assert_same_schedule(tg, est, sim)


# ---------------------------------------------------------------------- pipelines
@pytest.mark.parametrize("stages,micro", [(2, 1), (3, 4), (4, 8), (5, 3)])
def test_pipeline_by_stage_times(stages, micro):
    # Distinct device per stage; the inter-stage transfer (x) is shorter than a stage (t), so the
    # transfers of consecutive micro-batches never overlap on a link.
    system = make_system(stages, topology="chain", bandwidth="50 GB/s", latency="1 us")
    b = TaskGraphBuilder(system)
    t_stage, size = 1e-4, 1e6
    x = 1e-6 + size / (50 * GB)
    for m in range(micro):
        prev: tuple = ()
        for s in range(stages):
            prev = (b.compute(f"acc{s}", t_stage, preds=prev, priority=m, micro_batch=m),)
            if s < stages - 1:
                prev = (b.transfer(f"acc{s}", f"acc{s + 1}", size, preds=prev, micro_batch=m),)
    tg, est, sim = _both(b)
    assert math.isclose(est.makespan, (stages + micro - 1) * t_stage + (stages - 1) * x, rel_tol=REL)
    _assert_same_schedule(tg, est, sim)


def test_pipeline_with_a_slow_stage_is_paced_by_it():
    system = make_system(3, topology="chain", bandwidth="50 GB/s", latency="0 s")
    b = TaskGraphBuilder(system)
    stage = [2e-5, 7e-5, 3e-5]
    micro = 6
    for m in range(micro):
        prev: tuple = ()
        for s in range(3):
            prev = (b.compute(f"acc{s}", stage[s], preds=prev, priority=m, micro_batch=m),)
            if s < 2:
                prev = (b.transfer(f"acc{s}", f"acc{s + 1}", 1e5, preds=prev, micro_batch=m),)
    tg, est, sim = _both(b)
    x = 1e5 / (50 * GB)
    assert math.isclose(est.makespan, sum(stage) + 2 * x + (micro - 1) * max(stage), rel_tol=REL)
    _assert_same_schedule(tg, est, sim)


# ---------------------------------------------------------------------- collectives
@pytest.mark.parametrize("n", [2, 3, 4, 8])
def test_ring_all_reduce_closed_form(n):
    alpha, bw, size = 1e-6, 50 * GB, 8e6
    system = make_system(n, topology="ring", bandwidth="50 GB/s", latency="1 us")
    b = TaskGraphBuilder(system)
    devices = tuple(f"acc{i}" for i in range(n))
    steps = schedule("all_reduce", "ring", [size / n] * n)
    expand_collective(b, "all_reduce", "ring", devices, steps, [()] * n, size)
    tg, est, sim = _both(b)
    assert math.isclose(est.makespan, 2 * (n - 1) * (alpha + size / (n * bw)), rel_tol=1e-9)
    _assert_same_schedule(tg, est, sim)


@pytest.mark.parametrize("kind", ["all_gather", "reduce_scatter"])
def test_ring_gather_and_scatter_with_uneven_chunks(kind):
    # Uneven pieces: the contention-free time is the longest chain of steps, not a closed form;
    # the simulation must still agree since each step's flows use distinct ring links.
    n = 5
    system = make_system(n, topology="ring", bandwidth="20 GB/s", latency="2 us")
    b = TaskGraphBuilder(system)
    devices = tuple(f"acc{i}" for i in range(n))
    starts = [(b.compute(d, 1e-5 * (i + 1)),) for i, d in enumerate(devices)]
    chunks = [1e6 * (1 + i) for i in range(n)]
    expand_collective(b, kind, "ring", devices, schedule(kind, "ring", chunks), starts, sum(chunks))
    tg, est, sim = _both(b)
    _assert_same_schedule(tg, est, sim)


@pytest.mark.parametrize("n", [4, 8])
def test_halving_doubling_all_reduce_on_a_switch(n):
    alpha, bw, size = 1e-6, 100 * GB, 16e6
    system = make_system(n, topology="switch", bandwidth="100 GB/s", latency="0.5 us")
    b = TaskGraphBuilder(system)
    devices = tuple(f"acc{i}" for i in range(n))
    steps = schedule("all_reduce", "halving_doubling", [size / n] * n)
    expand_collective(b, "all_reduce", "halving_doubling", devices, steps, [()] * n, size)
    tg, est, sim = _both(b)
    logn = int(math.log2(n))
    expected = 2 * logn * alpha + 2 * sum(size / 2 ** (k + 1) for k in range(logn)) / bw
    assert math.isclose(est.makespan, expected, rel_tol=1e-9)
    _assert_same_schedule(tg, est, sim)


@pytest.mark.parametrize("kind", ["all_gather", "reduce_scatter"])
@pytest.mark.parametrize("n", [3, 4, 8])
def test_direct_collective_flows_share_their_ranks_port(kind, n):
    # A direct collective sends a rank's pieces to its n - 1 peers at once: they share the rank's
    # link to the switch (and each receiver's), so a step takes (n - 1) S / B, the closed form, and
    # the estimate gives what the simulation does, although it otherwise leaves contention out.
    alpha, bw, piece = 1e-6, 100 * GB, 4e6
    system = make_system(n, topology="switch", bandwidth="100 GB/s", latency="1 us")
    b = TaskGraphBuilder(system)
    devices = tuple(f"acc{i}" for i in range(n))
    steps = schedule(kind, "direct", [piece] * n)
    expand_collective(b, kind, "direct", devices, steps, [()] * n, piece * n)
    tg, est, sim = _both(b)
    route = system.route("acc0", "acc1")
    assert math.isclose(est.makespan, route.latency + (n - 1) * piece / bw, rel_tol=1e-9)
    assert route.latency >= alpha
    assert math.isclose(est.makespan, sim.makespan, rel_tol=1e-9)
    flows = transfer_durations(tg, system)[tg.kind != COMPUTE]
    assert np.allclose(flows, route.latency + (n - 1) * piece / bw, rtol=1e-9)


# ---------------------------------------------------------------------- device queues
def test_ready_tasks_run_lowest_priority_first():
    # Three tasks ready at once on one device: contention for the device, none for links. The
    # estimate models the device exactly as the simulator does.
    system = make_system(1, topology="chain")
    b = TaskGraphBuilder(system)
    a = b.compute("acc0", 3e-6, priority=2)
    c = b.compute("acc0", 5e-6, priority=0)
    d = b.compute("acc0", 7e-6, priority=1)
    tg, est, sim = _both(b)
    assert est.start[c] == 0.0 and est.start[d] == 5e-6 and est.start[a] == 12e-6
    assert est.devices.loc["acc0", "wait_s"] == pytest.approx(5e-6 + 12e-6, rel=1e-15)
    _assert_same_schedule(tg, est, sim)


def test_idle_device_takes_whatever_becomes_ready_first():
    # acc1's low-priority task waits for a long transfer; its high-priority-number task is ready
    # earlier and runs in the gap (the device never idles while a task is ready).
    system = make_system(2, topology="chain", bandwidth="1 GB/s", latency="0 s")
    b = TaskGraphBuilder(system)
    src = b.compute("acc0", 1e-6)
    slow = b.transfer("acc0", "acc1", 1e5, preds=(src,))  # 100 us
    urgent = b.compute("acc1", 5e-5, preds=(slow,), priority=0)
    filler = b.compute("acc1", 2e-5, priority=9)
    tg, est, sim = _both(b)
    assert est.start[filler] == 0.0
    assert math.isclose(est.start[urgent], 1e-6 + 1e-4, rel_tol=REL)
    _assert_same_schedule(tg, est, sim)


def test_lowered_single_device_mapping_equals_the_simulation():
    g = _small_cnn()
    system = make_system(2, topology="chain")
    mapping = Mapping(sets=(AcceleratorSet(("acc1",), "os16"),), op_set=(0,) * len(g.compute_ops),
                      op_sharding=("none",) * len(g.compute_ops))
    tg = lower(g, system, mapping, RooflineCost())
    est = estimate(tg, system)
    sim = simulate(tg, system, record=False, setup=False)
    _assert_same_schedule(tg, est, sim)


# ---------------------------------------------------------------------- bounds and views
def test_lower_bound_components_on_a_contended_graph():
    # Four flows share one link: the estimate (each alone) is below the simulation, the resource
    # load bound (all bytes over the link) equals it.
    system = make_system(2, topology="chain", bandwidth="10 GB/s", latency="0 s")
    b = TaskGraphBuilder(system)
    for _ in range(4):
        b.transfer("acc0", "acc1", 1e6)
    tg, est, sim = _both(b)
    assert math.isclose(est.makespan, 1e6 / (10 * GB), rel_tol=REL)
    assert math.isclose(sim.makespan, 4e6 / (10 * GB), rel_tol=REL)
    assert math.isclose(est.bounds["resource_load"], 4e6 / (10 * GB), rel_tol=REL)
    assert est.lower_bound == est.bounds["resource_load"] <= sim.makespan * (1 + 1e-12)
    # raised to the bound, the estimate meets the simulation here (one link carries everything)
    assert est.bounded == max(est.makespan, est.lower_bound)
    assert math.isclose(est.bounded, sim.makespan, rel_tol=REL)
    assert est.links.loc["acc0->acc1", "bytes"] == 4e6


def test_device_work_bound_and_critical_path_bound():
    system = make_system(2, topology="chain")
    b = TaskGraphBuilder(system)
    for d in (1e-5, 2e-5, 3e-5):
        b.compute("acc0", d)
    first = b.compute("acc1", 4e-5)
    b.compute("acc1", 1e-5, preds=(first,))
    tg, est, _ = _both(b)
    assert est.bounds["device_work"] == pytest.approx(6e-5, rel=1e-15)
    assert est.bounds["critical_path"] == pytest.approx(5e-5, rel=1e-15)
    assert est.makespan == pytest.approx(6e-5, rel=1e-15)


def test_critical_path_walks_back_through_device_waits():
    system = make_system(2, topology="chain", bandwidth="10 GB/s", latency="0 s")
    b = TaskGraphBuilder(system)
    a = b.compute("acc0", 1e-5, priority=0)
    c = b.compute("acc0", 2e-5, priority=1)  # waits for a on the device
    t = b.transfer("acc0", "acc1", 1e5, preds=(c,))
    d = b.compute("acc1", 1e-6, preds=(t,))
    tg, est, _ = _both(b)
    assert est.critical_path().tolist() == [a, c, t, d]


def test_transfer_durations_match_the_route_bottleneck():
    system = make_system(3, topology="chain", bandwidth="40 GB/s", latency="1 us", memory_bandwidth="20 GB/s")
    b = TaskGraphBuilder(system)
    b.compute("acc0", 7e-6)
    b.transfer("acc0", "acc2", 2e6)
    tg = b.build()
    d = transfer_durations(tg, system)
    assert d[0] == 7e-6
    assert math.isclose(d[1], 2e-6 + 2e6 / (20 * GB), rel_tol=1e-15)


def test_cycle_is_reported():
    system = make_system(1, topology="chain")
    b = TaskGraphBuilder(system)
    x = b.compute("acc0", 1e-6)
    y = b.compute("acc0", 1e-6, preds=(x,))
    b.depend(y, x)
    with pytest.raises(ValueError, match="cycle"):
        estimate(b.build(), system)


def test_empty_task_graph():
    system = make_system(1, topology="chain")
    est = estimate(TaskGraphBuilder(system).build(), system)
    assert est.makespan == 0.0 and est.lower_bound == 0.0


def test_search_screening_uses_the_estimate():
    g = _small_cnn()
    system = make_system(4, topology="ring")
    mapping = Mapping.single_set(g, system, sharding="dp")
    problem = Problem(g, system, RooflineCost())
    tg = lower(g, system, mapping, RooflineCost())
    assert estimate_mapping(problem, mapping) == estimate(tg, system).makespan


@pytest.mark.skipif(not have_numba(), reason="numba not installed")
def test_compiled_and_python_kernels_agree_bit_for_bit():
    g = _small_cnn(batch=4)
    system = make_system(4, topology="ring")
    from marssim.search import MappingSpace

    space = MappingSpace(g, system)
    rng = np.random.default_rng(11)
    for _ in range(10):
        tg = lower(g, system, space.decode(space.random(rng)), RooflineCost())
        a = estimate(tg, system, backend="python")
        c = estimate(tg, system, backend="numba")
        assert np.array_equal(a.start, c.start) and np.array_equal(a.end, c.end)
        assert np.array_equal(a.ready, c.ready) and a.lower_bound == c.lower_bound


def test_unknown_backend_is_refused():
    system = make_system(1, topology="chain")
    with pytest.raises(ValueError, match="backend"):
        estimate(TaskGraphBuilder(system).build(), system, backend="gpu")


def _small_cnn(batch: int = 2):
    b = GraphBuilder("cnn", batch=batch)
    x = b.input("img", c=8, h=16, w=16)
    x = b.conv("c1", x, 16, kernel=3)
    x = b.eltwise("r1", x, fn="relu")
    y = b.conv("c2", x, 16, kernel=3)
    x = b.eltwise("add", x, y, fn="add")
    x = b.global_pool("gap", x)
    b.linear("fc", x, 10)
    return b.build()


def test_devices_table_matches_the_compute_tasks():
    g = _small_cnn(batch=4)
    system = make_system(2, topology="chain")
    tg = lower(g, system, Mapping.single_set(g, system, sharding="dp"), RooflineCost())
    est = estimate(tg, system)
    compute = tg.kind == COMPUTE
    for name in ("acc0", "acc1"):
        mine = compute & (tg.device == system.node_index[name])
        assert est.devices.loc[name, "tasks"] == int(mine.sum())
        assert est.devices.loc[name, "busy_s"] == pytest.approx(float(tg.duration[mine].sum()), rel=1e-12)
        assert est.devices.loc[name, "flops"] == pytest.approx(float(tg.flops[mine].sum()), rel=1e-12)
