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
from collections import defaultdict
from dataclasses import dataclass, field

from marssim.cost.base import CostModel
from marssim.system import System
from marssim.workload import Graph

from . import overlap, zero3
from .config import ParallelConfig
from .fold import Folding, identity_folding
from .host import launch_gaps
from .megatron import grad_scaled, sequence_parallel_params
from .memo import OwnerMemo, graph_cached
from .memory import MemoryEstimate, memory_estimate
from .partition import prepare_graph
from .patterns import DP_RING, TP_RING
from .placement import Placement, place
from .runmodel import RunModel
from .unittimer import UnitTimer

__all__ = ["Screen", "screen", "screen_model", "serving_times"]


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


def screen(graph: Graph, system: System, cfg: ParallelConfig, cost: CostModel, *,
           time_infeasible: bool = True) -> Screen:
    """The :class:`Screen` of ``cfg`` (checked by the caller) for ``graph`` on ``system``.
    ``time_infeasible=False``: a configuration that does not fit the GPUs' memory is not timed
    (its ``iteration_s`` is infinite; a search rejects it anyway)."""
    low, where, representative = screen_model(graph, system, cfg, cost)
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

    def tail_time(timer: UnitTimer, stage: int, backward: float) -> tuple[float, float, float]:
        # a stage between the first and the last holding blocks only: its tail is alike on every
        # such stage whose GPU is alike, whose data-parallel ring's hops are alike and whose
        # blocks' parameters are the same
        layers = [layer for c, chunk in enumerate(low.chunks) if c % cfg.pp == stage for layer in chunk]
        if not cfg.uniform or stage in (0, cfg.pp - 1) or not all(0 <= x < t.layers for x in layers):
            return _tail(low, timer, stage, backward)
        ring = timer.ring_hops(DP_RING, cfg.dp_cp)[1] if cfg.dp_cp > 1 else None
        key = (timer.signature(), ring, low.place.coords[timer.gpu][::2],
               tuple(low.opt_params.get(x, 0) for x in layers), backward)
        hit = tail_times.get(key)
        if hit is None:
            hit = tail_times[key] = _tail(low, timer, stage, backward)
        return hit

    def block_time(timer: UnitTimer, kind: tuple, ops: list) -> tuple[float, float, float]:
        if not cfg.uniform:
            return timer.unit(ops)
        key = (kind, timer.signature())
        hit = block_times.get(key)
        if hit is None:
            hit = block_times[key] = timer.unit(ops)
        return hit

    for stage in range(cfg.pp):
        timer = UnitTimer(low, representative[stage])
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
                    # the last), and the others alike by kind (the blocks of a model have equal
                    # shapes, but for a mixture of experts' dense first blocks). A block's times
                    # are alike on every stage whose GPU is alike (design, tensor-parallel ring,
                    # the routes from the stages before and after it) and whose chunk holds the
                    # same place (first, last, between; one block or more)
                    where_ = (chunk == 0, chunk == len(low.chunks) - 1, len(blocks) > 1)
                    edge = blocks[0] if direction == "F" else blocks[-1]
                    parts.append((block_time(timer, ("edge", direction, where_, t.is_moe_layer(edge)),
                                             of_layer[edge]), 1))
                    inner: dict[bool, list[int]] = {}
                    for layer in blocks:
                        if layer != edge:
                            inner.setdefault(t.is_moe_layer(layer), []).append(layer)
                    for kind, alike in inner.items():
                        parts.append((block_time(timer, ("inner", direction, where_, kind), of_layer[alike[0]]),
                                      len(alike)))
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
        pipeline += max(_gather_exposed(low, UnitTimer(low, representative[s]), s, forwards[s]) for s in range(cfg.pp))
    flops, peak = low.model_flops()
    return Screen(iteration_s=pipeline + tail, stage_s=tuple(stage_times), tail_s=tail, memory=memory,
                  model_flops=flops, peak_flops=peak, gpus=cfg.gpus)


def _zero3_exposed(low: RunModel, timer: UnitTimer, chunk: int, direction: str) -> float:
    """Seconds a unit's kernels wait for ZeRO-3's parameter all-gathers (:mod:`.zero3`): the unit
    run by :func:`.zero3.unit_seconds` with its kernels' times and each gather's ring, less its
    kernels' time."""
    plan = low.zero3_plans.get((chunk, direction))
    if plan is None or not plan.uses:
        return 0.0
    key = ("zero3 exposed", chunk, direction, timer.signature(), timer.ring_hops(DP_RING, low.cfg.dp_cp)[1])
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
        times = low.shard_cache.put(ckey, (sum(seconds[:firsts[0]]),
                                           tuple(sum(seconds[a:b]) for a, b in itertools.pairwise(firsts))))
    prelude, compute = times
    gather = [timer.ring(DP_RING, low.cfg.dp_cp, g.params * low.param_bytes, "all_gather") for g in plan.gathers]
    hit = low.memo[key] = max(0.0, zero3.unit_seconds(plan, prelude, compute, gather) - prelude - sum(compute))
    return hit


def _split_units(low: RunModel) -> dict[tuple[int, str], tuple[dict[int, list], list]]:
    """Per unit: its ops by block (layer) and its other ops (embedding, head, loss)."""
    layers = low.t.layers
    out = {}
    for key, ops in low.unit_ops.items():
        of_layer = defaultdict(list)
        for op in ops:
            of_layer[op.param("layer")].append(op)
        out[key] = (of_layer, [op for op in ops if not 0 <= op.param("layer") < layers])
    return out


LAYOUTS = OwnerMemo(default_size=8)
"""Per system (while it lives), the :class:`_Layout` of its most recently screened rank layouts."""


@dataclass
class _Layout:
    """What the screen reads of a rank layout on a system, whatever else the configuration says:
    every GPU its own class (:func:`.fold.identity_folding`), each stage's first GPU, the hops of
    the rings it has timed (:meth:`.unittimer.UnitTimer.ring_hops`), the smallest GPU memory (bytes)."""

    coords: dict  # the placement's (kept, so that its id is not reused)
    folding: Folding
    representative: dict[int, int]
    capacity: float
    hops: dict = field(default_factory=dict)


def _layout(system: System, where: Placement) -> _Layout:
    """The :class:`_Layout` of ``where``, memoised per system and rank layout (the placement
    memoises its layout, so one layout is one ``coords`` dict)."""
    def make() -> _Layout:
        gpus = where.gpus
        return _Layout(where.coords, identity_folding(system, gpus), {where.stage(g): g for g in reversed(gpus)},
                       min(a.memory.capacity for a in system.accelerators))

    key = ("layout", id(where.coords))
    hit = LAYOUTS.get_or_make(system, key, make)
    if hit.coords is not where.coords:  # a dead layout's id reused
        hit = LAYOUTS.cache(system, "layout").put(key, make())
    return hit


def screen_model(graph: Graph, system: System, cfg: ParallelConfig,
                 cost: CostModel) -> tuple[RunModel, Placement, dict[int, int]]:
    """The run model the screen reads (graph prepared for ``cfg``, rules, units, each rank's
    parameters; every GPU its own class), the placement, and each stage's first GPU."""
    prepared = prepare_graph(graph, cfg)
    where = place(system, cfg)
    layout = _layout(system, where)
    low = RunModel(prepared, system, cfg, cost, layout.folding, where)
    low.layout = layout
    return low, where, layout.representative


def _tail(low: RunModel, timer: UnitTimer, stage: int, backward: float) -> tuple[float, float, float]:
    """After a stage's last backward (``backward``: seconds of one micro-batch's backward on it),
    as the lowering runs it (:meth:`.builder.UnitBuilder._optimizer`), in three parts: the gradient
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
    everything = timer.ring(DP_RING, n, sum(params) * gb, kind) if n > 1 else 0.0
    if cfg.overlap_grad_reduce:
        # the buckets reduce while the last backward runs; the last one (the stage's first layers,
        # one bucket's worth) after it, and whatever the backward could not hide
        size = 0
        for p in params:
            size += p
            if size >= (cfg.zero3_bucket if cfg.zero == 3 else cfg.bucket):
                break
        last = timer.ring(DP_RING, n, size * gb, kind) if n > 1 else 0.0
        exposed = max(last, everything - backward)
    else:
        exposed = everything
    tp = low.tp_here(timer.gpu)
    if cfg.sp and tp > 1:
        blocks = sum(1 for layer in layers if 0 <= layer < low.t.layers)
        exposed += timer.ring(TP_RING, tp, blocks * sequence_parallel_params(low.t) * gb, "all_reduce")
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
    gather = timer.ring(DP_RING, n, overlap.gather_bytes(low, layers), "all_gather") if gathers else 0.0
    return exposed, embedding, optimizer + gather


def _model_parallel_seconds(low: RunModel, timer: UnitTimer, nbytes: float) -> float:
    """An all-reduce of ``nbytes`` over the model-parallel group of the timer's GPU, as the
    lowering times it (:meth:`.builder.UnitBuilder._model_parallel_all_reduce`)."""
    dp, _, tp = low.place.coords[timer.gpu]
    key = ("model-parallel all-reduce", dp, tp, nbytes)  # every stage of a replica: one group
    hit = low.memo.get(key)
    if hit is None:
        starts = tuple(low.gpu_on_stage(timer.gpu, s) for s in range(low.cfg.pp))
        hit = low.memo[key] = _group_all_reduce_seconds(low, timer, starts, nbytes)
    return hit


def _group_all_reduce_seconds(low: RunModel, timer: UnitTimer, starts: tuple[int, ...], nbytes: float) -> float:
    members: list[int] = []
    tp_peer = timer.patterns.get(TP_RING)
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


def _gather_exposed(low: RunModel, timer: UnitTimer, stage: int, forward: float) -> float:
    """``overlap_param_gather``: seconds of a stage's parameter all-gathers the first micro-batch's
    forward (``forward`` seconds) does not hide: the first bucket's, or whatever exceeds the
    forward."""
    cfg = low.cfg
    if cfg.dp_cp <= 1:
        return 0.0
    layers = [layer for c, chunk in enumerate(low.chunks) if c % cfg.pp == stage for layer in chunk]
    buckets = [timer.ring(DP_RING, cfg.dp_cp, overlap.gather_bytes(low, bucket), "all_gather")
               for bucket in overlap.gather_buckets(layers, low.rank_params, cfg.bucket)]
    if not buckets:
        return 0.0
    return max(buckets[-1], sum(buckets) - forward)


def serving_times(graph: Graph, system: System, cfg: ParallelConfig, cost: CostModel) -> tuple[float, float]:
    """A serving graph's (``mode=serve``) time to first token and time per output token in
    closed form: the prefill's ops and the decode steps' ops of every stage timed on its
    representative GPU (one request batch crosses the stages one after another)."""
    low, _, representative = screen_model(graph, system, cfg, cost)
    prefill = decode = 0.0
    for stage in range(cfg.pp):
        timer = UnitTimer(low, representative[stage])
        ops = [op for chunk in range(len(low.chunks)) if chunk % cfg.pp == stage
               for op in low.unit_ops.get((chunk, "F"), [])]
        busy, received, _ = timer.unit([op for op in ops if op.name.startswith("prefill.")])
        prefill += busy + received
        busy, received, _ = timer.unit([op for op in ops if op.name.startswith("decode.")])
        decode += busy + received
    steps = low.t.generate or 1
    return prefill, decode / steps
