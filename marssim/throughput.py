"""Samples per second of a scheduled TaskGraph (simulated or estimated).

``end`` holds every task's end time (s); ``tg.meta["batch"]`` the samples of the whole batch.
Pure numpy: shared by the simulator and the analytical estimate.
"""

from __future__ import annotations

import numpy as np

from marssim.system import System
from marssim.taskgraph import COMPUTE, TaskGraph

__all__ = ["steady_throughput"]


def steady_throughput(tg: TaskGraph, end: np.ndarray, makespan: float, system: System, streams: int = 1) -> float:
    """Samples per second: in steady state between the first and last micro-batch when pipelined,
    else the batch over the makespan.

    The steady-state rate is measured from when micro-batches finish, and bounded by the work of
    the busiest resource: every device must run its compute for the whole batch (with ``streams``
    at once) and every link, switch or memory port must carry its bytes, so no pipeline delivers
    the batch faster than ``batch / max(work)``. The bound matters when few micro-batches happen to
    finish close together."""
    batch = float(tg.meta.get("batch", 0) or 0)
    if batch <= 0 or makespan <= 0:
        return float("nan")
    mbs = int(tg.micro_batch.max()) + 1 if tg.n_tasks else 1
    if mbs < 2:
        return batch / makespan
    finish = np.full(mbs, -np.inf)
    np.maximum.at(finish, tg.micro_batch, end)
    sizes = [batch // mbs + (1 if i < batch % mbs else 0) for i in range(mbs)]
    span = finish[-1] - finish[0]
    if span <= 0:
        return batch / makespan
    return float(min(sum(sizes[1:]) / span, batch / _busiest_work(tg, system, streams)))


def _busiest_work(tg: TaskGraph, system: System, streams: int) -> float:
    """Seconds the busiest device (compute over ``streams``) or bandwidth resource (bytes over
    capacity) must work to process the whole TaskGraph; at least the smallest positive float."""
    compute = tg.kind == COMPUTE
    busy = np.bincount(tg.device[compute], weights=tg.duration[compute], minlength=len(tg.node_names))
    work = float(busy.max(initial=0.0)) / streams
    moving = ~compute
    if moving.any():
        route_bytes = np.bincount(tg.route[moving], weights=tg.nbytes[moving], minlength=len(tg.routes))
        res_bytes = np.zeros(len(system.resource_capacity))
        for r, nbytes in enumerate(route_bytes):
            if nbytes:
                res_bytes[list(tg.routes[r].resources)] += nbytes
        work = max(work, float((res_bytes / system.resource_capacity).max(initial=0.0)))
    return max(work, np.finfo(float).tiny)
