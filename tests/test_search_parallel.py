"""Parallel evaluation: a process pool and a Dask cluster give the same search as serial."""

from __future__ import annotations

from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor

import pytest

from marssim.search.evaluate import Evaluator, Problem, _chunks, _unchunk
from marssim.search.ga import GAConfig, mars
from marssim.search.space import MappingSpace
from test_search_support import chain, system, two_models
from support import RooflineCost

COST = RooflineCost()
CONFIG = GAConfig(population=6, generations=3)


def _signature(result):
    return result.best.key, result.fitness, result.history.drop(columns=["wall_s"]).to_dict("list")


@pytest.fixture(scope="module")
def serial():
    graph, sys_ = two_models(), system(4)
    return graph, sys_, mars(graph, sys_, COST, config=CONFIG, seed=3)


def test_chunks_deal_items_round_robin_and_unchunk_restores_the_order():
    items = [f"plan {i}" for i in range(11)]
    for parts in (1, 2, 3, 4, 11, 50):
        chunks = _chunks(items, parts)
        assert sorted(x for c in chunks for x in c) == list(range(11))
        assert _unchunk(chunks, [[items[i] for i in c] for c in chunks], len(items)) == items
        assert len(chunks) == min(parts, 11) and max(map(len, chunks)) - min(map(len, chunks)) <= 1
        assert all(c == sorted(c) and all(b - a == len(chunks) for a, b in zip(c, c[1:])) for c in chunks)


def test_configurations_are_chunked_by_the_graph_and_rules_they_share():
    """Parallel configurations go to chunks by micro-batch (the graph a worker prepares for
    them), in runs of equal length; unchunking restores the order."""
    from marssim.parallel import parse_parallel

    configs = [parse_parallel(f"tp={tp},pp=2,dp=2,micro_batch={mb},global_batch=32")
               for tp in (1, 2) for mb in (4, 1, 2, 8) for _ in range(2)]
    chunks = _chunks(configs, 4)
    assert [len(c) for c in chunks] == [4, 4, 4, 4]
    assert [{configs[i].micro_batch for i in c} for c in chunks] == [{1}, {2}, {4}, {8}]
    assert _unchunk(chunks, [[configs[i] for i in c] for c in chunks], len(configs)) == configs


def test_evaluator_results_follow_the_input_order_on_any_executor():
    import numpy as np

    graph, sys_ = chain(), system(3)
    space = MappingSpace(graph, sys_)
    rng = np.random.default_rng(0)
    mappings = [space.decode(space.random(rng)) for _ in range(9)]
    mappings += mappings[:3]  # duplicates are simulated once and returned at each position
    reference = Evaluator(Problem(graph, sys_, COST)).simulate(mappings)
    with ThreadPoolExecutor(3) as pool:
        ev = Evaluator(Problem(graph, sys_, COST), pool)
        assert [e.makespan for e in ev.simulate(mappings)] == [e.makespan for e in reference]
        assert ev.simulations == len({m.key for m in mappings})


def test_a_worker_without_the_problem_gets_it_again():
    """After the first batch tasks carry the problem's key alone; a worker that no longer holds
    the problem answers Missing and its chunk is sent again with the bytes: same results."""
    import numpy as np

    from marssim.search import evaluate
    from marssim.workercache import Missing, worker_copy

    assert isinstance(worker_copy({}, "key", None), Missing)
    graph, sys_ = chain(), system(3)
    space = MappingSpace(graph, sys_)
    rng = np.random.default_rng(1)
    mappings = [space.decode(space.random(rng)) for _ in range(8)]
    reference = [e.makespan for e in Evaluator(Problem(graph, sys_, COST)).simulate(mappings)]
    with ThreadPoolExecutor(2) as pool:
        ev = Evaluator(Problem(graph, sys_, COST), pool)
        first = ev.simulate(mappings[:4])
        assert ev._shipped
        evaluate._PROBLEMS.pop(ev._key)  # as a new worker process would be: without the problem
        second = ev.simulate(mappings[4:])
        assert ev._key in evaluate._PROBLEMS  # sent again, with the bytes
    assert [e.makespan for e in first + second] == reference


def test_simulations_in_flight_settle_in_order_as_waited_for_ones():
    """simulate_soon submits without waiting (counted at once, each plan once); settle_next
    gives each batch's evaluations in the order asked, the same as simulate's, and caches them
    in submission order."""
    import numpy as np

    graph, sys_ = chain(), system(3)
    space = MappingSpace(graph, sys_)
    rng = np.random.default_rng(2)
    mappings = [space.decode(space.random(rng)) for _ in range(6)]
    serial = Evaluator(Problem(graph, sys_, COST))
    reference = [serial.simulate(mappings[:4]), serial.simulate(mappings[2:])]
    with ThreadPoolExecutor(2) as pool:
        ev = Evaluator(Problem(graph, sys_, COST), pool)
        ev.simulate_soon(mappings[:4])
        ev.simulate_soon(mappings[2:])  # two of them already in flight: not submitted again
        assert ev.simulations == 6 and ev.in_flight(mappings[5]) and ev.known(mappings[0]) is not None
        assert not ev._in_flight  # known() waited for everything in flight
        assert (ev.soon_batches, ev.settled_batches) == (2, 2)
    with ThreadPoolExecutor(2) as pool:
        ev = Evaluator(Problem(graph, sys_, COST), pool)
        ev.simulate_soon(mappings[:4])
        ev.simulate_soon(mappings[2:])
        got = [ev.settle_next(), ev.settle_next(), ev.settle_next()]
    assert got[2] is None
    for (plans, evals), ref, asked in zip(got, reference, (mappings[:4], mappings[2:])):
        assert plans == asked and [e.makespan for e in evals] == [e.makespan for e in ref]
    assert [p.key for p, _ in ev.simulated_plans()] == [p.key for p, _ in serial.simulated_plans()]


def test_process_pool_gives_the_serial_search(serial):
    graph, sys_, expected = serial
    with ProcessPoolExecutor(2) as pool:
        res = mars(graph, sys_, COST, config=CONFIG, seed=3, executor=pool)
    assert _signature(res) == _signature(expected)


def test_dask_cluster_gives_the_serial_search(serial):
    distributed = pytest.importorskip("distributed")
    graph, sys_, expected = serial
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None,
                                  silence_logs=40) as cluster, distributed.Client(cluster) as client:
        res = mars(graph, sys_, COST, config=CONFIG, seed=3, executor=client.get_executor())
    assert _signature(res) == _signature(expected)
