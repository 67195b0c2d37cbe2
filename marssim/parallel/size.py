"""How big a parallel configuration's simulation is before it is built, and the bound it must meet.

A lowering simulates one GPU per class of identical GPUs (:mod:`.fold`); each runs its units
(:mod:`.schedule`) over the micro-batches. Once the classes are known (and before any task is
copied), the tasks are the sizes of one class's unit templates per stage times the units it runs,
summed over the classes: :func:`lowered_size`. From the tasks follow the bytes of the TaskGraph
and of a simulation (measured constants, :data:`TASKGRAPH_BYTES_PER_TASK`,
:data:`SIMULATION_BYTES_PER_TASK`), plus what placement and folding hold per GPU.

:func:`check_size` refuses, with one InputError saying the size and the reason, a configuration
of more GPUs than any cluster built (:data:`MAX_GPUS`) before anything is placed, and one whose
simulation would not fit the machine's memory before its tasks are copied. Units: bytes.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from marssim.errors import InputError
from marssim.system.cluster import MAX_CLUSTER_GPUS

__all__ = ["SizeEstimate", "MAX_GPUS", "TASKGRAPH_BYTES_PER_TASK", "SIMULATION_BYTES_PER_TASK", "BYTES_PER_GPU",
           "machine_memory", "check_gpus", "check_size"]

MAX_GPUS = MAX_CLUSTER_GPUS
"""The most GPUs a configuration may span: those of the largest cluster a system may have
(:data:`marssim.system.cluster.MAX_CLUSTER_GPUS`); placement and folding hold a few kB per GPU."""

TASKGRAPH_BYTES_PER_TASK = 105.0
"""Bytes of a TaskGraph per task: 16 columns and about two predecessors a task (measured on the
Megatron configurations of ``analysis/bench_megatron_scale.py``: 100 to 104)."""

SIMULATION_BYTES_PER_TASK = 125.0
"""Bytes a compiled simulation adds per task: successors, per-task state, flow slots, event
queue (measured: 105 to 120)."""

BYTES_PER_GPU = 4096.0
"""Bytes the placement, the folding and the TaskGraph's labels hold per GPU (measured: 2 to 4 kB)."""

BYTES_PER_TEMPLATE_ROW = 400.0
"""Bytes of a task of a unit template while it is built (Python lists and tuples per row: its
columns, predecessors and references; measured: 300 to 400). Every simulated GPU has its own
templates, one per unit it runs (not per micro-batch)."""


@dataclass(frozen=True)
class SizeEstimate:
    """The size of one lowered configuration: GPUs, simulated GPUs (classes), tasks, and the
    bytes of its TaskGraph and of a simulation of it (peak, TaskGraph included)."""

    gpus: int
    classes: int
    tasks: int
    template_rows: int = 0  # tasks of the unit templates the lowering builds (one per unit and simulated GPU)

    @property
    def taskgraph_bytes(self) -> float:
        return self.tasks * TASKGRAPH_BYTES_PER_TASK + self.gpus * BYTES_PER_GPU

    @property
    def lowering_bytes(self) -> float:
        """Peak of the lowering: its templates, then the TaskGraph they are copied into."""
        return self.template_rows * BYTES_PER_TEMPLATE_ROW + self.taskgraph_bytes

    @property
    def simulation_bytes(self) -> float:
        """Peak of lowering and simulating (the templates are freed before the simulation)."""
        return max(self.lowering_bytes, self.taskgraph_bytes + self.tasks * SIMULATION_BYTES_PER_TASK)

    def text(self) -> str:
        return (f"{self.tasks:,} tasks on {self.classes:,} simulated GPUs (classes of identical GPUs) of "
                f"{self.gpus:,}: TaskGraph ~{self.taskgraph_bytes / 2**30:.2f} GiB, lowering and simulation "
                f"~{self.simulation_bytes / 2**30:.2f} GiB")


MEMORY_SHARE = 0.8
"""The share of the machine's memory a lowering and simulation may plan to take."""


def machine_memory() -> float:
    """The bytes a lowering and simulation may take: :data:`MEMORY_SHARE` of this machine's
    physical memory (``MARSSIM_MAX_BYTES`` overrides it; inf when unknown)."""
    override = os.environ.get("MARSSIM_MAX_BYTES", "")
    if override:
        return float(override)
    try:
        return MEMORY_SHARE * float(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):
        return float("inf")


def check_gpus(gpus: int, where: str = "--parallel") -> None:
    """Refuse more GPUs than :data:`MAX_GPUS`, before any of them is placed."""
    if gpus > MAX_GPUS:
        raise InputError(where, "dp", f"{gpus:,} GPUs: more than {MAX_GPUS:,}, above the largest GPU clusters built "
                                      "(100,000-200,000 GPUs); placing and folding them alone would hold "
                                      f"~{gpus * BYTES_PER_GPU / 2**30:.1f} GiB")


def check_size(size: SizeEstimate, where: str = "--parallel", max_bytes: float | None = None) -> None:
    """Refuse a configuration whose simulation would need more than ``max_bytes`` (default: this
    machine's memory), or more tasks than a TaskGraph indexes (2^31)."""
    limit = machine_memory() if max_bytes is None else max_bytes
    if size.tasks >= 2**31 - 1:
        raise InputError(where, "", f"{size.text()}: more tasks than a TaskGraph holds (2^31)")
    if size.simulation_bytes > limit:
        raise InputError(where, "", f"{size.text()}: more than the {limit / 2**30:.1f} GiB this machine allows "
                                    "(fewer micro-batches, or a cluster whose scalable units hold whole "
                                    "data-parallel rings, fold into fewer simulated GPUs)")
