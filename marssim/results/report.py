"""The per-op and per-layer report of a schedule, whichever evaluator produced it.

From the TaskGraph, the System and the start and end time of every task (s), one row per op of
the workload (graph order) and one per layer group (:mod:`marssim.results.groups`):

==================  =============================================================================
column              meaning
==================  =============================================================================
group               the layer group (``layer2.1``, ``encoder.layer.7``, ``conv1 .. maxpool``)
kind, model         op kind (conv, gemm, ...); workload model (several in a multi-model mix)
sharding, set       the strategy that split it; the accelerator set(s) that ran it
cost_model          the cost model(s) that timed its shards (``systolic-os``, ``measured``,
                    ``interpolated``, ``fitted``, ``gpu-roofline``, ...)
loops               the loop nest (``N=8 K=64 ...``; ops only)
ops, tasks          ops in the group; compute tasks and transfers labelled with the op
flops               FLOPs of its compute tasks
start_s, end_s      when its first task started and its last one ended
span_s              ``end_s - start_s``
critical_s          seconds of its tasks on one critical path of the schedule
critical_share      ``critical_s`` over the makespan (the shares of all ops add up to at most 1)
busy_s              seconds of compute, all devices together
busy_max_s          seconds of compute of its busiest device
transfer_s          seconds of its transfers (flows overlap: not a share of anything)
bytes               bytes its transfers (and spills) moved
compute_energy_j    joules of its compute tasks (NaN when no design has energy figures)
comm_energy_j       joules of its transfers (NaN when no link has an energy figure)
==================  =============================================================================

A transfer is labelled with the op that needs its data (the consumer), so an op's bytes and
transfer time are what it waited to receive (a graph output's return to the host is its
producer's). ``op_devices`` is the busy time per (op, device) in long form. Units: s, bytes,
FLOP, J.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from marssim.lazymodule import lazy_module
from marssim.system import System
from marssim.taskgraph import COMPUTE, OpInfo, TaskGraph

from .aggregate import transfer_energy
from .groups import layer_groups
from .schedule import critical_path

pd = lazy_module("pandas")  # imported when a table is first built

__all__ = ["OP_COLUMNS", "GROUP_COLUMNS", "op_table", "group_table", "op_device_table", "format_layers"]

OP_COLUMNS = ("group", "kind", "model", "sharding", "set", "cost_model", "loops", "tasks", "flops", "start_s",
              "end_s", "span_s", "critical_s", "critical_share", "busy_s", "busy_max_s", "transfer_s", "bytes",
              "compute_energy_j", "comm_energy_j")
GROUP_COLUMNS = ("ops", "kind", "model", "sharding", "set", "cost_model", "tasks", "flops", "start_s", "end_s",
                 "span_s", "critical_s", "critical_share", "busy_s", "busy_max_s", "transfer_s", "bytes",
                 "compute_energy_j", "comm_energy_j")


def _ops_in_order(tg: TaskGraph) -> list[OpInfo]:
    """The TaskGraph's ops in graph order, then any op name its tasks use that is not among them."""
    known = list(tg.ops)
    named = {op.name for op in known}
    return known + [OpInfo(name) for name in tg.op_names if name not in named]


def _sum_known(values: np.ndarray, rows: np.ndarray, n: int) -> np.ndarray:
    """Per row: the sum of ``values`` that are not NaN, NaN where all were."""
    total = np.bincount(rows, weights=np.nan_to_num(values), minlength=n)[:n]
    known = np.bincount(rows, weights=~np.isnan(values), minlength=n)[:n] > 0
    return np.where(known, total, np.nan)


def op_table(taskgraph: TaskGraph, system: System, start: np.ndarray, end: np.ndarray, makespan: float, *,
             path: np.ndarray | None = None, spilled: Sequence[tuple[int, float]] = (),
             level: str = "block") -> pd.DataFrame:
    """One row per op (index ``op``; columns :data:`OP_COLUMNS`, see the module docstring).
    ``path``: task ids of a critical path (default: :func:`critical_path` of this schedule);
    ``spilled``: ``(op index into taskgraph.op_names, bytes)`` of flows outside the TaskGraph
    (a simulation's spills), added to ``bytes``; ``level``: the layer groups' level."""
    tg = taskgraph
    ops = _ops_in_order(tg)
    n = len(ops)
    row_of_name = {op.name: i for i, op in enumerate(ops)}
    row_of_index = np.asarray([row_of_name[name] for name in tg.op_names] + [n], dtype=np.int64)
    labelled = tg.op >= 0
    rows = row_of_index[tg.op[labelled]]
    s, e = start[labelled], end[labelled]
    dur = e - s
    is_compute = tg.kind[labelled] == COMPUTE
    comp_rows = rows[is_compute]

    def per_op(weights: np.ndarray, which: np.ndarray | None = None) -> np.ndarray:
        r = rows if which is None else rows[which]
        return np.bincount(r, weights=weights, minlength=n + 1)[:n]

    first = np.full(n + 1, np.inf)
    np.minimum.at(first, rows, s)
    last = np.full(n + 1, -np.inf)
    np.maximum.at(last, rows, e)
    first, last = first[:n], last[:n]
    on_path = np.zeros(tg.n_tasks, dtype=bool)
    on_path[critical_path(tg, start, end) if path is None else path] = True
    critical = per_op(np.where(on_path[labelled], dur, 0.0))
    nbytes = per_op(np.where(is_compute, 0.0, tg.nbytes[labelled]))
    for index, moved in spilled:
        if index >= 0:
            nbytes[row_of_index[index]] += moved
    comm = transfer_energy(tg, system)[labelled]
    devices = op_device_table(tg, start, end, ops=ops)
    busy_max = devices.groupby("op", sort=False)["busy_s"].max().reindex([op.name for op in ops]).fillna(0.0)
    frame = pd.DataFrame({
        "group": layer_groups([op.name for op in ops], level,
                              [op.set for op in ops] if tg.meta.get("parallel") else None),
        "kind": [op.kind for op in ops], "model": [op.model for op in ops],
        "sharding": [op.sharding for op in ops], "set": [op.set for op in ops],
        "cost_model": [op.cost_model for op in ops], "loops": [op.loops for op in ops],
        "tasks": np.bincount(rows, minlength=n + 1)[:n].astype(np.int64),
        "flops": per_op(tg.flops[labelled]),
        "start_s": np.where(np.isfinite(first), first, np.nan), "end_s": np.where(np.isfinite(last), last, np.nan),
        "span_s": np.where(np.isfinite(first), last - first, 0.0),
        "critical_s": critical, "critical_share": critical / makespan if makespan > 0 else np.zeros(n),
        "busy_s": np.bincount(comp_rows, weights=dur[is_compute], minlength=n + 1)[:n],
        "busy_max_s": busy_max.to_numpy(dtype=float),
        "transfer_s": per_op(np.where(is_compute, 0.0, dur)),
        "bytes": nbytes,
        "compute_energy_j": _sum_known(tg.energy[labelled][is_compute], comp_rows, n),
        "comm_energy_j": (np.full(n, np.nan) if not system.has_link_energy
                          else per_op(np.where(is_compute, 0.0, np.nan_to_num(comm)))),
    }, index=pd.Index([op.name for op in ops], name="op"))
    return frame[list(OP_COLUMNS)]


def op_device_table(taskgraph: TaskGraph, start: np.ndarray, end: np.ndarray, *,
                    ops: Sequence[OpInfo] | None = None) -> pd.DataFrame:
    """Busy time per (op, device): columns ``op``, ``device``, ``busy_s`` (compute seconds) and
    ``tasks``, ops in graph order and devices in system order within each op."""
    tg = taskgraph
    ops = list(ops) if ops is not None else _ops_in_order(tg)
    rank = {op.name: i for i, op in enumerate(ops)}
    sel = (tg.kind == COMPUTE) & (tg.op >= 0)
    frame = pd.DataFrame({"op_index": tg.op[sel], "device_index": tg.device[sel], "busy_s": (end - start)[sel]})
    grouped = frame.groupby(["op_index", "device_index"], sort=False).agg(busy_s=("busy_s", "sum"),
                                                                         tasks=("busy_s", "size")).reset_index()
    names = np.asarray(tg.op_names, dtype=object)
    grouped["op"] = names[grouped["op_index"].to_numpy()] if len(grouped) else []
    grouped["device"] = np.asarray(tg.node_names, dtype=object)[grouped["device_index"].to_numpy()] \
        if len(grouped) else []
    grouped["order"] = grouped["op"].map(rank)
    grouped = grouped.sort_values(["order", "device_index"], kind="stable")
    return grouped[["op", "device", "busy_s", "tasks"]].reset_index(drop=True).astype({"tasks": np.int64})


def _joined(values: pd.Series) -> str:
    return "+".join(dict.fromkeys(p for v in values.astype(str) for p in v.split("+") if p and p != "-1"))


def group_table(ops: pd.DataFrame, op_devices: pd.DataFrame, makespan: float) -> pd.DataFrame:
    """One row per layer group (index ``group``, first-appearance order; columns
    :data:`GROUP_COLUMNS`) from :func:`op_table` and :func:`op_device_table`: sums of the ops'
    counts, times, bytes and energies (NaN energy where no op of the group had one), the first
    start and last end, the busiest device's compute over the group's ops, and the distinct
    kinds, models, shardings, sets and cost models joined by ``+``."""
    g = ops.groupby("group", sort=False)
    frame = pd.DataFrame({
        "ops": g.size(),
        **{col: g[col].agg(_joined) for col in ("kind", "model", "sharding", "set", "cost_model")},
        "tasks": g["tasks"].sum(), "flops": g["flops"].sum(), "start_s": g["start_s"].min(),
        "end_s": g["end_s"].max(),
        "critical_s": g["critical_s"].sum(), "busy_s": g["busy_s"].sum(), "transfer_s": g["transfer_s"].sum(),
        "bytes": g["bytes"].sum(),
        "compute_energy_j": g["compute_energy_j"].sum(min_count=1),
        "comm_energy_j": g["comm_energy_j"].sum(min_count=1),
    })
    frame["span_s"] = (frame["end_s"] - frame["start_s"]).fillna(0.0)
    frame["critical_share"] = frame["critical_s"] / makespan if makespan > 0 else 0.0
    per_device = op_devices.assign(group=op_devices["op"].map(ops["group"]))
    busiest = per_device.groupby(["group", "device"], sort=False)["busy_s"].sum().groupby(level=0).max()
    frame["busy_max_s"] = busiest.reindex(frame.index).fillna(0.0)
    frame.index.name = "group"
    return frame[list(GROUP_COLUMNS)]


def format_layers(layers: pd.DataFrame, makespan: float, *, limit: int | None = None, by: str = "group") -> list[str]:
    """The per-layer table as text lines (``layers``: :func:`group_table` or :func:`op_table`),
    in graph order; ``limit``: at most this many rows (the rest counted in a last line)."""
    from marssim.tables import format_table
    from marssim.units import fmt_bytes, fmt_time

    shown = layers if limit is None else layers.head(limit)
    rows = []
    for name, r in shown.iterrows():
        energy = r["compute_energy_j"] + (r["comm_energy_j"] if r["comm_energy_j"] == r["comm_energy_j"] else 0.0)
        rows.append([str(name), str(r["cost_model"]) or "-", fmt_time(r["start_s"]) if r["start_s"] == r["start_s"]
                     else "-", fmt_time(r["span_s"]), fmt_time(r["critical_s"]), f"{r['critical_share']:.1%}",
                     fmt_time(r["busy_max_s"]), fmt_bytes(r["bytes"]),
                     f"{energy * 1e3:.4g} mJ" if energy == energy else "-"])
    lines = format_table([by, "cost model", "start", "span", "critical", "share", "busiest dev", "moved", "energy"],
                         rows, indent="")
    if limit is not None and len(layers) > limit:
        lines.append(f"... {len(layers) - limit} more")
    return lines
