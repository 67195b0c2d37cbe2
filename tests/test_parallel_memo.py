"""The bounded, locked memos of the parallel package (marssim/parallel/memo.py): their bound, the
order they drop values in, one value per key under threads, and a memo that goes with its owner."""

from __future__ import annotations

import gc
import threading

import pytest

from marssim.parallel.memo import GRAPH_MEMO, BoundedCache, OwnerMemo, graph_cached, kind_of


def test_a_bounded_cache_drops_the_least_recently_used_value():
    cache = BoundedCache(3)
    for k in "abc":
        cache.put(k, k.upper())
    assert cache.get("a") == "A"  # now the most recently used: "b" is the oldest
    cache.put("d", "D")
    assert len(cache) == 3
    assert "b" not in cache and cache.keys() == ["c", "a", "d"]
    assert cache.get("b", "missing") == "missing"


def test_get_or_make_makes_once_and_keeps_a_falsy_value():
    cache = BoundedCache(2)
    calls = []

    def make():
        calls.append(1)
        return 0  # falsy: still a stored value, not a miss

    assert cache.get_or_make("k", make) == 0
    assert cache.get_or_make("k", make) == 0
    assert calls == [1]


def test_a_bounded_cache_holds_at_least_one_value():
    with pytest.raises(ValueError):
        BoundedCache(0)


def test_threads_missing_one_key_at_once_all_get_the_first_value_stored():
    """Each thread makes its own object; every caller gets the same one back (the first stored),
    and the cache never exceeds its bound while 8 threads fill it."""
    cache = BoundedCache(16)
    start, filled = threading.Barrier(8), threading.Barrier(8)
    got: list[object] = [None] * 8
    sizes: list[int] = []

    def work(i: int) -> None:
        start.wait()
        got[i] = cache.get_or_make("shared", object)
        filled.wait()  # every thread has its value before any fills the cache past its bound
        for j in range(200):
            cache.get_or_make((i, j), lambda j=j: j)
            sizes.append(len(cache))

    threads = [threading.Thread(target=work, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len({id(g) for g in got}) == 1
    assert max(sizes) <= 16 and len(cache) == 16


def test_an_owner_memo_bounds_each_kind_and_goes_with_its_owner():
    class Owner:
        pass

    memo = OwnerMemo(default_size=2, sizes={"big": 4})
    owner = Owner()
    for i in range(5):
        memo.get_or_make(owner, ("small", i), lambda i=i: i)
        memo.get_or_make(owner, ("big", i), lambda i=i: i)
    assert len(memo.cache(owner, "small")) == 2 and len(memo.cache(owner, "big")) == 4
    assert memo.get_or_make(owner, ("small", 4), lambda: "made again") == 4  # kept: the latest two
    assert memo.get_or_make(owner, ("small", 0), lambda: "made again") == "made again"  # dropped
    assert len(memo._owners) == 1
    del owner
    gc.collect()
    assert len(memo._owners) == 0


def test_kind_of_a_key():
    assert kind_of(("rules", 1, 2)) == "rules"
    assert kind_of("footprint") == "footprint"
    assert kind_of(()) == ()


def test_the_graph_memo_bounds_the_rules_of_many_layouts():
    """A search's thousands of configurations of one graph keep at most the bound of each kind."""
    class Graph:
        pass

    g = Graph()
    for i in range(3 * GRAPH_MEMO.sizes["rules"]):
        graph_cached(g, ("rules", i), lambda i=i: {"op": i})
    assert len(GRAPH_MEMO.cache(g, "rules")) == GRAPH_MEMO.sizes["rules"]


def test_screens_and_lowerings_on_threads_share_the_memos_and_agree_with_one_thread():
    """A thread pool screening and lowering configurations of one graph (the memos of the graph,
    the system and the rules shared between threads) gives the figures of one thread, bit for bit."""
    from concurrent.futures import ThreadPoolExecutor

    from marssim.cost import default_cost_model
    from marssim.parallel import lower_parallel, parse_parallel
    from marssim.parallel.analytic import screen
    from marssim.system import load_system
    from marssim.workload import load_workload

    system = load_system("dgx-a100-cluster:nodes=1")
    cost = default_cost_model()
    specs = [f"tp={tp},pp={pp},dp={8 // tp // pp},global_batch=8{extra}" for tp in (1, 2, 4) for pp in (1, 2)
             for extra in ("", ",sp=true", ",zero=1") if 8 % (tp * pp) == 0 and (tp > 1 or "sp" not in extra)]

    def figures(graph, spec: str) -> tuple:
        cfg = parse_parallel(spec)
        tg = lower_parallel(graph, system, cfg, cost)
        return screen(graph, system, cfg, cost).iteration_s, tg.n_tasks, float(tg.duration.sum())

    workload = "gpt:layers=4,hidden=256,heads=8,vocab=1000,seq=64,mode=train,max_positions=64"
    alone = [figures(load_workload(workload), s) for s in specs]
    shared = load_workload(workload)
    with ThreadPoolExecutor(4) as pool:
        threaded = list(pool.map(lambda s: figures(shared, s), specs * 2))
    assert threaded == alone * 2
