"""The headline numbers of a schedule of a TaskGraph, simulated or estimated: makespan,
steady-state throughput and energy (compute and communication).

Pure numpy over the TaskGraph and the tasks' end times (s): shared by the simulator
(:func:`marssim.sim.simulate_summary`, :class:`marssim.results.Result`) and the analytical estimate,
so both report the same quantities the same way.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .aggregate import communication_energy, compute_energy, node_busy, resource_bytes
from marssim.system import System
from marssim.taskgraph import COMPUTE, TaskGraph, column_chunks, unbuilt_program

__all__ = ["Summary", "summarise", "steady_throughput", "compute_energy", "total_energy"]


@dataclass(frozen=True, slots=True)
class Summary:
    """Makespan (s), throughput (samples/s) and energy (J: compute and communication, each where
    known; NaN when no design and no link has energy figures) of a schedule. For a simulation:
    equal, bit for bit, to the same fields of the :class:`~marssim.results.Result` that
    :func:`~marssim.sim.simulate` returns for the same inputs."""

    makespan: float
    throughput: float
    energy: float


def summarise(taskgraph: TaskGraph, system: System, end: np.ndarray, streams: int = 1) -> Summary:
    """The :class:`Summary` of a schedule of ``taskgraph`` whose tasks end at ``end`` (s, one per
    task), devices running ``streams`` compute tasks at once."""
    makespan = float(np.nanmax(end)) if taskgraph.n_tasks else 0.0
    return Summary(makespan, steady_throughput(taskgraph, end, makespan, system, streams),
                   total_energy(taskgraph, system))


def total_energy(taskgraph: TaskGraph, system: System) -> float:
    """Joules of the run: compute energy plus communication energy, each where known (NaN when
    neither is); see :mod:`marssim.results.aggregate`."""
    parts = [compute_energy(taskgraph, system), communication_energy(taskgraph, system)]
    known = [p for p in parts if p == p]
    return float(sum(known)) if known else float("nan")


def steady_throughput(tg: TaskGraph, end: np.ndarray, makespan: float, system: System, streams: int = 1) -> float:
    """Samples per second: in steady state between the first and last micro-batch when pipelined,
    else the batch over the makespan.

    The steady-state rate is measured from when micro-batches finish, and bounded by the work of
    the busiest resource: every device must run its compute for the whole batch (with ``streams``
    at once) and every link, switch or memory port must carry its bytes, so no pipeline delivers
    the batch faster than ``batch / max(work)``. The bound matters when few micro-batches happen to
    finish close together."""
    batch = float(tg.batch)
    if batch <= 0 or makespan <= 0:
        return float("nan")
    mbs = 1
    finish = np.full(0, -np.inf)
    program = unbuilt_program(tg, ("micro_batch",))
    if program is not None:  # the latest end of each instance, then of each micro-batch (max: any order)
        runs = np.diff(program.inst_base) > 0
        mb = program.inst_mb[runs]
        if len(mb):
            finish = np.full(int(mb.max()) + 1, -np.inf)
            np.maximum.at(finish, mb, program.instance_max(end)[runs])
    at = 0
    for c in (() if program is not None else column_chunks(tg, ("micro_batch",))):
        mb = c["micro_batch"]
        if len(mb) and int(mb.max()) + 1 > len(finish):
            finish = np.concatenate([finish, np.full(int(mb.max()) + 1 - len(finish), -np.inf)])
        np.maximum.at(finish, mb, end[at:at + len(mb)])
        at += len(mb)
    mbs = max(len(finish), 1) if tg.n_tasks else 1
    if mbs < 2:
        return batch / makespan
    sizes = [batch // mbs + (1 if i < batch % mbs else 0) for i in range(mbs)]
    span = finish[-1] - finish[0]
    if span <= 0:
        return batch / makespan
    return float(min(sum(sizes[1:]) / span, batch / _busiest_work(tg, system, streams)))


def _busiest_work(tg: TaskGraph, system: System, streams: int) -> float:
    """Seconds the busiest device (compute over ``streams``) or bandwidth resource (bytes over
    capacity) must work to process the whole TaskGraph; at least the smallest positive float."""
    busy = node_busy(tg)
    program = unbuilt_program(tg, ("kind",))
    if program is not None:
        moving = bool(((program.rows["kind"] != COMPUTE) & program.used_rows).any())
    else:
        moving = bool((tg.kind != COMPUTE).any())
    work = float(busy.max(initial=0.0)) / streams
    if moving:
        res_bytes = resource_bytes(tg, system)
        work = max(work, float((res_bytes / system.resource_capacity).max(initial=0.0)))
    return max(work, np.finfo(float).tiny)
