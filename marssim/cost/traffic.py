"""On-chip buffers and off-chip traffic of PE-array designs: what is refetched, spilled and stalled.

An op's operands live in DRAM; the design's buffers (:mod:`marssim.system.buffers`) hold the
part the array works on. Each operand ``X`` has a *window* ``w_X`` of bytes that can stay
resident while the array computes (half its buffer when double-buffered). This module turns a
dataflow's loop order and those windows into DRAM reads and writes per operand, and those bytes
into time with the compute they overlap.

**Refetch.** A dataflow streams one operand ``S`` through the array once per iteration of its
outer fold loop (``F`` iterations) and reuses a tile of the other (``T``) across its inner loop
(``I`` iterations). ``S`` is read from DRAM once if it can stay resident (``r_S``: its whole
buffer; a window under the ``scalesim`` convention), else once per outer iteration; a tile of
``T`` (``T / F``) once if it fits its window, else once per inner iteration::

    S_dram = S                 if S <= r_S   else F * S
    T_dram = T                 if T/F <= w_T else I * T

**Partial sums** (weight- and input-stationary arrays accumulate over ``f_k = ceil(K / rows)``
folds): the block accumulated per outer iteration (``O / F``) stays in the ofmap buffer when it
fits (written once), else every fold writes it and every fold but the first reads it back:
``f_k * O`` written, ``(f_k - 1) * O`` read.

**Stalls.** The array waits whenever DRAM cannot deliver a fold's data during the fold. With
double buffering, one outer iteration is a phase whose time is ``max(compute, DRAM)``; the first
iteration (*cold*) also reads the streamed operand the first time, the others (*warm*) only what
does not stay resident, so an operand that fits costs DRAM time once rather than being averaged
over the op. Before the first fold the array waits for the first window of each input (*fill*,
plus the DRAM latency); after the last it waits for the last output block (*drain*)::

    time = fill + G * (max(c_cold, d_cold) + max(c_warm, d_warm)) + drain

where ``G`` counts independent GEMMs (groups, heads), ``c`` is compute time and ``d`` the DRAM
time of the phase's bytes: their sum over the design's ``dram_bandwidth`` with one shared
channel, or the largest operand's bytes over it with a channel per buffer. Without double
buffering nothing overlaps: ``time = G * (compute + DRAM) + latency * refills`` (a refill per
window of each operand's DRAM bytes).

The functions here are written once for scalars (``mx``/``mn`` = ``max``/``min``) and for numpy
columns (``numpy.maximum``/``numpy.minimum``), like every cost formula in this package.
"""

from __future__ import annotations

__all__ = ["reuse", "psums", "overlap", "refetch", "channel_time", "sel", "scalesim_reads"]


def sel(cond, a, b):
    """``a`` where ``cond`` else ``b`` (``cond`` a bool or a numpy bool array)."""
    return b + cond * (a - b)


def reuse(s_bytes, r_s, outer, t_bytes, w_t, inner):
    """DRAM bytes of the streamed operand (``s_bytes``, resident when at most ``r_s``, else
    streamed once per each of ``outer`` iterations) and of the reused one (``t_bytes``, window
    ``w_t``, a tile of ``t_bytes / outer`` reused over ``inner`` iterations): ``(s_dram, t_dram)``."""
    s_dram = s_bytes + (s_bytes > r_s) * (outer - 1) * s_bytes
    t_dram = t_bytes + (t_bytes > w_t * outer) * (inner - 1) * t_bytes
    return s_dram, t_dram


def psums(o_bytes, w_o, outer, k_folds, write_through: bool):
    """``(written, read)`` DRAM bytes of an output of ``o_bytes`` accumulated over ``k_folds``
    folds, a block of ``o_bytes / outer`` at a time. ``write_through`` (SCALE-Sim's convention):
    every fold's partial outputs are written and never read back."""
    if write_through:
        return o_bytes * k_folds, 0 * o_bytes
    spill = o_bytes > w_o * outer
    return o_bytes + spill * (k_folds - 1) * o_bytes, spill * (k_folds - 1) * o_bytes


def channel_time(a, b, o, d, mx):
    """Seconds DRAM needs for ``a``, ``b``, ``o`` bytes of the three operands on design ``d``:
    one shared channel (sum) or one per buffer (the largest)."""
    if d.per_operand:
        return mx(mx(a, b), o) / d.dram_bw
    return (a + b + o) / d.dram_bw


def overlap(d, g, compute, cold_frac, cold, warm, fill, drain, mx):
    """``(time, dram_time)`` of an op of ``g`` groups taking ``compute`` seconds of array time on
    design ``d``. Per group, ``cold_frac`` of the compute is the cold phase; ``cold``/``warm`` are
    the phases' DRAM bytes ``(ifmap, filter, ofmap)``; ``fill`` = bytes of each input read
    before the first fold (ifmap, filter), ``drain`` = output bytes written after the last.
    ``dram_time`` is the time of the traffic alone. The fill and the drain are taken out of the
    phases (spread evenly over the groups) and paid apart; with no DRAM time the result is
    ``compute`` exactly."""
    ac, bc, oc = cold
    aw, bw_, ow = warm
    fa, fb = fill
    fa_g, fb_g, dr_g = fa / g, fb / g, drain / g
    ac2, bc2 = mx(ac - fa_g, 0), mx(bc - fb_g, 0)
    aw2, bw2 = aw - mx(fa_g - ac, 0), bw_ - mx(fb_g - bc, 0)
    ow2 = mx(ow - dr_g, 0)
    oc2 = oc - mx(dr_g - ow, 0)
    t_fill = channel_time(fa, fb, 0, d, mx) + d.dram_latency
    t_drain = channel_time(0, 0, drain, d, mx)
    d_cold = channel_time(ac2, bc2, oc2, d, mx)
    d_warm = channel_time(aw2, bw2, ow2, d, mx)
    dram_time = t_fill + g * (d_cold + d_warm) + t_drain
    if not d.double_buffered:  # every refill of a buffer waits for DRAM, latency included
        refills = g * (-(-(ac + aw) // d.wi) + -(-(bc + bw_) // d.wf) + -(-(oc + ow) // d.wo))
        return compute + dram_time + d.dram_latency * refills, dram_time
    c_group = compute / g
    c_cold = c_group * cold_frac
    stall = mx(d_cold - c_cold, 0) + mx(d_warm - (c_group - c_cold), 0)
    return compute + t_fill + g * stall + t_drain, dram_time


def refetch(x_bytes, passes, y_bytes, r_x):
    """Extra DRAM bytes ``(for X, for Y)`` when operand X (``x_bytes``) is needed ``passes``
    times and stays resident up to ``r_x`` bytes: none if it fits, else the cheaper of
    streaming X from DRAM on every pass (``(passes - 1) * X``) and cutting X into chunks that
    stay resident, finishing every pass on a chunk before the next, which streams the partner Y
    once per chunk (``(ceil(X / r_x) - 1) * Y``). Used by the loop-mapping dataflows."""
    again = (x_bytes > r_x) * (passes - 1) * x_bytes
    chunked = (x_bytes > r_x) * (-(-x_bytes // r_x) - 1) * y_bytes
    take_x = again <= chunked
    return take_x * again, (1 - take_x) * chunked


def scalesim_reads(valid, fetch, passes, cap, bw, mx, mn):
    """Words SCALE-Sim 3.0.0's double-buffered read buffer of ``cap`` words fetches from DRAM at
    ``bw`` words per cycle for an operand whose prefetch sequence holds ``valid`` words
    (``fetch`` with the padding of partial folds) and is demanded ``passes`` times in order
    (``memory/read_buffer.py``). The buffer is 100 lines; the active window is the first half;
    before the first cycle it loads the active window (or the whole sequence when shorter), and
    each time the array needs a line past the window it slides by the prefetch half, or by the
    lines left when the sequence is shorter than the buffer, and is charged a whole prefetch
    half either way::

        lines = ceil(valid / ceil(cap / 100)),  A = min(50, lines),  P = min(50, lines - A)
        words = min(half, fetch) + ceil((passes * lines - A) / P) * half     (rounded up to bw)

    An operand that fits the active window (``P = 0``) is fetched once whatever ``passes``."""
    per_line = -(-cap // 100)
    active = -(-cap // 2)
    prefetch = cap - active
    lines = -(-valid // per_line)
    a = mn(-(-active // per_line), lines)
    p = mn(-(-prefetch // per_line), lines - a)
    initial = mn(-(-active // bw), -(-fetch // bw)) * bw
    slides = (p > 0) * -(-mx(passes * lines - a, 0) // mx(p, 1))
    return initial + slides * (-(-prefetch // bw) * bw), initial
