"""Tensor-parallel communication overlapped with its GEMMs (``tp_comm_overlap``), as Transformer
Engine's userbuffers run it under Megatron-LM's ``--tp-comm-overlap`` (sequence parallelism
required), with the defaults of ``transformer_engine.pytorch.module.base.initialize_ub``:

=====================  ===========================================================================
``ring_exchange``      the all-gather before a column-parallel GEMM (``qkv_fprop``, ``fc1_fprop``)
                       and before a row-parallel layer's input-gradient GEMM (``proj_dgrad``,
                       ``fc2_dgrad``): the GEMM runs in ``tp`` chunks of the tokens, chunk 0 on the
                       rank's own tokens while they go on to the next rank, chunk ``j`` on the
                       tokens that arrived at step ``j`` (copy-engine transfers: no SMs taken)
``pipeline``           the reduce-scatter after a row-parallel GEMM (``proj_fprop``, ``fc2_fprop``):
                       the GEMM in :data:`PIPELINE_SPLITS` chunks of the tokens, each chunk's
                       partial sums reduce-scattered over the group while the next chunk computes,
                       one after another on one communication stream; the GEMM runs on all but
                       :data:`PIPELINE_SMS` of the GPU's SMs (``set_sm_margin``), the reduction
                       kernels on those
``bulk``               the all-gather of a column-parallel layer's input for its weight-gradient
                       GEMM beside the input-gradient GEMM, and the reduce-scatter of the input
                       gradient beside the weight-gradient GEMM (``qkv_dgrad``, ``qkv_wgrad``,
                       ``fc1_dgrad``, ``fc1_wgrad``): the lowering already runs these beside the GEMM
                       that does not read them, with or without the setting
=====================  ===========================================================================

The GEMMs are the blocks' Transformer Engine layers (:data:`OVERLAP_GEMMS`; a gated MLP's gate and
up projections are one GEMM, ``mlp.fc1``, as Megatron-LM's ``linear_fc1``). Chunks are timed by the
cost model at their own shape (a smaller GEMM may run less efficiently), so overlap is not free.

Closed forms for ``n`` chunks of ``g`` seconds each and transfers of ``c`` seconds per step,
nothing contending: the ring exchange ends at ``max(n g, (n - 1) c + g)``
(:func:`ring_exchange_end`); the pipeline, with reduce-scatters of ``r`` seconds, at
``max_k ((k + 1) g + (n - k) r)`` (:func:`pipeline_end`).

Memory: every userbuffer is ``(tokens of a micro-batch on a rank's sequence, hidden)`` (Megatron-LM
allocates them for ``seq x micro_batch / cp`` tokens), one per overlapped GEMM of a block: six
all-gather buffers (FP8 under an FP8 recipe) and four reduce-scatter buffers (bf16)
(:func:`buffer_bytes`).

Units: seconds, bytes.
"""

from __future__ import annotations

import math

from marssim.workload import Op, OpKind

from .partition import shard_loops
from .patterns import TP_RING

__all__ = ["OVERLAP_GEMMS", "PIPELINE_SPLITS", "PIPELINE_SMS", "AG_BUFFERS", "RS_BUFFERS", "te_gemm",
           "gathers_input", "scatters_output", "ring_exchange_end", "pipeline_end", "sm_margin", "buffer_bytes",
           "chunk_timing", "pipelined"]

OVERLAP_GEMMS = ("attn.qkv", "attn.proj", "mlp.fc1", "mlp.fc2", "mlp.down")
"""The blocks' GEMMs that run through Transformer Engine's linear layers (name suffixes)."""
PIPELINE_SPLITS = 4
"""Chunks of a ``pipeline`` overlap (``num_splits`` of ``initialize_ub``'s defaults)."""
PIPELINE_SMS = 16
"""SMs a ``pipeline`` overlap's reduction kernels take from the GEMM (``num_sm``, ``set_sm_margin``)."""
AG_BUFFERS = 6
"""Userbuffers of all-gathers: ``qkv_fprop``, ``qkv_dgrad``, ``proj_dgrad``, ``fc1_fprop``,
``fc1_dgrad``, ``fc2_dgrad`` (FP8 under an FP8 recipe)."""
RS_BUFFERS = 4
"""Userbuffers of reduce-scatters: ``proj_fprop``, ``fc2_fprop``, ``qkv_wgrad``, ``fc1_wgrad``."""


def te_gemm(op: Op) -> bool:
    """True for a (non-expert) GEMM of a block that Transformer Engine runs."""
    if op.kind != OpKind.GEMM or op.param("grouped"):
        return False
    parts = op.name.split(".")
    while parts and parts[-1] in ("dgrad", "wgrad", "recompute"):
        parts.pop()
    base = ".".join(parts)
    return any(base.endswith("." + suffix) for suffix in OVERLAP_GEMMS)


def gathers_input(op: Op, rule) -> bool:
    """A column-parallel forward GEMM or a row-parallel layer's input-gradient GEMM: it reads its
    one input whole (``R``), which sequence parallelism all-gathers (``ring_exchange``)."""
    return te_gemm(op) and op.param("grad") in (None, "input") and rule.want == ("R",) and len(op.inputs) == 1


def scatters_output(op: Op, rule) -> bool:
    """A row-parallel forward GEMM: partial sums reduce-scattered after it (``pipeline``)."""
    return te_gemm(op) and op.param("grad") is None and rule.out == "P"


def ring_exchange_end(chunk: float, step: float, n: int) -> float:
    """Seconds of a ring-exchange all-gather + GEMM of ``n`` chunks of ``chunk`` seconds, each
    transfer step ``step`` seconds, nothing contending: chunk ``j`` starts when chunk ``j - 1``
    ends and step ``j`` has brought its tokens (at ``j * step``)."""
    return max(n * chunk, (n - 1) * step + chunk)


def pipeline_end(chunk: float, scatter: float, n: int) -> float:
    """Seconds of a GEMM + pipelined reduce-scatter of ``n`` chunks of ``chunk`` seconds, each
    chunk's reduce-scatter ``scatter`` seconds after the chunk and after the reduce-scatter before
    it: ``max_k ((k + 1) chunk + (n - k) scatter)``."""
    return max((k + 1) * chunk + (n - k) * scatter for k in range(n))


def sm_margin(design) -> float:
    """The factor a ``pipeline`` overlap's GEMM is slowed by: its SMs over those it keeps
    (``sms / (sms - 16)``; 1 where the design does not say its SMs)."""
    sms = getattr(getattr(design, "gpu", None), "sms", 0) or 0
    return sms / (sms - PIPELINE_SMS) if sms > PIPELINE_SMS else 1.0


def buffer_bytes(t, cfg) -> float:
    """Bytes of the userbuffers one GPU allocates (see the module docstring): ``t`` the
    :class:`~marssim.workload.llm.TransformerConfig` of the micro-batch on one context-parallel
    rank (its ``seq`` already divided by ``cp``)."""
    from marssim.workload.op import DTYPE_BYTES

    if not cfg.tp_comm_overlap:
        return 0.0
    tokens = t.batch * t.seq
    gather = DTYPE_BYTES[t.low_dtype or t.dtype]
    return float(tokens * t.hidden * (AG_BUFFERS * gather + RS_BUFFERS * DTYPE_BYTES[t.dtype]))


def chunk_timing(low, gpu: int, op: Op, parts: int) -> tuple[float, float, float, float]:
    """``(seconds, FLOPs, joules, output bytes)`` of ``1/parts`` of ``op``'s tokens on ``gpu``
    (the op's tensor-parallel split kept; ``low``: a :class:`.runmodel.RunModel`), memoised with the
    lowering's shards."""
    design = low.design(gpu)
    rule = low.rules[op.name]
    key = ("userbuffers", low.shape_key(op), design.name, rule.split, parts)
    hit = low.shard_cache.get(key)
    if hit is not None:
        low.cost_models.setdefault(op.name, hit[1])
        return hit[0]
    sizes = shard_loops(op, rule, low.rank_params, 1)
    sizes["M"] = max(1, math.ceil(op.dim("M") / parts))
    part = op.with_loops(**sizes)
    c = low.cost.op_cost(part, design)
    low.cost_models.setdefault(op.name, c.model)
    timing = (float(c.time), float(part.flops), float(c.energy), float(part.output_bytes))
    low.shard_cache.put(key, (timing, c.model))
    return timing


def pipelined(b, op: Op, rule) -> tuple | None:
    """Add ``op`` with its overlapped communication to the unit builder ``b`` (a
    :class:`.builder.UnitBuilder`) when the setting applies to it; the refs after which its output is
    ready (None: lower it as usual)."""
    low = b.low
    tp = low.tp_here(b.rep)
    if tp <= 1:
        return None
    if gathers_input(op, rule):
        name = op.inputs[0]
        if low.graph.ops[low.op_index[name]].kind == OpKind.INPUT or (name, "R") in b.t.converted:
            return None
        have, refs = b.locate(name)
        if have != "S":
            return None
        return _ring_exchange(b, op, name, refs, tp)
    if scatters_output(op, rule):
        return _pipeline(b, op, rule, tp)
    return None


def _ring_exchange(b, op: Op, name: str, refs: tuple, tp: int) -> tuple:
    low = b.low
    # the copies start with the GEMM: after the kernel before it on this GPU's stream
    refs = tuple(refs) + ((b.me(b.t.last_compute),) if b.t.last_compute >= 0 else ())
    deps = refs + b.param_deps(op)
    timing = chunk_timing(low, b.rep, op, tp)
    chunk = low.layout_bytes(name, "S")
    peer = low.place.patterns()[TP_RING]
    nxt = peer(b.rep)
    prv = next(g for g in b.group(TP_RING) if peer(g) == b.rep)
    prv_rep = low.fold.rep(prv)
    coll = b.collective("all_gather", "tp", TP_RING, chunk * tp, name, tp - 1, "ring_exchange")

    def theirs(rel: int) -> tuple:
        return b.peer_ref(prv_rep, rel)

    compute = b.compute(op, deps, timing=timing)
    arrived = []
    send = -1
    for j in range(1, tp):
        send = b.flow(b.rep, nxt, chunk, name, coll, refs if j == 1 else (theirs(send),), hold=False,
                      pattern=TP_RING)
        arrived.append(theirs(send))
        compute = b.compute(op, (theirs(send),), timing=timing)
    b.t.converted[(name, "R")] = tuple(dict.fromkeys(tuple(refs) + tuple(arrived)))
    return (b.me(compute),)


def _pipeline(b, op: Op, rule, tp: int) -> tuple:
    low = b.low
    deps: list = []
    for name, want in zip(op.inputs, rule.want):
        deps.extend(b.tensor(name, want, op.name))
    deps.extend(b.param_deps(op))
    seconds, flops, energy, out = chunk_timing(low, b.rep, op, PIPELINE_SPLITS)
    timing = (seconds * sm_margin(low.design(b.rep)), flops, energy, out)
    full = low.layout_bytes(op.name, "R")
    ready: tuple = ()
    computes = []
    for k in range(PIPELINE_SPLITS):
        rel = b.compute(op, tuple(deps) if k == 0 else (), timing=timing)
        computes.append(b.me(rel))
        # one communication stream: each chunk's reduce-scatter after the one before it
        ready = b.ring("reduce_scatter", "tp", TP_RING, full / PIPELINE_SPLITS, tp, op.name, (b.me(rel),) + ready)
    b.t.converted[(op.name, "S")] = tuple(dict.fromkeys(ready))
    return (computes[-1],)
