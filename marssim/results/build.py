"""Build a :class:`~marssim.results.Result` from a schedule: the TaskGraph, the System, the start
and end time of every task (s), and what only the evaluator knows (a simulation's spills, memory
pools and link usage; an estimate gets them from :mod:`marssim.results.timelines`).

Both evaluators call :func:`build_result`, so a simulated and an estimated schedule of the same
TaskGraph are reported with the same tables, the same aggregations of bytes and energy
(:mod:`marssim.results.aggregate`) and the same per-op report (:mod:`marssim.results.report`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from marssim.lazymodule import lazy_module
from marssim.system import System
from marssim.taskgraph import COMPUTE, TaskGraph

from .aggregate import (
    communication_energy, compute_energy, node_compute_energy, resource_bytes, route_energy_per_byte, transfer_energy,
)
from .report import group_table, op_device_table, op_table
from .result import INTERVAL_COLUMNS, Result
from .schedule import busy_time
from .summary import steady_throughput

pd = lazy_module("pandas")  # imported when a table is first built

__all__ = ["Spill", "build_result", "interval_frame", "device_table", "link_table"]


@dataclass(frozen=True, slots=True)
class Spill:
    """A flow outside the TaskGraph that a simulation ran (a buffer spilled to or brought back
    from host memory): ``kind`` (``spill_out`` or ``spill_in``), the task whose buffer it moved,
    its ends (node names), start and end (s) and bytes."""

    kind: str
    task: int
    src: str
    dst: str
    start: float
    end: float
    nbytes: float


def build_result(taskgraph: TaskGraph, system: System, start: np.ndarray, end: np.ndarray, *, streams: int = 1,
                 memories: pd.DataFrame, memory_timeline: pd.DataFrame, link_timeline: pd.DataFrame,
                 link_busy: np.ndarray, spills: Sequence[Spill] = (), meta: dict[str, Any] | None = None,
                 level: str = "block") -> Result:
    """The :class:`Result` of a schedule of ``taskgraph`` on ``system`` (``start``/``end``: s, one
    per task; devices running ``streams`` tasks at once). ``memories`` (index node: peak_bytes,
    capacity_bytes, resident_bytes), ``memory_timeline`` and ``link_timeline`` (see
    :class:`Result`), ``link_busy`` (seconds each resource carried a flow) and ``spills`` come
    from the evaluator; ``meta`` is added to the TaskGraph's labels; ``level``: the layer groups of
    the report (``block`` or ``stage``)."""
    tg = taskgraph
    makespan = float(np.nanmax(end)) if tg.n_tasks else 0.0
    spill_routes = [(system.route(s.src, s.dst), s.nbytes) for s in spills]
    comm = communication_energy(tg, system)
    if spills and system.has_link_energy:
        per_byte = route_energy_per_byte([r for r, _ in spill_routes], system)
        comm += float(sum(nbytes * per_byte[i] for i, (_, nbytes) in enumerate(spill_routes)))
    info = dict(tg.meta)
    info.update(meta or {})
    spilled = [(int(tg.op[s.task]), s.nbytes) for s in spills]

    def report() -> dict[str, pd.DataFrame]:
        ops = op_table(tg, system, start, end, makespan, spilled=spilled, level=level)
        devices = op_device_table(tg, start, end)
        return {"ops": ops, "layers": group_table(ops, devices, makespan), "op_devices": devices}

    return Result(
        makespan=makespan, intervals=interval_frame(tg, system, start, end, spills),
        devices=device_table(tg, system, start, end, makespan, streams),
        links=link_table(tg, system, makespan, link_busy, extra=spill_routes), memories=memories,
        memory_timeline=memory_timeline, link_timeline=link_timeline, edges=edge_frame(tg),
        throughput=steady_throughput(tg, end, makespan, system, streams), meta=info,
        compute_energy=compute_energy(tg, system), communication_energy=comm, report=report)


def interval_frame(tg: TaskGraph, system: System, start: np.ndarray, end: np.ndarray,
                   spills: Sequence[Spill] = ()) -> pd.DataFrame:
    """The interval log (:data:`~marssim.results.result.INTERVAL_COLUMNS`), sorted by start,
    kind and task."""
    n = tg.n_tasks
    names = tg.node_names
    is_compute = tg.kind == COMPUTE
    op_names = np.asarray(tg.op_names + ("",), dtype=object)[tg.op]
    model_of = {op.name: op.model for op in tg.ops}
    models = np.asarray([model_of.get(o, "") for o in op_names], dtype=object)
    node_arr = np.asarray(names + ("",), dtype=object)
    src_names = node_arr[tg.src]
    dst_names = node_arr[tg.dst]
    resource = np.where(is_compute, node_arr[tg.device], src_names + "->" + dst_names)
    coll_kind = np.asarray([c.kind for c in tg.collectives] + [""], dtype=object)[tg.collective]
    res_names = np.asarray(system.resource_names, dtype=object)
    link_of_route = [";".join(res_names[list(r.resources)]) for r in tg.routes] + [""]
    links_col = np.asarray(link_of_route, dtype=object)[tg.route]
    frame = pd.DataFrame({
        "kind": np.where(is_compute, "compute", "transfer"), "resource": resource,
        "task": np.arange(n), "op": op_names, "model": models, "micro_batch": tg.micro_batch.astype(np.int64),
        "start": start, "end": end, "bytes": np.where(is_compute, 0.0, tg.nbytes), "flops": tg.flops,
        "energy": np.where(is_compute, tg.energy, transfer_energy(tg, system)),
        "src": np.where(is_compute, "", src_names), "dst": np.where(is_compute, "", dst_names),
        "collective": coll_kind, "collective_id": tg.collective.astype(np.int64), "links": links_col,
    })
    if spills:
        per_byte = route_energy_per_byte([system.route(s.src, s.dst) for s in spills], system)
        rows = []
        for i, s in enumerate(spills):
            route = system.route(s.src, s.dst)
            rows.append({"kind": s.kind, "resource": f"{s.src}->{s.dst}", "task": -1, "op": op_names[s.task],
                         "model": models[s.task], "micro_batch": int(tg.micro_batch[s.task]), "start": s.start,
                         "end": s.end, "bytes": s.nbytes, "flops": 0.0,
                         "energy": s.nbytes * per_byte[i] if system.has_link_energy else np.nan,
                         "src": s.src, "dst": s.dst, "collective": "", "collective_id": -1,
                         "links": ";".join(res_names[list(route.resources)])})
        frame = pd.concat([frame, pd.DataFrame(rows)], ignore_index=True)
    return frame.sort_values(["start", "kind", "task"], kind="stable").reset_index(drop=True)[list(INTERVAL_COLUMNS)]


def device_table(tg: TaskGraph, system: System, start: np.ndarray, end: np.ndarray, makespan: float,
                 streams: int = 1) -> pd.DataFrame:
    """One row per accelerator: ``design``, ``busy_s``, ``utilisation`` (busy over the
    makespan), ``energy_j`` (compute; NaN unknown), ``flops``, ``tasks``, ``represented_by``
    (the GPU whose schedule a folded run simulated for this one, ``""`` for itself: a GPU it
    stood for reports what its representative ran)."""
    n = len(tg.node_names)
    is_compute = tg.kind == COMPUTE
    busy = busy_time(tg, start, end, streams)
    energy, known = node_compute_energy(tg)
    flops = np.bincount(tg.device[is_compute], weights=tg.flops[is_compute], minlength=n)[:n]
    count = np.bincount(tg.device[is_compute], minlength=n)[:n]
    fold = tg.meta.get("fold") or {}  # a device a folded run stood for reports what its class's representative ran
    designs = tg.meta.get("device_design") or {}
    rows = {}
    for acc in system.accelerators:
        rep = fold.get(acc.id, acc.id)
        i = system.node_index[rep]
        rows[acc.id] = {"design": tg.device_design.get(rep, designs.get(acc.id, "")), "busy_s": float(busy[i]),
                        "utilisation": float(busy[i]) / makespan if makespan > 0 else 0.0,
                        "energy_j": float(energy[i]) if known[i] else np.nan,
                        "flops": float(flops[i]), "tasks": int(count[i]),
                        "represented_by": rep if rep != acc.id else ""}
    return pd.DataFrame.from_dict(rows, orient="index", columns=["design", "busy_s", "utilisation", "energy_j", "flops",
                                                                 "tasks", "represented_by"])


def link_table(tg: TaskGraph, system: System, makespan: float, busy: np.ndarray, *, extra=()) -> pd.DataFrame:
    """One row per bandwidth resource (index ``resource``): ``kind``, ``capacity`` (bytes/s),
    ``bytes`` carried (:func:`~marssim.results.aggregate.resource_bytes`), ``busy_s`` (seconds it
    carried a flow) and ``utilisation`` (bytes over capacity times the makespan)."""
    res_bytes = resource_bytes(tg, system, extra=extra)
    cap = system.resource_capacity
    return pd.DataFrame({
        "kind": list(system.resource_kinds), "capacity": cap, "bytes": res_bytes, "busy_s": np.asarray(busy, float),
        "utilisation": res_bytes / (cap * makespan) if makespan > 0 else np.zeros(len(cap)),
    }, index=pd.Index(system.resource_names, name="resource"))


def edge_frame(tg: TaskGraph) -> pd.DataFrame:
    """The dependencies that involve a transfer: ``src_task``, ``dst_task``."""
    counts = np.diff(tg.pred_ptr)
    dst = np.repeat(np.arange(tg.n_tasks), counts)
    src = tg.pred_idx.astype(np.int64)
    keep = (tg.kind[src] != COMPUTE) | (tg.kind[dst] != COMPUTE)
    return pd.DataFrame({"src_task": src[keep], "dst_task": dst[keep]})
