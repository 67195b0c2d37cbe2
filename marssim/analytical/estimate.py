"""The analytical estimate: a TaskGraph evaluated without link contention.

Every transfer takes its route's latency plus its bytes over the route's *bottleneck* capacity
(the smallest capacity among the resources it crosses: link channels, switch backplanes and the
memories at both ends), exactly what the simulator gives a flow that shares nothing. Compute
tasks take their cost-model duration. Devices run their ready tasks one at a time, lowest
priority first, as the simulator's devices do; so pipelines are timed by their stage times
(micro-batch after micro-batch through each stage) and a collective by its point-to-point steps,
which on a uniform ring is the closed form ``2(N-1)(alpha + S/(N*B))``.

What the estimate leaves out is contention between flows: a flow never shares bandwidth, with
one exception that belongs to a collective's own algorithm: a *direct* collective (an all-to-all,
a direct all-gather or reduce-scatter) issues every rank's flows to all its peers at once, so a
flow shares each resource it crosses with the collective's other flows there and moves at the
rate of the most loaded one (:func:`direct_rates`): a direct all-to-all of ``S`` bytes per rank
over ``n`` ranks of one switch takes ``(n - 1) S / (n B)``, its closed form, as in the
simulation; across nodes, the flows of every rank of a node that leave through one network
adapter share it. Where no two flows share a resource at once otherwise, the estimate equals the
simulation (to rounding). Where they do, the simulation's transfers are slower and the estimate is
usually below it; it is not a strict bound (a faster transfer can change the order in which a
device takes its tasks, and list scheduling is not monotone), but :attr:`Estimate.lower_bound` is
one: the largest of the critical path without device serialisation (every flow timed alone, a
direct collective's too), the busiest device's total work and the busiest resource's bytes over
its capacity. Units: seconds, bytes, bytes/s, FLOPs, joules.
"""

from __future__ import annotations

import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import numpy as np

from marssim.progress import EstimateProgress
from marssim.results.aggregate import node_busy
from marssim.results.aggregate import resource_bytes as _aggregate_bytes
from marssim.results.build import build_result, device_table
from marssim.results.result import Result
from marssim.results.schedule import critical_path
from marssim.results.summary import steady_throughput, total_energy
from marssim.results.timelines import buffer_timeline, flow_timeline
from marssim.system import System
from marssim.taskgraph import COMPUTE, TaskGraph

from .schedule import BACKENDS, earliest_schedule, list_schedule

__all__ = ["Estimate", "estimate", "transfer_durations", "resource_bytes", "critical_path", "direct_rates"]


_ROUTE_CACHE: "weakref.WeakKeyDictionary[System, dict]" = weakref.WeakKeyDictionary()
_PAIR_CACHE: "weakref.WeakKeyDictionary[System, dict]" = weakref.WeakKeyDictionary()


def _route_arrays(taskgraph: TaskGraph, system: System):
    """Per route of ``taskgraph``: bottleneck capacity (bytes/s, inf when it holds nothing) and
    latency (s), each with one trailing entry for "no route"; and the (resource, route) incidence
    as two flat index arrays. Route facts are memoised per System."""
    cache = _ROUTE_CACHE.get(system)
    if cache is None:
        cache = _ROUTE_CACHE[system] = {}
    cap = system.resource_capacity
    n = len(taskgraph.routes)
    bottleneck = np.full(n + 1, np.inf)
    latency = np.zeros(n + 1)
    res_idx: list[int] = []
    res_route: list[int] = []
    res_weight: list[float] = []
    for r, route in enumerate(taskgraph.routes):
        hit = cache.get(route)
        if hit is None:
            res = tuple(route.resources)
            w = tuple(route.weights) if route.weights else (1.0,) * len(res)
            # a folded flow shares each resource with the flows it stands for there
            hit = cache[route] = (float((cap[list(res)] / np.asarray(w)).min()) if res else np.inf,
                                  float(route.latency), res, w)
        bottleneck[r], latency[r], res, w = hit
        res_idx.extend(res)
        res_route.extend([r] * len(res))
        res_weight.extend(w)
    return (bottleneck, latency, np.asarray(res_idx, dtype=np.int64), np.asarray(res_route, dtype=np.int64),
            np.asarray(res_weight, dtype=np.float64))


def transfer_durations(taskgraph: TaskGraph, system: System) -> np.ndarray:
    """Contention-free duration (s) of every task: the compute duration, or for a transfer its
    route latency plus ``nbytes`` over the route's bottleneck capacity (latency alone for an
    empty transfer or a route that holds no resource, as in the simulator), or for a flow of a
    direct collective its bytes at the rate :func:`direct_rates` gives it."""
    bottleneck, latency, _, _, _ = _route_arrays(taskgraph, system)
    return _shared(taskgraph, _durations(taskgraph, bottleneck, latency), latency, system)


_FANNED = ("all_to_all", "all_gather", "reduce_scatter", "all_reduce")
"""The collectives whose direct algorithm sends every rank's pieces to all its peers at once (a
point-to-point transfer, ``p2p``, is one flow, and several of one op follow each other)."""

_PAIRS_LIMIT = 256
"""Ranks up to which a direct collective's pairs are routed one by one (:func:`_pair_load`);
beyond, each flow takes ``n - 1`` times its own serial time."""


def _pair_load(system: System, devices: tuple[str, ...]) -> np.ndarray | None:
    """Per resource of ``system``, how many of the ``n (n - 1)`` flows of a direct collective
    over ``devices`` (every rank to every other) cross it; None beyond :data:`_PAIRS_LIMIT`
    ranks. Memoised per System."""
    cache = _PAIR_CACHE.get(system)
    if cache is None:
        cache = _PAIR_CACHE[system] = {}
    hit = cache.get(devices, False)
    if hit is not False:
        return hit
    load = None
    if len(devices) <= _PAIRS_LIMIT:
        load = np.zeros(len(system.resource_capacity))
        for a in devices:
            for b in devices:
                if a != b:
                    res = system.route(a, b).resources
                    if res:
                        np.add.at(load, list(res), 1.0)
    cache[devices] = load
    return load


def direct_rates(collective: np.ndarray, route: np.ndarray, routes, collectives, system: System) -> np.ndarray:
    """Seconds per byte of each transfer of a *direct* collective (an all-to-all, all-gather,
    reduce-scatter or all-reduce whose algorithm is ``direct``: :data:`_FANNED`), NaN for every
    other transfer. Such a collective issues every rank's flows to all its peers at once, so a
    flow shares each resource it crosses with the collective's other flows there: it moves at
    the rate of its most loaded resource, the flows crossing it over its capacity (per step: a
    direct all-reduce's reduce-scatter and all-gather do not overlap). ``collective``: each
    transfer's index into ``collectives`` (-1: none); ``route``: its index into ``routes``."""
    rate = np.full(len(collective), np.nan)
    fanned = np.array([c.algorithm == "direct" and c.kind in _FANNED for c in collectives] + [False])
    hit = fanned[collective] & (collective >= 0)
    if not hit.any():
        return rate
    cap = system.resource_capacity
    groups: dict[tuple[str, ...], int] = {}  # each distinct set of ranks, numbered
    dev_id = np.full(len(collectives) + 1, -1, dtype=np.int64)
    for i in np.unique(collective[hit]).tolist():
        dev_id[i] = groups.setdefault(collectives[i].devices, len(groups))
    devices_of = {k: devices for devices, k in groups.items()}
    pairs, inverse = np.unique(np.stack([dev_id[collective[hit]], route[hit].astype(np.int64)], axis=1), axis=0,
                               return_inverse=True)
    values = np.empty(len(pairs))
    for k, (d, r) in enumerate(pairs.tolist()):
        devices = devices_of[d]
        res = list(routes[r].resources)
        load = _pair_load(system, devices)
        if not res:
            values[k] = 0.0
        elif load is None:
            values[k] = (len(devices) - 1) / float(cap[res].min())
        else:
            values[k] = float((np.maximum(load[res], 1.0) / cap[res]).max())
    rate[hit] = values[inverse.reshape(-1)]
    return rate


def _durations(tg: TaskGraph, bottleneck: np.ndarray, latency: np.ndarray) -> np.ndarray:
    """Every task's duration with every flow timed alone (s)."""
    duration = tg.duration.astype(np.float64, copy=True)
    is_transfer = tg.kind != COMPUTE
    if is_transfer.any():
        route = tg.route[is_transfer]
        nbytes = tg.nbytes[is_transfer]
        with np.errstate(divide="ignore", invalid="ignore"):
            serial = np.where(nbytes > 0, nbytes / bottleneck[route], 0.0)
        steps = tg.steps[is_transfer] if tg.steps is not None else 1
        duration[is_transfer] = serial + latency[route] * steps
    return duration


def _shared(tg: TaskGraph, alone: np.ndarray, latency: np.ndarray, system: System) -> np.ndarray:
    """``alone`` (:func:`_durations`) with each direct collective's flows at the rate
    :func:`direct_rates` gives them; ``alone`` itself where the TaskGraph has none."""
    if not tg.collectives:
        return alone
    moving = np.flatnonzero(tg.kind != COMPUTE)
    rate = direct_rates(tg.collective[moving], tg.route[moving], tg.routes, tg.collectives, system)
    hit = ~np.isnan(rate)
    if not hit.any():
        return alone
    t = moving[hit]
    steps = tg.steps[t] if tg.steps is not None else 1
    out = alone.copy()
    out[t] = tg.nbytes[t] * rate[hit] + latency[tg.route[t]] * steps
    return out


def _first_step_end(tg: TaskGraph, start: np.ndarray, end: np.ndarray, bottleneck: np.ndarray,
                    latency: np.ndarray) -> np.ndarray:
    """When each task has read its inputs (s): its end, or for a transfer of several steps the
    end of its first step (``nbytes / steps`` at the bottleneck rate, then the route latency)."""
    if tg.steps is None:
        return end
    stepped = np.flatnonzero(tg.steps > 1)
    if not len(stepped):
        return end
    out = end.copy()
    route = tg.route[stepped]
    nbytes = tg.nbytes[stepped] / tg.steps[stepped]
    with np.errstate(divide="ignore", invalid="ignore"):
        serial = np.where(nbytes > 0, nbytes / bottleneck[route], 0.0)
    out[stepped] = start[stepped] + serial + latency[route]
    return out


@dataclass(frozen=True, eq=False)
class Estimate:
    """The analytical evaluation of one TaskGraph on one System.

    ``makespan``: seconds until the last task ends. ``start``, ``ready``, ``end``: seconds, one per
    task (``ready`` is when a task's predecessors have all ended; compute tasks may wait for their
    device after that; where none ever waits, ``ready`` is the ``start`` array itself). ``duration``: contention-free seconds per task. ``busy``: seconds of compute
    per node index (zero for nodes that run nothing). ``lower_bound``: seconds no schedule of the
    TaskGraph on the System can beat, contention or not (see :attr:`bounds`)."""

    makespan: float
    start: np.ndarray
    ready: np.ndarray
    end: np.ndarray
    duration: np.ndarray
    busy: np.ndarray
    lower_bound: float
    bounds: dict[str, float]
    taskgraph: TaskGraph = field(repr=False)
    system: System = field(repr=False)
    meta: dict[str, Any] = field(default_factory=dict)

    # ------------------------------------------------------------------ per-resource views
    @cached_property
    def devices(self):
        """One row per accelerator (like ``Result.devices``): ``design``, ``busy_s``,
        ``utilisation``, ``energy_j`` (NaN unknown), ``flops``, ``tasks``, and ``wait_s``: seconds
        its tasks spent ready but waiting for it."""
        tg = self.taskgraph
        is_compute = tg.kind == COMPUTE
        wait = np.bincount(tg.device[is_compute], weights=(self.start - self.ready)[is_compute],
                           minlength=len(tg.node_names))
        table = device_table(tg, self.system, self.start, self.end, self.makespan)
        table["wait_s"] = [float(wait[self.system.node_index[acc]]) for acc in table.index]
        return table

    @cached_property
    def links(self):
        """One row per bandwidth resource (like ``Result.links``): ``kind``, ``capacity``,
        ``bytes`` carried, ``load_s`` (bytes over capacity: the least time the resource must be
        busy) and ``utilisation`` (``load_s`` over the makespan)."""
        import pandas as pd

        res_bytes = resource_bytes(self.taskgraph, self.system)
        cap = self.system.resource_capacity
        load = res_bytes / cap
        return pd.DataFrame({
            "kind": list(self.system.resource_kinds), "capacity": cap, "bytes": res_bytes, "load_s": load,
            "utilisation": load / self.makespan if self.makespan > 0 else np.zeros(len(cap)),
        }, index=pd.Index(self.system.resource_names, name="resource"))

    @property
    def bounded(self) -> float:
        """``max(makespan, lower_bound)`` in seconds: the contention-free makespan raised to what
        the busiest resource, device or dependency chain needs at least. Equal to the simulation
        wherever the contention-free makespan is (the bound never exceeds the simulation), and never
        further from it when the contention-free makespan is below it; it ranks contended mappings
        far better (see docs/validation.md)."""
        return max(self.makespan, self.lower_bound)

    @property
    def energy(self) -> float:
        """Joules of the run, as ``Result.energy``: compute and communication energy, each where
        known (NaN when neither is)."""
        return total_energy(self.taskgraph, self.system)

    @cached_property
    def throughput(self) -> float:
        """Samples per second, defined as in ``Result.throughput``: steady state between the first
        and last micro-batch when pipelined, else the batch over the makespan."""
        return steady_throughput(self.taskgraph, self.end, self.makespan, self.system)

    def critical_path(self) -> np.ndarray:
        """Task ids of one critical path of the estimated schedule, first to last (see
        :func:`critical_path`)."""
        return critical_path(self.taskgraph, self.start, self.end)

    def result(self, *, level: str = "block") -> Result:
        """The estimated schedule as a :class:`~marssim.results.Result`, the same tables a
        simulation gives (interval log, devices, links, memories, the per-op and per-layer
        report; ``level``: its layer groups), for reports and traces. Memory occupancy and link
        usage are those of the contention-free schedule (:mod:`marssim.results.timelines`); no
        buffer is ever spilled."""
        tg, system = self.taskgraph, self.system
        bottleneck, latency, _, _, _ = _route_arrays(tg, system)
        memories, memory_timeline = buffer_timeline(tg, system, self.start, self.end,
                                                    _first_step_end(tg, self.start, self.end, bottleneck, latency))
        link_timeline, busy = flow_timeline(tg, system, self.start, self.end, bottleneck, latency)
        meta = {"evaluator": "analytical", "tasks": tg.n_tasks, "lower_bound_s": self.lower_bound,
                "bound": max(self.bounds, key=self.bounds.get) if self.bounds else ""}
        return build_result(tg, system, self.start, self.end, memories=memories, memory_timeline=memory_timeline,
                            link_timeline=link_timeline, link_busy=busy, meta=meta, level=level)

    def summary(self) -> str:
        """A few readable lines: makespan, bounds, busiest devices."""
        lines = [f"estimated makespan  {self.makespan * 1e3:.4f} ms (no link contention)",
                 f"lower bound         {self.lower_bound * 1e3:.4f} ms "
                 f"({max(self.bounds, key=self.bounds.get)})"]
        dev = self.devices.sort_values("utilisation", ascending=False).head(3)
        if len(dev):
            lines.append("busiest devices: " + ", ".join(f"{d} ({u:.0%})" for d, u in dev["utilisation"].items()))
        return "\n".join(lines)


def estimate(taskgraph: TaskGraph, system: System, *, backend: str = "auto",
             progress: Callable[[EstimateProgress], None] | None = None) -> Estimate:
    """Evaluate ``taskgraph`` on ``system`` without link contention (see the module docstring).

    ``backend``: ``auto`` (compiled kernels when numba is installed), ``python`` or ``numba``;
    all give identical results. ``progress``: called after each of the estimate's passes (durations,
    the list schedule, the critical path, the bounds) with an :class:`~marssim.progress.EstimateProgress`.
    Raises ValueError when the TaskGraph has a cycle."""
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {', '.join(BACKENDS)}, got {backend!r}")

    def report(stage: str, done: int) -> None:
        if progress is not None:
            progress(EstimateProgress(stage, done, taskgraph.n_tasks))

    wall = time.perf_counter()
    tg = taskgraph
    n = tg.n_tasks
    n_nodes = len(tg.node_names)
    bottleneck, latency, res_idx, res_route, res_weight = _route_arrays(tg, system)
    program = getattr(tg, "program", None)
    coupled = program is not None and program.coupled is not None
    if program is not None and n and backend != "python" and ("kind" not in tg.__dict__ or coupled):
        from .schedule import _compiled

        if _compiled() is not None:
            return _estimate_program(tg, system, program, bottleneck, latency, (res_idx, res_route, res_weight),
                                     report, wall)
    if coupled:
        raise ValueError("this TaskGraph couples ring steps (lowered with coupled_rings=True): only the compiled "
                         "estimate (numba) times them; lower it with coupled_rings=False")
    # the critical-path bound takes every flow alone: a direct collective's flows share their
    # resources only while they run at once, which the simulation need not make them do
    alone = _durations(tg, bottleneck, latency)
    duration = _shared(tg, alone, latency, system)
    is_compute = tg.kind == COMPUTE
    if n == 0:
        empty = np.zeros(0)
        return Estimate(0.0, empty, empty, empty, duration, np.zeros(n_nodes), 0.0,
                        {"critical_path": 0.0, "device_work": 0.0, "resource_load": 0.0}, tg, system,
                        {"wall_s": time.perf_counter() - wall, "tasks": 0})
    # dense device ids for the compute tasks
    dev_nodes = tg.device[is_compute]
    used = np.unique(dev_nodes)
    dense = np.full(n_nodes, -1, dtype=np.int64)
    dense[used] = np.arange(len(used))
    device = np.where(is_compute, dense[np.where(is_compute, tg.device, 0)], -1)
    succ_ptr, succ_idx = tg.successors
    n_pred = np.diff(tg.pred_ptr)
    report("durations", 0)
    start, ready, end = list_schedule(duration, device, tg.priority, succ_ptr, succ_idx, n_pred, len(used),
                                      backend=backend)
    report("schedule", n)
    makespan = float(end.max())
    busy = np.bincount(dev_nodes, weights=duration[is_compute], minlength=n_nodes)
    _, cp_end = earliest_schedule(alone, succ_ptr, succ_idx, n_pred, backend=backend)
    report("critical_path", n)
    res_load = _aggregate_bytes(tg, system, incidence=(res_idx, res_route, res_weight)) / system.resource_capacity
    bounds = {"critical_path": float(cp_end.max()), "device_work": float(busy.max(initial=0.0)),
              "resource_load": float(res_load.max(initial=0.0))}
    report("bounds", n)
    return Estimate(makespan=makespan, start=start, ready=ready, end=end, duration=duration, busy=busy,
                    lower_bound=max(bounds.values()), bounds=bounds, taskgraph=tg, system=system,
                    meta={"wall_s": time.perf_counter() - wall, "tasks": n})


def _kernels_in_chains(program, is_compute: np.ndarray) -> bool:
    """Whether every GPU's kernels in ``program`` are totally ordered by their dependencies: in
    each template they follow each other on one GPU (:func:`._program_kernels.compute_chains`),
    and the instances with kernels on a GPU form one chain (each instance's first kernel after
    the last kernel of its ``chain_prev``), as a parallel lowering makes them."""
    from . import _program_kernels as K

    rows = program.rows
    if not K.compute_chains(is_compute, rows["device"], program.tpl_start, program.ipred_ptr, program.ipred,
                            program.first_compute, program.last_compute):
        return False
    first = program.first_compute[program.inst_tpl].astype(np.int64)
    has = first >= 0
    device = np.where(has, rows["device"][program.tpl_start[program.inst_tpl] + np.maximum(first, 0)], -1)
    prev = program.chain_prev.astype(np.int64)
    linked = prev >= 0
    if (linked & ~has).any():
        return False
    after = prev[linked]
    if not has[after].all() or (device[after] != device[linked]).any():
        return False
    heads = device[has & ~linked]
    return bool(np.bincount(heads).max(initial=0) <= 1 and np.bincount(after).max(initial=0) <= 1)


def _coupling(program, rows: dict, bottleneck: np.ndarray, latency: np.ndarray) -> Callable[[], tuple]:
    """The program's coupled ring transfers as the schedules read them: per row whether it is one;
    per coupled task (ascending) its component, per component its members, each one's feeder
    among them, its seconds per step (as a one-step transfer of its bytes per step takes) and
    its steps; returns a function giving them with a fresh count of members not yet ready."""
    n_rows = len(rows["kind"])
    coupled = program.coupled
    if coupled is None or not len(coupled):
        row_coupled = np.zeros(n_rows, dtype=np.bool_)
        empty_i, empty_f = np.zeros(0, dtype=np.int64), np.zeros(0)
        fixed = (row_coupled, empty_i, empty_i, np.zeros(1, dtype=np.int64), empty_i, empty_i, empty_f, empty_i)
        return lambda: fixed + (np.zeros(0, dtype=np.int64),)
    task = coupled.task
    inst = program.inst_of[task]
    row = program.tpl_start[program.inst_tpl[inst]] + task - program.inst_base[inst]
    row_coupled = np.zeros(n_rows, dtype=np.bool_)
    row_coupled[row] = True
    comp, ptr, members = coupled.components
    position = np.empty(len(task), dtype=np.int64)
    position[members] = np.arange(len(task)) - np.repeat(ptr[:-1], np.diff(ptr))
    prev_local = position[coupled.prev_index]
    route = rows["route"][row]
    with np.errstate(divide="ignore", invalid="ignore"):
        serial = np.where(coupled.chunk > 0, coupled.chunk / bottleneck[route], 0.0)
    step = serial + latency[route]  # a one-step transfer's latency times 1, exactly
    steps = rows["steps"][row].astype(np.int64)
    if (steps[members] != np.repeat(steps[members[ptr[:-1]]], np.diff(ptr))).any():
        raise ValueError("the coupled transfers of one ring have different step counts")
    fixed = (row_coupled, task, comp, ptr, members, prev_local, step, steps)
    sizes = np.diff(ptr)
    return lambda: fixed + (sizes.copy(),)


def _template_rates(tg: TaskGraph, program, rows, moving: np.ndarray, system: System) -> np.ndarray:
    """:func:`direct_rates` of the transfer rows of ``program``'s templates (each template's
    collectives numbered from its own first)."""
    tpl_of_row = np.repeat(np.arange(len(program.sizes), dtype=np.int64), program.sizes)[moving]
    local = rows["collective"][moving].astype(np.int64)
    colls = [c for cs in program.tpl_colls for c in cs]
    offset = np.concatenate([[0], np.cumsum([len(cs) for cs in program.tpl_colls])]).astype(np.int64)
    glob = np.where(local >= 0, offset[tpl_of_row] + local, -1)
    return direct_rates(glob, rows["route"][moving].astype(np.int64), tg.routes, colls, system)


def _estimate_program(tg: TaskGraph, system: System, program, bottleneck: np.ndarray, latency: np.ndarray,
                      incidence: tuple, report, wall: float, chained: bool = True) -> Estimate:
    """:func:`estimate` of a lowering's TaskGraph from its :class:`~marssim.taskprogram.TaskProgram`
    (its columns are not built): the same schedules over template rows (see
    :mod:`._program_kernels`), the same arrays. Where every GPU's kernels form one chain of
    dependencies (``chained`` and :func:`_kernels_in_chains`), one pass gives both schedules."""
    from . import _program_kernels as K

    n = tg.n_tasks
    n_nodes = len(tg.node_names)
    rows = program.rows
    is_compute = rows["kind"] == COMPUTE
    # each row's contention-free duration, as _durations gives it per task
    d_row = rows["duration"].astype(np.float64, copy=True)
    d_free = d_row  # every flow alone, as the critical-path bound takes them (see estimate)
    moving = ~is_compute
    if moving.any():
        route = rows["route"][moving]
        nbytes = rows["nbytes"][moving]
        with np.errstate(divide="ignore", invalid="ignore"):
            serial = np.where(nbytes > 0, nbytes / bottleneck[route], 0.0)
        d_row[moving] = serial + latency[route] * rows["steps"][moving]
        rate = _template_rates(tg, program, rows, moving, system)
        if not np.isnan(rate).all():
            d_free = d_row.copy()
            shared = nbytes * rate + latency[route] * rows["steps"][moving]
            d_row[moving] = np.where(np.isnan(rate), d_row[moving], shared)
    per_row = np.repeat(np.bincount(program.inst_tpl, minlength=len(program.sizes)), program.sizes)
    used = np.unique(rows["device"][is_compute & (per_row > 0)])
    dense = np.full(n_nodes, -1, dtype=np.int64)
    dense[used] = np.arange(len(used))
    dev_row = np.where(is_compute, dense[np.where(is_compute, rows["device"], 0)], -1)
    per_dev = np.bincount(dev_row[is_compute], weights=per_row[is_compute], minlength=len(used)).astype(np.int64)
    n_pred = program.pred_counts()
    su = program.successors()
    walk = (program.inst_of, program.inst_tpl, program.inst_base, program.tpl_start, program.first_compute,
            program.last_compute, su.isucc_ptr, su.isucc, su.inc_ptr, su.inc_inst, su.inc_group, program.grp_lastkernel,
            su.rev_base, su.grp_rel_ptr, su.rev_ptr, su.rev_rel, su.grp_rel, su.chain_next)
    max_succ = program.max_successors()
    coupling = _coupling(program, rows, bottleneck, latency)
    report("durations", 0)
    if chained and _kernels_in_chains(program, is_compute):
        # no kernel ever waits for its GPU: the list schedule is the earliest schedule, each task
        # ready when it starts, and its makespan the critical path (the same floats)
        start, end, done = K.chained_schedule(d_row, n_pred, max_succ, *coupling(), *walk)
        if done != n:
            raise ValueError(f"the task graph has a cycle ({n - done} tasks never become ready)")
        del n_pred
        ready = start
        makespan = critical = float(end.max())
        if d_free is not d_row:
            cp_end, _ = K.earliest_schedule(d_free, program.pred_counts(), max_succ, *coupling(), *walk)
            critical = float(cp_end.max())
            del cp_end
    else:
        # the earliest schedule first: its arrays are gone before the list schedule's are made
        cp_end, done = K.earliest_schedule(d_free, n_pred, max_succ, *coupling(), *walk)
        if done != n:
            raise ValueError(f"the task graph has a cycle ({n - done} tasks never become ready)")
        critical = float(cp_end.max())
        del cp_end
        if d_free is not d_row:
            n_pred = program.pred_counts()
        start, ready, end, done = K.list_schedule(d_row, dev_row, n_pred, len(used), per_dev, max_succ, *coupling(),
                                                  *walk)
        del n_pred
        makespan = float(end.max())
    report("schedule", n)
    report("critical_path", n)
    duration = program.take_rows(d_row)
    busy = node_busy(tg)  # compute seconds per node, task after task
    res_load = _aggregate_bytes(tg, system, incidence=incidence) / system.resource_capacity
    bounds = {"critical_path": critical, "device_work": float(busy.max(initial=0.0)),
              "resource_load": float(res_load.max(initial=0.0))}
    report("bounds", n)
    return Estimate(makespan=makespan, start=start, ready=ready, end=end, duration=duration, busy=busy,
                    lower_bound=max(bounds.values()), bounds=bounds, taskgraph=tg, system=system,
                    meta={"wall_s": time.perf_counter() - wall, "tasks": n})


def resource_bytes(taskgraph: TaskGraph, system: System) -> np.ndarray:
    """Bytes every bandwidth resource of ``system`` carries over the whole TaskGraph
    (:func:`marssim.results.aggregate.resource_bytes`, with this module's memoised route facts)."""
    _, _, res_idx, res_route, res_weight = _route_arrays(taskgraph, system)
    return _aggregate_bytes(taskgraph, system, incidence=(res_idx, res_route, res_weight))
