"""The cost-model interface: how long an op (or a shard of it) takes on a design.

Implementations live beside this module; :func:`marssim.cost.default_cost_model` picks the
right one per design (systolic, loop-mapping, GPU roofline, calibrated tables).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from marssim.system import Design
from marssim.workload import Op

__all__ = ["OpCost", "CostModel"]


@dataclass(frozen=True, slots=True)
class OpCost:
    """Time and energy of one op on one design, with its breakdown.

    time: seconds, the max of the compute-bound and memory-bound times (plus fixed overheads).
    energy: joules (NaN when the design has no energy figures).
    compute_time: seconds the PE array needs (cycles / clock) assuming data arrives in time.
    memory_time: seconds the buffer/off-chip bandwidths need for the op's traffic.
    cycles: compute cycles of the PE array (0 where the model has no cycle notion).
    utilisation: fraction of the design's peak MAC rate achieved over ``time``.
    model: which model produced it (``systolic-os``, ``loopmap-rs``, ``bandwidth``; a GPU's
    ``measured`` (a measured kernel of the shape), ``interpolated`` (between measured fused
    attention kernels), ``extrapolated`` (a context attention kernel past the longest measured
    prompt, as its ``s^2`` products), ``derived`` (a fused attention backward from its measured forward:
    :mod:`marssim.cost.attention_backward`), ``rescaled`` (a causal prompt attention kernel as the
    design's attention kernel set times it: :mod:`marssim.cost.attention_kernels`), ``fitted`` (the
    curve fitted to measurements) or ``gpu-roofline``...).
    dram_bytes, sram_bytes: bytes read plus written off chip and in the on-chip buffer (the
    array's accesses, DRAM fills and drains); NaN where the model does not count them.
    energy_compute, energy_sram, energy_dram: the parts of ``energy`` (J): MACs (or FLOPs) plus
    static power over ``time``, buffer accesses, DRAM accesses; NaN without energy figures.
    """

    time: float
    energy: float
    compute_time: float
    memory_time: float
    cycles: float
    utilisation: float
    model: str
    dram_bytes: float = float("nan")
    sram_bytes: float = float("nan")
    energy_compute: float = float("nan")
    energy_sram: float = float("nan")
    energy_dram: float = float("nan")


@runtime_checkable
class CostModel(Protocol):
    """What the rest of marssim needs from a cost model."""

    def op_cost(self, op: Op, design: Design) -> OpCost:
        """Time (s), energy (J) and breakdown of ``op`` on ``design``."""
        ...

    def op_time(self, op: Op, design: Design) -> float:
        """Seconds ``op`` takes on ``design`` (``op_cost(op, design).time``)."""
        ...

    def op_times(self, ops: Sequence[Op], designs: Sequence[Design]):
        """Vectorised: a numpy array of seconds, one per ``(ops[i], designs[i])`` pair."""
        ...
