"""Benchmark: the search over parallel configurations of LLM training runs.

1. A default search (``marssim search`` without budget flags) for GPT-3 175B (sequence 2,048,
   global batch 1,536) on 1,024 A100 (``dgx-a100-cluster:nodes=128``, its real scalable units of
   20 nodes) with 1 and 2 worker
   processes: wall time, configurations screened (and rejected by the memory model) and
   simulated, screened configurations per second, where the time went (screening, and the
   simulated candidates' lowering and simulation), the best configuration, and the parallel
   efficiency of 2 workers (wall with 1 / (2 * wall with 2)).
2. Mixed GPU kinds: on ``mixed-a100-h100-cluster`` the MARS search against the grid of uniform
   Megatron configurations (uniform layers on every GPU kind), same evaluator, same seed, for
   Llama-3 8B and GPT-3 13B training: the best of each and the change.

Usage: ``python analysis/bench_llm_search.py [--quick]`` (quick: part 2 only, one case). Prints
a table; the committed output is ``analysis/results/bench_llm_search.txt``.
"""

from __future__ import annotations

import argparse
import os
import platform
import time
from concurrent.futures import ProcessPoolExecutor

from marssim.cost import default_cost_model
from dataclasses import replace

from marssim.search.llm import LLMSearchSettings, grid_search, mars_llm, simulate_configs
from marssim.system import load_system
from marssim.workload import load_workload

BIG = ("dgx-a100-cluster:nodes=128", "gpt3-175b:mode=train,seq=2048,batch=1536")
MIXED = [("mixed-a100-h100-cluster:nodes_a100=2,nodes_h100=2", "llama3-8b:mode=train,seq=2048,batch=32"),
         ("mixed-a100-h100-cluster:nodes_a100=4,nodes_h100=4", "gpt3-13b:mode=train,seq=2048,batch=64")]


def default_search(workers: int):
    system, graph = load_system(BIG[0]), load_workload(BIG[1])
    cost = default_cost_model()
    if workers == 1:
        return mars_llm(graph, system, cost, LLMSearchSettings())
    with ProcessPoolExecutor(workers) as pool:
        return mars_llm(graph, system, cost, LLMSearchSettings(), executor=pool)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    print(f"machine: {platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}")
    if not args.quick:
        print(f"\nDefault search: {BIG[1]} on {BIG[0]} (1,024 GPUs), objective iteration time")
        print(f"{'workers':>8}{'wall s':>9}{'screened':>10}{'rejected':>10}{'simulated':>10}{'screened/s':>11}"
              f"{'screen s':>10}{'simulate s':>12}{'sim sum s':>11}{'best ms':>10}  best configuration")
        walls = {}
        for workers in (1, 2):
            r = default_search(workers)
            walls[workers] = r.wall_s
            t = r.notes["timing"]
            print(f"{workers:>8}{r.wall_s:>9.1f}{r.estimates:>10}{r.rejected_memory:>10}{r.simulations:>10}"
                  f"{r.estimates / max(t['screen_s'], 1e-9):>11.1f}{t['screen_s']:>10.1f}{t['simulate_s']:>12.1f}"
                  f"{t['simulations_s']:>11.1f}{r.makespan * 1e3:>10.1f}  {r.best.text()}")
        print(f"parallel efficiency with 2 workers: {walls[1] / (2 * walls[2]):.0%} (targets: >= 80%, the search "
              f"within 300 s on 2 cores)")
        print("screen s and simulate s: wall time the search waited for screens (closed form, memory check "
              "first) and for simulations; sim sum s: the simulations' own time (lowering and simulation), summed "
              "where they ran")

    print("\nMixed GPU kinds: MARS search vs the uniform Megatron grid (same evaluator, seed 0, 2 workers)")
    print(f"{'case':<64}{'grid ms':>9}{'mars ms':>9}{'change':>8}{'balanced':>10}  mars best / grid best")
    cost = default_cost_model()
    for system_spec, workload in (MIXED[:1] if args.quick else MIXED):
        system, graph = load_system(system_spec), load_workload(workload)
        with ProcessPoolExecutor(2) as pool:
            start = time.perf_counter()
            grid = grid_search(graph, system, cost, LLMSearchSettings(), executor=pool)
            mars = mars_llm(graph, system, cost, LLMSearchSettings(), executor=pool)
            wall = time.perf_counter() - start
        g, m = grid.makespan, mars.makespan
        even = replace(mars.best, layers_per_stage=())
        (balanced,) = simulate_configs(load_workload(workload, batch=even.micro_batch), system, cost, [even])
        print(f"{workload + ' / ' + system_spec.split(':')[1]:<64}{g * 1e3:>9.1f}{m * 1e3:>9.1f}{m / g - 1:>+8.1%}"
              f"{balanced.makespan * 1e3:>10.1f}  {mars.best.text()} / {grid.best.text()}  "
              f"({wall:.0f} s)")
    print("balanced: the MARS configuration with its layers spread evenly over the stages (simulated), to "
          "separate what the uneven stages gain from the rest of the configuration")


if __name__ == "__main__":
    main()
