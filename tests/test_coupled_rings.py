"""Coupled ring steps (``lower_parallel(..., coupled_rings=True)``): a ring over GPUs of several
classes held as one task per class, its steps coupled to the previous rank's, must give the
estimate the same floats as the lowering that holds one task per step."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("numba")

from marssim.analytical import estimate  # noqa: E402
from marssim.analytical.estimate import _estimate_program, _route_arrays, resource_bytes  # noqa: E402
from marssim.cost import default_cost_model  # noqa: E402
from marssim.parallel import lower_parallel, parse_parallel  # noqa: E402
from marssim.plan import run  # noqa: E402
from marssim.sim import simulate_summary  # noqa: E402
from marssim.system import load_system  # noqa: E402
from marssim.taskgraph import COMPUTE  # noqa: E402
from marssim.workload import load_workload  # noqa: E402

GPT = "gpt:layers=2,hidden=256,heads=4,vocab=1000,seq=64,max_positions=64,mode=train,batch=1"
GPT4 = "gpt:layers=4,hidden=256,heads=4,vocab=1000,seq=64,max_positions=64,mode=train,batch=1"
MOE = "moe:layers=2,hidden=256,heads=4,vocab=1000,seq=64,max_positions=64,mode=train,batch=1,experts=8,top_k=2,kv_heads=4"

CASES = [
    # ZeRO-3 over three nodes: every layer's all-gathers and reduce-scatter ring over 8 classes
    ("dgx-a100-cluster:nodes=3", GPT, "tp=1,pp=1,dp=24,zero=3,micro_batch=1,global_batch=48,recompute=full"),
    # a partly filled scalable unit (21 nodes, units of 20), gradients overlapped with the backward
    ("dgx-a100-cluster:nodes=21", GPT, "tp=2,pp=2,dp=42,micro_batch=1,global_batch=168,overlap_grad_reduce=true"),
    # the distributed optimizer with its parameter all-gather overlapped, interleaved stages
    ("dgx-a100-cluster:nodes=4", GPT4, "tp=2,pp=2,dp=8,zero=1,micro_batch=1,global_batch=32,schedule=interleaved,"
                                       "virtual_stages=2,overlap_param_gather=true"),
    # experts: expert-parallel all-to-all beside data-parallel rings
    ("dgx-h100-cluster:nodes=4", MOE, "tp=1,pp=2,ep=8,dp=16,micro_batch=1,global_batch=32"),
]


def _lowerings(system_spec: str, workload: str, config: str):
    system, graph, cfg = load_system(system_spec), load_workload(workload), parse_parallel(config)
    cost = default_cost_model()
    steps = lower_parallel(graph, system, cfg, cost)
    coupled = lower_parallel(graph, system, cfg, cost, coupled_rings=True)
    return system, steps, coupled


def _positions(coupled_tg) -> tuple[np.ndarray, np.ndarray]:
    """Per task of the coupled lowering: its first and its last task in the lowering with one
    task per step (a coupled transfer of k steps stands for k consecutive tasks there)."""
    n = coupled_tg.n_tasks
    extra = np.zeros(n + 1, dtype=np.int64)
    c = coupled_tg.program.coupled
    more = coupled_tg.steps[c.task].astype(np.int64) - 1
    extra[c.task + 1] = more
    first = np.arange(n) + np.cumsum(extra)[:-1]
    last = first.copy()
    last[c.task] += more
    return first, last


def _estimate(tg, system, chained: bool):
    bottleneck, latency, res_idx, res_route, res_weight = _route_arrays(tg, system)
    return _estimate_program(tg, system, tg.program, bottleneck, latency, (res_idx, res_route, res_weight),
                             lambda *_: None, 0.0, chained=chained)


@pytest.mark.parametrize("system_spec,workload,config", CASES)
def test_coupled_estimate_equals_one_task_per_step(system_spec, workload, config):
    system, steps, coupled = _lowerings(system_spec, workload, config)
    c = coupled.program.coupled
    assert c is not None and len(c) > 0
    assert steps.program.coupled is None
    first, last = _positions(coupled)
    assert last[-1] == steps.n_tasks - 1  # every step accounted for
    # the tasks that are not coupled are the same tasks
    kinds = steps.kind[first]
    assert np.array_equal(kinds, coupled.kind)
    assert np.array_equal(steps.device[first], coupled.device)
    assert np.array_equal(steps.op[first], coupled.op)
    # a coupled transfer carries all its steps' bytes
    assert np.allclose(coupled.nbytes[c.task], steps.nbytes[first[c.task]] * coupled.steps[c.task], rtol=1e-12)
    for chained in (True, False):  # the one-pass schedule and the list schedule
        a, b = _estimate(steps, system, chained), _estimate(coupled, system, chained)
        assert b.makespan == a.makespan
        assert np.array_equal(b.start, a.start[first])
        assert np.array_equal(b.ready, a.ready[first])
        assert np.array_equal(b.end, a.end[last])
        assert b.bounds["critical_path"] == a.bounds["critical_path"]
        assert b.bounds["device_work"] == a.bounds["device_work"]
    # the public entry takes the compiled path for a coupled program, whatever was read before
    assert estimate(coupled, system).makespan == a.makespan
    # bytes per resource: the same, summed in another order
    assert np.allclose(resource_bytes(coupled, system), resource_bytes(steps, system), rtol=1e-12, atol=0.0)


def test_coupled_components_are_rings_of_classes():
    system, steps, coupled = _lowerings(*CASES[0])
    c = coupled.program.coupled
    comp, ptr, members = c.components
    sizes = np.diff(ptr)
    assert (sizes == coupled.meta["fold_classes"]).all()  # the 8 classes of a node, one task each
    assert (comp[c.prev_index] == comp).all()  # fed within its ring
    for k in range(len(sizes)):  # each ring is one cycle through its feeders
        mine = members[ptr[k]:ptr[k + 1]]
        seen, at = set(), int(mine[0])
        for _ in range(len(mine)):
            seen.add(at)
            at = int(c.prev_index[at])
        assert at == mine[0] and seen == set(mine.tolist())
    # a ring step's bytes: the whole tensor over the ring's ranks
    assert (coupled.steps[c.task] == 23).all()


def test_simulators_and_python_estimate_refuse_coupled_steps():
    system, _, coupled = _lowerings(*CASES[0])
    with pytest.raises(ValueError, match="coupled_rings=False"):
        simulate_summary(coupled, system, memory_policy="ignore")
    with pytest.raises(ValueError, match="coupled_rings=False"):
        estimate(coupled, system, backend="python")


def test_plan_run_estimates_coupled_with_the_same_report():
    system_spec, workload, config = CASES[1]
    system, graph, cfg = load_system(system_spec), load_workload(workload), parse_parallel(config)
    cost = default_cost_model()
    est = run(cfg, graph, system, cost, how="estimate", detail=False)
    assert est.taskgraph.program.coupled is not None
    steps = lower_parallel(graph, system, cfg, cost)
    ref = run(cfg, graph, system, cost, how="estimate", detail=False, taskgraph=steps)
    assert est.makespan == ref.makespan
    assert est.report.iteration_s == ref.report.iteration_s
    assert est.report.mfu == ref.report.mfu
    sim = run(cfg, graph, system, cost, how="simulate", detail=False)
    assert sim.taskgraph.program.coupled is None and sim.taskgraph.n_tasks == steps.n_tasks
    assert est.taskgraph.n_tasks < steps.n_tasks
    assert np.count_nonzero(est.taskgraph.kind == COMPUTE) == np.count_nonzero(steps.kind == COMPUTE)


def test_placement_memo_gives_each_layout_its_own_ranks():
    """place() memoises rank layouts per system: configurations with the same layout share one,
    any other field of the layout (order, degrees, stage blocks) gets its own, equal to a fresh
    computation."""
    from marssim.parallel.placement import LAYOUTS, _layout, place

    system = load_system("dgx-a100-cluster:nodes=4")
    specs = ["tp=2,pp=2,dp=8,micro_batch=1,global_batch=32", "tp=2,pp=2,dp=8,micro_batch=2,global_batch=32",
             "tp=4,pp=2,dp=4,micro_batch=1,global_batch=32", "tp=2,pp=2,dp=8,micro_batch=1,global_batch=32,order=tp-dp-pp",
             "pp=2,dp=4,micro_batch=1,global_batch=32,stage_tp=4/2"]
    first = {}
    for _ in range(2):
        for spec in specs * 2:
            cfg = parse_parallel(spec)
            got = place(system, cfg)
            blocked = bool(cfg.stage_start or (cfg.stage_tp and not cfg.uniform))
            ranks, coords = _layout(system, cfg, blocked)
            assert got.ranks == ranks and got.coords == coords
            first.setdefault(spec, got.ranks)
    assert first[specs[0]] is first[specs[1]]  # micro-batch is not part of the layout
    assert first[specs[0]] != first[specs[2]] and first[specs[0]] != first[specs[3]]
    assert first[specs[4]] != first[specs[0]]
    assert 1 <= len(LAYOUTS.cache(system, "layout")) <= LAYOUTS.default_size


def test_components_of_feeder_cycles_with_tails():
    """Components found by pointer doubling equal those of a plain walk: two cycles of feeders,
    one with tasks leading into it, and a task feeding itself."""
    from marssim.taskprogram import CoupledSteps

    # positions: cycle 0 -> 3 -> 5 -> 0; cycle 1 -> 4 -> 1; tail 2 -> 3, 6 -> 2; 7 feeds itself
    prev_pos = np.array([5, 4, 3, 0, 1, 3, 2, 7])
    task = np.arange(8) * 10 + 3
    c = CoupledSteps(task=task, prev=task[prev_pos], chunk=np.ones(8))
    comp, ptr, members = c.components
    assert np.array_equal(c.prev_index, prev_pos)
    groups = {frozenset(members[ptr[k]:ptr[k + 1]].tolist()) for k in range(len(ptr) - 1)}
    assert groups == {frozenset({0, 2, 3, 5, 6}), frozenset({1, 4}), frozenset({7})}
    assert all(comp[m] == k for k in range(len(ptr) - 1) for m in members[ptr[k]:ptr[k + 1]])
