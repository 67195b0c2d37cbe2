"""What keeps large parallel configurations tractable: the size of a lowering known before its
tasks are copied (and refused with its size and reason when too big), progress reported while
lowering, simulating and estimating."""

from __future__ import annotations

import numpy as np
import pytest

from marssim.cost import default_cost_model
from marssim.errors import InputError
from marssim.parallel import lower_parallel, parse_parallel
from marssim.progress import EstimateProgress, LoweringProgress
from marssim.parallel.size import MAX_GPUS, SizeEstimate, check_gpus, check_size
from marssim.system import load_system
from marssim.workload import load_workload

COST = default_cost_model()
GPT = "gpt:layers=8,hidden=512,heads=8,vocab=1000,seq=128,mode=train,max_positions=128"

CASES = [
    # data-parallel replicas on both sides of a partly filled scalable unit (22 nodes, units of 20)
    ("dgx-a100-cluster:nodes=22", GPT, "tp=8,pp=2,dp=11,global_batch=44,recompute=full", True),
    ("dgx-a100-cluster:nodes=2", GPT, "tp=4,pp=2,dp=2,schedule=interleaved,virtual_stages=2,sp=true,zero=1,"
                                      "global_batch=8", True),
    ("dgx-a100-cluster:nodes=2", GPT, "tp=4,pp=2,dp=2,schedule=interleaved,virtual_stages=2,sp=true,zero=1,"
                                      "global_batch=8", False),
    ("dgx-a100-cluster:nodes=1", GPT, "tp=2,pp=1,dp=4,zero=3,global_batch=8", True),
]


@pytest.mark.parametrize("system_spec,workload,config,folding", CASES)
def test_the_size_known_before_copying_is_the_taskgraphs(system_spec, workload, config, folding):
    """The tasks counted from one template set per stage (before the others are built) are the
    tasks of the TaskGraph, and every progress report up to the last one says so."""
    system = load_system(system_spec)
    calls: list[LoweringProgress] = []
    tg = lower_parallel(load_workload(workload), system, parse_parallel(config), COST, folding=folding,
                        progress=calls.append)
    assert all(type(c) is LoweringProgress for c in calls)
    stages = [c.stage for c in calls]
    assert stages[0] == "fold" and stages[-1] == "assemble"
    assert stages.index("assemble") > stages.index("templates") > stages.index("fold")
    assert calls[-1].tasks == calls[-1].total == tg.n_tasks
    done = [c.tasks for c in calls]
    assert done == sorted(done)


def test_a_lowering_too_big_for_the_memory_allowed_is_refused_with_its_size():
    system = load_system("dgx-a100-cluster:nodes=2")
    graph = load_workload(GPT)
    cfg = parse_parallel("tp=4,pp=2,dp=2,global_batch=64")
    tg = lower_parallel(graph, system, cfg, COST)
    with pytest.raises(InputError) as info:
        lower_parallel(graph, system, cfg, COST, max_bytes=1e5)
    message = str(info.value)
    assert f"{tg.n_tasks:,} tasks" in message and "GiB" in message and "simulated GPUs" in message


def test_more_gpus_than_any_cluster_is_refused_before_placing_them():
    check_gpus(MAX_GPUS)
    with pytest.raises(InputError, match="800,000 GPUs"):
        check_gpus(800_000)


def test_more_tasks_than_a_taskgraph_indexes_is_refused():
    with pytest.raises(InputError, match="2\\^31"):
        check_size(SizeEstimate(gpus=8, classes=1, tasks=2**31), max_bytes=float("inf"))
    check_size(SizeEstimate(gpus=8, classes=1, tasks=1000), max_bytes=float("inf"))


def test_the_estimate_reports_its_passes_to_the_end():
    from marssim.analytical import estimate

    system = load_system("dgx-a100-cluster:nodes=2")
    tg = lower_parallel(load_workload(GPT), system, parse_parallel("tp=4,pp=2,dp=2,global_batch=8"), COST)
    calls: list[EstimateProgress] = []
    estimate(tg, system, progress=calls.append)
    assert all(type(c) is EstimateProgress for c in calls)
    assert [c.stage for c in calls] == ["durations", "schedule", "critical_path", "bounds"]
    assert calls[-1].tasks_done == calls[-1].tasks == tg.n_tasks


def test_a_lowering_simulates_from_its_program_as_from_its_columns():
    """The TaskGraph a lowering returns keeps its unit templates and instances and builds its
    columns only when read: a simulation walking the program and one of the same TaskGraph with
    every column built give the same Result and the same Summary (throughput and energy added
    task after task in the same order)."""
    import dataclasses

    import pandas as pd

    from marssim.sim import simulate, simulate_summary
    from marssim.sim.fast import available
    from marssim.taskgraph import ProgramTaskGraph

    system = load_system("dgx-a100-cluster:nodes=22")
    tg = lower_parallel(load_workload(GPT), system, parse_parallel("tp=8,pp=2,dp=11,global_batch=44,recompute=full"),
                        COST)
    assert isinstance(tg, ProgramTaskGraph) and "kind" not in tg.__dict__
    assert "ops" not in tg.__dict__  # the ops' labels too are made when first read
    engine = "compiled" if available() else "simpy"
    lazy = simulate_summary(tg, system, engine=engine)
    assert "kind" not in tg.__dict__  # the summary did not build the columns
    built = dataclasses.replace(tg)  # every field read: the columns built
    assert "kind" in built.__dict__ and built.n_tasks == tg.n_tasks
    assert len(tg.ops) > 0 and built.ops == tg.ops  # made once read, the same for both
    assert {o.name for o in tg.ops} <= set(tg.op_names) and any(o.cost_model for o in tg.ops)
    again = simulate_summary(built, system, engine=engine)
    assert (again.makespan, again.throughput) == (lazy.makespan, lazy.throughput)
    assert again.energy == lazy.energy or (again.energy != again.energy and lazy.energy != lazy.energy)
    a, b = simulate(tg, system, engine=engine), simulate(built, system, engine=engine)
    pd.testing.assert_frame_equal(a.intervals, b.intervals)
    assert a.makespan == b.makespan == lazy.makespan and a.throughput == b.throughput == lazy.throughput


@pytest.mark.parametrize("system_spec,workload,config,folding", CASES)
def test_a_lowering_estimates_from_its_program_as_from_its_columns(system_spec, workload, config, folding):
    """The estimate of a lowering's TaskGraph walks its program (its columns are not built) and
    gives every start, ready and end time, duration, busy second and bound of the estimate of the
    same TaskGraph with every column built."""
    import dataclasses

    from marssim.analytical import estimate
    from marssim.analytical.schedule import have_numba

    system = load_system(system_spec)
    tg = lower_parallel(load_workload(workload), system, parse_parallel(config), COST, folding=folding)
    lazy = estimate(tg, system)
    if have_numba():
        assert "kind" not in tg.__dict__
    built = estimate(dataclasses.replace(tg), system)
    for name in ("start", "ready", "end", "duration", "busy"):
        assert np.array_equal(getattr(lazy, name), getattr(built, name)), name
    assert (lazy.makespan, lazy.lower_bound, lazy.bounds) == (built.makespan, built.lower_bound, built.bounds)


@pytest.mark.parametrize("system_spec,workload,config,folding", CASES)
def test_chained_kernels_make_one_pass_the_list_schedule(system_spec, workload, config, folding):
    """A lowering chains every GPU's kernels (each after the one before it, unit after unit), so
    the estimate's single pass (no kernel waits for its GPU, ready = start) gives what the list
    schedule and the earliest schedule give run separately: the same floats."""
    import sys

    from marssim.analytical import estimate
    from marssim.analytical.schedule import have_numba

    if not have_numba():
        pytest.skip("the program's kernels need numba")
    est = sys.modules["marssim.analytical.estimate"]
    system = load_system(system_spec)
    tg = lower_parallel(load_workload(workload), system, parse_parallel(config), COST, folding=folding)
    program = tg.program
    is_compute = program.rows["kind"] == 0
    assert est._kernels_in_chains(program, is_compute)
    one = estimate(tg, system)
    assert one.ready is one.start and one.bounds["critical_path"] == one.makespan
    bottleneck, latency, *incidence = est._route_arrays(tg, system)
    two = est._estimate_program(tg, system, program, bottleneck, latency, tuple(incidence), lambda *a: None, 0.0,
                                chained=False)
    for name in ("start", "ready", "end", "duration", "busy"):
        assert np.array_equal(getattr(one, name), getattr(two, name)), name
    assert (one.makespan, one.lower_bound, one.bounds) == (two.makespan, two.lower_bound, two.bounds)


def test_kernels_out_of_one_chain_take_the_list_schedule():
    """Two chains of units on one GPU (an instance's kernels no longer after the previous
    unit's), or a template's kernels on two GPUs: the single pass no longer applies."""
    import dataclasses
    import sys

    from marssim.analytical.schedule import have_numba

    if not have_numba():
        pytest.skip("the program's kernels need numba")
    est = sys.modules["marssim.analytical.estimate"]
    system = load_system(CASES[1][0])
    program = lower_parallel(load_workload(CASES[1][1]), system, parse_parallel(CASES[1][2]), COST).program
    is_compute = program.rows["kind"] == 0
    assert est._kernels_in_chains(program, is_compute)
    linked = np.flatnonzero(program.chain_prev >= 0)
    cut = program.chain_prev.copy()
    cut[linked[len(linked) // 2]] = -1
    assert not est._kernels_in_chains(dataclasses.replace(program, chain_prev=cut), is_compute)
    rows = dict(program.rows)
    device = rows["device"].copy()
    j = int(np.flatnonzero(program.last_compute > program.first_compute)[0])
    device[program.tpl_start[j] + program.last_compute[j]] += 1
    rows["device"] = device
    assert not est._kernels_in_chains(dataclasses.replace(program, rows=rows), is_compute)


def test_an_estimate_does_not_import_pandas():
    """Lowering and estimating build no table: the process never imports pandas."""
    import subprocess
    import sys

    code = ("import sys\n"
            "from marssim.analytical import estimate\n"
            "from marssim.cost import default_cost_model\n"
            "from marssim.parallel import lower_parallel, parse_parallel\n"
            "from marssim.system import load_system\n"
            "from marssim.workload import load_workload\n"
            f"s = load_system({CASES[1][0]!r})\n"
            f"tg = lower_parallel(load_workload({CASES[1][1]!r}), s, parse_parallel({CASES[1][2]!r}), "
            "default_cost_model())\n"
            "assert estimate(tg, s).makespan > 0\n"
            "print('pandas' in sys.modules)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


@pytest.mark.parametrize("engine", ["compiled", "simpy"])
def test_a_searchs_schedule_is_the_full_simulations(engine):
    """simulate_schedule: the same summary and every task's start and end as simulate's Result
    (what a search's report reads), on either engine; the search's run gives the same report."""
    from marssim.plan import run
    from marssim.sim import simulate, simulate_schedule

    if engine == "compiled":
        pytest.importorskip("numba")
    system = load_system("dgx-a100-cluster:nodes=2")
    graph = load_workload(GPT)
    cfg = parse_parallel("tp=4,pp=2,dp=2,global_batch=8")
    tg = lower_parallel(graph, system, cfg, COST)
    full = simulate(tg, system, memory_policy="ignore", engine=engine)
    got = simulate_schedule(tg, system, memory_policy="ignore", engine=engine)
    assert (got.summary.makespan, got.summary.throughput) == (full.makespan, full.throughput)
    iv = full.intervals[full.intervals["task"] >= 0]
    assert np.array_equal(got.start[iv["task"].to_numpy()], iv["start"].to_numpy())
    assert np.array_equal(got.end[iv["task"].to_numpy()], iv["end"].to_numpy())
    detailed = run(cfg, graph, system, COST, detail=True).report.to_dict()
    searched = run(cfg, graph, system, COST, detail=False).report.to_dict()
    assert searched == detailed
