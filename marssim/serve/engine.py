"""A model replica as SimPy processes: its engines' iteration loops over its pipeline stages.

A replica of ``tp x pp`` GPUs runs ``pp`` virtual engines (vLLM's arrangement for pipeline
parallelism), each a process with its own scheduler (:mod:`.schedulers`) and ``1/pp`` of the KV
cache's blocks, so up to ``pp`` iterations are in flight, one per stage. An iteration:

1. the scheduler picks the batch (and the blocks to swap, which move first, over each GPU's link
   to its host, as flows of the network);
2. stage by stage: the stage is held for its compute time (:class:`~.itermodel.IterationModel`,
   memoised by shape; with ``tp_comm=network`` the tensor-parallel collectives of the iteration are
   flows of the network instead of their closed form), then every tensor-parallel rank sends the
   batch's hidden states to its peer on the next stage (flows of the network);
   With speculative decoding (``pp = 1``; :mod:`.speculative`) the replica is held for the
   draft's passes and then the verification pass;
3. at the end of the last stage the sampled tokens exist (their time is the token's time); with
   ``pp > 1`` they go back to the first stage before that engine's next iteration.

With a pool's ``engine`` other than ``none`` the first stage's time is the iteration's with the
host's work (:mod:`.hosttime`: scheduling, inputs, sampling, output processing and the kernels'
launches, overlapped with the GPU as the engine does); with ``none`` the engine does not wait for
anything between iterations.
"""

from __future__ import annotations

import numpy as np
import simpy

from .batchshape import batch_shape
from .fabric import Fabric
from .hosttime import HostTime
from .itermodel import IterationModel
from .kvcache import BlockManager
from .schedulers import Scheduler, Work
from .sequence import Seq
from .speculative import draw_accepted

__all__ = ["Replica", "VirtualEngine"]


class VirtualEngine:
    """One engine loop of a replica (see the module docstring)."""

    def __init__(self, replica: "Replica", index: int, scheduler: Scheduler) -> None:
        self.replica = replica
        self.index = index
        self.scheduler = scheduler
        self.idle: simpy.Event | None = None

    def wake(self) -> None:
        """Start the loop again if it waits for work."""
        if self.idle is not None and not self.idle.triggered:
            self.idle.succeed()

    def run(self):
        rep = self.replica
        env = rep.env
        sched = self.scheduler
        model = rep.model
        timeout = env.timeout
        pp = model.pp
        record = rep.recorder.iteration
        host = rep.host
        while True:
            work = sched.schedule(env.now)
            if work is None:
                self.idle = env.event()
                yield self.idle
                self.idle = None
                continue
            if work.swap_out or work.swap_in:
                yield from rep.swap(work)
            start = env.now
            if rep.spec is not None and (work.prefills or work.decodes):
                spec = rep.spec
                drafting = spec.draft_time(work)
                shape = spec.verify_shape(work)
                seqs = len(work.prefills) + len(work.decodes)
                if rep.tp_network:
                    part = model.stage_parts(*shape)[0]
                    if host is not None:
                        gpu = drafting + part[0]
                        yield timeout(host.step(gpu, seqs, not work.prefills) - gpu)
                    yield timeout(drafting)
                    yield from rep.stage_on_network(0, part)
                elif host is not None:
                    yield timeout(host.step(drafting + model.stage_times(*shape)[0], seqs, not work.prefills))
                else:
                    yield timeout(drafting + model.stage_times(*shape)[0])
                rep.recorder.spec_time(drafting, env.now - start - drafting)
                tokens = 0
            elif work.prefills or work.decodes:
                shape, tokens = batch_shape(work)
                seqs = len(work.prefills) + len(work.decodes)
                if rep.tp_network:
                    for s, part in enumerate(model.stage_parts(*shape)):
                        if s == 0 and host is not None:  # the host's time beyond the stage's compute
                            yield timeout(host.step(part[0], seqs, not work.prefills) - part[0])
                        if pp > 1:
                            held = rep.stages[s].request()
                            yield held
                        yield from rep.stage_on_network(s, part)
                        if pp > 1:
                            rep.stages[s].release(held)
                            if s < pp - 1:
                                yield rep.pipeline_send(s, tokens)
                elif pp == 1:
                    gpu = model.stage_times(*shape)[0]
                    yield timeout(gpu if host is None else host.step(gpu, seqs, not work.prefills))
                else:
                    times = model.stage_times(*shape)
                    if host is not None:
                        times = (host.step(times[0], seqs, not work.prefills),) + tuple(times[1:])
                    for s in range(pp):
                        with rep.stages[s].request() as held:
                            yield held
                            yield timeout(times[s])
                        if s < pp - 1:
                            yield rep.pipeline_send(s, tokens)
            else:
                tokens = 0
            end = env.now
            sched.complete(work, end)
            record(rep.index, self.index, start, end, work, sched)
            rep.after_iteration(self)
            if pp > 1 and (work.prefills or work.decodes):
                rows = sum(1 for s, q in work.prefills if s.computed >= s.target) + len(work.decodes)
                if rows:
                    yield rep.token_return(rows)


class Replica:
    """A replica: its GPUs per stage, virtual engines, stage resources and counters; the sink of
    its schedulers' events (forwarded to the recorder)."""

    def __init__(self, env: simpy.Environment, index: int, pool: int, role: str, stages: tuple[tuple[str, ...], ...],
                 model: IterationModel, cfg, blocks: int, swap_blocks: int, block_bytes: tuple[float, ...],
                 fabric: Fabric, recorder, cluster, tp_network: bool = False, spec=None, seed: int = 0,
                 host: HostTime | None = None) -> None:
        """``spec``: the :class:`~.speculative.SpecTimer` of a pool that decodes speculatively
        (its acceptances drawn from a generator seeded by ``seed``, the replica and the engine);
        ``host``: the engine's host time per iteration (None: none)."""
        self.env = env
        self.index = index
        self.pool = pool
        self.role = role
        self.gpus = stages
        self.model = model
        self.cfg = cfg
        self.fabric = fabric
        self.recorder = recorder
        self.cluster = cluster
        self.tp_network = tp_network and len(stages[0]) > 1
        self.block_bytes = block_bytes  # per GPU of each stage
        pp = len(stages)
        self.stages = [simpy.Resource(env, 1) for _ in range(pp)] if pp > 1 else []
        self.outstanding = 0  # prompt and output tokens still to process here
        self.assigned = 0  # requests here and not done or handed over
        self.engines: list[VirtualEngine] = []
        per = blocks // pp
        swap_per = swap_blocks // pp
        self.spec = spec
        self.host = host
        for v in range(pp):
            bm = BlockManager(per, cfg.block_size, cfg.watermark, swap_per)
            accept = None
            if spec is not None:
                accept = _acceptance(np.random.default_rng([seed, index, v]), cfg.spec_k, cfg.spec_alpha)
            self.engines.append(VirtualEngine(self, v, Scheduler(cfg, bm, role, self, accept)))
        self.blocks = per * pp
        for ve in self.engines:
            env.process(ve.run())

    # ------------------------------------------------------------------ work in
    def engine_for(self) -> VirtualEngine:
        """The virtual engine with the fewest unfinished requests (the first on ties)."""
        engines = self.engines
        if len(engines) == 1:
            return engines[0]
        return min(engines, key=lambda ve: (ve.scheduler.unfinished, ve.index))

    def enqueue(self, seq: Seq) -> None:
        """A new request routed here."""
        ve = self.engine_for()
        seq.replica = self.index
        seq.ve = ve.scheduler
        self.assigned += 1
        self.outstanding += seq.outstanding
        ve.scheduler.waiting.append(seq)
        ve.wake()

    def stage_on_network(self, stage: int, part: tuple[float, float, int]):
        """A stage's iteration with its tensor-parallel collectives as flows: the compute and the
        collectives' step latencies but one route latency, then every rank sends its ring
        neighbour the collectives' bytes (alone on its route: one more latency and the bytes over
        the bandwidth, which is the closed form on a ring of equal hops; slower where other flows
        share the links)."""
        compute, nbytes, latency = part
        hops = self.model.ring_hops(stage)
        lead = max(0.0, latency - max(lat for lat, _ in hops)) if nbytes > 0 else latency
        yield self.env.timeout(compute + lead)
        if nbytes > 0:
            gpus = self.gpus[stage]
            yield self.fabric.transfers([(g, gpus[(i + 1) % len(gpus)], nbytes) for i, g in enumerate(gpus)], "tp")

    # ------------------------------------------------------------------ transfers
    def pipeline_send(self, stage: int, tokens: int) -> simpy.Event:
        """Each rank of ``stage`` sends the hidden states of ``tokens`` tokens to its peer."""
        nbytes = self.model.activation_bytes(tokens)
        src, dst = self.gpus[stage], self.gpus[stage + 1]
        return self.fabric.transfers([(a, b, nbytes) for a, b in zip(src, dst)], "pipeline")

    def token_return(self, rows: int) -> simpy.Event:
        """The sampled tokens of ``rows`` sequences from the last stage to the first."""
        nbytes = self.model.token_bytes(rows)
        return self.fabric.transfers([(a, b, nbytes) for a, b in zip(self.gpus[-1], self.gpus[0])], "token")

    def swap(self, work: Work):
        """Blocks swapped out and in before an iteration, over each GPU's route to its host: a
        flow per request and GPU (the request's blocks of that GPU's stage)."""
        system = self.fabric.system
        events = []
        for moved, kind in ((work.swapped_out, "swap_out"), (work.swapped_in, "swap_in")):
            for request, blocks in moved:
                for s, gpus in enumerate(self.gpus):
                    nbytes = blocks * self.block_bytes[s]
                    for g in gpus:
                        host = system.nearest_host(g)
                        src, dst = (g, host) if kind == "swap_out" else (host, g)
                        events.append(self.fabric.transfer(src, dst, nbytes, kind, request))
        if events:
            yield simpy.AllOf(self.env, events)

    # ------------------------------------------------------------------ the schedulers' events
    def started(self, s: Seq, now: float) -> None:
        self.recorder.started(s, now)

    def progress(self, s: Seq, tokens: int) -> None:
        self.outstanding -= tokens

    def rework(self, s: Seq, tokens: int) -> None:
        self.outstanding += tokens

    def first_token(self, s: Seq, now: float) -> None:
        self.outstanding -= 1
        self.recorder.first_token(s, now)

    def gap(self, s: Seq, gap: float) -> None:
        self.outstanding -= 1
        self.recorder.gap(s, gap)

    def speculated(self, steps: int, proposed: int, accepted: int, emitted: int) -> None:
        self.recorder.speculated(steps, proposed, accepted, emitted)

    def preempted(self, s: Seq) -> None:
        self.recorder.preempted(s)

    def finished(self, s: Seq, now: float) -> None:
        self.assigned -= 1
        self.recorder.finished(s, now)

    def handoff(self, s: Seq, now: float, scheduler: Scheduler) -> None:
        self.assigned -= 1
        self.outstanding -= s.output - s.generated
        self.cluster.handoff(s, self, scheduler, now)

    def engine_of(self, scheduler: Scheduler) -> VirtualEngine:
        return next(ve for ve in self.engines if ve.scheduler is scheduler)

    def after_iteration(self, ve: VirtualEngine) -> None:
        if self.cluster.pending_of(self):
            self.cluster.retry_pending(self)


def _acceptance(rng: np.random.Generator, k: int, alpha: float):
    """``accept(n)``: the accepted proposals of ``n`` speculative steps, drawn from ``rng``."""
    def accept(n: int) -> np.ndarray:
        return draw_accepted(rng, n, k, alpha)
    return accept
