"""Systolic arrays (output-, weight- and input-stationary, R x C PEs), as in SCALE-Sim.

Follows SCALE-Sim (Samajdar et al., "A Systematic Methodology for Characterizing Scalability
of DNN Accelerators using SCALE-Sim", ISPASS 2020; the TPU v1 of Jouppi et al., ISCA 2017, is
the weight-stationary case). A GEMM ``M x K`` times ``K x N`` (convolutions in their im2col
view: ``M = N*P*Q``, ``N = K``, ``K = C*R*S``) is cut into *folds*: the array holds an
``R x C`` tile of one operand (os: outputs; ws: weights; is: inputs) while the third dimension
``T`` streams through it. With ``Sr``/``Sc`` the dims laid on rows/columns::

    os: Sr = M, Sc = N, T = K    cycles = folds * (T + R + C - 2) - 1
    ws: Sr = K, Sc = N, T = M    cycles = folds * (T + 2R + C - 2) - 1
    is: Sr = K, Sc = M, T = N    cycles = folds * (T + 2R + C - 2) - 1
    folds = G * ceil(Sr / R) * ceil(Sc / C)

(stall-free; the ``-1`` is SCALE-Sim's convention of reporting the index of the last busy
cycle; the ws/is ``2R`` includes loading the stationary tile). ``G`` independent GEMMs (groups,
attention heads) run back to back; a depthwise conv is ``G = channels`` GEMMs with ``N = 1``,
one per channel, which uses one column of the array: a plain systolic array cannot share an
input stream between channels.

A larger array is not always faster: the skew fill grows with ``R`` and ``C``, so a GEMM smaller
than the array can take longer on a bigger one (SCALE-Sim shows the same). When every GEMM dim
reaches the larger array, scaling rows or columns by whole factors never adds cycles.

Traffic model (all in bytes, operands in the op's dtype, partial sums too):

* buffer (SRAM) reads and writes implied by the folds, in the im2col view: the stationary
  operand is read once; a streamed operand is re-read once per fold of the spatial dim it is not
  indexed by; outputs are written once (os), or, for ws/is, written ``ceil(K/R)`` times and read
  back ``ceil(K/R) - 1`` times as partial sums::

      os: A * ceil(N/C) + B * ceil(M/R) + O
      ws: B + A * ceil(N/C) + O * (2 ceil(K/R) - 1)
      is: A + B * ceil(M/C) + O * (2 ceil(K/R) - 1)

  with ``A = G*M*K``, ``B = G*K*N``, ``O = G*M*N`` elements.
* off-chip (DRAM): the compulsory traffic (inputs + weights + output tensors), plus the re-reads
  above for every operand (actual tensor bytes, not im2col) that does not fit in half of the
  buffer, by the tiling rule of :mod:`marssim.cost.traffic`.

Time is ``max(cycles / clock, buffer bytes / sram_bandwidth, DRAM bytes / dram_bandwidth)``: a
roofline floor under the stall-free cycle count, so memory-bound layers are not optimistic.
"""

from __future__ import annotations

from .features import F_AB, F_BB, F_EB, F_G, F_KK, F_M, F_NN, F_OB, F_TRAFFIC
from .traffic import psum_refetch, refetch

__all__ = ["systolic_gemm", "fold_cycles"]


def fold_cycles(dataflow: str, rows: int, cols: int, m: int, n: int, k: int, groups: int = 1) -> int:
    """Stall-free cycles of ``groups`` GEMMs ``m x k`` times ``k x n`` on a ``rows x cols``
    array with ``dataflow`` os/ws/is (SCALE-Sim's fold formula; 0 for an empty GEMM)."""
    if groups * m * n * k == 0:
        return 0
    if dataflow == "os":
        sr, sc, t, extra = m, n, k, rows + cols - 2
    elif dataflow == "ws":
        sr, sc, t, extra = k, n, m, 2 * rows + cols - 2
    elif dataflow == "is":
        sr, sc, t, extra = k, m, n, 2 * rows + cols - 2
    else:
        raise ValueError(f"not a systolic dataflow: {dataflow!r} (expected os, ws or is)")
    folds = groups * -(-sr // rows) * -(-sc // cols)
    return folds * (t + extra) - 1


def systolic_gemm(x, d, code: int, mx, mn):
    """Time of GEMM-like ops ``x`` (a feature tuple, or a list of numpy feature columns) on the
    systolic design ``d`` (:class:`~marssim.cost.features.DesignParams`) whose dataflow code is
    ``code`` (0 os, 1 ws, 2 is). ``mx``/``mn`` are ``max``/``min`` or their numpy versions.

    Returns ``(time, compute_time, memory_time, cycles, sram_bytes, dram_bytes)`` (s, s, s,
    cycles, bytes, bytes)."""
    R, C = d.rows, d.cols
    g, m, n, k = x[F_G], x[F_M], x[F_NN], x[F_KK]
    eb = x[F_EB]
    a_e, b_e, o_e = g * m * k, g * k * n, g * m * n
    a_b, b_b, o_b = x[F_AB], x[F_BB], x[F_OB]
    half = 0.5 * d.sram
    if code == 0:  # output-stationary
        fr, fc = -(-m // R), -(-n // C)
        cycles = g * fr * fc * (k + R + C - 2) - 1
        sram_e = a_e * fc + b_e * fr + o_e
        extra = refetch(a_b, fc, b_b, half, mn) + refetch(b_b, fr, a_b, half, mn)
    else:
        fk = -(-k // R)
        psum = o_e * (2 * fk - 1)
        if code == 1:  # weight-stationary
            fc = -(-n // C)
            cycles = g * fk * fc * (m + 2 * R + C - 2) - 1
            sram_e = b_e + a_e * fc + psum
            extra = refetch(a_b, fc, b_b, half, mn) + psum_refetch(o_b, fk, b_b, half, mn)
        else:  # input-stationary
            fc = -(-m // C)
            cycles = g * fk * fc * (n + 2 * R + C - 2) - 1
            sram_e = a_e + b_e * fc + psum
            extra = refetch(b_b, fc, a_b, half, mn) + psum_refetch(o_b, fk, a_b, half, mn)
    sram_b = sram_e * eb
    dram_b = x[F_TRAFFIC] + extra
    compute = cycles / d.clock
    memory = mx(sram_b / d.sram_bw, dram_b / d.dram_bw)
    return mx(compute, memory), compute, memory, cycles, sram_b, dram_b
