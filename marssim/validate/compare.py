"""One mapping evaluated both ways, and the gap attributed to the resources that contended.

Walking the simulated critical path back from the last task, every transfer on it that took longer
than it would alone charges its extra time to the resources of its route that another flow was
using at the same time, and every compute task that waited for its device longer than it does in
the estimate charges the extra wait to that device. Units: seconds."""

from __future__ import annotations

import math
import time

import numpy as np
import pandas as pd

from marssim.errors import CapacityError
from marssim.system import System
from marssim.taskgraph import COMPUTE, TaskGraph
from marssim.workload import Graph

from .records import Comparison, NamedMapping

__all__ = ["compare", "attribute", "op_times"]


def compare(graph: Graph, system: System, item: NamedMapping, cost=None, *, memory_policy: str = "error",
            want_ops: bool = False) -> Comparison:
    """Lower ``item.mapping`` once, estimate and simulate it (:func:`marssim.plan.run`), and
    attribute the gap."""
    from marssim.plan import run

    m = item.mapping
    estimated = run(m, graph, system, cost, how="estimate", detail=False, validate=False)
    tg, est = estimated.taskgraph, estimated.estimate
    base = dict(name=item.name, key=m.key, family=item.family, sets=len(m.sets), stages=m.n_stages,
                micro_batches=m.micro_batches, tasks=tg.n_tasks, estimate_s=est.makespan,
                lower_bound_s=est.lower_bound, bounded_s=est.bounded,
                estimate_wall_s=estimated.wall_s["evaluate_s"])
    t1 = time.perf_counter()
    try:
        sim = run(m, graph, system, cost, taskgraph=tg, memory_policy=memory_policy, record=False).result
    except CapacityError as err:
        return Comparison(**base, simulated_s=math.nan, error=math.nan, feasible=False, problem=str(err),
                          simulate_wall_s=time.perf_counter() - t1)
    wall = time.perf_counter() - t1
    log = sim.intervals
    log = log[log["task"] >= 0].sort_values("task")
    start = log["start"].to_numpy()
    end = log["end"].to_numpy()
    delays, link_delay = attribute(tg, system, est, start, end)
    wait = _device_wait(tg, start, end)
    ops = op_times(tg, start, end) if want_ops else {}
    ops_est = op_times(tg, est.start, est.end) if want_ops else {}
    error = (est.makespan - sim.makespan) / sim.makespan if sim.makespan > 0 else 0.0
    return Comparison(**base, simulated_s=sim.makespan, error=error, simulate_wall_s=wall,
                      link_delay_s=link_delay, wait_s=wait, wait_estimate_s=float((est.start - est.ready).sum()),
                      delays=delays, op_sim_s=ops, op_est_s=ops_est)


def _device_wait(tg: TaskGraph, start: np.ndarray, end: np.ndarray) -> float:
    """Seconds compute tasks spent between their predecessors' end and their own start."""
    if tg.n_tasks == 0:
        return 0.0
    counts = np.diff(tg.pred_ptr)
    ready = np.zeros(tg.n_tasks)
    np.maximum.at(ready, np.repeat(np.arange(tg.n_tasks), counts), end[tg.pred_idx])
    comp = tg.kind == COMPUTE
    return float((start[comp] - ready[comp]).sum())


def attribute(tg: TaskGraph, system: System, est, start: np.ndarray, end: np.ndarray) -> tuple[dict[str, float], float]:
    """Charge the gap between simulation and estimate to resources (see the module docstring).

    ``start``/``end``: the simulated times per task (s). The simulated makespan is the sum of
    the simulated durations along its critical path; each transfer on it took its contention-free
    duration plus some extra, charged to the resource(s) of its route that squeezed it most. When
    every device runs its tasks in the same order in both schedules, the charged seconds are at
    least the gap; what the gap exceeds them by is charged to ``device order``. Returns
    ``(delays, link_delay_s)``: seconds per resource name, and the extra seconds of all transfers
    (on the critical path or not)."""
    from marssim.analytical import critical_path

    is_transfer = tg.kind != COMPUTE
    extra = np.maximum(np.where(is_transfer, (end - start) - est.duration, 0.0), 0.0)
    link_delay = float(extra.sum())
    names = system.resource_names
    delays: dict[str, float] = {}
    path = critical_path(tg, start, end)
    on_path = path[is_transfer[path]]
    on_path = on_path[extra[on_path] > 1e-12 * float(end.max(initial=0.0))]
    if len(on_path):
        shared = _shared_resources(tg, system, start, end)
        for t in on_path.tolist():
            res = shared.get(t) or _bottleneck(tg, system, t)
            for r in res:
                delays[names[r]] = delays.get(names[r], 0.0) + extra[t] / len(res)
    gap = float(end.max(initial=0.0)) - est.makespan
    residual = gap - sum(delays.values())
    if residual > 1e-9 * max(gap, 1e-30) and residual > 1e-15:
        delays["device order"] = residual
    return delays, link_delay


def _bottleneck(tg: TaskGraph, system: System, t: int) -> tuple[int, ...]:
    res = tg.routes[tg.route[t]].resources
    if not res:
        return ()
    cap = system.resource_capacity[list(res)]
    return (res[int(np.argmin(cap))],)


def _shared_resources(tg: TaskGraph, system: System, start: np.ndarray, end: np.ndarray) -> dict[int, tuple[int, ...]]:
    """For each transfer that overlapped another flow on some resource of its route, the
    resource(s) that squeezed it most: the smallest capacity per concurrent flow (its capacity
    over one plus the flows that overlapped it there; ties all count)."""
    transfers = np.flatnonzero((tg.kind != COMPUTE) & (tg.nbytes > 0))
    by_resource: dict[int, list[int]] = {}
    for t in transfers.tolist():
        for r in tg.routes[tg.route[t]].resources:
            by_resource.setdefault(r, []).append(t)
    cap = system.resource_capacity
    best: dict[int, tuple[float, list[int]]] = {}
    for r, members in sorted(by_resource.items()):
        if len(members) < 2:
            continue
        idx = np.asarray(members)
        s, e = start[idx], end[idx]
        others = np.zeros(len(idx), dtype=np.int64)
        for lo in range(0, len(idx), 1024):  # blocks keep the overlap matrix small
            blk = slice(lo, lo + 1024)
            ov = (s[blk, None] < e[None, :]) & (s[None, :] < e[blk, None])
            others[blk] = ov.sum(axis=1) - 1
        for t, k in zip(idx[others > 0].tolist(), others[others > 0].tolist()):
            share = float(cap[r]) / (1 + k)
            cur = best.get(t)
            if cur is None or share < cur[0] * (1 - 1e-12):
                best[t] = (share, [r])
            elif share <= cur[0] * (1 + 1e-12):
                cur[1].append(r)
    return {t: tuple(rs) for t, (_, rs) in best.items()}


def op_times(tg: TaskGraph, start: np.ndarray, end: np.ndarray) -> dict[str, float]:
    """Seconds each op spends computing: per micro-batch, from its first shard's start to its
    last shard's end, summed over micro-batches (transfers excluded)."""
    comp = tg.kind == COMPUTE
    frame = pd.DataFrame({"op": tg.op[comp], "mb": tg.micro_batch[comp], "start": start[comp], "end": end[comp]})
    frame = frame[frame["op"] >= 0]
    if frame.empty:
        return {}
    g = frame.groupby(["op", "mb"], sort=True)
    span = (g["end"].max() - g["start"].min()).groupby(level=0).sum()
    return {tg.op_names[int(o)]: float(v) for o, v in span.items()}
