"""ZeRO-3 as DeepSpeed runs it (marssim/parallel/zero3.py): the gathers' plan by its rules, the
bytes the lowering moves against closed forms, the unit's time against its two-stream closed form,
the memory term against the live bound, and the settings' checks."""

from __future__ import annotations

import numpy as np
import pytest

from marssim.cost import default_cost_model
from marssim.errors import InputError
from marssim.parallel import lower_parallel, memory_estimate, parse_parallel, prepare_graph
from marssim.parallel.partition import op_rules
from marssim.parallel.zero3 import Use, Zero3Settings, live_bytes, module_params, plan_unit, unit_seconds
from marssim.system import load_system
from marssim.taskgraph import TRANSFER
from marssim.workload import load_workload

GPT = "gpt:layers=2,hidden=512,heads=8,vocab=1000,seq=128,max_positions=128,mode=train,batch=1"
NODE = "dgx-a100-cluster:nodes=1"
INF = 10**15


def uses(*sizes: int, names: str = "") -> list[Use]:
    names = names or "abcdefghijklmnopqrstuvwxyz"[:len(sizes)]
    return [Use(n, s, i, False) for i, (n, s) in enumerate(zip(names, sizes))]


def test_no_prefetch_fetches_each_use_as_it_comes():
    plan = plan_unit(uses(10, 20, 30), Zero3Settings(prefetch=0, reuse=0))
    assert [(g.use, g.issuer, g.params) for g in plan.gathers] == [(0, 0, 10), (1, 1, 20), (2, 2, 30)]
    assert plan.peak == 30  # one module at a time


def test_prefetch_stops_at_the_live_limit():
    # modules of 10: at use 0 the fetch (10) leaves 15 to prefetch, taken while under it: 2 modules;
    # afterwards each use releases one and leaves 5, so one more is prefetched per use
    plan = plan_unit(uses(*[10] * 6), Zero3Settings(prefetch=INF, live=25, reuse=0))
    assert [(g.use, g.issuer) for g in plan.gathers] == [(0, 0), (1, 0), (2, 0), (3, 1), (4, 2), (5, 3)]
    assert plan.peak == 30
    # the prefetch bucket bounds it the same way when it is the smaller
    bucket = plan_unit(uses(*[10] * 6), Zero3Settings(prefetch=5, live=INF, reuse=0))
    assert [(g.use, g.issuer) for g in bucket.gathers] == [(0, 0), (1, 0), (2, 1), (3, 2), (4, 3), (5, 4)]


def test_reuse_distance_keeps_a_module_gathered():
    seq = uses(100, 7, 100, names="aba")
    kept = plan_unit(seq, Zero3Settings(prefetch=0, reuse=7 + 1))
    assert [g.use for g in kept.gathers] == [0, 1]  # a is used again within 8 elements: not gathered twice
    assert kept.source[2] == kept.source[0]
    again = plan_unit(seq, Zero3Settings(prefetch=0, reuse=7))
    assert [g.use for g in again.gathers] == [0, 1, 2]


def test_persistent_parameters_are_never_gathered():
    seq = [Use("a", 5, 0, True), Use("b", 50, 1, False), Use("a", 5, 2, True)]
    plan = plan_unit(seq, Zero3Settings())
    assert [g.use for g in plan.gathers] == [1] and plan.source == (-1, 0, -1)


def test_unit_seconds_hidden_with_unbounded_prefetch_and_exposed_without():
    seq = uses(10, 10, 10, 10)
    compute, gather = [3.0, 2.5, 4.0, 1.0], [1.0, 2.0, 2.0, 0.5]
    ahead = plan_unit(seq, Zero3Settings(prefetch=INF, live=INF, reuse=0))
    # the first gather is waited for; the others run while the kernels before them do
    assert unit_seconds(ahead, 0.0, compute, gather) == pytest.approx(gather[0] + sum(compute))
    alone = plan_unit(seq, Zero3Settings(prefetch=0, reuse=0))
    assert unit_seconds(alone, 0.5, compute, gather) == pytest.approx(0.5 + sum(compute) + sum(gather))


def _lowered(config: str, folding: bool = False):
    system, graph = load_system(NODE), load_workload(GPT)
    cfg = parse_parallel(config)
    return system, graph, cfg, lower_parallel(graph, system, cfg, default_cost_model(), folding=folding)


def _sent(tg, gpu: int, kind: str) -> float:
    """Bytes GPU ``gpu`` sends in its collectives of ``kind`` over the data-parallel group."""
    colls = np.asarray([c.kind == kind and c.group == "dp" for c in tg.collectives] + [False])
    mask = (tg.kind == TRANSFER) & (tg.src == gpu) & colls[tg.collective]
    return float(tg.nbytes[mask].sum())


@pytest.mark.parametrize("micro", [1, 2])
def test_gathered_and_reduced_bytes_in_closed_form(micro):
    n = 8
    _, graph, cfg, tg = _lowered(f"tp=1,dp={n},zero=3,recompute=none,collectives=line,global_batch={8 * micro}")
    prepared = prepare_graph(graph, cfg)
    params = module_params(prepared, cfg, op_rules(prepared, cfg))
    gathered = sum(p for p in params.values() if p >= Zero3Settings().persist)
    whole = sum(op.weight_elems for op in prepared.ops if op.param("phase", "fwd") == "fwd" and op.weight_elems
                and not op.param("shares"))
    assert sum(params.values()) == whole  # tp = 1: a rank's module is the whole op
    eb = 2.0  # bf16 parameters
    for gpu in range(n):
        # forward and backward each gather every module once per micro-batch (no recomputation)
        assert _sent(tg, gpu, "all_gather") == pytest.approx(2 * micro * gathered * eb * (n - 1) / n, rel=1e-12)
        # the gradients reduce-scattered once, in the gradient buffer's type (fp32 for bf16)
        assert _sent(tg, gpu, "reduce_scatter") == pytest.approx(whole * 4.0 * (n - 1) / n, rel=1e-12)
    # one gather per module that is not persistent, in each forward and backward
    modules = sum(1 for p in params.values() if p >= Zero3Settings().persist)
    gathers = sum(1 for c in tg.collectives if c.kind == "all_gather" and c.group == "dp" and c.devices[0] == "gpu0")
    assert gathers == 2 * micro * modules


def test_recomputation_gathers_a_module_again_beyond_the_reuse_distance():
    n = 8
    # no prefetch: a prefetch walking past a module's next use keeps it gathered until then (as
    # DeepSpeed does), whatever the reuse distance
    base = f"tp=1,dp={n},zero=3,recompute=full,collectives=line,global_batch=8,zero3_prefetch=0"
    _, _, _, kept = _lowered(base)
    _, graph, cfg, again = _lowered(base + ",zero3_reuse=0")
    prepared = prepare_graph(graph, cfg)
    params = module_params(prepared, cfg, op_rules(prepared, cfg))
    big = sum(p for p in params.values() if p >= Zero3Settings().persist)
    # reuse 0: the backward gathers Q/K/V, the attention projection and the MLP's first GEMM for
    # their recomputation and again for their gradients (the second MLP GEMM's recomputation is
    # followed by its gradient with no other module between: one use), and the forward gathers the
    # word embedding again for the tied output layer
    again_ = sum(p for name, p in params.items() if name.endswith((".attn.qkv", ".attn.proj", ".mlp.fc1")))
    again_ += params["embed.tokens"]
    assert _sent(again, 0, "all_gather") == pytest.approx((2 * big + again_) * 2.0 * (n - 1) / n, rel=1e-12)
    # the default distance (1e9 elements) keeps it gathered between the two
    assert _sent(kept, 0, "all_gather") == pytest.approx(2 * big * 2.0 * (n - 1) / n, rel=1e-12)


def test_nothing_gathered_after_the_optimizer_step():
    _, graph, _, tg = _lowered("tp=1,dp=8,zero=3,global_batch=8")
    index = {op.name: i for i, op in enumerate(graph.ops)}
    adams = {i for name, i in index.items() if name.endswith(".adam")}
    gather_ops = {c.op for c in tg.collectives if c.kind == "all_gather"}
    assert gather_ops and not gather_ops & {graph.ops[i].name for i in adams}


def test_estimate_equals_simulation_and_screen_is_close():
    from marssim.analytical import estimate
    from marssim.parallel.analytic import screen
    from marssim.sim import simulate

    system, graph, cfg, _ = _lowered("tp=1,dp=8,zero=3,global_batch=8")
    cost = default_cost_model()
    tg = lower_parallel(graph, system, cfg, cost)
    sim = simulate(tg, system, memory_policy="ignore", setup=False)
    est = estimate(lower_parallel(graph, system, cfg, cost, coupled_rings=True), system)
    assert est.makespan == pytest.approx(sim.makespan, rel=1e-9)  # one node: no two flows share a link
    assert screen(graph, system, cfg, cost).iteration_s == pytest.approx(sim.makespan, rel=0.1)


def test_memory_term_is_the_live_bound():
    _, graph, _, _ = _lowered("tp=1,dp=8,zero=3,global_batch=8")
    cfg = parse_parallel("tp=1,dp=8,zero=3,global_batch=8,zero3_prefetch=0,zero3_reuse=0,zero3_persist=0")
    prepared = prepare_graph(graph, cfg)
    rules = op_rules(prepared, cfg)
    largest = max(op.weight_elems for op in prepared.ops if op.param("phase", "fwd") == "fwd" and not op.param("shares"))
    total = sum(op.weight_elems for op in prepared.ops if op.param("phase", "fwd") == "fwd" and not op.param("shares"))
    # one module gathered at a time, plus one gradient bucket (the whole model: it is below 5e8)
    expected = largest * 2.0 + min(5e8, total) * 4.0
    assert live_bytes(prepared, cfg, rules, 0, 2.0, 4.0) == pytest.approx(expected)
    est = memory_estimate(prepared, cfg, 80 * 2**30)
    assert est.buffers[0] == pytest.approx(expected)


def test_a_large_zero3_run_now_fits():
    from marssim.parallel import check_memory

    system = load_system("dgx-a100-cluster:nodes=48")
    graph = load_workload("gpt:layers=96,hidden=12288,heads=96,vocab=51200,seq=2048,max_positions=2048,"
                          "mode=train,batch=4,dtype=fp16")
    cfg = parse_parallel("tp=1,pp=1,dp=384,zero=3,micro_batch=4,global_batch=1536,recompute=full")
    check_memory(graph, system, cfg)  # the whole model gathered at once (325 GiB) was refused
    est = memory_estimate(prepare_graph(graph, cfg), cfg, 80 * 2**30)
    assert est.buffers[0] < 8 * 2**30  # about the live limit (1e9 elements) and a bucket


@pytest.mark.parametrize("setting", ["zero3_prefetch=0", "zero3_live=5", "zero3_persist=0", "zero3_reuse=0",
                                     "zero3_bucket=100"])
def test_zero3_settings_apply_to_zero3_only(setting):
    system, graph = load_system(NODE), load_workload(GPT)
    key = setting.split("=")[0]
    with pytest.raises(InputError, match=key):
        lower_parallel(graph, system, parse_parallel(f"tp=1,dp=8,zero=1,global_batch=8,{setting}"))
    lower_parallel(graph, system, parse_parallel(f"tp=1,dp=8,zero=3,global_batch=8,{setting}"))


def test_long_gathers_take_at_most_ring_rows_transfers_at_the_same_times():
    """A gather over 72 ranks (71 steps, 8 classes of GPUs: 35 transfers of 2 steps and one of 1) is at most RING_ROWS transfers per
    rank of consecutive steps in the simulator's lowering: the estimate of it equals the estimate
    coupling every step (marssim estimate's lowering), and so does the simulation."""
    from marssim.analytical import estimate
    from marssim.parallel.zero3 import RING_ROWS
    from marssim.sim import simulate_summary

    system = load_system("dgx-a100-cluster:nodes=9")
    graph = load_workload("gpt:layers=2,hidden=256,heads=4,vocab=1000,seq=64,max_positions=64,mode=train,batch=1")
    cfg = parse_parallel("tp=1,dp=72,zero=3,global_batch=72")
    cost = default_cost_model()
    rows = lower_parallel(graph, system, cfg, cost)
    coupled = estimate(lower_parallel(graph, system, cfg, cost, coupled_rings=True), system).makespan
    gathers = [i for i, c in enumerate(rows.collectives) if c.kind == "all_gather" and c.group == "dp"]
    per = np.bincount(rows.collective[np.isin(rows.collective, gathers)], minlength=len(rows.collectives))[gathers]
    assert per.max() <= RING_ROWS < 71
    assert estimate(rows, system).makespan == pytest.approx(coupled, rel=1e-12)
    assert simulate_summary(rows, system, memory_policy="ignore").makespan == pytest.approx(coupled, rel=1e-12)
