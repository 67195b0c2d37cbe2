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
  ones overlap the backward; all of them when ``overlap_grad_reduce`` is off), the optimizer and
  its FP8 weight casts, and ZeRO's parameter all-gather (with ``overlap_param_gather`` before the
  first forward instead: the part of it the first micro-batch's forward does not hide);
* memory: :func:`.memory.memory_estimate`.

It ignores contention and the finer overlap of the schedule, so it is a ranking, not a
prediction: the search simulates the candidates it ranks best. ``tests/test_parallel_search.py``
measures its error and rank correlation against simulations.
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass

from marssim.cost.base import CostModel
from marssim.system import System
from marssim.workload import Graph, OpKind

from . import context, experts, overlap, userbuffers
from .config import ParallelConfig
from .fold import identity_folding
from .lower import _Lowering, _model_flops, _parameters, prepare_graph
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

    def route_time(self, src: int, dst: int, nbytes: float) -> float:
        route = self.system.route(self.system.nodes[src], self.system.nodes[dst])
        cap = self.system.resource_capacity
        bw = min((float(cap[r]) for r in route.resources), default=float("inf"))
        return route.latency + (nbytes / bw if nbytes > 0 else 0.0)

    def ring(self, pattern: str, n: int, size: float, kind: str) -> float:
        if n <= 1 or size <= 0:
            return 0.0
        key = (pattern, n, size, kind)
        hit = self._ring_cache.get(key)
        if hit is None:
            # a ring's steps go at the pace of its slowest hop
            steps = 2 * (n - 1) if kind == "all_reduce" else n - 1
            peer = self.patterns[pattern]
            members = [self.gpu]
            while len(members) < n:
                members.append(peer(members[-1]))
            hit = self._ring_cache[key] = steps * max(self.route_time(g, peer(g), size / n) for g in members)
        return hit

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

    def unit(self, ops: list) -> tuple[float, float]:
        """Seconds of one pass over ``ops`` on this GPU: kernels and layout conversions, and
        (apart) the activations or gradients received from another stage."""
        low = self.low
        tp = low.tp_here(self.gpu)
        here = low.place.stage(self.gpu)
        have: dict[str, str] = {}
        seen: set[tuple[str, str]] = set()
        total = 0.0
        received = 0.0
        for op in ops:
            rule = low.rules[op.name]
            both = self.overlapped(op, rule, have, seen) if not rule.alias else None
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
                        received += self.route_time(peer, self.gpu, low.layout_bytes(name, layout))
                if layout == want or want == "*":
                    continue
                full = low.layout_bytes(name, "R")
                if layout in experts.EXPERT_LAYOUTS and want in experts.EXPERT_LAYOUTS:
                    total += self.expert_conversion(name, layout, want)
                elif layout == "P" and want in ("R", "S", "F"):
                    total += self.ring("tp+1", tp, full, "reduce_scatter" if want != "R" else "all_reduce")
                elif layout in ("S", "F") and want == "R" or (layout == "S" and want == "F"):
                    total += self.ring("tp+1", tp, full, "all_gather")
            if rule.alias:
                have[op.name] = rule.out
                continue
            if both is not None:
                total += both
                have.setdefault(op.name, rule.out)
                continue
            total += low.shard(op, self.gpu)[0]
            if rule.loss_reduce:
                total += self.ring("tp+1", tp, 12.0 * low.t.batch * low.t.seq, "all_reduce")
            have[op.name] = rule.out
            if op.name in low.gather_out:
                total += self.ring("tp+1", tp, low.layout_bytes(op.name, "R"), "all_gather")
                have[op.name] = "R"
        return total, received


def screen(graph: Graph, system: System, cfg: ParallelConfig, cost: CostModel, *,
           time_infeasible: bool = True) -> Screen:
    """The :class:`Screen` of ``cfg`` (checked by the caller) for ``graph`` on ``system``.
    ``time_infeasible=False``: a configuration that does not fit the GPUs' memory is not timed
    (its ``iteration_s`` is infinite; a search rejects it anyway)."""
    low, where, representative = _lowering(graph, system, cfg, cost)
    t = low.t
    capacity = min(a.memory.capacity for a in system.accelerators)
    memory = memory_estimate(low.graph, cfg, capacity, low.rules, low.rank_params)
    if not memory.fits and not time_infeasible:
        return Screen(math.inf, (), math.inf, memory, 0.0, 0.0, len(where.gpus))
    m = low.micro_batches
    stage_times = []
    receives = []
    receives_of: list[dict[str, float]] = []
    forwards = []
    tails = []
    for stage in range(cfg.pp):
        timer = _Timer(low, representative[stage])
        busy = received = backward = 0.0
        by_direction = {"F": 0.0, "B": 0.0}
        for chunk, layers in enumerate(low.chunks):
            if chunk % cfg.pp != stage:
                continue
            blocks = [layer for layer in layers if 0 <= layer < t.layers]
            for direction in ("F", "B"):
                ops = low.unit_ops.get((chunk, direction), [])
                if not ops:
                    continue
                parts = []
                of_layer = defaultdict(list)
                for op in ops:
                    of_layer[op.param("layer")].append(op)
                ends = [op for op in ops if not 0 <= op.param("layer") < t.layers]
                if blocks:
                    # the block that receives from the other stage (forward: the first; backward:
                    # the last), and the others alike (the blocks of a model have equal shapes)
                    edge = blocks[0] if direction == "F" else blocks[-1]
                    parts.append((timer.unit(of_layer[edge]), 1))
                    if len(blocks) > 1:
                        inner = blocks[1] if direction == "F" else blocks[0]
                        parts.append((timer.unit(of_layer[inner]), len(blocks) - 1))
                if ends:
                    parts.append((timer.unit(ends), 1))
                for (b, r), n in parts:
                    busy += b * n
                    received += r * n
                    by_direction[direction] += r * n
                    if direction == "B":
                        backward += b * n
        stage_times.append(busy)
        receives.append(received)
        receives_of.append(by_direction)
        forwards.append(busy - backward)
        tails.append(_tail(low, timer, stage, backward))
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
    tail = max(tails) if tails else 0.0
    if cfg.overlap_param_gather and t.training:  # the gathers open the iteration, hidden by the first forward
        pipeline += max(_gather_exposed(low, _Timer(low, representative[s]), s, forwards[s]) for s in range(cfg.pp))
    flops, peak = _model_flops(low)
    return Screen(iteration_s=pipeline + tail, stage_s=tuple(stage_times), tail_s=tail, memory=memory,
                  model_flops=flops, peak_flops=peak, gpus=cfg.gpus)


def _lowering(graph: Graph, system: System, cfg: ParallelConfig,
              cost: CostModel) -> tuple[_Lowering, Placement, dict[int, int]]:
    """The lowering state the screen reads (graph prepared for ``cfg``, rules, units, each
    rank's parameters; no folding), the placement, and each stage's first GPU."""
    prepared = prepare_graph(graph, cfg)
    where = place(system, cfg)
    low = _Lowering(prepared, system, cfg, cost, identity_folding(system, where.gpus), where)
    _parameters(low)
    representative = {where.stage(g): g for g in reversed(where.gpus)}
    return low, where, representative


def _tail(low: _Lowering, timer: _Timer, stage: int, backward: float) -> float:
    """After a stage's last backward (``backward``: seconds of one micro-batch's backward on it):
    the gradient reduction not hidden by it, the optimizer, ZeRO's parameter all-gather."""
    cfg = low.cfg
    if not low.training:
        return 0.0
    eb = low.param_bytes
    layers = [layer for c, chunk in enumerate(low.chunks) if c % cfg.pp == stage for layer in chunk]
    params = [low.rank_params.get(layer, 0) for layer in layers]
    kind = "reduce_scatter" if cfg.zero >= 1 else "all_reduce"
    n = cfg.dp_cp
    everything = timer.ring("dp+1", n, sum(params) * eb, kind) if n > 1 else 0.0
    if cfg.overlap_grad_reduce:
        # the buckets reduce while the last backward runs; the last one (the stage's first layers,
        # one bucket's worth) after it, and whatever the backward could not hide
        size = 0
        for p in params:
            size += p
            if size >= cfg.bucket:
                break
        last = timer.ring("dp+1", n, size * eb, kind) if n > 1 else 0.0
        exposed = max(last, everything - backward)
    else:
        exposed = everything
    optimizer = sum(timer.low.shard(op, timer.gpu)[0] for chunk in range(len(low.chunks))
                    if chunk % cfg.pp == stage for op in low.unit_ops.get((chunk, "O"), [])
                    if op.param("fn") == "adam")
    for layer in layers:  # the FP8 weight casts after the step
        cast, count = overlap.step_casts(low, layer)
        if cast is not None:
            optimizer += overlap.cast_timing(low, timer.gpu, cast, count)[0]
    gathers = cfg.zero >= 1 and n > 1 and not cfg.overlap_param_gather
    gather = timer.ring("dp+1", n, overlap.gather_bytes(low, layers), "all_gather") if gathers else 0.0
    return exposed + optimizer + gather


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
        busy, received = timer.unit([op for op in ops if op.name.startswith("prefill.")])
        prefill += busy + received
        busy, received = timer.unit([op for op in ops if op.name.startswith("decode.")])
        decode += busy + received
    steps = low.t.generate or 1
    return prefill, decode / steps
