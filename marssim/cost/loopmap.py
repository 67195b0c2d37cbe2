"""Loop-mapping models of the non-systolic dataflows: Eyeriss row-stationary, NVDLA-like
channel-parallel and ShiDianNao-like output-pixel-parallel arrays.

Each dataflow lays some loop dimensions of the conv view (``G, n, k, c, p, q, r, s``, see
:mod:`marssim.cost.features`) across the PE rows and columns and runs the others in time. A
spatial dimension ``d`` laid on ``P`` PEs takes ``ceil(d / P)`` folds, so the array's
utilisation is the product over spatial dimensions of ``d / (ceil(d / P) * P)``. One MAC per PE
per cycle; no pipeline fill terms (unlike the systolic arrays) -- the arrays below broadcast
operands rather than skew them.

DRAM bytes are the compulsory traffic plus the re-reads of operands that do not fit their window
of the buffer (:func:`marssim.cost.traffic.refetch`: the cheaper of re-streaming the operand
and chunking it while re-streaming its partner) and, for row-stationary, the partial sums of a
filter fold that do not fit the ofmap window. Time is
:func:`marssim.cost.traffic.overlap` with one phase (fill, then compute and DRAM overlapped,
then the last output block), and at least the buffer bytes over ``sram_bandwidth``.

**nvdla** (NVDLA v1, nvdla.org hardware architecture: the convolution core's MAC array of
*atomic-K* x *atomic-C* cells). ``pe_rows`` = atomic-K output channels, ``pe_cols`` = atomic-C
input channels; each cycle one output pixel and one kernel tap (the "atomic operation")::

    cycles = G * ceil(k / rows) * ceil(c / cols) * n*p*q*r*s

Weights sit in the MAC cells and are read once; input pixels (im2col ``A = G*M*K``) are
broadcast to all atomic-K cells and re-read once per output-channel fold; the accumulator
holds partial sums, so outputs are written once: buffer bytes ``B + A*ceil(k/rows) + O``.
A depthwise conv (``c = k = 1`` per group) uses one cell: this is why NVDLA-style arrays do
poorly on MobileNets (Herald, Kwon et al., HPCA 2021).

**shidiannao** (Du et al., "ShiDianNao", ISCA 2015). Each PE owns one output pixel
(output-stationary): ``pe_rows x pe_cols`` output pixels ``p x q`` of one output channel at a
time; inputs shift between neighbouring PEs, one weight is broadcast to all PEs per cycle::

    conv:        cycles = G * ceil(p / rows) * ceil(q / cols) * n*k*c*r*s
    gemm/matmul: cycles = G * ceil(M / rows) * ceil(N / cols) * K

(for fully connected layers the paper spreads output neurons over the PEs; here the output
matrix ``M x N`` is the output plane). Buffer reads for convs: weights once per output tile,
the input pixels the conv uses once per output channel (neighbour shifting supplies the window;
"used" = ``min(input tensor, im2col A)``, so a strided 1x1 conv reads a quarter), outputs once;
for GEMMs as an output-stationary array: ``A*ceil(N/cols) + B*ceil(M/rows) + O``.

**rs** (Chen et al., "Eyeriss", ISCA 2016 / JSSC 2017: row-stationary). A logical *PE set* of
``r`` rows (filter rows) by ``p`` columns (output rows) computes one 2-D convolution of one
channel with one filter; each PE runs a 1-D convolution (``q*s`` MACs) of a filter row over an
input row. A set taller than the array is folded (``ceil(r / rows)``), a wider one folded
over ``ceil(p / cols)``; a smaller set is replicated: ``u_r = rows // r`` sets stacked
vertically take different input channels (their partial sums add up the column), ``u_c = cols
// p`` side by side take different filters; replicas left over (a depthwise conv has one
channel and one filter per group) take different groups::

    c_par = min(u_r, c), k_par = min(u_c, k), g_par = (u_r // c_par) * (u_c // k_par)
    cycles = n * ceil(G / g_par) * ceil(k / k_par) * ceil(c / c_par)
               * ceil(r / rows) * ceil(p / cols) * q * s

Buffer traffic (the PE scratchpads keep filter rows across ``q`` and input rows across ``s``):
weights once per sample and column fold; the used input pixels (as for ShiDianNao) once per
row fold and per
``RS_FILTER_INTERLEAVE`` (16) filter folds -- a PE interleaves up to 16 filters on the input row
it holds (Eyeriss's mapping parameter *p*, bounded by its 24-entry partial-sum scratchpad; an
assumption of this model, the paper tunes it per layer); partial sums written
``ceil(c / c_par) * ceil(r / rows)`` times and read back one time fewer.
"""

from __future__ import annotations

from .features import (
    F_AE, F_BB, F_C, F_CONV, F_EB, F_G, F_K, F_KK, F_M, F_N, F_NN, F_OB, F_P, F_Q, F_R, F_S, F_ST, F_SX,
    F_SY, F_TRAFFIC,
)
from .traffic import overlap, psums, refetch

__all__ = ["nvdla_gemm", "shidiannao_gemm", "rs_gemm", "rs_mapping", "RS_FILTER_INTERLEAVE"]

RS_FILTER_INTERLEAVE = 16
"""Filters a row-stationary PE interleaves on one input row (input reuse from its scratchpad)."""


def _finish(cycles, sram_rd_e, sram_wr_e, a_t, b_t, o_wr, o_rd, first, block, x, d, mx, mn):
    """Returns ``(time, compute_time, memory_time, cycles, sram_read, sram_write, dram_read,
    dram_write)`` from the cycles, the buffer elements read and written by the array, the DRAM
    bytes of each operand, the bytes of each input the array needs before its first cycle
    (``first``; the rest streams while it computes) and of the last output block."""
    eb = x[F_EB]
    compute = cycles / d.clock
    fill = (mn(mn(first[0], a_t), d.wi), mn(mn(first[1], b_t), d.wf))
    t, dram_time = overlap(d, 1, compute, 1, (a_t, b_t, o_wr + o_rd), (0, 0, 0), fill, mn(block, d.wo), mx)
    sram_array = (sram_rd_e + sram_wr_e) * eb
    t = mx(t, sram_array / d.sram_bw)
    memory = mx(dram_time, sram_array / d.sram_bw)
    dram_rd = a_t + b_t + o_rd
    return t, compute, memory, cycles, sram_rd_e * eb + o_wr, sram_wr_e * eb + dram_rd, dram_rd, o_wr


def _inputs(x):
    """DRAM bytes of the first input once (the compulsory traffic less weights and output)."""
    return x[F_TRAFFIC] - x[F_BB] - x[F_OB]


def nvdla_gemm(x, d, mx, mn):
    """NVDLA-like (atomic-K rows x atomic-C columns). Returns ``(time, compute_time,
    memory_time, cycles, sram_read, sram_write, dram_read, dram_write)``; ``x`` a feature tuple
    or numpy columns."""
    g, k, c = x[F_G], x[F_K], x[F_C]
    m, nn, kk = x[F_M], x[F_NN], x[F_KK]
    fk = -(-k // d.rows)
    cycles = g * fk * -(-c // d.cols) * m * x[F_R] * x[F_S]
    a_b, b_b, o_b = _inputs(x), x[F_BB], x[F_OB]
    extra_a, extra_b = refetch(a_b, fk, b_b, d.ri)
    first = (d.cols * x[F_EB], d.rows * d.cols * x[F_EB])  # a pixel's channels, the cells' weights
    return _finish(cycles, g * kk * nn + g * m * kk * fk, g * m * nn, a_b + extra_a, b_b + extra_b, o_b, 0 * o_b,
                   first, o_b / (fk * m), x, d, mx, mn)


def shidiannao_gemm(x, d, mx, mn):
    """ShiDianNao-like (output pixels on rows x columns). Same returns as :func:`nvdla_gemm`."""
    g, sx, sy, st = x[F_G], x[F_SX], x[F_SY], x[F_ST]
    fx, fy = -(-sx // d.rows), -(-sy // d.cols)
    cycles = g * fx * fy * st
    m, nn, kk = x[F_M], x[F_NN], x[F_KK]
    a_b, b_b, o_b = _inputs(x), x[F_BB], x[F_OB]
    conv = x[F_CONV]
    # conv: weights per output tile (n * fx * fy tiles), input pixels per output channel
    tiles = x[F_N] * fx * fy
    conv_e = g * kk * nn * tiles + mn(x[F_AE], g * m * kk) * x[F_K]
    cb1, ca1 = refetch(b_b, tiles, a_b, d.rf)
    ca2, cb2 = refetch(a_b, x[F_K], b_b, d.ri)
    # gemm: output-stationary over the M x N output matrix
    gemm_e = g * m * kk * fy + g * kk * nn * fx
    ga1, gb1 = refetch(a_b, fy, b_b, d.ri)
    gb2, ga2 = refetch(b_b, fx, a_b, d.rf)
    sram_rd = conv * conv_e + (1 - conv) * gemm_e
    extra_a = conv * (ca1 + ca2) + (1 - conv) * (ga1 + ga2)
    extra_b = conv * (cb1 + cb2) + (1 - conv) * (gb1 + gb2)
    block = mn(d.rows * d.cols * x[F_EB], o_b)
    first = (d.rows * d.cols * x[F_EB], x[F_EB])  # an output tile's first inputs, one weight
    return _finish(cycles, sram_rd, g * m * nn, a_b + extra_a, b_b + extra_b, o_b, 0 * o_b, first, block, x, d,
                   mx, mn)


def rs_mapping(x, rows: int, cols: int, mx, mn):
    """Eyeriss row-stationary mapping: ``(cycles, c_folds, k_folds, row_folds, col_folds)``."""
    g, n, k, c, p, r = x[F_G], x[F_N], x[F_K], x[F_C], x[F_P], x[F_R]
    row_folds = -(-r // rows)
    col_folds = -(-p // cols)
    u_r = mx(1, rows // r)
    u_c = mx(1, cols // p)
    c_par = mn(u_r, c)
    k_par = mn(u_c, k)
    g_par = (u_r // c_par) * (u_c // k_par)
    c_folds = -(-c // c_par)
    k_folds = -(-k // k_par)
    cycles = n * -(-g // g_par) * k_folds * c_folds * row_folds * col_folds * x[F_Q] * x[F_S]
    return cycles, c_folds, k_folds, row_folds, col_folds


def rs_gemm(x, d, mx, mn):
    """Eyeriss-like row-stationary array. Same returns as :func:`nvdla_gemm`. Partial sums of one
    filter fold (``k_par`` filters of every group and sample: the output over ``k_folds``)
    accumulate over ``c_folds * row_folds`` passes in the ofmap window, else spill."""
    cycles, c_folds, k_folds, row_folds, col_folds = rs_mapping(x, d.rows, d.cols, mx, mn)
    g, m, nn, kk = x[F_G], x[F_M], x[F_NN], x[F_KK]
    a_b, b_b, o_b = _inputs(x), x[F_BB], x[F_OB]
    w_passes = x[F_N] * col_folds
    in_passes = -(-k_folds // RS_FILTER_INTERLEAVE) * row_folds
    psum_passes = c_folds * row_folds
    sram_rd = g * kk * nn * w_passes + mn(x[F_AE], g * m * kk) * in_passes + g * m * nn * (psum_passes - 1)
    sram_wr = g * m * nn * psum_passes
    ea1, eb1 = refetch(a_b, in_passes, b_b, d.ri)
    eb2, ea2 = refetch(b_b, w_passes, a_b, d.rf)
    o_wr, o_rd = psums(o_b, d.wo, k_folds, psum_passes, False)
    first = (d.rows * d.cols * x[F_EB], d.rows * x[F_S] * x[F_EB])  # input rows, filter rows of the PE set
    return _finish(cycles, sram_rd, sram_wr, a_b + ea1 + ea2, b_b + eb1 + eb2, o_wr, o_rd, first, o_b / k_folds,
                   x, d, mx, mn)
