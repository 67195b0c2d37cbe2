"""Simulated cases shared by the trace benchmark and the figure script.

ResNet-50 on ``topologies/mars-adaptive-16.yaml`` (16 accelerators, 4 boards of 4), mapped
three ways, timed by :func:`marssim.cost.default_cost_model`.
"""

from __future__ import annotations

from pathlib import Path

from marssim.lower import lower
from marssim.mapping import Mapping
from marssim.mapping.model import AcceleratorSet
from marssim.sim import simulate
from marssim.system import load_system
from marssim.workload import load_workload

ROOT = Path(__file__).resolve().parents[1]
SYSTEM = ROOT / "topologies" / "mars-adaptive-16.yaml"
BOARD_DESIGNS = ("os32", "ws32", "nvdla64", "shi32")  # one design per board (pipeline stage)


def cost_model():
    """(cost model, its name): marssim's default."""
    from marssim.cost import default_cost_model

    return default_cost_model(), "marssim.cost.default_cost_model"


def mapping(kind: str, graph, system, micro_batches: int) -> Mapping:
    """``dp``: every layer data-parallel over all 16; ``pipeline``: four stages, one per board
    (its own design), output-channel sharding inside each; ``oc``: one set of 16, every layer
    split by output channels (all-gathers between layers)."""
    if kind == "dp":
        return Mapping.single_set(graph, system, sharding="dp", micro_batches=micro_batches)
    if kind == "oc":
        return Mapping.single_set(graph, system, sharding=("oc", "dp"), micro_batches=micro_batches)
    if kind == "pipeline":
        n = len(graph.layers)
        sets = [AcceleratorSet(tuple(f"acc{4 * k + i}" for i in range(4)), d) for k, d in enumerate(BOARD_DESIGNS)]
        return Mapping.pipeline(graph, system, sets, [n // 4, n // 2, 3 * n // 4], sharding=("oc", "dp"),
                                micro_batches=micro_batches)
    raise ValueError(kind)


def run(kind: str, batch: int = 8, micro_batches: int = 4):
    """(Result, cost model name) of ResNet-50 at ``batch`` on mars-adaptive-16 with ``kind``."""
    graph = load_workload(f"resnet50:batch={batch}")
    system = load_system(str(SYSTEM))
    cost, cost_name = cost_model()
    m = mapping(kind, graph, system, micro_batches)
    result = simulate(lower(graph, system, m, cost), system)
    result.meta["mapping_kind"] = kind
    return result, cost_name
