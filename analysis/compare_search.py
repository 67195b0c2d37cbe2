"""The GA against its baselines on heterogeneous and adaptive systems: ``marssim compare`` on

* ``herald-soc`` (four fixed sub-accelerators of different dataflows) with MobileNetV2,
  ResNet-50 and the mix-vision multi-model workload (batch 1), where H2H is the strong baseline;
* ``mars-adaptive-16`` (16 identical adaptive accelerators) with ResNet-50 at batch 8, the
  default search case.

Each row is what ``marssim compare --system S --workload W`` prints (default settings: the GA
seeded with data_parallel and h2h; random search simulating as many mappings as the GA
evaluated), plus the case's total wall time. Every number is a simulation; same seed, same
numbers (wall times aside).

Run: ``PYTHONPATH=. python analysis/compare_search.py [--workers 2]``; the output is committed in
``analysis/results/compare_search.txt``. Compare wall-time ratios within one run only.
"""

from __future__ import annotations

import argparse
import os
import platform
import time

from marssim.cli.compare import format_table
from marssim.cost import default_cost_model
from marssim.search import SearchSettings, compare
from marssim.search.parallel import open_executor
from marssim.system import load_system
from marssim.workload import load_workload

CASES = (("herald-soc", "mobilenetv2"), ("herald-soc", "resnet50"), ("herald-soc", "mix-vision"),
         ("mars-adaptive-16", "resnet50:batch=8"))


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
          f"Python {platform.python_version()}; {args.workers} workers; "
          f"load average before: {os.getloadavg()[0]:.2f}")
    cost = default_cost_model()
    settings = SearchSettings(seed=args.seed)
    for system_name, spec in CASES:
        system, graph = load_system(system_name), load_workload(spec)
        t0 = time.perf_counter()
        with open_executor(args.workers, None) as executor:
            table, results = compare(graph, system, cost, settings, executor=executor)
        print()
        print(f"{system.name} / {graph.spec} / seed {args.seed}: {time.perf_counter() - t0:.1f} s in all")
        print(format_table(table, settings.objective))
        mars = results["mars"]
        best_baseline = min(results["data_parallel"].fitness, results["h2h"].fitness)
        print(f"mars vs the better of data_parallel and h2h: {(mars.fitness / best_baseline - 1) * 100:+.1f}%; "
              f"{len(mars.history)} generations; the baselines that seeded it ran "
              f"{results['data_parallel'].simulations + results['h2h'].simulations} simulations")
    print()
    print(f"load average after: {os.getloadavg()[0]:.2f} (other work on the machine slows every wall time)")


if __name__ == "__main__":
    main()
