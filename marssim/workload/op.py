"""Operators with exact shapes.

An :class:`Op` is a loop nest (its ``loops``: dimension name -> size) plus the shapes of the
activation tensors it reads and writes. Every activation tensor is viewed as a logical 4-D box
``(n, c, h, w)``: batch, feature/channel, rows (image rows or sequence tokens), columns (image
columns; 1 for token tensors). Transformer tensors ``[batch, tokens, hidden]`` are ``(batch,
hidden, tokens, 1)``; attention scores ``[batch, heads, q, k]`` are ``(batch, heads*k, q, 1)``.

Loop dimensions per kind (sizes are exact; FLOPs follow from them):

============  ==============================  =======================================================
kind          loops                           meaning
============  ==============================  =======================================================
``conv``      N K C P Q R S                   batch, out channels, in channels *per group*, out
                                              rows/cols, kernel rows/cols; ``groups`` param
``gemm``      B M N K                         samples, rows per sample (tokens), out and in features
``matmul``    B H M N K                       activation x activation, per sample and head
``pool``      N C P Q R S                     window pooling (``global`` when R, S cover the input)
``eltwise``   N C H W                         element-wise (relu, add, gelu, ...)
``norm``      N C H W                         batch norm (per channel), layer norm or LRN (over C)
``softmax``   N A H L                         batch, heads, query rows, keys (normalised over L)
``embedding`` N H C                           batch, tokens, hidden; table of ``vocab`` rows
``reshape``   N C H W                         memory-only (flatten, transpose, concat, ...)
``input``     N C H W                         a graph input, resident on a host
============  ==============================  =======================================================

Parameters that training and serving graphs add (all optional; see :mod:`marssim.workload.llm`):

================  ==================================================================================
param             meaning
================  ==================================================================================
``phase``         ``fwd``, ``bwd``, ``recompute`` (a forward op re-run in backward) or ``opt``
``layer``         transformer block index (``-1``: before the first block, ``layers``: after the last)
``grad``          ``input`` (a GEMM computing the gradient of its forward op's input: an ordinary
                  GEMM reading the forward weights) or ``weight`` (a GEMM computing the gradient of
                  the forward weights; see below)
``shares``        the op whose weights this op reads (tied embeddings, backward GEMMs): its
                  ``weight_elems`` are traffic, not parameters of the model
``grouped``       a ``gemm`` whose ``B`` indexes independent weight matrices (MoE experts):
                  ``B * K * N`` weights, ``B`` GEMMs of ``M x K`` by ``K x N``
``kv_group``      a ``matmul`` whose second operand has fewer heads (grouped-query attention): each of
                  its heads is shared by ``kv_group`` query heads, so its features are
                  ``ceil(H / kv_group) * K`` (or ``* N``)
``out_group``     a ``matmul`` whose output sums over groups of that many heads (the key/value
                  gradients of grouped-query attention): ``ceil(H / out_group) * N`` features
``a_t``           a ``matmul`` reading its first operand transposed, ``(n, H*M, K, 1)`` (the key and
                  value gradients of attention)
``fused``         a ``matmul`` that is a whole fused attention kernel (FlashAttention-style: the scores
                  never leave the chip): ``fwd`` reads Q ``(n, H*K, M, 1)``, K and V ``(n, kv*K, N, 1)``
                  and writes the context ``(n, H*K, M, 1)``: the two products ``Q K^T`` and ``P V``
                  (``2 x`` the MACs of its loops); ``bwd`` (self-attention, ``M == N``) reads Q, K, V,
                  the context and its gradient and writes the gradients of Q, K and V as one
                  ``(n, (H + 2 kv) * K, M, 1)`` tensor (per key/value head: its query heads', its key's
                  and its value's, Megatron-LM's fused QKV layout): the four gradient products (``4 x``
                  the MACs;
                  the ``Q K^T`` FlashAttention recomputes inside its backward is not counted, as model
                  FLOPs count no recomputation). Loops: ``B`` samples, ``H`` query heads, ``M``
                  queries, ``N`` keys, ``K`` head dimension; the per-row softmax statistics (4 B per
                  query and head) are left out of the bytes
``backend``       the scaled-dot-product attention backend a ``fused`` op models (``flash``,
                  ``efficient``, ``cudnn``): which measured kernels time it
``view``          a ``reshape`` that only re-labels its input (no copy, no new buffer)
``extra_per_elem`` bytes read or written per output element beyond inputs, weights and output
                  (dropout masks, optimizer state write-back)
``resident``      an ``input`` that lives in device memory (a KV cache), not on a host
``in_dtypes``     the element type of each input, in order, where it differs from the op's ``dtype``
                  (which is then its output's): an FP8 GEMM of Transformer Engine reads FP8 inputs and
                  writes bf16 (``in_dtypes=("fp8",)``, ``w_dtype="fp8"``, ``dtype="bf16"``); a cast reads
                  bf16 and writes FP8; attention over an FP8 KV cache reads bf16 queries and FP8 keys
``w_dtype``       the element type of the weights the op reads, where it differs from ``dtype``
``fp8``           the FP8 format a cast writes: ``e4m3`` (forward tensors) or ``e5m2`` (gradients)
================  ==================================================================================

Element types: ``dtype`` is the op's output's and, unless ``in_dtypes`` / ``w_dtype`` say
otherwise, its inputs' and weights'; every byte count (:attr:`Op.input_bytes`,
:attr:`Op.weight_bytes`, :attr:`Op.output_bytes`) takes each operand at its own type.
:attr:`Op.math_dtype`, the type the kernel computes in, is its first input's (a GEMM's ``A``
operand; a GEMM's weights are the same type): cost models take the tensor-core peak and the
calibration rows of that type, so an FP8 GEMM runs at the FP8 peak whatever it writes. ``fp4``
is NVFP4 (Blackwell): 4-bit E2M1 values with one E4M3 scale per block of 16, 4.5 bits or
0.5625 bytes per element (the per-tensor fp32 scale is left out); its byte counts round up to
whole bytes. ``fp8_block`` is E4M3 with one fp32 scale per 128 elements (Transformer Engine's
``Float8BlockScaling``: blocks of 1 x 128 of activations and gradients, of 128 x 128 of weights,
whose scales are taken at the 1 x 128 blocks' 1.03125 bytes per element, an overcount of 3 % of
the weights' FP8 bytes), ``mxfp8`` E4M3 with one E8M0 scale per 32 (OCP MX, Blackwell): both
1.03125 bytes per element.

A weight-gradient GEMM (``grad=weight``) keeps the loops of its forward GEMM -- ``B`` samples
(experts when grouped), ``M`` tokens, ``N`` out and ``K`` in features -- so its MACs equal the
forward's; it reads the forward input ``(B, K, M, 1)`` and the output gradient ``(B, N, M, 1)``
and writes the weight gradient ``(1, N, K, 1)`` (``(B, N, K, 1)`` when grouped). Its GEMM view is
``(1, K, N, B*M)``: the token loops are the contraction.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from enum import Enum
from typing import Any

__all__ = ["OpKind", "Op", "DTYPE_BYTES", "GEMM_LIKE", "dtype_bytes", "tensor_bytes", "Shape", "FUSED_PRODUCTS",
           "products_of"]

Shape = tuple[int, int, int, int]
"""Logical activation box ``(n, c, h, w)``."""

DTYPE_BYTES: dict[str, float] = {"fp32": 4, "tf32": 4, "fp16": 2, "bf16": 2, "fp8": 1, "int8": 1, "int32": 4,
                                  "int64": 8, "fp4": 0.5625, "fp8_block": 1.03125, "mxfp8": 1.03125}
"""Bytes per element of each element type (``fp4``: NVFP4 with its block scales; ``fp8_block``,
``mxfp8``: FP8 with block scales; see the module docstring; every other type a whole number)."""


def dtype_bytes(dtype: str) -> float:
    """Bytes per element of a dtype name (``fp16`` -> 2). KeyError for unknown names."""
    return DTYPE_BYTES[dtype]


def tensor_bytes(elems: int, dtype: str) -> int:
    """Bytes of ``elems`` elements of ``dtype``, rounded up to a whole byte (``fp4``)."""
    b = DTYPE_BYTES[dtype]
    return elems * b if type(b) is int else math.ceil(elems * b)


class OpKind(str, Enum):
    """Kinds of operators; the value is the name used in files and tables."""

    INPUT = "input"
    CONV = "conv"
    GEMM = "gemm"
    MATMUL = "matmul"
    POOL = "pool"
    ELTWISE = "eltwise"
    NORM = "norm"
    SOFTMAX = "softmax"
    EMBEDDING = "embedding"
    RESHAPE = "reshape"

    def __str__(self) -> str:  # so f-strings print "conv", not "OpKind.CONV"
        return self.value


GEMM_LIKE = frozenset({OpKind.CONV, OpKind.GEMM, OpKind.MATMUL})
"""Kinds whose work is multiply-accumulate (counted as MACs)."""

FUSED_PRODUCTS = {"fwd": 2, "bwd": 4}
"""Products of ``M x N`` by the head dimension a fused attention op computes (``fused`` param)."""


def products_of(op: "Op") -> int:
    """How many products of its loop nest a ``matmul`` op computes: 1, or for a fused attention
    op :data:`FUSED_PRODUCTS` of its ``fused`` (2 forward, 4 backward)."""
    fused = op.param("fused")
    return 1 if fused is None else FUSED_PRODUCTS[fused]


# FLOPs per output element of the non-MAC ops, by function name (documented approximations).
ELTWISE_FLOPS = {"relu": 1, "relu6": 2, "add": 1, "mul": 1, "sub": 1, "div": 1, "gelu": 8, "sigmoid": 4,
                 "silu": 5, "tanh": 4, "leaky_relu": 2, "clip": 2, "identity": 0,
                 # training and serving graphs (per output element; documented approximations)
                 "dropout": 2,             # compare a random number, scale
                 "dropout_grad": 1,        # scale by the saved mask
                 "gelu_grad": 12,          # tanh-GeLU derivative times the incoming gradient
                 "swiglu": 6,              # silu(gate) * up
                 "swiglu_gate_grad": 9,    # d/dgate of silu(gate) * up, times the gradient
                 "swiglu_up_grad": 6,      # silu(gate) * gradient
                 "rope": 3,                # x*cos + rotate(x)*sin
                 "rope_grad": 3,
                 "softmax_grad": 4,        # y * (dy - sum(dy * y))
                 "cross_entropy_grad": 2,  # (p - onehot) / tokens
                 "embedding_grad": 1,      # scatter-add of gradient rows
                 "grad_accumulate": 1,     # sum of two gradient contributions
                 "router": 2,              # top-k selection and gate normalisation
                 "sigmoid_gate": 2,        # y * sigmoid(score), the sigmoid once per token
                 "sigmoid_gate_grad": 2,   # dy * sigmoid(score)
                 "sigmoid_gate_score_grad": 3,  # sum over features of dy * z, times (1 - sigmoid(score))
                 "combine": 2,             # gate-weighted sum of the expert outputs
                 "sample": 1,              # next-token choice (argmax) over the logits
                 "adam": 14,               # AdamW update per parameter (moments, bias correction, decay)
                 "quantize": 3,            # low-precision cast: scale, convert with saturation, amax
                 "amax": 2,                # absolute value and running maximum
                 "amax_update": 2}         # per history entry: shift, maximum (scales: per tensor)
REDUCTIONS = frozenset({"amax"})
"""Element-wise functions that reduce their input to one value: the op's loops are its input's
(a shard reads its share), its output stays as built, FLOPs per element read."""
NORM_FLOPS = {"batch": 2, "layer": 8, "lrn": 8, "rms": 4, "layer_grad": 14, "rms_grad": 8}
# inference BN is scale+shift; LN computes mean/var too; RMSNorm only the mean square;
# LRN sums squares over a window of channels, then scales, raises to a power and divides;
# norm gradients recompute the statistics and reduce twice over the features
SOFTMAX_FLOPS = 5  # max, sub, exp, sum, div per element


@dataclass(frozen=True, slots=True)
class Op:
    """One operator of a workload graph.

    Attributes:
        name: unique name in its graph.
        kind: the :class:`OpKind`.
        loops: ``((dim, size), ...)``: the loop nest (see module docstring), exact sizes.
        inputs: names of the producer ops, in operand order.
        in_shapes: ``(n, c, h, w)`` of each input as produced (full tensors, not windows).
        out_shape: ``(n, c, h, w)`` of the output.
        params: kind-specific parameters (``stride``, ``pad``, ``groups``, ``fn``, ``vocab``...).
        weight_elems: number of weight (parameter) elements.
        dtype: element type of the output and, unless ``in_dtypes`` / ``w_dtype`` say otherwise, of
            the inputs and weights (``fp16``, ``bf16``, ``fp32``, ``fp8``, ``int8``, ``fp4``).
        model: the model this op belongs to (multi-model workloads).
    """

    name: str
    kind: OpKind
    loops: tuple[tuple[str, int], ...]
    inputs: tuple[str, ...]
    in_shapes: tuple[Shape, ...]
    out_shape: Shape
    params: tuple[tuple[str, Any], ...] = ()
    weight_elems: int = 0
    dtype: str = "fp16"
    model: str = ""
    _loop_map: dict[str, int] = field(init=False, repr=False, compare=False, hash=False)
    _param_map: dict[str, Any] = field(init=False, repr=False, compare=False, hash=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_loop_map", dict(self.loops))
        object.__setattr__(self, "_param_map", dict(self.params))
        for dim, size in self.loops:
            if not isinstance(size, int) or size < 0:
                raise ValueError(f"op {self.name}: loop {dim} must be a non-negative int, got {size!r}")
        types = self._param_map.get("in_dtypes")
        if types is not None:
            if len(types) != len(self.in_shapes) or any(t not in DTYPE_BYTES for t in types):
                raise ValueError(f"op {self.name}: in_dtypes must name one element type per input "
                                 f"({len(self.in_shapes)}) among {', '.join(DTYPE_BYTES)}, got {types!r}")
        w = self._param_map.get("w_dtype")
        if w is not None and w not in DTYPE_BYTES:
            raise ValueError(f"op {self.name}: unknown w_dtype {w!r}; expected one of {', '.join(DTYPE_BYTES)}")

    # ---------------------------------------------------------------- lookups
    def dim(self, name: str) -> int:
        """Size of loop dimension ``name``."""
        return self._loop_map[name]

    def has_dim(self, name: str) -> bool:
        return name in self._loop_map

    def param(self, name: str, default: Any = None) -> Any:
        return self._param_map.get(name, default)

    @property
    def loop_dict(self) -> dict[str, int]:
        return dict(self._loop_map)

    @property
    def dtype_bytes(self) -> float:
        """Bytes per element of the output."""
        return DTYPE_BYTES[self.dtype]

    @property
    def input_dtypes(self) -> tuple[str, ...]:
        """The element type of each input (``in_dtypes``, else the op's ``dtype``)."""
        types = self._param_map.get("in_dtypes")
        return tuple(types) if types else (self.dtype,) * len(self.in_shapes)

    @property
    def weight_dtype(self) -> str:
        """The element type of the weights the op reads (``w_dtype``, else ``dtype``)."""
        return self._param_map.get("w_dtype") or self.dtype

    @property
    def math_dtype(self) -> str:
        """The element type the kernel computes in: its first input's (an FP8 GEMM's ``fp8``,
        whatever it writes), else the op's ``dtype``."""
        types = self._param_map.get("in_dtypes")
        return types[0] if types else self.dtype

    @property
    def is_gemm_like(self) -> bool:
        return self.kind in GEMM_LIKE

    # ---------------------------------------------------------------- work
    @property
    def macs(self) -> int:
        """Multiply-accumulates (GEMM-like ops only; 0 otherwise)."""
        if self.kind not in GEMM_LIKE:
            return 0
        macs = math.prod(self._loop_map.values())
        return macs * products_of(self) if self.kind == OpKind.MATMUL else macs

    @property
    def flops(self) -> int:
        """Floating-point operations: 2 per MAC for GEMM-like ops, per-element counts otherwise."""
        if self.kind in GEMM_LIKE:
            return 2 * self.macs
        m = self._loop_map
        if self.kind == OpKind.POOL:
            return m["N"] * m["C"] * m["P"] * m["Q"] * m["R"] * m["S"]
        if self.kind == OpKind.ELTWISE:
            fn = self.param("fn", "identity")
            if fn in REDUCTIONS:  # per element read: the loops are the input's
                return math.prod(m.values()) * ELTWISE_FLOPS.get(fn, 1)
            return self.out_elems * ELTWISE_FLOPS.get(fn, 1)
        if self.kind == OpKind.NORM:
            return self.out_elems * NORM_FLOPS.get(self.param("norm", "layer"), 8)
        if self.kind == OpKind.SOFTMAX:
            return self.out_elems * SOFTMAX_FLOPS
        return 0

    @property
    def out_elems(self) -> int:
        return math.prod(self.out_shape)

    @property
    def weight_bytes(self) -> int:
        """Bytes of parameters the op reads (weights, biases, norm scales, embedding tables), at
        :attr:`weight_dtype` (an FP8 GEMM reads its weights' FP8 copy)."""
        return tensor_bytes(self.weight_elems, self.weight_dtype)

    @property
    def input_bytes(self) -> int:
        """Bytes of activation inputs read (full producer tensors; conv/pool windows included),
        each at its element type."""
        if self.kind == OpKind.EMBEDDING:
            return math.prod(self.in_shapes[0]) * 4  # int32 token ids
        types = self._param_map.get("in_dtypes")
        if types:
            return sum(tensor_bytes(math.prod(s), t) for s, t in zip(self.in_shapes, types))
        return tensor_bytes(sum(math.prod(s) for s in self.in_shapes), self.dtype)

    @property
    def output_bytes(self) -> int:
        return tensor_bytes(self.out_elems, self.dtype)

    @property
    def extra_bytes(self) -> int:
        """Bytes moved beyond inputs, weights and output (``extra_per_elem`` x output elements):
        dropout masks, optimizer state written back."""
        per = self._param_map.get("extra_per_elem", 0)
        return int(round(per * self.out_elems)) if per else 0

    @property
    def bytes_moved(self) -> int:
        """Compulsory traffic: inputs + weights + output (+ :attr:`extra_bytes`), in bytes."""
        return self.input_bytes + self.weight_bytes + self.output_bytes + self.extra_bytes

    def gemm_view(self) -> tuple[int, int, int, int]:
        """``(batch, M, N, K)``: the op as ``batch`` independent GEMMs of ``M x K`` times ``K x N``.

        Convolutions use the im2col view (M = N*P*Q, N = K, K = C*R*S); grouped convs give one
        GEMM per group and depthwise convs one per channel (N = 1). Non-GEMM ops return zeros.
        """
        m = self._loop_map
        if self.kind == OpKind.CONV:
            groups = self.param("groups", 1)
            if groups == 1:
                return 1, m["N"] * m["P"] * m["Q"], m["K"], m["C"] * m["R"] * m["S"]
            if self.param("depthwise", False):
                return m["K"], m["N"] * m["P"] * m["Q"], 1, m["C"] * m["R"] * m["S"]
            return groups, m["N"] * m["P"] * m["Q"], m["K"] // groups, m["C"] * m["R"] * m["S"]
        if self.kind == OpKind.GEMM:
            grouped = self.param("grouped", False)
            if self.param("grad") == "weight":
                return (m["B"], m["K"], m["N"], m["M"]) if grouped else (1, m["K"], m["N"], m["B"] * m["M"])
            if grouped:
                return m["B"], m["M"], m["N"], m["K"]
            return 1, m["B"] * m["M"], m["N"], m["K"]
        if self.kind == OpKind.MATMUL:
            return products_of(self) * m["B"] * m["H"], m["M"], m["N"], m["K"]
        return 0, 0, 0, 0

    def with_loops(self, **sizes: int) -> "Op":
        """A shard of this op: the same op with some loop dims reduced (exact, no rounding).

        Shapes follow the loops: e.g. splitting a conv's ``P`` shrinks its output rows and the
        input rows it reads (with the halo of the kernel); splitting ``K`` of a depthwise conv
        also splits its input channels. Used by cost models and lowering to time a shard.
        """
        if not sizes:
            return self
        loops = dict(self._loop_map)
        for dim, size in sizes.items():
            if dim not in loops:
                raise KeyError(f"op {self.name} ({self.kind}) has no loop dimension {dim!r}")
            loops[dim] = int(size)
        return _reshape(self, loops)

    def __str__(self) -> str:
        dims = " ".join(f"{k}={v}" for k, v in self.loops)
        return f"{self.name} [{self.kind}] {dims}"


def _reshape(op: Op, loops: dict[str, int]) -> Op:
    """Recompute tensor shapes and weight counts of ``op`` for new loop sizes."""
    kind = op.kind
    old = op._loop_map
    in_shapes = list(op.in_shapes)
    weight = op.weight_elems
    if kind == OpKind.CONV:
        n, k, c, p, q, r, s = (loops[d] for d in "NKCPQRS")
        groups = op.param("groups", 1)
        stride_h, stride_w = op.param("stride", (1, 1))
        depthwise = op.param("depthwise", False)
        in_c = k if depthwise else c * groups
        dil = op.param("dilation", 1)
        h_in = min(in_shapes[0][2], (p - 1) * stride_h + dil * (r - 1) + 1) if p > 0 else 0
        w_in = min(in_shapes[0][3], (q - 1) * stride_w + dil * (s - 1) + 1) if q > 0 else 0
        in_shapes[0] = (n, in_c, h_in, w_in)
        out = (n, k, p, q)
        bias = k if op.param("bias", False) else 0
        weight = k * c * r * s + bias
    elif kind == OpKind.GEMM:
        b, m, nn, kk = (loops[d] for d in "BMNK")
        grouped = op.param("grouped", False)
        if op.param("grad") == "weight":
            in_shapes[0] = (b, kk, m, 1)
            in_shapes[1] = (b, nn, m, 1)
            out = (b if grouped else 1, nn, kk, 1)
            weight = 0
        else:
            in_shapes[0] = (b, kk, m, 1)
            out = (b, nn, m, 1)
            weight = (b if grouped else 1) * kk * nn + (nn if op.param("bias", False) else 0)
    elif kind == OpKind.MATMUL and op.param("fused") is not None:
        in_shapes, out = fused_attention_shapes(op.param("fused"), *(loops[d] for d in "BHMNK"),
                                                op.param("kv_group", 1), op.name)
    elif kind == OpKind.MATMUL:
        b, h, m, nn, kk = (loops[d] for d in "BHMNK")
        in_shapes[0] = (b, h * m, kk, 1) if op.param("a_t") else (b, h * kk, m, 1)
        kv = kv_heads_of(h, op.param("kv_group", 1))
        in_shapes[1] = (b, kv * kk, nn, 1) if op.param("b_feature", "K") == "K" else (b, kv * nn, kk, 1)
        out = (b, kv_heads_of(h, op.param("out_group", 1)) * nn, m, 1)
    elif kind == OpKind.POOL:
        n, c, p, q, r, s = (loops[d] for d in "NCPQRS")
        stride_h, stride_w = op.param("stride", (1, 1))
        h_in = min(in_shapes[0][2], (p - 1) * stride_h + r) if p > 0 else 0
        w_in = min(in_shapes[0][3], (q - 1) * stride_w + s) if q > 0 else 0
        in_shapes[0] = (n, c, h_in, w_in)
        out = (n, c, p, q)
    elif kind == OpKind.RESHAPE:
        if any(loops[d] != old[d] for d in "CHW"):
            raise ValueError(f"reshape op {op.name} can only be split along N")
        n = loops["N"]
        in_shapes = [(n if sh[0] == old["N"] else sh[0], *sh[1:]) for sh in in_shapes]
        out = (n, *op.out_shape[1:])
    elif kind in (OpKind.ELTWISE, OpKind.NORM, OpKind.INPUT):
        n, c, h, w = (loops[d] for d in "NCHW")
        out = op.out_shape if kind == OpKind.ELTWISE and op.param("fn") in REDUCTIONS else (n, c, h, w)
        in_shapes = [(n, c if sh[1] == old["C"] else sh[1], h if sh[2] == old["H"] else sh[2],
                      w if sh[3] == old["W"] else sh[3]) for sh in in_shapes]
        if kind == OpKind.NORM:
            weight = norm_weight_elems(op.param("norm", "batch"), c)
        elif op.param("fn") == "adam" and weight:  # the master weights and moments of the shard's parameters
            weight = weight * (n * c * h * w) // max(1, old["N"] * old["C"] * old["H"] * old["W"])
    elif kind == OpKind.SOFTMAX:
        n, a, h, l_ = (loops[d] for d in "NAHL")
        out = (n, a * l_, h, 1)
        in_shapes = [out for _ in in_shapes]
    elif kind == OpKind.EMBEDDING:
        n, h, c = (loops[d] for d in "NHC")
        in_shapes[0] = (n, 1, h, 1)
        out = (n, c, h, 1)
        weight = op.param("vocab", 0) * c
    else:  # pragma: no cover - every kind is handled above
        raise ValueError(f"unknown op kind {kind}")
    return replace(op, loops=tuple(loops.items()), in_shapes=tuple(in_shapes), out_shape=out, weight_elems=weight)


def fused_attention_shapes(fused: str, b: int, h: int, m: int, n: int, d: int, kv_group: int = 1,
                           name: str = "") -> tuple[list[Shape], Shape]:
    """``(input shapes, output shape)`` of a fused attention op (``fused`` ``fwd`` or ``bwd``;
    see the module docstring) of ``b`` samples, ``h`` query heads sharing each key/value head
    ``kv_group`` ways, ``m`` queries, ``n`` keys and head dimension ``d``. A backward needs
    ``m == n`` (self-attention): ValueError otherwise."""
    kv = kv_heads_of(h, kv_group)
    q: Shape = (b, h * d, m, 1)
    keys: Shape = (b, kv * d, n, 1)
    if fused == "fwd":
        return [q, keys, keys], q
    if fused != "bwd":
        raise ValueError(f"op {name}: fused must be fwd or bwd, got {fused!r}")
    if m != n:
        raise ValueError(f"op {name}: a fused attention backward needs as many queries as keys, got {m} and {n}")
    return [q, keys, keys, q, q], (b, (h + 2 * kv) * d, m, 1)


def norm_weight_elems(norm: str, channels: int) -> int:
    """Learned elements of a norm over ``channels`` features: scale and shift (batch, layer),
    scale only (rms), none (lrn); a norm gradient reads its forward's."""
    base = norm[:-5] if norm.endswith("_grad") else norm
    if base == "lrn":
        return 0
    return channels if base == "rms" else 2 * channels


def kv_heads_of(heads: int, group: int) -> int:
    """Key/value heads that ``heads`` consecutive query heads read when each key/value head is
    shared by ``group`` query heads (grouped-query attention; ``group`` 1 is multi-head)."""
    return -(-heads // group) if heads else 0
