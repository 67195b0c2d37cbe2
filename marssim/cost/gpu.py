"""GPU-class designs: a roofline times efficiency curves per kernel kind.

A kernel's time is ``max(compute, memory) + launch``::

    memory  = traffic / bandwidth                       (bandwidth = DRAM bandwidth x mem_eff)
    compute = flops / (rate * efficiency)               (rate = peak FLOP/s of the dtype x peak_eff)

GEMM-class kernels (``gemm``, ``conv`` as implicit GEMM, ``attention`` = the batched products of
attention) run as thread-block tiles of ``tm x tn`` over ``K`` in steps of ``tk``, so their
efficiency depends on the shape ``(batch, M, N, K)``. Libraries shrink tiles for small matrices
(down to the tensor-core MMA shape m16 n8 k16), so the tile is
``tm = min(tile_m, ceil16(M))``, ``tn = min(tile_n, ceil8(N))``, ``tk = min(tile_k, ceil16(K))``
(``ceilX`` rounds up to a multiple of X)::

    tiles      = batch * ceil(M / tm) * ceil(N / tn)
    waves      = ceil(tiles / SMs)
    efficiency = tiles / (waves * SMs)                                    wave quantisation
               * M*N*K / (ceil(M/tm)*tm * ceil(N/tn)*tn * ceil(K/tk)*tk)  tile padding
               * K / (K + k_half)                                         prologue/epilogue share

All the other kinds (``elementwise``, ``norm``, ``softmax``, ``pool``, ``embedding``,
``reshape``) stream: ``rate`` is the CUDA-core rate (the ``fp32`` peak x ``peak_eff``) and the
efficiency factor is 1. The curve has four fitted parameters per (kernel kind, dtype) --
``rate``, ``bandwidth``, ``k_half``, ``launch`` -- which :mod:`marssim.cost.calibrated` fits to
measured kernel timings; this module gives the analytical defaults.

Defaults for H100-class GPUs (assumptions, to be replaced by calibration tables):

=============  ========  ======  =======  ===================================================
kind           peak_eff  k_half  mem_eff  why
=============  ========  ======  =======  ===================================================
gemm           0.80      64      0.85     large cuBLAS bf16 GEMMs reach ~75-80 % of dense peak
conv           0.65      64      0.80     cuDNN implicit GEMM: im2col gathers, smaller tiles
attention      0.60      64      0.80     unfused batched products with head dim 64
elementwise    0.50      --      0.90     copy-like kernels reach ~90 % of HBM bandwidth
norm, softmax  0.50      --      0.80     row reductions: two passes over short rows
pool           0.50      --      0.85
embedding      0.50      --      0.60     row gathers
reshape        0.50      --      0.90     copies (a view costs only the launch)
=============  ========  ======  =======  ===================================================

Traffic is the op's compulsory bytes at DRAM bandwidth; L2 reuse (``sram``, ``gpu.l2``) is not
modelled beyond what ``mem_eff`` absorbs, and neither are fused kernels (each op is one kernel).
``tile_m``/``tile_n`` and the launch overhead come from the design's ``gpu:`` section;
``tile_k`` is 32. The peak of a dtype missing from ``peak_flops`` falls back to a sibling
(``bf16``<->``fp16``, ``tf32``->``fp32``, ``fp8``<->``int8``) and else to the lowest listed peak,
except ``fp4``: a GPU without a published FP4 peak has no FP4 tensor cores (Hopper, CDNA 3), so
its ``fp4`` peak is NaN (:data:`NO_FALLBACK`) and the cost model refuses an FP4 GEMM on it
(:meth:`GpuTable.check_dtype`). Block-scaled FP8 (``fp8_block``, ``mxfp8``) runs at the ``fp8``
peak where the GPU's compute capability runs it (:data:`BLOCK_SCALED_FP8`; ``mxfp8`` from
Blackwell on), and is refused likewise elsewhere.

A GEMM's dtype is its :attr:`~marssim.workload.Op.math_dtype`, its inputs' type: an FP8 GEMM of
Transformer Engine (FP8 inputs, bf16 output) runs at the ``fp8`` peak, with its bytes counted
operand by operand.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from marssim.system import Design

from .attention_grid import AttentionGrid
from .attention_kernels import AttentionRescale
from .gemm_grid import grid_from_measured
from .features import (
    CLASS_NONE, DTYPES, F_CLASS, F_DTYPE, F_FLOPS, F_G, F_KERNEL, F_KK, F_M, F_N, F_NN, F_TRAFFIC, KERNEL_KINDS,
    N_GEMM_KERNELS, conv_geometry_key,
)
from .residual import ResidualCorrection

__all__ = ["BLOCK_SCALED_FP8", "design_peaks", "CurveParams", "KindEfficiency", "DEFAULT_EFFICIENCY", "TILE_K",
           "gemm_curve", "stream_curve", "dtype_peak", "computes_in", "default_curve", "GpuTable"]

TILE_K = 32
"""Default K step of a GEMM thread-block tile."""


@dataclass(frozen=True, slots=True)
class KindEfficiency:
    """Analytical efficiency of one kernel kind: fraction of peak FLOP/s (``peak_eff``), ``K``
    at which the prologue/epilogue halves efficiency (``k_half``, GEMM-class only) and fraction
    of DRAM bandwidth reached (``mem_eff``)."""

    peak_eff: float
    k_half: float
    mem_eff: float


DEFAULT_EFFICIENCY: dict[str, KindEfficiency] = {
    "gemm": KindEfficiency(0.80, 64.0, 0.85),
    "conv": KindEfficiency(0.65, 64.0, 0.80),
    "attention": KindEfficiency(0.60, 64.0, 0.80),
    "elementwise": KindEfficiency(0.50, 0.0, 0.90),
    "norm": KindEfficiency(0.50, 0.0, 0.80),
    "softmax": KindEfficiency(0.50, 0.0, 0.80),
    "pool": KindEfficiency(0.50, 0.0, 0.85),
    "embedding": KindEfficiency(0.50, 0.0, 0.60),
    "reshape": KindEfficiency(0.50, 0.0, 0.90),
}


@dataclass(frozen=True, slots=True)
class CurveParams:
    """The efficiency curve of one kernel kind and dtype on one GPU (SI units).

    rate: FLOP/s at full efficiency (peak x peak efficiency); ``inf`` ignores compute.
    bandwidth: bytes/s reached by the kernel's traffic.
    k_half: K (elements) at which the prologue/epilogue halves GEMM efficiency.
    launch: fixed time per kernel, s.
    sms, tile_m, tile_n, tile_k: SM count and thread-block tile of the wave/padding terms.
    """

    rate: float
    bandwidth: float
    k_half: float
    launch: float
    sms: int
    tile_m: int = 128
    tile_n: int = 128
    tile_k: int = TILE_K

    def as_row(self) -> tuple:
        return (self.rate, self.bandwidth, self.k_half, self.launch, self.sms, self.tile_m, self.tile_n, self.tile_k)


# ----------------------------------------------------------------------------- the curves
def gemm_curve(g, m, n, k, flops, traffic, rate, bandwidth, k_half, launch, sms, tile_m, tile_n, tile_k, mx, mn):
    """Seconds of GEMM-class kernels: ``(time, compute, memory)``. Works elementwise on Python
    numbers or numpy arrays (``mx``/``mn``: ``max``/``min`` or their numpy versions); dims >= 1."""
    tm = mn(tile_m, -(-m // 16) * 16)
    tn = mn(tile_n, -(-n // 8) * 8)
    tk = mn(tile_k, -(-k // 16) * 16)
    mt = -(-m // tm)
    nt = -(-n // tn)
    kt = -(-k // tk)
    tiles = g * mt * nt
    waves = -(-tiles // sms)
    wave_eff = tiles / (waves * sms)
    pad_eff = (m * n * k) / (mt * tm * nt * tn * kt * tk)
    sat = k / (k + k_half)
    compute = flops / (rate * (wave_eff * pad_eff * sat))
    memory = traffic / bandwidth
    return mx(compute, memory) + launch, compute, memory


def stream_curve(flops, traffic, rate, bandwidth, launch, mx):
    """Seconds of streaming kernels: ``(time, compute, memory)``."""
    compute = flops / rate
    memory = traffic / bandwidth
    return mx(compute, memory) + launch, compute, memory


def gpu_gemm(x, p, mx, mn):
    """GEMM-class ops ``x`` with curve parameters ``p`` (a :meth:`CurveParams.as_row` tuple or
    a tuple of numpy arrays): ``(time, compute, memory, cycles, sram_bytes, dram_bytes)``."""
    t, c, m = gemm_curve(x[F_G], x[F_M], x[F_NN], x[F_KK], x[F_FLOPS], x[F_TRAFFIC], *p, mx, mn)
    return t, c, m, 0, 0, x[F_TRAFFIC]


def gpu_stream(x, p, mx, mn):
    """Streaming ops ``x`` with curve parameters ``p``; same returns as :func:`gpu_gemm`."""
    t, c, m = stream_curve(x[F_FLOPS], x[F_TRAFFIC], p[0], p[1], p[3], mx)
    return t, c, m, 0, 0, x[F_TRAFFIC]


# ----------------------------------------------------------------------------- defaults
_SIBLING = {"bf16": ("fp16",), "fp16": ("bf16",), "tf32": ("fp32",), "fp32": (), "fp8": ("int8",),
            "int8": ("fp8",), "int32": ("fp32",), "int64": ("fp32",)}
NO_FALLBACK = frozenset({"fp4"})
"""Dtypes only some GPUs compute in: without a listed peak a design has none (NaN)."""

BLOCK_SCALED_FP8 = {"fp8_block": 0.0, "mxfp8": 10.0}
"""FP8 with block scales, by the least compute capability whose tensor cores run it at the FP8
peak: ``fp8_block`` (an fp32 scale per 128 elements, applied outside the MMA: any GPU with FP8
tensor cores, Hopper's kernels promoting partial sums to apply them) and ``mxfp8`` (an E8M0
scale per 32, applied inside Blackwell's block-scaled MMA, ``tcgen05.mma`` ``block_scale``:
compute capability 10.0 and later). A design without an ``fp8`` peak, or below that capability,
has none (NaN)."""


def dtype_peak(design: Design, dtype: str) -> float:
    """Dense peak FLOP/s of ``design`` for ``dtype`` (sibling dtype, else the lowest peak; NaN
    for a :data:`NO_FALLBACK` dtype the design does not list; a :data:`BLOCK_SCALED_FP8` type
    the ``fp8`` peak where the design's compute capability runs it, else NaN)."""
    peaks = design.gpu.peak_flops
    if dtype in peaks:
        return float(peaks[dtype])
    if dtype in BLOCK_SCALED_FP8:
        cc = design.gpu.compute_capability
        capable = BLOCK_SCALED_FP8[dtype] == 0.0 or (cc is not None and float(cc) >= BLOCK_SCALED_FP8[dtype])
        return float(peaks["fp8"]) if "fp8" in peaks and capable else math.nan
    if dtype in NO_FALLBACK:
        return math.nan
    for other in _SIBLING.get(dtype, ()):
        if other in peaks:
            return float(peaks[other])
    return float(min(peaks.values()))


def computes_in(design: Design, dtype: str) -> bool:
    """Whether the GPU-class ``design`` has tensor cores for ``dtype``: a peak listed for it, or a
    :data:`BLOCK_SCALED_FP8` type its FP8 tensor cores and compute capability run."""
    if dtype in BLOCK_SCALED_FP8:
        return not math.isnan(dtype_peak(design, dtype))
    return dtype in design.gpu.peak_flops


def design_peaks(design: Design) -> dict[str, float]:
    """Dense peak FLOP/s of the GPU-class ``design`` for every dtype (:func:`dtype_peak`)."""
    return {dt: dtype_peak(design, dt) for dt in DTYPES}


def _vector_peak(design: Design) -> float:
    peaks = design.gpu.peak_flops
    return float(peaks["fp32"]) if "fp32" in peaks else float(min(peaks.values()))


def default_curve(design: Design, kind: str, dtype: str,
                  efficiency: dict[str, KindEfficiency] | None = None) -> CurveParams:
    """The analytical curve of ``kind`` kernels in ``dtype`` on the GPU-class ``design``."""
    eff = (efficiency or DEFAULT_EFFICIENCY)[kind]
    gpu = design.gpu
    gemm_class = KERNEL_KINDS.index(kind) < N_GEMM_KERNELS
    peak = dtype_peak(design, dtype) if gemm_class else _vector_peak(design)
    dram = math.inf if design.dram_bandwidth is None else float(design.dram_bandwidth)
    return CurveParams(rate=peak * eff.peak_eff, bandwidth=dram * eff.mem_eff, k_half=eff.k_half,
                       launch=float(gpu.launch_overhead), sms=int(gpu.sms), tile_m=int(gpu.tile_m),
                       tile_n=int(gpu.tile_n), tile_k=TILE_K)


class GpuTable:
    """Curve parameters of one GPU design for every (kernel kind, dtype): nested tuples for the
    scalar path (``rows[kind][dtype]``), arrays of shape ``(kinds, dtypes)`` for the vectorised
    path (``arrays[i]`` is parameter ``i`` of :meth:`CurveParams.as_row`), the name of the
    model behind each entry (``models[kind][dtype]``), measured kernel times (s) by shape
    code ``(kernel kind index, dtype index, batch, m, n, k, flops, bytes)`` (see
    :func:`marssim.cost.calibrated.shape_key`; index codes instead of names), and the local
    residual corrections of the fitted curves (``corrections[kind][dtype]``, None where there
    is none; see :mod:`marssim.cost.residual`), and the FLOP/s no curve-timed GEMM-class kernel
    exceeds (``ceilings[kind, dtype]``: the best throughput measured for the kind and dtype, else
    the dense peak: a curve fitted on the measured shapes must not extrapolate past what the GPU
    was seen to sustain), and the measured fused attention kernels that time the shapes between
    them (``attention``: :mod:`marssim.cost.attention_grid`, None without), the measured
    linear-layer GEMMs that time the shapes between them (``gemm``: :mod:`marssim.cost.gemm_grid`,
    None without), and the training
    stack's kernel set that times its causal prompt attention kernels instead (``rescale``:
    :mod:`marssim.cost.attention_kernels`, None without)."""

    __slots__ = ("rows", "arrays", "models", "peaks", "ceilings", "measured", "corrections", "any_correction",
                 "missing", "design_name", "attention", "rescale", "gemm")

    def __init__(self, design: Design, overrides: dict[tuple[str, str], CurveParams] | None = None,
                 override_model: str = "fitted",
                 measured: dict[tuple[int, ...], float] | None = None,
                 corrections: dict[tuple[str, str], ResidualCorrection] | None = None,
                 best_rates: dict[tuple[str, str], float] | None = None,
                 attention: AttentionGrid | None = None, rescale: AttentionRescale | None = None) -> None:
        self.measured = dict(measured or {})
        self.attention = attention if attention else None
        gemm = grid_from_measured(self.measured)
        self.gemm = gemm if gemm else None
        self.rescale = rescale
        corrections = corrections or {}
        self.corrections = tuple(tuple(corrections.get((kind, dt)) for dt in DTYPES) for kind in KERNEL_KINDS)
        self.any_correction = bool(corrections)
        overrides = overrides or {}
        rows, models = [], []
        for kind in KERNEL_KINDS:
            row, mrow = [], []
            for dt in DTYPES:
                fitted = overrides.get((kind, dt))
                params = fitted if fitted is not None else default_curve(design, kind, dt)
                row.append(params.as_row())
                mrow.append(override_model if fitted is not None else "gpu-roofline")
            rows.append(tuple(row))
            models.append(tuple(mrow))
        self.rows = tuple(rows)
        self.models = tuple(models)
        self.arrays = tuple(
            np.array([[r[i] for r in row] for row in rows], dtype=np.float64 if i < 4 else np.int64)
            for i in range(8))
        self.peaks = tuple(dtype_peak(design, dt) for dt in DTYPES)
        self.missing = frozenset(i for i, p in enumerate(self.peaks) if math.isnan(p))
        """Dtype codes the design has no tensor-core peak for (a GEMM of one is refused)."""
        self.design_name = design.name
        rates = best_rates or {}
        self.ceilings = np.array([[rates.get((kind, dt)) or p for p, dt in zip(self.peaks, DTYPES)]
                                  for kind in KERNEL_KINDS], dtype=np.float64)

    def check_dtype(self, dtype_code: int) -> None:
        """Raise InputError for a GEMM-class kernel of a dtype this design has no peak for."""
        if dtype_code in self.missing:
            from marssim.errors import InputError

            dt = DTYPES[dtype_code]
            raise InputError(None, f"designs.{self.design_name}.gpu.peak_flops",
                             f"a {dt} GEMM needs the design's {dt} tensor-core peak, and none is listed (no published "
                             f"{dt} peak: the GPU has no {dt} tensor cores); run the workload in another dtype")

    def correction_factors(self, xs: list[tuple[int, ...]]) -> np.ndarray:
        """Multipliers of the curve times of the GPU ops with feature tuples ``xs``: the local
        residual correction of their (kind, dtype), 1.0 where none applies. Each shape's value
        is independent of the others in ``xs`` (bit for bit), so the scalar path calls this
        with one tuple and the vectorised path with many."""
        out = np.ones(len(xs), dtype=np.float64)
        if not self.any_correction or not xs:
            return out
        groups: dict[tuple[int, int], list[int]] = {}
        for i, x in enumerate(xs):
            corr = self.corrections[x[F_KERNEL]][x[F_DTYPE]]
            if corr is None or x[F_CLASS] == CLASS_NONE:
                continue
            if (x[F_G] > 0 and x[F_M] > 0 and x[F_NN] > 0 and x[F_KK] > 0) if corr.gemm else x[F_TRAFFIC] > 0:
                groups.setdefault((x[F_KERNEL], x[F_DTYPE]), []).append(i)
        for (kernel, dt), idx in groups.items():
            corr = self.corrections[kernel][dt]
            sel = [xs[i] for i in idx]
            if corr.gemm:
                geometry = [(x[F_N], *conv_geometry_key(x)) for x in sel] if corr.geometry else None
                feats = corr.features([x[F_G] for x in sel], [x[F_M] for x in sel], [x[F_NN] for x in sel],
                                      [x[F_KK] for x in sel], geometry=geometry)
            else:
                feats = corr.features(flops=[x[F_FLOPS] for x in sel], nbytes=[x[F_TRAFFIC] for x in sel])
            out[idx] = corr.factors(feats)
        return out
