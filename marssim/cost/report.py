"""Per-layer cost of a workload on every design of a system: which design suits which layer.

The premise of computation-aware accelerator selection (MARS, Herald) is that layers differ in
which design runs them best. :func:`design_costs` times every compute op of a graph on one
accelerator of each design (the first accelerator that can take it, so the design's off-chip
bandwidth is that accelerator's memory) and marks the fastest; ``marssim cost`` prints it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from marssim.system import Design, System
from marssim.workload import Graph, Op

from .base import CostModel, OpCost

__all__ = ["LayerCosts", "DesignCosts", "design_costs", "designs_of"]


@dataclass(frozen=True)
class LayerCosts:
    """One op on every design: ``costs[j]`` is its :class:`OpCost` on design ``j``."""

    op: Op
    costs: tuple[OpCost, ...]

    @property
    def times(self) -> np.ndarray:
        return np.array([c.time for c in self.costs])

    @property
    def fastest(self) -> int:
        """Index of the fastest design (first on ties)."""
        return int(np.argmin(self.times))


@dataclass(frozen=True)
class DesignCosts:
    """A workload's ops timed on each design of a system."""

    design_names: tuple[str, ...]
    hosts: tuple[str, ...]
    designs: tuple[Design, ...]
    layers: tuple[LayerCosts, ...]

    def total_time(self) -> np.ndarray:
        """Seconds of all listed ops, one after another, per design."""
        return np.sum([layer.times for layer in self.layers], axis=0) if self.layers else np.zeros(len(self.designs))

    def total_energy(self) -> np.ndarray:
        """Joules of all listed ops per design (NaN where a design has no energy figures)."""
        if not self.layers:
            return np.zeros(len(self.designs))
        return np.sum([[c.energy for c in layer.costs] for layer in self.layers], axis=0)

    def wins(self) -> np.ndarray:
        """How many listed ops each design runs fastest."""
        return np.bincount([layer.fastest for layer in self.layers], minlength=len(self.designs))


def designs_of(system: System) -> list[tuple[str, str, Design]]:
    """``(design name, accelerator, design as configured there)`` for every design of ``system``
    that some accelerator can take (the first such accelerator)."""
    out = []
    for name in system.designs:
        host = next((a.id for a in system.accelerators if name in a.designs), None)
        if host is not None:
            out.append((name, host, system.design(host, name)))
    return out


def design_costs(graph: Graph, system: System, cost: CostModel, *, all_ops: bool = False) -> DesignCosts:
    """Every GEMM-like op (or, with ``all_ops``, every compute op) of ``graph`` timed on one
    accelerator of each design of ``system``."""
    entries = designs_of(system)
    ops = [graph.ops[i] for i in graph.compute_ops if all_ops or graph.ops[i].is_gemm_like]
    layers = tuple(LayerCosts(op, tuple(cost.op_cost(op, d) for _, _, d in entries)) for op in ops)
    return DesignCosts(tuple(n for n, _, _ in entries), tuple(h for _, h, _ in entries),
                       tuple(d for _, _, d in entries), layers)
