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
  ``1/dp`` shard and the parameters are all-gathered); ZeRO-3 also all-gathers each chunk's
  parameters before each of its units; then the optimizer steps;
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

import weakref
from collections import defaultdict
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from marssim.cost.base import CostModel
from marssim.errors import InputError
from marssim.gcpause import gc_paused
from marssim.system import Route, System
from marssim.taskgraph import COMPUTE, TRANSFER, Collective, TaskGraph
from marssim.workload import Graph, Op, OpKind

from . import context, experts, overlap, userbuffers
from .config import ParallelConfig, check_parallel
from .fold import Folding, fold, identity_folding
from .memory import static_bytes
from .placement import PULLS, Placement, place
from .roles import Rule, rule_for, strategy_of
from .schedule import stage_units

__all__ = ["lower_parallel", "chunk_layers", "prepare_graph"]

Ref = tuple  # ("u", rep, unit key, rel task, "same" | "last")


def chunk_layers(layers: int, cfg: ParallelConfig) -> list[list[int]]:
    """The layers of each model chunk: ``pp * virtual_stages`` chunks (``layers_per_stage`` when
    given), balanced with the larger ones first; chunk 0 also holds the embedding (layer -1), the
    last the head (layer ``layers``)."""
    n = cfg.pp * (cfg.virtual_stages if cfg.schedule == "interleaved" else 1)
    sizes = list(cfg.layers_per_stage) if cfg.layers_per_stage else \
        [layers // n + (1 if i < layers % n else 0) for i in range(n)]
    out, at = [], 0
    for size in sizes:
        out.append(list(range(at, at + size)))
        at += size
    out[0].insert(0, -1)
    out[-1].append(layers)
    return out


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


_BOUNDED = frozenset({"rules", "layouts", "units", "rank_parameters", "low_precision_parameters", "saved_per_layer"})
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
            same = [k for k in cache if isinstance(k, tuple) and k and k[0] == kind]
            for old in same[:max(0, len(same) - _KEEP + 1)]:
                del cache[old]
        hit = cache[key] = make()
    return hit


def op_rules(graph: Graph, cfg: ParallelConfig) -> dict[str, Rule]:
    """Every op's tensor-parallel rule (:func:`~.roles.rule_for` with its stage's degree), in
    graph order; the MoE re-layouts as ``D`` (locally permuted, before the all-to-all).
    Memoised per graph by the degree of every layer, sequence and expert parallelism."""
    stage_of = stage_of_layers(graph.meta["transformer"].layers, cfg)
    return graph_cached(graph, rules_key(cfg, stage_of), lambda: _op_rules(graph, cfg, stage_of))


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
    sends: list[tuple[int, int, tuple]] = field(default_factory=list)  # (pipeline transfer, sender, its unit)
    last_compute: int = -1
    first_compute: int = -1
    prev_compute: int = -1  # the kernel before the last one
    arrays: dict[str, np.ndarray] | None = None

    def __len__(self) -> int:
        return len(self.preds)


_COLUMNS = ("kind", "device", "duration", "src", "dst", "nbytes", "route", "flops", "energy", "mem_node",
            "mem_bytes", "op", "collective", "steps")


class _Lowering:
    def __init__(self, graph: Graph, system: System, cfg: ParallelConfig, cost: CostModel, folding: Folding,
                 where: Placement) -> None:
        self.graph = graph
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
        self.route_id: dict[tuple[int, int], int] = {}
        self.templates: dict[tuple[int, tuple], _Template] = {}
        # shard timings by (op, design, split) and the cost model that timed them: shared by every
        # lowering of this graph with this cost model (kept beside it, so its id is never reused)
        entry = graph_cache(graph).get(("shards", id(cost)))
        if entry is None or entry[0] is not cost:
            entry = graph_cache(graph)[("shards", id(cost))] = (cost, {})
        self.shard_cache: dict[tuple, tuple[tuple[float, float, float, float], str]] = entry[1]
        self.cost_models: dict[str, str] = {}  # op -> the cost model that timed it
        self.shape_keys: dict[str, tuple] = graph_cache(graph).setdefault("shape_keys", {})
        self.expert_share = experts.busiest_share(self.t.expert_load, cfg.ep)
        self.designs: dict[int, object] = {}
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
    def route(self, src: int, dst: int, per: int | None = None) -> int:
        """Index of the (folded) route ``src`` -> ``dst``, standing for a flow per member of
        ``per``'s class (default: the sender's)."""
        key = (src, dst, per)
        r = self.route_id.get(key)
        if r is None:
            r = self.route_id[key] = len(self.routes)
            self.routes.append(self.fold.route(src, dst, per))
        return r

    def design(self, gpu: int):
        d = self.designs.get(gpu)
        if d is None:
            name = self.system.nodes[gpu]
            d = self.designs[gpu] = self.system.design(name, self.system.accelerator(name).designs[0])
        return d

    def shard(self, op: Op, gpu: int) -> tuple[float, float, float, float]:
        """``(seconds, FLOPs, joules, output bytes)`` of ``op``'s part on ``gpu``."""
        d = self.design(gpu)
        rule = self.rules[op.name]
        adam = op.param("fn") == "adam"
        share = (self.rank_params.get(op.param("layer"), 0), self.cfg.dp_cp if self.cfg.zero >= 1 else 1) if adam else ()
        key = (self._shape(op), d.name, rule.split, rule.scale, share)
        hit = self.shard_cache.get(key)
        if hit is not None:
            self.cost_models.setdefault(op.name, hit[1])
            return hit[0]
        sizes = shard_loops(op, rule, self.rank_params, self.cfg.dp_cp if self.cfg.zero >= 1 else 1)
        part = op.with_loops(**sizes) if sizes else op
        c = self.cost.op_cost(part, d)
        self.cost_models.setdefault(op.name, c.model)
        seconds, flops, energy = c.time, float(part.flops), c.energy
        out_bytes = 0.0 if op.param("keep") and op.param("fn") == "adam" else float(part.output_bytes)
        if rule.scale > 1:
            seconds, flops, energy, out_bytes = seconds / rule.scale, flops / rule.scale, energy / rule.scale, \
                out_bytes / rule.scale
        timing = (float(seconds), flops, float(energy), out_bytes)
        self.shard_cache[key] = (timing, c.model)
        return timing

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
        if t.first_compute < 0:
            t.first_compute = rel
        t.prev_compute, t.last_compute = t.last_compute, rel
        return rel

    def flow(self, src: int, dst: int, nbytes: float, op: str, coll: int, deps, hold: bool, steps: int = 1,
             pulled: bool = False) -> int:
        """A transfer of ``nbytes`` (in ``steps`` back-to-back steps) from ``src`` to ``dst``;
        ``hold``: the receiver keeps the bytes until the transfer's readers end; ``pulled``: one
        such transfer per member of the receiver's class (else of the sender's)."""
        low = self.low
        route = low.route(src, dst, dst if pulled else None)
        receiver = low.fold.rep(dst) if dst in low.fold.class_of else dst
        return self._row(TRANSFER, -1, 0.0, src, dst, nbytes, route, 0.0, 0.0, receiver if hold else -1,
                         nbytes if hold else 0.0, low.op_index[op], coll, deps, steps)

    # ------------------------------------------------------------------ collectives
    def _collective(self, kind: str, group: str, pattern: str, nbytes: float, op: str, steps: int,
                    algorithm: str = "ring") -> int:
        low = self.low
        members = self._group(pattern)
        coll = Collective(kind, algorithm, tuple(self.node_names[g] for g in members), float(nbytes), op, steps, group)
        self.t.colls.append(coll)
        return len(self.t.colls) - 1

    def _group(self, pattern: str) -> list[int]:
        peer = self.low.place.patterns().get(pattern) if pattern else None
        out = [self.rep]
        if peer is None:
            return out
        g = peer(self.rep)
        while g != self.rep and g not in out and len(out) < 4096:
            out.append(g)
            g = peer(g)
        return out

    def ring(self, kind: str, group: str, pattern: str, size: float, n: int, op: str, deps) -> tuple:
        """A ring collective over ``n`` ranks of ``size`` bytes (the whole tensor per rank):
        all-reduce 2(n-1) steps, reduce-scatter and all-gather n-1, each sending size/n.
        Returns the refs after which this rank's result is ready."""
        if n <= 1 or size <= 0:
            return tuple(deps)
        steps = 2 * (n - 1) if kind == "all_reduce" else n - 1
        chunk = size / n
        low = self.low
        peer = low.place.patterns()[pattern]
        inverse = {v: k for k, v in ((g, peer(g)) for g in self._group(pattern))}
        nxt = peer(self.rep)
        prv = inverse.get(self.rep, self.rep)
        prv_rep = low.fold.rep(prv)
        coll = self._collective(kind, group, pattern, size, op, steps)
        if prv_rep == self.rep:
            # the whole ring is this GPU's class: every rank's steps follow each other in lockstep,
            # so the steps are one transfer of `steps` back-to-back steps (exact, see TaskGraph.steps)
            rel = self.flow(self.rep, nxt, chunk * steps, op, coll, tuple(deps), hold=False, steps=steps)
            return (self.me(rel),)
        last = None
        for k in range(steps):
            if last is None:
                step_deps = tuple(deps)
            else:
                step_deps = (self.me(last), ("u", prv_rep, self.key, last, "same"))
            last = self.flow(self.rep, nxt, chunk, op, coll, step_deps, hold=False)
        return tuple(dict.fromkeys((self.me(last), ("u", prv_rep, self.key, last, "same"))))

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
        coll = self._collective("p2p", "emb" if self.key[1] == "O" else "pp", "", nbytes, name, 1, "direct")
        rel = self.flow(peer, self.rep, nbytes, name, coll, refs, hold=True, pulled=True)
        if self.key[1] != "O":  # a pipeline send: the sender may wait for it (overlap_p2p_comm off)
            t.sends.append((rel, sender, key))
        result = (layout, (self.me(rel),) + tuple(r for r in refs if r[1] == self.rep))
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
            if low.cfg.zero == 3 and low.training:
                self._gather_params()
            for op in low.unit_ops.get(self.key, []):
                self.op(op)
        t.arrays = {name: np.asarray(t.cols[name]) for name in _COLUMNS}
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

    def _gather_params(self) -> None:
        """ZeRO-3: all-gather this chunk's parameter shards before the unit."""
        low = self.low
        params = low.chunk_params[self.key[0]]
        first = low.unit_ops.get(self.key, [])
        if not first or params <= 0:
            return
        nbytes = overlap.gather_bytes(low, low.chunks[self.key[0]])
        self._param_deps = self.ring("all_gather", "dp", "dp+1", nbytes, low.cfg.dp_cp, first[0].name, ())

    def _optimizer(self) -> None:
        """Data-parallel gradient reduction in buckets, the optimizer step, ZeRO's parameter
        all-gather."""
        low = self.low
        cfg = low.cfg
        ops = low.unit_ops.get(self.key, [])
        if not ops:
            return
        eb = low.param_bytes
        buffers = [op for op in ops if op.param("what") == "grad_buffer"]
        adams = {op.param("layer"): op for op in ops if op.param("fn") == "adam"}
        # buckets in the order gradients complete: the chunk's later layers first
        buckets: list[list[Op]] = []
        size = 0
        for buf in sorted(buffers, key=lambda o: -o.param("layer")):
            if not buckets or size >= cfg.bucket:
                buckets.append([])
                size = 0
            buckets[-1].append(buf)
            size += low.rank_params.get(buf.param("layer"), 0)
        kind = "reduce_scatter" if cfg.zero >= 1 else "all_reduce"
        ready_of: dict[int, tuple] = {}
        for bucket in buckets:
            deps: list = []
            dense = expert = 0.0
            for buf in bucket:
                for name in buf.inputs:
                    deps.extend(self.tensor(name, "*", buf.name))
                dense += low.rank_params.get(buf.param("layer"), 0) - low.rank_expert_params.get(buf.param("layer"), 0)
                expert += low.rank_expert_params.get(buf.param("layer"), 0)
            if not cfg.overlap_grad_reduce:
                deps.append(("u", self.rep, ("last-backward", 0), 0, "last"))
            name = bucket[0].name
            ready = self.ring(kind, "dp", "dp+1", dense * eb, cfg.dp_cp, name, tuple(deps))
            if expert:  # over the ranks that hold the same expert weights
                pattern, n = experts.gradient_group(cfg, low.place.stage(self.rep))
                ready = ready + self.ring(kind, "dp", pattern, expert * eb, n, name, tuple(deps))
            for buf in bucket:
                ready_of[buf.param("layer")] = tuple(dict.fromkeys(ready))
        steps = []
        for layer, adam in sorted(adams.items(), key=lambda kv: -kv[0]):
            rel = self.compute(adam, ready_of.get(layer, ()))
            self.t.produced[adam.name] = ("R", (self.me(rel),))
            steps.append((layer, adam, rel))
        overlap.after_steps(self, steps)


def lower_parallel(graph: Graph, system: System, cfg: ParallelConfig, cost: CostModel | None = None, *,
                   folding: bool = True, where: str = "--parallel") -> TaskGraph:
    """Lower ``graph`` (an LLM workload) under ``cfg`` on ``system`` (see the module docstring).

    ``folding``: simulate one GPU per class of identical GPUs (exact, :mod:`.fold`); False: every
    GPU. Raises InputError when the configuration cannot run the workload on the system."""
    if cost is None:
        from marssim.cost import default_cost_model

        cost = default_cost_model()
    t = graph.meta.get("transformer")
    if t is None:
        raise InputError(where, "", "a parallel configuration needs an LLM workload (gpt, llama, moe or a preset)")
    check_parallel(cfg, t, len(system.accelerators), where)
    graph = prepare_graph(graph, cfg)
    with gc_paused():
        return _lower(graph, system, cfg, cost, folding)


def _lower(graph: Graph, system: System, cfg: ParallelConfig, cost: CostModel, folding: bool) -> TaskGraph:
    import time

    wall = time.perf_counter()
    where = place(system, cfg)
    patterns = where.patterns()
    if folding:
        role = {}
        for g in where.gpus:
            acc = system.accelerator(system.nodes[g])
            role[g] = (where.stage(g), acc.designs, acc.memory.capacity)
        folded = fold(system, where.gpus, role, patterns, pulls=PULLS)
    else:
        folded = identity_folding(system, where.gpus)
    low = _Lowering(graph, system, cfg, cost, folded, where)
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
    for rep, key, _ in order:
        low.template(rep, key)
    tg = _assemble(low, order)
    tg.meta["wall_lower_s"] = time.perf_counter() - wall
    tg.meta["wall_templates_s"] = time.perf_counter() - build_wall
    return tg


def _parameters(low: _Lowering) -> None:
    """Per layer group: the parameters one rank of the group holds (and of them the experts'),
    and per chunk the parameters of its layers; the bytes of a parameter."""
    from .memory import rank_parameters

    from marssim.workload.op import DTYPE_BYTES

    per_layer, experts = graph_cached(low.graph, ("rank_parameters", low.rules_key),
                                      lambda: rank_parameters(low.graph, low.cfg, low.rules))
    low.rank_params = per_layer
    low.rank_expert_params = experts
    low.chunk_params = [sum(per_layer.get(layer, 0) for layer in layers) for layers in low.chunks]

    low.param_bytes = float(DTYPE_BYTES[low.t.dtype])


def _template_edges(tpl: _Template) -> None:
    """Precompute a template's internal edges and its references grouped by target unit."""
    counts = np.fromiter(map(len, tpl.preds), dtype=np.int64, count=len(tpl.preds))
    tpl.edge_dst = np.repeat(np.arange(len(tpl.preds), dtype=np.int64), counts)
    tpl.edge_src = np.fromiter((p for ps in tpl.preds for p in ps), dtype=np.int64, count=int(counts.sum()))
    groups: dict[tuple, tuple[list[int], list[int]]] = {}
    for rel, ref in tpl.ext:
        _, r_rep, r_key, r_rel, mode = ref
        g = groups.setdefault((r_rep, r_key, mode), ([], []))
        g[0].append(rel)
        g[1].append(r_rel)
    tpl.ext_groups = [(k, np.asarray(a, dtype=np.int64), np.asarray(b, dtype=np.int64)) for k, (a, b) in groups.items()]


def _assemble(low: _Lowering, order: list[tuple[int, tuple[int, str], int]]) -> TaskGraph:
    """Copy the templates into one TaskGraph: unit instances at their offsets, references
    resolved, each GPU's kernels chained in schedule order."""
    base: dict[tuple[int, tuple[int, str], int], int] = {}
    last_of: dict[tuple[int, tuple[int, str]], int] = {}
    at = 0
    for rep, key, mb in order:
        base[(rep, key, mb)] = at
        last_of[(rep, key)] = max(mb, last_of.get((rep, key), -1))
        at += len(low.templates[(rep, key)])
    n = at
    for tpl in low.templates.values():
        if not hasattr(tpl, "edge_dst"):
            _template_edges(tpl)
    cols: dict[str, list] = {name: [] for name in _COLUMNS}
    micro = []
    coll_list: list[Collective] = []
    dst_parts: list[np.ndarray] = []
    src_parts: list[np.ndarray] = []
    prev_compute: dict[int, int] = {}
    last_backward: dict[int, int] = {}
    chain_dst: list[int] = []
    chain_src: list[int] = []
    for rep, key, mb in order:
        tpl = low.templates[(rep, key)]
        b = base[(rep, key, mb)]
        arrays = tpl.arrays
        size = len(tpl)
        if not size:
            continue
        for name in _COLUMNS:
            col = arrays[name]
            if name == "collective" and coll_list:
                col = np.where(col >= 0, col + len(coll_list), -1)
            cols[name].append(col)
        coll_list.extend(tpl.colls)
        micro.append(np.full(size, mb, dtype=np.int32))
        if len(tpl.edge_dst):
            dst_parts.append(tpl.edge_dst + b)
            src_parts.append(tpl.edge_src + b)
        for (r_rep, r_key, mode), rels, r_rels in tpl.ext_groups:
            if r_key == ("last-backward", 0):
                target = last_backward.get(rep)
                if target is None:
                    continue
                dst_parts.append(rels + b)
                src_parts.append(np.full(len(rels), target, dtype=np.int64))
                continue
            r_mb = last_of.get((r_rep, r_key), 0) if mode == "last" else mb
            target = base.get((r_rep, r_key, r_mb))
            if target is None:
                continue
            dst_parts.append(rels + b)
            src_parts.append(r_rels + target)
        if tpl.first_compute >= 0:
            prev = prev_compute.get(rep)
            if prev is not None:
                chain_dst.append(b + tpl.first_compute)
                chain_src.append(prev)
            prev_compute[rep] = b + tpl.last_compute
            if key[1] == "B":
                last_backward[rep] = b + tpl.last_compute
    dst_parts.append(np.asarray(chain_dst, dtype=np.int64))
    src_parts.append(np.asarray(chain_src, dtype=np.int64))
    blocking_dst, blocking_src = overlap.blocking_send_edges(low, order, base)
    dst_parts.append(blocking_dst)
    src_parts.append(blocking_src)
    dst = np.concatenate(dst_parts)
    src = np.concatenate(src_parts)
    order_edges = np.argsort(dst, kind="stable")
    pred_idx = src[order_edges].astype(np.int32)
    pred_ptr = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(np.bincount(dst, minlength=n), out=pred_ptr[1:])
    c = {name: np.concatenate(parts) if parts else np.zeros(0) for name, parts in cols.items()}
    kind = c["kind"].astype(np.int8)
    priority = np.arange(n, dtype=np.int64)
    resident, setup = _memory(low)
    meta = _meta(low)
    steps = c["steps"].astype(np.int32)
    ops_info = _op_info(low)
    names = low.system.nodes
    tg = TaskGraph(
        kind=kind, device=c["device"].astype(np.int32), duration=c["duration"].astype(np.float64),
        src=c["src"].astype(np.int32), dst=c["dst"].astype(np.int32), nbytes=c["nbytes"].astype(np.float64),
        route=c["route"].astype(np.int32), flops=c["flops"].astype(np.float64),
        energy=c["energy"].astype(np.float64), mem_node=c["mem_node"].astype(np.int32),
        mem_bytes=c["mem_bytes"].astype(np.float64), priority=priority, op=c["op"].astype(np.int32),
        micro_batch=np.concatenate(micro) if micro else np.zeros(0, dtype=np.int32),
        collective=c["collective"].astype(np.int32), pred_ptr=pred_ptr, pred_idx=pred_idx,
        node_names=low.system.nodes, op_names=tuple(op.name for op in low.graph.ops), routes=tuple(low.routes),
        collectives=tuple(coll_list), resident=resident, setup=setup, meta=meta, ops=ops_info,
        device_design={names[g]: low.system.accelerator(names[g]).designs[0] for g in low.fold.reps},
        batch=low.cfg.batch, steps=steps if (steps > 1).any() else None)
    for name in ("kind", "device", "duration", "src", "dst", "nbytes", "route", "flops", "energy", "mem_node",
                 "mem_bytes", "priority", "op", "micro_batch", "collective", "pred_ptr", "pred_idx"):
        getattr(tg, name).setflags(write=False)
    return tg


def _memory(low: _Lowering) -> tuple[dict[str, float], tuple[tuple[str, str, float], ...]]:
    """Resident bytes of each representative (weights, gradients, optimizer state, KV cache) and
    the weight loads of every GPU from its node's host."""
    names = low.system.nodes
    resident: dict[str, float] = {}
    setup = []
    per_stage = {}
    for stage in range(low.cfg.pp):
        per_stage[stage] = static_bytes(low.graph, low.cfg, stage, low.rules, low.rank_params)
    for g in low.place.gpus:
        stage = low.place.stage(g)
        total = per_stage[stage].total
        if g in low.fold.reps:
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
    peaks = []
    for g in low.place.gpus:
        design = low.design(g)
        if design.gpu is not None:
            table = design.gpu.peak_flops
            peaks.append(float(table.get(low.t.dtype) or table.get("bf16") or table.get("fp16") or max(table.values())))
        else:
            peaks.append(2.0 * design.peak_macs_per_s)
    return total, sum(peaks) / len(peaks)  # per GPU, averaged over the GPUs of a mixed cluster


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
        "model_flops": model_flops, "peak_flops": peak,
    }
