"""One serving simulation: requests arriving at a deployment's router, replicas iterating, KV
caches moving between pools, every transfer on one contended network. A pure function of its
inputs: :func:`simulate_serving` (deployment, model, system, cost model, requests, seed) ->
:class:`ServeResult`, so it runs in any worker of a ``concurrent.futures`` executor.

Where the replicas run: each pool's replicas take the next free GPUs of the system in its order
(of the pool's GPU design, when it names one), ``tp x pp`` consecutive ones each, the
tensor-parallel ranks innermost, as the parallel placement puts a stage.

Requests arrive at their times (open loop, offline), or, when the :class:`~.requests.Requests`
carry a concurrency, from a closed loop of that many users: each sends the next request of the
stream the instant its previous one ends or is rejected (its arrival is then that instant, in
the result), until the stream or the duration ends.

A request is *rejected* (counted, not simulated) when its replica could never hold it: its prompt
and output need more KV blocks than the replica has (less the watermark), or, with the
``continuous`` and ``static`` schedulers, its prompt exceeds ``max_batched_tokens`` (vLLM ignores
such prompts too).
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field, replace

import numpy as np
import simpy

from marssim.cost.base import CostModel
from marssim.errors import InputError
from marssim.system import System
from marssim.workload.llm.config import TransformerConfig

from .deployment import Deployment, check_deployment
from .disagg import kv_plan
from .engine import Replica
from .fabric import Fabric
from .hosttime import host_time
from .itermodel import IterationModel
from .memory import ReplicaMemory, replica_memory
from .metrics import ITERATION_COLUMNS, SLO, ConstraintsMissed, Recorder, WatchedRecorder, summarise
from .poolcheck import check_pool
from .requests import Requests, RequestSpec
from .router import Router
from .sequence import Seq
from .speculative import SpecTimer, draft_config, draft_memory

__all__ = ["simulate_serving", "simulate_spec", "ServeResult", "ReplicaInfo", "place_replicas",
           "iteration_model"]


@dataclass(frozen=True)
class ReplicaInfo:
    """Where a replica runs and what it holds."""

    index: int
    pool: int
    role: str
    gpus: tuple[tuple[str, ...], ...]  # per stage, tensor-parallel order
    design: str
    memory: ReplicaMemory
    experts: str = ""  # a mixture of experts: what times its experts (IterationModel.experts_timing)
    kernels: str = ""  # what times its GPU design's kernels and collectives (cost.model.kernel_sources)


@dataclass(frozen=True, eq=False)
class ServeResult:
    """A serving simulation's records and figures (see :mod:`.metrics`)."""

    deployment: Deployment
    model: TransformerConfig
    system: str
    requests: Requests
    slo: SLO
    replicas: tuple[ReplicaInfo, ...]
    per_request: dict[str, np.ndarray]
    iterations: dict[str, np.ndarray]
    iteration_requests: tuple[np.ndarray, np.ndarray] | None
    transfers: dict[str, np.ndarray]
    gaps: np.ndarray
    summary: dict
    meta: dict = field(default_factory=dict)


def place_replicas(system: System, deployment: Deployment,
                   where: str = "deployment") -> list[tuple[int, tuple[tuple[str, ...], ...]]]:
    """``(pool index, GPUs per stage)`` of every replica, pool by pool (see the module docstring)."""
    free = list(system.accelerator_ids)
    out = []
    for p, pool in enumerate(deployment.pools):
        if pool.gpu:
            kinds = {system.accelerator(a).designs[0] for a in system.accelerator_ids}
            if pool.gpu not in kinds:
                raise InputError(where, f"pools[{p}].gpu", f"expected a GPU design of {system.spec} "
                                                           f"({', '.join(sorted(kinds))}), got {pool.gpu!r}")
        matching = [a for a in free if not pool.gpu or system.accelerator(a).designs[0] == pool.gpu]
        need = pool.gpus
        if need > len(matching):
            kind = f" of design {pool.gpu}" if pool.gpu else ""
            raise InputError(where, f"pools[{p}].replicas", f"{pool.replicas} replicas of tp {pool.tp} x pp {pool.pp} "
                                                            f"need {need} GPUs{kind}; {len(matching)} are free on "
                                                            f"{system.spec}")
        taken = matching[:need]
        for r in range(pool.replicas):
            gpus = taken[r * pool.gpus_per_replica:(r + 1) * pool.gpus_per_replica]
            out.append((p, tuple(tuple(gpus[s * pool.tp:(s + 1) * pool.tp]) for s in range(pool.pp))))
        chosen = set(taken)
        free = [a for a in free if a not in chosen]
    return out


class _Cluster:
    """The simulation's state beside the replicas: routers, disaggregated handoffs, arrivals."""

    def __init__(self, env: simpy.Environment, deployment: Deployment, model: TransformerConfig, system: System,
                 cost: CostModel, requests: Requests, seed: int, recorder: Recorder, fabric: Fabric) -> None:
        self.env = env
        self.dep = deployment
        self.model = model
        self.fabric = fabric
        self.recorder = recorder
        self.requests = requests
        self.replicas: list[Replica] = []
        self.infos: list[ReplicaInfo] = []
        drafts: dict[int, TransformerConfig] = {}
        from marssim.cost.model import kernel_sources  # for the report only: not at import

        for p, stages in place_replicas(system, deployment):
            pool = deployment.pools[p]
            check_pool(pool, model, "deployment", f"pools[{p}].")
            design = system.accelerator(stages[0][0]).designs[0]
            fused = pool.scheduler.fused_elementwise
            im = _iteration_model(model, system, stages, cost, deployment.context_bucket, pool.ep, fused)
            capacity = system.accelerator(stages[0][0]).memory.capacity
            spec = None
            draft = (0.0, 0.0)
            if pool.scheduler.speculative:
                if p not in drafts:
                    drafts[p] = draft_config(model, pool, "deployment", f"pools[{p}].")
                draft_im = _iteration_model(drafts[p], system, stages, cost, deployment.context_bucket, 1, fused)
                spec = SpecTimer(im, draft_im, pool.scheduler)
                draft = draft_memory(draft_im, pool.scheduler.spec_method)
            mem = replica_memory(im, pool.scheduler, capacity, where=f"pools[{p}]", draft=draft)
            swap = int(pool.scheduler.swap_space // max(mem.block_bytes(s) for s in range(pool.pp))) \
                if pool.scheduler.preemption == "swap" else 0
            index = len(self.replicas)
            rep = Replica(env, index, p, pool.role, stages, im, pool.scheduler, mem.blocks, swap,
                          tuple(mem.block_bytes(s) for s in range(pool.pp)), fabric, recorder, self,
                          tp_network=deployment.tp_comm == "network", spec=spec, seed=seed,
                          host=host_time(pool.scheduler.engine, pool.scheduler.cuda_graphs, im,
                                         pool.scheduler.overlap))
            self.replicas.append(rep)
            self.infos.append(ReplicaInfo(index, p, pool.role, stages, design, mem, im.experts_timing,
                                          kernel_sources(system.designs[design])))
        front = [r for r in self.replicas if r.role in ("both", "prefill")]
        self.decoders = [r for r in self.replicas if r.role == "decode"]
        self.router = Router(deployment.router, front, seed)
        self.decode_router = Router(deployment.decode_router, self.decoders, seed + 1) if self.decoders else None
        self.pending: dict[int, deque] = {r.index: deque() for r in self.decoders}
        self._plans: dict[tuple[int, int], list] = {}
        self.sent = 0  # closed loop: requests sent so far
        self.exhausted = False  # closed loop with a duration: a user found no request left before it
        self.done: dict[int, simpy.Event] = {}
        if requests.concurrency:
            recorder.on_finish = self.request_done
            for _ in range(min(requests.concurrency, len(requests))):
                env.process(self._user())
        else:
            env.process(self._arrivals())

    # ------------------------------------------------------------------ arrivals
    def _admissible(self, rep: Replica, prompt: int, output: int) -> bool:
        cfg = rep.cfg
        bm = rep.engines[0].scheduler.bm
        if rep.role == "prefill":
            fits = bm.blocks(prompt) <= bm.total - bm.watermark
            fits = fits and all(bm.blocks(prompt + output + d.cfg.lookahead) <= d.engines[0].scheduler.bm.total -
                                d.engines[0].scheduler.bm.watermark for d in self.decoders)
        else:
            fits = bm.blocks(prompt + output + cfg.lookahead) <= bm.total - (0 if cfg.kind == "static" else
                                                                               bm.watermark)
        if cfg.kind == "continuous" and prompt > cfg.max_batched_tokens:
            fits = False
        if self.model.positions == "learned" and prompt + output > self.model.max_positions:
            fits = False  # beyond the table of learned positions
        return fits

    def _arrivals(self):
        env = self.env
        arrival = self.requests.arrival
        for i in range(len(self.requests)):
            t = float(arrival[i])
            if t > env.now:
                yield env.timeout(t - env.now)
            self._send(i, t)

    def _send(self, i: int, t: float) -> bool:
        """Request ``i`` arrives at the router at ``t`` (now): False when it is rejected (see the module
        docstring)."""
        env = self.env
        req = self.requests
        rec = self.recorder
        p, o = int(req.prompt[i]), int(req.output[i])
        rep = self.router.pick()
        if not self._admissible(rep, p, o):
            rec.rejected[i] = True
            if rec.stops_on_reject:
                raise ConstraintsMissed(f"request {i} rejected", env.now)
            return False
        prefix = req.prefix
        seq = Seq(i, t, p, o, int(prefix[i]) if prefix is not None else -1,
                  int(req.prefix_tokens[i]) if prefix is not None else 0)
        rec.replica[i] = rep.index
        rec.arrived(env.now)
        rep.enqueue(seq)
        return True

    # ------------------------------------------------------------------ a closed loop of users
    def _user(self):
        """One user of a closed loop: the next request of the stream the instant its previous one
        ends (or is rejected), while the duration lasts. An engine iteration that starts at that
        instant has formed its batch already: the request joins the next one, as an engine adds
        requests between its steps."""
        env = self.env
        n = len(self.requests)
        duration = self.requests.duration
        while True:
            if duration and env.now >= duration:
                return
            if self.sent >= n:
                self.exhausted = bool(duration)
                return
            i = self.sent
            self.sent += 1
            self.recorder.sent_at[i] = env.now
            if self._send(i, env.now):
                done = self.done[i] = env.event()
                yield done

    def request_done(self, i: int) -> None:
        """Request ``i`` has its last token: its user (closed loop) sends the next one."""
        event = self.done.pop(i, None)
        if event is not None:
            event.succeed()

    # ------------------------------------------------------------------ the replicas' events
    def handoff(self, s: Seq, src: Replica, scheduler, now: float) -> None:
        """``s`` is prefilled on ``src``: pick its decode replica, reserve its blocks there (or
        queue until they free up), then move its KV cache."""
        dst = self.decode_router.pick()
        self.recorder.decode_replica[s.id] = dst.index
        dst.assigned += 1
        dst.outstanding += s.output - s.generated
        self.pending[dst.index].append((s, src, scheduler))
        self.retry_pending(dst)

    def pending_of(self, rep: Replica) -> bool:
        q = self.pending.get(rep.index)
        return bool(q)

    def retry_pending(self, dst: Replica) -> None:
        q = self.pending[dst.index]
        while q:
            s, src, scheduler = q[0]
            ve = dst.engine_for()
            bm = ve.scheduler.bm
            need = bm.blocks(ve.scheduler.reserve_tokens(s))
            if not bm.can_admit(need):
                break
            q.popleft()
            bm.take(need)
            self.env.process(self._move(s, src, scheduler, dst, ve, need))

    def _move(self, s: Seq, src: Replica, scheduler, dst: Replica, ve, blocks: int):
        key = (src.index, dst.index)
        plan = self._plans.get(key)
        if plan is None:
            plan = self._plans[key] = kv_plan(self.model, src.gpus, dst.gpus)
        tokens = s.computed
        start = self.env.now
        yield self.fabric.transfers([(a, b, per * tokens) for a, b, per in plan], "kv", s.id)
        self.recorder.kv_start[s.id] = start
        self.recorder.kv_end[s.id] = self.env.now
        scheduler.release(s)
        src.engine_of(scheduler).wake()
        s.blocks = blocks
        s.replica = dst.index
        s.ve = ve.scheduler
        ve.scheduler.incoming.append(s)
        ve.wake()


_MODELS: dict[tuple, tuple[CostModel, System, IterationModel]] = {}


def _iteration_model(model: TransformerConfig, system: System, stages: tuple[tuple[str, ...], ...], cost: CostModel,
                     bucket: int, ep: int = 1, fused: bool = False) -> IterationModel:
    """The iteration-time model of a replica on ``stages``, shared by every replica (of this and
    later simulations in this process, on the same system object and cost model) whose stages
    have the same design and ring routes: their memo of iteration pieces is shared too."""
    first = stages[0][0]
    acc = system.accelerator(first)
    key = (model, len(stages[0]), len(stages), id(system), acc.designs[0], id(cost), bucket, ep, fused,
           tuple(tuple(_ring_signature(system, s)) for s in stages))
    hit = _MODELS.get(key)
    if hit is not None and hit[0] is cost and hit[1] is system:
        return hit[2]
    if len(_MODELS) >= 32:
        _MODELS.clear()
    im = IterationModel(model, system, stages, cost, context_bucket=bucket, ep=ep, fused_elementwise=fused)
    _MODELS[key] = (cost, system, im)
    return im


def iteration_model(model: TransformerConfig, system: System, stages: tuple[tuple[str, ...], ...], cost: CostModel,
                    bucket: int = 1, ep: int = 1, fused: bool = False) -> IterationModel:
    """The iteration-time model a simulation would give a replica on ``stages`` (the same object,
    with its memo, for every replica of the same design and ring routes in this process)."""
    return _iteration_model(model, system, stages, cost, bucket, ep, fused)


def _ring_signature(system: System, gpus: tuple[str, ...]) -> list[tuple[float, float]]:
    cap = system.resource_capacity
    out = []
    for i, g in enumerate(gpus):
        route = system.route(g, gpus[(i + 1) % len(gpus)])
        out.append((route.latency, min((float(cap[r]) for r in route.resources), default=math.inf)))
    return out


def simulate_serving(deployment: Deployment, model: TransformerConfig, system: System, cost: CostModel,
                     requests: Requests, *, seed: int = 0, slo: SLO = SLO(), trace: bool = False,
                     stop_when_missed: tuple = ()) -> ServeResult:
    """Serve ``requests`` with ``deployment`` of ``model`` on ``system``, every iteration timed by
    ``cost`` (see the module docstring); ``seed`` drives the random router; ``trace`` keeps the
    requests of every iteration and every transfer (for :mod:`.outputs`' Perfetto trace).
    ``stop_when_missed``: bounds ``(metric, quantile, limit s)`` on percentiles of ``ttft``,
    ``tbt``, ``tpot``, ``e2e``, ``queue``: the run stops with
    :class:`~.metrics.ConstraintsMissed` as soon as one can no longer be met, or a request is
    rejected (:class:`~.metrics.WatchedRecorder`); a run that meets them is the same run."""
    check_deployment(deployment)
    env = simpy.Environment()
    n = len(requests)
    if stop_when_missed:
        recorder = WatchedRecorder(n, stop_when_missed, requests.output, requests_per_iteration=trace)
    else:
        recorder = Recorder(n, requests_per_iteration=trace)
    fabric = Fabric(env, system, log=True if trace else ("kv", "swap_out", "swap_in"))
    cluster = _Cluster(env, deployment, model, system, cost, requests, seed, recorder, fabric)
    env.run()
    fabric.close()
    if requests.concurrency:  # a closed loop: the requests sent, arriving when their users sent them
        sent = cluster.sent
        recorder.keep(sent)
        requests = Requests(recorder.sent_at.copy(), requests.prompt[:sent], requests.output[:sent],
                            requests.source,
                            requests.prefix[:sent] if requests.prefix is not None else None,
                            requests.prefix_tokens[:sent] if requests.prefix_tokens is not None else None,
                            requests.concurrency, requests.duration)
    done = np.isfinite(recorder.finish)
    accepted = ~recorder.rejected
    if (done != accepted).any() or (recorder.finished_count[accepted] != 1).any():
        stuck = np.flatnonzero(accepted & ~done)
        raise RuntimeError(f"{len(stuck)} requests never finished (first: {stuck[:5].tolist()}); "
                           "the schedulers left work behind")
    iterations = {c: np.frombuffer(recorder.iterations[c], dtype=float).copy() for c in ITERATION_COLUMNS}
    for c in ("replica", "engine", "prefill_tokens", "decode_tokens", "prefill_seqs", "decode_seqs", "kv_blocks",
              "kv_capacity", "waiting", "running", "swapped"):
        iterations[c] = iterations[c].astype(np.int64)
    transfers = {c: np.frombuffer(fabric.rows[c], dtype=float).copy() for c in fabric.rows}
    summary = summarise(requests.arrival, requests.output, recorder, iterations, deployment.gpus, slo,
                        requests.prompt)
    summary["kv_transfer_s"] = _kv_stats(recorder)
    per_request = {
        "arrival_s": requests.arrival, "prompt_tokens": requests.prompt, "output_tokens": requests.output,
        "replica": recorder.replica, "decode_replica": recorder.decode_replica, "rejected": recorder.rejected,
        "started_s": recorder.started_at, "first_token_s": recorder.first, "finish_s": recorder.finish,
        "preemptions": recorder.preemptions, "max_tbt_s": recorder.gap_max, "kv_transfer_start_s": recorder.kv_start,
        "kv_transfer_end_s": recorder.kv_end,
    }
    it_requests = None
    if trace:
        it_requests = (np.frombuffer(recorder.iteration_requests, dtype=np.int64).copy(),
                       np.frombuffer(recorder.iteration_offsets, dtype=np.int64).copy())
    meta = {"network_bytes": fabric.bytes_moved, "network_recomputes": fabric.net.recomputes,
            "little_area": recorder.area, "node_names": system.nodes, "requests_exhausted": cluster.exhausted}
    if requests.concurrency:
        summary["concurrency"] = requests.concurrency
    return ServeResult(deployment, model, system.spec, requests, slo, tuple(cluster.infos), per_request, iterations,
                       it_requests, transfers, np.frombuffer(recorder.gaps, dtype=float).copy(), summary, meta)


def simulate_spec(deployment: Deployment, model: TransformerConfig, system: System, cost: CostModel,
                  spec: RequestSpec, *, seed: int = 0, slo: SLO = SLO(), trace: bool = False) -> ServeResult:
    """:func:`simulate_serving` of the requests ``spec`` draws with ``seed``. A closed loop with a
    duration (:func:`~.requests.closed_loop`) whose users ran out of requests before the duration
    ended is run again with twice the count (drawn afresh with the seed), until the duration ends
    first (so the count is a cap the run grows, not a setting that changes the run's length)."""
    while True:
        result = simulate_serving(deployment, model, system, cost, spec.draw(seed), seed=seed, slo=slo, trace=trace)
        if not result.meta["requests_exhausted"]:
            return result
        if spec.count >= MAX_CLOSED_LOOP_REQUESTS:
            raise InputError(None, "--duration", f"{spec.count:,} requests are sent before "
                                                 f"{spec.arrivals.duration:g} s; expected a shorter duration")
        spec = replace(spec, count=min(2 * spec.count, MAX_CLOSED_LOOP_REQUESTS))


MAX_CLOSED_LOOP_REQUESTS = 10_000_000


def _kv_stats(rec: Recorder) -> dict:
    d = rec.kv_end - rec.kv_start
    d = d[np.isfinite(d)]
    if not len(d):
        return {}
    return {"mean": float(d.mean()), "p99": float(np.percentile(d, 99)), "count": int(len(d))}
