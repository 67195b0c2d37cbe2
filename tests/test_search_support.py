"""Helpers shared by the search tests (no tests here): search problems small enough to
enumerate, where the best mapping is not a trivial one (two designs that suit different layers)."""

from __future__ import annotations

import math

from marssim.cost.base import OpCost
from marssim.search.space import MappingSpace
from marssim.workload import GraphBuilder
from marssim.workload.graph import merge_graphs
from support import DESIGN, RooflineCost, make_system

# "big": 4x the MACs of "wide" but 1/16 of its buffer bandwidth. Convolutions (many MACs per
# byte) run ~4x faster on big; the fully connected layers at batch 4 (~2 MACs per weight byte)
# run ~2.5x faster on wide.
DESIGNS = {
    "big": {**DESIGN, "pe_rows": 32, "pe_cols": 32, "sram_bandwidth": "50 GB/s"},
    "wide": {**DESIGN, "dataflow": "ws", "pe_rows": 16, "pe_cols": 16, "sram_bandwidth": "800 GB/s"},
}
SMALL_SPACE = {"micro_batch_choices": (1, 2), "strategies": ("dp", "oc")}


def two_models(batch: int = 4):
    """A CNN (2 conv layers) and an MLP (2 fully connected layers) run side by side."""
    a = GraphBuilder("cnn", batch=batch)
    x = a.input("img", c=16, h=16, w=16)
    x = a.conv("c1", x, 64, kernel=3)
    x = a.eltwise("r1", x, fn="relu")
    a.conv("c2", x, 64, kernel=3)
    b = GraphBuilder("mlp", batch=batch)
    y = b.input("vec", c=512)
    y = b.linear("fc1", y, 2048)
    b.linear("fc2", y, 1000)
    return merge_graphs("cnn+mlp", [a.build(), b.build()])


def chain(batch: int = 4):
    """One model: two convolutions (the second with a global pooling) and two fully connected
    layers (4 layers)."""
    b = GraphBuilder("chain", batch=batch)
    x = b.input("img", c=16, h=16, w=16)
    x = b.conv("c1", x, 64, kernel=3)
    x = b.eltwise("r1", x, fn="relu")
    x = b.conv("c2", x, 64, kernel=3, stride=2)
    x = b.global_pool("gap", x)
    x = b.linear("fc1", x, 2048)
    b.linear("fc2", x, 1000)
    return b.build()


def system(n: int = 3, **kwargs):
    return make_system(n, designs=DESIGNS, **kwargs)


def small_space(graph, sys_, **kwargs) -> MappingSpace:
    return MappingSpace(graph, sys_, **{**SMALL_SPACE, **kwargs})


class EnergyRoofline(RooflineCost):
    """The roofline time with energy: ``pj_per_mac`` per MAC by design name pattern (big arrays
    cost more per MAC here), plus 1 pJ per byte moved."""

    def op_cost(self, op, design) -> OpCost:
        c = super().op_cost(op, design)
        per_mac = 2e-12 if design.pe_rows * design.pe_cols >= 1024 else 0.5e-12
        energy = op.macs * per_mac + op.bytes_moved * 1e-12
        return OpCost(c.time, energy, c.compute_time, c.memory_time, 0.0, 0.0, "test-energy")


def finite(x: float) -> bool:
    return math.isfinite(x)


def system_dict(n: int = 3) -> dict:
    """The YAML form of :func:`system` (a ring of ``n`` accelerators, both designs allowed)."""
    return {
        "name": f"search-ring-{n}", "designs": DESIGNS,
        "accelerators": [{"id": f"acc[0-{n - 1}]", "designs": list(DESIGNS),
                          "memory": {"capacity": "16 GiB", "bandwidth": "10 TB/s"}}],
        "hosts": [{"id": "host0", "dram": {"capacity": "1 TiB", "bandwidth": "1 TB/s"}}],
        "links": [{"pattern": "ring", "nodes": f"acc[0-{n - 1}]", "bandwidth": "50 GB/s", "latency": "1 us"},
                  {"between": ["host0", "acc0"], "bandwidth": "32 GB/s", "latency": "1 us"}],
    }
