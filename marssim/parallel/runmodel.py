"""The model of a parallel run: one configuration of one workload on one system, as the lowering
(:mod:`.lower`) and the closed-form screen (:mod:`.analytic`) both read it.

A :class:`RunModel` holds what a run is made of before any task exists: the chunks and units of
the graph (:mod:`.partition`), every op's rule, output layout and shard timing on each GPU design
(the kernels Megatron-LM runs for it, :mod:`.megatron`, timed by the cost model), the parameters
each rank holds and updates, the routes between GPUs (folded, :mod:`.fold`) with the latency and
weight of NCCL's steps on them, the collectives' plans, the host's launch time and the model's
FLOPs against the GPUs' peak.

Shard timings are shared by every run of the graph with the same cost model (kept with the graph,
:data:`.memo.GRAPH_MEMO`); the rest is the run's own. Units: seconds, bytes, FLOPs, joules.
"""

from __future__ import annotations

from dataclasses import replace

from marssim.collectives.group import Hop, group_plan, hop_step, route_bottleneck
from marssim.collectives.plan import CollectivePlan
from marssim.cost.base import CostModel
from marssim.system import Route, System
from marssim.workload import Graph, Op, OpKind
from marssim.workload.llm import require_transformer
from marssim.workload.llm.tprole import TP_ROLE

from . import experts, zero3
from .config import ParallelConfig
from .fold import Folding, binding_route
from .host import launch_seconds
from .megatron import grad_dtype, kernels_key, op_kernels, optimizer_kernels, roles
from .memo import BoundedCache, OwnerMemo, graph_cached
from .memory import rank_parameters, tied_copy_params
from .partition import chunk_layers, op_rules, rules_key, shard_loops, stage_of_layers
from .patterns import PULL_NEXT, PULL_PREV
from .placement import Placement

__all__ = ["DESIGN_COUNTS", "SHARD_CACHE_SIZE", "RunModel", "design_counts"]

SHARD_CACHE_SIZE = 1 << 16
"""The most shard timings kept per graph and cost model."""


class RunModel:
    """One configuration ``cfg`` of ``graph`` (prepared for it) on ``system``, timed by ``cost``,
    its GPUs placed by ``where`` and folded by ``folding``; ``coupled_rings``: the lowering's ring
    collectives over several classes as coupled steps (see :func:`.lower.lower_parallel`)."""

    def __init__(self, graph: Graph, system: System, cfg: ParallelConfig, cost: CostModel, folding: Folding,
                 where: Placement, coupled_rings: bool = False) -> None:
        self.graph = graph
        self.coupled_rings = coupled_rings
        self.system = system
        self.cfg = cfg
        self.cost = cost
        self.fold = folding
        self.place = where
        self.t = require_transformer(graph, "a parallel configuration")
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
        self.groups: dict[tuple[int, str], list[int]] = {}  # UnitBuilder.group's memo
        self.group_names: dict[tuple[int, str], tuple[str, ...]] = {}  # the names of its GPUs
        self.memo: dict[tuple, object] = {}  # the closed-form screen's memo (.analytic), by named keys
        # shard timings by (op, design, split) and the cost model that timed them: shared by every
        # lowering of this graph with this cost model (kept beside it, so its id is never reused)
        entry = graph_cached(graph, ("shards", id(cost)), lambda: (cost, BoundedCache(SHARD_CACHE_SIZE)))
        if entry[0] is not cost:  # another cost model's (a dead one's id reused)
            entry = (cost, BoundedCache(SHARD_CACHE_SIZE))
        self.shard_cache: BoundedCache = entry[1]  # key -> (timing, cost model, kernels)
        self._shards: dict[tuple[str, str], tuple] = {}  # (op, design) -> its shard_cache entry
        self.cost_models: dict[str, str] = {}  # op -> the cost model that timed it
        self.shape_keys: dict[str, tuple] = graph_cached(graph, "shape_keys", dict)
        self.expert_share = experts.busiest_share(self.t.expert_load, cfg.ep)
        self.designs: dict[int, object] = {}
        self.roles: dict[str, tuple[str, ...]] = graph_cached(graph, "megatron_roles", lambda: roles(graph))
        self.kernels_key = kernels_key(cfg)
        self.optimizer_key = (cfg.clip_grad > 0, cfg.grads_clipped, cfg.fused_adam, grad_dtype(cfg, self.t),
                              cfg.optimizer_dtype)
        self._rules()
        self._units()
        self._parameters()

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

    def _parameters(self) -> None:
        """Per layer group: the parameters one rank of the group holds (and of them the experts'),
        and per chunk the parameters of its layers; the bytes of a parameter."""
        from marssim.workload.op import DTYPE_BYTES

        per_layer, expert_params = graph_cached(self.graph, ("rank_parameters", self.rules_key),
                                                lambda: rank_parameters(self.graph, self.cfg, self.rules))
        self.rank_params = per_layer
        self.rank_expert_params = expert_params
        self.chunk_params = [sum(per_layer.get(layer, 0) for layer in layers) for layers in self.chunks]

        self.param_bytes = float(DTYPE_BYTES[self.t.dtype])
        self.grad_bytes = float(DTYPE_BYTES[grad_dtype(self.cfg, self.t)])
        # the last stage's copy of a word embedding tied to the output layer (Megatron-LM keeps one
        # there with pipeline parallelism; memory.rank_parameters counts it in the head's group)
        output = self.graph.ops[self.op_index["output"]] if "output" in self.op_index else None
        self.tied_copy = bool(output is not None and self.training and output.param("shares") and
                              self.stage_of_chunk(self.chunk_of_layer[output.param("layer")]) != self.stage_of_chunk(0))
        self.word_embedding_params = tied_copy_params(self.t, self.cfg) if self.tied_copy else 0
        # what each group's optimizer updates and reduces: its parameters, the head's with the copy
        self.opt_params = dict(per_layer)
        if self.tied_copy:
            self.opt_params[self.t.layers] = self.opt_params.get(self.t.layers, 0) + self.word_embedding_params
        # ZeRO-3: each forward and backward unit's parameter all-gathers (.zero3)
        self.zero3_plans = zero3.unit_plans(self.graph, self.cfg, self.rules, self.unit_ops) \
            if self.cfg.zero == 3 and self.training and self.cfg.dp_cp > 1 else {}

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
            # a plan depends on the group's shape alone (group_plan memoises it so): one per set of GPUs
            group = (kind, nbytes, frozenset(members))
            plan = self._plans.get(group)
            if plan is None:
                names = self.system.nodes
                plan = self._plans[group] = (group_plan(self.system, [names[g] for g in members], kind, nbytes),)
            hit = self._plans[key] = (members, plan[0])
        return hit[1]

    def pull_pattern(self, stage: int, source: int) -> str | None:
        """The pattern of a pipeline transfer that ``stage`` pulls from ``source``."""
        if self.cfg.pp > 1 and source == (stage + 1) % self.cfg.pp:
            return PULL_NEXT
        if self.cfg.pp > 1 and source == (stage - 1) % self.cfg.pp:
            return PULL_PREV
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
        this run by op and design (what else its key holds is fixed within a lowering)."""
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
        entry = self._shards[(op.name, d.name)] = \
            self.shard_cache.put(key, (timing, c.model, 1 if kernels is None else len(kernels)))
        return entry

    def _shard_key(self, op: Op, design) -> tuple:
        rule = self.rules[op.name]
        adam = op.param("fn") == "adam"
        share = (self.opt_params.get(op.param("layer"), 0), self.cfg.dp_cp if self.cfg.zero >= 1 else 1) if adam else ()
        op_roles = self.roles.get(op.name, ())
        return (self.shape_key(op), design.name, rule.split, rule.scale, share, op_roles,
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
            hit = self.shard_cache.put(key, (sum(c.time for c in costs), "+".join(sorted({c.model for c in costs})),
                                             len(costs)))
        return hit

    def shape_key(self, op: Op) -> tuple:
        """What an op's shard timing depends on, without its name (blocks share timings)."""
        key = self.shape_keys.get(op.name)
        if key is None:
            params = tuple((k, v) for k, v in op.params if k not in ("layer", "shares", "mask_of", TP_ROLE))
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

    # ------------------------------------------------------------------ FLOPs
    def model_flops(self) -> tuple[float, float]:
        """Model FLOPs of one iteration (all GPUs) and a GPU's peak FLOP/s for the model's type."""
        from marssim.workload.llm.footprint import footprint

        f = self.graph.meta.get("unsplit_footprint") or \
            graph_cached(self.graph, "footprint", lambda: footprint(self.graph))
        per_replica = f.model_flops if self.training else f.flops.get("fwd", 0.0)
        total = per_replica * self.micro_batches * self.cfg.dp
        return total, self.peak(self.t.dtype)

    def peak(self, dtype: str) -> float:
        """A GPU's dense peak FLOP/s for ``dtype`` (bf16, fp16, then the largest where the design
        lists no such type), averaged over the GPUs of a mixed cluster."""
        peaks = []
        for g, count in design_counts(self.system, tuple(self.place.gpus)):
            design = self.design(g)
            if design.gpu is not None:
                table = design.gpu.peak_flops
                peak = float(table.get(dtype) or table.get("bf16") or table.get("fp16") or max(table.values()))
            else:
                peak = 2.0 * design.peak_macs_per_s
            peaks.append(peak * count)
        return sum(peaks) / len(self.place.gpus)


DESIGN_COUNTS = OwnerMemo(default_size=64)
"""Per system (while it lives), the GPUs of each design among a run's GPUs (:func:`design_counts`)."""


def design_counts(system: System, gpus: tuple[int, ...]) -> tuple[tuple[int, int], ...]:
    """(a GPU of each accelerator design, how many of ``gpus`` have it), in the order met;
    memoised per system (:data:`DESIGN_COUNTS`)."""
    return DESIGN_COUNTS.get_or_make(system, ("design counts", gpus), lambda: _count_designs(system, gpus))


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
