"""Discrete-event simulation of a TaskGraph on a System (SimPy).

* Each accelerator is a SimPy process (``streams`` of them per device) that runs its ready
  compute tasks one at a time, lowest ``priority`` first (pipeline order), each for its duration.
* Transfers run on their own (DMA): they start as soon as their predecessors end and become
  flows of the max-min fair :class:`~marssim.sim.network.FairShareNetwork`, so a device computes
  while it sends.
* Memories are capacities (:class:`~marssim.sim.memory.MemoryPool`): weights resident from
  the start, a task's output buffer allocated when it starts and freed when its last successor
  ends; overflow is an error or a spill to host DRAM, by policy.

The simulator reads only the TaskGraph and the System's resources: it knows nothing of
graphs, mappings or searches. Same inputs, same result, bit for bit.
"""

from __future__ import annotations

import heapq
import time

import numpy as np
import pandas as pd
import simpy

from marssim.errors import CapacityError
from marssim.gcpause import gc_paused
from marssim.system import System
from marssim.taskgraph import COMPUTE, TaskGraph
from marssim.summary import Summary, steady_throughput, summarise

from .memory import POLICIES, MemoryPool
from .network import FairShareNetwork
from .result import INTERVAL_COLUMNS, Result

__all__ = ["simulate", "simulate_summary", "setup_time"]


def simulate(taskgraph: TaskGraph, system: System, *, memory_policy: str = "error", streams: int = 1,
             record: bool = True, setup: bool = True) -> Result:
    """Simulate ``taskgraph`` on ``system`` and return the :class:`Result`.

    ``memory_policy``: ``error`` (raise CapacityError on overflow) or ``spill`` (to host DRAM).
    ``streams``: compute tasks a device may run at once. ``record``: keep the memory and link
    timelines (traces need them; searches do not). ``setup``: also simulate the weight loads
    to report ``Result.setup_time``."""
    if memory_policy not in POLICIES:
        raise ValueError(f"memory_policy must be one of {POLICIES}, got {memory_policy!r}")
    if streams < 1:
        raise ValueError(f"streams must be >= 1, got {streams}")
    wall = time.perf_counter()
    with gc_paused():
        sim = _Simulation(taskgraph, system, memory_policy, streams, record)
        sim.run()
        result = sim.result()
        del sim  # acyclic once run: freed here, before the collector is back
    result.meta["wall_s"] = time.perf_counter() - wall
    if setup and taskgraph.setup:
        result.setup_time = setup_time(taskgraph, system)
    return result


def simulate_summary(taskgraph: TaskGraph, system: System, *, memory_policy: str = "error",
                     streams: int = 1) -> Summary:
    """Simulate like :func:`simulate` but return only the :class:`Summary`: no interval log, no
    per-resource tables (what a search needs, several times faster on small graphs)."""
    if memory_policy not in POLICIES:
        raise ValueError(f"memory_policy must be one of {POLICIES}, got {memory_policy!r}")
    if streams < 1:
        raise ValueError(f"streams must be >= 1, got {streams}")
    with gc_paused():
        sim = _Simulation(taskgraph, system, memory_policy, streams, False)
        sim.run()
        summary = sim.summary()
        del sim  # acyclic once run: freed here, before the collector is back
    return summary


def setup_time(taskgraph: TaskGraph, system: System) -> float:
    """Seconds to load every device's weights from its host, all loads at once, with contention."""
    if not taskgraph.setup:
        return 0.0
    env = simpy.Environment()
    done: list[float] = []
    net = FairShareNetwork(env, system.resource_capacity, lambda token: done.append(env.now))
    for token, (src, dst, nbytes) in enumerate(taskgraph.setup):
        route = system.route(src, dst)
        net.start(token, nbytes, route.resources, route.latency)
    env.run()
    return max(done, default=0.0)


class _Simulation:
    """One run: per-task columns as Python lists (indexed by task id), the hot paths as closures
    over them (see :meth:`_bind`), the memory pools and the network."""

    def __init__(self, tg: TaskGraph, system: System, policy: str, streams: int, record: bool) -> None:
        self.tg = tg
        self.system = system
        self.policy = policy
        self.spill = policy == "spill"
        self.record = record
        self.streams = streams
        self.env = env = simpy.Environment()
        n = tg.n_tasks
        self.n = n
        is_compute = tg.kind == COMPUTE
        self.is_compute = is_compute.tolist()
        self.device = tg.device.tolist()
        self.duration = tg.duration.tolist()
        self.nbytes = tg.nbytes.tolist()
        self.mem_node = tg.mem_node.tolist()
        self.mem_bytes = tg.mem_bytes.tolist()
        succ_ptr, succ_idx = tg.successors
        self.succ = _split(succ_idx.tolist(), succ_ptr.tolist())
        self.pred = _split(tg.pred_idx.tolist(), tg.pred_ptr.tolist())
        self.waiting = np.diff(tg.pred_ptr).tolist()  # predecessors not yet ended
        self.readers_left = np.diff(succ_ptr).tolist()  # successors not yet ended (buffer frees)
        self.route = tg.route.tolist()
        route_res = [r.resources for r in tg.routes]
        # a transfer is a flow when it has bytes and a route with resources; else it is only latency
        # (indexing by route as the lists did: -1 is the last route)
        route_lat = np.asarray([r.latency for r in tg.routes] or [0.0], dtype=float)
        has_res = np.asarray([bool(r) for r in route_res] or [False])
        self.latency = np.where(is_compute, 0.0, route_lat[tg.route]).tolist()  # s
        self.is_flow = (~is_compute & (tg.nbytes > 0) & has_res[tg.route]).tolist()
        # ready compute tasks of a device run lowest (priority, task id) first: heaps hold ranks
        by_rank = np.lexsort((np.arange(n), tg.priority))
        rank = np.empty(n, dtype=np.int64)
        rank[by_rank] = np.arange(n)
        self.by_rank = by_rank.tolist()
        self.rank = rank.tolist()
        self.start = [float("nan")] * n
        self.end = [float("nan")] * n
        self.spilled = [False] * n
        self.spills: list[tuple[str, int, int, float, float, float]] = []  # kind, node, task, start, end, bytes
        self._spill_tokens: dict[int, tuple] = {}
        self.net = FairShareNetwork(env, system.resource_capacity, self._delivered, record=record,
                                    routes=route_res)

        nodes = tg.node_names
        self.pools: dict[int, MemoryPool] = {}
        used_nodes = set(np.unique(tg.mem_node[tg.mem_node >= 0]).tolist())
        used_nodes.update(system.node_index[d] for d in tg.resident)
        for node in sorted(used_nodes):
            name = nodes[node]
            self.pools[node] = MemoryPool(env, name, system.memory_capacity(name), tg.resident.get(name, 0.0),
                                          record=record)
        # the pool holding each task's output buffer (its host's once the buffer has spilled)
        self.pool_of: list[MemoryPool | None] = list(map(self.pools.get, self.mem_node))
        self.host_of: dict[int, int] = {}

        # each compute task's device queue (ranks) and idle streams (transfers: unused entries)
        compute_devices = np.unique(tg.device[is_compute]).tolist()
        heaps: dict[int, list[int]] = {d: [] for d in compute_devices}
        idles: dict[int, list[simpy.Event]] = {d: [] for d in compute_devices}
        self.heap_of = list(map(heaps.get, self.device))
        self.idle_of = list(map(idles.get, self.device))
        self._bind()
        self.net.on_delivered_event = self._finish
        self._streams: list = []  # the device processes' generators
        for d in compute_devices:
            for _ in range(streams):
                self._streams.append(self._device(heaps[d], idles[d]))
                env.process(self._streams[-1])

    # ------------------------------------------------------------------ life of a task
    def run(self) -> None:
        ready = self._ready
        for t, w in enumerate(self.waiting):
            if w == 0:
                ready(t)
        self.env.run()
        self._release()
        unfinished = int(np.isnan(np.asarray(self.end)).sum())
        if unfinished:
            raise RuntimeError(f"{unfinished} tasks never ran: the task graph has a cycle or an unreachable dependency")

    def _release(self) -> None:
        """Break the reference cycles of a finished run (processes suspended on events that
        will never come, closures and callbacks that refer back to the simulation), so that it
        is freed by reference counting as soon as it is dropped: otherwise the cyclic collector
        traces its ~10 containers per task once, a few ms per large run."""
        for stream in self._streams:
            stream.close()
        self._streams = []
        self.net.close()
        self._allocate = self._dispatch = self._ready = self._complete = self._finish = None

    def _bind(self) -> None:
        """Build the per-event paths as closures over the task columns (local lookups only):

        * ``_ready(t)``: all of ``t``'s predecessors have ended: queue it on its device, or start
          its transfer (after bringing back spilled inputs under the spill policy);
        * ``_dispatch(t)``: queue or start ``t`` now;
        * ``_allocate(t)``: put ``t``'s output buffer in its memory (or spill it);
        * ``_finish(event)``: the task (or spill flow) that is ``event.value`` has ended at the
          current time (s): free the buffers nobody will read any more, ready the successors
          that were waiting only for it. It is the callback of every delivered flow and the
          end of every compute task;
        * ``_complete(t)``: ready ``t``'s successors (after its spilled output has left)."""
        env = self.env
        n = self.n
        start, end = self.start, self.end
        pred, succ = self.pred, self.succ
        waiting, readers_left = self.waiting, self.readers_left
        mem_bytes, pool_of, spilled = self.mem_bytes, self.pool_of, self.spilled
        is_compute, is_flow, rank = self.is_compute, self.is_flow, self.rank
        heap_of, idle_of = self.heap_of, self.idle_of
        nbytes, route, latency = self.nbytes, self.route, self.latency
        add_flow = self.net.add_flow
        deliver = self.net._deliver
        spill = self.spill
        spill_arrived = self._spill_arrived
        heappush = heapq.heappush

        def allocate(t: int) -> None:
            nb = mem_bytes[t]
            pool = pool_of[t]
            if spill and not pool.fits(nb):
                spilled[t] = True
                pool = pool_of[t] = self._host_pool(self.mem_node[t])
            try:
                pool.allocate(nb)
            except CapacityError as err:
                self._overflow(t, err)

        def dispatch(t: int) -> None:
            if is_compute[t]:
                heappush(heap_of[t], rank[t])
                idle = idle_of[t]
                if idle:
                    idle.pop().succeed()
                return
            start[t] = env._now
            if mem_bytes[t] > 0:
                allocate(t)
            if is_flow[t]:
                add_flow(t, nbytes[t], route[t], latency[t])
            else:
                deliver(t, latency[t])

        def ready(t: int) -> None:
            pending = [p for p in pred[t] if spilled[p]]
            if pending:
                self._spill_in(t, pending)
            else:
                dispatch(t)

        if not spill:
            ready = dispatch  # noqa: F811  (nothing is ever spilled)

        def complete(t: int) -> None:
            for s in succ[t]:
                w = waiting[s] - 1
                waiting[s] = w
                if w == 0:
                    ready(s)

        def finish(event) -> None:
            t = event._value
            if t >= n:
                spill_arrived(t)
                return
            end[t] = env._now
            for p in pred[t]:
                left = readers_left[p] - 1
                readers_left[p] = left
                if left == 0:
                    nb = mem_bytes[p]
                    if nb > 0:
                        pool_of[p].release(nb)
            nexts = succ[t]
            if not nexts:  # nobody reads its buffer: freed at once, never written to the host
                nb = mem_bytes[t]
                if nb > 0:
                    pool_of[t].release(nb)
                return
            if spilled[t]:
                self._spill_out(t)
                return
            complete(t)

        self._allocate, self._dispatch, self._ready = allocate, dispatch, ready
        self._complete, self._finish = complete, finish

    def _device(self, heap: list[int], idle: list[simpy.Event]):
        """One compute stream of a device: run its ready tasks (ranks in ``heap``) one at a
        time; when there are none, wait on an event appended to ``idle``."""
        env = self.env
        by_rank, duration, start, mem_bytes = self.by_rank, self.duration, self.start, self.mem_bytes
        allocate, finish = self._allocate, self._finish
        timeout, event, heappop = env.timeout, env.event, heapq.heappop
        while True:
            if not heap:
                ev = event()
                idle.append(ev)
                yield ev
                continue
            t = by_rank[heappop(heap)]
            start[t] = env._now
            if mem_bytes[t] > 0:
                allocate(t)
            ev = timeout(duration[t], t)
            yield ev
            finish(ev)

    def _overflow(self, t: int, err: CapacityError) -> None:
        """Raise ``err`` (a buffer of ``t`` does not fit) again, naming the buffer."""
        what = "spilled output of " if self.spilled[t] else "output of "
        raise CapacityError(err.device, err.time_s, err.peak_bytes, err.capacity_bytes,
                            what + self.tg.task_name(t)) from None

    def _delivered(self, token: int) -> None:
        """A flow delivered without latency (``token``: its task, or a spill flow's)."""
        self._finish(_Arrival(token))

    def _spill_arrived(self, token: int) -> None:
        """A spill flow has arrived: its reader may start, or its writer's successors."""
        kind, node, t, start, nbytes, rest = self._spill_tokens.pop(token)
        self.spills.append((kind, node, t, start, self.env.now, nbytes))
        if kind == "spill_out":
            self._complete(t)
        else:
            rest[0] -= 1
            if rest[0] == 0:
                self._dispatch(t)

    # ------------------------------------------------------------------ spill policy
    def _host_pool(self, node: int) -> MemoryPool:
        host = self.host_of.get(node)
        if host is None:
            name = self.system.nearest_host(self.tg.node_names[node])
            host = self.host_of[node] = self.system.node_index[name]
            if host not in self.pools:
                self.pools[host] = MemoryPool(self.env, name, self.system.memory_capacity(name), record=self.record)
        return self.pools[host]

    def _spill_flow(self, kind: str, src: int, dst: int, t: int, nbytes: float, rest: list) -> None:
        token = self.n + len(self._spill_tokens) + len(self.spills)
        self._spill_tokens[token] = (kind, src if kind == "spill_out" else dst, t, self.env.now, nbytes, rest)
        names = self.tg.node_names
        route = self.system.route(names[src], names[dst])
        self.net.start(token, nbytes, route.resources, route.latency)

    def _spill_out(self, t: int) -> None:
        node = self.mem_node[t]
        host = self.host_of[node]
        self._spill_flow("spill_out", node, host, t, self.mem_bytes[t], [0])

    def _spill_in(self, t: int, spilled_preds: list[int]) -> None:
        rest = [len(spilled_preds)]
        for p in spilled_preds:
            node = self.mem_node[p]
            self._spill_flow("spill_in", self.host_of[node], node, t, self.mem_bytes[p], rest)

    # ------------------------------------------------------------------ result
    def summary(self) -> Summary:
        """Makespan, throughput and energy computed exactly as :meth:`result` computes them."""
        return summarise(self.tg, self.system, np.asarray(self.end), self.streams)

    def result(self) -> Result:
        tg = self.tg
        names = tg.node_names
        start = np.asarray(self.start)
        end = np.asarray(self.end)
        makespan = float(np.nanmax(end)) if self.n else 0.0
        is_compute = tg.kind == COMPUTE
        op_names = np.asarray(tg.op_names + ("",), dtype=object)[tg.op]
        op_model = tg.meta.get("op_model", {})
        models = np.asarray([op_model.get(o, "") for o in op_names], dtype=object)
        node_arr = np.asarray(names + ("",), dtype=object)
        src_names = node_arr[tg.src]
        dst_names = node_arr[tg.dst]
        resource = np.where(is_compute, node_arr[tg.device], src_names + "->" + dst_names)
        coll_kind = np.asarray([c.kind for c in tg.collectives] + [""], dtype=object)[tg.collective]
        res_names = np.asarray(self.system.resource_names, dtype=object)
        link_of_route = [";".join(res_names[list(r.resources)]) for r in tg.routes] + [""]
        links_col = np.asarray(link_of_route, dtype=object)[tg.route]
        frame = pd.DataFrame({
            "kind": np.where(is_compute, "compute", "transfer"), "resource": resource,
            "task": np.arange(self.n), "op": op_names, "model": models, "micro_batch": tg.micro_batch.astype(np.int64),
            "start": start, "end": end, "bytes": np.where(is_compute, 0.0, tg.nbytes), "flops": tg.flops,
            "energy": np.where(is_compute, tg.energy, np.nan), "src": np.where(is_compute, "", src_names),
            "dst": np.where(is_compute, "", dst_names), "collective": coll_kind, "collective_id": tg.collective.astype(np.int64),
            "links": links_col,
        })
        if self.spills:
            rows = []
            for kind, node, t, s, e, nbytes in self.spills:
                host = names[self.host_of[node]]
                src, dst = (names[node], host) if kind == "spill_out" else (host, names[node])
                route = self.system.route(src, dst)
                rows.append({"kind": kind, "resource": f"{src}->{dst}", "task": -1, "op": op_names[t],
                             "model": models[t], "micro_batch": int(tg.micro_batch[t]), "start": s, "end": e,
                             "bytes": nbytes, "flops": 0.0, "energy": np.nan, "src": src, "dst": dst,
                             "collective": "", "collective_id": -1,
                             "links": ";".join(res_names[list(route.resources)])})
            frame = pd.concat([frame, pd.DataFrame(rows)], ignore_index=True)
        frame = frame.sort_values(["start", "kind", "task"], kind="stable").reset_index(drop=True)[list(INTERVAL_COLUMNS)]

        # devices
        device_design = tg.meta.get("device_design", {})
        dev_rows = {}
        busy = np.zeros(len(names))
        dur = end - start
        np.add.at(busy, tg.device[is_compute], dur[is_compute])
        energy = np.zeros(len(names))
        has_energy = np.zeros(len(names), dtype=bool)
        e = tg.energy[is_compute]
        np.add.at(energy, tg.device[is_compute], np.nan_to_num(e))
        np.logical_or.at(has_energy, tg.device[is_compute], ~np.isnan(e))
        flops = np.zeros(len(names))
        np.add.at(flops, tg.device[is_compute], tg.flops[is_compute])
        count = np.bincount(tg.device[is_compute], minlength=len(names))
        for acc in self.system.accelerators:
            i = self.system.node_index[acc.id]
            if self.streams == 1:
                busy_i = float(busy[i])
            else:
                mask = is_compute & (tg.device == i)
                busy_i = _union_length(start[mask], end[mask])
            dev_rows[acc.id] = {"design": device_design.get(acc.id, ""), "busy_s": busy_i,
                                "utilisation": busy_i / makespan if makespan > 0 else 0.0,
                                "energy_j": float(energy[i]) if has_energy[i] else np.nan,
                                "flops": float(flops[i]), "tasks": int(count[i])}
        devices = pd.DataFrame.from_dict(dev_rows, orient="index")

        # links and other bandwidth resources
        res_bytes = np.zeros(len(res_names))
        is_transfer = ~is_compute
        route_bytes = np.zeros(len(tg.routes))
        np.add.at(route_bytes, tg.route[is_transfer], tg.nbytes[is_transfer])
        for r, b in enumerate(route_bytes):
            if b:
                for res in tg.routes[r].resources:
                    res_bytes[res] += b
        for kind, node, t, s, e_, nbytes in self.spills:
            host = names[self.host_of[node]]
            src, dst = (names[node], host) if kind == "spill_out" else (host, names[node])
            for res in self.system.route(src, dst).resources:
                res_bytes[res] += nbytes
        cap = self.system.resource_capacity
        links = pd.DataFrame({
            "kind": list(self.system.resource_kinds), "capacity": cap, "bytes": res_bytes,
            "busy_s": np.asarray(self.net.busy),
            "utilisation": res_bytes / (cap * makespan) if makespan > 0 else np.zeros(len(cap)),
        }, index=pd.Index(res_names, name="resource"))

        mem_rows = {}
        for node, pool in sorted(self.pools.items()):
            mem_rows[pool.name] = {"peak_bytes": pool.peak, "capacity_bytes": pool.capacity,
                                   "resident_bytes": pool.resident}
        memories = pd.DataFrame.from_dict(mem_rows, orient="index",
                                          columns=["peak_bytes", "capacity_bytes", "resident_bytes"])
        mem_tl = [(pool.name, t_, lvl) for pool in self.pools.values() for t_, lvl in pool.timeline]
        memory_timeline = pd.DataFrame(mem_tl, columns=["node", "time", "bytes"])
        link_timeline = pd.DataFrame([(res_names[r], t_, rate, k) for t_, r, rate, k in self.net.timeline],
                                     columns=["resource", "time", "rate", "flows"])

        throughput = steady_throughput(tg, end, makespan, self.system, self.streams)
        meta = dict(tg.meta)
        meta.update({"tasks": self.n, "events": _events_scheduled(self.env), "network_recomputes": self.net.recomputes,
                     "memory_policy": self.policy, "spills": len(self.spills)})
        for key in ("op_sharding", "op_set", "op_model", "op_kind", "op_loops", "device_design"):
            meta.pop(key, None)
        return Result(makespan=makespan, intervals=frame, devices=devices, links=links, memories=memories,
                      memory_timeline=memory_timeline, link_timeline=link_timeline, edges=self._edges(),
                      ops=self._ops(), throughput=throughput, meta=meta)

    def _edges(self) -> pd.DataFrame:
        tg = self.tg
        counts = np.diff(tg.pred_ptr)
        dst = np.repeat(np.arange(tg.n_tasks), counts)
        src = tg.pred_idx.astype(np.int64)
        keep = (tg.kind[src] != COMPUTE) | (tg.kind[dst] != COMPUTE)
        return pd.DataFrame({"src_task": src[keep], "dst_task": dst[keep]})

    def _ops(self) -> pd.DataFrame:
        meta = self.tg.meta
        kinds = meta.get("op_kind", {})
        names = np.asarray(self.tg.op_names + ("",), dtype=object)[self.tg.op]
        flops = pd.Series(self.tg.flops).groupby(names).sum()
        compute = self.tg.kind == COMPUTE  # energy per op: its compute tasks' (compute + SRAM + DRAM)
        energy = pd.Series(self.tg.energy[compute]).groupby(names[compute]).sum(min_count=1)
        rows = {name: {"kind": kind, "model": meta.get("op_model", {}).get(name, ""),
                       "sharding": meta.get("op_sharding", {}).get(name, ""),
                       "set": meta.get("op_set", {}).get(name, -1), "loops": meta.get("op_loops", {}).get(name, ""),
                       "flops": float(flops.get(name, 0.0)), "energy_j": float(energy.get(name, np.nan))}
                for name, kind in kinds.items() if kind != "input"}
        frame = pd.DataFrame.from_dict(rows, orient="index",
                                       columns=["kind", "model", "sharding", "set", "loops", "flops", "energy_j"])
        return frame.rename_axis("op")



class _Arrival:
    """What a flow delivered without latency hands to ``_finish`` in place of its timeout."""

    __slots__ = ("_value",)

    def __init__(self, token: int) -> None:
        self._value = token


def _split(values: list, ptr: list[int]) -> list[list]:
    """CSR to lists: ``values[ptr[i]:ptr[i + 1]]`` for each ``i``."""
    return [values[a:b] for a, b in zip(ptr, ptr[1:])]


def _events_scheduled(env: simpy.Environment) -> int:
    """Number of events SimPy scheduled (its internal event id counter)."""
    counter = getattr(env, "_eid", None)
    return int(next(counter)) if counter is not None else -1


def _union_length(starts: np.ndarray, ends: np.ndarray) -> float:
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
