"""Lowering benchmark: ResNet-50 at batch 8 onto the 16 accelerators of mars-adaptive-16 with a
per-layer mix of shardings, a cold lowering (fresh cost model, nothing memoised) and a warm one.

Run: ``python analysis/bench_lower.py``. Target: < 50 ms per lowering. The committed output lives
in ``analysis/results/bench_lower.txt``.
"""

from __future__ import annotations

import os
import platform
import statistics
import time

from marssim.cost import default_cost_model
from marssim.lower import LoweringCache, lower
from marssim.mapping import AcceleratorSet, Mapping, legal_strategies
from marssim.search.space import MappingSpace
from marssim.system import load_system
from marssim.workload import load_workload

MIX = ("dp", "oc", "spatial", "ic", "seq", "head")


def mixed_mapping(graph, system, n_sets: int, micro: int) -> Mapping:
    """``n_sets`` sets of equal size with FLOP-balanced segments; layer ``i`` takes the ``i``-th
    strategy of MIX (cyclically) that is legal for it, so neighbouring layers re-distribute."""
    accs = system.accelerator_ids
    size = len(accs) // n_sets
    designs = ("os32", "ws32", "nvdla64", "shi32")
    sets = [AcceleratorSet(tuple(accs[i * size:(i + 1) * size]), designs[i % len(designs)]) for i in range(n_sets)]
    space = MappingSpace(graph, system)
    base = Mapping.pipeline(graph, system, sets, list(space.balanced_boundaries([1.0] * n_sets)),
                            micro_batches=micro)
    shard = list(base.op_sharding)
    position = {gi: k for k, gi in enumerate(graph.compute_ops)}
    for li, layer in enumerate(graph.layers):
        for j in range(len(MIX)):
            want = MIX[(li + j) % len(MIX)]
            if want in legal_strategies(graph.ops[layer[0]]):
                break
        for gi in layer:
            legal = legal_strategies(graph.ops[gi])
            shard[position[gi]] = want if want in legal else ("dp" if "dp" in legal else "none")
    return base.with_(op_sharding=tuple(shard))


def main() -> None:
    print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
          f"Python {platform.python_version()}")
    graph = load_workload("resnet50:batch=8")
    system = load_system("mars-adaptive-16")
    print(f"{'mapping':<44}{'tasks':>8}{'transfers':>11}{'cold ms':>10}{'warm ms':>10}{'search ms':>11}")
    for n_sets, micro in ((1, 1), (4, 1), (4, 4), (16, 8)):
        mapping = mixed_mapping(graph, system, n_sets, micro)
        colds, warms, searches = [], [], []
        for _ in range(5):
            cost = default_cost_model()
            t0 = time.perf_counter()
            tg = lower(graph, system, mapping, cost)
            colds.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            lower(graph, system, mapping, cost)
            warms.append(time.perf_counter() - t0)
            cache = LoweringCache(graph, system, cost)
            lower(graph, system, mapping, cost, cache=cache)
            t0 = time.perf_counter()
            lower(graph, system, mapping, cost, cache=cache)
            searches.append(time.perf_counter() - t0)
        transfers = int((tg.kind == 1).sum())
        name = f"{n_sets} sets, mixed shardings, {micro} micro-batches"
        print(f"{name:<44}{tg.n_tasks:>8}{transfers:>11}{statistics.median(colds) * 1e3:>10.1f}"
              f"{statistics.median(warms) * 1e3:>10.1f}{statistics.median(searches) * 1e3:>11.1f}")
    print("\ncold: a fresh cost model (nothing memoised); warm: the same cost model again; search: the same\n"
          "LoweringCache again, as a search shares one across its candidates. Median of 5; target < 50 ms.")


if __name__ == "__main__":
    main()
