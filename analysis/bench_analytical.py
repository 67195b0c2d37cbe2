"""How much faster the analytical estimate is than simulating the same TaskGraph.

For each (system, workload) pair, sampled mappings (the same families ``marssim validate``
samples: uniform, pipelines with many micro-batches, channel sharding) are lowered once; then the
simulation (no timelines, no set-up run, as the search and ``validate`` run it) and the estimate
(compiled kernels, and the pure-Python fallback) are timed on the same TaskGraph. Times are
medians of repeats after a warm-up call; compare the ratios, measured in one run on one machine.

Run: ``PYTHONPATH=. python analysis/bench_analytical.py``; the output is committed in
``analysis/results/bench_analytical.txt``.
"""

from __future__ import annotations

import os
import platform
import statistics
import time

import numpy as np

from marssim.cost import default_cost_model
from marssim.analytical import estimate, have_numba
from marssim.lower import lower
from marssim.sim import simulate
from marssim.system import load_system
from marssim.search.sample import sample_mappings
from marssim.workload import load_workload

PAIRS = [("mars-adaptive-16", "resnet50:batch=8"), ("dgx-h100", "bert-base:batch=8"),
         ("ring-8", "mobilenetv2:batch=8")]
PER_PAIR = 9
SEED = 0


def _median(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main() -> None:
    cost, cost_name = default_cost_model(), "marssim.cost.default_cost_model()"
    print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
          f"Python {platform.python_version()}; cost model: {cost_name}")
    print(f"compiled kernels (numba): {'yes' if have_numba() else 'NO: only the Python column is meaningful'}")
    print()
    print(f"{'system':<18}{'workload':<20}{'mapping':<18}{'tasks':>7}{'sim ms':>10}{'est ms':>9}{'ratio':>8}"
          f"{'py ms':>9}{'ratio':>7}")
    ratios: dict[str, list[float]] = {}
    py_ratios: dict[str, list[float]] = {}
    for system_name, spec in PAIRS:
        system = load_system(system_name)
        graph = load_workload(spec)
        for item in sample_mappings(graph, system, PER_PAIR, seed=SEED):
            tg = lower(graph, system, item.mapping, cost)
            try:
                simulate(tg, system, record=False, setup=False)
            except Exception as err:  # a mapping that does not fit memory is not timed
                print(f"{system_name:<18}{spec:<20}{item.name:<18}{tg.n_tasks:>7}  not simulated: {type(err).__name__}")
                continue
            sim = _median(lambda: simulate(tg, system, record=False, setup=False), 3)
            estimate(tg, system)
            est = _median(lambda: estimate(tg, system), 15)
            py = _median(lambda: estimate(tg, system, backend="python"), 3)
            ratios.setdefault(system_name, []).append(sim / est)
            py_ratios.setdefault(system_name, []).append(sim / py)
            print(f"{system_name:<18}{spec:<20}{item.name:<18}{tg.n_tasks:>7}{sim * 1e3:>10.2f}{est * 1e3:>9.3f}"
                  f"{sim / est:>7.0f}x{py * 1e3:>9.2f}{sim / py:>6.0f}x")
    print()
    print(f"{'system':<18}{'estimate / simulation speed-up':>34}{'pure Python':>26}")
    print(f"{'':<18}{'median':>12}{'min':>10}{'max':>12}{'median':>14}{'min':>12}")
    everything, everything_py = [], []
    for name in ratios:
        r, p = np.asarray(ratios[name]), np.asarray(py_ratios[name])
        everything += r.tolist()
        everything_py += p.tolist()
        print(f"{name:<18}{np.median(r):>11.0f}x{r.min():>9.0f}x{r.max():>11.0f}x{np.median(p):>13.0f}x{p.min():>11.0f}x")
    r, p = np.asarray(everything), np.asarray(everything_py)
    print(f"{'all':<18}{np.median(r):>11.0f}x{r.min():>9.0f}x{r.max():>11.0f}x{np.median(p):>13.0f}x{p.min():>11.0f}x")


if __name__ == "__main__":
    main()
