"""The GA on systems whose accelerators differ: segments go to the accelerator that suits them,
H2H seeds it, it beats both baselines on herald-soc; the level-1 operators keep every genome
valid; computation-aware choices match an independent computation."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from marssim.lower import lower
from marssim.mapping import Mapping, mapping_problems
from marssim.search import GAConfig, SearchSettings, run_algorithm
from marssim.search.baselines import data_parallel
from marssim.search.evaluate import Evaluator, Problem
from marssim.search.ga import _MARS, design_table, mars
from marssim.search.space import MappingSpace
from marssim.sim import simulate
from marssim.workload import GraphBuilder
from test_search_support import chain, two_models
from test_space import FIXED, GRAPH
from support import RooflineCost

COST = RooflineCost()


def state(graph, system, seed: int = 0, cost=COST) -> _MARS:
    space = MappingSpace(graph, system)
    ev = Evaluator(Problem(graph, system, cost))
    return _MARS(space, ev, GAConfig(), np.random.default_rng(seed), "latency", design_table(graph, system, cost))


# ------------------------------------------------------------------------------ herald-soc
@pytest.fixture(scope="module")
def herald():
    from marssim.cost import default_cost_model
    from marssim.system import load_system

    return load_system("herald-soc"), default_cost_model()


def test_default_search_on_herald_soc_is_seeded_with_h2h_and_never_slower(herald):
    """MobileNetV2 at batch 1 on four fixed sub-accelerators of different dataflows: the default
    search is seeded with both baselines, returns no slower than H2H and faster than running
    everything data parallel on the best single design (the previous GA returned that seed)."""
    from marssim.workload import load_workload

    system, cost = herald
    graph = load_workload("mobilenetv2:batch=1")
    settings = SearchSettings()
    dp = run_algorithm("data_parallel", graph, system, cost, settings)
    hh = run_algorithm("h2h", graph, system, cost, settings)
    res = run_algorithm("mars", graph, system, cost, settings, baselines={"data_parallel": dp, "h2h": hh})
    assert res.fitness <= hh.fitness < dp.fitness
    assert res.simulations > 60  # it did not stop after a few generations
    again = simulate(lower(graph, system, res.best, cost), system, setup=False)
    assert again.makespan == res.makespan


@pytest.mark.parametrize("spec, budget", [("mobilenetv2:batch=4", None), ("mix-vision", 200)])
def test_unseeded_ga_beats_both_baselines_on_herald_soc(herald, spec, budget):
    """Without seeds (default configuration; for mix-vision a budget of 200 simulations) the GA
    finds a mapping strictly faster than H2H and than data_parallel: its segments go to
    different sub-accelerators and some sub-accelerator runs several separate segments, which
    the previous genome (segment i on set i) could not express."""
    from marssim.workload import load_workload

    system, cost = herald
    graph = load_workload(spec)
    settings = SearchSettings(seed_with=(), budget=budget)
    dp = run_algorithm("data_parallel", graph, system, cost, settings)
    hh = run_algorithm("h2h", graph, system, cost, settings)
    res = run_algorithm("mars", graph, system, cost, settings)
    assert res.fitness < hh.fitness and res.fitness < dp.fitness
    assert len(res.best.sets) >= 2 and res.best.n_stages > len(res.best.sets)
    if budget is not None:
        assert res.simulations < budget + 20  # stops at the first generation past the budget


# ------------------------------------------------------------------------------ small heterogeneous cases
def test_data_parallel_on_fixed_different_accelerators_takes_each_design_alone():
    """No design is shared: each candidate is the accelerator(s) of one design; the result is
    the fastest of them, simulated from scratch here."""
    graph = chain()
    res = data_parallel(graph, FIXED, COST)
    expected = []
    for acc in FIXED.accelerator_ids:
        m = Mapping.single_set(graph, FIXED, devices=(acc,), design=FIXED.accelerator(acc).designs[0])
        expected.append(simulate(lower(graph, FIXED, m, COST), FIXED, setup=False).makespan)
    assert res.simulations == 4 and res.makespan == min(expected)
    assert len(res.best.sets) == 1 and len(res.best.sets[0].devices) == 1


def test_same_seed_same_search_on_fixed_accelerators():
    graph = two_models()
    cfg = GAConfig(population=8, generations=6)
    a = mars(graph, FIXED, COST, config=cfg, seed=4)
    b = mars(graph, FIXED, COST, config=cfg, seed=4)
    assert a.best.key == b.best.key
    assert a.history.drop(columns=["wall_s"]).to_dict("list") == b.history.drop(columns=["wall_s"]).to_dict("list")
    c = mars(graph, FIXED, COST, config=cfg, seed=5)
    assert c.history.drop(columns=["wall_s"]).to_dict("list") != a.history.drop(columns=["wall_s"]).to_dict("list")


def test_level1_operators_keep_genomes_valid_and_change_the_assignment():
    """Mutation, crossover and one-operator neighbours on random genomes: every child decodes
    to a valid mapping whose genome round trips; the segment operator produces each of its
    kinds of change (classified here from the genes alone)."""
    st = state(GRAPH, FIXED, seed=1)
    space = st.space
    rng = np.random.default_rng(3)
    kinds = set()
    for _ in range(150):
        g = space.random(rng)
        h = space.random(rng)
        children = [st.mutate(g), st.neighbour(g), *st.mate(g, h)]
        for child in children:
            m = space.decode(child)
            assert mapping_problems(m, GRAPH, FIXED) == []
            assert space.decode(space.encode(m)) == m
        sets = space.decoded_sets(g.cuts)
        bounds, assign = (list(x) for x in space.segments(g, len(sets)))
        nb, na = st._mutate_segments(g, sets, list(bounds), list(assign))
        assert len(na) == len(nb) + 1 and list(nb) == sorted(set(nb)) and all(0 <= a < len(sets) for a in na)
        if len(na) == len(assign) + 1:
            kinds.add("split")
            assert set(bounds) < set(nb)
        elif len(na) == len(assign) - 1:
            kinds.add("merge")
            assert set(nb) < set(bounds)
        elif nb == bounds and sum(x != y for x, y in zip(na, assign)) == 1:
            kinds.add("move")
        elif nb == bounds and sorted(na) == sorted(assign) and sum(x != y for x, y in zip(na, assign)) == 2:
            kinds.add("swap")
        else:
            assert (nb, na) == (bounds, assign)  # nothing to change (or the fastest set already)
    assert kinds == {"split", "merge", "move", "swap"}


def test_computation_aware_designs_are_the_fastest_for_each_sets_layers():
    """Adaptive accelerators: each used set takes the design whose summed layer times (cost
    model, one device) are the smallest, computed here op by op."""
    from test_search_support import system

    graph, sys_ = chain(), system(4)
    st = state(graph, sys_)
    rng = np.random.default_rng(0)
    for _ in range(20):
        g = st.computation_aware(st.space.random(rng))
        sets, labels = st.space.layer_sets(g)
        for i, devices in enumerate(sets):
            layers = [graph.layers[li] for li in np.flatnonzero(labels == i)]
            if not layers:
                continue
            totals = {d: sum(COST.op_time(graph.ops[k], sys_.design(devices[0], d)) for layer in layers for k in layer)
                      for d in st.space.allowed_designs(devices)}
            assert st.space.set_design(g, sets, i) == min(totals, key=totals.get)


def test_computation_aware_assignment_sends_each_model_to_the_accelerator_that_suits_it():
    """Two models on fixed accelerators with fast links: a convolution stack and a wide MLP.
    The greedy assignment (one segment per model) puts each on the accelerator where it runs
    fastest when they do not compete: checked against the cost model's times directly."""
    def cnn():
        b = GraphBuilder("cnn", batch=2)
        x = b.input("img", c=32, h=32, w=32)
        for i in range(3):
            x = b.conv(f"c{i}", x, 64, kernel=3)
        return b.build()

    def mlp():
        b = GraphBuilder("mlp", batch=2)
        x = b.input("x", c=2048)
        for i in range(2):
            x = b.linear(f"l{i}", x, 2048)
        return b.build()

    from marssim.workload.graph import merge_graphs

    graph = merge_graphs("pair", [cnn(), mlp()])
    st = state(graph, FIXED)
    space = st.space
    g = replace(space.uniform(1), cuts=(True,) * 3, boundaries=space.model_starts, assignment=(0, 0))
    out = space.decode(st.assign_greedy(g))
    best = {}
    for model in ("cnn", "mlp"):
        ops = [k for k in graph.compute_ops if graph.ops[k].model == model]
        times = {a: sum(COST.op_time(graph.ops[k], FIXED.design(a, FIXED.accelerator(a).designs[0])) for k in ops)
                 for a in FIXED.accelerator_ids}
        best[model] = min(times, key=times.get)
    assert best["cnn"] != best["mlp"]  # the case is meaningful
    placed = {graph.ops[gi].model: out.sets[out.op_set[k]].devices[0] for k, gi in enumerate(graph.compute_ops)}
    assert placed == best
