"""Memory per GPU under a parallel configuration, in closed form (before any simulation).

Per rank of pipeline stage ``s``, for the layers of the stage's chunks (:func:`rank_parameters`
splits each op's weights by its tensor- and expert-parallel rule):

* weights: the rank's parameters at the bytes the workload holds per parameter of each op (the
  model's element type, plus the low-precision copies of an FP8 recipe's GEMM weights:
  :func:`marssim.workload.llm.precision.held_weight_bytes`; ZeRO-3: ``1/dp`` of them);
* gradients: the main gradients' buffer, 4 B per parameter (fp32, Megatron-LM's default for bf16)
  or 2 B (``grad_reduce_dtype=bf16``, fp16 training: :func:`.megatron.grad_dtype`); ZeRO-2 and 3: ``1/dp``;
* optimizer state: 12 B per parameter (fp32 master weights and Adam's two moments; 4 B with
  ``optimizer_dtype=bf16``: bf16 moments, no master copy; ZeRO-1 and
  above: ``1/dp``; with context parallelism every ``1/dp`` is ``1/(dp x cp)``, the distributed
  optimizer's group); the last stage of a pipeline with tied embeddings keeps a copy of the word
  embedding (and its gradient and optimizer state), as Megatron-LM does;
* activations: per micro-batch, the forward outputs and dropout masks the backward reads
  (:func:`marssim.workload.llm.footprint.saved_tensors`) of the stage's layers, each divided by
  its tensor-parallel split, times the micro-batches in flight: all ``m`` under GPipe,
  ``min(pp - s, m)`` under 1F1B, ``min((pp - s - 1) * 2 + (v - 1) * pp + 1, m v)`` chunks of
  ``1/v`` of the stage under the interleaved schedule;
* KV cache (serving): the stage's layers' caches, split over the tensor-parallel ranks by key and
  value heads;
* communication buffers: ZeRO-3's gathered parameters (the most its forward or backward holds at
  once under DeepSpeed's prefetch, live and reuse limits, the persistent ones, and one gradient
  bucket: :func:`.zero3.live_bytes`); under context
  parallelism the key/value ring's buffers of one layer (:func:`.context.kv_buffer_bytes`); under
  ``tp_comm_overlap`` Transformer Engine's userbuffers (:func:`.userbuffers.buffer_bytes`).

With context parallelism the graph is one rank's ``seq / cp`` tokens, so activations are those of
its tokens.

The simulation reports the peak it observes (the same static bytes as a resident floor plus
every buffer while it lives); this closed form is what a search uses to reject a configuration
before lowering it.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

from marssim.errors import CapacityError
from marssim.system import System
from marssim.workload import Graph, OpKind
from marssim.workload.llm import require_transformer
from marssim.workload.op import DTYPE_BYTES

from . import context, userbuffers
from .config import ParallelConfig
from .experts import EXPERT_LAYOUTS, busiest_share, layout_fraction
from .megatron import OPTIMIZER_STATE_BYTES, grad_dtype
from .memo import graph_cached
from .partition import chunk_layers, op_rules, prepare_graph, rules_key, shard_weights, stage_of_layers
from .placement import place
from .zero3 import live_bytes

__all__ = ["StaticMemory", "MemoryEstimate", "rank_parameters", "low_precision_rank_parameters", "rank_weight_bytes",
           "static_bytes", "memory_estimate", "check_memory"]


@dataclass(frozen=True)
class StaticMemory:
    """Bytes one rank of a stage holds for the whole run."""

    weights: float
    gradients: float
    optimizer: float
    kv_cache: float

    @property
    def total(self) -> float:
        return self.weights + self.gradients + self.optimizer + self.kv_cache


@dataclass(frozen=True)
class MemoryEstimate:
    """The peak one rank of each stage reaches: static bytes, activations in flight (plus the
    working set of a layer recomputed for its backward) and communication buffers (ZeRO-3's
    gathered parameters and gradient bucket). This one model is what the pre-check refuses by, what
    the search screens with and what a run reports."""

    static: dict[int, StaticMemory]
    activations: dict[int, float]  # per stage, bytes of the micro-batches in flight
    capacity: float
    working: dict[int, float] = field(default_factory=dict)  # per stage, a recomputed layer's activations
    buffers: dict[int, float] = field(default_factory=dict)  # per stage, communication buffers

    def peak(self, stage: int) -> float:
        return (self.static[stage].total + self.activations.get(stage, 0.0) + self.working.get(stage, 0.0)
                + self.buffers.get(stage, 0.0))

    @property
    def worst_stage(self) -> int:
        return max(self.static, key=self.peak)

    @property
    def fits(self) -> bool:
        return all(self.peak(s) <= self.capacity for s in self.static)

    def terms(self, stage: int) -> dict[str, float]:
        """Bytes by term (see :data:`.report.MEMORY_TERMS`); they add up to :meth:`peak`."""
        st = self.static[stage]
        return {"weights": st.weights, "gradients": st.gradients, "optimizer state": st.optimizer,
                "activations": self.activations.get(stage, 0.0) + self.working.get(stage, 0.0),
                "KV cache": st.kv_cache, "communication buffers": self.buffers.get(stage, 0.0)}


def tied_copy_params(t, cfg: ParallelConfig) -> int:
    """Parameters of one rank of the last stage's copy of a word embedding tied to the output
    layer (``t``: the :class:`~marssim.workload.llm.TransformerConfig`): its vocabulary part, padded
    to ``tp`` equal parts. Megatron-LM keeps the copy there with pipeline parallelism, all-reduces
    its gradient with the first stage's and updates it (``optimizer.allreduce_word_embedding_grads``)."""
    return -(-t.vocab // cfg.tp_of(cfg.pp - 1)) * t.hidden


def rank_parameters(graph: Graph, cfg: ParallelConfig, rules) -> tuple[dict[int, int], dict[int, int]]:
    """Per layer group (``layer`` of the ops): parameters one rank holds, and how many of them
    are expert weights."""
    stage_of = stage_of_layers(require_transformer(graph, "a parallel configuration").layers, cfg)
    per: dict[int, int] = defaultdict(int)
    experts: dict[int, int] = defaultdict(int)
    for op in graph.ops:
        if op.param("phase", "fwd") != "fwd" or not op.weight_elems or op.param("shares"):
            continue
        n = shard_weights(op, rules[op.name], cfg.tp_of(stage_of[op.param("layer")]))
        per[op.param("layer")] += n
        if op.param("grouped"):
            experts[op.param("layer")] += n
    return dict(per), dict(experts)


def low_precision_rank_parameters(graph: Graph, cfg: ParallelConfig, rules) -> dict[int, int]:
    """Per layer group: parameters one rank holds of GEMMs whose weights a low-precision recipe
    casts (``w_dtype`` fp8 or fp4), split as :func:`rank_parameters` splits them."""
    from marssim.workload.llm.precision import LOW_PRECISION
    stage_of = stage_of_layers(require_transformer(graph, "a parallel configuration").layers, cfg)
    per: dict[int, int] = defaultdict(int)
    for op in graph.ops:
        if op.param("phase", "fwd") != "fwd" or not op.weight_elems or op.param("shares") or \
                op.param("w_dtype") not in LOW_PRECISION:
            continue
        per[op.param("layer")] += shard_weights(op, rules[op.name], cfg.tp_of(stage_of[op.param("layer")]))
    return dict(per)


def weight_cast_parameters(rank_low: int, cfg: ParallelConfig, fp8_param_gather: bool) -> int:
    """Parameters the low-precision weight cast after an optimizer step converts on one rank, of
    ``rank_low`` low-precision GEMM parameters it holds (:func:`low_precision_rank_parameters`):
    its ``1/(dp x cp)`` shard when the distributed optimizer gathers the weights in FP8
    (``fp8_param_gather`` with ZeRO), all of them otherwise."""
    if fp8_param_gather and cfg.zero >= 1:
        return -(-rank_low // cfg.dp_cp)
    return rank_low


def rank_weight_bytes(graph: Graph, cfg: ParallelConfig, rules) -> dict[int, float]:
    """Per layer group: bytes of weights one rank holds, each op's parameters at the bytes the
    workload holds per parameter (:func:`marssim.workload.llm.precision.held_weight_bytes`)."""
    from marssim.workload.llm.precision import held_weight_bytes
    t = require_transformer(graph, "a parallel configuration")
    stage_of = stage_of_layers(t.layers, cfg)

    def make() -> dict[int, float]:
        out: dict[int, float] = defaultdict(float)
        for op in graph.ops:
            if op.param("phase", "fwd") != "fwd" or not op.weight_elems or op.param("shares"):
                continue
            n = shard_weights(op, rules[op.name], cfg.tp_of(stage_of[op.param("layer")]))
            out[op.param("layer")] += n * held_weight_bytes(op, t)
        return out

    return graph_cached(graph, ("rank_weight_bytes", rules_key(cfg, stage_of)), make)


def _stage_layers(graph: Graph, cfg: ParallelConfig, stage: int) -> set[int]:
    t = require_transformer(graph, "a parallel configuration")
    chunks = chunk_layers(t.layers, cfg)
    return {layer for c, layers in enumerate(chunks) if c % cfg.pp == stage for layer in layers}


def _resident_inputs(graph: Graph) -> list:
    """The graph's resident inputs (a serving graph's KV cache), in graph order (kept with the graph)."""

    return graph_cached(graph, "resident_inputs", lambda: [op for op in graph.ops
                                                            if op.kind == OpKind.INPUT and op.param("resident")])


def static_bytes(graph: Graph, cfg: ParallelConfig, stage: int, rules, per: dict[int, int] | None = None,
                 held_per: dict[int, float] | None = None) -> StaticMemory:
    """The static bytes of one rank of ``stage`` (see the module docstring); ``per``: the
    :func:`rank_parameters` per layer, ``held_per``: the bytes of weights a rank holds per layer,
    when the caller has them."""
    t = require_transformer(graph, "a parallel configuration")
    layers = _stage_layers(graph, cfg, stage)
    if per is None:
        per, _ = rank_parameters(graph, cfg, rules)
    if held_per is None:
        held_per = rank_weight_bytes(graph, cfg, rules)
    params = sum(per.get(layer, 0) for layer in layers)
    held = sum(held_per.get(layer, 0.0) for layer in layers)
    if t.tie_embeddings and cfg.pp > 1 and stage == cfg.pp - 1 and t.training:
        tied = tied_copy_params(t, cfg)  # the last stage's copy of the word embedding
        params += tied
        held += tied * DTYPE_BYTES[t.dtype]
    dp = cfg.dp_cp  # the distributed optimizer's group: data- and context-parallel ranks
    weights = held / (dp if cfg.zero >= 3 else 1)
    grads = opt = 0.0
    if t.training:
        grads = params * DTYPE_BYTES[grad_dtype(cfg, t)] / (dp if cfg.zero >= 2 else 1)
        opt = params * OPTIMIZER_STATE_BYTES[cfg.optimizer_dtype] / (dp if cfg.zero >= 1 else 1)
    kv = 0.0
    for op in _resident_inputs(graph):
        if op.param("layer") in layers:
            heads = t.kv
            kv += op.output_bytes * (-(-heads // cfg.tp_of(stage))) / heads
    return StaticMemory(float(weights), float(grads), float(opt), float(kv))


def _in_flight(cfg: ParallelConfig, stage: int, micro_batches: int) -> float:
    """Micro-batches (in units of a whole stage's layers) whose activations a stage holds at once."""
    m, p = micro_batches, cfg.pp
    if cfg.schedule == "gpipe":
        return float(m)
    if cfg.schedule == "1f1b":
        return float(min(p - stage, m))
    v = cfg.virtual_stages
    return min((p - stage - 1) * 2 + (v - 1) * p + 1, m * v) / v


def memory_estimate(graph: Graph, cfg: ParallelConfig, capacity: float, rules=None,
                    per: dict[int, int] | None = None) -> MemoryEstimate:
    """Static, activation and buffer bytes per stage for one rank (``graph``: one micro-batch,
    prepared for ``cfg``); ``capacity``: bytes of a GPU's memory; ``rules`` and ``per`` (the
    :func:`rank_parameters` per layer) when the caller has them."""

    if rules is None:
        rules = op_rules(graph, cfg)
    if per is None:  # kept with the graph, as the lowering keeps it (RunModel)
        key = ("rank_parameters", rules_key(cfg, stage_of_layers(require_transformer(graph, "a memory estimate").layers,
                                                                  cfg)))
        per, _ = graph_cached(graph, key, lambda: rank_parameters(graph, cfg, rules))
    held_per = rank_weight_bytes(graph, cfg, rules)
    static = {s: static_bytes(graph, cfg, s, rules, per, held_per) for s in range(cfg.pp)}
    acts: dict[int, float] = {}
    working: dict[int, float] = {}
    buffers: dict[int, float] = {}
    t = require_transformer(graph, "a parallel configuration")
    if t.training:
        per_layer = _saved_per_layer(graph, cfg, rules)
        plain = per_layer
        if t.recompute != "none":  # a layer's backward first recomputes what its forward did not keep
            plain = _saved_per_layer_without_recompute(graph, cfg, rules)
        for s in range(cfg.pp):
            layers = _stage_layers(graph, cfg, s)
            acts[s] = sum(per_layer.get(layer, 0.0) for layer in layers) * _in_flight(cfg, s, cfg.micro_batches)
            working[s] = max((plain.get(layer, 0.0) - per_layer.get(layer, 0.0) for layer in layers), default=0.0)
    if cfg.zero >= 3 and cfg.dp_cp > 1 and t.training:  # what ZeRO-3 holds gathered at once, and a gradient bucket
        for s in range(cfg.pp):
            buffers[s] = live_bytes(graph, cfg, rules, s, DTYPE_BYTES[t.dtype], DTYPE_BYTES[grad_dtype(cfg, t)])
    for s, extra in _knob_buffers(graph, cfg).items():
        buffers[s] = buffers.get(s, 0.0) + extra
    return MemoryEstimate(static, acts, capacity, working, buffers)


def _knob_buffers(graph: Graph, cfg: ParallelConfig) -> dict[int, float]:
    """Per stage, bytes of the context-parallel ring's buffers and of Transformer Engine's
    userbuffers (``graph``: one micro-batch on one context-parallel rank)."""
    t = require_transformer(graph, "a parallel configuration")
    out: dict[int, float] = {}
    core = None
    if cfg.cp > 1:
        core = next((op for op in graph.ops if op.param("fused") == "fwd" and op.param("phase", "fwd") == "fwd"), None)
    for s in range(cfg.pp):
        tp = cfg.tp_of(s)
        extra = userbuffers.buffer_bytes(t, cfg) if tp > 1 else 0.0
        if cfg.cp > 1 and core is not None and t.training:
            index = graph.index
            kv = sum(graph.ops[index[name]].output_bytes for name in core.inputs[1:3]) / tp
            extra += context.kv_buffer_bytes(cfg.cp, kv, core.output_bytes / tp)
        if extra:
            out[s] = extra
    return out


def _saved_per_layer_without_recompute(graph: Graph, cfg: ParallelConfig, rules) -> dict[int, float]:
    """:func:`_saved_per_layer` of the workload of ``graph`` (which recomputes) built without
    recomputation, read from ``graph`` itself
    (:func:`~marssim.workload.llm.footprint.saved_without_recompute`: its forward ops and their
    rules are that graph's); built and read where a recomputed copy names no forward op."""
    from marssim.workload.llm.footprint import saved_without_recompute

    t = require_transformer(graph, "a parallel configuration")
    key = ("saved_per_layer_without_recompute",) + rules_key(cfg, stage_of_layers(t.layers, cfg))

    def make() -> dict[int, float]:
        saved = saved_without_recompute(graph)
        if saved is None:
            whole = prepare_graph(graph, cfg.with_(recompute="none"))
            return _saved_per_layer(whole, cfg, op_rules(whole, cfg))
        return _saved_per_layer(graph, cfg, rules, saved)

    return graph_cached(graph, key, make)


def _saved_per_layer(graph: Graph, cfg: ParallelConfig, rules, saved: dict | None = None) -> dict[int, float]:
    """Bytes of activations one micro-batch keeps for the backward, per layer group, on one rank
    (each tensor divided by its tensor-parallel split); ``saved``: the tensors kept (default:
    :func:`~marssim.workload.llm.footprint.saved_tensors` of ``graph``)."""
    from marssim.workload.llm.footprint import saved_tensors
    t = require_transformer(graph, "a parallel configuration")
    per_layer: dict[int, float] = defaultdict(float)
    stage_of = stage_of_layers(t.layers, cfg)
    index = graph.index
    if saved is None:
        saved = graph_cached(graph, "saved", lambda: saved_tensors(graph))
    share = busiest_share(t.expert_load, cfg.ep)
    for (name, what), (size, layer) in saved.items():
        rule = rules.get(name)
        stage = stage_of[graph.ops[index[name]].param("layer")]
        tp = cfg.tp_of(stage)
        out = rule.out if rule is not None else "R"
        if out in EXPERT_LAYOUTS:  # routed tokens: the busiest rank's, gathered over etp where they are
            per_layer[layer] += size * layout_fraction(out, tp, cfg.etp_of(stage), share)
        else:
            per_layer[layer] += size / (tp if out in ("S", "F") else 1)
    return dict(per_layer)


def check_memory(graph: Graph, system: System, cfg: ParallelConfig) -> None:
    """Raise CapacityError naming the GPU, its peak, the capacity and the largest term when the
    closed-form memory of ``cfg`` exceeds a GPU's memory (see :mod:`.memory`)."""

    prepared = prepare_graph(graph, cfg)
    capacity = min(a.memory.capacity for a in system.accelerators)
    est = memory_estimate(prepared, cfg, capacity)
    if est.fits:
        return
    stage = est.worst_stage
    where = place(system, cfg)
    gpu = next(system.nodes[g] for g in where.gpus if where.stage(g) == stage)
    terms = est.terms(stage)
    largest = max(terms, key=terms.get)
    raise CapacityError(gpu, None, est.peak(stage), capacity,
                        f"stage {stage} of {cfg.pp}, before simulating: largest term {largest} "
                        f"{terms[largest] / 2**30:.2f} GiB; "
                        + ", ".join(f"{k} {v / 2**30:.2f} GiB" for k, v in terms.items() if v)
                        + "; --memory-policy ignore simulates anyway")
