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
import simpy

from marssim.errors import CapacityError
from marssim.gcpause import gc_paused
from marssim.lazymodule import lazy_module
from marssim.progress import SimulationProgress
from marssim.system import System
from marssim.taskgraph import COMPUTE, TaskGraph
from marssim.results.build import Spill, build_result
from marssim.results.summary import Summary, summarise

from .fast import Progress  # noqa: F401  (the progress callback type)
from .memory import POLICIES, MemoryPool
from .network import FairShareNetwork
from .schedule import Schedule
from marssim.results.result import Result

pd = lazy_module("pandas")  # imported when a table is first built

__all__ = ["simulate", "simulate_summary", "simulate_schedule", "Schedule", "setup_time", "ENGINES"]


ENGINES = ("auto", "compiled", "simpy")
"""``compiled``: :mod:`.fast` (numba; same results, several times faster, arrays instead of
Python objects per task); ``simpy``: this module; ``auto``: compiled where it can run (numba
installed, not the ``spill`` policy) once the process has simulated more than a few tasks (see
:data:`SIMPY_TASKS`), else SimPy."""


def _check(memory_policy: str, streams: int, engine: str, taskgraph: TaskGraph | None = None) -> None:
    program = getattr(taskgraph, "program", None)
    if program is not None and program.coupled is not None:
        raise ValueError("this TaskGraph couples ring steps in one task per class (lowered with coupled_rings=True, "
                         "for the estimate); the simulators time every step: lower it with coupled_rings=False")
    if memory_policy not in POLICIES:
        raise ValueError(f"memory_policy must be one of {POLICIES}, got {memory_policy!r}")
    if streams < 1:
        raise ValueError(f"streams must be >= 1, got {streams}")
    if engine not in ENGINES:
        raise ValueError(f"engine must be one of {ENGINES}, got {engine!r}")


SIMPY_TASKS = 10_000
"""``auto`` simulates on SimPy while the tasks it has simulated in this process stay within
this many: a process that simulates little is done before the compiled engine's code would be
loaded from numba's cache (about a second); one that simulates more (a search) goes compiled."""

SIMPY_TASKS_UNCOMPILED = 50_000
"""The same bound while the compiled engine is not yet in numba's cache (the first run after
installing): SimPy takes a few seconds on so many tasks, compiling the engine about 15 s of CPU. A
larger run compiles it (once: numba keeps it in its cache), so that no size of run stays on
SimPy for good."""

_simpy_tasks = 0  # tasks this process has simulated on SimPy by the rule above


def _compiled(taskgraph: TaskGraph, memory_policy: str, engine: str) -> bool:
    """Whether this run takes the compiled engine (``auto``: where it can run, except within
    :data:`SIMPY_TASKS` (:data:`SIMPY_TASKS_UNCOMPILED` before its first compilation) tasks of
    a process; the same floats either way)."""
    global _simpy_tasks

    from . import fast

    if engine == "simpy":
        return False
    ok = fast.usable(taskgraph, memory_policy)
    if engine == "compiled" and not ok:
        raise RuntimeError("engine 'compiled' needs numba (pip install numba, a dependency of marssim) and a memory "
                           "policy other than 'spill'")
    if ok and engine == "auto":
        limit = SIMPY_TASKS if fast.kernels_cached() else SIMPY_TASKS_UNCOMPILED
        if _simpy_tasks + taskgraph.n_tasks <= limit:
            _simpy_tasks += taskgraph.n_tasks
            return False
    return ok


def simulate(taskgraph: TaskGraph, system: System, *, memory_policy: str = "error", streams: int = 1,
             record: bool = True, setup: bool = True, engine: str = "auto",
             progress: "Progress | None" = None) -> Result:
    """Simulate ``taskgraph`` on ``system`` and return the :class:`Result`.

    ``memory_policy``: ``error`` (raise CapacityError on overflow), ``spill`` (to host DRAM) or
    ``ignore`` (never overflow; the peak is still reported).
    ``streams``: compute tasks a device may run at once. ``record``: keep the memory and link
    timelines (traces need them; searches do not). ``setup``: also simulate the weight loads
    to report ``Result.setup_time``. ``engine``: see :data:`ENGINES` (the same result from
    either). ``progress``: called at most every half second of wall time with a
    :class:`~marssim.progress.SimulationProgress` (simulated seconds so far, tasks ended, tasks)."""
    _check(memory_policy, streams, engine, taskgraph)
    wall = time.perf_counter()
    with gc_paused():
        if _compiled(taskgraph, memory_policy, engine):
            from .fast import run_compiled

            result = run_compiled(taskgraph, system, memory_policy, streams, record, progress=progress)
        else:
            sim = _Simulation(taskgraph, system, memory_policy, streams, record)
            sim.run(progress)
            result = sim.result()
            del sim  # acyclic once run: freed here, before the collector is back
    result.meta["wall_s"] = time.perf_counter() - wall
    if setup and taskgraph.setup:
        result.setup_time = setup_time(taskgraph, system)
    return result


def simulate_summary(taskgraph: TaskGraph, system: System, *, memory_policy: str = "error",
                     streams: int = 1, engine: str = "auto", progress: "Progress | None" = None) -> Summary:
    """Simulate like :func:`simulate` but return only the :class:`Summary`: no interval log, no
    per-resource tables (what a search needs, several times faster on small graphs)."""
    return simulate_schedule(taskgraph, system, memory_policy=memory_policy, streams=streams, engine=engine,
                             progress=progress).summary


def simulate_schedule(taskgraph: TaskGraph, system: System, *, memory_policy: str = "error",
                      streams: int = 1, engine: str = "auto", progress: "Progress | None" = None) -> Schedule:
    """Simulate like :func:`simulate_summary` and keep every task's start and end too (no interval
    log, no per-resource tables)."""
    _check(memory_policy, streams, engine, taskgraph)
    with gc_paused():
        if _compiled(taskgraph, memory_policy, engine):
            from .fast import run_compiled

            return run_compiled(taskgraph, system, memory_policy, streams, False, schedule_only=True,
                                progress=progress)
        sim = _Simulation(taskgraph, system, memory_policy, streams, False)
        sim.run(progress)
        out = Schedule(sim.summary(), np.asarray(sim.start, dtype=float), np.asarray(sim.end, dtype=float))
        del sim  # acyclic once run: freed here, before the collector is back
    return out


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
        steps = tg.steps
        # a stepped transfer (see TaskGraph.steps) sends nbytes / steps per step
        self.nbytes = (tg.nbytes / np.maximum(steps, 1)).tolist() if steps is not None else tg.nbytes.tolist()
        self.steps_left = np.maximum(steps.astype(np.int64) - 1, 0).tolist() if steps is not None else None
        self.steps_total = steps.tolist() if steps is not None else None
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
                                    routes=route_res, weights=[r.weights for r in tg.routes])

        nodes = tg.node_names
        self.pools: dict[int, MemoryPool] = {}
        used_nodes = set(np.unique(tg.mem_node[tg.mem_node >= 0]).tolist())
        used_nodes.update(system.node_index[d] for d in tg.resident)
        for node in sorted(used_nodes):
            name = nodes[node]
            capacity = float("inf") if policy == "ignore" else system.memory_capacity(name)
            self.pools[node] = MemoryPool(env, name, capacity, tg.resident.get(name, 0.0), record=record)
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
        self.net.on_delivered_event = self._finish_step if self.steps_left is not None else self._finish
        self._streams: list = []  # the device processes' generators
        for d in compute_devices:
            for _ in range(streams):
                self._streams.append(self._device(heaps[d], idles[d]))
                env.process(self._streams[-1])

    # ------------------------------------------------------------------ life of a task
    def run(self, progress: "Progress | None" = None) -> None:
        ready = self._ready
        # the tasks without predecessors (listed first: one that ends at once readies others,
        # which must not be readied twice)
        for t in [t for t, w in enumerate(self.waiting) if w == 0]:
            ready(t)
        if progress is None:
            self.env.run()
        else:
            self._run_reporting(progress)
        self._release()
        unfinished = int(np.isnan(np.asarray(self.end, dtype=float)).sum())
        if unfinished:
            raise RuntimeError(f"{unfinished} tasks never ran: the task graph has a cycle or an unreachable dependency")

    def _run_reporting(self, progress: "Progress") -> None:
        """``env.run()`` step by step, calling ``progress`` at most every PROGRESS_EVERY seconds."""
        from .fast import PROGRESS_EVERY

        env, step = self.env, self.env.step

        def report() -> None:
            ended = int(np.count_nonzero(~np.isnan(np.asarray(self.end, dtype=float))))
            progress(SimulationProgress(env.now, ended, self.n))

        last = time.perf_counter()
        try:
            while True:
                for _ in range(4096):
                    step()
                if time.perf_counter() - last >= PROGRESS_EVERY:
                    last = time.perf_counter()
                    report()
        except simpy.core.EmptySchedule:
            pass
        report()

    def _release(self) -> None:
        """Break the reference cycles of a finished run (processes suspended on events that
        will never come, closures and callbacks that refer back to the simulation), so that it
        is freed by reference counting as soon as it is dropped: otherwise the cyclic collector
        traces its ~10 containers per task once, a few ms per large run."""
        for stream in self._streams:
            stream.close()
        self._streams = []
        self.net.close()
        self._allocate = self._dispatch = self._ready = self._complete = self._finish = self._read = None

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

        def read_once(t: int) -> None:  # a stepped transfer's first step has read its inputs
            for p in pred[t]:
                left = readers_left[p] - 1
                readers_left[p] = left
                if left == 0:
                    nb = mem_bytes[p]
                    if nb > 0:
                        pool_of[p].release(nb)
            pred[t] = ()

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
        self._complete, self._finish, self._read = complete, finish, read_once

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
        if self.steps_left is not None:
            self._finish_step(_Arrival(token))
        else:
            self._finish(_Arrival(token))

    def _finish_step(self, event) -> None:
        """A step of a transfer has arrived: start its next step, or finish the task. A stepped
        transfer reads its inputs in its first step (as the first of the steps it stands for
        does), so its predecessors' buffers count it as ended when that step has arrived."""
        t = event._value
        if t < self.n and self.steps_left[t] > 0:
            if self.steps_left[t] == self.steps_total[t] - 1:
                self._read(t)
            self.steps_left[t] -= 1
            if self.is_flow[t]:
                self.net.add_flow(t, self.nbytes[t], self.route[t], self.latency[t])
            else:
                self.net._deliver(t, self.latency[t])
            return
        self._finish(event)

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
        return summarise(self.tg, self.system, np.asarray(self.end, dtype=float), self.streams)

    def result(self) -> Result:
        """The run as a :class:`~marssim.results.Result` (built by the results layer from the
        task times and what only the simulation recorded: spills, memory pools, link usage)."""
        names = self.tg.node_names
        spills = []
        for kind, node, t, s_, e_, nbytes in self.spills:
            host = names[self.host_of[node]]
            src, dst = (names[node], host) if kind == "spill_out" else (host, names[node])
            spills.append(Spill(kind, t, src, dst, s_, e_, nbytes))
        memories = pd.DataFrame.from_dict(
            {pool.name: {"peak_bytes": pool.peak, "capacity_bytes": pool.capacity, "resident_bytes": pool.resident}
             for _, pool in sorted(self.pools.items())},
            orient="index", columns=["peak_bytes", "capacity_bytes", "resident_bytes"])
        memory_timeline = pd.DataFrame([(pool.name, t_, lvl) for pool in self.pools.values() for t_, lvl in pool.timeline],
                                       columns=["node", "time", "bytes"])
        res_names = self.system.resource_names
        link_timeline = pd.DataFrame([(res_names[r], t_, rate, k) for t_, r, rate, k in self.net.timeline],
                                     columns=["resource", "time", "rate", "flows"])
        meta = {"evaluator": "simulation", "tasks": self.n, "events": _events_scheduled(self.env),
                "network_recomputes": self.net.recomputes, "memory_policy": self.policy, "spills": len(self.spills)}
        return build_result(self.tg, self.system, np.asarray(self.start, dtype=float), np.asarray(self.end, dtype=float), streams=self.streams,
                            memories=memories, memory_timeline=memory_timeline, link_timeline=link_timeline,
                            link_busy=np.asarray(self.net.busy), spills=spills, meta=meta)


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
