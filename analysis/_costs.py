"""The cost model the analysis scripts use: marssim's default when it is available, else a plain
roofline (time = max(MACs / peak MAC/s, bytes / SRAM bandwidth)), named in the output."""

from __future__ import annotations

from marssim.cost.base import OpCost


class Roofline:
    """max(compute, memory) time per op on a design; no energy figures."""

    def op_cost(self, op, design) -> OpCost:
        compute = (op.macs or op.flops) / design.peak_macs_per_s
        memory = op.bytes_moved / design.sram_bandwidth
        return OpCost(max(compute, memory), float("nan"), compute, memory, 0.0, 0.0, "roofline")

    def op_time(self, op, design) -> float:
        return self.op_cost(op, design).time

    def op_times(self, ops, designs):
        import numpy as np

        return np.array([self.op_time(o, d) for o, d in zip(ops, designs)])


def cost_model():
    """``(model, name)``."""
    try:
        from marssim.cost import default_cost_model
    except ImportError:
        return Roofline(), "roofline (marssim.cost.default_cost_model not available)"
    return default_cost_model(), "marssim.cost.default_cost_model()"
