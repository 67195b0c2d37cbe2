"""The MARS GA and its baselines: optimality on enumerable spaces, determinism, returned
mappings that validate and whose fitness is a fresh simulation, seeds, budgets, caching."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest

from marssim.lower import lower
from marssim.mapping import AcceleratorSet, Mapping, mapping_problems
from marssim.search.baselines import count_space, data_parallel, exhaustive, h2h, random_search, set_partitions
from marssim.search.evaluate import Evaluator, MappingEvaluation, Problem, rank_value
from marssim.search.ga import GAConfig, mars
from marssim.search.runner import SearchSettings, run_algorithm
from marssim.search.space import MappingSpace
from marssim.sim import simulate
from marssim.workload import GraphBuilder
from marssim.workload.graph import merge_graphs
from test_search_support import EnergyRoofline, chain, small_space, system, two_models
from support import DESIGN, RooflineCost, make_system

COST = RooflineCost()


def fresh(graph, sys_, mapping, cost=COST):
    """Simulate a mapping from scratch (full simulator, not the search's evaluation path)."""
    return simulate(lower(graph, sys_, mapping, cost), sys_, setup=False)


def history_without_wall(result):
    return result.history.drop(columns=["wall_s"]).to_dict("list")


# ------------------------------------------------------------------------------ the space
@pytest.mark.parametrize("n_acc, expected", [(2, 20), (3, 86)])
def test_count_space_matches_a_hand_count(n_acc, expected):
    """Two designs on every accelerator, 2 layers, strategies none/dp, one micro-batch choice.
    A mapping uses some disjoint runs of accelerators, each running at least one layer, in any
    order; a layer on a set of several devices has 2 shardings, on one device 1.

    n=2: {a0a1}: 2 designs x 2x2 shardings = 8; {a0} or {a1} alone: 2 x 1 each = 4;
    {a0}{a1}: 4 designs x 2 ways to place the two layers = 8 -> 20.
    n=3: one run: {a0a1a2}, {a0a1}, {a1a2}: 8 each = 24; {a0}, {a1}, {a2}: 2 each = 6;
    two single runs ({a0}{a1}, {a0}{a2}, {a1}{a2}): 4 x 2 = 8 each = 24; a pair and a single
    ({a0a1}{a2}, {a0}{a1a2}): 4 designs x 2 placements x 2 shardings = 16 each = 32; three
    runs cannot all run one of two layers -> 86."""
    b = GraphBuilder("two", batch=2)
    x = b.input("x", c=64)
    x = b.linear("l1", x, 64)
    b.linear("l2", x, 64)
    graph = b.build()
    space = MappingSpace(graph, system(n_acc), micro_batch_choices=(1,), strategies=("none", "dp"))
    assert count_space(space) == expected
    res = exhaustive(graph, system(n_acc), COST, space=space)
    assert res.notes["distinct_mappings"] == expected
    assert res.simulations == expected


def test_set_partitions_respect_design_compatibility():
    sys_ = make_system(3, designs={"x": DESIGN, "y": {**DESIGN, "dataflow": "ws"}})
    space = MappingSpace(chain(), sys_)
    parts = list(set_partitions(space))
    assert len(parts) == len(set(parts)) == 4  # {012} {0}{12} {01}{2} {0}{1}{2}
    for p in parts:
        assert [d for s in p for d in s] == list(sys_.accelerator_ids)


# ------------------------------------------------------------------------------ exhaustive and GA optimality
CASES = {
    # two models side by side; the optimum puts the CNN on "big" and the MLP on "wide"
    "two-models-3acc": (two_models, 3, {}),
    # one model; the optimum pipelines the convolutions on "big" and the MLP on "wide"
    "chain-3acc": (chain, 3, {}),
}


@pytest.fixture(scope="module", params=sorted(CASES))
def enumerated(request):
    make_graph, n_acc, kwargs = CASES[request.param]
    graph, sys_ = make_graph(), system(n_acc, **kwargs)
    space = small_space(graph, sys_)
    ev = Evaluator(Problem(graph, sys_, COST))
    best = exhaustive(graph, sys_, COST, space=space, evaluator=ev)
    return request.param, graph, sys_, space, best, ev


def test_exhaustive_optimum_beats_every_sampled_mapping(enumerated):
    """Independent check: no randomly drawn mapping, simulated from scratch, beats it."""
    _, graph, sys_, space, best, ev = enumerated
    assert best.simulations == count_space(space) > 200
    rng = np.random.default_rng(3)
    for _ in range(15):
        m = space.decode(space.random(rng))
        assert fresh(graph, sys_, m).makespan >= best.makespan
    # and it is the minimum over everything it simulated
    assert best.fitness == min(e.fitness() for e in ev._sim.values())


def test_ga_finds_the_exhaustive_optimum_with_its_default_config(enumerated):
    name, graph, sys_, space, best, _ = enumerated
    for seed in (0, 1, 2):
        res = mars(graph, sys_, COST, config=GAConfig(), seed=seed, space=space)
        assert res.fitness == best.fitness, (name, seed, res.fitness / best.fitness - 1)
        assert res.simulations < best.simulations  # it did not simply enumerate


def test_the_optimum_is_not_a_baseline(enumerated):
    """The cases are meaningful: the optimum is far from data parallelism and uses both designs
    on different sets (level 1 matters); H2H, which places whole layers on single accelerators
    (points of the space too), does not beat it."""
    _, graph, sys_, space, best, _ = enumerated
    dp = data_parallel(graph, sys_, COST)
    assert best.makespan < 0.8 * dp.makespan
    assert len(best.best.sets) >= 2 and {s.design for s in best.best.sets} == {"big", "wide"}
    assert best.makespan <= h2h(graph, sys_, COST, micro_batch_choices=space.micro_batch_choices).makespan


# ------------------------------------------------------------------------------ returned mappings
ALGORITHMS = {
    "mars": lambda g, s, **kw: mars(g, s, COST, config=GAConfig(population=6, generations=3), seed=5, **kw),
    "data_parallel": lambda g, s, **kw: data_parallel(g, s, COST, **kw),
    "h2h": lambda g, s, **kw: h2h(g, s, COST, **kw),
    "random": lambda g, s, **kw: random_search(g, s, COST, budget=30, seed=5, **kw),
}


@pytest.mark.parametrize("algorithm", sorted(ALGORITHMS))
@pytest.mark.parametrize("objective", ["latency", "throughput"])
def test_returned_mapping_validates_and_its_fitness_is_a_fresh_simulation(algorithm, objective):
    graph, sys_ = two_models(), system(4)
    res = ALGORITHMS[algorithm](graph, sys_, objective=objective)
    assert res.algorithm == algorithm and res.objective == objective
    assert mapping_problems(res.best, graph, sys_) == []
    again = fresh(graph, sys_, res.best)
    assert res.evaluation.makespan == again.makespan  # bit for bit
    assert res.evaluation.throughput == again.throughput
    expected = again.makespan if objective == "latency" else 1.0 / again.throughput
    assert res.fitness == expected
    assert res.evaluation.feasible and math.isfinite(res.fitness)


def test_energy_objective_reports_simulated_energy_and_beats_data_parallel():
    graph, sys_ = two_models(), system(3)
    cost = EnergyRoofline()
    res = mars(graph, sys_, cost, objective="energy", config=GAConfig(population=6, generations=4), seed=1)
    again = simulate(lower(graph, sys_, res.best, cost), sys_, setup=False)
    assert res.evaluation.energy == again.energy and res.fitness == again.energy
    dp = data_parallel(graph, sys_, cost, objective="energy")
    assert res.fitness <= dp.fitness
    edp = mars(graph, sys_, cost, objective="edp", config=GAConfig(population=4, generations=2), seed=1)
    assert edp.fitness == edp.evaluation.energy * edp.evaluation.makespan


def test_energy_objective_without_energy_figures_is_infinite():
    e = MappingEvaluation(1e-3, 10.0, energy=float("nan"))
    assert e.fitness("energy") == math.inf and e.fitness("edp") == math.inf
    with pytest.raises(ValueError, match="unknown objective"):
        e.fitness("speed")
    with pytest.raises(ValueError, match="mapping evaluation"):  # a deployment's objective is no mapping's
        e.fitness("goodput")


# ------------------------------------------------------------------------------ determinism, seeds, budget
def test_same_seed_same_search():
    graph, sys_ = chain(), system(4)
    cfg = GAConfig(population=8, generations=4)
    a = mars(graph, sys_, COST, config=cfg, seed=11)
    b = mars(graph, sys_, COST, config=cfg, seed=11)
    assert a.best == b.best and a.best.key == b.best.key
    assert history_without_wall(a) == history_without_wall(b)
    r1 = random_search(graph, sys_, COST, budget=20, seed=4)
    r2 = random_search(graph, sys_, COST, budget=20, seed=4)
    assert r1.best == r2.best and r1.simulations == r2.simulations == 20
    assert h2h(graph, sys_, COST).best == h2h(graph, sys_, COST).best


def test_rank_value_ties_rounding_noise_and_separates_real_differences():
    x = 5.263712345678901e-05
    assert rank_value(x) == rank_value(np.nextafter(x, 1.0)) == rank_value(x * (1 + 4e-16))
    assert rank_value(x) < rank_value(x * (1 + 1e-9))
    assert rank_value(math.inf) == math.inf and rank_value(0.0) == 0.0
    assert abs(rank_value(x) / x - 1) < 1e-11


class _NoisyEvaluator(Evaluator):
    """Every result off by a few units in the last place, differently per mapping (as another
    machine's floating point would be)."""

    def _noisy(self, mappings, evaluations):
        out = []
        for m, e in zip(mappings, evaluations):
            ulps = int(m.key[-2:], 16) % 7 - 3
            t = e.makespan
            for _ in range(abs(ulps)):
                t = float(np.nextafter(t, math.inf if ulps > 0 else 0.0))
            out.append(replace(e, makespan=t))
        return out

    def simulate(self, mappings):
        return self._noisy(mappings, super().simulate(mappings))

    def estimate(self, mappings):
        return self._noisy(mappings, super().estimate(mappings))


def test_rounding_noise_does_not_change_the_search(enumerated):
    """Equivalent mappings on a symmetric ring tie up to rounding; the GA ranks at 12 digits, so
    ulp-level noise (another machine) leaves its whole search, and its answer, unchanged."""
    _, graph, sys_, space, _, _ = enumerated
    cfg = GAConfig(generations=4)
    plain = mars(graph, sys_, COST, config=cfg, seed=1, space=space)
    noisy = mars(graph, sys_, COST, config=cfg, seed=1, space=space,
                 evaluator=_NoisyEvaluator(Problem(graph, sys_, COST)))
    assert noisy.best.key == plain.best.key
    assert noisy.history["simulations"].tolist() == plain.history["simulations"].tolist()
    assert noisy.fitness == pytest.approx(plain.fitness, rel=1e-14)


def test_ga_never_returns_worse_than_its_best_seed(enumerated):
    _, graph, sys_, space, best, _ = enumerated
    tiny = GAConfig(population=2, generations=1, inner_population=2, inner_generations=0)
    # a seed outside the GA's own space (strategies restricted to dp) that it cannot reach
    narrow = GAConfig(population=2, generations=1, inner_population=2, inner_generations=0, strategies=("dp",),
                      micro_batch_choices=(1,))
    for cfg in (tiny, narrow):
        res = mars(graph, sys_, COST, config=cfg, seed=0, seeds=[best.best])
        assert res.fitness <= best.fitness
    baselines = [data_parallel(graph, sys_, COST), h2h(graph, sys_, COST)]
    res = mars(graph, sys_, COST, config=tiny, seed=0, seeds=[b.best for b in baselines])
    assert res.fitness <= min(b.fitness for b in baselines)


def test_ga_seeded_by_default_with_both_baselines_is_never_worse_than_either():
    """On fixed accelerators of different designs, where H2H is the strong baseline: the
    default settings seed the GA with data_parallel and h2h, and even a one-generation GA of
    two individuals returns no worse than the better of them."""
    from test_space import FIXED

    graph = two_models()
    settings = SearchSettings(config=GAConfig(population=2, generations=1, inner_population=2, inner_generations=0))
    assert settings.seed_with == ("data_parallel", "h2h")
    dp = run_algorithm("data_parallel", graph, FIXED, COST, settings)
    hh = run_algorithm("h2h", graph, FIXED, COST, settings)
    assert hh.fitness < dp.fitness
    for baselines in (None, {"data_parallel": dp, "h2h": hh}):
        res = run_algorithm("mars", graph, FIXED, COST, settings, baselines=baselines)
        assert res.fitness <= hh.fitness and res.notes["seeded_with"] == ("data_parallel", "h2h")
        assert res.notes["seed_simulations"] == (dp.simulations + hh.simulations if baselines is None else 0)


def test_simulation_budget_stops_the_search_at_a_generation_boundary():
    graph, sys_ = chain(), system(4)
    budget = 40
    res = mars(graph, sys_, COST, config=GAConfig(max_simulations=budget, generations=50, patience=50), seed=2)
    sims = res.history["simulations"].tolist()
    assert all(s < budget for s in sims[:-1]) and sims[-1] >= budget
    assert res.simulations == sims[-1]
    assert len(sims) < 50


def test_early_stop_after_patience_generations_without_improvement():
    """One accelerator, one design, one micro-batch choice: nothing to improve after the first
    generation (and an initial population larger than the level-1 space must not hang)."""
    graph = chain()
    sys_ = make_system(1)
    res = mars(graph, sys_, COST, config=GAConfig(population=8, generations=20, patience=2,
                                                  micro_batch_choices=(1,)), seed=0)
    assert len(res.history) == 3
    assert res.best.sets == (AcceleratorSet(("acc0",), "os16"),)


# ------------------------------------------------------------------------------ evaluator
def test_evaluator_caches_by_mapping_hash_and_keeps_order():
    graph, sys_ = chain(), system(2)
    ev = Evaluator(Problem(graph, sys_, COST))
    a = Mapping.single_set(graph, sys_, design="big")
    b = Mapping.single_set(graph, sys_, design="wide")
    out = ev.simulate([a, b, a])
    assert ev.simulations == 2 and ev.cache_hits == 0
    assert out[0] is out[2] and out[0].makespan == fresh(graph, sys_, a).makespan
    assert out[1].makespan == fresh(graph, sys_, b).makespan
    again = ev.simulate([b, Mapping.single_set(graph, sys_, design="wide")])  # equal value, new object
    assert ev.simulations == 2 and ev.cache_hits == 2 and again[0] is out[1] and again[1] is out[1]


def test_infeasible_mappings_have_infinite_fitness_and_are_not_returned():
    """Weights of the fully connected layer (4 MiB) do not fit one 3 MiB device; split over
    two devices they do."""
    b = GraphBuilder("fat", batch=2)
    x = b.input("x", c=1024)
    b.linear("fc", x, 2048, bias=False)
    graph = b.build()
    sys_ = make_system(2, capacity="3 MiB")
    ev = Evaluator(Problem(graph, sys_, COST))
    whole = Mapping.single_set(graph, sys_, devices=("acc0",))
    e = ev.simulate([whole])[0]
    assert not e.feasible and e.fitness() == math.inf and "acc0" in e.error
    res = mars(graph, sys_, COST, config=GAConfig(population=4, generations=2), seed=0)
    assert res.evaluation.feasible and math.isfinite(res.fitness)


# ------------------------------------------------------------------------------ baselines
def test_data_parallel_is_the_best_single_design_dp_mapping():
    graph, sys_ = two_models(), system(3)
    res = data_parallel(graph, sys_, COST)
    expected = min(fresh(graph, sys_, Mapping.single_set(graph, sys_, design=d, sharding="dp")).makespan
                   for d in ("big", "wide"))
    assert res.makespan == expected
    assert len(res.best.sets) == 1 and res.best.sets[0].devices == sys_.accelerator_ids
    assert set(res.best.op_sharding) == {"dp"}


def test_h2h_runs_independent_models_side_by_side():
    """Two identical chains, two identical accelerators, fast links: the greedy makespan-aware
    assignment puts each model whole on its own accelerator, halving the makespan."""
    def mlp(name):
        b = GraphBuilder(name, batch=2)
        x = b.input("x", c=256)
        for i in range(3):
            x = b.linear(f"l{i}", x, 256)
        return b.build()

    graph = merge_graphs("pair", [mlp("m0"), mlp("m1")])
    sys_ = make_system(2, bandwidth="1 TB/s", latency="10 ns", host_bandwidth="1 TB/s")
    res = h2h(graph, sys_, COST)
    model_sets = {}
    for k, gi in enumerate(graph.compute_ops):
        model_sets.setdefault(graph.ops[gi].model, set()).add(res.best.op_set[k])
    assert all(len(s) == 1 for s in model_sets.values())
    assert model_sets["m0"] != model_sets["m1"]
    serial = fresh(graph, sys_, Mapping.single_set(graph, sys_, devices=("acc0",), sharding="none")).makespan
    assert res.makespan < 0.6 * serial
    assert all(len(s.devices) == 1 for s in res.best.sets) and set(res.best.op_sharding) == {"none"}


def test_h2h_keeps_a_chain_on_the_fast_accelerator_when_links_are_slow():
    """acc0 is fixed to a 4x faster design; links are slow: every layer stays on acc0."""
    fast = {**DESIGN, "pe_rows": 32, "pe_cols": 32, "sram_bandwidth": "800 GB/s"}
    sys_ = system(2, bandwidth="1 GB/s")
    from marssim.system import system_from_dict

    sys_ = system_from_dict({
        "name": "fixed-pair", "designs": {"fast": fast, "slow": DESIGN},
        "accelerators": [{"id": "acc0", "design": "fast", "memory": {"capacity": "1 GiB", "bandwidth": "1 TB/s"}},
                         {"id": "acc1", "design": "slow", "memory": {"capacity": "1 GiB", "bandwidth": "1 TB/s"}}],
        "hosts": [{"id": "host0", "dram": {"capacity": "8 GiB", "bandwidth": "100 GB/s"}}],
        "links": [{"between": ["acc0", "acc1"], "bandwidth": "1 GB/s", "latency": "1 us"},
                  {"between": ["host0", "acc0"], "bandwidth": "32 GB/s"},
                  {"between": ["host0", "acc1"], "bandwidth": "32 GB/s"}]}, "<fixed-pair>")
    res = h2h(chain(), sys_, COST)
    assert set(res.best.op_set) == {0}
    assert res.notes["designs"] == {"acc0": "fast", "acc1": "slow"}


# ------------------------------------------------------------------------------ operators
def test_variation_operators():
    from marssim.search.ga import cx_two_point, cx_uniform, flip_bits, tournament

    rng = np.random.default_rng(0)
    keys = [5.0, 1.0, 3.0, 1.0]
    # a tournament of 8 (with replacement) almost always sees a best one; ties go to the lower
    # index, so 1 wins whenever both 1 and 3 are drawn
    wins = tournament(rng, keys, 200, 8)
    assert sum(w in (1, 3) for w in wins) > 190 and wins.count(1) > 2 * wins.count(3)
    assert tournament(rng, keys, 5, 1) and all(0 <= w < 4 for w in tournament(rng, keys, 5, 1))
    for _ in range(20):
        a, b = list("abcdef"), list("ABCDEF")
        cx_uniform(rng, a, b)
        assert all({x.lower(), y.lower()} == {c} and x != y for x, y, c in zip(a, b, "abcdef"))
        a, b = list("abcdef"), list("ABCDEF")
        cx_two_point(rng, a, b)
        swapped = [i for i, x in enumerate(a) if x.isupper()]
        assert swapped == list(range(swapped[0], swapped[-1] + 1)) if swapped else True
        assert [x.lower() for x in a] == list("abcdef") and [x.upper() for x in b] == list("ABCDEF")
    bits = [True, False] * 50
    assert flip_bits(rng, bits, 0.0) == bits and flip_bits(rng, bits, 1.0) == [not x for x in bits]
    assert 20 < sum(x != y for x, y in zip(bits, flip_bits(rng, bits, 0.5))) < 80


def test_summary_simulation_equals_the_full_simulation_bit_for_bit():
    """The search's fast path (no interval log) reports exactly what a full simulation does."""
    from marssim.sim import simulate_summary

    graph, sys_ = two_models(), system(4)
    space = MappingSpace(graph, sys_)
    rng = np.random.default_rng(1)
    for cost in (COST, EnergyRoofline()):
        for _ in range(6):
            m = space.decode(space.random(rng))
            tg = lower(graph, sys_, m, cost)
            full, fast = simulate(tg, sys_), simulate_summary(tg, sys_)
            assert (fast.makespan, fast.throughput) == (full.makespan, full.throughput)
            assert fast.energy == full.energy or (math.isnan(fast.energy) and math.isnan(full.energy))
    # the spill policy too: 128 KiB activations overflow a 200 KiB memory and spill to the host
    b = GraphBuilder("convs", batch=4)
    x = b.input("img", c=16, h=16, w=16)
    for i in range(3):
        x = b.conv(f"c{i}", x, 64, kernel=3)
    graph = b.build()
    tight = make_system(2, capacity="200 KiB")
    m = Mapping.single_set(graph, tight, devices=("acc0",), sharding="none")
    tg = lower(graph, tight, m, COST)
    full, fast = simulate(tg, tight, memory_policy="spill"), simulate_summary(tg, tight, memory_policy="spill")
    assert full.meta["spills"] > 0 and fast.makespan == full.makespan


def test_h2h_pipelines_a_chain_over_micro_batches():
    """Four equal layers, two equal accelerators, fast links, batch 8: split into micro-batches,
    two layers per accelerator overlap like a two-stage pipeline, well under the one-accelerator
    time; with one micro-batch allowed they cannot overlap."""
    b = GraphBuilder("mlp4", batch=8)
    x = b.input("x", c=512)
    for i in range(4):
        x = b.linear(f"l{i}", x, 512)
    graph = b.build()
    sys_ = make_system(2, bandwidth="1 TB/s", latency="10 ns", host_bandwidth="1 TB/s")
    serial = fresh(graph, sys_, Mapping.single_set(graph, sys_, devices=("acc0",), sharding="none")).makespan
    res = h2h(graph, sys_, COST)
    assert res.notes["micro_batches"] > 1 and len(set(res.best.op_set)) == 2
    assert res.makespan < 0.7 * serial
    one = h2h(graph, sys_, COST, micro_batch_choices=(1,))
    assert one.notes["micro_batches"] == 1 and one.makespan > 0.95 * serial


def test_estimates_carry_the_simulated_energy_and_screen_every_objective():
    """The compute energy does not depend on the schedule: the estimate reports the simulated
    energy exactly; on a single chain on one device nothing contends, so the estimated makespan
    and throughput equal the simulated ones too."""
    graph, sys_ = two_models(), system(3)
    cost = EnergyRoofline()
    ev = Evaluator(Problem(graph, sys_, cost))
    space = MappingSpace(graph, sys_)
    rng = np.random.default_rng(2)
    for m in [space.decode(space.random(rng)) for _ in range(5)]:
        est, sim = ev.estimate([m])[0], ev.simulate([m])[0]
        assert est.energy == sim.energy
    one = Mapping.single_set(chain(), sys_, devices=("acc0",), sharding="none")
    ev1 = Evaluator(Problem(chain(), sys_, cost))
    est, sim = ev1.estimate([one])[0], ev1.simulate([one])[0]
    assert est.makespan == pytest.approx(sim.makespan, rel=1e-12)
    assert est.throughput == pytest.approx(sim.throughput, rel=1e-12)
    res = mars(graph, sys_, cost, objective="energy", config=GAConfig(population=4, generations=2), seed=0)
    assert res.notes["screened"] and res.estimates > 0
