"""A closed-form estimate of a parallel configuration, for screening many candidates quickly.

Built from the same pieces as the lowering (the ops' tensor-parallel rules and shards, timed by
the same cost model; the same collectives over the same routes), but composed by formula instead
of by a schedule:

* per stage and micro-batch, the forward and the backward time of one representative block
  (the blocks of a model are alike) times the stage's blocks, plus its embedding or head: every
  kernel's time, and every collective as ring steps ``steps * (latency + chunk / bandwidth)`` on
  the route to the GPU's ring neighbour, and the activation received from the previous stage;
* the pipeline: ``sum over stages of t_s + (m - 1) * max over stages of t_s`` (the first
  micro-batch crosses every stage, the others follow at the slowest stage's pace; GPipe and 1F1B
  alike), ``(m + (p - 1) / v) * t`` for the interleaved schedule of uniform stages;
* the overlap settings by their closed forms: a context-parallel attention core as its ring
  (:func:`.context.forward_ring_end`, :func:`.context.backward_ring_end`), a GEMM with its
  overlapped all-gather or reduce-scatter (:func:`.userbuffers.ring_exchange_end`,
  :func:`.userbuffers.pipeline_end`); with ``overlap_p2p_comm`` off a stage's sends add to its
  time per micro-batch;
* after the last backward: the data-parallel reduction of the last gradient bucket (the earlier
  ones overlap the backward; all of them when ``overlap_grad_reduce`` is off), the
  sequence-parallel norms' and the tied embedding's all-reduces, the optimizer step's kernels and
  all-reduces and its FP8 weight casts, and ZeRO-1/2's parameter all-gather (with
  ``overlap_param_gather`` before the first forward instead: the part of it the first
  micro-batch's forward does not hide); a stage's tail overlapping the last backward of the
  stages before it (not the last stage's when it waits for the first stage's embedding
  gradient);
* ZeRO-3: per forward and backward unit, the time its kernels wait for the module-by-module
  parameter all-gathers (:func:`.zero3.unit_seconds` over the unit's kernels and gathers);
* memory: :func:`.memory.memory_estimate`.

It ignores contention and the finer overlap of the schedule, so it is a ranking, not a
prediction: the search simulates the candidates it ranks best. ``tests/test_parallel_search.py``
measures its error and rank correlation against simulations.
"""

from __future__ import annotations

import itertools
import math
import weakref
from collections import defaultdict
from dataclasses import dataclass, field

from marssim.collectives.group import ring_time, route_bottleneck
from marssim.cost.base import CostModel
from marssim.system import System
from marssim.workload import Graph, OpKind

from . import context, experts, overlap, userbuffers, zero3
from .config import ParallelConfig
from .fold import Folding, binding_route, identity_folding
from .lower import _Lowering, _model_flops, _parameters, graph_cached, prepare_graph
from .host import launch_gaps
from .megatron import grad_scaled, sequence_parallel_params
from .memory import MemoryEstimate, memory_estimate
from .placement import Placement, place

__all__ = ["Screen", "screen", "serving_times"]


@dataclass(frozen=True)
class Screen:
    """The closed-form figures of one configuration (seconds, FLOPs, bytes)."""

    iteration_s: float
    stage_s: tuple[float, ...]  # forward + backward of one micro-batch, per stage
    tail_s: float  # data-parallel reduction, optimizer and parameter gather after the pipeline
    memory: MemoryEstimate
    model_flops: float
    peak_flops: float
    gpus: int

    @property
    def fits(self) -> bool:
        return self.memory.fits

    @property
    def mfu(self) -> float:
        if not self.iteration_s or not self.peak_flops:
            return 0.0
        return self.model_flops / self.gpus / self.iteration_s / self.peak_flops


class _Timer:
    """Times units of one stage's representative GPU by the lowering's rules and shards."""

    def __init__(self, low: _Lowering, gpu: int) -> None:
        self.low = low
        self.gpu = gpu
        self.patterns = low.place.patterns()
        self.system = low.system
        self._ring_cache: dict[tuple, float] = {}
        self._signature: tuple | None = None

    def route_time(self, src: int, dst: int, nbytes: float) -> float:
        route = self.system.route(self.system.nodes[src], self.system.nodes[dst])
        cap = self.system.resource_capacity
        bw = min((float(cap[r]) for r in route.resources), default=float("inf"))
        return route.latency + (nbytes / bw if nbytes > 0 else 0.0)

    def ring(self, pattern: str, n: int, size: float, kind: str) -> float:
        """Seconds of a collective over ``pattern``'s ring of ``n`` ranks, as the lowering runs it
        (:meth:`.lower._Builder.ring`): NCCL's plan, its steps at the pace of the slowest hop
        (:func:`marssim.collectives.group.hop_step`); without a plan, ring steps at line rate."""
        if n <= 1 or size <= 0:
            return 0.0
        key = (pattern, n, size, kind)
        hit = self._ring_cache.get(key)
        if hit is None:
            members, profile = self.ring_hops(pattern, n)
            plan = self.low.plan(kind, size, members)
            if plan is None:  # a ring's steps go at the pace of its slowest hop
                hit = ring_time(kind, size, n, profile).seconds
            else:  # one plan's step on each kind of hop: shared by every stage's ring alike
                memo = self.low.memo
                hit = memo.get(("ring steps", plan, profile))
                if hit is None:
                    hit = memo[("ring steps", plan, profile)] = ring_time(kind, size, n, profile, plan).seconds
            self._ring_cache[key] = hit
        return hit

    def ring_hops(self, pattern: str, n: int) -> tuple[list[int], frozenset]:
        """The ``n`` GPUs of ``pattern``'s ring from this one, and its hops' kinds: the set of
        (latency s, bottleneck bytes/s) over its hops (:meth:`.lower._Lowering.hop`'s inputs)."""
        key = ("hops", pattern, n)
        hit = self._ring_cache.get(key)
        if hit is None:
            peer = self.patterns[pattern]
            members = [self.gpu]
            while len(members) < n:
                members.append(peer(members[-1]))
            ring = (tuple(members), peer(members[-1]))
            layout = getattr(self.low, "layout", None)
            known = layout.hops.get(ring) if layout is not None else None
            if known is not None:
                hit = self._ring_cache[key] = (members, known)
                return hit
            cap = self.system.resource_capacity
            names = self.system.nodes
            low = self.low
            profile = set()
            for g in members:
                nxt = peer(g)
                route = binding_route(self.system, names[g], names[nxt])
                profile.add((low.fold.latency(g, nxt), route_bottleneck(cap, route.resources)))
            hit = self._ring_cache[key] = (members, frozenset(profile))
            if layout is not None:
                layout.hops[ring] = hit[1]
        return hit

    def signature(self) -> tuple:
        """What the time of a block depends on beyond its ops and its chunk's place: the GPU's
        design, its stage's tensor-parallel degree, the hops of its tensor-parallel ring and the
        routes from the GPUs of the stages before and after it (latency and bottleneck of each)."""
        if self._signature is not None:
            return self._signature
        low = self.low
        tp = low.tp_here(self.gpu)
        cap = self.system.resource_capacity
        hops = ()
        if tp > 1 and "tp+1" in self.patterns:
            peer = self.patterns["tp+1"]
            members = [self.gpu]
            while len(members) < tp:
                members.append(peer(members[-1]))
            routes = [self.system.route(self.system.nodes[g], self.system.nodes[peer(g)]) for g in members]
            hops = tuple((r.latency, min((float(cap[x]) for x in r.resources), default=float("inf"))) for r in routes)
        here = low.place.stage(self.gpu)
        sides = []
        for other in ((here - 1) % low.cfg.pp, (here + 1) % low.cfg.pp):  # activations and gradients received
            peer = low.gpu_on_stage(self.gpu, other)
            r = self.system.route(self.system.nodes[peer], self.system.nodes[self.gpu]) if peer != self.gpu else None
            sides.append((r.latency, min((float(cap[x]) for x in r.resources), default=float("inf"))) if r else None)
        self._signature = (low.design(self.gpu).name, tp, hops, tuple(sides))
        return self._signature

    def receive(self, peer: int, nbytes: float, layout: str, producer_tp: int) -> tuple[float, float]:
        """Seconds to receive a tensor of ``nbytes`` (``layout``) from ``peer`` on another stage, as
        the lowering does (:meth:`.lower._Builder.locate`): the send/receive plan, and with
        Megatron-LM's scatter/gather ``1/tp`` of it and the all-gather after: ``(seconds of the
        send/receive, seconds of the all-gather)``."""
        low = self.low
        tp = low.tp_here(self.gpu)
        split = (low.cfg.scatter_gather and layout == "R" and tp > 1 and producer_tp == tp
                 and int(round(nbytes)) % tp == 0)
        sent = nbytes / tp if split else nbytes
        plan = low.plan("send_recv", sent, [peer, self.gpu])
        seconds = self.route_time(peer, self.gpu, sent) if plan is None else low.hop(peer, self.gpu, plan).time
        return seconds, (self.ring("tp+1", tp, nbytes, "all_gather") if split else 0.0)

    def step_time(self, pattern: str, n: int, nbytes: float) -> float:
        """Seconds of one step of a ring of ``n`` ranks moving ``nbytes`` per step (its slowest hop)."""
        return self.ring(pattern, n, nbytes * n, "all_gather") / (n - 1) if n > 1 else 0.0

    def overlapped(self, op, rule, have: dict[str, str], seen: set) -> float | None:
        """Seconds of ``op`` with the communication it overlaps (context-parallel ring, userbuffers),
        None where no overlap applies; marks the layouts it leaves."""
        low = self.low
        cfg = low.cfg
        if context.is_ring_core(op, cfg.cp):
            step = low.shard(op, self.gpu)[0]
            kv = context.kv_bytes(low.layout_bytes, op)
            block = self.step_time(context.RING_PATTERN, cfg.cp, kv)
            if op.param("fused") == "bwd":
                return context.backward_ring_end(step, block, self.step_time(context.RING_PATTERN, cfg.cp, 2 * kv),
                                                 cfg.cp)
            return context.forward_ring_end(step, block, cfg.cp)
        tp = low.tp_here(self.gpu)
        if not cfg.tp_comm_overlap or tp <= 1:
            return None
        if userbuffers.gathers_input(op, rule):
            name = op.inputs[0]
            if (name, "R") in seen or have.get(name, low.layouts.get(name)) != "S":
                return None
            seen.add((name, "R"))
            chunk = userbuffers.chunk_timing(low, self.gpu, op, tp)[0]
            return userbuffers.ring_exchange_end(chunk, self.step_time("tp+1", tp, low.layout_bytes(name, "S")), tp)
        if userbuffers.scatters_output(op, rule):
            n = userbuffers.PIPELINE_SPLITS
            chunk = userbuffers.chunk_timing(low, self.gpu, op, n)[0] * userbuffers.sm_margin(low.design(self.gpu))
            scatter = self.ring("tp+1", tp, low.layout_bytes(op.name, "R") / n, "reduce_scatter")
            have[op.name] = "S"
            return userbuffers.pipeline_end(chunk, scatter, n)
        return None

    def expert_conversion(self, name: str, have: str, want: str) -> float:
        """Seconds of the collectives between two expert layouts (:func:`.experts.expert_path`)."""
        low = self.low
        cfg = low.cfg
        stage = low.place.stage(self.gpu)
        etp, pattern = cfg.etp_of(stage), experts.etp_pattern(cfg, stage)
        total = 0.0
        for step in experts.expert_path(have, want):
            if step == "a2a" and cfg.ep > 1:
                peer = self.patterns["ep+1"](self.gpu)
                total += self.route_time(self.gpu, peer, low.layout_bytes(name, "E") / cfg.ep) * (cfg.ep - 1)
            elif step == "ag":
                total += self.ring(pattern, etp, low.layout_bytes(name, "X"), "all_gather")
            elif step == "rs":
                total += self.ring(pattern, etp, low.layout_bytes(name, "Z"), "reduce_scatter")
        return total

    def unit(self, ops: list) -> tuple[float, float, float]:
        """Seconds of one pass over ``ops`` on this GPU: kernels and layout conversions; (apart)
        the activations or gradients received from another stage; of those the send/receive
        alone (what a blocking sender waits for).

        The kernels run one after another; the conversions' collectives one after another on
        the communication stream, each before its reader, which waits for it. In the backward
        each starts from its tensor's kernel (a tensor kept from another unit: from the start of
        the kernel before its reader), so the kernels between hide it, as the lowering runs them
        (:meth:`.lower._Builder.tensor`); in the forward from its reader's turn."""
        low = self.low
        tp = low.tp_here(self.gpu)
        here = low.place.stage(self.gpu)
        have: dict[str, str] = {}
        seen: set[tuple[str, str]] = set()
        clock = comm = last_start = 0.0  # compute stream, communication stream, the last kernel's start
        done: dict[str, float] = {}  # tensor -> when its kernel ended (this pass)
        received = sent = 0.0
        kernels: list[tuple[float, int]] = []

        def collective(seconds: float, ready: float) -> float:
            nonlocal comm
            comm = max(comm, ready) + seconds
            return comm

        for op in ops:
            rule = low.rules[op.name]
            both = self.overlapped(op, rule, have, seen) if not rule.alias else None
            start = clock
            for name, want in zip(op.inputs, rule.want):
                producer = low.graph.ops[low.op_index[name]]
                if producer.kind == OpKind.INPUT or (name, want) in seen:
                    continue
                seen.add((name, want))
                layout = have.get(name, low.layouts[name])
                if name not in have:  # produced in another unit: another stage's output arrives
                    stage = low.stage_of_chunk(low.chunk_of_layer[producer.param("layer")])
                    if stage != here and producer.param("phase", "fwd") != "opt":
                        peer = low.gpu_on_stage(self.gpu, stage)
                        if name in low.gather_out:
                            layout = "R"
                        p2p, gather = self.receive(peer, low.layout_bytes(name, layout), layout, low.cfg.tp_of(stage))
                        received += p2p + gather
                        sent += p2p
                if layout == want or want == "*":
                    continue
                full = low.layout_bytes(name, "R")
                if layout in experts.EXPERT_LAYOUTS and want in experts.EXPERT_LAYOUTS:
                    seconds = self.expert_conversion(name, layout, want)
                elif layout == "P" and want in ("R", "S", "F"):
                    seconds = self.ring("tp+1", tp, full, "reduce_scatter" if want != "R" else "all_reduce")
                elif layout in ("S", "F") and want == "R" or (layout == "S" and want == "F"):
                    seconds = self.ring("tp+1", tp, full, "all_gather")
                else:
                    continue
                # Megatron-LM launches the backward's collectives asynchronously (the input
                # gradient's all-reduce beside the weight-gradient GEMM); the forward's wait
                ready = done.get(name, last_start) if op.param("phase", "fwd") == "bwd" else clock
                start = max(start, collective(seconds, ready))
            clock = start
            if rule.alias:
                have[op.name] = rule.out
                done[op.name] = done.get(op.inputs[0], clock) if op.inputs else clock
                continue
            if both is not None:
                last_start, clock = clock, clock + both
                have.setdefault(op.name, rule.out)
                done[op.name] = clock
                continue
            seconds = low.shard(op, self.gpu)[0]
            last_start, clock = clock, clock + seconds
            kernels.append((seconds, low.kernels(op, self.gpu)))
            if rule.loss_reduce:
                clock = collective(self.ring("tp+1", tp, 12.0 * low.t.batch * low.t.seq, "all_reduce"), clock)
            have[op.name] = rule.out
            if op.name in low.gather_out:
                clock = collective(self.ring("tp+1", tp, low.layout_bytes(op.name, "R"), "all_gather"), clock)
                have[op.name] = "R"
            done[op.name] = clock
        total = clock
        launch = low.launch(self.gpu)
        if launch > 0 and kernels:  # the host's launch gaps (.host), from a synchronised start
            total += sum(launch_gaps([d for d, _ in kernels], [k for _, k in kernels], launch))
        return total, received, sent


def screen(graph: Graph, system: System, cfg: ParallelConfig, cost: CostModel, *,
           time_infeasible: bool = True) -> Screen:
    """The :class:`Screen` of ``cfg`` (checked by the caller) for ``graph`` on ``system``.
    ``time_infeasible=False``: a configuration that does not fit the GPUs' memory is not timed
    (its ``iteration_s`` is infinite; a search rejects it anyway)."""
    low, where, representative = _lowering(graph, system, cfg, cost)
    t = low.t
    capacity = low.layout.capacity
    memory = memory_estimate(low.graph, cfg, capacity, low.rules, low.rank_params)
    if not memory.fits and not time_infeasible:
        return Screen(math.inf, (), math.inf, memory, 0.0, 0.0, len(where.gpus))
    m = low.micro_batches
    stage_times = []
    receives = []
    receives_of: list[dict[str, float]] = []
    forwards = []
    tails = []
    backwards = []
    block_times: dict[tuple, tuple[float, float, float]] = {}
    split_units = graph_cached(low.graph, ("unit blocks", tuple(map(tuple, low.chunks))), lambda: _split_units(low))

    tail_times: dict[tuple, tuple[float, float, float]] = {}

    def tail_time(timer: _Timer, stage: int, backward: float) -> tuple[float, float, float]:
        # a stage between the first and the last holding blocks only: its tail is alike on every
        # such stage whose GPU is alike, whose data-parallel ring's hops are alike and whose
        # blocks' parameters are the same
        layers = [layer for c, chunk in enumerate(low.chunks) if c % cfg.pp == stage for layer in chunk]
        if not cfg.uniform or stage in (0, cfg.pp - 1) or not all(0 <= x < t.layers for x in layers):
            return _tail(low, timer, stage, backward)
        ring = timer.ring_hops("dp+1", cfg.dp_cp)[1] if cfg.dp_cp > 1 else None
        key = (timer.signature(), ring, low.place.coords[timer.gpu][::2],
               tuple(low.opt_params.get(x, 0) for x in layers), backward)
        hit = tail_times.get(key)
        if hit is None:
            hit = tail_times[key] = _tail(low, timer, stage, backward)
        return hit

    def block_time(timer: _Timer, kind: tuple, ops: list) -> tuple[float, float, float]:
        if not cfg.uniform:
            return timer.unit(ops)
        key = (kind, timer.signature())
        hit = block_times.get(key)
        if hit is None:
            hit = block_times[key] = timer.unit(ops)
        return hit

    for stage in range(cfg.pp):
        timer = _Timer(low, representative[stage])
        busy = received = backward = 0.0
        by_direction = {"F": 0.0, "B": 0.0}
        for chunk, layers in enumerate(low.chunks):
            if chunk % cfg.pp != stage:
                continue
            blocks = [layer for layer in layers if 0 <= layer < t.layers]
            for direction in ("F", "B"):
                if not low.unit_ops.get((chunk, direction)):
                    continue
                parts = []
                of_layer, ends = split_units[(chunk, direction)]
                if blocks:
                    # the block that receives from the other stage (forward: the first; backward:
                    # the last), and the others alike (the blocks of a model have equal shapes).
                    # A block's times are alike on every stage whose GPU is alike (design,
                    # tensor-parallel ring, the routes from the stages before and after it) and
                    # whose chunk holds the same place (first, last, between; one block or more)
                    where_ = (chunk == 0, chunk == len(low.chunks) - 1, len(blocks) > 1)
                    edge = blocks[0] if direction == "F" else blocks[-1]
                    parts.append((block_time(timer, ("edge", direction, where_), of_layer[edge]), 1))
                    if len(blocks) > 1:
                        inner = blocks[1] if direction == "F" else blocks[0]
                        parts.append((block_time(timer, ("inner", direction, where_), of_layer[inner]),
                                      len(blocks) - 1))
                if ends:
                    parts.append((timer.unit(ends), 1))
                if low.zero3_plans:  # ZeRO-3's parameter gathers the unit's kernels wait for
                    parts.append(((_zero3_exposed(low, timer, chunk, direction), 0.0, 0.0), 1))
                for (b, r, q), n in parts:
                    busy += b * n
                    received += r * n
                    by_direction[direction] += q * n
                    if direction == "B":
                        backward += b * n
        stage_times.append(busy)
        receives.append(received)
        receives_of.append(by_direction)
        forwards.append(busy - backward)
        tails.append(tail_time(timer, stage, backward))
        backwards.append(backward)
    # with overlap_p2p_comm off each stage waits for its sends (what its neighbours receive) once the
    # pipeline is full; while it fills, a send is the receive the next stage already counts
    p = cfg.pp
    blocking = [receives_of[(s + 1) % p]["F"] + receives_of[(s - 1) % p]["B"]
                if p > 1 and not cfg.overlap_p2p_comm else 0.0 for s in range(p)]
    steady = [a + b for a, b in zip(stage_times, blocking)]
    # the first micro-batch crosses every stage, receives included; the others follow at the
    # slowest stage's pace (the next micro-batch's activations arrive while a stage computes)
    if cfg.schedule == "interleaved":
        step = max(steady)
        pipeline = m * step + (cfg.pp - 1) / cfg.virtual_stages * max(a + b for a, b in zip(stage_times, receives))
    else:
        pipeline = sum(a + b for a, b in zip(stage_times, receives)) + (m - 1) * max(steady)
    # a stage's tail runs while the stages before it run the last micro-batch's backward (a chunk
    # of it with the interleaved schedule); the last stage's waits for the first's end when it
    # all-reduces the tied word embedding's gradient with it
    # (the first stage receives the last stage's embedding gradient while the stages before the
    # last run their last backward)
    share = 1.0 / cfg.virtual_stages if cfg.schedule == "interleaved" else 1.0
    ends = []
    for s, (reduce, emb, step) in enumerate(tails):
        hidden = sum(backwards[:s]) * share
        if s == 0:
            ends.append(max(0.0, emb - sum(backwards[:cfg.pp - 1]) * share) + reduce + step)
        elif low.tied_copy and s == cfg.pp - 1:
            ends.append(max(0.0, reduce - hidden) + emb + step)
        else:
            ends.append(reduce + step - hidden)
    tail = max(0.0, max(ends, default=0.0))
    if cfg.overlap_param_gather and t.training:  # the gathers open the iteration, hidden by the first forward
        pipeline += max(_gather_exposed(low, _Timer(low, representative[s]), s, forwards[s]) for s in range(cfg.pp))
    flops, peak = _model_flops(low)
    return Screen(iteration_s=pipeline + tail, stage_s=tuple(stage_times), tail_s=tail, memory=memory,
                  model_flops=flops, peak_flops=peak, gpus=cfg.gpus)


def _zero3_exposed(low: _Lowering, timer: _Timer, chunk: int, direction: str) -> float:
    """Seconds a unit's kernels wait for ZeRO-3's parameter all-gathers (:mod:`.zero3`): the unit
    run by :func:`.zero3.unit_seconds` with its kernels' times and each gather's ring, less its
    kernels' time."""
    plan = low.zero3_plans.get((chunk, direction))
    if plan is None or not plan.uses:
        return 0.0
    key = ("zero3 exposed", chunk, direction, timer.signature(), timer.ring_hops("dp+1", low.cfg.dp_cp)[1])
    hit = low.memo.get(key)
    if hit is not None:
        return hit
    # the kernels' seconds per use, kept with the lowering's shard timings (per graph and cost model)
    ckey = ("zero3 unit compute", low.rules_key, tuple(map(tuple, low.chunks)), chunk, direction,
            low.design(timer.gpu).name, low.kernels_key)
    times = low.shard_cache.get(ckey)
    if times is None:
        ops = low.unit_ops[(chunk, direction)]
        seconds = [0.0 if low.rules[op.name].alias else low.shard(op, timer.gpu)[0] for op in ops]
        firsts = [u.first for u in plan.uses] + [len(ops)]
        times = low.shard_cache[ckey] = (sum(seconds[:firsts[0]]),
                                         tuple(sum(seconds[a:b]) for a, b in itertools.pairwise(firsts)))
    prelude, compute = times
    gather = [timer.ring("dp+1", low.cfg.dp_cp, g.params * low.param_bytes, "all_gather") for g in plan.gathers]
    hit = low.memo[key] = max(0.0, zero3.unit_seconds(plan, prelude, compute, gather) - prelude - sum(compute))
    return hit


def _split_units(low: _Lowering) -> dict[tuple[int, str], tuple[dict[int, list], list]]:
    """Per unit: its ops by block (layer) and its other ops (embedding, head, loss)."""
    layers = low.t.layers
    out = {}
    for key, ops in low.unit_ops.items():
        of_layer = defaultdict(list)
        for op in ops:
            of_layer[op.param("layer")].append(op)
        out[key] = (of_layer, [op for op in ops if not 0 <= op.param("layer") < layers])
    return out


_LAYOUTS: "weakref.WeakKeyDictionary[System, dict]" = weakref.WeakKeyDictionary()


@dataclass
class _Layout:
    """What the screen reads of a rank layout on a system, whatever else the configuration says:
    every GPU its own class (:func:`.fold.identity_folding`), each stage's first GPU, the hops of
    the rings it has timed (:meth:`_Timer.ring_hops`), the smallest GPU memory (bytes)."""

    coords: dict  # the placement's (kept, so that its id is not reused)
    folding: Folding
    representative: dict[int, int]
    capacity: float
    hops: dict = field(default_factory=dict)


def _layout(system: System, where: Placement) -> _Layout:
    """The :class:`_Layout` of ``where``, memoised per system and rank layout (the placement
    memoises its layout, so one layout is one ``coords`` dict)."""
    memo = _LAYOUTS.get(system)
    if memo is None:
        memo = _LAYOUTS[system] = {}
    hit = memo.get(id(where.coords))
    if hit is None or hit.coords is not where.coords:
        if len(memo) >= 8:
            memo.clear()
        gpus = where.gpus
        hit = memo[id(where.coords)] = _Layout(where.coords, identity_folding(system, gpus),
                                               {where.stage(g): g for g in reversed(gpus)},
                                               min(a.memory.capacity for a in system.accelerators))
    return hit


def _lowering(graph: Graph, system: System, cfg: ParallelConfig,
              cost: CostModel) -> tuple[_Lowering, Placement, dict[int, int]]:
    """The lowering state the screen reads (graph prepared for ``cfg``, rules, units, each
    rank's parameters; no folding), the placement, and each stage's first GPU."""
    prepared = prepare_graph(graph, cfg)
    where = place(system, cfg)
    layout = _layout(system, where)
    low = _Lowering(prepared, system, cfg, cost, layout.folding, where)
    low.layout = layout
    _parameters(low)
    return low, where, layout.representative


def _tail(low: _Lowering, timer: _Timer, stage: int, backward: float) -> tuple[float, float, float]:
    """After a stage's last backward (``backward``: seconds of one micro-batch's backward on it),
    as the lowering runs it (:meth:`.lower._Builder._optimizer`), in three parts: the gradient
    reduction not hidden by it and the sequence-parallel norms' all-reduce; the tied embedding's
    all-reduce (first and last stage); the optimizer step's kernels and its all-reduces over the
    model-parallel group, and ZeRO's parameter all-gather."""
    cfg = low.cfg
    if not low.training:
        return 0.0, 0.0, 0.0
    gb = low.grad_bytes
    layers = [layer for c, chunk in enumerate(low.chunks) if c % cfg.pp == stage for layer in chunk]
    params = [low.opt_params.get(layer, 0) for layer in layers]
    kind = "reduce_scatter" if cfg.zero >= 1 else "all_reduce"
    n = cfg.dp_cp
    everything = timer.ring("dp+1", n, sum(params) * gb, kind) if n > 1 else 0.0
    if cfg.overlap_grad_reduce:
        # the buckets reduce while the last backward runs; the last one (the stage's first layers,
        # one bucket's worth) after it, and whatever the backward could not hide
        size = 0
        bucket = cfg.zero3_bucket if cfg.zero == 3 else cfg.bucket
        for p in params:
            size += p
            if size >= bucket:
                break
        last = timer.ring("dp+1", n, size * gb, kind) if n > 1 else 0.0
        exposed = max(last, everything - backward)
    else:
        exposed = everything
    tp = low.tp_here(timer.gpu)
    if cfg.sp and tp > 1:
        blocks = sum(1 for layer in layers if 0 <= layer < low.t.layers)
        exposed += timer.ring("tp+1", tp, blocks * sequence_parallel_params(low.t) * gb, "all_reduce")
    if low.tied_copy and (stage == 0 or stage == cfg.pp - 1):
        peer = low.gpu_on_stage(timer.gpu, cfg.pp - 1 if stage == 0 else 0)
        nbytes = low.word_embedding_params * gb
        plan = low.plan("all_reduce", nbytes, [peer, timer.gpu])
        embedding = timer.route_time(peer, timer.gpu, nbytes) if plan is None else \
            plan.steps * low.hop(peer, timer.gpu, plan).time
    else:
        embedding = 0.0
    adams = [op for chunk in range(len(low.chunks)) if chunk % cfg.pp == stage
             for op in low.unit_ops.get((chunk, "O"), []) if op.param("fn") == "adam"]
    optimizer = sum(low.shard(op, timer.gpu)[0] + low.optimizer_before_norm(op, timer.gpu)[0] for op in adams)
    launch = low.launch(timer.gpu)
    if launch > 0 and adams:  # the host's launch gaps after the optimizer's synchronisation
        optimizer += sum(launch_gaps([low.shard(op, timer.gpu)[0] for op in adams],
                                     [low.kernels(op, timer.gpu) for op in adams], launch))
    if adams:
        optimizer += ((cfg.clip_grad > 0) + grad_scaled(low.t)) * _model_parallel_seconds(low, timer, 4.0)
    for layer in layers:  # the FP8 weight casts after the step
        cast, count = overlap.step_casts(low, layer)
        if cast is not None:
            optimizer += overlap.cast_timing(low, timer.gpu, cast, count)[0]
    gathers = cfg.zero in (1, 2) and n > 1 and not cfg.overlap_param_gather  # ZeRO-3: per module (_zero3_exposed)
    gather = timer.ring("dp+1", n, overlap.gather_bytes(low, layers), "all_gather") if gathers else 0.0
    return exposed, embedding, optimizer + gather


def _model_parallel_seconds(low: _Lowering, timer: _Timer, nbytes: float) -> float:
    """An all-reduce of ``nbytes`` over the model-parallel group of the timer's GPU, as the
    lowering times it (:meth:`.lower._Builder._model_parallel_all_reduce`)."""
    dp, _, tp = low.place.coords[timer.gpu]
    key = ("model-parallel all-reduce", dp, tp, nbytes)  # every stage of a replica: one group
    hit = low.memo.get(key)
    if hit is None:
        starts = tuple(low.gpu_on_stage(timer.gpu, s) for s in range(low.cfg.pp))
        hit = low.memo[key] = _group_all_reduce_seconds(low, timer, starts, nbytes)
    return hit


def _group_all_reduce_seconds(low: _Lowering, timer: _Timer, starts: tuple[int, ...], nbytes: float) -> float:
    members: list[int] = []
    tp_peer = timer.patterns.get("tp+1")
    for g in starts:
        members.append(g)
        while tp_peer is not None and tp_peer(members[-1]) not in (g, members[-1]) and len(members) < 1 << 16:
            members.append(tp_peer(members[-1]))
    if len(members) < 2:
        return 0.0
    plan = low.plan("all_reduce", nbytes, members)
    if plan is not None:
        return plan.time
    names = low.system.nodes
    return 2 * (len(members) - 1) * max(low.system.route(names[a], names[b]).latency
                                        for a, b in zip(members, members[1:] + members[:1]))


def _gather_exposed(low: _Lowering, timer: _Timer, stage: int, forward: float) -> float:
    """``overlap_param_gather``: seconds of a stage's parameter all-gathers the first micro-batch's
    forward (``forward`` seconds) does not hide: the first bucket's, or whatever exceeds the
    forward."""
    cfg = low.cfg
    if cfg.dp_cp <= 1:
        return 0.0
    layers = [layer for c, chunk in enumerate(low.chunks) if c % cfg.pp == stage for layer in chunk]
    buckets = [timer.ring("dp+1", cfg.dp_cp, overlap.gather_bytes(low, bucket), "all_gather")
               for bucket in overlap.gather_buckets(layers, low.rank_params, cfg.bucket)]
    if not buckets:
        return 0.0
    return max(buckets[-1], sum(buckets) - forward)


def serving_times(graph: Graph, system: System, cfg: ParallelConfig, cost: CostModel) -> tuple[float, float]:
    """A serving graph's (``mode=serve``) time to first token and time per output token in
    closed form: the prefill's ops and the decode steps' ops of every stage timed on its
    representative GPU (one request batch crosses the stages one after another)."""
    low, _, representative = _lowering(graph, system, cfg, cost)
    prefill = decode = 0.0
    for stage in range(cfg.pp):
        timer = _Timer(low, representative[stage])
        ops = [op for chunk in range(len(low.chunks)) if chunk % cfg.pp == stage
               for op in low.unit_ops.get((chunk, "F"), [])]
        busy, received, _ = timer.unit([op for op in ops if op.name.startswith("prefill.")])
        prefill += busy + received
        busy, received, _ = timer.unit([op for op in ops if op.name.startswith("decode.")])
        decode += busy + received
    steps = low.t.generate or 1
    return prefill, decode / steps
