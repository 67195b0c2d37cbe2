"""Facts of a schedule (start and end times of every task, s) that any evaluator's schedule has:
one critical path, and how long each device was busy."""

from __future__ import annotations

import numpy as np

from marssim.taskgraph import COMPUTE, TaskGraph

__all__ = ["critical_path", "busy_time", "union_length"]


def critical_path(taskgraph: TaskGraph, start: np.ndarray, end: np.ndarray) -> np.ndarray:
    """Task ids of one critical path of a schedule (``start``/``end`` in seconds, one per task),
    first to last: from the task that ends last, repeatedly step to whatever it waited for, the
    predecessor or (for a compute task) the task its device ran just before it, whichever ended
    latest. Works for estimated and simulated schedules alike."""
    tg = taskgraph
    if tg.n_tasks == 0:
        return np.zeros(0, dtype=np.int64)
    comp = np.flatnonzero(tg.kind == COMPUTE)
    order = comp[np.lexsort((comp, start[comp], tg.device[comp]))]
    prev_on_device = np.full(tg.n_tasks, -1, dtype=np.int64)
    same = tg.device[order[1:]] == tg.device[order[:-1]]
    prev_on_device[order[1:][same]] = order[:-1][same]
    pp = tg.pred_ptr
    pi = tg.pred_idx
    path = [int(np.argmax(end))]
    seen = {path[0]}
    while start[path[-1]] > 0.0:
        t = path[-1]
        candidates = [int(p) for p in pi[pp[t]:pp[t + 1]]]
        if prev_on_device[t] >= 0:
            candidates.append(int(prev_on_device[t]))
        candidates = [c for c in candidates if c not in seen]
        if not candidates:
            break
        best = max(candidates, key=lambda p: (end[p], -p))
        path.append(best)
        seen.add(best)
    return np.asarray(path[::-1], dtype=np.int64)


def busy_time(taskgraph: TaskGraph, start: np.ndarray, end: np.ndarray, streams: int = 1) -> np.ndarray:
    """Seconds each node (by index) spent computing: the sum of its compute tasks' durations, or
    with ``streams`` > 1 (tasks may overlap) the length of their union."""
    tg = taskgraph
    n = len(tg.node_names)
    is_compute = tg.kind == COMPUTE
    if streams == 1:
        return np.bincount(tg.device[is_compute], weights=(end - start)[is_compute], minlength=n)[:n]
    busy = np.zeros(n)
    for d in np.unique(tg.device[is_compute]).tolist():
        mask = is_compute & (tg.device == d)
        busy[d] = union_length(start[mask], end[mask])
    return busy


def union_length(starts: np.ndarray, ends: np.ndarray) -> float:
    """Total length (s) covered by a set of intervals."""
    if len(starts) == 0:
        return 0.0
    order = np.argsort(starts, kind="stable")
    total = 0.0
    cur_s, cur_e = float(starts[order[0]]), float(ends[order[0]])
    for i in order[1:]:
        s_, e_ = float(starts[i]), float(ends[i])
        if s_ > cur_e:
            total += cur_e - cur_s
            cur_s, cur_e = s_, e_
        elif e_ > cur_e:
            cur_e = e_
    return total + cur_e - cur_s
