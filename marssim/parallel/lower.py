"""Lower a transformer graph under a parallel configuration to the TaskGraph both evaluators read.

What a Megatron-LM run does, task by task, on one GPU per class of identical GPUs
(:mod:`.fold`):

* every op of a model chunk runs on its stage's GPUs, split by its tensor-parallel rule
  (:mod:`.roles`) and timed by the cost model on the GPU's design; the collectives that convert
  layouts between ops (all-reduce, reduce-scatter, all-gather over the tensor-parallel group;
  all-to-all over the expert-parallel group) are ring (direct for all-to-all) point-to-point
  steps over the system's routes;
* an activation crossing pipeline stages is a point-to-point transfer to the next stage (its
  gradient back to the previous one), held in the receiver's memory until its last reader ends;
* each GPU runs its units (chunk, micro-batch, forward or backward) in the order of the
  schedule (:mod:`.schedule`), one kernel after another on one stream; communication runs beside
  it and a kernel waits only for the data it reads;
* after its last backward, each chunk reduces its gradients over the data-parallel group in
  buckets of ``bucket`` parameters (later layers first, overlapping the rest of the backward when
  ``overlap_grad_reduce``), reduce-scattered with ``zero`` >= 1 (then the optimizer updates a
  ``1/dp`` shard and the parameters are all-gathered); then the optimizer steps. ZeRO-3 runs as
  DeepSpeed does (:mod:`.zero3`): each module's parameters all-gathered before its use in the
  forward and again in the backward, with a bounded prefetch, the gradients reduce-scattered in
  buckets of ``zero3_bucket`` parameters, nothing gathered after the step;
* weights, gradients and optimizer state are resident (:mod:`.memory`); activations are buffers
  from their producer's start to their last reader's end;
* the settings of :mod:`.config` that change the tasks live in modules of their own: context
  parallelism's attention ring (:mod:`.context`), Transformer Engine's overlapped tensor-parallel
  GEMMs (:mod:`.userbuffers`), the parameter all-gather's and the pipeline sends' overlap and
  the FP8 weight casts (:mod:`.overlap`), expert tensor parallelism and uneven routing
  (:mod:`.experts`); a collective on a tensor kept from another unit starts when the kernel
  before its reader starts.

Units: seconds, bytes. Pure and deterministic.
"""

from __future__ import annotations

import functools
import itertools

import weakref
from collections import Counter, defaultdict
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from marssim.collectives.group import Hop, group_plan, hop_step, route_bottleneck
from marssim.collectives.plan import CollectivePlan, ring_steps
from marssim.cost.base import CostModel
from marssim.errors import InputError
from marssim.gcpause import gc_paused
from marssim.system import Route, System
from marssim.taskgraph import COMPUTE, TRANSFER, Collective, TaskGraph, from_program
from marssim.taskprogram import CoupledSteps, TaskProgram
from marssim.workload import Graph, Op, OpKind

from . import context, experts, overlap, userbuffers, zero3
from .config import ParallelConfig, check_parallel
from .fold import Folding, binding_route, fold, identity_folding
from .host import launch_gaps, launch_seconds
from .megatron import grad_dtype, grad_scaled, kernels_key, op_kernels, optimizer_kernels, roles, \
    sequence_parallel_params
from .memory import static_bytes
from .placement import PULLS, Placement, direct_patterns, place
from .roles import Rule, rule_for, strategy_of
from .schedule import stage_units
from .size import SizeEstimate, check_gpus, check_size

Progress = Callable[[dict], None]
"""A progress callback (see :func:`lower_parallel`)."""

PROGRESS_EVERY = 0.5  # s of wall time between progress calls

__all__ = ["lower_parallel", "chunk_layers", "prepare_graph", "lowered_size"]

Ref = tuple  # ("u", rep, unit key, rel task, "same" | "last")
_GROUP_PLAN = object()  # a ring's plan: its group's own (see _Builder.ring)
_AFTER_PREVIOUS = ("previous row",)  # a template row's predecessors: the row before it alone (a ring's repeated steps)


@functools.lru_cache(maxsize=1024)
def chunk_layers(layers: int, cfg: ParallelConfig) -> tuple[tuple[int, ...], ...]:
    """The layers of each model chunk: ``pp * virtual_stages`` chunks (``layers_per_stage`` when
    given), balanced with the larger ones first; chunk 0 also holds the embedding (layer -1), the
    last the head (layer ``layers``). Memoised: read it, do not change it."""
    n = cfg.pp * (cfg.virtual_stages if cfg.schedule == "interleaved" else 1)
    sizes = list(cfg.layers_per_stage) if cfg.layers_per_stage else \
        [layers // n + (1 if i < layers % n else 0) for i in range(n)]
    out, at = [], 0
    for size in sizes:
        out.append(list(range(at, at + size)))
        at += size
    out[0].insert(0, -1)
    out[-1].append(layers)
    return tuple(tuple(chunk) for chunk in out)


def stage_of_layers(layers: int, cfg: ParallelConfig) -> dict[int, int]:
    """The pipeline stage of every layer (``-1``: the embedding, ``layers``: the head)."""
    return {layer: c % cfg.pp for c, chunk in enumerate(chunk_layers(layers, cfg)) for layer in chunk}


_CACHES: "weakref.WeakKeyDictionary[Graph, dict]" = weakref.WeakKeyDictionary()


def graph_cache(graph: Graph) -> dict:
    """A dictionary of derived values kept with ``graph`` (while it lives): the rules, prepared
    graphs and shard timings that many configurations of one workload share."""
    cache = _CACHES.get(graph)
    if cache is None:
        cache = _CACHES[graph] = {}
    return cache


_BOUNDED = frozenset({"rules", "layouts", "units", "rank_parameters", "low_precision_parameters", "saved_per_layer",
                      "zero3 plans", "zero3 live bytes"})
_KEEP = 8
"""Per graph, at most this many values of each kind in :data:`_BOUNDED` (derived per layer
layout, cheap to make again): a search's thousands of configurations then hold a bounded set."""


def graph_cached(graph: Graph, key: Hashable, make: Callable[[], Any]) -> Any:
    """The value of ``key`` in :func:`graph_cache`, made by ``make()`` on first use (the oldest
    value of the same kind dropped past :data:`_KEEP` of them, for the kinds in :data:`_BOUNDED`)."""
    cache = graph_cache(graph)
    hit = cache.get(key)
    if hit is None:
        kind = key[0] if isinstance(key, tuple) and key else key
        if kind in _BOUNDED:
            # a copy of the keys: evaluators on threads (Dask's local cluster) share the graph
            same = [k for k in list(cache) if isinstance(k, tuple) and k and k[0] == kind]
            for old in same[:max(0, len(same) - _KEEP + 1)]:
                cache.pop(old, None)
        hit = cache[key] = make()
    return hit


def op_rules(graph: Graph, cfg: ParallelConfig) -> dict[str, Rule]:
    """Every op's tensor-parallel rule (:func:`~.roles.rule_for` with its stage's degree), in
    graph order; the MoE re-layouts as ``D`` (locally permuted, before the all-to-all).
    Memoised per graph by the degree of every layer, sequence and expert parallelism."""
    stage_of = stage_of_layers(graph.meta["transformer"].layers, cfg)
    key = rules_key(cfg, stage_of)
    return graph_cached(graph, key, lambda: _shared_rules(graph, cfg, stage_of, key))


_SHARED_RULES: dict[tuple, dict[str, Rule]] = {}
"""op_rules by (graph structure, rules key): the graphs of one model prepared for several
micro-batch sizes differ in their ops' sizes only, which no rule reads (bounded, oldest dropped)."""
_SHARED_KEEP = 64


def _structure(graph: Graph) -> tuple:
    """What :func:`~.roles.rule_for` reads of a graph's ops (names, kinds, inputs, the params it
    looks at) and the expert routing: graphs alike in it get the same rules."""
    def make() -> tuple:
        params = ("view", "grad", "grouped", "fn", "what")
        t = graph.meta["transformer"]
        return (getattr(t, "expert_load", None),) + tuple(
            (op.name, op.kind, tuple(op.inputs), tuple(op.param(p) for p in params)) for op in graph.ops)
    return graph_cached(graph, "rule structure", make)


def _shared_rules(graph: Graph, cfg: ParallelConfig, stage_of: dict[int, int], key: tuple) -> dict[str, Rule]:
    shared = (_structure(graph), key)
    hit = _SHARED_RULES.get(shared)
    if hit is None:
        hit = _op_rules(graph, cfg, stage_of)
        # a copy of the keys: evaluators on threads (Dask's local cluster) share this memo
        for old in list(_SHARED_RULES)[:max(0, len(_SHARED_RULES) - _SHARED_KEEP + 1)]:
            _SHARED_RULES.pop(old, None)
        _SHARED_RULES[shared] = hit
    return hit


def rules_key(cfg: ParallelConfig, stage_of: dict[int, int]) -> tuple:
    """What :func:`op_rules` depends on beyond the graph: sequence and expert parallelism and
    the tensor- and expert-tensor-parallel degree of every layer (``stage_of``:
    :func:`stage_of_layers`)."""
    return ("rules", cfg.sp, cfg.ep, tuple(sorted((layer, cfg.tp_of(s), cfg.etp_of(s)) for layer, s in stage_of.items())))


_MOE_RESHAPES = ("dispatch", "combine", "dispatch_grad", "combine_grad", "gate_grad")


def shard_loops(op: Op, rule: Rule, rank_params: dict[int, int], zero_share: int) -> dict[str, int]:
    """The loop sizes of ``op``'s part on one rank under ``rule``: each split loop cut to
    ``ceil(size * num / den)``; an AdamW step over the parameters of its layer group one rank
    holds (``rank_params``), a ``1/zero_share`` part of them (ZeRO)."""
    sizes = {}
    for loop, num, den in rule.split:
        if op.has_dim(loop) and (num != 1 or den != 1):
            sizes[loop] = max(1, -(-op.dim(loop) * num // den))
    if op.param("fn") == "adam":
        sizes["C"] = max(1, -(-rank_params.get(op.param("layer"), 0) // zero_share))
    return sizes


def _op_rules(graph: Graph, cfg: ParallelConfig, stage_of: dict[int, int]) -> dict[str, Rule]:
    layouts: dict[str, str] = {}
    rules: dict[str, Rule] = {}
    t = graph.meta["transformer"]
    share = experts.busiest_share(t.expert_load, cfg.ep)
    load = (share.numerator, share.denominator)
    for op in graph.ops:
        if op.kind == OpKind.INPUT:
            layouts[op.name] = "R"
            continue
        stage = stage_of[op.param("layer")]
        tp = cfg.tp_of(stage)
        rule = rule_for(op, layouts, tp, cfg.sp, cfg.ep, cfg.etp_of(stage) if t.is_moe else 1, load)
        if op.kind == OpKind.RESHAPE and op.param("what") in _MOE_RESHAPES:
            rule = Rule(rule.split, tuple("D" if w == "E" else w for w in rule.want),
                        "D" if rule.out == "E" else rule.out, scale=tp)
        rules[op.name] = rule
        layouts[op.name] = rule.out
    return rules


def prepare_graph(graph: Graph, cfg: ParallelConfig) -> Graph:
    """``graph`` rebuilt (when needed) for one micro-batch of ``cfg`` with its recomputation."""
    t = graph.meta.get("transformer")
    if t is None:
        raise InputError(graph.spec, "", "a parallel configuration needs an LLM workload (gpt, llama, moe or a "
                                         "preset such as llama3-70b)")
    key = ("prepared", cfg.micro_batch, cfg.recompute if t.training else t.recompute, cfg.cp)
    return graph_cached(graph, key, lambda: _prepare(graph, t, cfg))


def _prepare(graph: Graph, t, cfg: ParallelConfig) -> Graph:
    from marssim.workload.llm import build_transformer
    from marssim.workload.llm.config import with_overrides

    changes = {}
    if t.batch != cfg.micro_batch:
        changes["batch"] = cfg.micro_batch
    if t.training and t.recompute != cfg.recompute:
        changes["recompute"] = cfg.recompute
    if cfg.cp > 1:  # a context-parallel rank's tokens (the attention core's ring gives it every key)
        changes["seq"] = t.seq // cfg.cp
    if not changes:
        return graph
    try:
        rebuilt = with_overrides(t, **changes)
    except InputError as err:
        raise InputError(graph.spec, problems=err.problems) from None
    out = build_transformer(rebuilt, spec=graph.spec)
    if cfg.cp > 1:  # the model FLOPs of the whole sequence (attention is quadratic in it)
        from marssim.workload.llm.footprint import footprint

        out.meta["unsplit_footprint"] = footprint(prepare_graph(graph, cfg.with_(cp=1)))
    return out


@dataclass
class _Template:
    """The tasks of one unit of one representative GPU, ids relative to the unit's first task."""

    cols: dict[str, list] = field(default_factory=lambda: defaultdict(list))
    preds: list[list[int]] = field(default_factory=list)
    ext: list[tuple[int, Ref]] = field(default_factory=list)  # (task, reference outside the unit)
    colls: list[Collective] = field(default_factory=list)
    produced: dict[str, tuple[str, tuple]] = field(default_factory=dict)  # tensor -> (layout, refs)
    converted: dict[tuple[str, str], tuple] = field(default_factory=dict)
    kernels: dict[int, int] = field(default_factory=dict)  # compute task -> kernels it launches
    send_wait: int = -1  # the task after its last kernel that waits for its blocking pipeline sends
    last_compute: int = -1
    first_compute: int = -1
    prev_compute: int = -1  # the kernel before the last one
    arrays: dict[str, np.ndarray] | None = None
    n_rows: int = 0  # once built (its rows then held as arrays, see _freeze)
    runs: list[tuple[int, int]] = field(default_factory=list)  # (first, count): rows copying the row before first
    # coupled ring transfers (lowered with coupled rings): (row, the representative whose same row
    # feeds its steps, bytes per step)
    coupled: list[tuple[int, int, float]] = field(default_factory=list)

    def __len__(self) -> int:
        return self.n_rows if self.preds is None else len(self.preds)


_COLUMNS = {"kind": np.int8, "device": np.int32, "duration": np.float64, "src": np.int32, "dst": np.int32,
            "nbytes": np.float64, "route": np.int32, "flops": np.float64, "energy": np.float64, "mem_node": np.int32,
            "mem_bytes": np.float64, "op": np.int32, "collective": np.int32, "steps": np.int32}
"""A template's columns and their dtypes (the TaskGraph's)."""


class _Lowering:
    def __init__(self, graph: Graph, system: System, cfg: ParallelConfig, cost: CostModel, folding: Folding,
                 where: Placement, coupled_rings: bool = False) -> None:
        self.graph = graph
        self.coupled_rings = coupled_rings
        self.system = system
        self.cfg = cfg
        self.cost = cost
        self.fold = folding
        self.place = where
        self.t = graph.meta["transformer"]
        self.H = "S" if cfg.sp else "R"
        self.training = self.t.training
        self.micro_batches = cfg.micro_batches if self.training else 1
        self.chunks = chunk_layers(self.t.layers, cfg)
        self.chunk_of_layer = {layer: c for c, layers in enumerate(self.chunks) for layer in layers}
        self.op_index = graph.index
        self.routes: list[Route] = []
        self.route_id: dict[tuple, int] = {}
        self._hops: dict[tuple, Hop] = {}  # hop()'s memo
        self._plans: dict[tuple, tuple] = {}  # plan()'s memo, by the members' list (kept: its id is the key)
        self.groups: dict[tuple[int, str], list[int]] = {}  # _Builder._group's memo
        self.group_names: dict[tuple[int, str], tuple[str, ...]] = {}  # the names of its GPUs
        self.memo: dict[tuple, object] = {}  # the closed-form screen's memo (.analytic), by named keys
        self.templates: dict[tuple[int, tuple], _Template] = {}
        # shard timings by (op, design, split) and the cost model that timed them: shared by every
        # lowering of this graph with this cost model (kept beside it, so its id is never reused)
        entry = graph_cache(graph).get(("shards", id(cost)))
        if entry is None or entry[0] is not cost:
            entry = graph_cache(graph)[("shards", id(cost))] = (cost, {})
        self.shard_cache: dict[tuple, tuple[tuple[float, float, float, float], str, int]] = entry[1]
        self._shards: dict[tuple[str, str], tuple] = {}  # (op, design) -> its shard_cache entry
        self.cost_models: dict[str, str] = {}  # op -> the cost model that timed it
        self.shape_keys: dict[str, tuple] = graph_cache(graph).setdefault("shape_keys", {})
        self.expert_share = experts.busiest_share(self.t.expert_load, cfg.ep)
        self.designs: dict[int, object] = {}
        self.roles: dict[str, tuple[str, ...]] = graph_cached(graph, "megatron_roles", lambda: roles(graph))
        self.kernels_key = kernels_key(cfg)
        self.optimizer_key = (cfg.clip_grad > 0, cfg.grads_clipped, cfg.fused_adam, grad_dtype(cfg, self.t))
        self._rules()
        self._units()

    # ------------------------------------------------------------------ the graph, once
    def _rules(self) -> None:
        """Every op's tensor-parallel rule and output layout; the ops whose sequence-split output
        another stage of a different tensor-parallel degree reads (gathered before it leaves)."""
        self.rules = op_rules(self.graph, self.cfg)
        self.rules_key = rules_key(self.cfg, stage_of_layers(self.t.layers, self.cfg))
        self.layouts = graph_cached(self.graph, ("layouts", self.rules_key), lambda: {
            op.name: ("R" if op.kind == OpKind.INPUT else self.rules[op.name].out) for op in self.graph.ops})
        self.gather_out: set[str] = set()
        if not self.cfg.uniform:
            stage = {op.name: self.stage_of_chunk(self.chunk_of_layer[op.param("layer")]) for op in self.graph.ops
                     if op.kind != OpKind.INPUT}
            for op in self.graph.ops:
                for src in op.inputs:
                    if src in stage and self.layouts[src] == "S" and \
                            self.cfg.tp_of(stage[src]) != self.cfg.tp_of(stage[op.name]):
                        self.gather_out.add(src)

    def tp_here(self, gpu: int) -> int:
        """The tensor-parallel degree of ``gpu``'s stage."""
        return self.cfg.tp_of(self.place.stage(gpu))

    def _units(self) -> None:
        """Ops of each (chunk, F/B/O) unit, in graph order (shared by the lowerings of this
        graph that cut its layers into the same chunks; read only)."""
        self.unit_ops, self.unit_of = graph_cached(self.graph, ("units", tuple(map(tuple, self.chunks))),
                                                   self._make_units)

    def _make_units(self) -> tuple[dict[tuple[int, str], list[Op]], dict[str, tuple[int, str]]]:
        unit_ops: dict[tuple[int, str], list[Op]] = {}
        unit_of: dict[str, tuple[int, str]] = {}
        direction_of = {"fwd": "F", "bwd": "B", "recompute": "B", "opt": "O"}
        for op in self.graph.ops:
            if op.kind == OpKind.INPUT:
                continue
            key = (self.chunk_of_layer[op.param("layer")], direction_of[op.param("phase", "fwd")])
            unit_ops.setdefault(key, []).append(op)
            unit_of[op.name] = key
        return unit_ops, unit_of

    def stage_of_chunk(self, chunk: int) -> int:
        return chunk % self.cfg.pp

    def gpu_on_stage(self, gpu: int, stage: int) -> int:
        return self.place.on_stage(gpu, stage)

    # ------------------------------------------------------------------ routes and shards
    def route(self, src: int, dst: int, per: int | None = None, pattern: str | None = None) -> int:
        """Index of the (folded) route ``src`` -> ``dst``, standing for a flow per member of
        ``per``'s class (default: the sender's), of communication pattern ``pattern`` (its
        latency, :meth:`Folding.latency`)."""
        key = (src, dst, per, pattern)
        r = self.route_id.get(key)
        if r is None:
            r = self.route_id[key] = len(self.routes)
            self.routes.append(self.fold.route(src, dst, per, pattern))
        return r

    def wait_route(self, gpu: int, seconds: float) -> int:
        """Index of a route on ``gpu`` that holds no resource and takes ``seconds``: a transfer
        over it waits beside the GPU's stream (a latency-bound collective whose links do not
        matter)."""
        key = ("wait", gpu, seconds)
        r = self.route_id.get(key)
        if r is None:
            r = self.route_id[key] = len(self.routes)
            name = self.system.nodes[gpu]
            self.routes.append(Route((name,), (), float(seconds)))
        return r

    def plan(self, kind: str, nbytes: float, members: list[int]) -> CollectivePlan | None:
        """NCCL's plan of collective ``kind`` of ``nbytes`` over the GPUs ``members``
        (:func:`marssim.collectives.group.group_plan`); None where the collective model does not
        describe the group (the ring then runs at the links' line rate)."""
        if not self.cfg.nccl:
            return None
        key = (kind, nbytes, id(members))
        hit = self._plans.get(key)
        if hit is None or hit[0] is not members:
            names = self.system.nodes
            hit = self._plans[key] = (members, group_plan(self.system, [names[g] for g in members], kind, nbytes))
        return hit[1]

    def pull_pattern(self, stage: int, source: int) -> str | None:
        """The pattern of a pipeline transfer that ``stage`` pulls from ``source``."""
        if self.cfg.pp > 1 and source == (stage + 1) % self.cfg.pp:
            return "pull+1"
        if self.cfg.pp > 1 and source == (stage - 1) % self.cfg.pp:
            return "pull-1"
        return None

    def hop(self, src: int, dst: int, plan: CollectivePlan, pattern: str | None = None) -> Hop:
        """A step of ``plan`` on the route ``src`` -> ``dst`` as it is alone on its links (the
        concrete route, so that folded and full lowerings weigh a step alike; the latency its
        pattern's transfers wait, :meth:`Folding.latency`)."""
        key = (src, dst, pattern, plan)
        hit = self._hops.get(key)
        if hit is None:
            names = self.system.nodes
            concrete = binding_route(self.system, names[src], names[dst])
            hit = self._hops[key] = hop_step(plan, route_bottleneck(self.system.resource_capacity, concrete.resources),
                                             self.fold.latency(src, dst, pattern))
        return hit

    def step_route(self, src: int, dst: int, per: int | None, plan: CollectivePlan | None,
                   pattern: str | None = None) -> int:
        """Index of the route of a step of ``plan`` from ``src`` to ``dst`` (see
        :func:`marssim.collectives.group.hop_step`): the (folded) route with the step's latency
        and its weights times the step's factor; the plain route without a plan."""
        r = self.route(src, dst, per, pattern)
        if plan is None:
            return r
        hop = self.hop(src, dst, plan, pattern)
        key = (src, dst, per, pattern, hop.latency, hop.factor)
        got = self.route_id.get(key)
        if got is None:
            base = self.routes[r]
            weights = base.weights or (1.0,) * len(base.resources)
            got = self.route_id[key] = len(self.routes)
            self.routes.append(replace(base, latency=hop.latency, weights=tuple(w * hop.factor for w in weights)))
        return got

    def design(self, gpu: int):
        d = self.designs.get(gpu)
        if d is None:
            name = self.system.nodes[gpu]
            d = self.designs[gpu] = self.system.design(name, self.system.accelerator(name).designs[0])
        return d

    def shard(self, op: Op, gpu: int) -> tuple[float, float, float, float]:
        """``(seconds, FLOPs, joules, output bytes)`` of ``op``'s part on ``gpu``: the kernels its
        task runs in Megatron-LM (:func:`.megatron.op_kernels`; the optimizer step's after the
        global norm, :func:`.megatron.optimizer_kernels`), each timed by the cost model."""
        return self._shard_entry(op, gpu)[0]

    def _shard_entry(self, op: Op, gpu: int) -> tuple:
        """``(timing, cost model, kernels)`` of ``op`` on ``gpu`` (:meth:`shard`), memoised in
        this lowering by op and design (what else its key holds is fixed within a lowering)."""
        d = self.design(gpu)
        mine = self._shards.get((op.name, d.name))
        if mine is not None:
            return mine
        key = self._shard_key(op, d)
        hit = self.shard_cache.get(key)
        if hit is not None:
            self.cost_models.setdefault(op.name, hit[1])
            self._shards[(op.name, d.name)] = hit
            return hit
        rule = self.rules[op.name]
        adam = op.param("fn") == "adam"
        op_roles = self.roles.get(op.name, ())
        sizes = shard_loops(op, rule, self.opt_params, self.cfg.dp_cp if self.cfg.zero >= 1 else 1)
        part = op.with_loops(**sizes) if sizes else op
        c = self.cost.op_cost(part, d)
        self.cost_models.setdefault(op.name, c.model)
        seconds, flops, energy = c.time, float(part.flops), c.energy
        # Megatron-LM's kernels in training; a serving engine runs the graph's own
        kernels = None if not self.training else optimizer_kernels(op.name, part.dim("C"), self.t, self.cfg)[1] \
            if adam else op_kernels(op, part, op_roles, self.cfg)
        if kernels is not None:
            seconds, energy = self._kernels_time(kernels, part, c, d)
        out_bytes = 0.0 if op.param("keep") and op.param("fn") == "adam" else float(part.output_bytes)
        if rule.scale > 1:
            seconds, flops, energy, out_bytes = seconds / rule.scale, flops / rule.scale, energy / rule.scale, \
                out_bytes / rule.scale
        timing = (float(seconds), flops, float(energy), out_bytes)
        entry = self.shard_cache[key] = self._shards[(op.name, d.name)] = \
            (timing, c.model, 1 if kernels is None else len(kernels))
        return entry

    def _shard_key(self, op: Op, design) -> tuple:
        rule = self.rules[op.name]
        adam = op.param("fn") == "adam"
        share = (self.opt_params.get(op.param("layer"), 0), self.cfg.dp_cp if self.cfg.zero >= 1 else 1) if adam else ()
        op_roles = self.roles.get(op.name, ())
        return (self._shape(op), design.name, rule.split, rule.scale, share, op_roles,
                self.kernels_key if op_roles else (), self.optimizer_key if adam else ())

    def kernels(self, op: Op, gpu: int) -> int:
        """How many kernels the task of ``op`` on ``gpu`` launches (after :meth:`shard`)."""
        return self._shard_entry(op, gpu)[2]

    def launch(self, gpu: int) -> float:
        """Seconds the host takes to launch a kernel on ``gpu`` (:func:`.host.launch_seconds`; 0
        without ``host_gaps`` or host measurements of its device and stack)."""
        gpu_spec = self.design(gpu).gpu
        if not self.cfg.host_gaps or gpu_spec is None:
            return 0.0
        return launch_seconds(gpu_spec.calibration, gpu_spec.stack)

    def _kernels_time(self, kernels, part: Op, own, design) -> tuple[float, float]:
        """Seconds and joules of ``kernels`` run one after another (``part``: the op's own
        shard, already timed as ``own``)."""
        seconds = energy = 0.0
        for k in kernels:
            c = own if k is part else self.cost.op_cost(k, design)
            seconds += c.time
            energy += c.energy
        return seconds, energy

    def optimizer_before_norm(self, op: Op, gpu: int) -> tuple[float, str, int]:
        """Seconds of the optimizer step's kernels before the global norm's all-reduce over the
        parameters of ``op``'s group one rank updates (:func:`.megatron.optimizer_kernels`), the
        cost model that timed them and how many they are."""
        d = self.design(gpu)
        params = max(1, -(-self.opt_params.get(op.param("layer"), 0) // (self.cfg.dp_cp if self.cfg.zero >= 1 else 1)))
        key = ("before_norm", params, d.name, self.t.dtype, self.optimizer_key)
        hit = self.shard_cache.get(key)
        if hit is None:
            costs = [self.cost.op_cost(k, d) for k in optimizer_kernels(op.name, params, self.t, self.cfg)[0]]
            hit = self.shard_cache[key] = (sum(c.time for c in costs), "+".join(sorted({c.model for c in costs})),
                                           len(costs))
        return hit

    def _shape(self, op: Op) -> tuple:
        """What an op's shard timing depends on, without its name (blocks share timings)."""
        key = self.shape_keys.get(op.name)
        if key is None:
            params = tuple((k, v) for k, v in op.params if k not in ("layer", "shares", "mask_of"))
            key = self.shape_keys[op.name] = (op.kind, op.loops, params, op.in_shapes, op.out_shape,
                                              op.weight_elems, op.dtype)
        return key

    def layout_bytes(self, name: str, layout: str) -> float:
        """Bytes of tensor ``name`` one rank (of its producer's stage) holds in ``layout``."""
        op = self.graph.ops[self.op_index[name]]
        full = float(op.output_bytes)
        if op.kind == OpKind.INPUT:
            return full
        stage = self.stage_of_chunk(self.chunk_of_layer[op.param("layer")])
        tp = self.cfg.tp_of(stage)
        if layout in ("S", "F"):
            return full / tp
        if layout in experts.EXPERT_LAYOUTS:
            return full * experts.layout_fraction(layout, tp, self.cfg.etp_of(stage), self.expert_share)
        return full

    # ------------------------------------------------------------------ templates
    def template(self, rep: int, key: tuple[int, str]) -> _Template:
        hit = self.templates.get((rep, key))
        if hit is None:
            hit = self.templates[(rep, key)] = _Builder(self, rep, key).build()
        return hit


class _Builder:
    """Builds the :class:`_Template` of one unit of one representative GPU."""

    def __init__(self, low: _Lowering, rep: int, key: tuple[int, str]) -> None:
        self.low = low
        self.rep = rep
        self.key = key
        self.t = _Template()
        self.node_names = low.system.nodes
        self._issued: dict[str, tuple] = {}  # per ring pattern (communicator): its last collective's refs

    # ------------------------------------------------------------------ rows
    def _row(self, kind: int, device: int, duration: float, src: int, dst: int, nbytes: float, route: int,
             flops: float, energy: float, mem_node: int, mem_bytes: float, op: int, coll: int, deps,
             steps: int = 1) -> int:
        t = self.t
        rel = len(t.preds)
        c = t.cols
        c["kind"].append(kind)
        c["device"].append(device)
        c["duration"].append(duration)
        c["src"].append(src)
        c["dst"].append(dst)
        c["nbytes"].append(nbytes)
        c["route"].append(route)
        c["flops"].append(flops)
        c["energy"].append(energy)
        c["mem_node"].append(mem_node)
        c["mem_bytes"].append(mem_bytes)
        c["op"].append(op)
        c["collective"].append(coll)
        c["steps"].append(steps)
        local = []
        for ref in dict.fromkeys(deps):
            if ref[1] == self.rep and ref[2] == self.key and ref[4] == "same":
                local.append(ref[3])
            else:
                t.ext.append((rel, ref))
        t.preds.append(local)
        return rel

    def _repeat_step(self, first: int, count: int, prv_rep: int) -> int:
        """``count`` more rows like ``first`` (a ring step's transfer), each after the one before
        it here and the same step of ``prv_rep``'s ring rank (the rank that sends to this one):
        :meth:`ring`'s steps, appended at once. Returns the last row."""
        if count <= 0:
            return first
        t = self.t
        c = t.cols
        for name, col in c.items():
            col.extend([col[first]] * count)
        t.preds.extend(itertools.repeat(_AFTER_PREVIOUS, count))
        t.runs.append((first + 1, count))
        # the references to prv_rep's steps, as one entry (expanded by _template_edges)
        t.ext.append((first + 1, ("steps", count, prv_rep, self.key)))
        return first + count

    def me(self, rel: int) -> Ref:
        return ("u", self.rep, self.key, rel, "same")

    def compute(self, op: Op, deps, timing: tuple[float, float, float, float] | None = None) -> int:
        """A kernel of ``op`` (its shard, or ``timing``: seconds, FLOPs, joules, output bytes of a
        part of it) after ``deps`` and this GPU's kernel before it."""
        seconds, flops, energy, out_bytes = timing or self.low.shard(op, self.rep)
        t = self.t
        if t.last_compute >= 0:
            deps = tuple(deps) + (self.me(t.last_compute),)
        rel = self._row(COMPUTE, self.rep, seconds, -1, -1, 0.0, -1, flops, energy,
                        self.rep if out_bytes > 0 else -1, out_bytes, self.low.op_index[op.name], -1, deps)
        t.kernels[rel] = self.low.kernels(op, self.rep)
        if t.first_compute < 0:
            t.first_compute = rel
        t.last_compute = rel
        return rel

    def kernel_row(self, op: Op, seconds: float, deps, kernels: int = 1) -> int:
        """A compute task of ``seconds`` (``kernels`` kernels) on this GPU labelled ``op``
        (kernels Megatron-LM runs for it that are not the op's own shard), after this unit's
        previous kernel."""
        t = self.t
        if t.last_compute >= 0:
            deps = tuple(deps) + (self.me(t.last_compute),)
        rel = self._row(COMPUTE, self.rep, seconds, -1, -1, 0.0, -1, 0.0, 0.0, -1, 0.0, self.low.op_index[op.name], -1,
                        deps)
        t.kernels[rel] = kernels
        if t.first_compute < 0:
            t.first_compute = rel
        t.prev_compute, t.last_compute = t.last_compute, rel
        return rel

    def flow(self, src: int, dst: int, nbytes: float, op: str, coll: int, deps, hold: bool, steps: int = 1,
             pulled: bool = False, plan: CollectivePlan | None = None, held: float | None = None,
             pattern: str | None = None) -> int:
        """A transfer of ``nbytes`` (in ``steps`` back-to-back steps) from ``src`` to ``dst``;
        ``hold``: the receiver keeps ``held`` bytes (default ``nbytes``) until the transfer's
        readers end; ``pulled``: one such transfer per member of the receiver's class (else of the
        sender's); ``plan``: the collective whose steps these are (their latency and weight on the
        links, else the route's own); ``pattern``: the communication pattern it belongs to (the
        latency it waits, :meth:`Folding.latency`)."""
        low = self.low
        route = low.step_route(src, dst, dst if pulled else None, plan, pattern)
        receiver = low.fold.rep(dst) if dst in low.fold.class_of else dst
        return self._row(TRANSFER, -1, 0.0, src, dst, nbytes, route, 0.0, 0.0, receiver if hold else -1,
                         (nbytes if held is None else held) if hold else 0.0, low.op_index[op], coll, deps, steps)

    # ------------------------------------------------------------------ collectives
    def _collective(self, kind: str, group: str, pattern: str, nbytes: float, op: str, steps: int,
                    algorithm: str = "ring") -> int:
        names = self.low.group_names.get((self.rep, pattern))
        if names is None:
            names = self.low.group_names[(self.rep, pattern)] = tuple(self.node_names[g] for g in self._group(pattern))
        coll = Collective(kind, algorithm, names, float(nbytes), op, steps, group)
        self.t.colls.append(coll)
        return len(self.t.colls) - 1

    def _group(self, pattern: str) -> list[int]:
        """The GPUs of ``pattern``'s ring from this representative on (memoised per lowering)."""
        key = (self.rep, pattern)
        hit = self.low.groups.get(key)
        if hit is not None:
            return hit
        peer = self.low.place.patterns().get(pattern) if pattern else None
        out = [self.rep]
        if peer is not None:
            seen = {self.rep}
            g = peer(self.rep)
            while g not in seen and len(out) < 1 << 16:
                out.append(g)
                seen.add(g)
                g = peer(g)
        self.low.groups[key] = out
        return out

    def ring(self, kind: str, group: str, pattern: str, size: float, n: int, op: str, deps,
             plan: "CollectivePlan | None | object" = _GROUP_PLAN, max_rows: int = 0) -> tuple:
        """A collective over the ``n`` ranks of ``pattern``'s ring of ``size`` bytes (the whole
        tensor per rank) as NCCL runs it (:meth:`_Lowering.plan`): its steps, each rank sending
        the step's bytes to its ring neighbour with the step's latency and weight on the links
        (:func:`marssim.collectives.group.hop_step`); without a plan, ring steps at the links'
        line rate: all-reduce 2(n-1) steps, reduce-scatter and all-gather n-1, each sending size/n.
        ``plan``: the plan to run instead of the group's own (its steps over this ring). The
        collectives of one ring pattern (one NCCL communicator) run one after another in the
        order this unit issues them, as NCCL runs a communicator's operations on its stream.
        ``max_rows``: a ring over several classes of GPUs takes at most this many transfers per
        rank (0: one per step; see below). Returns the refs after which this rank's result is
        ready."""
        if n <= 1 or size <= 0:
            return tuple(deps)
        # a communicator runs its collectives one after another, in the order they are issued
        deps = tuple(dict.fromkeys(tuple(deps) + self._issued.get(pattern, ())))
        low = self.low
        peer = low.place.patterns()[pattern]
        members = self._group(pattern)
        if plan is _GROUP_PLAN:
            plan = low.plan(kind, size, members)
        if plan is None:
            steps, chunk, algorithm = ring_steps(kind, n), size / n, "ring"
        else:
            steps, chunk, algorithm = plan.steps, plan.payload_per_step, plan.algorithm
        nxt = peer(self.rep)
        prv = members[-1] if peer(members[-1]) == self.rep else self.rep  # the ring's rank before this one
        prv_rep = low.fold.rep(prv)
        coll = self._collective(kind, group, pattern, size, op, steps, algorithm)
        if prv_rep == self.rep:
            # the whole ring is this GPU's class: every rank's steps follow each other in lockstep,
            # so the steps are one transfer of `steps` back-to-back steps (exact, see TaskGraph.steps)
            rel = self.flow(self.rep, nxt, chunk * steps, op, coll, tuple(deps), hold=False, steps=steps, plan=plan,
                            pattern=pattern)
            self._issued[pattern] = (self.me(rel),)
            return (self.me(rel),)
        if low.coupled_rings and steps > 1:
            # one transfer of `steps` steps whose k-th step waits for its own (k-1)-th and for the
            # (k-1)-th of prv_rep's same transfer: the steps below as one row (TaskProgram.coupled)
            last = self.flow(self.rep, nxt, chunk * steps, op, coll, tuple(deps), hold=False, steps=steps, plan=plan,
                             pattern=pattern)
            self.t.coupled.append((last, prv_rep, float(chunk)))
        elif max_rows and steps > max_rows:
            # at most max_rows transfers, each of `per` back-to-back steps, each after its own
            # previous one and prv_rep's (the steps coupled per transfer rather than per step:
            # the same times while the ranks run in lockstep)
            per = -(-steps // max_rows)
            rows, rest = divmod(steps, per)
            first = self.flow(self.rep, nxt, chunk * per, op, coll, tuple(deps), hold=False, steps=per, plan=plan,
                              pattern=pattern)
            last = self._repeat_step(first, rows - 1, prv_rep)
            if rest:
                last = self.flow(self.rep, nxt, chunk * rest, op, coll, (self.me(last), ("u", prv_rep, self.key, last,
                                 "same")), hold=False, steps=rest, plan=plan, pattern=pattern)
        else:
            first = self.flow(self.rep, nxt, chunk, op, coll, tuple(deps), hold=False, plan=plan, pattern=pattern)
            last = self._repeat_step(first, steps - 1, prv_rep)
        done = tuple(dict.fromkeys((self.me(last), ("u", prv_rep, self.key, last, "same"))))
        self._issued[pattern] = done
        return done

    def all_to_all(self, size: float, op: str, deps) -> tuple:
        """Direct all-to-all over the expert-parallel group: 1/ep of ``size`` to each peer."""
        low = self.low
        ep = low.cfg.ep
        if ep <= 1 or size <= 0:
            return tuple(deps)
        patterns = low.place.patterns()
        coll = self._collective("all_to_all", "ep", "ep+1", size, op, 1, "direct")
        ready = []
        for k in range(1, ep):
            peer = patterns[f"ep+{k}"]
            rel = self.flow(self.rep, peer(self.rep), size / ep, op, coll, deps, hold=False)
            ready.append(self.me(rel))
            source = patterns[f"ep+{ep - k}"](self.rep)  # who sends to this rank in the same step
            ready.append(("u", low.fold.rep(source), self.key, rel, "same"))
        return tuple(dict.fromkeys(ready))

    # ------------------------------------------------------------------ tensors
    def tensor(self, name: str, want: str, op_name: str) -> tuple:
        """Refs to wait for before reading tensor ``name`` in layout ``want`` (adding the
        transfers and collectives that bring it here)."""
        low = self.low
        producer = low.graph.ops[low.op_index[name]]
        if producer.kind == OpKind.INPUT:
            return ()
        t = self.t
        hit = t.converted.get((name, want))
        if hit is not None:
            return hit
        have, refs = self.locate(name)
        if have != want and want != "*" and self.low.unit_of.get(name) != self.key and t.prev_compute >= 0:
            # a tensor kept from another unit is converted when the kernel before its reader starts
            # (Megatron-LM launches the all-gather of a saved input as the input-gradient GEMM
            # starts), not as soon as it was produced
            refs = refs + (self.me(t.prev_compute),)
        refs = self.convert(name, have, want, refs, op_name)
        t.converted[(name, want)] = refs
        return refs

    def locate(self, name: str) -> tuple[str, tuple]:
        """Where tensor ``name`` is, as (layout, refs): produced in this unit, in another unit of
        this GPU, or on another stage (then a point-to-point transfer brings it here)."""
        low = self.low
        t = self.t
        if name in t.produced:
            return t.produced[name]
        key = low.unit_of[name]
        mode = "last" if self.key[1] == "O" and key[1] != "O" else "same"
        stage = low.stage_of_chunk(key[0])
        here = low.stage_of_chunk(self.key[0])
        if stage == here:
            other = low.template(self.rep, key)
            layout, refs = other.produced[name]
            return layout, tuple(r if r[4] == "last" else (*r[:4], mode) for r in refs)
        peer = low.gpu_on_stage(self.rep, stage)
        sender = low.fold.rep(peer)
        other = low.template(sender, key)
        layout, refs = other.produced[name]
        refs = tuple(r if r[4] == "last" else (*r[:4], mode) for r in refs)
        nbytes = low.layout_bytes(name, layout)
        tp = low.tp_here(self.rep)
        # Megatron-LM's scatter/gather of pipeline activations (p2p_communication.py, _communicate:
        # scatter_gather_tensors_in_pipeline, not with sequence parallelism): each tensor-parallel
        # rank sends its 1/tp of the tensor, the receivers all-gather it
        split = (low.cfg.scatter_gather and layout == "R" and tp > 1 and self.key[1] != "O"
                 and low.cfg.tp_of(stage) == tp and int(round(nbytes)) % tp == 0)
        sent = nbytes / tp if split else nbytes
        plan = low.plan("send_recv", sent, [peer, self.rep])
        coll = self._collective("p2p", "emb" if self.key[1] == "O" else "pp", "", sent, name, 1,
                                "direct" if plan is None else plan.algorithm)
        rel = self.flow(peer, self.rep, sent, name, coll, refs, hold=True, pulled=True, plan=plan, held=nbytes,
                        pattern=low.pull_pattern(here, stage))
        if other.send_wait >= 0 and self.key[1] != "O":  # a blocking pipeline send: its sender waits for it
            other.ext.append((other.send_wait, self.me(rel)))
        ready = (self.me(rel),)
        if split:
            ready = ready + self.ring("all_gather", "pp", "tp+1", nbytes, tp, name, ready)
        result = (layout, ready + tuple(r for r in refs if r[1] == self.rep))
        t.produced[name] = result
        return result

    def convert(self, name: str, have: str, want: str, refs: tuple, op_name: str) -> tuple:
        low = self.low
        if have == want or want == "*":
            return refs
        tp = low.tp_here(self.rep)
        full = low.layout_bytes(name, "R")
        if have in experts.EXPERT_LAYOUTS and want in experts.EXPERT_LAYOUTS:
            return self._expert_conversion(name, have, want, refs)
        if have == "P" and want in ("R", "S", "F"):
            kind = "reduce_scatter" if want in ("S", "F") else "all_reduce"
            return refs + self.ring(kind, "tp", "tp+1", full, tp, name, refs)
        if have in ("S", "F") and want == "R":
            return refs + self.ring("all_gather", "tp", "tp+1", full, tp, name, refs)
        if have == "S" and want == "F":
            return refs + self.ring("all_gather", "tp", "tp+1", full, tp, name, refs)
        return refs  # R -> S/F/D/E, D/E among themselves without ep, F -> S: local slices

    def _expert_conversion(self, name: str, have: str, want: str, refs: tuple) -> tuple:
        """Routed tokens from one expert layout to another (:func:`.experts.expert_path`): the
        all-to-all over the expert-parallel group (the busiest rank's tokens), the all-gather and
        reduce-scatter over the expert-tensor-parallel group."""
        low = self.low
        stage = low.place.stage(self.rep)
        etp, pattern = low.cfg.etp_of(stage), experts.etp_pattern(low.cfg, stage)
        for step in experts.expert_path(have, want):
            if step == "a2a":
                refs = refs + self.all_to_all(low.layout_bytes(name, "E"), name, refs)
            elif step == "ag":
                refs = refs + self.ring("all_gather", "tp", pattern, low.layout_bytes(name, "X"), etp, name, refs)
            else:
                refs = refs + self.ring("reduce_scatter", "tp", pattern, low.layout_bytes(name, "Z"), etp, name, refs)
        return refs

    # ------------------------------------------------------------------ the unit
    def build(self) -> _Template:
        low = self.low
        chunk, direction = self.key
        t = self.t
        if direction == "O":
            self._optimizer()
        elif direction == "G":
            overlap.param_gather_unit(self)
        else:
            plan = low.zero3_plans.get(self.key) if low.zero3_plans else None
            starts = {u.first: i for i, u in enumerate(plan.uses)} if plan is not None else {}
            ready: dict[int, tuple] = {}
            if starts:  # the unit's start on its GPU (after the unit before it), where its first gathers issue
                t.first_compute = t.last_compute = self._row(
                    COMPUTE, self.rep, 0.0, -1, -1, 0.0, -1, 0.0, 0.0, -1, 0.0,
                    low.op_index[low.unit_ops[self.key][0].name], -1, ())
            for i, op in enumerate(low.unit_ops.get(self.key, [])):
                if i in starts:
                    self._zero3_use(plan, starts[i], op, ready)
                self.op(op)
        launch = low.launch(self.rep)
        if launch > 0 and t.kernels:  # the host's launch gaps, the unit starting synchronised (.host)
            rows = sorted(t.kernels)
            durations = t.cols["duration"]
            for r, gap in zip(rows, launch_gaps([durations[r] for r in rows], [t.kernels[r] for r in rows], launch)):
                durations[r] += gap
        if overlap.sends_block(low, self.key):  # its sends' end, which the GPU's next kernel waits for
            t.send_wait = self._row(COMPUTE, self.rep, 0.0, -1, -1, 0.0, -1, 0.0, 0.0, -1, 0.0,
                                    low.op_index[low.unit_ops[self.key][-1].name], -1, (self.me(t.last_compute),))
            t.prev_compute, t.last_compute = t.last_compute, t.send_wait
        t.arrays = {name: _column_array(t.cols[name], dtype, t.runs) for name, dtype in _COLUMNS.items()}
        _freeze(t)
        return t

    def op(self, op: Op) -> None:
        low = self.low
        rule = low.rules[op.name]
        refs = userbuffers.pipelined(self, op, rule) if low.cfg.tp_comm_overlap and not rule.alias else None
        if refs is None:
            deps: list = []
            for name, want in zip(op.inputs, rule.want):
                deps.extend(self.tensor(name, want, op.name))
            if self._param_deps:
                deps.extend(self._param_deps)
            deps.extend(overlap.param_gather_deps(self, op))
            if rule.alias:
                self.t.produced[op.name] = (rule.out, tuple(dict.fromkeys(deps)))
                return
            if context.is_ring_core(op, low.cfg.cp):
                refs = context.ring_core(self, op, tuple(deps))
            else:
                refs = (self.me(self.compute(op, deps)),)
        tp = low.tp_here(self.rep)
        if rule.loss_reduce:  # vocabulary-parallel cross-entropy: max, target logit, sum of exponentials
            t = low.t
            refs = refs + self.ring("all_reduce", "tp", "tp+1", 3 * 4.0 * t.batch * t.seq, tp, op.name, refs)
        out = rule.out
        if op.name in low.gather_out:  # read by a stage of another tensor-parallel degree: leaves whole
            refs = refs + self.ring("all_gather", "tp", "tp+1", low.layout_bytes(op.name, "R"), tp, op.name, refs)
            out = "R"
        self.t.produced[op.name] = (out, refs)

    _param_deps: tuple = ()

    def _zero3_use(self, plan, use: int, op: Op, ready: dict[int, tuple]) -> None:
        """ZeRO-3 at the hook of ``plan``'s use ``use`` (whose first op is ``op``): its own
        all-gather (a fetch) when the kernel before it has ended, then the prefetches it issues
        once its parameters are there, one after another on the data-parallel communicator
        (:mod:`.zero3`); the use's kernels wait for its parameters."""
        low = self.low
        t = self.t
        issue = (self.me(t.last_compute),) if t.last_compute >= 0 else ()
        mine = [k for k, g in enumerate(plan.gathers) if g.issuer == use]
        for k in mine:
            if plan.gathers[k].use == use:
                ready[k] = self.ring("all_gather", "dp", "dp+1", plan.gathers[k].params * low.param_bytes, low.cfg.dp_cp,
                                     op.name, issue, max_rows=zero3.RING_ROWS)
        source = plan.source[use]
        own = ready.get(source, ()) if source >= 0 else ()
        for k in mine:
            if plan.gathers[k].use != use:
                ready[k] = self.ring("all_gather", "dp", "dp+1", plan.gathers[k].params * low.param_bytes, low.cfg.dp_cp,
                                     op.name, issue + own, max_rows=zero3.RING_ROWS)
        self._param_deps = own

    def _optimizer(self) -> None:
        """After the chunk's last backward: its gradients reduced over the data-parallel group in
        buckets, in the gradient buffer's type (:func:`.megatron.grad_dtype`), one bucket after
        another (:meth:`ring`; the chunks of an interleaved schedule each have their own order
        here). On the stage's last
        chunk, the optimizer step of the stage as Megatron-LM's ``optimizer.step`` runs it, after
        ``reduce_model_grads`` (``optimizer/optimizer.py``): the norm and bias gradients of sequence
        parallelism all-reduced over the tensor-parallel group (``allreduce_layernorm_grads``), the
        tied word embedding's gradient all-reduced between the first and last stage
        (``allreduce_word_embedding_grads``), per group the kernels before the global norm, the
        all-reduces over the model-parallel group (fp16's inf/NaN flag, the norm:
        :meth:`_model_parallel_all_reduce`), then per group the Adam step and what follows it;
        ZeRO's parameter all-gather."""
        low = self.low
        cfg = low.cfg
        ops = low.unit_ops.get(self.key, [])
        if not ops:
            return
        gb = low.grad_bytes
        buffers = [op for op in ops if op.param("what") == "grad_buffer"]
        # buckets in the order gradients complete: the chunk's later layers first
        buckets: list[list[Op]] = []
        size = 0
        for buf in sorted(buffers, key=lambda o: -o.param("layer")):
            if not buckets or size >= (cfg.zero3_bucket if cfg.zero == 3 else cfg.bucket):
                buckets.append([])
                size = 0
            buckets[-1].append(buf)
            size += low.opt_params.get(buf.param("layer"), 0)
        kind = "reduce_scatter" if cfg.zero >= 1 else "all_reduce"
        for bucket in buckets:
            deps: list = []
            dense = expert = 0.0
            for buf in bucket:
                for name in buf.inputs:
                    deps.extend(self._gradient(name, buf))
                dense += low.opt_params.get(buf.param("layer"), 0) - low.rank_expert_params.get(buf.param("layer"), 0)
                expert += low.rank_expert_params.get(buf.param("layer"), 0)
            if not cfg.overlap_grad_reduce:
                deps.append(("u", self.rep, ("last-backward", 0), 0, "last"))
            name = bucket[0].name
            ready = self.ring(kind, "dp", "dp+1", dense * gb, cfg.dp_cp, name, tuple(deps))
            if expert:  # over the ranks that hold the same expert weights
                pattern, n = experts.gradient_group(cfg, low.place.stage(self.rep))
                ready = ready + self.ring(kind, "dp", pattern, expert * gb, n, name, tuple(deps))
            for buf in bucket:
                self.t.produced[buf.name] = ("R", tuple(dict.fromkeys(ready)))
        chunk = self.key[0]
        stage = low.stage_of_chunk(chunk)
        chunks = [c for c in range(len(low.chunks)) if low.stage_of_chunk(c) == stage and (c, "O") in low.unit_ops]
        if chunk != chunks[-1]:
            return  # the stage's last chunk steps the optimizer for all of them
        stage_ops = [op for c in chunks for op in low.unit_ops[(c, "O")]]
        ready_of: dict[int, tuple] = {}
        for buf in stage_ops:
            if buf.param("what") == "grad_buffer":
                ready_of[buf.param("layer")] = self.tensor(buf.name, "*", buf.name)
        everything = tuple(dict.fromkeys(r for refs in ready_of.values() for r in refs))
        if cfg.sp and low.tp_here(self.rep) > 1:  # the norms' and row-parallel biases' gradients
            blocks = sum(1 for layer in ready_of if 0 <= layer < low.t.layers)
            everything = everything + self.ring("all_reduce", "tp", "tp+1", blocks * sequence_parallel_params(low.t)
                                                * gb, low.tp_here(self.rep), stage_ops[0].name, everything)
        head = low.t.layers
        if low.tied_copy and head in ready_of:  # the last stage's copy of the word embedding
            ready_of[head] = ready_of[head] + self._embedding_all_reduce("embed.tokens.grad", stage_ops[0].name,
                                                                         everything)
        adams = sorted(((op.param("layer"), op) for op in stage_ops if op.param("fn") == "adam"), key=lambda kv: -kv[0])
        before = []
        for layer, adam in adams:
            buf = next(op for op in stage_ops if op.param("what") == "grad_buffer" and op.param("layer") == layer)
            seconds, model, count = low.optimizer_before_norm(adam, self.rep)
            if seconds <= 0:
                continue
            low.cost_models.setdefault(buf.name, model)
            deps = ready_of.get(layer, ()) + (everything if cfg.sp else ())
            before.append(self.me(self.kernel_row(buf, seconds, deps, count)))
        synced = tuple(before)
        if adams and low.training:
            for _ in range((cfg.clip_grad > 0) + grad_scaled(low.t)):  # fp16's inf/NaN flag, then the norm
                synced = self._model_parallel_all_reduce(4.0, adams[0][1].name, synced)
        steps = []
        for layer, adam in adams:
            rel = self.compute(adam, ready_of.get(layer, ()) + synced)
            self.t.produced[adam.name] = ("R", (self.me(rel),))
            steps.append((layer, adam, rel))
        overlap.after_steps(self, steps)

    def _gradient(self, name: str, buf: Op) -> tuple:
        """Refs to wait for before gradient ``name`` joins the buffer ``buf``: the gradient of the
        tied output layer, on the last stage, comes to the first stage's word embedding through
        their all-reduce (:meth:`_embedding_all_reduce`)."""
        low = self.low
        key = low.unit_of.get(name)
        if key is not None and low.tied_copy and low.stage_of_chunk(key[0]) != low.stage_of_chunk(self.key[0]):
            return self._embedding_all_reduce(name, buf.name, ())
        return self.tensor(name, "*", buf.name)

    def _embedding_all_reduce(self, name: str, op: str, deps: tuple) -> tuple:
        """The all-reduce of the word embedding's gradient between the first and the last stage
        (Megatron-LM's embedding group: the two ranks of the same tensor-parallel rank), of the
        vocabulary part one rank holds, in the gradient buffer's type, as this rank receives it:
        after ``name``, produced on the other stage (its gradient), a transfer from that stage's
        GPU timed as the two ranks' all-reduce."""
        low = self.low
        t = self.t
        hit = t.converted.get((name, "all_reduce"))
        if hit is not None:
            return hit
        key = low.unit_of[name]
        peer = low.gpu_on_stage(self.rep, low.stage_of_chunk(key[0]))
        sender = low.fold.rep(peer)
        layout, refs = low.template(sender, key).produced[name]
        mode = "last" if key[1] != "O" else "same"
        refs = tuple(r if r[4] == "last" else (*r[:4], mode) for r in refs)
        nbytes = low.word_embedding_params * low.grad_bytes
        plan = low.plan("all_reduce", nbytes, [peer, self.rep])
        coll = self._collective("all_reduce", "emb", "", nbytes, op, 2 if plan is None else plan.steps,
                                "ring" if plan is None else plan.algorithm)
        steps = 1 if plan is None else plan.steps
        payload = nbytes if plan is None else plan.payload_per_step * plan.steps
        rel = self.flow(peer, self.rep, payload, op, coll, refs + tuple(deps), hold=False, steps=steps, pulled=True,
                        plan=plan, pattern=low.pull_pattern(low.stage_of_chunk(self.key[0]), low.stage_of_chunk(key[0])))
        out = (self.me(rel),) + tuple(r for r in refs if r[1] == self.rep) + tuple(deps)
        t.converted[(name, "all_reduce")] = out
        return out

    def _model_parallel_all_reduce(self, nbytes: float, op: str, deps: tuple) -> tuple:
        """An all-reduce of ``nbytes`` over the model-parallel group (every stage's tensor-parallel
        ranks: Megatron-LM's ``get_model_parallel_group``), timed as NCCL's plan of that group and
        run as a wait beside the GPU's stream (a transfer over no link: a few bytes, latency
        alone). Each stage waits for its own ranks only: the barrier of every stage it is in
        Megatron-LM is left out (the first stage ends its backward last in every schedule here, so
        it delays other stages' updates, not the iteration, but by their difference)."""
        low = self.low
        members: list[int] = []
        tp_peer = low.place.patterns().get("tp+1")
        for g in (self._group("pull-1") if low.cfg.pp > 1 else [self.rep]):
            members.append(g)
            while tp_peer is not None and tp_peer(members[-1]) not in (g, members[-1]) and len(members) < 1 << 16:
                members.append(tp_peer(members[-1]))
        if len(members) < 2:
            return tuple(deps)
        plan = low.plan("all_reduce", nbytes, members)
        if plan is not None:
            seconds = plan.time
        else:  # a ring at line rate: latency-bound
            names = low.system.nodes
            seconds = 2 * (len(members) - 1) * max(
                low.system.route(names[a], names[b]).latency for a, b in zip(members, members[1:] + members[:1]))
        coll = self._collective("all_reduce", "mp", "", nbytes, op, 1, "ring" if plan is None else plan.algorithm)
        rel = self._row(TRANSFER, -1, 0.0, self.rep, self.rep, nbytes, low.wait_route(self.rep, seconds), 0.0, 0.0,
                        -1, 0.0, low.op_index[op], coll, tuple(deps))
        return (self.me(rel),)


def lower_parallel(graph: Graph, system: System, cfg: ParallelConfig, cost: CostModel | None = None, *,
                   folding: bool = True, where: str = "--parallel", progress: Progress | None = None,
                   max_bytes: float | None = None, coupled_rings: bool = False) -> TaskGraph:
    """Lower ``graph`` (an LLM workload) under ``cfg`` on ``system`` (see the module docstring).

    ``folding``: simulate one GPU per class of identical GPUs (exact, :mod:`.fold`); False: every
    GPU. ``progress``: called at most every half second of wall time with ``{"stage": "fold",
    "templates" or "assemble", "tasks": tasks lowered so far, "total": tasks of the TaskGraph}``.
    ``max_bytes``: the most a simulation of the result may need (default: this machine's memory;
    :mod:`.size`). Raises InputError when the configuration cannot run the workload on the
    system, or spans more GPUs or would need more memory than that bound (saying its size).

    ``coupled_rings``: a ring collective over GPUs of several classes is one transfer per class
    whose steps are coupled to the previous rank's (:class:`~marssim.taskprogram.CoupledSteps`)
    instead of one task per step: far fewer tasks for the estimate, which times those steps
    exactly as it times the tasks; the simulators refuse such a TaskGraph."""
    if cost is None:
        from marssim.cost import default_cost_model

        cost = default_cost_model()
    t = graph.meta.get("transformer")
    if t is None:
        raise InputError(where, "", "a parallel configuration needs an LLM workload (gpt, llama, moe or a preset)")
    check_parallel(cfg, t, len(system.accelerators), where)
    check_gpus(cfg.gpus, where)
    graph = prepare_graph(graph, cfg)
    with gc_paused():
        return _lower(graph, system, cfg, cost, folding, _Reporter(progress), where, max_bytes, coupled_rings)


class _Reporter:
    """Calls a progress callback at most every PROGRESS_EVERY seconds (and at each new stage)."""

    def __init__(self, callback: Progress | None) -> None:
        self.callback = callback
        self.last = 0.0
        self.stage = ""
        self.total = 0

    def __call__(self, stage: str, tasks: int, force: bool = False) -> None:
        if self.callback is None:
            return
        import time

        now = time.perf_counter()
        if force or stage != self.stage or now - self.last >= PROGRESS_EVERY:
            self.stage, self.last = stage, now
            self.callback({"stage": stage, "tasks": tasks, "total": self.total})


def _lower(graph: Graph, system: System, cfg: ParallelConfig, cost: CostModel, folding: bool, report: _Reporter,
           where_key: str = "--parallel", max_bytes: float | None = None, coupled_rings: bool = False) -> TaskGraph:
    import time

    wall = time.perf_counter()
    where = place(system, cfg)
    patterns = where.patterns()
    report("fold", 0)
    if folding:
        role = {}
        for g in where.gpus:
            acc = system.accelerator(system.nodes[g])
            role[g] = (where.stage(g), acc.designs, acc.memory.capacity)
        folded = fold(system, where.gpus, role, patterns, pulls=PULLS, direct=direct_patterns(patterns))
    else:
        folded = identity_folding(system, where.gpus, patterns, PULLS, direct_patterns(patterns))
    low = _Lowering(graph, system, cfg, cost, folded, where, coupled_rings)
    _parameters(low)
    reps = folded.reps
    # every representative's units in schedule order, then its chunks' optimizer units
    order: list[tuple[int, tuple[int, str], int]] = []
    for rep in reps:
        stage = where.stage(rep)
        units = stage_units(cfg.schedule, stage, cfg.pp, low.micro_batches,
                            cfg.virtual_stages if cfg.schedule == "interleaved" else 1,
                            forward_only=not low.training)
        if cfg.overlap_param_gather and low.training:  # the parameter all-gathers open the iteration
            for chunk in range(len(low.chunks)):
                if low.stage_of_chunk(chunk) == stage and (chunk, "O") in low.unit_ops:
                    order.append((rep, (chunk, "G"), 0))
        for chunk, mb, direction in units:
            if (chunk, direction) in low.unit_ops:
                order.append((rep, (chunk, direction), mb))
        if low.training:
            for chunk in range(len(low.chunks)):
                if low.stage_of_chunk(chunk) == stage and (chunk, "O") in low.unit_ops:
                    order.append((rep, (chunk, "O"), low.micro_batches - 1))
    build_wall = time.perf_counter()
    size = lowered_size(low, order)
    check_size(size, where_key, max_bytes)
    report.total = size.tasks
    done = 0
    for rep, key, _ in order:
        done += len(low.template(rep, key))
        report("templates", done)
    report("assemble", size.tasks)
    tg = _taskgraph(low, _program(low, order))
    report("assemble", tg.n_tasks, force=True)
    tg.meta["wall_lower_s"] = time.perf_counter() - wall
    tg.meta["wall_templates_s"] = time.perf_counter() - build_wall
    return tg


def lowered_size(low: _Lowering, order: list[tuple[int, tuple[int, str], int]]) -> SizeEstimate:
    """The size of the TaskGraph of ``order`` (its units, per representative GPU), from the unit
    templates of one representative per pipeline stage (and per class size) before any other
    is built: representatives of one stage whose classes are alike run templates of the same size."""
    per_rep: dict[int, list[tuple[int, str]]] = {}
    for rep, key, _ in order:
        per_rep.setdefault(rep, []).append(key)
    sized: dict[tuple, tuple[int, int]] = {}
    tasks = rows = 0
    for rep, keys in per_rep.items():
        kind = (low.place.stage(rep), low.fold.size(rep))
        n = sized.get(kind)
        if n is None:
            uses = Counter(keys)  # each unit's instances (one per micro-batch)
            n = sized[kind] = (sum(len(low.template(rep, key)) * count for key, count in uses.items()),
                               sum(len(low.template(rep, key)) for key in uses))
        tasks += n[0]
        rows += n[1]
    return SizeEstimate(len(low.place.gpus), len(low.fold.members), tasks, rows)


def _parameters(low: _Lowering) -> None:
    """Per layer group: the parameters one rank of the group holds (and of them the experts'),
    and per chunk the parameters of its layers; the bytes of a parameter."""
    from .memory import rank_parameters, tied_copy_params

    from marssim.workload.op import DTYPE_BYTES

    per_layer, experts = graph_cached(low.graph, ("rank_parameters", low.rules_key),
                                      lambda: rank_parameters(low.graph, low.cfg, low.rules))
    low.rank_params = per_layer
    low.rank_expert_params = experts
    low.chunk_params = [sum(per_layer.get(layer, 0) for layer in layers) for layers in low.chunks]

    low.param_bytes = float(DTYPE_BYTES[low.t.dtype])
    low.grad_bytes = float(DTYPE_BYTES[grad_dtype(low.cfg, low.t)])
    # the last stage's copy of a word embedding tied to the output layer (Megatron-LM keeps one
    # there with pipeline parallelism; memory.rank_parameters counts it in the head's group)
    output = low.graph.ops[low.op_index["output"]] if "output" in low.op_index else None
    low.tied_copy = bool(output is not None and low.training and output.param("shares") and
                         low.stage_of_chunk(low.chunk_of_layer[output.param("layer")]) != low.stage_of_chunk(0))
    low.word_embedding_params = tied_copy_params(low.t, low.cfg) if low.tied_copy else 0
    # what each group's optimizer updates and reduces: its parameters, the head's with the copy
    low.opt_params = dict(per_layer)
    if low.tied_copy:
        low.opt_params[low.t.layers] = low.opt_params.get(low.t.layers, 0) + low.word_embedding_params
    # ZeRO-3: each forward and backward unit's parameter all-gathers (.zero3)
    low.zero3_plans = zero3.unit_plans(low.graph, low.cfg, low.rules, low.unit_ops) \
        if low.cfg.zero == 3 and low.training and low.cfg.dp_cp > 1 else {}


def _segments(n: int, runs: list[tuple[int, int]]):
    """Rows ``0..n`` as ``(start, stop, run)`` in order: the rows between runs (``run`` False)
    and each run of copied rows (``run`` True)."""
    at = 0
    for first, count in runs:
        if first > at:
            yield at, first, False
        yield first, first + count, True
        at = first + count
    if n > at:
        yield at, n, False


def _column_array(values: list, dtype, runs: list[tuple[int, int]]) -> np.ndarray:
    """``values`` as an array of ``dtype``: a run's rows (copies of the row before it) filled
    without reading them one by one."""
    if not runs:
        return np.asarray(values, dtype=dtype)
    out = np.empty(len(values), dtype=dtype)
    for a, b, run in _segments(len(values), runs):
        out[a:b] = values[a] if run else np.asarray(values[a:b], dtype=dtype)
    return out


def _freeze(tpl: _Template) -> None:
    """A built template's rows as arrays only: its predecessors in the unit (per row, how many;
    the rows they are, row after row; :data:`_AFTER_PREVIOUS`: the row before it, a run of them
    filled at once); the lists it was built in are dropped."""
    preds = tpl.preds
    n = len(preds)
    counts_parts, src_parts = [], []
    for a, b, run in _segments(n, tpl.runs):
        if run:
            counts_parts.append(np.ones(b - a, dtype=np.int64))
            src_parts.append(np.arange(a - 1, b - 1, dtype=np.int32))
            continue
        part = preds[a:b]
        c = np.fromiter((1 if ps is _AFTER_PREVIOUS else len(ps) for ps in part), dtype=np.int64, count=b - a)
        counts_parts.append(c)
        src_parts.append(np.fromiter((p for rel, ps in enumerate(part, a)
                                      for p in ((rel - 1,) if ps is _AFTER_PREVIOUS else ps)),
                                     dtype=np.int32, count=int(c.sum())))
    tpl.n_rows = n
    tpl.pred_counts = np.concatenate(counts_parts) if counts_parts else np.zeros(0, dtype=np.int64)
    tpl.edge_src = np.concatenate(src_parts) if src_parts else np.zeros(0, dtype=np.int32)  # rels in the unit
    tpl.preds = None
    tpl.cols = None
    tpl.runs = []


def _template_edges(tpl: _Template) -> None:
    """Precompute a template's references grouped by target unit (a ring's repeated steps, one
    ``("steps", count, rep, key)`` entry, expanded: row ``r`` reads row ``r - 1`` of ``rep``); rows
    as int32, as the program keeps them."""
    groups: dict[tuple, tuple[list, list, list, list]] = {}  # key -> (parts, parts read, rows, rows read)
    for rel, ref in tpl.ext:
        if ref[0] == "steps":
            _, count, r_rep, r_key = ref
            parts, parts_read, rows, rows_read = groups.setdefault((r_rep, r_key, "same"), ([], [], [], []))
            if rows:
                parts.append(np.asarray(rows, dtype=np.int32))
                parts_read.append(np.asarray(rows_read, dtype=np.int32))
                rows.clear()
                rows_read.clear()
            steps = np.arange(rel, rel + count, dtype=np.int32)
            parts.append(steps)
            parts_read.append(steps - 1)
            continue
        _, r_rep, r_key, r_rel, mode = ref
        _, _, rows, rows_read = groups.setdefault((r_rep, r_key, mode), ([], [], [], []))
        rows.append(rel)
        rows_read.append(r_rel)
    out = []
    for k, (parts, parts_read, rows, rows_read) in groups.items():
        if rows:
            parts.append(np.asarray(rows, dtype=np.int32))
            parts_read.append(np.asarray(rows_read, dtype=np.int32))
        out.append((k, np.concatenate(parts), np.concatenate(parts_read)))
    tpl.ext_groups = out


@dataclass
class _Instances:
    """The unit instances of a lowering in task order: which template each copies, its
    micro-batch, its first task and its first collective; the templates in first-use order."""

    templates: list[_Template]
    keys: list[tuple[int, tuple[int, str]]]  # (rep, unit key) of each template
    tpl: np.ndarray  # per instance, its template's index
    rep: np.ndarray  # per instance, its representative GPU
    mb: np.ndarray  # per instance, its micro-batch
    base: np.ndarray  # per instance, its first task (int64; one more entry: the task count)
    coll: np.ndarray  # per instance, its first collective (one more entry: the count)
    index: dict[tuple[int, tuple[int, str], int], int]  # (rep, key, mb) -> instance

    @property
    def n_tasks(self) -> int:
        return int(self.base[-1])


def _instances(low: _Lowering, order: list[tuple[int, tuple[int, str], int]]) -> _Instances:
    tpl_of: dict[tuple[int, tuple[int, str]], int] = {}
    templates: list[_Template] = []
    keys: list[tuple[int, tuple[int, str]]] = []
    tpl = np.empty(len(order), dtype=np.int64)
    reps = np.empty(len(order), dtype=np.int64)
    mbs = np.empty(len(order), dtype=np.int64)
    index: dict[tuple[int, tuple[int, str], int], int] = {}
    for i, (rep, key, mb) in enumerate(order):
        j = tpl_of.get((rep, key))
        if j is None:
            j = tpl_of[(rep, key)] = len(templates)
            templates.append(low.templates[(rep, key)])
            keys.append((rep, key))
        tpl[i] = j
        reps[i] = rep
        mbs[i] = mb
        index[(rep, key, mb)] = i
    sizes = np.asarray([len(t) for t in templates], dtype=np.int64)[tpl]
    colls = np.asarray([len(t.colls) for t in templates], dtype=np.int64)[tpl]
    base = np.zeros(len(order) + 1, dtype=np.int64)
    np.cumsum(sizes, out=base[1:])
    coll = np.zeros(len(order) + 1, dtype=np.int64)
    np.cumsum(colls, out=coll[1:])
    return _Instances(templates, keys, tpl, reps, mbs, base, coll, index)


def _taskgraph(low: _Lowering, program: TaskProgram) -> TaskGraph:
    """The TaskGraph of ``program`` with the lowering's labels; its columns are built from the
    program when first read (:class:`~marssim.taskgraph.ProgramTaskGraph`)."""
    if program.n_tasks >= 2**31 - 1:
        raise InputError("--parallel", "", f"{program.n_tasks:,} tasks: more than a TaskGraph holds (2^31)")
    names = low.system.nodes
    resident, setup = _memory(low)
    return from_program(
        program, node_names=names, op_names=tuple(op.name for op in low.graph.ops), routes=tuple(low.routes),
        resident=resident, setup=setup, meta=_meta(low), ops=_op_info(low),
        device_design={names[g]: low.system.accelerator(names[g]).designs[0] for g in low.fold.reps},
        batch=low.cfg.batch)


def _program(low: _Lowering, order: list[tuple[int, tuple[int, str], int]]) -> TaskProgram:
    """The unit templates and their instances in ``order`` as a :class:`TaskProgram`: each
    template's rows, predecessors in the unit and references grouped by the unit they read; each
    instance's template, micro-batch, first task and collective, the target instance of each
    group and the instance whose last kernel its first kernel follows."""
    inst = _instances(low, order)
    templates = inst.templates
    for tpl in templates:
        if not hasattr(tpl, "ext_groups"):
            _template_edges(tpl)
    sizes = np.asarray([len(t) for t in templates], dtype=np.int64)
    tpl_start = np.zeros(len(templates) + 1, dtype=np.int64)
    np.cumsum(sizes, out=tpl_start[1:])
    # each template's arrays are dropped once copied (a lowering whose units run once holds its
    # tasks twice otherwise)
    rows = {}
    for name, dtype in _COLUMNS.items():
        rows[name] = np.concatenate([t.arrays[name] for t in templates]) if templates else np.zeros(0, dtype=dtype)
        for t in templates:
            del t.arrays[name]
    n_ipred = np.concatenate([t.pred_counts for t in templates]) \
        if templates else np.zeros(0, dtype=np.int64)
    ipred_ptr = np.zeros(len(n_ipred) + 1, dtype=np.int64)
    np.cumsum(n_ipred, out=ipred_ptr[1:])
    ipred = np.concatenate([t.edge_src for t in templates]) if templates else np.zeros(0, np.int32)
    for t in templates:
        t.pred_counts = t.edge_src = None
    # references: per row, (group, row read) in group order; the groups of each template
    tpl_index = {key: j for j, key in enumerate(inst.keys)}
    x_rows, x_group, x_rel = [], [], []
    grp_start = np.zeros(len(templates) + 1, dtype=np.int64)
    grp_keys: list[tuple] = []
    for j, tpl in enumerate(templates):
        for g, (key, rels, r_rels) in enumerate(tpl.ext_groups):
            x_rows.append(rels + np.int32(tpl_start[j]))
            x_group.append(np.full(len(rels), g, dtype=np.int32))
            x_rel.append(r_rels)
            grp_keys.append(key)
        grp_start[j + 1] = grp_start[j] + len(tpl.ext_groups)
        tpl.ext_groups = [(key, None, None) for key, _, _ in tpl.ext_groups]  # copied; its keys kept
    if x_rows:
        xr, xg, xl = (np.concatenate(a) for a in (x_rows, x_group, x_rel))
        del x_rows, x_group, x_rel
        # by row, then group, then order within the group: a stable sort by (row, group), as each
        # (row, group) belongs to one group's references, listed in their order
        width = int(np.diff(grp_start).max()) + 1
        order_x = np.argsort(xr.astype(np.int64) * width + xg, kind="stable")
        xr, xg, xl = xr[order_x], xg[order_x], xl[order_x]
        del order_x
    else:
        xr = xg = xl = np.zeros(0, dtype=np.int64)
    xref_ptr = np.zeros(len(n_ipred) + 1, dtype=np.int64)
    np.cumsum(np.bincount(xr, minlength=len(n_ipred)), out=xref_ptr[1:])
    lastkernel = np.asarray([key[1] == ("last-backward", 0) for key in grp_keys], dtype=np.bool_)
    target_tpl = np.asarray([-1 if last else tpl_index.get((key[0], key[1]), -1)
                             for key, last in zip(grp_keys, lastkernel)], dtype=np.int32)
    targets = _group_targets(inst, templates, grp_start, grp_keys, lastkernel, tpl_index)
    first = np.asarray([t.first_compute for t in templates], dtype=np.int32)
    last = np.asarray([t.last_compute for t in templates], dtype=np.int32)
    chain_prev = np.full(len(inst.tpl), -1, dtype=np.int32)
    with_compute = np.flatnonzero(first[inst.tpl] >= 0)
    same_rep = inst.rep[with_compute[1:]] == inst.rep[with_compute[:-1]]
    chain_prev[with_compute[1:][same_rep]] = with_compute[:-1][same_rep]
    n_groups = grp_start[1:] - grp_start[:-1]
    inst_gstart = np.zeros(len(inst.tpl) + 1, dtype=np.int64)
    np.cumsum(n_groups[inst.tpl], out=inst_gstart[1:])
    return TaskProgram(
        rows=rows, tpl_start=tpl_start, ipred_ptr=ipred_ptr, ipred=ipred, xref_ptr=xref_ptr,
        xref_group=xg.astype(np.int32, copy=False), xref_rel=xl.astype(np.int32, copy=False), grp_start=grp_start, grp_lastkernel=lastkernel,
        grp_target_tpl=target_tpl, first_compute=first, last_compute=last,
        tpl_colls=tuple(tuple(t.colls) for t in templates), inst_tpl=inst.tpl.astype(np.int32),
        inst_mb=inst.mb.astype(np.int32), inst_base=inst.base, inst_coll=inst.coll, inst_gstart=inst_gstart,
        target=targets, chain_prev=chain_prev, coupled=_coupled(inst, templates, tpl_index))


def _group_targets(inst: _Instances, templates: list[_Template], grp_start: np.ndarray, grp_keys: list[tuple],
                   lastkernel: np.ndarray, tpl_index: dict) -> np.ndarray:
    """Per (instance, group of its template): the instance the group's references read (the same
    micro-batch, or the last one for ``last`` references; a ``lastkernel`` group: the last
    instance with a backward pass before it on its GPU), -1 when there is none."""
    n_inst = len(inst.tpl)
    n_groups = grp_start[1:] - grp_start[:-1]
    inst_gstart = np.zeros(n_inst + 1, dtype=np.int64)
    np.cumsum(n_groups[inst.tpl], out=inst_gstart[1:])
    out = np.full(int(inst_gstart[-1]), -1, dtype=np.int32)
    by_key, last_mb = _instances_by_key(inst, tpl_index)
    needs_backward = bool(lastkernel.any())
    last_backward = np.full(n_inst, -1, dtype=np.int64)
    if needs_backward:  # the latest instance before each one, on its GPU, with a backward kernel
        latest: dict[int, int] = {}
        for i, (j, rep) in enumerate(zip(inst.tpl.tolist(), inst.rep.tolist())):
            last_backward[i] = latest.get(rep, -1)
            if templates[j].first_compute >= 0 and inst.keys[j][1][1] == "B":
                latest[rep] = i
    for j in range(len(templates)):
        mine = np.flatnonzero(inst.tpl == j)
        if not len(mine):
            continue
        for g in range(int(n_groups[j])):
            gg = int(grp_start[j]) + g
            slots = inst_gstart[mine] + g
            if lastkernel[gg]:
                out[slots] = last_backward[mine]
                continue
            r_rep, r_key, mode = grp_keys[gg]
            table = by_key.get((r_rep, r_key))
            if table is None:
                continue
            r_mb = np.full(len(mine), last_mb[(r_rep, r_key)]) if mode == "last" else inst.mb[mine]
            inside = r_mb < len(table)
            out[slots[inside]] = table[r_mb[inside]]
    return out


def _instances_by_key(inst: _Instances, tpl_index: dict) -> tuple[dict[tuple, np.ndarray], dict[tuple, int]]:
    """Per (rep, unit key): its instances by micro-batch (-1: none), and its last micro-batch."""
    by_key: dict[tuple, np.ndarray] = {}
    last_mb: dict[tuple, int] = {}
    for (rep, key), j in tpl_index.items():
        mine = np.flatnonzero(inst.tpl == j)
        mbs = inst.mb[mine]
        table = np.full(int(mbs.max()) + 1 if len(mbs) else 1, -1, dtype=np.int64)
        table[mbs] = mine
        by_key[(rep, key)] = table
        last_mb[(rep, key)] = int(mbs.max()) if len(mbs) else 0
    return by_key, last_mb


def _coupled(inst: _Instances, templates: list[_Template], tpl_index: dict) -> CoupledSteps | None:
    """The coupled ring transfers of the instances (:class:`~marssim.taskprogram.CoupledSteps`):
    each one's task, the task of the same micro-batch of the representative feeding its steps,
    and its bytes per step; None when the lowering made none."""
    if not any(t.coupled for t in templates):
        return None
    by_key, _ = _instances_by_key(inst, tpl_index)
    tasks, prevs, chunks = [], [], []
    for j, tpl in enumerate(templates):
        if not tpl.coupled:
            continue
        mine = np.flatnonzero(inst.tpl == j)
        key = inst.keys[j][1]
        for rel, prv_rep, chunk in tpl.coupled:
            table = by_key[(prv_rep, key)]
            feeder = table[inst.mb[mine]]
            if (feeder < 0).any():
                raise AssertionError(f"a coupled ring transfer of unit {key} has no feeder on GPU {prv_rep}")
            tasks.append(inst.base[mine] + rel)
            prevs.append(inst.base[feeder] + rel)
            chunks.append(np.full(len(mine), chunk))
    task = np.concatenate(tasks)
    order = np.argsort(task, kind="stable")
    return CoupledSteps(task=task[order], prev=np.concatenate(prevs)[order], chunk=np.concatenate(chunks)[order])


def _memory(low: _Lowering) -> tuple[dict[str, float], tuple[tuple[str, str, float], ...]]:
    """Resident bytes of each representative (weights, gradients, optimizer state, KV cache) and
    the weight loads of every GPU from its node's host."""
    names = low.system.nodes
    resident: dict[str, float] = {}
    setup = []
    per_stage = {}
    reps = set(low.fold.reps)
    for stage in range(low.cfg.pp):
        per_stage[stage] = static_bytes(low.graph, low.cfg, stage, low.rules, low.rank_params)
    for g in low.place.gpus:
        stage = low.place.stage(g)
        total = per_stage[stage].total
        if g in reps:
            resident[names[g]] = total
        setup.append((low.system.nearest_host(names[g]), names[g], per_stage[stage].weights))
    return resident, tuple(setup)


def _op_info(low: _Lowering) -> tuple:
    """The typed label of every compute op: its tensor-parallel split as a strategy name, its
    pipeline stage as the set, the cost model that timed it."""
    from marssim.taskgraph import OpInfo

    out = []
    for op in low.graph.ops:
        if op.kind == OpKind.INPUT:
            continue
        rule = low.rules[op.name]
        stage = low.stage_of_chunk(low.chunk_of_layer[op.param("layer")])
        out.append(OpInfo(op.name, op.kind.value, op.model, " ".join(f"{k}={v}" for k, v in op.loops),
                          strategy_of(op, rule), stage, low.cost_models.get(op.name, "")))
    return tuple(out)


def _model_flops(low: _Lowering) -> tuple[float, float]:
    """Model FLOPs of one iteration (all GPUs) and a GPU's peak FLOP/s for the model's type."""
    from marssim.workload.llm.footprint import footprint

    f = low.graph.meta.get("unsplit_footprint") or graph_cached(low.graph, "footprint", lambda: footprint(low.graph))
    per_replica = f.model_flops if low.training else f.flops.get("fwd", 0.0)
    total = per_replica * low.micro_batches * low.cfg.dp
    return total, _peak(low, low.t.dtype)


def _peak(low: _Lowering, dtype: str) -> float:
    """A GPU's dense peak FLOP/s for ``dtype`` (bf16, fp16, then the largest where the design
    lists no such type), averaged over the GPUs of a mixed cluster."""
    peaks = []
    for g, count in _design_counts(low.system, tuple(low.place.gpus)):
        design = low.design(g)
        if design.gpu is not None:
            table = design.gpu.peak_flops
            peak = float(table.get(dtype) or table.get("bf16") or table.get("fp16") or max(table.values()))
        else:
            peak = 2.0 * design.peak_macs_per_s
        peaks.append(peak * count)
    return sum(peaks) / len(low.place.gpus)


_DESIGN_COUNTS: "weakref.WeakKeyDictionary[System, dict]" = weakref.WeakKeyDictionary()


def _design_counts(system: System, gpus: tuple[int, ...]) -> tuple[tuple[int, int], ...]:
    """(a GPU of each accelerator design, how many of ``gpus`` have it), in the order met;
    memoised per system (weakly: a system's memo goes with it)."""
    memo = _DESIGN_COUNTS.setdefault(system, {})
    hit = memo.get(gpus)
    if hit is None:
        hit = memo[gpus] = _count_designs(system, gpus)
    return hit


def _count_designs(system: System, gpus: tuple[int, ...]) -> tuple[tuple[int, int], ...]:
    first: dict[tuple, list[int]] = {}
    for g in gpus:
        key = system.accelerator(system.nodes[g]).designs[:1]
        hit = first.get(key)
        if hit is None:
            first[key] = [g, 1]
        else:
            hit[1] += 1
    return tuple((g, n) for g, n in first.values())


def _meta(low: _Lowering) -> dict:
    names = low.system.nodes
    cfg = low.cfg
    model_flops, peak = _model_flops(low)
    fold_map = {names[g]: names[low.fold.rep(g)] for g in low.place.gpus}
    return {
        "system": low.system.spec, "workload": low.graph.spec, "batch": cfg.batch, "micro_batches": low.micro_batches,
        "parallel": cfg.text(), "mapping": cfg.text(), "n_stages": cfg.pp,
        "fold": fold_map, "fold_classes": len(low.fold.members),
        "stage_of": {names[g]: low.place.stage(g) for g in low.place.gpus},
        "device_design": {names[g]: low.system.accelerator(names[g]).designs[0] for g in low.place.gpus},
        "op_model": {op.name: op.model for op in low.graph.ops},
        "op_kind": {op.name: op.kind.value for op in low.graph.ops},
        "model_flops": model_flops, "peak_flops": peak, "peak_dtype": low.t.dtype,
        # the low-precision GEMMs' own peak (Transformer Engine's fp8/fp4): MFU against it too
        **({"gemm_dtype": low.t.gemm_dtype, "gemm_peak_flops": _peak(low, low.t.gemm_dtype)}
           if low.t.gemm_dtype and low.t.gemm_dtype != low.t.dtype else {}),
    }
