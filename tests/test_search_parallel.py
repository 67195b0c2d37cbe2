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
    items = list(range(11))
    for parts in (1, 2, 3, 4, 11, 50):
        chunks = _chunks(items, parts)
        assert sorted(x for c in chunks for x in c) == items and _unchunk(chunks) == items
        assert len(chunks) == min(parts, 11) and max(map(len, chunks)) - min(map(len, chunks)) <= 1
        assert all(c == sorted(c) and all(b - a == len(chunks) for a, b in zip(c, c[1:])) for c in chunks)


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
