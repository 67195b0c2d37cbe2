"""The compiled engine: the simulation of :mod:`marssim.sim.engine`, event for event, as a
numba-compiled loop over numpy arrays (:mod:`._fast_kernels`).

Same inputs, same floats: every start and end time, memory peak, link timeline row and busy
second equals the SimPy engine's (tested on generated task graphs, contention, folded
parallel lowerings, stepped transfers and several streams per device). It needs numba (the
``fast`` extra) and covers the ``error`` and ``ignore`` memory policies; ``spill`` runs on SimPy.
What it keeps per task is arrays (about 150 bytes a task, against a few hundred in Python
lists and objects), and it runs a budget of events per call, so a caller may report progress.
Units: seconds, bytes, bytes/s.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable

import numpy as np

from marssim.errors import CapacityError
from marssim.lazymodule import lazy_module
from marssim.progress import SimulationProgress
from marssim.results.build import build_result
from marssim.results.summary import summarise
from marssim.system import System
from marssim.taskgraph import COMPUTE, TaskGraph

from .schedule import Schedule

pd = lazy_module("pandas")  # imported when a table is first built

__all__ = ["available", "usable", "run_compiled", "Progress"]

Progress = Callable[[SimulationProgress], None]
"""A progress callback: called with a :class:`~marssim.progress.SimulationProgress` (simulated
seconds, tasks ended, all tasks) at most every ``PROGRESS_EVERY`` seconds of wall time."""

PROGRESS_EVERY = 0.5  # s of wall time between progress calls
_BUDGET = 1 << 16  # events per call of the compiled loop
_MEMO_SLOTS = 1 << 17  # components whose rates are remembered (a power of two)
_MEMO_ROUTES = 1 << 20  # routes over all of them

_KERNELS: object | None = None


def _kernels():
    global _KERNELS
    if _KERNELS is None:
        if os.environ.get("MARSSIM_NO_NUMBA", "") not in ("", "0"):
            _KERNELS = False
        else:
            try:
                from . import _fast_kernels
            except ImportError:
                _KERNELS = False
            else:
                _KERNELS = _fast_kernels
    return _KERNELS or None


def kernels_cached() -> bool:
    """Whether numba's cache holds the compiled engine (so that it loads in about a second
    instead of compiling for about 15 s); True when that cannot be told."""
    k = _kernels()
    try:
        return os.path.exists(k.run._cache._cache_file._index_path)
    except AttributeError:  # numba's cache laid out otherwise, or no cache: assume it is at hand
        return True


def available() -> bool:
    """True when the compiled engine can run (numba importable, ``MARSSIM_NO_NUMBA`` unset)."""
    return _kernels() is not None


def usable(taskgraph: TaskGraph, memory_policy: str) -> bool:
    """Whether the compiled engine can simulate ``taskgraph`` under ``memory_policy`` (numba
    installed, not the ``spill`` policy, routes that cross each resource once, buffers on a node)."""
    if memory_policy == "spill" or not available():
        return False
    for route in taskgraph.routes:
        if len(set(route.resources)) != len(route.resources):
            return False
    program = getattr(taskgraph, "program", None)
    mem_bytes, mem_node = ((program.rows["mem_bytes"], program.rows["mem_node"]) if program is not None else
                           (taskgraph.mem_bytes, taskgraph.mem_node))
    return not bool(((mem_bytes > 0) & (mem_node < 0)).any())


def _layout(tg: TaskGraph) -> dict:
    """The rows, templates, groups and instances the loop walks, and each task's starting
    counts: a lowering's :class:`~marssim.taskprogram.TaskProgram` as it is (without building the
    TaskGraph's columns), or a plain TaskGraph as one template of all its tasks."""
    program = getattr(tg, "program", None)
    i32, i64 = np.int32, np.int64
    if program is None:
        n = tg.n_tasks
        succ_ptr, succ_idx = tg.successors
        rows = {"kind": tg.kind, "device": tg.device, "duration": tg.duration, "nbytes": tg.nbytes,
                "steps": tg.steps if tg.steps is not None else np.ones(n, dtype=i32), "mem_bytes": tg.mem_bytes,
                "mem_node": tg.mem_node, "route": tg.route}
        one = np.zeros(1, dtype=i64)
        return dict(single=True, n=n, rows=rows, tpl_count=np.ones(1, dtype=i64),
                    r_ipred_ptr=tg.pred_ptr, r_ipred=tg.pred_idx, r_isucc_ptr=succ_ptr, r_isucc=succ_idx,
                    r_xref_ptr=np.zeros(n + 1, dtype=i64), r_xref_group=np.zeros(1, i32), r_xref_rel=np.zeros(1, i32),
                    t_start=np.asarray([0, n], dtype=i64), t_first=np.full(1, -1, i32), t_last=np.full(1, -1, i32),
                    t_gstart=np.zeros(2, dtype=i64), g_lastkernel=np.zeros(1, np.bool_), g_rev_base=np.zeros(2, i64),
                    g_rel_ptr=np.zeros(2, i64), rev_ptr=one, rev_rel=np.zeros(1, i32), g_rel=np.zeros(1, i32),
                    i_tpl=np.zeros(1, i32), i_base=np.asarray([0, n], dtype=i64), i_gstart=np.zeros(2, i64),
                    i_target=np.full(1, -1, i32), i_prev=np.full(1, -1, i32), i_next=np.full(1, -1, i32),
                    i_inc_ptr=np.zeros(2, i64), i_inc_inst=np.zeros(1, i32), i_inc_group=np.zeros(1, i32),
                    inst_of=np.zeros(1, i32), waiting=np.diff(tg.pred_ptr).astype(i32),
                    readers_left=np.diff(succ_ptr).astype(i32), priority=tg.priority)
    pr = program
    su = pr.successors()
    n = pr.n_tasks
    waiting, readers = pr.counts()
    return dict(single=False, n=n, rows=pr.rows, tpl_count=np.bincount(pr.inst_tpl, minlength=len(pr.sizes)),
                r_ipred_ptr=pr.ipred_ptr, r_ipred=pr.ipred, r_isucc_ptr=su.isucc_ptr, r_isucc=su.isucc,
                r_xref_ptr=pr.xref_ptr, r_xref_group=pr.xref_group, r_xref_rel=pr.xref_rel, t_start=pr.tpl_start,
                t_first=pr.first_compute, t_last=pr.last_compute, t_gstart=pr.grp_start, g_lastkernel=pr.grp_lastkernel,
                g_rev_base=su.rev_base, g_rel_ptr=su.grp_rel_ptr, rev_ptr=su.rev_ptr, rev_rel=su.rev_rel, g_rel=su.grp_rel,
                i_tpl=pr.inst_tpl, i_base=pr.inst_base, i_gstart=pr.inst_gstart, i_target=pr.target,
                i_prev=pr.chain_prev, i_next=su.chain_next, i_inc_ptr=su.inc_ptr, i_inc_inst=su.inc_inst,
                i_inc_group=su.inc_group, inst_of=pr.inst_of, waiting=waiting, readers_left=readers, priority=None)


def _prepare(tg: TaskGraph, system: System, policy: str, streams: int, record: bool):
    """The arrays of one run (the SimPy engine's ``_Simulation.__init__``, as arrays over the
    task graph's rows: see :func:`_layout`)."""
    k = _kernels()
    lay = _layout(tg)
    n = lay["n"]
    rows = lay["rows"]
    n_rows = len(rows["kind"])
    tpl_count = lay["tpl_count"]
    # how many tasks each row stands for (the instances of its template)
    per_row = np.repeat(tpl_count, np.diff(lay["t_start"]))
    r_compute = rows["kind"] == COMPUTE
    route_lat = np.asarray([r.latency for r in tg.routes] or [0.0], dtype=float)
    has_res = np.asarray([bool(r.resources) for r in tg.routes] or [False])
    r_flow = ~r_compute & (rows["nbytes"] > 0) & has_res[rows["route"]]
    priority = lay["priority"]
    identity = priority is None or bool(n == 0 or (priority[0] == 0 and (np.diff(priority) == 1).all()))
    if identity:
        rank = by_rank = np.zeros(1, dtype=np.int64)
    else:
        by_rank = np.lexsort((np.arange(n), priority)).astype(np.int64)
        rank = np.empty(n, dtype=np.int64)
        rank[by_rank] = np.arange(n, dtype=np.int64)

    # memory pools: the nodes holding buffers or resident weights, in node order
    nodes = tg.node_names
    mem_node = rows["mem_node"]
    used = set(np.unique(mem_node[(mem_node >= 0) & (per_row > 0)]).tolist())
    used.update(system.node_index[d] for d in tg.resident)
    pool_nodes = sorted(used)
    pool_names = [nodes[g] for g in pool_nodes]
    capacity = np.asarray([float("inf") if policy == "ignore" else float(system.memory_capacity(name))
                           for name in pool_names], dtype=float)
    resident = np.asarray([float(tg.resident.get(name, 0.0)) for name in pool_names], dtype=float)
    for name, cap, res in zip(pool_names, capacity, resident):
        if res > cap:
            raise CapacityError(name, 0.0, res, cap, "weights alone exceed the memory")
    pool_index = np.full(len(nodes) + 1, -1, dtype=np.int32)
    pool_index[pool_nodes] = np.arange(len(pool_nodes), dtype=np.int32)
    r_pool = pool_index[mem_node]  # mem_node -1 -> the trailing -1

    # devices: their compute tasks' heaps and their streams
    device = rows["device"]
    compute_devices = np.unique(device[r_compute & (per_row > 0)])
    dense = np.full(len(nodes), -1, dtype=np.int32)
    dense[compute_devices] = np.arange(len(compute_devices), dtype=np.int32)
    r_dev = np.where(r_compute, dense[np.where(r_compute, device, 0)], -1).astype(np.int32)
    per_dev = np.bincount(r_dev[r_compute], weights=per_row[r_compute], minlength=len(compute_devices)).astype(np.int64)
    dh_base = np.zeros(len(compute_devices) + 1, dtype=np.int64)
    np.cumsum(per_dev, out=dh_base[1:])
    n_streams = len(compute_devices) * streams
    stream_dev = np.repeat(np.arange(len(compute_devices), dtype=np.int32), streams)
    idle_base = (np.arange(len(compute_devices), dtype=np.int64) * streams)

    # flow slots: at most one per transfer task (taken and given back: few are ever touched)
    n_slots = max(int(per_row[~r_compute].sum()), 1)

    # routes as entries (resource, weight, bound: the most bytes/s its other resources allow)
    cap = np.asarray(system.resource_capacity, dtype=float)
    lengths = np.asarray([len(r.resources) for r in tg.routes], dtype=np.int64)
    rt_ptr = np.zeros(len(tg.routes) + 1, dtype=np.int64)
    np.cumsum(lengths, out=rt_ptr[1:])
    n_entries = int(rt_ptr[-1])
    rt_res = np.fromiter((r for route in tg.routes for r in route.resources), dtype=np.int64, count=n_entries)
    rt_w = np.ones(n_entries, dtype=float)
    rt_has_w = np.zeros(max(len(tg.routes), 1), dtype=np.bool_)
    rt_bound = np.full(n_entries, np.inf)
    for i, route in enumerate(tg.routes):
        a = rt_ptr[i]
        w = route.weights or (1.0,) * len(route.resources)
        if route.weights:
            rt_has_w[i] = True
            rt_w[a:a + len(w)] = w
        caps = [float(cap[r]) / w[j] for j, r in enumerate(route.resources)]
        for j in range(len(caps)):
            rt_bound[a + j] = min((c for jj, c in enumerate(caps) if jj != j), default=np.inf)
    entry_route = np.repeat(np.arange(len(tg.routes), dtype=np.int64), lengths)
    n_routes = max(len(tg.routes), 1)
    n_res = max(len(cap), 1)

    def z(size, dtype):  # zeroed lazily by the system: pages nobody touches cost nothing
        return np.zeros(size, dtype=dtype)

    def full(size, value, dtype):
        return np.full(size, value, dtype=dtype)

    n_pools = len(pool_nodes)
    mt = (2 * n + 1) if record else 1
    lt = (4 * n_res + 16) if record else 1
    n_edges = int(lay["readers_left"].sum(dtype=np.int64))
    q = 2 * n_streams + n_slots + 4
    it = np.zeros(k.N_INT_SCALARS, dtype=np.int64)
    it[k.I.EID] = 1 + n_streams  # the network's and the streams' start events come first
    it[k.I.NSTREAMS] = n_streams
    it[k.I.RECORD] = int(record)
    it[k.I.IDENTITY] = int(identity)
    it[k.I.SINGLE] = int(lay["single"])
    fl = np.zeros(4, dtype=float)
    fl[k.F.TIMER_AT] = np.inf
    readers = lay["readers_left"]
    arrays = dict(
        inst_of=_ro(lay["inst_of"], np.int32), waiting=lay["waiting"].astype(np.int32, copy=False),
        readers_left=readers.astype(np.int32, copy=False), has_succ=readers > 0, steps_left=z(n, np.int32),
        preds_read=z(n, np.bool_), start=full(n, np.nan, float), end=full(n, np.nan, float), slot_of=z(n, np.int32),
        rank=_ro(rank, np.int64), by_rank=_ro(by_rank, np.int64),
        r_compute=_ro(r_compute, np.bool_), r_dev=_ro(r_dev, np.int32), r_duration=_ro(rows["duration"], float),
        r_nbytes=_ro(rows["nbytes"], float), r_steps=_ro(rows["steps"], np.int32), r_mem=_ro(rows["mem_bytes"], float),
        r_pool=_ro(r_pool, np.int32), r_route=_ro(rows["route"], np.int32), r_flow=_ro(r_flow, np.bool_),
        r_ipred_ptr=_ro(lay["r_ipred_ptr"], np.int64), r_ipred=_ro(lay["r_ipred"], np.int32),
        r_isucc_ptr=_ro(lay["r_isucc_ptr"], np.int64), r_isucc=_ro(lay["r_isucc"], np.int32),
        r_xref_ptr=_ro(lay["r_xref_ptr"], np.int64), r_xref_group=_ro(lay["r_xref_group"], np.int32),
        r_xref_rel=_ro(lay["r_xref_rel"], np.int32),
        t_start=_ro(lay["t_start"], np.int64), t_first=_ro(lay["t_first"], np.int32),
        t_last=_ro(lay["t_last"], np.int32), t_gstart=_ro(lay["t_gstart"], np.int64),
        g_lastkernel=_ro(lay["g_lastkernel"], np.bool_), g_rev_base=_ro(lay["g_rev_base"], np.int64),
        g_rel_ptr=_ro(lay["g_rel_ptr"], np.int64), rev_ptr=_ro(lay["rev_ptr"], np.int64),
        rev_rel=_ro(lay["rev_rel"], np.int32), g_rel=_ro(lay["g_rel"], np.int32),
        i_tpl=_ro(lay["i_tpl"], np.int32), i_base=_ro(lay["i_base"], np.int64), i_gstart=_ro(lay["i_gstart"], np.int64),
        i_target=_ro(lay["i_target"], np.int32), i_prev=_ro(lay["i_prev"], np.int32),
        i_next=_ro(lay["i_next"], np.int32), i_inc_ptr=_ro(lay["i_inc_ptr"], np.int64),
        i_inc_inst=_ro(lay["i_inc_inst"], np.int32), i_inc_group=_ro(lay["i_inc_group"], np.int32),
        slot_task=z(n_slots, np.int64), f_left=z(n_slots, float), f_t0=z(n_slots, float), f_rate=z(n_slots, float),
        f_finish=z(n_slots, float), f_seq=z(n_slots, np.int64), f_hpos=z(n_slots, np.int64),
        f_next=z(n_slots, np.int64), f_prev=z(n_slots, np.int64), f_free=z(n_slots, np.int64),
        rt_lat=_ro(route_lat, float), rt_ptr=rt_ptr, rt_res=rt_res if n_entries else z(1, np.int64),
        rt_w=rt_w if n_entries else z(1, float), rt_bound=rt_bound if n_entries else z(1, float), rt_has_w=rt_has_w,
        entry_route=entry_route if n_entries else z(1, np.int64),
        rt_mult=z(n_routes, np.int64), rt_head=full(n_routes, -1, np.int64), rt_tail=full(n_routes, -1, np.int64),
        rt_found=z(n_routes, np.int64), rt_rate=z(n_routes, float),
        cap=cap if len(cap) else z(1, float), rs_head=full(n_res, -1, np.int64), rs_tail=full(n_res, -1, np.int64),
        e_next=full(max(n_entries, 1), -1, np.int64), e_prev=full(max(n_entries, 1), -1, np.int64),
        rs_busy=z(n_res, float), rs_since=z(n_res, float), rs_dirty=z(n_res, np.bool_), dirty=z(n_res, np.int64),
        changed=z(n_res, np.int64), rs_seen=z(n_res, np.int64), rs_local=full(n_res, -1, np.int64),
        prev_rate=z(n_res, float), prev_n=z(n_res, float), prev_has=z(n_res, np.bool_),
        tot_mark=z(n_res, np.int64), touched=z(n_res, np.int64),
        found=z(n_routes, np.int64), stack=z(n_routes, np.int64), keys=z(n_routes, np.int64),
        g_rate=z(n_routes, float), loc_res=z(n_res, np.int64), loc_left=z(n_res, float), loc_count=z(n_res, float),
        users_cnt=z(n_res, np.int64), users_ptr=z(n_res + 1, np.int64), users_g=z(max(n_entries, 1), np.int64),
        users_n=z(max(n_entries, 1), float), rh_share=z(n_res, float), rh_r=z(n_res, np.int64),
        fin_slot=z(n_slots, np.int64), fin_seq=z(n_slots, np.int64), nh=z(n_slots, np.int64),
        mt_hash=z(_MEMO_SLOTS, np.int64), mt_off=z(_MEMO_SLOTS, np.int64), mt_len=z(_MEMO_SLOTS, np.int64),
        mp_key=z(_MEMO_ROUTES, np.int64), mp_mult=z(_MEMO_ROUTES, np.int64), mp_rate=z(_MEMO_ROUTES, float),
        q_time=z(q, float), q_eid=z(q, np.int64), q_kind=z(q, np.int64), q_a=z(q, np.int64), q_b=z(q, np.int64),
        dh_base=dh_base, dh_size=z(len(compute_devices) + 1, np.int64),
        dh_rank=z(max(int(dh_base[-1]), 1), np.int64), idle_base=np.append(idle_base, 0),
        idle_size=z(len(compute_devices) + 1, np.int64), idle_stream=z(max(n_streams, 1), np.int64),
        stream_dev=stream_dev if n_streams else z(1, np.int32),
        pl_level=resident.copy() if n_pools else z(1, float), pl_peak=resident.copy() if n_pools else z(1, float),
        pl_limit=capacity * (1 + 1e-12) if n_pools else z(1, float),
        mt_pool=z(mt, np.int32), mt_time=z(mt, float), mt_level=z(mt, float),
        lt_time=z(lt, float), lt_res=z(lt, np.int32), lt_rate=z(lt, float), lt_n=z(lt, float),
        st_t=z(n + 1, np.int64), st_a=z(n + 1, np.int64), st_b=z(n + 1, np.int64), sb=z(n_edges + 1, np.int64),
        it=it, fl=fl,
    )
    del n_rows
    pools = {"names": pool_names, "capacity": capacity, "resident": resident}
    return arrays, pools, n_res


def _ro(a: np.ndarray, dtype) -> np.ndarray:
    """``a`` as a contiguous read-only array of ``dtype`` (a view when it already is one), so the
    compiled loop always sees the same array types (and is compiled once)."""
    a = np.ascontiguousarray(a, dtype=dtype).view()
    a.setflags(write=False)
    return a


def _grow_links(arrays: dict) -> None:
    """Make the link timeline twice as long."""
    for name in ("lt_time", "lt_res", "lt_rate", "lt_n"):
        old = arrays[name]
        new = np.zeros(2 * len(old), dtype=old.dtype)
        new[:len(old)] = old
        arrays[name] = new


def run_compiled(taskgraph: TaskGraph, system: System, memory_policy: str, streams: int, record: bool,
                 progress: Progress | None = None, schedule_only: bool = False):
    """Simulate on the compiled engine (callers check :func:`usable` first): the
    :class:`Result` (or with ``schedule_only`` the :class:`~marssim.sim.schedule.Schedule`: its
    summary and every task's start and end) the SimPy engine gives."""
    k = _kernels()
    tg = taskgraph
    arrays, pools, n_res = _prepare(tg, system, memory_policy, streams, record)
    state = k.State(**arrays)  # holds the same arrays: what the loop writes is read from `arrays`
    last = time.perf_counter()
    try:
        k.start(state, np.flatnonzero(arrays["waiting"] == 0))  # the tasks without predecessors
        while True:
            status = k.run(state, _BUDGET, n_res + 1)
            if status == k.DONE:
                break
            if status == k.GROW_LINKS:
                _grow_links(arrays)
                state = k.State(**arrays)
            if progress is not None and time.perf_counter() - last >= PROGRESS_EVERY:
                last = time.perf_counter()
                progress(SimulationProgress(float(arrays["fl"][k.F.NOW]),
                                            int(np.count_nonzero(arrays["end"] == arrays["end"])), tg.n_tasks))
    except MemoryError:
        pool = int(arrays["it"][k.I.ERRPOOL])
        t = int(arrays["it"][k.I.ERRTASK])
        raise CapacityError(pools["names"][pool], float(arrays["fl"][k.F.NOW]), float(arrays["fl"][k.F.ERRLEVEL]),
                            float(pools["capacity"][pool]), "output of " + tg.task_name(t)) from None
    end = arrays["end"]
    unfinished = int(np.isnan(end).sum())
    if unfinished:
        raise RuntimeError(f"{unfinished} tasks never ran: the task graph has a cycle or an unreachable dependency")
    if progress is not None:
        progress(SimulationProgress(float(np.nanmax(end)) if tg.n_tasks else 0.0, tg.n_tasks, tg.n_tasks))
    start = arrays["start"]
    if schedule_only:  # a summary and every task's times: no tables (and no pandas)
        del state, arrays
        return Schedule(summarise(tg, system, end, streams), start, end)
    names = pools["names"]
    memories = pd.DataFrame.from_dict(
        {name: {"peak_bytes": float(arrays["pl_peak"][i]), "capacity_bytes": float(pools["capacity"][i]),
                "resident_bytes": float(pools["resident"][i])} for i, name in enumerate(names)},
        orient="index", columns=["peak_bytes", "capacity_bytes", "resident_bytes"])
    memory_timeline = _memory_timeline(arrays, k, pools, record)
    link_timeline = _link_timeline(arrays, k, system, tg, record)
    meta = {"evaluator": "simulation", "tasks": tg.n_tasks, "events": int(arrays["it"][k.I.EID]),
            "network_recomputes": int(arrays["it"][k.I.RECOMPUTES]), "memory_policy": memory_policy, "spills": 0}
    busy = arrays["rs_busy"][:len(system.resource_capacity)].copy()
    del state, arrays  # the loop's state goes before the results are built
    return build_result(tg, system, start, end, streams=streams, memories=memories, memory_timeline=memory_timeline,
                        link_timeline=link_timeline, link_busy=busy, spills=[], meta=meta)


def _memory_timeline(arrays: dict, k, pools, record: bool) -> pd.DataFrame:
    """Rows (node, time, bytes): per pool in node order, its resident level at 0 then every change."""
    if not record:
        return pd.DataFrame([], columns=["node", "time", "bytes"])
    rows = int(arrays["it"][k.I.MEMORY_ROWS])
    if not rows and not len(pools["names"]):  # as the SimPy engine builds it from no rows
        return pd.DataFrame([], columns=["node", "time", "bytes"])
    pool = arrays["mt_pool"][:rows]
    order = np.argsort(pool, kind="stable")
    names = pools["names"]
    n_pools = len(names)
    node = np.concatenate([np.arange(n_pools), pool[order]])
    times = np.concatenate([np.zeros(n_pools), arrays["mt_time"][:rows][order]])
    level = np.concatenate([pools["resident"], arrays["mt_level"][:rows][order]])
    grouped = np.argsort(node, kind="stable")
    return pd.DataFrame({"node": np.asarray(names, dtype=object)[node[grouped]] if n_pools else [],
                         "time": times[grouped], "bytes": level[grouped]}, columns=["node", "time", "bytes"])


def _link_timeline(arrays: dict, k, system: System, tg: TaskGraph, record: bool) -> pd.DataFrame:
    if not record:
        return pd.DataFrame([], columns=["resource", "time", "rate", "flows"])
    rows = int(arrays["it"][k.I.LINK_ROWS])
    if not rows:  # as the SimPy engine builds it from no rows
        return pd.DataFrame([], columns=["resource", "time", "rate", "flows"])
    names = np.asarray(system.resource_names, dtype=object)
    flows = arrays["lt_n"][:rows]
    if not any(r.weights for r in tg.routes):
        flows = flows.astype(np.int64)
    return pd.DataFrame({"resource": names[arrays["lt_res"][:rows]], "time": arrays["lt_time"][:rows],
                         "rate": arrays["lt_rate"][:rows], "flows": flows}, columns=["resource", "time", "rate", "flows"])
