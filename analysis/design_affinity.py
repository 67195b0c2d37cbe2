"""How much can computation-aware design selection gain on our system model?

For each zoo workload, the time of every layer on one accelerator of each design of
``topologies/mars-adaptive-16.yaml`` (default cost model, no communication): the total on the
best single design, and the total if every layer ran on its own best design. Their ratio bounds
what choosing designs per layer segment can save, before any parallelism: MARS's
"computation-aware accelerator selection" has this much room, no more, on our designs.

Run: ``PYTHONPATH=. python analysis/design_affinity.py``; output committed in
``analysis/results/design_affinity.txt``.
"""

from __future__ import annotations

import os
import platform
from pathlib import Path

import numpy as np

from marssim.cost import default_cost_model
from marssim.search.ga import design_table
from marssim.system import load_system
from marssim.workload import load_workload

ROOT = Path(__file__).resolve().parents[1]
SYSTEM = ROOT / "topologies" / "mars-adaptive-16.yaml"
WORKLOADS = ("resnet50", "vgg16", "mobilenetv2", "bert-base", "gpt2", "vit-b16")


def main() -> None:
    system, cost = load_system(SYSTEM), default_cost_model()
    print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores; "
          f"system: {SYSTEM.relative_to(ROOT)}; cost model: marssim.cost.default_cost_model; batch 1")
    names = tuple(system.designs)
    print()
    print(f"{'workload':<14}" + "".join(f"{n:>10}" for n in names) + f"{'best one':>11}{'per layer':>11}{'saving':>8}"
          f"{'layers won by each design':>40}")
    savings = []
    for name in WORKLOADS:
        graph = load_workload(name)
        cols, table = design_table(graph, system, cost)
        totals = table.sum(axis=0)
        best_one = totals.min()
        per_layer = table.min(axis=1).sum()
        savings.append(1 - per_layer / best_one)
        wins = np.bincount(table.argmin(axis=1), minlength=len(cols))
        won = " ".join(f"{c}:{w}" for c, w in zip(cols, wins) if w)
        print(f"{name:<14}" + "".join(f"{t * 1e3:>10.2f}" for t in totals) + f"{best_one * 1e3:>11.2f}"
              f"{per_layer * 1e3:>11.2f}{savings[-1]:>8.1%}{won:>40}")
    print()
    print(f"times in ms on one accelerator; mean saving of per-layer design choice: {np.mean(savings):.1%}")


if __name__ == "__main__":
    main()
