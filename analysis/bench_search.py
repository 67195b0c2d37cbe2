"""Search speed: evaluations per second on 1 and 2 workers, and the wall time of a default search.

1. Throughput: the same batch of distinct ResNet-50 mappings (batch 8, drawn uniformly from the
   mapping space of ``topologies/mars-adaptive-16.yaml``) is simulated, and separately
   estimated, through an :class:`~marssim.search.evaluate.Evaluator` serially and on a process
   pool of 2 workers (fresh evaluation caches; the workers started and warmed up on a few other
   mappings first).
2. The default search, exactly what ``marssim search --system topologies/mars-adaptive-16.yaml
   --workload resnet50:batch=8`` runs (MARS GA, default configuration, seeded with
   data_parallel and h2h, whose runs are included), with 1 and with 2 workers: wall time,
   simulations, estimates, evaluations/s and the best makespan (identical for both worker
   counts: the search is deterministic).

Run: ``PYTHONPATH=. python analysis/bench_search.py``; the output is committed in
``analysis/results/bench_search.txt``. Compare ratios measured in one run on one machine.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import platform
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np

from marssim.cost import default_cost_model
from marssim.search import SearchSettings, run_algorithm
from marssim.search.evaluate import Evaluator, Problem, estimate_evaluation, evaluate_mapping
from marssim.search.parallel import open_executor
from marssim.search.space import MappingSpace
from marssim.system import load_system
from marssim.workload import load_workload

ROOT = Path(__file__).resolve().parents[1]
SYSTEM = ROOT / "topologies" / "mars-adaptive-16.yaml"
WORKLOAD = "resnet50:batch=8"


def _warm_worker(graph, system, cost, mapping) -> None:
    """Run in each worker as it starts: estimate and simulate ``mapping`` once, so every worker
    has imported everything and loaded the compiled estimate before the clock starts."""
    problem = Problem(graph, system, cost)
    estimate_evaluation(problem, mapping)
    evaluate_mapping(problem, mapping)


def throughput(graph, system, cost, mappings, warmup, workers: int, kind: str) -> tuple[float, float]:
    """(seconds, evaluations per second) to evaluate ``mappings`` once, after the workers have
    started, each evaluated a mapping, and the pool both simulated and estimated the ``warmup``
    mappings (so start-up, imports and loading the compiled estimate are not counted)."""
    context = (ProcessPoolExecutor(workers, initializer=_warm_worker, initargs=(graph, system, cost, warmup[0]))
               if workers > 1 else contextlib.nullcontext())
    with context as pool:
        warm = Evaluator(Problem(graph, system, cost), pool)
        warm.simulate(warmup)
        warm.estimate(warmup)
        ev = Evaluator(Problem(graph, system, cost), pool)
        t0 = time.perf_counter()
        (ev.simulate if kind == "simulate" else ev.estimate)(mappings)
        wall = time.perf_counter() - t0
    return wall, len(mappings) / wall


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--mappings", type=int, default=64, help="mappings in the throughput batch")
    p.add_argument("--skip-search", action="store_true")
    args = p.parse_args(argv)
    graph, system, cost = load_workload(WORKLOAD), load_system(SYSTEM), default_cost_model()
    print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
          f"Python {platform.python_version()}; load average before: {os.getloadavg()[0]:.2f}")
    print(f"case: {WORKLOAD} on {SYSTEM.relative_to(ROOT)}; cost model: marssim.cost.default_cost_model")
    print()
    space = MappingSpace(graph, system)
    rng = np.random.default_rng(0)
    drawn = list({m.key: m for m in (space.decode(space.random(rng)) for _ in range(args.mappings + 4))}.values())
    mappings, warmup = drawn[:args.mappings], drawn[args.mappings:]
    print(f"1. throughput on {len(mappings)} distinct uniformly drawn mappings (lower + evaluate)")
    print(f"{'evaluation':<12}{'workers':>8}{'wall s':>9}{'evals/s':>10}{'speed-up':>10}")
    for kind in ("simulate", "estimate"):
        base = None
        for workers in (1, 2):
            wall, rate = throughput(graph, system, cost, mappings, warmup, workers, kind)
            base = base or rate
            print(f"{kind:<12}{workers:>8}{wall:>9.2f}{rate:>10.2f}{rate / base:>9.2f}x")
    if args.skip_search:
        return
    print()
    print("2. default search (marssim search --system topologies/mars-adaptive-16.yaml --workload resnet50:batch=8)")
    print(f"{'workers':>7}{'wall s':>9}{'generations':>13}{'simulations':>13}{'estimates':>11}{'evals/s':>9}"
          f"{'best ms':>10}")
    keys = set()
    for workers in (1, 2):
        t0 = time.perf_counter()
        with open_executor(workers) as executor:
            r = run_algorithm("mars", graph, system, cost, SearchSettings(), executor=executor)
        wall = time.perf_counter() - t0
        keys.add(r.best.key)
        print(f"{workers:>7}{wall:>9.1f}{len(r.history):>13}{r.simulations:>13}{r.estimates:>11}"
              f"{(r.simulations + r.estimates) / wall:>9.1f}{r.makespan * 1e3:>10.4f}")
    print(f"same best mapping for 1 and 2 workers: {'yes' if len(keys) == 1 else 'NO'}")
    print(f"load average after: {os.getloadavg()[0]:.2f} (other work on the machine slows every number)")


if __name__ == "__main__":
    main()
