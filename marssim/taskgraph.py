"""The TaskGraph: the one interface between a mapping and its evaluation.

Columnar (numpy arrays, one entry per task) so that both evaluators read it without per-task
Python objects. A task is either

* a **compute** task: runs on ``device`` for ``duration`` seconds, doing ``flops`` FLOPs and
  spending ``energy`` joules (NaN where the design has no energy figures); or
* a **transfer**: moves ``nbytes`` bytes from node ``src`` to node ``dst`` along ``route``
  (an index into :attr:`TaskGraph.routes`); a collective is several transfers sharing a
  ``collective`` index.

A transfer with ``steps`` k > 1 (the optional column; absent: 1) is k back-to-back steps over
its route, each serialising ``nbytes / k`` bytes and then taking the route's latency: a ring
collective's steps when every rank of the ring is one folded class (see
:mod:`marssim.parallel.fold`), whose steps follow each other without waiting for anyone else. It
reads its predecessors' outputs in its first step: their buffers count it as ended then.

Every task may allocate an output buffer of ``mem_bytes`` bytes on node ``mem_node`` when it
starts; the buffer is freed when the last of the task's successors ends (or when the task itself
ends if it has none). Weights are resident from the start (``resident``). ``priority`` orders
ready tasks on one device: lower first. Units: seconds, bytes, FLOPs, joules.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, NamedTuple

import numpy as np

from marssim.system import Route, System

__all__ = ["COMPUTE", "TRANSFER", "Collective", "OpInfo", "TaskGraph", "TaskGraphBuilder", "ProgramTaskGraph",
           "from_program", "column_chunks", "unbuilt_program"]

COMPUTE = 0
TRANSFER = 1

_DTYPES = {"kind": np.int8, "device": np.int32, "duration": np.float64, "src": np.int32, "dst": np.int32,
           "nbytes": np.float64, "route": np.int32, "flops": np.float64, "energy": np.float64, "mem_node": np.int32,
           "mem_bytes": np.float64, "priority": np.int64, "op": np.int32, "micro_batch": np.int32,
           "collective": np.int32}
"""The dtype of each column of a :class:`TaskGraph`."""


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
    group: str = ""  # the parallel dimension it serves: tp, dp, pp, ep, emb (empty: a per-op mapping's)


class OpInfo(NamedTuple):
    """What the evaluations report about one op of the workload (the lowering fills it in).

    ``kind``: conv, gemm, matmul, ...; ``model``: the workload model it belongs to (several in a
    multi-model mix); ``loops``: its loop nest (``"N=8 K=64 ..."``); ``sharding``: the strategy
    that split it; ``set``: the index of the accelerator set that ran it; ``cost_model``: the cost
    model that timed its shards (``OpCost.model``: ``systolic-os``, ``gpu-roofline``,
    ``fitted``, ``measured``...; several joined by ``+`` when its shards were timed by
    different ones). A named tuple: a lowering makes one per op, cheaply."""

    name: str
    kind: str = ""
    model: str = ""
    loops: str = ""
    sharding: str = ""
    set: int = -1
    cost_model: str = ""


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
    meta: dict[str, Any] = field(default_factory=dict)  # descriptive labels (system, workload, mapping...)
    ops: tuple[OpInfo, ...] = ()  # the workload's compute ops in graph order
    device_design: dict[str, str] = field(default_factory=dict)  # the design each used device takes
    batch: int = 0  # samples of the whole run (throughput); 0: unknown
    steps: np.ndarray | None = None  # int32 per task, None: all 1; see below
    program: Any = None  # the unit templates and instances it was built from (a TaskProgram), or None

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


_COLUMN_FIELDS = ("kind", "device", "duration", "src", "dst", "nbytes", "route", "flops", "energy", "mem_node",
                  "mem_bytes", "priority", "op", "micro_batch", "collective")
_LAZY_FIELDS = frozenset(_COLUMN_FIELDS + ("pred_ptr", "pred_idx", "collectives", "steps", "ops"))


class ProgramTaskGraph(TaskGraph):
    """A TaskGraph kept as a :class:`~marssim.taskprogram.TaskProgram` (unit templates and
    their instances): each column, the predecessor lists and the collectives are built from the
    program when first read, and kept. Evaluators that walk the program itself (the compiled
    simulation) never build them. Make one with :func:`from_program`."""

    def __getattribute__(self, name: str):
        if name in _LAZY_FIELDS:
            d = object.__getattribute__(self, "__dict__")
            if name not in d:
                object.__getattribute__(self, "_build")(name)
        return object.__getattribute__(self, name)

    def _build(self, name: str) -> None:
        program = self.__dict__["program"]
        if name in ("pred_ptr", "pred_idx"):
            ptr, idx = program.edges()
            for key, value in (("pred_ptr", ptr), ("pred_idx", idx)):
                value.setflags(write=False)
                object.__setattr__(self, key, value)
        elif name == "collectives":
            object.__setattr__(self, name, program.collectives())
        elif name == "steps":
            col = program.column("steps")
            object.__setattr__(self, name, col if (col > 1).any() else None)
        elif name == "ops":  # given as the function that makes them (from_program)
            object.__setattr__(self, name, tuple(self.__dict__.pop("_ops")()))
        else:
            col = program.column(name)
            col.setflags(write=False)
            object.__setattr__(self, name, col)

    @property
    def n_tasks(self) -> int:
        return self.__dict__["program"].n_tasks


def column_chunks(taskgraph: TaskGraph, names: tuple[str, ...]):
    """The columns ``names`` of ``taskgraph`` in task order: whole, or for a
    :class:`ProgramTaskGraph` whose columns are not built, from its program in runs of whole
    instances (so an aggregation need not build them). Yields dicts of arrays."""
    program = unbuilt_program(taskgraph, names)
    if program is not None:
        yield from program.column_chunks(names)
    else:
        yield {name: getattr(taskgraph, name) for name in names}


def unbuilt_program(taskgraph: TaskGraph, names: tuple[str, ...]):
    """The :class:`~marssim.taskprogram.TaskProgram` of a :class:`ProgramTaskGraph` whose
    columns ``names`` are not all built (an aggregation then reads its rows and instances
    rather than building them), else None."""
    if isinstance(taskgraph, ProgramTaskGraph) and not all(n in taskgraph.__dict__ for n in names):
        return taskgraph.__dict__["program"]
    return None


def from_program(program, *, node_names: tuple[str, ...], op_names: tuple[str, ...], routes: tuple[Route, ...],
                 **labels: Any) -> TaskGraph:
    """The TaskGraph of ``program`` (a :class:`~marssim.taskprogram.TaskProgram`), its columns
    built when first read (:class:`ProgramTaskGraph`); ``labels``: the other fields (resident,
    setup, meta, ops, device_design, batch); ``ops`` may be the function that makes them, called
    when they are first read."""
    tg = object.__new__(ProgramTaskGraph)
    values = {"node_names": node_names, "op_names": op_names, "routes": routes, "resident": {}, "setup": (),
              "meta": {}, "ops": (), "device_design": {}, "batch": 0, "program": program}
    values.update(labels)
    if callable(values["ops"]):
        values["_ops"] = values.pop("ops")
    for key, value in values.items():
        object.__setattr__(tg, key, value)
    return tg


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
        # (start, copies, priority step, collectives per period, end, carried): see repeat_tail
        self._repeat: tuple[int, int, int, int, int, dict[int, Sequence[int]]] | None = None

    def __len__(self) -> int:
        if self._repeat is not None:
            start, copies, _, _, end, _ = self._repeat
            return end + copies * (end - start)
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

    def computes(self, devices: Sequence[int], durations: Sequence[float], flops: Sequence[float],
                 energies: Sequence[float], out_bytes: Sequence[float], preds: Sequence[Sequence[int]], *,
                 priority: int = 0, op: str | None = None, micro_batch: int = 0) -> int:
        """Add one compute task per entry, as :meth:`compute` would one by one; returns the id of
        the first (the others follow it). ``devices`` are node indices; durations in s, FLOPs,
        energies in J (NaN: unknown), output bytes (a buffer on the task's device when > 0)."""
        n = len(devices)
        if n and min(durations) < 0:
            raise ValueError(f"negative duration {min(durations)} for {op}")
        return self._extend(n, preds, kind=COMPUTE, device=devices, duration=durations, src=-1, dst=-1,
                            nbytes=0.0, route=-1, flops=flops, energy=energies,
                            mem_node=[d if b > 0 else -1 for d, b in zip(devices, out_bytes)], mem_bytes=out_bytes,
                            priority=int(priority), op=self._op_index(op), micro_batch=int(micro_batch),
                            collective=-1)

    def transfers(self, pairs: Sequence[tuple[str, str]], pair_of: Sequence[int], src: Sequence[int],
                  dst: Sequence[int], nbytes: Sequence[float], preds: Sequence[Sequence[int]], *,
                  collective: int = -1, op: str | None = None, micro_batch: int = 0) -> int:
        """Add one held transfer per entry, as :meth:`transfer` would one by one (priority 0);
        returns the id of the first (the others follow it). Transfer ``i`` moves ``nbytes[i]``
        bytes (> 0) from node index ``src[i]`` to ``dst[i]`` along the route of
        ``pairs[pair_of[i]]`` (node names); ``pairs`` are listed in the order the transfers first
        use them, so routes are numbered as one-by-one calls number them."""
        n = len(src)
        if n and min(nbytes) <= 0:
            raise ValueError(f"transfer size {min(nbytes)} in a block of transfers; expected > 0 bytes")
        if any(map(int.__eq__, src, dst)):
            raise ValueError("transfer from a node to itself")
        ids = [self.route_index(a, b) for a, b in pairs]
        return self._extend(n, preds, kind=TRANSFER, device=-1, duration=0.0, src=src, dst=dst, nbytes=nbytes,
                            route=[ids[k] for k in pair_of], flops=0.0, energy=0.0, mem_node=dst, mem_bytes=nbytes,
                            priority=0, op=self._op_index(op), micro_batch=int(micro_batch),
                            collective=collective)

    def _extend(self, n: int, preds: Sequence[Sequence[int]], **columns: Any) -> int:
        """Append ``n`` tasks: each column a sequence of ``n`` values or one number for all;
        returns the id of the first."""
        first = len(self._preds)
        for name, col in self._cols.items():
            values = columns[name]
            col.extend([values] * n if isinstance(values, (int, float)) else values)
        self._preds.extend(map(list, preds))
        return first

    def add_collective(self, info: Collective) -> int:
        self.collectives.append(info)
        return len(self.collectives) - 1

    def repeat_tail(self, start: int, copies: int, *, priority_step: int, collectives_from: int,
                    carried: dict[int, Sequence[int]] | None = None) -> None:
        """Append ``copies`` copies of the tasks from ``start`` on (the last *period*) and of the
        collectives from ``collectives_from`` on. In copy ``c`` (1, 2, ...) every task id and
        every predecessor id is ``c`` periods higher (a task of the period that waits for one of
        the period before waits for the same task of its own period in the copy), a compute
        task's ``priority`` is ``c * priority_step`` higher (a transfer's is kept),
        ``micro_batch`` ``c`` higher, and a task of one of the period's collectives belongs to
        that collective's copy. ``carried``: tasks of the period whose copies wait for other
        tasks than their own shifted predecessors: task ``t``'s first copy waits for
        ``carried[t]`` (task ids), its copy ``c`` for those ``c - 1`` periods higher. The rows are
        copied in :meth:`build`; no task may be added after this."""
        if self._repeat is not None:
            raise RuntimeError("repeat_tail was already called")
        n = len(self._preds)
        if not 0 <= start < n or copies < 0:
            raise ValueError(f"cannot repeat tasks {start}.. of {n} {copies} times")
        if carried and not all(start <= t < n for t in carried):
            raise ValueError(f"carried tasks must be among the repeated tasks {start}..{n - 1}")
        n_coll = len(self.collectives) - collectives_from
        self.collectives.extend(self.collectives[collectives_from:] * copies)
        self._repeat = (start, copies, int(priority_step), n_coll, n, dict(carried or {}))

    def depend(self, before: int, after: int) -> None:
        """Add an edge: ``after`` starts only when ``before`` has ended."""
        self._preds[after].append(before)

    def _arrays(self) -> dict[str, np.ndarray]:
        """The columns and ``counts``/``pred_idx`` (predecessors) of the tasks added so far."""
        cols = {name: np.asarray(values, dtype=_DTYPES[name]) for name, values in self._cols.items()}
        cols["counts"] = np.fromiter(map(len, self._preds), dtype=np.int64, count=len(self._preds))
        cols["pred_idx"] = np.fromiter(itertools.chain.from_iterable(self._preds), dtype=np.int32)
        return cols

    def _repeated(self, cols: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """``cols`` with the copies :meth:`repeat_tail` asked for appended."""
        start, copies, priority_step, n_coll, end, carried = self._repeat
        if len(self._preds) != end:
            raise RuntimeError("tasks were added after repeat_tail")
        period = end - start
        copy = np.repeat(np.arange(1, copies + 1, dtype=np.int64), period)
        counts, preds = self._first_copy_preds(cols["counts"], cols["pred_idx"], start, period, carried)
        out = {"counts": np.concatenate([cols["counts"], np.tile(counts, copies)]),
               "pred_idx": np.concatenate([cols["pred_idx"], (np.tile(preds, copies) + np.repeat(
                   np.arange(copies, dtype=np.int64) * period, len(preds))).astype(np.int32)])}
        for name, col in cols.items():
            if name in out:
                continue
            tiled = np.tile(col[start:], copies)
            if name == "priority":
                tiled = tiled + copy * priority_step * (np.tile(cols["kind"][start:], copies) == COMPUTE)
            elif name == "micro_batch":
                tiled = tiled + copy
            elif name == "collective":
                tiled = np.where(tiled >= 0, tiled + copy * n_coll, tiled)
            out[name] = np.concatenate([col, tiled.astype(col.dtype)])
        return out

    @staticmethod
    def _first_copy_preds(counts: np.ndarray, pred_idx: np.ndarray, start: int, period: int,
                          carried: dict[int, Sequence[int]]) -> tuple[np.ndarray, np.ndarray]:
        """Predecessor counts and ids of the first copy of tasks ``start..start+period-1``: their
        own predecessors one period later, or ``carried[t]`` for a task ``t`` in ``carried``."""
        ptr = np.zeros(len(counts) + 1, dtype=np.int64)
        np.cumsum(counts, out=ptr[1:])
        block_counts = counts[start:].copy()
        pieces = []
        at = int(ptr[start])
        for t in sorted(carried):
            pieces.append(pred_idx[at:ptr[t]].astype(np.int64) + period)
            pieces.append(np.asarray(carried[t], dtype=np.int64))
            block_counts[t - start] = len(carried[t])
            at = int(ptr[t + 1])
        pieces.append(pred_idx[at:].astype(np.int64) + period)
        return block_counts, np.concatenate(pieces)

    def build(self, meta: dict[str, Any] | None = None, *, ops: Sequence[OpInfo] = (),
              device_design: dict[str, str] | None = None, batch: int = 0) -> TaskGraph:
        """Freeze the tasks into a :class:`TaskGraph` with its labels (``meta``), its ops in graph
        order, the design of each device and the batch (samples)."""
        c = self._arrays()
        if self._repeat is not None:
            c = self._repeated(c)
        n = len(c["counts"])
        pred_ptr = np.zeros(n + 1, dtype=np.int64)
        np.cumsum(c["counts"], out=pred_ptr[1:])
        pred_idx = c["pred_idx"]
        if len(pred_idx) and (pred_idx.min() < 0 or pred_idx.max() >= n):
            raise ValueError("a dependency refers to a task that does not exist")
        tg = TaskGraph(
            kind=c["kind"], device=c["device"], duration=c["duration"], src=c["src"], dst=c["dst"],
            nbytes=c["nbytes"], route=c["route"], flops=c["flops"], energy=c["energy"], mem_node=c["mem_node"],
            mem_bytes=c["mem_bytes"], priority=c["priority"], op=c["op"], micro_batch=c["micro_batch"],
            collective=c["collective"], pred_ptr=pred_ptr, pred_idx=pred_idx,
            node_names=self.system.nodes, op_names=tuple(self.op_names), routes=tuple(self._routes),
            collectives=tuple(self.collectives), resident=dict(self.resident), setup=tuple(self.setup),
            meta=dict(meta or {}), ops=tuple(ops), device_design=dict(device_design or {}), batch=int(batch),
        )
        for name in ("kind", "device", "duration", "src", "dst", "nbytes", "route", "flops", "energy", "mem_node",
                     "mem_bytes", "priority", "op", "micro_batch", "collective", "pred_ptr", "pred_idx"):
            getattr(tg, name).setflags(write=False)
        return tg
