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

Traffic model (bytes; operands in the op's dtype, partial sums too). Buffer side, in the im2col
view: the stationary operand is read once; a streamed operand is re-read once per fold of the
spatial dim it is not indexed by; outputs are written once (os), or, for ws/is, written
``ceil(K/R)`` times and read back ``ceil(K/R) - 1`` times as partial sums::

    os: A * ceil(N/C) + B * ceil(M/R) + O
    ws: B + A * ceil(N/C) + O * (2 ceil(K/R) - 1)
    is: A + B * ceil(M/C) + O * (2 ceil(K/R) - 1)

with ``A = G*M*K``, ``B = G*K*N``, ``O = G*M*N`` elements. DRAM side, per group, by the fold
order (outer loop first) and the operand windows of :mod:`marssim.cost.traffic`:

==  ============================  ==========  ==============================  ==================
df  fold order                    streamed    reused (tile per outer iter.)   partial sums
==  ============================  ==========  ==============================  ==================
os  N folds, then M folds         A (F=f_n)   B (K x C, over f_m)             none
ws  N folds, then K folds         A (F=f_n)   B tiles, each used once         O / f_n per iter.
is  M folds (of C), then K folds  B (F=f_mc)  A tiles, each used once         O / f_mc per iter.
==  ============================  ==========  ==============================  ==================

Under the ``marssim`` convention the cheaper of that order and one alternative is taken: os
swaps its two loops (B streamed, A rows reused); ws tiles M so that a chunk of A and its
partial-sum block fit (A and the outputs then move once, B once per chunk); is tiles N likewise
(B once, A once per chunk). ``A`` on the DRAM side is the input tensor (an input element once
per pass; a strided 1x1 convolution reads only the pixels it uses), or, under ``convention:
scalesim``, the im2col matrix. Time: :func:`marssim.cost.traffic.overlap` over the cold and warm
phases, then at least the buffer bytes over ``sram_bandwidth``.
"""

from __future__ import annotations

import math

from .features import F_AE, F_EB, F_G, F_KK, F_M, F_NN
from .traffic import overlap, psums, reuse, scalesim_reads, sel

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

    Returns ``(time, compute_time, memory_time, cycles, sram_read, sram_write, dram_read,
    dram_write)`` (s, s, s, cycles, then bytes)."""
    R, C = d.rows, d.cols
    g, m, n, k = x[F_G], x[F_M], x[F_NN], x[F_KK]
    eb = x[F_EB]
    a_e, b_e, o_e = m * k, k * n, m * n  # per group
    sa = (a_e if d.im2col else mn(x[F_AE] // g, a_e)) * eb
    sb, so = b_e * eb, o_e * eb
    wi, wf, wo = d.wi, d.wf, d.wo
    zero = 0 * sa
    if code == 0:  # output-stationary
        fm, fn = -(-m // R), -(-n // C)
        cycles_g = fm * fn * (k + R + C - 2)
        sram_rd, sram_wr = a_e * fn + b_e * fm, o_e
        if d.fixed_order:  # SCALE-Sim's prefetches: whole halves of a buffer
            b_passes = 1 + (sb > wf * fn) * (fm - 1)  # a K x C tile larger than a window: once per M fold
            fixed, fill = _scalesim(d, fn, (sa, k * R * fm * eb, fn), (sb, k * C * fn * eb, b_passes), (so, zero),
                                    mx, mn)
        else:
            # N outer: A streamed, B column tiles reused over M folds
            a1, b1 = reuse(sa, d.ri, fn, sb, wf, fm)
            fixed = (1 / fn, (sa, b1 / fn, so / fn), (a1, b1, so), (so, zero))
            # M outer: B streamed, A row tiles reused over N folds
            b2, a2 = reuse(sb, d.rf, fm, sa, wi, fn)
            alts = [(True, (1 / fm, (a2 / fm, sb, so / fm), (a2, b2, so), (so, zero)))]
            first = (R * eb, C * eb)  # the first elements on the array's edges
        block = mn(R * C * eb, so)  # the last output tile
    else:
        fk = -(-k // R)
        if code == 1:  # weight-stationary: A streamed per N fold, B tiles once
            outer = -(-n // C)
            cycles_g = fk * outer * (m + 2 * R + C - 2)
            s_b, r_s, w_s, t_b, spatial = sa, d.ri, wi, sb, m
            sram_rd = b_e + a_e * outer + o_e * (fk - 1)
            first = (R * eb, R * C * eb)  # the stationary R x C tile of B, a row of A
        else:  # input-stationary: B streamed per M fold, A tiles once
            outer = -(-m // C)
            cycles_g = fk * outer * (n + 2 * R + C - 2)
            s_b, r_s, w_s, t_b, spatial = sb, d.rf, wf, sa, n
            sram_rd = a_e + b_e * outer + o_e * (fk - 1)
            first = (R * C * eb, R * eb)  # the stationary R x C tile of A, a column of B
        sram_wr = o_e * fk
        psum = psums(so, wo, outer, fk, d.write_through)
        if d.fixed_order:  # SCALE-Sim's prefetches: whole halves of a buffer
            if code == 1:
                reads = ((sa, m * R * fk * eb, outer), (sb, k * C * outer * eb, 1))
            else:
                reads = ((sa, k * C * outer * eb, 1), (sb, n * R * fk * eb, outer))
            fixed, fill = _scalesim(d, outer, *reads, psum, mx, mn)
        else:
            s1, _ = reuse(s_b, r_s, outer, t_b, 1, 1)
            o1 = psum[0] + psum[1]
            # the fold order; or the streamed dim (ws: M, is: N) cut into chunks whose part of the
            # streamed operand fits a window (the next chunk is fetched behind it) and whose
            # partial-sum block (C columns of it) fits the ofmap window: the stationary operand is
            # then read once per chunk, the rest once, and only the first chunk's first fold waits
            # for its part of the streamed operand
            lines = mn(mn(w_s * spatial // mx(s_b, 1), wo // (C * eb)), spatial)
            c_min = sel(lines >= 1, -(-spatial // mx(lines, 1)), spatial + 1)  # spatial + 1: none fits
            fixed = _ab(code, 1 / outer, (s_b, t_b / outer, o1 / outer), (s1, t_b, o1), psum)
            # more chunks than the fewest shorten that first wait and cost one more read of the
            # stationary operand each: the fastest of 1, 4, 16, ... chunks (those not below the
            # fewest that fit), a ladder that does not depend on the buffer, so that a larger
            # buffer has every choice a smaller one has
            alts = []
            c = 1
            while True:
                alts.append((c >= c_min, _ab(code, 1 / (c * outer), (s_b / c, t_b / outer, so / (c * outer)),
                                             (s_b, t_b * c, so), (so, zero))))
                if not _any(c * CHUNK_LADDER <= spatial):
                    break
                c = c * CHUNK_LADDER
        block = so / outer  # the outputs of the last outer iteration
    cycles = g * cycles_g - 1
    compute = cycles / d.clock
    if not d.fixed_order:  # what the first cycle needs; the rest of the first fold streams in its cold phase
        fill = (mn(mn(first[0], sa), wi), mn(mn(first[1], sb), wf))
    if d.write_through:  # SCALE-Sim drains its ofmap buffer a window at a time; the rest at the end
        o_all = g * fixed[3][0]
        drain = o_all - wo * (-(-o_all // wo) - 1)
    else:
        drain = mn(block, wo)
    t, dram_time = _time(d, g, compute, fixed, fill, drain, mx)
    totals, o_wr, o_rd = fixed[2], fixed[3][0], fixed[3][1]
    if not d.fixed_order:  # the fastest of the alternatives
        for feasible, alt in alts:
            if not _any(feasible):  # no op may take it: nothing to compare
                continue
            t2, dram_time2 = _time(d, g, compute, alt, fill, drain, mx)
            faster = feasible * (t2 < t)
            t, dram_time = sel(faster, t2, t), sel(faster, dram_time2, dram_time)
            totals = tuple(sel(faster, p, q) for p, q in zip(alt[2], totals))
            o_wr, o_rd = sel(faster, alt[3][0], o_wr), sel(faster, alt[3][1], o_rd)
    sram_array = (sram_rd + sram_wr) * g * eb
    t = mx(t, sram_array / d.sram_bw)
    memory = mx(dram_time, sram_array / d.sram_bw)
    dram_rd, dram_wr = g * (totals[0] + totals[1] + o_rd), g * o_wr
    return t, compute, memory, cycles, sram_rd * g * eb + dram_wr, sram_wr * g * eb + dram_rd, dram_rd, dram_wr


CHUNK_LADDER = 4
"""Chunk counts tried when the streamed dim of a ws/is array is tiled: 1, 4, 16, ..."""


def _any(cond) -> bool:
    """``cond`` for a scalar, ``cond.any()`` for a numpy array."""
    return bool(cond.any()) if hasattr(cond, "any") else bool(cond)


def _scalesim(d, outer, a, b, psum, mx, mn):
    """SCALE-Sim's schedule and fill: each input ``(valid bytes, bytes with padding, passes)``
    read in whole prefetch halves (:func:`marssim.cost.traffic.scalesim_reads`), spread evenly
    over the ``outer`` iterations after the first window of each (the fill)."""
    bw = d.dram_bw / d.clock if math.isfinite(d.dram_bw) else 1.0  # bytes per cycle (the rounding only)
    a_t, a_fill = scalesim_reads(a[0], a[1], a[2], d.ci, bw, mx, mn)
    b_t, b_fill = scalesim_reads(b[0], b[1], b[2], d.cf, bw, mx, mn)
    o_t = psum[0] + psum[1]
    cold = (a_fill + (a_t - a_fill) / outer, b_fill + (b_t - b_fill) / outer, o_t / outer)
    return (1 / outer, cold, (a_t, b_t, o_t), psum), (a_fill, b_fill)


def _ab(code, frac, cold, total, psum):
    """A schedule ``(cold fraction, cold bytes, total bytes, (o written, o read))`` with bytes as
    (ifmap, filter, ofmap), from (streamed, stationary, output) of a ws (code 1) or is array."""
    if code == 1:
        return frac, cold, total, psum
    return frac, (cold[1], cold[0], cold[2]), (total[1], total[0], total[2]), psum


def _time(d, g, compute, schedule, fill, drain, mx):
    """``(time, dram_time)`` of a schedule ``(cold fraction, cold bytes, total bytes, _)`` (bytes
    per group as (ifmap, filter, ofmap)); see :func:`marssim.cost.traffic.overlap`."""
    frac, cold, total, _ = schedule
    warm = tuple(t - c for t, c in zip(total, cold))
    return overlap(d, g, compute, frac, cold, warm, fill, drain, mx)
