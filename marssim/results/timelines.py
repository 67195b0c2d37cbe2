"""Memory occupancy and link usage over time, derived from a contention-free schedule (what an
analytical estimate has instead of a simulation's records).

* :func:`buffer_timeline`: memories hold the resident weights from the start; a task's output
  buffer (``mem_bytes`` on ``mem_node``) is taken when the task starts and given back when the
  last of its successors ends (its own end when it has none; a transfer of several steps has
  read its inputs when its first step ends), the rule the simulator applies.
  At one instant, buffers given back are counted before buffers taken.
* :func:`flow_timeline`: a transfer with bytes serialises from its start for ``end - start -
  latency`` seconds at its route's bottleneck rate (no other flow shares it), on every resource
  of its route, then travels the route's latency.

Units: seconds, bytes, bytes/s.
"""

from __future__ import annotations

import numpy as np

from marssim.lazymodule import lazy_module
from marssim.system import System
from marssim.taskgraph import COMPUTE, TaskGraph

pd = lazy_module("pandas")  # imported when a table is first built

__all__ = ["buffer_timeline", "flow_timeline"]


def buffer_timeline(taskgraph: TaskGraph, system: System, start: np.ndarray, end: np.ndarray,
                    read_end: np.ndarray | None = None) -> tuple[pd.DataFrame, pd.DataFrame]:
    """``(memories, memory_timeline)`` of a schedule: per node holding anything (node order)
    ``peak_bytes``, ``capacity_bytes``, ``resident_bytes``; and the occupancy after every change,
    rows ``node``, ``time`` (s), ``bytes`` (resident weights included). ``read_end`` (s, per task;
    default ``end``): when a task has read its inputs (a transfer of several steps reads them in
    its first step)."""
    tg = taskgraph
    names = tg.node_names
    succ_ptr, succ_idx = tg.successors
    has_succ = np.diff(succ_ptr) > 0
    # when each buffer is given back: the last end among the task's successors, else its own end
    last_read = np.where(has_succ, -np.inf, end)
    if len(succ_idx):
        owner = np.repeat(np.arange(tg.n_tasks), np.diff(succ_ptr))
        np.maximum.at(last_read, owner, (end if read_end is None else read_end)[succ_idx])
    held = (tg.mem_node >= 0) & (tg.mem_bytes > 0)
    nodes = sorted(set(tg.mem_node[held].tolist()) | {system.node_index[d] for d in tg.resident})
    mem_rows, timeline = {}, []
    for node in nodes:
        name = names[node]
        resident = float(tg.resident.get(name, 0.0))
        mine = held & (tg.mem_node == node)
        times = np.concatenate([last_read[mine], start[mine]])
        change = np.concatenate([-tg.mem_bytes[mine], tg.mem_bytes[mine]])
        order = np.lexsort((change > 0, times))  # frees before allocations at one instant
        level = resident + np.cumsum(change[order])
        mem_rows[name] = {"peak_bytes": float(max(resident, level.max(initial=resident))),
                          "capacity_bytes": system.memory_capacity(name), "resident_bytes": resident}
        timeline.append(pd.DataFrame({"node": name, "time": np.concatenate([[0.0], times[order]]),
                                      "bytes": np.concatenate([[resident], level])}))
    memories = pd.DataFrame.from_dict(mem_rows, orient="index", columns=["peak_bytes", "capacity_bytes",
                                                                         "resident_bytes"])
    frame = pd.concat(timeline, ignore_index=True) if timeline else pd.DataFrame(columns=["node", "time", "bytes"])
    return memories, frame


def flow_timeline(taskgraph: TaskGraph, system: System, start: np.ndarray, end: np.ndarray,
                  bottleneck: np.ndarray, latency: np.ndarray) -> tuple[pd.DataFrame, np.ndarray]:
    """``(link_timeline, busy)`` of a contention-free schedule: rows ``resource``, ``time`` (s),
    ``rate`` (bytes/s in use after the change), ``flows`` (active flows), one per resource and
    instant at which they change; and the seconds each resource carried at least one flow.
    ``bottleneck``/``latency``: per route of the TaskGraph (bytes/s, s), plus a trailing entry."""
    tg = taskgraph
    n_res = len(system.resource_names)
    moving = np.flatnonzero((tg.kind != COMPUTE) & (tg.nbytes > 0))
    res_of_route = [tuple(r.resources) for r in tg.routes]
    counts = np.asarray([len(res_of_route[r]) for r in tg.route[moving]], dtype=np.int64)
    flows = moving[counts > 0]
    counts = counts[counts > 0]
    busy = np.zeros(n_res)
    if not len(flows):
        return pd.DataFrame(columns=["resource", "time", "rate", "flows"]), busy
    route = tg.route[flows]
    begin = start[flows]
    finish = end[flows] - latency[route]
    rate = bottleneck[route]
    resource = np.concatenate([res_of_route[r] for r in route.tolist()]).astype(np.int64)
    begin, finish, rate = (np.repeat(x, counts) for x in (begin, finish, rate))
    events = pd.DataFrame({"resource": np.concatenate([resource, resource]),
                           "time": np.concatenate([begin, finish]),
                           "rate": np.concatenate([rate, -rate]),
                           "flows": np.concatenate([np.ones(len(resource), np.int64), -np.ones(len(resource), np.int64)])})
    events = events.groupby(["resource", "time"], sort=True, as_index=False)[["rate", "flows"]].sum()
    events["rate"] = events.groupby("resource")["rate"].cumsum().clip(lower=0.0)
    events["flows"] = events.groupby("resource")["flows"].cumsum()
    events.loc[events["flows"] == 0, "rate"] = 0.0  # no flow left: exactly idle, whatever the rounding
    active = events["flows"].to_numpy() > 0
    nxt = events.groupby("resource")["time"].shift(-1).to_numpy()
    spans = np.where(active & ~np.isnan(nxt), nxt - events["time"].to_numpy(), 0.0)
    np.add.at(busy, events["resource"].to_numpy(), spans)
    events["resource"] = np.asarray(system.resource_names, dtype=object)[events["resource"].to_numpy()]
    events = events.sort_values(["time", "resource"], kind="stable").reset_index(drop=True)
    return events[["resource", "time", "rate", "flows"]], busy
