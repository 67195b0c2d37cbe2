"""What one step of a transformer graph costs: parameters, FLOPs per phase, bytes held.

Everything is read off the graph's ops (not a separate formula), so it agrees with what the
evaluators see:

* parameters: weight elements of the forward ops that own them; for mixture-of-experts models
  the *active* parameters per token count ``top_k`` of the ``experts`` expert matrices;
* FLOPs per phase: forward, backward, recomputation, optimizer, and ``cast``: the casts and
  amax updates of a low-precision recipe, whatever their phase; *model FLOPs* are forward plus
  backward without recomputation or casts (what model-FLOPs utilisation divides by: the same in
  every precision);
* weights at the model's element type, and the low-precision copies a recipe keeps of its GEMM
  weights (``dtype=fp8``: :func:`marssim.workload.llm.precision.held_weight_bytes`); for
  training, fp32 gradients (Megatron-LM accumulates them in fp32 ``main_grad`` buffers) and the
  optimizer state (fp32 master weights and the two Adam moments: 12 B per parameter), before
  any sharding, whatever the GEMMs' precision;
* activations kept for backward: every forward output some backward (or recomputation) op
  reads, plus the one-byte dropout masks, counted once each, per block; this is what
  Korthikanti et al. 2022 count (section 4: ``s*b*h*(34 + 5*a*s/h)`` bytes per block with
  16-bit activations, ``34*s*b*h`` with selective recomputation, ``2*s*b*h`` with full); under
  an FP8 recipe a GEMM's kept input is its FP8 copy (1 B per element), read off the graph too;
* the KV cache of serving graphs: ``2 * layers * kv_heads * head_dim * tokens * batch`` elements
  at ``kv_dtype``.
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass, field

from marssim.workload.graph import Graph
from marssim.workload.op import DTYPE_BYTES, OpKind

from .build import transformer_of
from .precision import held_weight_bytes

__all__ = ["Footprint", "footprint", "saved_tensors", "saved_without_recompute", "CAST_FNS"]

CAST_FNS = frozenset({"quantize", "amax", "amax_update"})
"""Element-wise functions of a low-precision recipe's casts (:mod:`.precision`)."""
GRAD_BYTES = 4
"""Bytes per parameter of the gradient buffers (fp32 main gradients)."""
OPTIMIZER_BYTES = 12
"""Bytes per parameter of the optimizer state (fp32 master weights, Adam's two moments)."""


@dataclass(frozen=True)
class Footprint:
    """One step of a graph. Counts, FLOPs and bytes (no sharding)."""

    parameters: int
    active_parameters: int
    flops: dict[str, float]  # by phase: fwd, bwd, recompute, opt; cast (low-precision casts, amax updates)
    weight_bytes: int  # every weight held, the low-precision copies included
    gradient_bytes: int
    optimizer_bytes: int
    activation_bytes: int
    activation_bytes_per_layer: dict[int, int] = field(default_factory=dict)
    kv_cache_bytes: int = 0
    low_precision_weight_bytes: int = 0  # of weight_bytes: the GEMM weights' FP8 (NVFP4) copies

    @property
    def model_flops(self) -> float:
        """Forward and backward FLOPs without recomputation (model-FLOPs utilisation's numerator)."""
        return self.flops.get("fwd", 0.0) + self.flops.get("bwd", 0.0)

    @property
    def total_flops(self) -> float:
        return float(sum(self.flops.values()))


def saved_tensors(graph: Graph) -> dict[tuple[str, str], tuple[int, int]]:
    """The activations a training graph keeps for backward: ``(op name, "out" or "mask") ->
    (bytes, layer)``. A forward output is kept when a backward or recomputation op reads it
    (its layer: the smallest layer among those readers); a dropout mask (one byte per
    element) when the backward reads the mask of a forward (not recomputed) dropout."""
    return _kept(graph, ("bwd", "recompute"), {})


RECOMPUTED = ".recompute"
"""The suffix of a recomputed copy of a forward op (:mod:`.autograd`)."""


def saved_without_recompute(graph: Graph) -> dict[tuple[str, str], tuple[int, int]] | None:
    """:func:`saved_tensors` of the same workload built without recomputation, read from
    ``graph``, which recomputes: its backward reads each recomputed copy where the graph without
    recomputation reads the forward op it copies (same op, same bytes, same readers in the same
    order). None when a copy names no forward op."""
    ops = graph.ops
    index = graph.index
    alias: dict[str, str] = {}
    for op in ops:
        if op.param("phase") == "recompute":
            source = op.name[:-len(RECOMPUTED)] if op.name.endswith(RECOMPUTED) else None
            if source is None or source not in index or ops[index[source]].param("phase", "fwd") != "fwd":
                return None
            alias[op.name] = source
    return _kept(graph, ("bwd",), alias)


def _kept(graph: Graph, phases: tuple[str, ...], alias: dict[str, str]) -> dict[tuple[str, str], tuple[int, int]]:
    """The forward outputs (and dropout masks) the ops of ``phases`` read, each tensor read
    through ``alias`` (a recomputed copy -> its forward op)."""
    index = graph.index
    ops = graph.ops
    out: dict[tuple[str, str], tuple[int, int]] = {}
    for op in ops:
        phase = op.param("phase")
        if phase not in phases:
            continue
        layer = op.param("layer")
        for src in op.inputs:
            src = alias.get(src, src)
            producer = ops[index[src]]
            if producer.kind == OpKind.INPUT or producer.param("phase", "fwd") != "fwd":
                continue
            key = (src, "out")
            size = producer.output_bytes
            if key in out:
                size, seen = out[key]
                layer = min(layer, seen) if layer is not None else seen
            out[key] = (size, layer)
        mask = op.param("mask_of")
        if mask is not None:
            mask = alias.get(mask, mask)
            producer = ops[index[mask]]
            if producer.param("phase", "fwd") == "fwd":
                out[(mask, "mask")] = (producer.out_elems, layer)
    return out


def footprint(graph: Graph) -> Footprint:
    """The :class:`Footprint` of ``graph`` (any workload; the training and serving terms are
    zero where the graph has none)."""
    cfg = transformer_of(graph)
    flops: dict[str, float] = defaultdict(float)
    params = 0
    expert_params = 0
    weight_bytes = 0.0
    low_bytes = 0.0
    for op in graph.ops:
        flops["cast" if op.param("fn") in CAST_FNS else op.param("phase", "fwd")] += op.flops
        if op.param("phase", "fwd") == "fwd" and op.weight_elems and not op.param("shares"):
            params += op.weight_elems
            if cfg is None:
                weight_bytes += op.weight_bytes
            else:
                held = op.weight_elems * held_weight_bytes(op, cfg)
                weight_bytes += held
                if op.param("w_dtype"):
                    low_bytes += held - (op.weight_elems * DTYPE_BYTES[cfg.dtype] if cfg.training and
                                         not cfg.fp8_param_gather else 0)
            if op.param("grouped"):
                expert_params += op.weight_elems
    active = params
    if cfg is not None and cfg.is_moe and expert_params:
        active = params - expert_params + expert_params * cfg.top_k // cfg.experts
    training = graph.training
    per_layer: dict[int, int] = defaultdict(int)
    if training:
        for size, layer in saved_tensors(graph).values():
            per_layer[layer] += size
    kv = 0
    for op in graph.ops:
        if op.kind == OpKind.INPUT and op.param("resident"):
            kv += op.output_bytes
    if not kv and cfg is not None and cfg.mode == "prefill":
        kv = math.ceil(2 * cfg.layers * cfg.kv * cfg.d_head * cfg.seq * cfg.batch * DTYPE_BYTES[cfg.cache_dtype])
    return Footprint(
        parameters=params, active_parameters=active, flops=dict(flops), weight_bytes=math.ceil(weight_bytes),
        low_precision_weight_bytes=math.ceil(low_bytes),
        gradient_bytes=GRAD_BYTES * params if training else 0,
        optimizer_bytes=OPTIMIZER_BYTES * params if training else 0,
        activation_bytes=sum(per_layer.values()), activation_bytes_per_layer=dict(sorted(per_layer.items())),
        kv_cache_bytes=kv)
