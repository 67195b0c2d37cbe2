"""The shapes the measurement harness times: the zoo's layer shapes plus a sweep around them.

Pure and deterministic; no GPU, no torch. A :class:`GridPoint` is one kernel shape: an
:class:`~marssim.workload.Op` (a layer of a workload, or a variant of one) with the numbers a
calibration-table row records for it -- computed by :func:`marssim.cost.features.op_features`,
the very function the cost model reads ops with, so a measured row matches the ops it was
measured for (:func:`marssim.cost.calibrated.shape_key`).

How the grid is built (:func:`build_grid`):

1. Every compute op of every workload (zoo names or ONNX files), re-typed to each dtype, whose
   kernel kind is asked for. Kinds are the calibration table's (``gemm``, ``conv``,
   ``attention`` = the zoo's ``matmul`` ops, ``elementwise``, ``norm``, ``softmax``, ``pool``,
   ``embedding``); ``fused-attention`` asks for one fused attention kernel per attention block
   (from the ``Q K^T`` products), recorded as SIP does (``batch = 2 x batch x heads``, see
   :func:`marssim.calibrate.sip.calibration.gemm_class_shape`) and written to its own table.
2. With ``sweep``, variants of each such op (deterministic, in this order):

   * batch: the batch-like loop (``N``, or ``B`` of ``gemm``/``matmul``) times 2, 4, ...
     up to ``max_batch_factor`` -- a data-parallel shard of a larger batch has these shapes;
   * GEMM-class ops only, around each of the GEMM dims a layer can change (``conv``: output
     channels ``K``; ``gemm``: ``M``, ``N``, ``K``; ``matmul``: ``M``, ``N``, ``K``): the
     powers of two just below and above the value and the multiples of the 128-wide tile just
     below and above it (values equal to the original or below 1 dropped).

3. With ``shards`` (split counts such as 2, 4, 8), the shards of each such op as the mappings
   cut them (:func:`shard_variants`): for every sharding strategy legal for the op
   (:func:`marssim.mapping.sharding.legal_strategies`), the op with the strategy's loop split
   into that many parts (:func:`~marssim.mapping.sharding.split_sizes`; each distinct part size
   once). A model-parallel mapping asks the cost model for exactly these shapes.
4. Points with the same :func:`shape_key` (per measure kind) are kept once, the first seen.
   Convolutions are keyed by their geometry too, so two layers with the same im2col GEMM but
   different channels, kernel size or stride are two points.

A point's key carries the kernel's phase (``fwd`` for the zoo's layers; ``dgrad``, ``wgrad``,
``bwd``, ``update`` for the ops of training graphs) and, for the fused attention ops of LLM
workloads (measure kind ``sdpa``), the scaled-dot-product attention backend: the grid of the LLM
workloads, cut as the parallel lowering cuts them, is :mod:`marssim.calibrate.llm`.

:func:`estimate_seconds` predicts how long the harness spends on a point (kernel time from the
analytical GPU roofline of a design, plus the L2 flush, warm-up and a fixed set-up cost per
point), :func:`split_chunks` cuts a grid into consecutive chunks under a time budget.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace

from marssim.cost.calibrated import shape_key
from marssim.cost.convgeom import ConvGeometry, conv_geometry
from marssim.cost.features import (
    CLASS_GEMM, CLASS_NONE, F_BACKEND, F_CLASS, F_FLOPS, F_G, F_KERNEL, F_KK, F_M, F_NN, F_PHASE, F_TRAFFIC,
    KERNEL_BACKENDS, KERNEL_KINDS, KERNEL_PHASES, op_features,
)
from marssim.errors import InputError
from marssim.workload import Graph, Op, OpKind
from marssim.workload.op import DTYPE_BYTES

__all__ = ["MEASURE_KINDS", "DEFAULT_KINDS", "FUSED_ATTENTION", "SDPA", "MEASURE_DTYPES", "DEFAULT_WORKLOADS",
           "GridPoint", "TimingPlan", "build_grid", "grid_from_graphs", "load_graphs", "split_workloads",
           "parse_list", "sweep_variants", "shard_variants", "estimate_seconds", "split_chunks", "tile_neighbours"]

FUSED_ATTENTION = "fused-attention"
SDPA = "sdpa"
MEASURE_KINDS = ("gemm", "conv", "attention", "elementwise", "norm", "softmax", "pool", "embedding", FUSED_ATTENTION,
                 SDPA)
"""Kinds the harness can time (``reshape`` is a view or a copy in a framework: not timed).
``fused-attention``: one fused kernel per attention block of a workload with unfused attention
(the SIP convention, a table of its own); ``sdpa``: the fused attention ops of LLM workloads
built with ``attention=flash`` or ``efficient`` (table kind ``attention``, the backend in the
row), which the cost model looks up."""
DEFAULT_KINDS = ("gemm", "conv", "attention", "elementwise", "norm")
MEASURE_DTYPES = ("bf16", "fp16", "fp32", "tf32")
"""Dtypes the harness can time (``tf32``: fp32 tensors with TF32 tensor-core math allowed)."""
DEFAULT_WORKLOADS = ("resnet50", "bert-base", "gpt2", "vit-b16", "mobilenetv2", "vgg16")
TILE = 128
"""Tile width of the sweep's "multiples of tiles" (a common cuBLAS/CUTLASS thread-block tile)."""
_GEMM_CLASS = ("gemm", "conv", "attention")


@dataclass(frozen=True)
class GridPoint:
    """One kernel shape to time.

    ``measure_kind``: the ``--kinds`` name it was asked for (``fused-attention`` or a table
    kind); ``kind``, ``dtype``, ``batch``, ``m``, ``n``, ``k``, ``flops``, ``bytes``: the
    calibration-table columns (FLOPs, bytes); ``op``: the op whose kernel is timed (for fused
    attention: the block's ``Q K^T`` product); ``origin``: where it came from
    (``resnet50:layer1.0.conv1``, or ``... x4 N`` for a sweep variant); ``conv``: a
    convolution's geometry (the ``conv_*`` columns, :func:`marssim.cost.convgeom.conv_geometry`),
    None for other kinds; ``phase``: the table's ``phase`` column (the op's kernel phase,
    :func:`marssim.cost.features.kernel_phase`); ``backend``: the fused attention backend the
    op names (:func:`~marssim.cost.features.kernel_backend`; the kernel that times the point
    must run that backend); ``hints``: ``(name, value)`` pairs a kernel needs beyond the op's
    shapes (the softmax rows of a softmax gradient, the head dimension of rotary embeddings)."""

    measure_kind: str
    kind: str
    dtype: str
    batch: int
    m: int
    n: int
    k: int
    flops: int
    bytes: int
    op: Op
    origin: str
    conv: ConvGeometry | None = None
    phase: str = "fwd"
    backend: str = ""
    hints: tuple[tuple[str, int], ...] = ()

    @property
    def key(self) -> tuple:
        """:func:`~marssim.cost.calibrated.shape_key` of the point (with its phase and fused
        attention backend): the key the cost model looks the op up by."""
        return shape_key(self.kind, self.dtype, self.batch, self.m, self.n, self.k, self.flops, self.bytes, self.conv,
                         self.phase, self.backend)

    def hint(self, name: str, default: int = 0) -> int:
        return dict(self.hints).get(name, default)

    @property
    def fused(self) -> bool:
        return self.measure_kind == FUSED_ATTENTION

    def describe(self) -> str:
        """Short text: ``conv bf16 1x12544x64x147 (resnet50:conv1)``."""
        if self.conv is not None:
            g = self.conv
            shape = (f"{self.batch}x{self.m}x{self.n}x{self.k} = C{g.c} {g.h}x{g.w} K{g.k} {g.r}x{g.s}"
                     f"/{g.stride_h}" + (f" g{g.groups}" if g.groups > 1 else ""))
        elif self.kind in _GEMM_CLASS:
            shape = f"{self.batch}x{self.m}x{self.n}x{self.k}"
        else:
            shape = f"{self.flops:.3g} FLOP {self.bytes:.3g} B"
        name = self.measure_kind if self.measure_kind in (FUSED_ATTENTION, SDPA) else self.kind
        extra = "".join(f" {x}" for x in (self.phase if self.phase != "fwd" else "", self.backend) if x)
        return f"{name}{extra} {self.dtype} {shape} ({self.origin})"


# ----------------------------------------------------------------------------- inputs
def parse_list(text: str, allowed: Sequence[str], flag: str) -> tuple[str, ...]:
    """``"a,b"`` -> ``("a", "b")``, each checked against ``allowed`` (InputError naming ``flag``);
    order kept, duplicates dropped."""
    items = tuple(dict.fromkeys(x.strip() for x in text.split(",") if x.strip()))
    if not items:
        raise InputError(None, flag, f"expected a comma list of {', '.join(allowed)}, got {text!r}")
    for x in items:
        if x not in allowed:
            raise InputError(None, flag, f"expected some of {', '.join(allowed)}, got {x!r}")
    return items


def split_workloads(text: str) -> tuple[str, ...]:
    """``"resnet50,bert-base:seq=512,batch=4,gpt2"`` -> ``("resnet50", "bert-base:seq=512,batch=4",
    "gpt2")``: a piece with ``=`` but no ``:`` continues the previous spec's parameters."""
    specs: list[str] = []
    for piece in (p.strip() for p in text.split(",")):
        if not piece:
            continue
        if "=" in piece and ":" not in piece and specs:
            specs[-1] += "," + piece
        else:
            specs.append(piece)
    if not specs:
        raise InputError(None, "--workloads", f"expected zoo names or ONNX files, got {text!r}")
    return tuple(specs)


def load_graphs(specs: Iterable[str]) -> list[Graph]:
    """The workloads named by ``specs`` (zoo specs or ONNX files; InputError when unknown)."""
    from marssim.workload import load_workload

    return [load_workload(spec) for spec in specs]


# ----------------------------------------------------------------------------- sweep
def _pow2_below(v: int) -> int:
    return 1 << ((v - 1).bit_length() - 1) if v > 1 else 0


def _pow2_above(v: int) -> int:
    return 1 << v.bit_length()


def tile_neighbours(value: int, tile: int = TILE) -> tuple[int, ...]:
    """Powers of two just below and above ``value`` and the multiples of ``tile`` just below and
    above it, without ``value`` itself and values below 1, in that order (duplicates dropped).
    ``768 -> (512, 1024, 640, 896)``; ``200 -> (128, 256)``."""
    below = (value - 1) // tile * tile
    above = (value // tile + 1) * tile
    out = [v for v in (_pow2_below(value), _pow2_above(value), below, above) if v >= 1 and v != value]
    return tuple(dict.fromkeys(out))


def _batch_dim(op: Op) -> str:
    return "B" if op.kind in (OpKind.GEMM, OpKind.MATMUL) else "N"


def _sweep_dims(op: Op) -> tuple[str, ...]:
    if op.kind == OpKind.CONV:
        return ("K",)
    if op.kind in (OpKind.GEMM, OpKind.MATMUL):
        return ("M", "N", "K")
    return ()


def sweep_variants(op: Op, max_batch_factor: int = 32) -> list[tuple[Op, str]]:
    """The sweep around ``op`` (see the module docstring): ``[(variant, label)]``."""
    out: list[tuple[Op, str]] = []
    dim = _batch_dim(op)
    base = op.dim(dim)
    factor = 2
    while factor <= max_batch_factor:
        out.append((op.with_loops(**{dim: base * factor}), f"x{factor} {dim}"))
        factor *= 2
    for d in _sweep_dims(op):
        if op.kind == OpKind.CONV and op.param("groups", 1) > 1 and not op.param("depthwise", False):
            continue  # grouped, not depthwise: K must stay a multiple of the groups
        for v in tile_neighbours(op.dim(d)):
            out.append((op.with_loops(**{d: v}), f"{d}={v}"))
    return out


def shard_variants(op: Op, shards: Sequence[int]) -> list[tuple[Op, str]]:
    """The shards of ``op`` split ``n`` ways for each ``n`` in ``shards``, by every legal sharding
    strategy that splits a loop: ``(shard op, label)``, label ``"model_k/8 K=96"`` (strategy,
    split count, the split loop and its size). Each distinct shape once, in strategy order, then
    split count, then size (larger first)."""
    from marssim.mapping.sharding import legal_strategies, split_dim, split_sizes

    out: list[tuple[Op, str]] = []
    seen: set[tuple[str, int]] = set()
    for strategy in legal_strategies(op):
        dim = split_dim(op, strategy)
        if dim is None:
            continue
        total = op.dim(dim)
        for parts in shards:
            if parts < 2 or parts > total:
                continue
            for size in dict.fromkeys(split_sizes(total, parts)):
                if (dim, size) in seen:
                    continue
                seen.add((dim, size))
                out.append((op.with_loops(**{dim: size}), f"{strategy}/{parts} {dim}={size}"))
    return out


# ----------------------------------------------------------------------------- points
def _point(op: Op, measure_kind: str, origin: str, hints: tuple[tuple[str, int], ...] = ()) -> GridPoint | None:
    x = op_features(op)
    if x[F_CLASS] == CLASS_NONE:
        return None
    kind = KERNEL_KINDS[x[F_KERNEL]]
    phase, backend = KERNEL_PHASES[x[F_PHASE]], KERNEL_BACKENDS[x[F_BACKEND]]
    if (measure_kind == SDPA) != bool(backend):  # fused attention ops are timed by the sdpa kernels only
        return None
    dtype = op.math_dtype  # the type the kernel computes in, which the cost model looks it up by
    if measure_kind == SDPA:
        return GridPoint(SDPA, kind, dtype, x[F_G], x[F_M], x[F_NN], x[F_KK], x[F_FLOPS], x[F_TRAFFIC], op, origin,
                         None, phase, backend, hints)
    if measure_kind == FUSED_ATTENTION:
        from marssim.calibrate.sip.calibration import gemm_class_shape

        s = gemm_class_shape("attention", {"Z": op.dim("B"), "H": op.dim("H"), "N_CTX": op.dim("M"),
                                           "HEAD_DIM": op.dim("K")}, DTYPE_BYTES[dtype])
        return GridPoint(FUSED_ATTENTION, "attention", dtype, int(s["batch"]), int(s["m"]), int(s["n"]),
                         int(s["k"]), int(s["flops"]), int(s["bytes"]), op, origin)
    if kind != measure_kind:
        return None
    if x[F_CLASS] == CLASS_GEMM:
        conv = conv_geometry(op) if kind == "conv" else None
        return GridPoint(kind, kind, dtype, x[F_G], x[F_M], x[F_NN], x[F_KK], x[F_FLOPS], x[F_TRAFFIC], op, origin,
                         conv, phase, "", hints)
    if kind in _GEMM_CLASS:  # a GEMM-like op without MACs: nothing to time
        return None
    return GridPoint(kind, kind, dtype, 0, 0, 0, 0, x[F_FLOPS], x[F_TRAFFIC], op, origin, None, phase, "", hints)


def _is_qk(op: Op) -> bool:
    """The ``Q K^T`` product of an attention block (the fused kernel is timed once per block)."""
    return op.kind == OpKind.MATMUL and op.param("b_feature", "K") == "K" and op.param("fused") is None


def _candidates(op: Op, measure_kind: str) -> bool:
    if measure_kind == FUSED_ATTENTION:
        return _is_qk(op) and op.dim("M") == op.dim("N")  # self-attention blocks
    return op.kind not in (OpKind.INPUT, OpKind.RESHAPE)


def grid_from_graphs(graphs: Sequence[Graph], kinds: Sequence[str] = DEFAULT_KINDS,
                     dtypes: Sequence[str] = ("bf16", "fp16", "fp32"), *, sweep: bool = True,
                     max_batch_factor: int = 32, shards: Sequence[int] = ()) -> tuple[GridPoint, ...]:
    """The grid of ``graphs`` (see the module docstring), ordered by kind, dtype, then the
    workloads' own shapes, the sweep's, then the shards'. Pure and deterministic."""
    for kind in kinds:
        if kind not in MEASURE_KINDS:
            raise ValueError(f"unknown kind {kind!r}; expected some of {', '.join(MEASURE_KINDS)}")
    for dt in dtypes:
        if dt not in DTYPE_BYTES:
            raise ValueError(f"unknown dtype {dt!r}")
    points: list[GridPoint] = []
    seen: set[tuple] = set()
    derived: list[Callable[[Op], list[tuple[Op, str]]]] = []
    if sweep:
        derived.append(lambda op: sweep_variants(op, max_batch_factor))
    if shards:
        derived.append(lambda op: shard_variants(op, shards))

    def add(p: GridPoint | None) -> None:
        if p is None:
            return
        key = (p.measure_kind, p.key)
        if key not in seen:
            seen.add(key)
            points.append(p)

    for measure_kind in kinds:
        for dt in dtypes:
            bases: list[tuple[Op, str]] = []
            for g in graphs:
                for i in g.compute_ops:
                    op = g.ops[i]
                    if not _candidates(op, measure_kind):
                        continue
                    typed = op if op.dtype == dt else replace(op, dtype=dt)
                    bases.append((typed, f"{g.spec}:{op.name}"))
            for op, origin in bases:
                add(_point(op, measure_kind, origin))
            for variants_of in derived:  # the sweep's variants of every base, then the shards
                for op, origin in bases:
                    if _point(op, measure_kind, origin) is None:
                        continue
                    for variant, label in variants_of(op):
                        add(_point(variant, measure_kind, f"{origin} {label}"))
    return tuple(points)


def build_grid(workloads: Sequence[str] = DEFAULT_WORKLOADS, kinds: Sequence[str] = DEFAULT_KINDS,
               dtypes: Sequence[str] = ("bf16", "fp16", "fp32"), *, sweep: bool = True,
               max_batch_factor: int = 32, shards: Sequence[int] = ()) -> tuple[GridPoint, ...]:
    """:func:`grid_from_graphs` of the workloads named by ``workloads`` (zoo specs, ONNX files)."""
    return grid_from_graphs(load_graphs(workloads), kinds, dtypes, sweep=sweep, max_batch_factor=max_batch_factor,
                            shards=shards)


# ----------------------------------------------------------------------------- time estimate
@dataclass(frozen=True)
class TimingPlan:
    """How the harness times a kernel, for the time estimate: ``warmup`` untimed runs, then
    ``min_reps``..``max_reps`` timed repetitions aiming at ``target_s`` of kernel time, each after
    an L2 flush writing ``flush_bytes``; ``setup_s`` per point (allocating and filling inputs,
    the library's first-call heuristics, reading back the output) and ``sync_s`` per repetition
    (event records, launch)."""

    warmup: int = 5
    min_reps: int = 20
    max_reps: int = 100
    target_s: float = 0.02
    flush_bytes: int = 256 << 20
    setup_s: float = 0.05
    sync_s: float = 10e-6

    def reps(self, kernel_s: float) -> int:
        """Timed repetitions for a kernel of ``kernel_s`` seconds."""
        return int(min(self.max_reps, max(self.min_reps, math.ceil(self.target_s / max(kernel_s, 1e-7)))))


def estimate_seconds(points: Sequence[GridPoint], kernels_per_point: Sequence[int], design=None,
                     plan: TimingPlan = TimingPlan()) -> list[float]:
    """Predicted harness seconds per point (all its kernels): the analytical GPU roofline of
    ``design`` (default: the ``h100`` design of ``dgx-h100``) times each kernel, then warm-up,
    repetitions with an L2 flush at DRAM bandwidth each, and the set-up cost."""
    from marssim.cost import GpuRooflineCost

    if design is None:
        from marssim.system import load_system

        system = load_system("dgx-h100")
        design = system.design(system.accelerator_ids[0], "h100")
    model = GpuRooflineCost()
    dram = float(design.dram_bandwidth or 3e12)
    flush_s = plan.flush_bytes / dram
    out = []
    for p, n_kernels in zip(points, kernels_per_point):
        t = model.op_time(p.op, design) * (2.0 if p.fused else 1.0)
        reps = plan.reps(t)
        per_kernel = plan.setup_s + plan.warmup * t + reps * (t + flush_s + plan.sync_s) + 5 * t
        out.append(per_kernel * n_kernels)
    return out


def split_chunks(seconds: Sequence[float], budget_s: float) -> list[tuple[int, int]]:
    """Consecutive ``[start, end)`` index ranges whose summed ``seconds`` stay within
    ``budget_s`` (a single item over the budget gets a chunk of its own). Deterministic."""
    if budget_s <= 0:
        raise ValueError("budget must be > 0")
    chunks: list[tuple[int, int]] = []
    start, total = 0, 0.0
    for i, s in enumerate(seconds):
        if i > start and total + s > budget_s:
            chunks.append((start, i))
            start, total = i, 0.0
        total += s
    if start < len(seconds):
        chunks.append((start, len(seconds)))
    return chunks
