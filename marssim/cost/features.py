"""What the cost models read from an op and from a design, as flat tuples of numbers.

Every cost formula in this package reads an op through its *feature tuple* (plain ints, indexed
by the ``F_*`` constants below) and a design through a :class:`DesignParams`. The same formula
code then runs on one op (Python ints and floats: the scalar path) or on many ops at once (one
numpy column per feature: the vectorised path), and both give bit-identical results because
they perform the same IEEE operations in the same order.

GEMM-like ops (conv, gemm, matmul) are described by a *conv view* ``G, n, k, c, p, q, r, s``:
``G`` independent groups, each a convolution of ``n`` samples, ``k`` output and ``c`` input
channels, ``p x q`` outputs and an ``r x s`` kernel. Its GEMM view (im2col) is ``M = n*p*q``,
``N = k``, ``K = c*r*s``, matching :meth:`marssim.workload.Op.gemm_view`:

=========  ====================================  ======================================
kind       conv view                             GEMM view (batch, M, N, K)
=========  ====================================  ======================================
conv       groups (K for depthwise), N, K/G, C,  (G, N*P*Q, K/G, C*R*S)
           P, Q, R, S
gemm       1, B, N, K, M, 1, 1, 1                (1, B*M, N, K)
matmul     B*H, 1, N, K, M, 1, 1, 1              (B*H, M, N, K)
=========  ====================================  ======================================

Element types: ``F_DTYPE`` is the op's :attr:`~marssim.workload.Op.math_dtype` (its first input's:
an FP8 GEMM writing bf16 is an ``fp8`` kernel, timed at the FP8 peak by the FP8 rows of a table)
and ``F_AB/F_BB/F_OB`` take each operand at its own type.

Traffic: ``F_TRAFFIC`` is the op's compulsory off-chip traffic in bytes, ``op.bytes_moved``
(inputs + weights + output + extra bytes such as dropout masks), except for embeddings, which
read only the gathered rows of their table: ids + 2 x output bytes (rows read, output written).
Training graphs add two GEMM views: a weight-gradient GEMM (``grad=weight``) is ``K x N`` by a
contraction over its ``B*M`` tokens, and a grouped GEMM (MoE experts) is ``B`` GEMMs of
``M x N x K`` with their own weights. A fused attention op (a ``matmul`` with ``fused``, see
:mod:`marssim.workload.op`) is ``products x B*H`` GEMMs of ``M x N x K``: its two forward products
(``Q K^T``, ``P V``) or four backward ones, each ``M x N`` by the head dimension ``K``. Views
(``view``) and graph inputs cost nothing.

Two features name the kernel beyond its shape, for the measured lookups of calibration tables:
``F_PHASE`` (:func:`kernel_phase`: ``fwd``, ``dgrad``, ``wgrad``, ``bwd``, ``update``, an index
into :data:`KERNEL_PHASES`) and ``F_BACKEND`` (:func:`kernel_backend`: the scaled-dot-product
attention backend a fused attention op names, an index into :data:`KERNEL_BACKENDS`; 0 for
every other op). No cost formula reads them.
"""

from __future__ import annotations

import math
from enum import IntEnum

from marssim.system import Design
from marssim.system.buffers import DEFAULT_BUFFERS, buffer_sizes, operand_windows
from marssim.workload import Op, OpKind
from marssim.workload.op import DTYPE_BYTES, GEMM_LIKE, kv_heads_of, products_of, tensor_bytes

from .convgeom import conv_geometry

__all__ = [
    "op_features", "design_key", "DesignParams", "DTYPES", "KIND_CODES", "Dataflow", "DATAFLOW_CODES", "N_FEATURES",
    "CLASS_NONE", "CLASS_GEMM", "CLASS_STREAM", "KERNEL_KINDS", "KERNEL_KIND_OF", "conv_geometry_key",
    "KERNEL_PHASES", "KERNEL_BACKENDS", "kernel_phase", "kernel_backend", "attention_geometry_key",
    "SDPA_BACKENDS", "lookup_backend", "attention_geometry",
]

DTYPES: tuple[str, ...] = tuple(DTYPE_BYTES)
"""Data type names in code order (the ``F_DTYPE`` feature indexes this)."""
_DTYPE_CODE = {name: i for i, name in enumerate(DTYPES)}

KIND_CODES: dict[OpKind, int] = {kind: i for i, kind in enumerate(OpKind)}

KERNEL_KINDS: tuple[str, ...] = (
    "gemm", "conv", "attention", "elementwise", "norm", "softmax", "pool", "embedding", "reshape",
)
"""GPU kernel kinds (the ``kind`` column of calibration tables). The first three are GEMM-class."""
N_GEMM_KERNELS = 3

KERNEL_KIND_OF: dict[OpKind, int] = {
    OpKind.GEMM: 0, OpKind.CONV: 1, OpKind.MATMUL: 2, OpKind.ELTWISE: 3, OpKind.NORM: 4,
    OpKind.SOFTMAX: 5, OpKind.POOL: 6, OpKind.EMBEDDING: 7, OpKind.RESHAPE: 8, OpKind.INPUT: 8,
}
"""Op kind -> index into :data:`KERNEL_KINDS` (``matmul`` ops are the attention products)."""

KERNEL_PHASES: tuple[str, ...] = ("fwd", "dgrad", "wgrad", "bwd", "update")
"""What a kernel computes in a training step (the ``phase`` column of calibration tables):
``fwd`` a forward kernel (also a recomputed one, and every kernel of inference), ``dgrad`` the
gradient of an input, ``wgrad`` the gradient of the weights (a contraction over the tokens),
``bwd`` a backward kernel of any other op (a fused attention backward computing every gradient,
norm and activation gradients), ``update`` an optimizer step."""

KERNEL_BACKENDS: tuple[str, ...] = ("", "flash", "efficient", "cudnn", "math")
"""Backends of ``torch.nn.functional.scaled_dot_product_attention`` that name different kernels
of one fused attention shape (``""``: no fused attention backend, every other op)."""
SDPA_BACKENDS = KERNEL_BACKENDS[1:]
"""Backends of scaled-dot-product attention: on ``attention`` rows, part of the shape looked up."""

class Dataflow(IntEnum):
    """A design's dataflow as the cost formulas branch on it: systolic output-, weight- and
    input-stationary (:mod:`.systolic`), Eyeriss row-stationary, NVDLA-like and ShiDianNao-like
    (:mod:`.loopmap`), GPU-class (:mod:`.gpu`); the values are the order of
    :data:`marssim.system.design.DATAFLOWS`."""

    OS = 0
    WS = 1
    IS = 2
    RS = 3
    NVDLA = 4
    SHIDIANNAO = 5
    GPU = 6

    @property
    def systolic(self) -> bool:
        """Whether a PE array's systolic formulas time it (os, ws, is)."""
        return self <= Dataflow.IS


DATAFLOW_CODES: dict[str, Dataflow] = {d.name.lower(): d for d in Dataflow}
"""A design's ``dataflow`` name -> its :class:`Dataflow`."""

# op classes: what kind of formula times the op
CLASS_NONE = 0    # graph inputs: no cost
CLASS_GEMM = 1    # GEMM-like with at least one MAC: PE-array / tensor-core formulas
CLASS_STREAM = 2  # everything else: bandwidth-bound streaming formulas

# feature indices
(F_CLASS, F_KIND, F_KERNEL, F_DTYPE, F_EB, F_G, F_N, F_K, F_C, F_P, F_Q, F_R, F_S, F_M, F_NN, F_KK,
 F_MACS, F_FLOPS, F_AE, F_BE, F_OE, F_AB, F_BB, F_OB, F_TRAFFIC, F_CONV, F_SX, F_SY, F_ST,
 F_SH, F_SW, F_PH, F_PW, F_DIL, F_PHASE, F_BACKEND) = range(36)
N_FEATURES = 36
"""Length of a feature tuple. ``F_AE/F_BE/F_OE``: elements of the A operand (first input),
B operand (weights, or the second input of a matmul) and output; ``F_AB/F_BB/F_OB``: the same in
bytes. ``F_SX, F_SY, F_ST``: the output plane an output-pixel-parallel array spreads over its
rows and columns, and the loop count per output (ShiDianNao-like; conv: P, Q, N*K*C*R*S per
group; gemm/matmul: M, N, K). ``F_SH, F_SW, F_PH, F_PW, F_DIL``: convolutions only (0
otherwise), the rest of the kernel's geometry (:func:`marssim.cost.convgeom.conv_geometry`:
strides, the padding the kernel applies, dilation), which with ``G, N, K, C, P, Q, R, S``
above names the convolution kernel (:func:`conv_geometry_key`); on a fused attention op the
first three hold its query heads, key/value heads and key/value element bits
(:func:`attention_geometry_key`), which its measured lookups match. ``F_PHASE``, ``F_BACKEND``: the
kernel's phase and fused attention backend (indices into :data:`KERNEL_PHASES`,
:data:`KERNEL_BACKENDS`)."""


def kernel_phase(op: Op) -> str:
    """The :data:`KERNEL_PHASES` entry of ``op``'s kernel: a GEMM's ``grad`` (``input`` ->
    ``dgrad``, ``weight`` -> ``wgrad``); a fused attention op's ``fused`` (``bwd``); the
    backward attention products (``matmul`` ops of phase ``bwd``): ``wgrad`` for the one reading
    its first operand transposed (``a_t``: the key and value gradients, a contraction over the
    query tokens as a weight gradient is), ``dgrad`` for the other; ``update`` for the AdamW
    step (``fn=adam``); ``bwd`` for any other op of phase ``bwd``; ``fwd`` otherwise
    (forward and recomputed ops, every op of an inference graph)."""
    return KERNEL_PHASES[_kernel_codes(op)[0]]


def kernel_backend(op: Op) -> str:
    """The fused attention backend ``op`` names (``flash``, ``efficient``, ...; a fused
    attention op's ``backend``), ``""`` for every other op. ValueError for an unknown one."""
    return KERNEL_BACKENDS[_kernel_codes(op)[1]]


_PHASE_CODE = {name: i for i, name in enumerate(KERNEL_PHASES)}
_BACKEND_CODE = {name: i for i, name in enumerate(KERNEL_BACKENDS)}


_DGRAD, _WGRAD, _BWD, _UPDATE = (_PHASE_CODE[p] for p in ("dgrad", "wgrad", "bwd", "update"))


def _kernel_codes(op: Op) -> tuple[int, int]:
    """``(phase code, backend code)`` of ``op`` (see :func:`kernel_phase`, :func:`kernel_backend`),
    in one pass: this runs for every op the cost model interns."""
    param = op.param
    kind = op.kind
    if kind == OpKind.GEMM:
        grad = param("grad")
        return (0 if grad is None else _DGRAD if grad == "input" else _WGRAD), 0
    if kind == OpKind.MATMUL:
        fused = param("fused")
        if fused is not None:
            backend = str(param("backend", ""))
            code = _BACKEND_CODE.get(backend)
            if code is None:
                raise ValueError(f"op {op.name}: unknown fused attention backend {backend!r}; expected one of "
                                 f"{', '.join(KERNEL_BACKENDS[1:])}")
            return (_BWD if fused == "bwd" else 0), code
        if param("phase") == "bwd":
            return (_WGRAD if param("a_t") else _DGRAD), 0
        return 0, 0
    if kind == OpKind.ELTWISE and param("fn") == "adam":
        return _UPDATE, 0
    return (_BWD if param("phase") == "bwd" else 0), 0


def op_features(op: Op) -> tuple[int, ...]:
    """The feature tuple of ``op`` (see module docstring); pure, a few microseconds."""
    kind = op.kind
    math_dtype = op.math_dtype
    eb = math.ceil(DTYPE_BYTES[math_dtype])
    code = KIND_CODES[kind]
    dt = _DTYPE_CODE[math_dtype]
    kernel = KERNEL_KIND_OF[kind]
    if kind in GEMM_LIKE:
        lm = op.dim
        if kind == OpKind.CONV:
            groups = op.param("groups", 1)
            g = lm("K") if op.param("depthwise", False) else groups
            n, k, c, p, q, r, s = lm("N"), lm("K") // g, lm("C"), lm("P"), lm("Q"), lm("R"), lm("S")
            conv = 1
        elif kind == OpKind.GEMM:
            grouped = op.param("grouped", False)
            if op.param("grad") == "weight":  # dW = X^T dY: rows K, columns N, contraction over the tokens
                g, n, k, c, p = (lm("B"), 1, lm("N"), lm("M"), lm("K")) if grouped else \
                    (1, 1, lm("N"), lm("B") * lm("M"), lm("K"))
            elif grouped:  # one GEMM per expert
                g, n, k, c, p = lm("B"), 1, lm("N"), lm("K"), lm("M")
            else:
                g, n, k, c, p = 1, lm("B"), lm("N"), lm("K"), lm("M")
            q, r, s = 1, 1, 1
            conv = 0
        else:  # attention products; a fused attention op: its products, each M x N by the head dim K
            g, n, k, c, p, q, r, s = products_of(op) * lm("B") * lm("H"), 1, lm("N"), lm("K"), lm("M"), 1, 1, 1
            conv = 0
        m_, nn, kk = n * p * q, k, c * r * s
        macs = g * m_ * nn * kk
        ae = math.prod(op.in_shapes[0]) if op.in_shapes else 0
        # the B operand: the weights, or the second input of an activation x activation product
        be = math.prod(op.in_shapes[1]) if len(op.in_shapes) > 1 else op.weight_elems
        oe = math.prod(op.out_shape)
        if conv:
            sx, sy, st = p, q, n * k * c * r * s
            geo = conv_geometry(op)
            tail = (geo.stride_h, geo.stride_w, geo.pad_h, geo.pad_w, geo.dilation)
        else:
            sx, sy, st = m_, nn, kk
            fused = kind == OpKind.MATMUL and op.param("fused") is not None
            tail = _attention_tail(op) if fused else _NO_GEOMETRY
        traffic = op.bytes_moved
        cls = CLASS_GEMM if macs > 0 else CLASS_STREAM
        if op.param("in_dtypes") or op.param("w_dtype"):  # operands of their own types (an FP8 GEMM)
            types = op.input_dtypes
            ab = tensor_bytes(ae, types[0]) if types else 0
            bb = tensor_bytes(be, types[1] if len(types) > 1 else op.weight_dtype)
            ob = tensor_bytes(oe, op.dtype)
        else:
            ab, bb, ob = ae * eb, be * eb, oe * eb
        return (cls, code, kernel, dt, eb, g, n, k, c, p, q, r, s, m_, nn, kk, macs, op.flops,
                ae, be, oe, ab, bb, ob, traffic, conv, sx, sy, st, *tail, *_kernel_codes(op))
    if kind == OpKind.INPUT or op.param("view", False):  # graph inputs and views cost nothing
        cls, traffic = CLASS_NONE, 0
    elif kind == OpKind.EMBEDDING:
        cls, traffic = CLASS_STREAM, op.input_bytes + 2 * op.output_bytes
    else:
        cls, traffic = CLASS_STREAM, op.bytes_moved
    oe = math.prod(op.out_shape)
    phase = _kernel_codes(op)[0] if cls != CLASS_NONE else 0
    return (cls, code, kernel, dt, eb, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, op.flops,
            0, 0, oe, 0, 0, tensor_bytes(oe, op.dtype), traffic, 0, 0, 0, 0, *_NO_GEOMETRY, phase, 0)


_NO_GEOMETRY = (0, 0, 0, 0, 0)


def _attention_tail(op: Op) -> tuple[int, int, int, int, int]:
    """The geometry slots of a fused attention op: query heads, key/value heads and the bits of
    a key/value element (its second input's type), then two zeros."""
    heads = op.dim("H")
    kv = kv_heads_of(heads, int(op.param("kv_group", 1) or 1))
    types = op.input_dtypes if op.param("in_dtypes") else ()
    kv_dtype = types[1] if len(types) > 1 else op.math_dtype
    return (heads, kv, int(round(8 * DTYPE_BYTES[kv_dtype])), 0, 0)


def attention_geometry_key(x: tuple[int, ...]) -> tuple[int, ...]:
    """``(heads, kv_heads, kv_bits)`` of the fused attention op with feature tuple ``x`` (see
    :func:`attention_geometry`), ``()`` for any other op."""
    if x[F_CONV] or not x[F_BACKEND] or x[F_CLASS] != CLASS_GEMM:
        return ()
    return (x[F_SH], x[F_SW], x[F_PH])


def lookup_backend(kind: str, backend: str) -> str:
    """The backend a row or kernel is looked up by: a scaled-dot-product attention backend
    (:data:`SDPA_BACKENDS`) on an ``attention`` row; ``""`` otherwise (other backend names, such as
    a Triton code path or the AdamW implementation, are provenance)."""
    return backend if kind == "attention" and backend in SDPA_BACKENDS else ""


def attention_geometry(kind: str, backend: str, note: str, dtype: str) -> tuple[int, ...]:
    """The heads of a fused attention row, part of the shape it is looked up by: ``(heads,
    kv_heads, kv_bits)`` from its note's ``heads`` and ``kv_heads`` (query and key/value heads)
    and ``kv_dtype`` (the cache's element type; absent: the row's ``dtype``), bits per key/value
    element; ``()`` for any other row or a note without them (such a row matches a fused
    attention op of its shape whatever its heads, as rows always did)."""
    if kind != "attention" or not lookup_backend(kind, backend) or "kv_heads" not in note:
        return ()
    fields = {}
    for part in note.split(";"):
        key, sep, value = part.partition("=")
        if sep:
            fields[key.strip()] = value.strip()
    try:
        heads, kv_heads = int(fields["heads"]), int(fields["kv_heads"])
    except (KeyError, ValueError):
        return ()
    width = DTYPE_BYTES.get(fields.get("kv_dtype") or dtype)
    if heads < 1 or kv_heads < 1 or width is None:
        return ()
    return (heads, kv_heads, int(round(8 * width)))


def conv_geometry_key(x: tuple[int, ...]) -> tuple[int, ...]:
    """The :attr:`~marssim.cost.convgeom.ConvGeometry.match_key` of the convolution with
    feature tuple ``x`` (``c, k, r, s, stride_h, stride_w, pad_h, pad_w, dilation, groups, P,
    Q``), or ``()`` for any other op."""
    if not x[F_CONV]:
        return ()
    g = x[F_G]
    return (x[F_C] * g, x[F_K] * g, x[F_R], x[F_S], x[F_SH], x[F_SW], x[F_PH], x[F_PW], x[F_DIL], g, x[F_P], x[F_Q])


# ----------------------------------------------------------------------------- designs
def design_key(design: Design) -> tuple:
    """A hashable tuple of every design field a cost formula reads (pydantic designs with a
    ``peak_flops`` dict are not hashable themselves)."""
    e = design.energy
    energy = None if e is None else (e.mac, *e.per_byte, e.static_power)
    g = design.gpu
    gpu = None if g is None else (g.sms, tuple(sorted(g.peak_flops.items())), g.l2, g.tile_m, g.tile_n,
                                  g.launch_overhead, g.calibration, g.stack, g.attention_kernels)
    b = design.buffers
    buffers = None if b is None else (b.sizes, b.split if isinstance(b.split, str) else tuple(sorted(b.split.items())),
                                      b.double_buffered, b.dram_latency, b.channels, b.convention)
    return (design.dataflow, design.pe_rows, design.pe_cols, design.clock, design.sram, design.sram_bandwidth,
            design.dram_bandwidth, energy, gpu, buffers)


class DesignParams:
    """The numbers of one design the formulas read (floats; ``dram_bw`` is ``inf`` when the
    design has no off-chip bandwidth set, i.e. unbounded). ``gpu`` holds the per-kernel-kind
    parameter tables of GPU-class designs (see :mod:`marssim.cost.gpu`).

    Buffers (:mod:`marssim.system.buffers`): ``wi``, ``wf``, ``wo`` the windows of ifmap, filter
    and ofmap (what the array works from while the next is fetched), ``ri``, ``rf``, ``ro`` the
    largest operand that stays resident once read, ``ci``, ``cf``, ``co`` the buffer sizes,
    ``double_buffered``, ``dram_latency`` (s),
    ``per_operand`` (a DRAM channel per buffer), and the ``scalesim`` convention's three rules:
    ``im2col`` (the ifmap moves as its im2col matrix), ``write_through`` (partial sums written
    every fold, never read back), ``fixed_order`` (no alternative loop order). ``energy``:
    ``(mac, sram read, sram write, dram read, dram write per byte, static power)``."""

    __slots__ = ("name", "dataflow", "code", "rows", "cols", "clock", "sram", "sram_bw", "dram_bw", "energy",
                 "peak_macs", "gpu", "gpu_np", "models", "wi", "wf", "wo", "ri", "rf", "ci", "cf", "double_buffered", "dram_latency",
                 "per_operand", "im2col", "write_through", "fixed_order")

    def __init__(self, design: Design) -> None:
        self.name = design.name
        self.dataflow = design.dataflow
        self.code = DATAFLOW_CODES[design.dataflow]
        self.rows = int(design.pe_rows)
        self.cols = int(design.pe_cols)
        self.clock = float(design.clock or 0.0)  # gpu designs may omit it; no gpu formula reads it
        self.sram = float(design.sram)
        self.sram_bw = math.inf if design.sram_bandwidth is None else float(design.sram_bandwidth)
        self.dram_bw = math.inf if design.dram_bandwidth is None else float(design.dram_bandwidth)
        e = design.energy
        self.energy = None if e is None else (float(e.mac), *e.per_byte, float(e.static_power))
        b = design.buffers or DEFAULT_BUFFERS
        (self.wi, self.wf, self.wo), (self.ri, self.rf, _) = operand_windows(self.sram, b)
        self.ci, self.cf, _ = buffer_sizes(self.sram, b)
        self.double_buffered = bool(b.double_buffered)
        self.dram_latency = float(b.dram_latency)
        self.per_operand = b.channels == "per_operand"
        scalesim = b.convention == "scalesim"
        self.im2col = self.write_through = self.fixed_order = scalesim
        self.peak_macs = float(self.rows * self.cols) * self.clock
        self.gpu = None      # filled by the model for GPU-class designs
        self.gpu_np = None
        self.models: tuple[str, ...] = ()
