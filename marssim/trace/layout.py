"""Where each interval of a :class:`~marssim.sim.Result` goes in a timeline view.

A *process* per accelerator, per host and per link or switch backplane that carried traffic;
*threads* (tracks) inside them:

* accelerator: ``compute`` (its compute intervals) and ``DMA out`` (the transfers it sends);
* host: ``DMA out`` (inputs it sends, spills coming back);
* link / switch backplane: one track per lane of concurrent flows (``flow 1``, ``flow 2`` ...),
  holding one slice per transfer that crosses it.

Intervals that overlap on one track are spread over extra lanes (``compute 2``, ``DMA out 2``)
by :func:`~marssim.trace.lanes.assign_lanes`, so that no track ever shows two slices at once.
Times are integer nanoseconds (``round(seconds * 1e9)``); viewers store nanoseconds, and an
integer grid keeps back-to-back slices exactly back to back. Memory resources (``acc0:mem``,
``host0:dram``) get no process: their bandwidth is a counter of their node's process.

The layout reads only the Result's tables, so it works on results loaded from disk.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from marssim.units import fmt_bytes, fmt_rate

from .lanes import assign_lanes

__all__ = ["Process", "Thread", "TraceLayout", "build_layout", "to_ns", "resource_kinds", "memory_node",
           "COMPUTE_TRACK", "SEND_TRACK"]

COMPUTE_TRACK = "compute"
SEND_TRACK = "DMA out"
_ONE_NS = 1  # an empty slice still owns its nanosecond: no two slices of a track start together


@dataclass(frozen=True, slots=True)
class Process:
    """A process of the trace: ``kind`` is accelerator, host, link or switch; ``key`` the node or
    resource name it shows; ``label`` a short description (design, capacity)."""

    pid: int
    kind: str
    key: str
    name: str
    label: str = ""


@dataclass(frozen=True, slots=True)
class Thread:
    """A track inside a process: ``role`` is compute, DMA out or flow; ``lane`` counts from 0."""

    pid: int
    tid: int
    role: str
    lane: int
    name: str


@dataclass(frozen=True, eq=False)
class TraceLayout:
    """Processes, threads, and the track of every interval and every link slice.

    Per interval row of ``result.intervals``: ``start_ns``, ``end_ns``, ``pid``, ``tid``.
    Link slices (one per transfer per link or backplane it crosses), ordered by interval row
    then hop: ``hop_row`` (the interval row), ``hop_pid``, ``hop_tid``."""

    processes: tuple[Process, ...]
    threads: tuple[Thread, ...]
    start_ns: np.ndarray
    end_ns: np.ndarray
    pid: np.ndarray
    tid: np.ndarray
    hop_row: np.ndarray
    hop_pid: np.ndarray
    hop_tid: np.ndarray
    node_pid: dict[str, int]
    resource_pid: dict[str, int]

    @property
    def n_slices(self) -> int:
        return int(self.start_ns.shape[0] + self.hop_row.shape[0])


def to_ns(seconds) -> np.ndarray:
    """Seconds to integer nanoseconds, rounded to nearest (ties to even)."""
    return np.rint(np.asarray(seconds, dtype=float) * 1e9).astype(np.int64)


def resource_kinds(result) -> dict[str, str]:
    """Kind (link, switch, memory) of every bandwidth resource of ``result.links`` (resources
    missing there are classified by name, see ``_kind_of``)."""
    kinds: dict[str, str] = {}
    links = result.links
    if "kind" in getattr(links, "columns", ()):
        kinds.update({str(k): str(v) for k, v in links["kind"].items()})
    return kinds


def _kind_of(name: str, kinds: dict[str, str]) -> str:
    """The table's kind, else by name: ``x:mem``/``x:dram`` memory, ``x:backplane`` switch, else link."""
    kind = kinds.get(name)
    if kind:
        return kind
    if name.endswith(":mem") or name.endswith(":dram"):
        return "memory"
    if name.endswith(":backplane"):
        return "switch"
    return "link"


def memory_node(resource: str) -> str:
    """The node whose memory a memory resource is (``acc0:mem`` -> ``acc0``)."""
    return resource.rsplit(":", 1)[0]


def build_layout(result) -> TraceLayout:
    """Assign every interval and link slice of ``result`` to a process and a lane-free track."""
    iv = result.intervals
    n = len(iv)
    start_ns = to_ns(iv["start"].to_numpy()) if n else np.zeros(0, dtype=np.int64)
    end_ns = to_ns(iv["end"].to_numpy()) if n else np.zeros(0, dtype=np.int64)
    kind = iv["kind"].to_numpy(dtype=object) if n else np.zeros(0, dtype=object)
    is_compute = kind == "compute"
    resource = iv["resource"].to_numpy(dtype=object) if n else np.zeros(0, dtype=object)
    src = iv["src"].to_numpy(dtype=object) if n else np.zeros(0, dtype=object)
    dst = iv["dst"].to_numpy(dtype=object) if n else np.zeros(0, dtype=object)
    kinds = resource_kinds(result)

    # ---------------------------------------------------------------- processes
    accelerators = [str(d) for d in result.devices.index]
    acc_set = set(accelerators)
    for dev in pd.unique(resource[is_compute]):  # a compute resource missing from the table
        if dev not in acc_set:
            accelerators.append(str(dev))
            acc_set.add(str(dev))
    hosts: list[str] = []
    seen = set(acc_set)
    mem_nodes = [str(x) for x in result.memories.index] if len(result.memories) else []
    others = sorted({str(x) for x in np.concatenate([src[~is_compute], dst[~is_compute]]) if x}
                    | {str(x) for x in result.memory_timeline.get("node", pd.Series(dtype=object)).unique()})
    for node in mem_nodes + others:
        if node and node not in seen:
            hosts.append(node)
            seen.add(node)

    # link resources: in the links table's order, those any transfer crossed or that changed rate
    route_strings, route_codes = _factorize(iv["links"].to_numpy(dtype=object)[~is_compute]) if n else ([], None)
    crossed: set[str] = set()
    for route in route_strings:
        crossed.update(r for r in route.split(";") if r)
    if len(result.link_timeline):
        crossed.update(str(r) for r in result.link_timeline["resource"].unique())
    table_order = [str(r) for r in result.links.index] if len(result.links) else []
    link_names = [r for r in table_order if r in crossed and _kind_of(r, kinds) != "memory"]
    link_names += sorted(r for r in crossed if r not in set(table_order) and _kind_of(r, kinds) != "memory")

    processes: list[Process] = []
    node_pid: dict[str, int] = {}
    resource_pid: dict[str, int] = {}
    devices = result.devices
    memories = result.memories
    for dev in accelerators:
        pid = len(processes) + 1
        design = str(devices.loc[dev, "design"]) if dev in devices.index and "design" in devices.columns else ""
        design = "" if design in ("nan", "None") else design
        label = []
        if design:
            label.append(f"design {design}")
        if dev in memories.index and "capacity_bytes" in memories.columns:
            label.append(f"memory {fmt_bytes(float(memories.loc[dev, 'capacity_bytes']))}")
        shown = str(devices.loc[dev, "label"]) if dev in devices.index and "label" in devices.columns else ""
        note = ", ".join(x for x in (design, "" if shown in ("nan", "None") else shown) if x)
        processes.append(Process(pid, "accelerator", dev, f"{dev} ({note})" if note else dev, ", ".join(label)))
        node_pid[dev] = pid
    for host in hosts:
        pid = len(processes) + 1
        label = ""
        if host in memories.index and "capacity_bytes" in memories.columns:
            label = f"DRAM {fmt_bytes(float(memories.loc[host, 'capacity_bytes']))}"
        processes.append(Process(pid, "host", host, f"{host} (host)", label))
        node_pid[host] = pid
    has_capacity = "capacity" in getattr(result.links, "columns", ())
    capacity = result.links["capacity"] if has_capacity else pd.Series(dtype=float)
    for res in link_names:
        pid = len(processes) + 1
        k = _kind_of(res, kinds)
        label = fmt_rate(float(capacity[res])) if res in capacity.index else ""
        if k == "switch":
            name = f"switch {res}"
        else:
            name = f"link {res}"
        processes.append(Process(pid, "switch" if k == "switch" else "link", res, name, label))
        resource_pid[res] = pid

    # ---------------------------------------------------------------- tracks of intervals
    # track group: compute intervals on their device, transfers (and spills) on their sender
    role = np.where(is_compute, 0, 1).astype(np.int64)
    owner = np.where(is_compute, resource, src) if n else resource
    pid = (pd.Series(owner, dtype=object).map(node_pid).to_numpy(dtype=np.int64) if n
           else np.zeros(0, dtype=np.int64))
    lane = np.zeros(n, dtype=np.int64)
    for (p, r), rows in _groups(pid, role):
        lane[rows] = assign_lanes(start_ns[rows], end_ns[rows], min_length=_ONE_NS)

    # ---------------------------------------------------------------- link slices
    hop_row = np.zeros(0, dtype=np.int64)
    hop_pid = np.zeros(0, dtype=np.int64)
    if n and len(route_strings):
        per_route = [[resource_pid[r] for r in s.split(";") if r in resource_pid] for s in route_strings]
        counts_by_route = np.asarray([len(x) for x in per_route], dtype=np.int64)
        flat = np.asarray([p_ for x in per_route for p_ in x], dtype=np.int64)
        first = np.concatenate([[0], np.cumsum(counts_by_route)[:-1]]).astype(np.int64)
        rows = np.flatnonzero(~is_compute)
        counts = counts_by_route[route_codes]
        hop_row = np.repeat(rows, counts)
        within = np.arange(hop_row.shape[0], dtype=np.int64) - np.repeat(np.cumsum(counts) - counts, counts)
        hop_pid = flat[np.repeat(first[route_codes], counts) + within]
    hop_lane = np.zeros(hop_row.shape[0], dtype=np.int64)
    for (p, _), idx in _groups(hop_pid, np.zeros_like(hop_pid)):
        r = hop_row[idx]
        hop_lane[idx] = assign_lanes(start_ns[r], end_ns[r], min_length=_ONE_NS)

    # ---------------------------------------------------------------- threads and tids
    lanes_of: dict[tuple[int, int], int] = {}
    for (p, r), rows in _groups(pid, role):
        lanes_of[(int(p), int(r))] = int(lane[rows].max()) + 1
    for (p, _), idx in _groups(hop_pid, np.zeros_like(hop_pid)):
        lanes_of[(int(p), 2)] = int(hop_lane[idx].max()) + 1
    threads: list[Thread] = []
    first_tid: dict[tuple[int, int], int] = {}
    next_tid = len(processes) + 1  # tids never equal a pid (a tid equal to a pid is its main thread)
    for proc in processes:
        for r, base in ((0, COMPUTE_TRACK), (1, SEND_TRACK), (2, "flow")):
            count = lanes_of.get((proc.pid, r), 0)
            if count:
                first_tid[(proc.pid, r)] = next_tid
            for k in range(count):
                name = f"flow {k + 1}" if r == 2 else (base if k == 0 else f"{base} {k + 1}")
                threads.append(Thread(proc.pid, next_tid, base, k, name))
                next_tid += 1
    tid = _first_tid(first_tid, pid, role) + lane
    hop_tid = _first_tid(first_tid, hop_pid, np.full_like(hop_pid, 2)) + hop_lane
    return TraceLayout(tuple(processes), tuple(threads), start_ns, end_ns, pid, tid, hop_row, hop_pid, hop_tid,
                       node_pid, resource_pid)


def _factorize(values: np.ndarray) -> tuple[list[str], np.ndarray]:
    codes, uniques = pd.factorize(values, sort=False)
    return [str(u) for u in uniques], codes.astype(np.int64)


def _groups(a: np.ndarray, b: np.ndarray):
    """``((a, b), row indices)`` for each distinct pair, in increasing (a, b) order."""
    if a.shape[0] == 0:
        return
    order = np.lexsort((np.arange(a.shape[0]), b, a))
    sa, sb = a[order], b[order]
    cut = np.flatnonzero((sa[1:] != sa[:-1]) | (sb[1:] != sb[:-1])) + 1
    for chunk in np.split(order, cut):
        yield (int(a[chunk[0]]), int(b[chunk[0]])), chunk


def _first_tid(first_tid: dict[tuple[int, int], int], pid: np.ndarray, role: np.ndarray) -> np.ndarray:
    """The tid of lane 0 of each row's (process, role) group; lanes follow it consecutively."""
    out = np.zeros(pid.shape[0], dtype=np.int64)
    for key, rows in _groups(pid, role):
        out[rows] = first_tid[key]
    return out
