"""The TaskGraph: the one interface between a mapping and its evaluation.

Columnar (numpy arrays, one entry per task) so that both evaluators read it without per-task
Python objects. A task is either

* a **compute** task: runs on ``device`` for ``duration`` seconds, doing ``flops`` FLOPs and
  spending ``energy`` joules (NaN where the design has no energy figures); or
* a **transfer**: moves ``nbytes`` bytes from node ``src`` to node ``dst`` along ``route``
  (an index into :attr:`TaskGraph.routes`); a collective is several transfers sharing a
  ``collective`` index.

Every task may allocate an output buffer of ``mem_bytes`` bytes on node ``mem_node`` when it
starts; the buffer is freed when the last of the task's successors ends (or when the task itself
ends if it has none). Weights are resident from the start (``resident``). ``priority`` orders
ready tasks on one device: lower first. Units: seconds, bytes, FLOPs, joules.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import numpy as np

from marssim.system import Route, System

__all__ = ["COMPUTE", "TRANSFER", "Collective", "TaskGraph", "TaskGraphBuilder"]

COMPUTE = 0
TRANSFER = 1


@dataclass(frozen=True, slots=True)
class Collective:
    """A collective operation expanded into point-to-point transfers.

    ``kind``: all_gather, reduce_scatter, all_reduce, all_to_all, p2p, halo, broadcast.
    ``algorithm``: ring, direct, halving_doubling, tree. ``nbytes``: bytes of the full tensor the
    collective redistributes (per device for all_reduce). ``devices``: node names in ring order.
    """

    kind: str
    algorithm: str
    devices: tuple[str, ...]
    nbytes: float
    op: str = ""
    steps: int = 0


@dataclass(frozen=True, eq=False)
class TaskGraph:
    """An immutable task DAG in columnar form. Build it with :class:`TaskGraphBuilder`."""

    kind: np.ndarray  # int8: COMPUTE or TRANSFER
    device: np.ndarray  # int32 node index of a compute task, -1 for transfers
    duration: np.ndarray  # float64 seconds (compute), 0 for transfers
    src: np.ndarray  # int32 node index (transfers), -1 for compute
    dst: np.ndarray  # int32 node index (transfers), -1 for compute
    nbytes: np.ndarray  # float64 bytes moved (transfers), 0 for compute
    route: np.ndarray  # int32 index into routes (transfers), -1 for compute
    flops: np.ndarray  # float64 FLOPs (compute)
    energy: np.ndarray  # float64 joules (compute); NaN when unknown
    mem_node: np.ndarray  # int32 node holding the task's output buffer, -1 for none
    mem_bytes: np.ndarray  # float64 bytes of that buffer
    priority: np.ndarray  # int64: lower runs first among ready tasks of one device
    op: np.ndarray  # int32 index into op_names, -1 for none
    micro_batch: np.ndarray  # int32
    collective: np.ndarray  # int32 index into collectives, -1 for none
    pred_ptr: np.ndarray  # int64 CSR: predecessors of task t are pred_idx[pred_ptr[t]:pred_ptr[t+1]]
    pred_idx: np.ndarray  # int32
    node_names: tuple[str, ...]
    op_names: tuple[str, ...]
    routes: tuple[Route, ...]
    collectives: tuple[Collective, ...]
    resident: dict[str, float] = field(default_factory=dict)  # weights resident per node, bytes
    setup: tuple[tuple[str, str, float], ...] = ()  # weight loads before the run: (src, dst, bytes)
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def n_tasks(self) -> int:
        return int(self.kind.shape[0])

    def __len__(self) -> int:
        return self.n_tasks

    @cached_property
    def successors(self) -> tuple[np.ndarray, np.ndarray]:
        """CSR of successors ``(succ_ptr, succ_idx)``, each list in increasing task order."""
        n = self.n_tasks
        counts = np.diff(self.pred_ptr)
        dst = np.repeat(np.arange(n, dtype=np.int32), counts)
        src = self.pred_idx
        order = np.lexsort((dst, src))
        succ_idx = dst[order].astype(np.int32)
        succ_ptr = np.zeros(n + 1, dtype=np.int64)
        np.add.at(succ_ptr, src.astype(np.int64) + 1, 1)
        return np.cumsum(succ_ptr), succ_idx

    def preds(self, t: int) -> np.ndarray:
        return self.pred_idx[self.pred_ptr[t] : self.pred_ptr[t + 1]]

    @cached_property
    def topological_order(self) -> np.ndarray:
        """Tasks in a topological order (Kahn, smallest index first). Raises ValueError on a cycle."""
        n = self.n_tasks
        indeg = np.diff(self.pred_ptr).astype(np.int64)
        succ_ptr, succ_idx = self.successors
        ready = list(np.flatnonzero(indeg == 0)[::-1])
        order = np.empty(n, dtype=np.int64)
        k = 0
        import heapq

        heap = [int(t) for t in ready]
        heapq.heapify(heap)
        indeg_l = indeg.tolist()
        sp = succ_ptr.tolist()
        si = succ_idx.tolist()
        while heap:
            t = heapq.heappop(heap)
            order[k] = t
            k += 1
            for j in range(sp[t], sp[t + 1]):
                s = si[j]
                indeg_l[s] -= 1
                if indeg_l[s] == 0:
                    heapq.heappush(heap, s)
        if k != n:
            raise ValueError(f"the task graph has a cycle ({n - k} tasks never become ready)")
        return order

    @property
    def total_flops(self) -> float:
        return float(self.flops.sum())

    @property
    def total_transfer_bytes(self) -> float:
        return float(self.nbytes.sum())

    def task_name(self, t: int) -> str:
        """Readable name: ``op[mb3]`` for compute, ``op:all_reduce[mb0] a->b`` for transfers."""
        op = self.op_names[self.op[t]] if self.op[t] >= 0 else "-"
        if self.kind[t] == COMPUTE:
            return f"{op}[mb{self.micro_batch[t]}]"
        coll = self.collectives[self.collective[t]].kind if self.collective[t] >= 0 else "p2p"
        return f"{op}:{coll}[mb{self.micro_batch[t]}] {self.node_names[self.src[t]]}->{self.node_names[self.dst[t]]}"

    def frame(self):
        """One row per task as a pandas DataFrame (for inspection and tests)."""
        import pandas as pd

        names = np.asarray(self.node_names + ("",), dtype=object)
        ops = np.asarray(self.op_names + ("",), dtype=object)
        return pd.DataFrame({
            "kind": np.where(self.kind == COMPUTE, "compute", "transfer"),
            "device": names[self.device], "src": names[self.src], "dst": names[self.dst],
            "duration": self.duration, "nbytes": self.nbytes, "flops": self.flops,
            "op": ops[self.op], "micro_batch": self.micro_batch, "collective": self.collective,
            "n_preds": np.diff(self.pred_ptr),
        })


class TaskGraphBuilder:
    """Accumulates tasks and edges, then freezes them into a :class:`TaskGraph`.

    Node arguments are node names of ``system``; routes come from ``system.route``."""

    def __init__(self, system: System) -> None:
        self.system = system
        self._node = system.node_index
        self._cols: dict[str, list] = {k: [] for k in (
            "kind", "device", "duration", "src", "dst", "nbytes", "route", "flops", "energy",
            "mem_node", "mem_bytes", "priority", "op", "micro_batch", "collective")}
        self._appenders = tuple(col.append for col in self._cols.values())
        self._preds: list[list[int]] = []
        self._routes: list[Route] = []
        self._route_id: dict[tuple[str, str], int] = {}
        self.collectives: list[Collective] = []
        self._op_id: dict[str, int] = {}
        self.op_names: list[str] = []
        self.resident: dict[str, float] = {}
        self.setup: list[tuple[str, str, float]] = []

    def __len__(self) -> int:
        return len(self._preds)

    def _op_index(self, op: str | None) -> int:
        if not op:
            return -1
        idx = self._op_id.get(op)
        if idx is None:
            idx = self._op_id[op] = len(self.op_names)
            self.op_names.append(op)
        return idx

    def route_index(self, src: str, dst: str) -> int:
        key = (src, dst)
        idx = self._route_id.get(key)
        if idx is None:
            idx = self._route_id[key] = len(self._routes)
            self._routes.append(self.system.route(src, dst))
        return idx

    def _append(self, **values: Any) -> int:
        cols = self._cols
        for key, col in cols.items():
            col.append(values[key])
        self._preds.append(list(values["preds"]))
        return len(self._preds) - 1

    def _row(self, kind, device, duration, src, dst, nbytes, route, flops, energy, mem_node, mem_bytes, priority, op,
             micro_batch, collective, preds) -> int:
        """Append one task (columns in :attr:`_cols` order); the lowering's hot path."""
        append = self._appenders
        append[0](kind)
        append[1](device)
        append[2](duration)
        append[3](src)
        append[4](dst)
        append[5](nbytes)
        append[6](route)
        append[7](flops)
        append[8](energy)
        append[9](mem_node)
        append[10](mem_bytes)
        append[11](priority)
        append[12](op)
        append[13](micro_batch)
        append[14](collective)
        self._preds.append(list(preds))
        return len(self._preds) - 1

    def compute(self, device: str, duration: float, *, preds: Sequence[int] = (), flops: float = 0.0,
                energy: float = float("nan"), out_bytes: float = 0.0, priority: int = 0, op: str | None = None,
                micro_batch: int = 0) -> int:
        """Add a compute task on ``device`` lasting ``duration`` s; returns its task id."""
        if duration < 0:
            raise ValueError(f"negative duration {duration} for {op}")
        d = self._node[device]
        return self._row(COMPUTE, d, float(duration), -1, -1, 0.0, -1, float(flops), float(energy),
                         d if out_bytes > 0 else -1, float(out_bytes), int(priority), self._op_index(op),
                         int(micro_batch), -1, preds)

    def transfer(self, src: str, dst: str, nbytes: float, *, preds: Sequence[int] = (), collective: int = -1,
                 priority: int = 0, op: str | None = None, micro_batch: int = 0, hold: bool = True) -> int:
        """Add a transfer of ``nbytes`` bytes from ``src`` to ``dst``; returns its task id.

        With ``hold`` the received bytes occupy ``dst``'s memory until the transfer's successors end."""
        if nbytes < 0:
            raise ValueError(f"negative transfer size {nbytes}")
        if src == dst:
            raise ValueError(f"transfer from {src} to itself")
        r = self.route_index(src, dst)
        d = self._node[dst]
        return self._row(TRANSFER, -1, 0.0, self._node[src], d, float(nbytes), r, 0.0, 0.0,
                         d if hold and nbytes > 0 else -1, float(nbytes) if hold else 0.0, int(priority),
                         self._op_index(op), int(micro_batch), collective, preds)

    def add_collective(self, info: Collective) -> int:
        self.collectives.append(info)
        return len(self.collectives) - 1

    def depend(self, before: int, after: int) -> None:
        """Add an edge: ``after`` starts only when ``before`` has ended."""
        self._preds[after].append(before)

    def build(self, meta: dict[str, Any] | None = None) -> TaskGraph:
        c = self._cols
        counts = np.fromiter((len(p) for p in self._preds), dtype=np.int64, count=len(self._preds))
        pred_ptr = np.zeros(len(self._preds) + 1, dtype=np.int64)
        np.cumsum(counts, out=pred_ptr[1:])
        flat = [t for p in self._preds for t in p]
        pred_idx = np.asarray(flat, dtype=np.int32)
        if len(flat) and (pred_idx.min() < 0 or pred_idx.max() >= len(self._preds)):
            raise ValueError("a dependency refers to a task that does not exist")
        tg = TaskGraph(
            kind=np.asarray(c["kind"], dtype=np.int8), device=np.asarray(c["device"], dtype=np.int32),
            duration=np.asarray(c["duration"], dtype=float), src=np.asarray(c["src"], dtype=np.int32),
            dst=np.asarray(c["dst"], dtype=np.int32), nbytes=np.asarray(c["nbytes"], dtype=float),
            route=np.asarray(c["route"], dtype=np.int32), flops=np.asarray(c["flops"], dtype=float),
            energy=np.asarray(c["energy"], dtype=float), mem_node=np.asarray(c["mem_node"], dtype=np.int32),
            mem_bytes=np.asarray(c["mem_bytes"], dtype=float), priority=np.asarray(c["priority"], dtype=np.int64),
            op=np.asarray(c["op"], dtype=np.int32), micro_batch=np.asarray(c["micro_batch"], dtype=np.int32),
            collective=np.asarray(c["collective"], dtype=np.int32), pred_ptr=pred_ptr, pred_idx=pred_idx,
            node_names=self.system.nodes, op_names=tuple(self.op_names), routes=tuple(self._routes),
            collectives=tuple(self.collectives), resident=dict(self.resident), setup=tuple(self.setup),
            meta=dict(meta or {}),
        )
        for name in ("kind", "device", "duration", "src", "dst", "nbytes", "route", "flops", "energy", "mem_node",
                     "mem_bytes", "priority", "op", "micro_batch", "collective", "pred_ptr", "pred_idx"):
            getattr(tg, name).setflags(write=False)
        return tg
