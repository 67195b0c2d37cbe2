"""Non-GEMM ops on PE-array accelerators: bandwidth-bound streaming.

Element-wise ops, norms, softmax, pooling, embeddings and re-layouts do no multiply-accumulate;
their time is set by their bytes. Every byte of the op's compulsory traffic (``F_TRAFFIC``, see
:mod:`marssim.cost.features`) crosses off-chip memory once and the on-chip buffer once (inputs
read, the output written), and the PE array works as a vector unit of one operation per PE per
cycle::

    cycles  = ceil(flops / PEs)
    time    = max(cycles / clock, traffic / sram_bandwidth, DRAM time + latency)

where the DRAM time is ``traffic / dram_bandwidth`` over one shared channel, or the larger of
inputs and output over it with a channel per buffer. For energy, each FLOP is charged half a MAC
(a MAC is two FLOPs).
"""

from __future__ import annotations

from .features import F_FLOPS, F_OB, F_TRAFFIC
from .traffic import channel_time

__all__ = ["stream_op"]


def stream_op(x, d, mx):
    """Returns ``(time, compute_time, memory_time, cycles, sram_read, sram_write, dram_read,
    dram_write)`` of non-GEMM ops ``x`` (feature tuple or numpy columns) on the PE-array design
    ``d``."""
    traffic = x[F_TRAFFIC]
    inputs = mx(traffic - x[F_OB], 0 * traffic)
    out = traffic - inputs
    cycles = -(-x[F_FLOPS] // (d.rows * d.cols))
    compute = cycles / d.clock
    memory = mx(traffic / d.sram_bw, channel_time(inputs, 0, out, d, mx) + d.dram_latency)
    return mx(compute, memory), compute, memory, cycles, traffic, traffic, inputs, out
