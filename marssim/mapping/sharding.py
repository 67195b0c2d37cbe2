"""Sharding strategies: which loop dimension of an op is split over the devices of its set, and
which region of each tensor a shard reads and writes.

Strategies (legal per op kind; see :func:`legal_strategies`):

=========  ========================================  ===============================================
name       splits                                    implies
=========  ========================================  ===============================================
``none``   nothing: the op runs on the set's first   a gather/broadcast when neighbours are split
           device
``dp``     the batch (conv/pool/... ``N``, gemm and  nothing between dp layers; weights replicated
           matmul ``B``)
``oc``     output channels / features (conv ``K``,   an all-gather (or re-layout) when the consumer
           gemm ``N``, channel-wise ops ``C``)       needs all features
``ic``     input channels / contraction (conv ``C``, partial sums: reduce-scatter or all-reduce
           gemm ``K``)
``spatial`` image rows (conv/pool ``P``, image-      halo exchange of the kernel's extra rows
           shaped element-wise ops ``H``)
``seq``    tokens (gemm/matmul ``M``, token-shaped   nothing between token-wise ops; keys/values
           ops ``H``)                                gathered for attention
``head``   attention heads (matmul ``H``, softmax    nothing inside attention
           ``A``)
=========  ========================================  ===============================================

A *region* is a box ``((n0, n1), (c0, c1), (h0, h1), (w0, w1))`` of a logical ``(n, c, h, w)``
tensor. Shards of uneven size arise when a dimension does not divide: sizes differ by at most
one and sum exactly to the dimension, so FLOPs are conserved.
"""

from __future__ import annotations

from functools import lru_cache

from marssim.workload import Op, OpKind

__all__ = ["STRATEGIES", "legal_strategies", "split_dim", "split_sizes", "shard_regions", "Box", "full_box",
           "box_elems", "intersect", "BATCH_DIM", "COMMUNICATION"]

STRATEGIES = ("none", "dp", "oc", "ic", "spatial", "seq", "head")

Range = tuple[int, int]
Box = tuple[Range, Range, Range, Range]

COMMUNICATION = {
    "none": "gather to / broadcast from the set's first device when neighbours are split",
    "dp": "none between data-parallel layers (weights replicated)",
    "oc": "all-gather of output features, or a re-layout for the consumer",
    "ic": "partial sums: reduce-scatter or all-reduce",
    "spatial": "halo exchange of the rows a kernel window needs from neighbours",
    "seq": "none between token-wise layers; keys/values gathered for attention",
    "head": "none inside attention; re-layout at its boundaries",
}
"""What each strategy implies for communication (documentation and ``marssim show``)."""

BATCH_DIM = {
    OpKind.INPUT: "N", OpKind.CONV: "N", OpKind.GEMM: "B", OpKind.MATMUL: "B", OpKind.POOL: "N",
    OpKind.ELTWISE: "N", OpKind.NORM: "N", OpKind.SOFTMAX: "N", OpKind.EMBEDDING: "N", OpKind.RESHAPE: "N",
}
"""The loop dimension that indexes samples, per op kind (micro-batching scales it)."""


def _token_shaped(op: Op) -> bool:
    return op.out_shape[3] == 1


_FIXED_RESHAPES = frozenset({"dispatch", "combine", "dispatch_grad", "combine_grad", "gate_grad", "grad_buffer"})
"""Re-layouts whose output is not indexed by the samples of their input (MoE routing, gradient
buffers): they run whole on one device."""


@lru_cache(maxsize=None)
def _strategy_dims(kind: OpKind, depthwise: bool, groups: int, token: bool, norm: str, variant: str = "") -> dict[str, str]:
    if variant == "fixed":
        return {}
    if variant == "a_t":  # a product reading its first operand transposed (attention gradients)
        return {"dp": "B", "head": "H"}
    if variant == "fused_fwd":  # fused attention: queries and heads split, keys never (softmax over them)
        return {"dp": "B", "seq": "M", "head": "H"}
    if variant == "fused_bwd":  # its backward: every query of a head needs every key (no seq split)
        return {"dp": "B", "head": "H"}
    if kind == OpKind.CONV:
        dims = {"dp": "N", "spatial": "P"}
        if groups == 1 or depthwise:
            dims["oc"] = "K"
        if groups == 1:
            dims["ic"] = "C"
        return dims
    if kind == OpKind.GEMM:
        return {"dp": "B", "seq": "M", "oc": "N", "ic": "K"}
    if kind == OpKind.MATMUL:
        return {"dp": "B", "seq": "M", "head": "H"}
    if kind == OpKind.POOL:
        return {"dp": "N", "oc": "C", "spatial": "P"}
    if kind in (OpKind.ELTWISE, OpKind.NORM):
        dims = {"dp": "N", ("seq" if token else "spatial"): "H"}
        if kind == OpKind.ELTWISE or norm == "batch":
            dims["oc"] = "C"
        return dims
    if kind == OpKind.SOFTMAX:
        return {"dp": "N", "head": "A", "seq": "H"}
    if kind == OpKind.EMBEDDING:
        return {"dp": "N", "seq": "H", "oc": "C"}
    if kind == OpKind.RESHAPE:
        return {"dp": "N"}
    return {}


def _variant(op: Op) -> str:
    if op.kind == OpKind.MATMUL and op.param("fused"):
        return f"fused_{op.param('fused')}"
    if op.kind == OpKind.MATMUL and op.param("a_t"):
        return "a_t"
    if op.kind == OpKind.RESHAPE and op.param("what") in _FIXED_RESHAPES:
        return "fixed"
    return ""


def _dims_of(op: Op) -> dict[str, str]:
    return _strategy_dims(op.kind, bool(op.param("depthwise", False)), int(op.param("groups", 1)),
                          _token_shaped(op), str(op.param("norm", "")), _variant(op))


def legal_strategies(op: Op) -> tuple[str, ...]:
    """Strategies legal for ``op``, in the canonical order of :data:`STRATEGIES`."""
    if op.kind == OpKind.INPUT:
        return ()
    dims = _dims_of(op)
    return ("none",) + tuple(s for s in STRATEGIES if s in dims)


def split_dim(op: Op, strategy: str) -> str | None:
    """The loop dimension ``strategy`` splits for ``op`` (None for ``none``). KeyError if illegal."""
    if strategy == "none":
        return None
    dims = _dims_of(op)
    if strategy not in dims:
        raise KeyError(f"sharding {strategy!r} is not legal for {op.name} ({op.kind}); legal: "
                       f"{', '.join(legal_strategies(op))}")
    return dims[strategy]


def split_sizes(total: int, parts: int) -> tuple[int, ...]:
    """Split ``total`` into ``parts`` sizes differing by at most one, larger first; sum is exact."""
    base, extra = divmod(total, parts)
    return tuple(base + (1 if i < extra else 0) for i in range(parts))


def full_box(shape: tuple[int, int, int, int]) -> Box:
    return ((0, shape[0]), (0, shape[1]), (0, shape[2]), (0, shape[3]))


def box_elems(box: Box) -> int:
    n = 1
    for lo, hi in box:
        if hi <= lo:
            return 0
        n *= hi - lo
    return n


def intersect(a: Box, b: Box) -> Box | None:
    """Intersection of two boxes, or None when empty."""
    out = []
    for (alo, ahi), (blo, bhi) in zip(a, b):
        lo, hi = max(alo, blo), min(ahi, bhi)
        if hi <= lo:
            return None
        out.append((lo, hi))
    return tuple(out)  # type: ignore[return-value]


def _with(box: Box, axis: int, rng: Range) -> Box:
    parts = list(box)
    parts[axis] = rng
    return tuple(parts)  # type: ignore[return-value]


def shard_regions(op: Op, dim: str | None, lo: int, hi: int) -> tuple[Box, tuple[Box, ...], bool]:
    """Regions of the shard of ``op`` whose loop ``dim`` runs over ``[lo, hi)``.

    Returns ``(output region, input regions (one per input, in the producers' full tensor
    coordinates), partial)``; ``partial`` is True when the shard produces partial sums of its
    output region (contraction splits). ``dim=None`` is the whole op."""
    out = full_box(op.out_shape)
    ins = [full_box(s) for s in op.in_shapes]
    if dim is None:
        return out, tuple(ins), False
    kind = op.kind
    partial = False
    if kind == OpKind.GEMM and op.param("grad") == "weight":
        # dW (B?, N, K) = X (B, K, M)^T dY (B, N, M): a split of the samples or tokens gives partial sums
        if dim == "B":
            ins = [_with(b, 0, (lo, hi)) for b in ins]
            if op.param("grouped", False):
                out = _with(out, 0, (lo, hi))
            else:
                partial = True
        elif dim == "M":
            ins = [_with(b, 2, (lo, hi)) for b in ins]
            partial = True
        elif dim == "N":
            out = _with(out, 1, (lo, hi))
            ins[1] = _with(ins[1], 1, (lo, hi))
        elif dim == "K":
            out = _with(out, 2, (lo, hi))
            ins[0] = _with(ins[0], 1, (lo, hi))
        return out, tuple(ins), partial
    if dim == BATCH_DIM[kind]:
        out = _with(out, 0, (lo, hi))
        ins = [_with(b, 0, (lo, hi)) for b in ins]
    elif kind == OpKind.CONV:
        if dim == "K":
            out = _with(out, 1, (lo, hi))
            if op.param("depthwise", False):
                ins[0] = _with(ins[0], 1, (lo, hi))
        elif dim == "C":
            partial = True
            ins[0] = _with(ins[0], 1, (lo, hi))
        elif dim == "P":
            out = _with(out, 2, (lo, hi))
            ins[0] = _with(ins[0], 2, _window(op, lo, hi))
    elif kind == OpKind.GEMM:
        if dim == "M":
            out = _with(out, 2, (lo, hi))
            ins[0] = _with(ins[0], 2, (lo, hi))
        elif dim == "N":
            out = _with(out, 1, (lo, hi))
        elif dim == "K":
            partial = True
            ins[0] = _with(ins[0], 1, (lo, hi))
    elif kind == OpKind.MATMUL and op.param("fused"):  # fused attention
        d, g = op.dim("K"), op.param("kv_group", 1)
        if dim == "H":
            heads, groups = (lo * d, hi * d), (lo // g * d, -(-hi // g) * d)
            ins = [_with(b, 1, groups if i in (1, 2) else heads) for i, b in enumerate(ins)]
            if op.param("fused") == "fwd":
                out = _with(out, 1, heads)
            else:  # per key/value head: its query heads' gradients, then its key's and value's
                out = _with(out, 1, (lo // g * (g + 2) * d, -(-hi // g) * (g + 2) * d))
                partial = g > 1 and (lo % g != 0 or hi % g != 0)
        elif dim == "M":
            out = _with(out, 2, (lo, hi))
            ins[0] = _with(ins[0], 2, (lo, hi))
    elif kind == OpKind.MATMUL:
        n_, k_ = op.dim("N"), op.dim("K")
        if dim == "H":
            fb = k_ if op.param("b_feature", "K") == "K" else n_
            fa = op.dim("M") if op.param("a_t") else k_
            g_in, g_out = op.param("kv_group", 1), op.param("out_group", 1)
            out = _with(out, 1, (lo // g_out * n_, -(-hi // g_out) * n_))
            partial = g_out > 1 and (lo % g_out != 0 or hi % g_out != 0)
            ins[0] = _with(ins[0], 1, (lo * fa, hi * fa))
            ins[1] = _with(ins[1], 1, (lo // g_in * fb, -(-hi // g_in) * fb))
        elif dim == "M":
            out = _with(out, 2, (lo, hi))
            ins[0] = _with(ins[0], 2, (lo, hi))
    elif kind == OpKind.POOL:
        if dim == "C":
            out = _with(out, 1, (lo, hi))
            ins[0] = _with(ins[0], 1, (lo, hi))
        elif dim == "P":
            out = _with(out, 2, (lo, hi))
            ins[0] = _with(ins[0], 2, _window(op, lo, hi))
    elif kind in (OpKind.ELTWISE, OpKind.NORM):
        axis = 1 if dim == "C" else 2
        out = _with(out, axis, (lo, hi))
        ins = [_with(b, axis, (lo, hi)) for b in ins]
    elif kind == OpKind.SOFTMAX:
        if dim == "A":
            l_ = op.dim("L")
            out = _with(out, 1, (lo * l_, hi * l_))
        else:
            out = _with(out, 2, (lo, hi))
        ins = [out]
    elif kind == OpKind.EMBEDDING:
        if dim == "H":
            out = _with(out, 2, (lo, hi))
            ins[0] = _with(ins[0], 2, (lo, hi))
        elif dim == "C":
            out = _with(out, 1, (lo, hi))
    return out, tuple(ins), partial


def _window(op: Op, lo: int, hi: int) -> Range:
    """Input rows read by output rows ``[lo, hi)`` of a conv or pool, clipped to the input."""
    stride = op.param("stride", (1, 1))[0]
    pad_top = op.param("pad", (0, 0, 0, 0))[0]
    extent = op.param("dilation", 1) * (op.dim("R") - 1) + 1
    height = op.in_shapes[0][2]
    start = lo * stride - pad_top
    stop = (hi - 1) * stride - pad_top + extent
    return max(0, start), min(height, stop)
