"""Systolic arrays: the fold formulas against a cycle-level register model of the array.

The reference below moves operands through the PE registers cycle by cycle (skewed edges,
one hop per cycle, partial sums flowing down for ws/is) and checks that the schedule really
computes ``A @ B``; its cycle count is the index of the last MAC of the last fold, with folds
back to back. It shares no code with ``marssim.cost.systolic``.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from marssim.cost import OpCost, SystolicCost, fold_cycles
from marssim.mapping.sharding import split_sizes
from marssim.system import Design
from marssim.workload import GraphBuilder

RNG = np.random.default_rng(7)


# ----------------------------------------------------------------------------- reference model
def _os_fold(a_tile: np.ndarray, b_tile: np.ndarray, rows: int, cols: int) -> tuple[np.ndarray, int]:
    """Output-stationary fold: A tile (rows x T) enters from the left, B tile (T x cols) from
    the top, both skewed by one cycle per row/column. Returns (accumulators, cycles of the fold)."""
    t_len = a_tile.shape[1]
    a_val = np.zeros((rows, cols)); a_ok = np.zeros((rows, cols), bool)
    b_val = np.zeros((rows, cols)); b_ok = np.zeros((rows, cols), bool)
    acc = np.zeros((rows, cols))
    last = -1
    cycle = 0
    while True:
        # shift one hop: A to the right, B down; feed the edges
        a_val[:, 1:] = a_val[:, :-1].copy(); a_ok[:, 1:] = a_ok[:, :-1].copy()
        b_val[1:, :] = b_val[:-1, :].copy(); b_ok[1:, :] = b_ok[:-1, :].copy()
        for i in range(rows):
            t = cycle - i
            a_ok[i, 0] = 0 <= t < t_len
            a_val[i, 0] = a_tile[i, t] if a_ok[i, 0] else 0.0
        for j in range(cols):
            t = cycle - j
            b_ok[0, j] = 0 <= t < t_len
            b_val[0, j] = b_tile[t, j] if b_ok[0, j] else 0.0
        fire = a_ok & b_ok
        if fire.any():
            acc += np.where(fire, a_val * b_val, 0.0)
            last = cycle
        elif cycle > t_len + rows + cols:
            break
        cycle += 1
    return acc, last + 1


def _ws_fold(stationary: np.ndarray, stream: np.ndarray, rows: int, cols: int) -> tuple[np.ndarray, int]:
    """Weight-stationary fold: ``stationary`` (rows x cols) is shifted in from the top, one row
    per cycle (``rows`` cycles); then row i of ``stream`` (T x rows) enters row i of the array
    skewed by i cycles and moves right; partial sums move down and leave the bottom row.
    Returns (outputs T x cols, cycles of the fold)."""
    t_len = stream.shape[0]
    w = np.zeros((rows, cols))
    cycle = 0
    last = -1
    for step in range(rows):  # load: after `rows` cycles row i holds stationary[i]
        w[1:, :] = w[:-1, :].copy()
        w[0, :] = stationary[rows - 1 - step, :]
        last = cycle
        cycle += 1
    a_val = np.zeros((rows, cols)); a_ok = np.zeros((rows, cols), bool)
    p_val = np.zeros((rows, cols)); p_idx = np.full((rows, cols), -1)
    out = np.zeros((t_len, cols))
    start = cycle
    while True:
        tau = cycle - start
        # partial sums computed last cycle move one row down; the bottom row's leave
        leaving_val, leaving_idx = p_val[rows - 1, :].copy(), p_idx[rows - 1, :].copy()
        for j in range(cols):
            if leaving_idx[j] >= 0:
                out[leaving_idx[j], j] = leaving_val[j]
        p_in_val = np.zeros((rows, cols)); p_in_idx = np.full((rows, cols), -1)
        p_in_val[1:, :] = p_val[:-1, :]; p_in_idx[1:, :] = p_idx[:-1, :]
        a_val[:, 1:] = a_val[:, :-1].copy(); a_ok[:, 1:] = a_ok[:, :-1].copy()
        a_idx_edge = []
        for i in range(rows):
            t = tau - i
            a_ok[i, 0] = 0 <= t < t_len
            a_val[i, 0] = stream[t, i] if a_ok[i, 0] else 0.0
            a_idx_edge.append(t)
        # which stream row each PE sees: the one that entered its row (cycle - column) ago
        fire = a_ok
        new_val = np.zeros((rows, cols)); new_idx = np.full((rows, cols), -1)
        for i in range(rows):
            for j in range(cols):
                if fire[i, j]:
                    m_index = tau - i - j
                    base = p_in_val[i, j] if i > 0 else 0.0
                    if i > 0:
                        assert p_in_idx[i, j] == m_index, "partial sum and input out of step"
                    new_val[i, j] = base + a_val[i, j] * w[i, j]
                    new_idx[i, j] = m_index
                    last = cycle
        p_val, p_idx = new_val, new_idx
        if not fire.any() and (p_idx < 0).all() and tau > t_len + rows + cols:
            break
        cycle += 1
    return out, last + 1


def simulate(dataflow: str, rows: int, cols: int, a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, int]:
    """Run ``a @ b`` (G x M x K times G x K x N) fold by fold; returns (product, index of the
    last busy cycle), folds back to back, tiles zero-padded to the whole array."""
    g_count, m, k = a.shape
    n = b.shape[2]
    out = np.zeros((g_count, m, n))
    total = 0
    for g in range(g_count):
        if dataflow == "os":
            for r0 in range(0, m, rows):
                for c0 in range(0, n, cols):
                    at = np.zeros((rows, k)); bt = np.zeros((k, cols))
                    at[:min(rows, m - r0)] = a[g, r0:r0 + rows]
                    bt[:, :min(cols, n - c0)] = b[g, :, c0:c0 + cols]
                    acc, cyc = _os_fold(at, bt, rows, cols)
                    out[g, r0:r0 + rows, c0:c0 + cols] = acc[:min(rows, m - r0), :min(cols, n - c0)]
                    total += cyc
        elif dataflow == "ws":  # stationary: B tile (K rows x N cols); stream: A (M x K)
            for k0 in range(0, k, rows):
                for c0 in range(0, n, cols):
                    wt = np.zeros((rows, cols)); st = np.zeros((m, rows))
                    wt[:min(rows, k - k0), :min(cols, n - c0)] = b[g, k0:k0 + rows, c0:c0 + cols]
                    st[:, :min(rows, k - k0)] = a[g, :, k0:k0 + rows]
                    part, cyc = _ws_fold(wt, st, rows, cols)
                    out[g, :, c0:c0 + cols] += part[:, :min(cols, n - c0)]
                    total += cyc
        else:  # is: stationary A^T tile (K rows x M cols); stream: B^T (N x K)
            for k0 in range(0, k, rows):
                for c0 in range(0, m, cols):
                    xt = np.zeros((rows, cols)); st = np.zeros((n, rows))
                    xt[:min(rows, k - k0), :min(cols, m - c0)] = a[g, c0:c0 + cols, k0:k0 + rows].T
                    st[:, :min(rows, k - k0)] = b[g, k0:k0 + rows, :].T
                    part, cyc = _ws_fold(xt, st, rows, cols)  # part: N x cols = (A B)^T slice
                    out[g, c0:c0 + cols, :] += part[:, :min(cols, m - c0)].T
                    total += cyc
    return out, total - 1


# (rows, cols, groups, M, N, K): square, skinny, tiny, larger than the array in every dim
SHAPES = [
    (4, 4, 1, 8, 8, 8), (4, 4, 1, 4, 4, 4), (3, 3, 1, 3, 3, 3),                       # square
    (4, 4, 1, 1, 37, 5), (4, 4, 1, 37, 1, 5), (4, 4, 1, 3, 3, 50), (3, 5, 1, 64, 2, 2),  # skinny
    (4, 4, 1, 1, 1, 1), (8, 8, 1, 2, 3, 1), (1, 1, 1, 3, 4, 5), (2, 2, 1, 1, 2, 1),     # tiny
    (4, 4, 1, 9, 13, 11), (3, 5, 1, 17, 11, 7), (5, 3, 1, 10, 10, 10), (2, 7, 1, 15, 8, 9),
    (6, 6, 1, 13, 19, 7), (8, 2, 1, 9, 5, 17), (1, 6, 1, 7, 13, 3), (6, 1, 1, 5, 4, 13),  # larger
    (4, 4, 3, 5, 1, 9), (3, 4, 2, 7, 6, 5),                                             # grouped
]


@pytest.mark.parametrize("dataflow", ["os", "ws", "is"])
@pytest.mark.parametrize("rows,cols,groups,m,n,k", SHAPES)
def test_fold_formula_matches_cycle_level_model(dataflow, rows, cols, groups, m, n, k):
    a = RNG.integers(-3, 4, size=(groups, m, k)).astype(float)
    b = RNG.integers(-3, 4, size=(groups, k, n)).astype(float)
    product, cycles = simulate(dataflow, rows, cols, a, b)
    np.testing.assert_array_equal(product, a @ b)  # the schedule computes the GEMM
    assert fold_cycles(dataflow, rows, cols, m, n, k, groups) == cycles


def _design(dataflow: str, rows: int, cols: int, **kw) -> Design:
    spec = dict(name="t", dataflow=dataflow, pe_rows=rows, pe_cols=cols, clock=1e9, sram=2.0**30,
                sram_bandwidth=1e18, dram_bandwidth=None)
    spec.update(kw)
    return Design(**spec)


def _gemm_op(m: int, n: int, k: int, batch: int = 1):
    b = GraphBuilder("g", batch=batch)
    x = b.input("x", c=k, h=m)
    b.linear("fc", x, n, bias=False)
    return b.build().op("fc")


@pytest.mark.parametrize("dataflow", ["os", "ws", "is"])
def test_cost_model_cycles_are_the_fold_cycles_of_the_gemm(dataflow):
    """A gemm op through the whole cost model: cycles equal the simulated count, and with
    unbounded bandwidth the time is cycles / clock."""
    model = SystolicCost()
    for rows, cols, _, m, n, k in SHAPES[:19]:
        a = np.ones((1, m, k)); b = np.ones((1, k, n))
        _, cycles = simulate(dataflow, rows, cols, a, b)
        cost = model.op_cost(_gemm_op(m, n, k), _design(dataflow, rows, cols))
        assert cost.cycles == cycles
        assert cost.compute_time == pytest.approx(cycles / 1e9, rel=1e-15)
        assert cost.time == cost.compute_time


def _conv(n, c, h, w, k, kernel, stride, pad, groups=1):
    b = GraphBuilder("c", batch=n)
    x = b.input("x", c=c, h=h, w=w)
    b.conv("conv", x, k, kernel, stride=stride, pad=pad, groups=groups)
    return b.build().op("conv")


CONVS = [  # (n, c, h, w, k, kernel, stride, pad, groups)
    (1, 3, 7, 7, 4, 3, 1, 1, 1), (2, 2, 5, 6, 3, 3, 2, 1, 1), (1, 4, 4, 4, 5, 1, 1, 0, 1),
    (1, 6, 5, 5, 6, 3, 1, 1, 6),  # depthwise
    (1, 4, 5, 5, 4, 3, 1, 0, 2),  # grouped
]


@pytest.mark.parametrize("dataflow", ["os", "ws", "is"])
@pytest.mark.parametrize("conv", CONVS)
def test_conv_is_timed_as_its_im2col_gemm(dataflow, conv):
    """im2col dims computed here from the conv definition: M = N*P*Q, N = K/G, K = C/G*R*S, with
    G GEMMs (a depthwise conv: one per channel, N = 1)."""
    n, c, h, w, k, kernel, stride, pad, groups = conv
    p = (h + 2 * pad - kernel) // stride + 1
    q = (w + 2 * pad - kernel) // stride + 1
    gm, gn, gk = n * p * q, k // groups, c // groups * kernel * kernel
    a = np.ones((groups, gm, gk)); b = np.ones((groups, gk, gn))
    _, cycles = simulate(dataflow, 4, 3, a, b)
    op = _conv(n, c, h, w, k, kernel, stride, pad, groups)
    assert SystolicCost().op_cost(op, _design(dataflow, 4, 3)).cycles == cycles


SIM_DESIGNS = [
    _design("os", 16, 16, sram_bandwidth=64e9, dram_bandwidth=8e9, sram=256 * 1024),
    _design("ws", 32, 8, sram_bandwidth=128e9, dram_bandwidth=16e9, sram=64 * 1024),
    _design("is", 8, 32, sram_bandwidth=32e9, dram_bandwidth=4e9, sram=1 << 20),
]


def _random_ops(count: int, seed: int = 3):
    rng = np.random.default_rng(seed)
    ops = []
    for _ in range(count):
        if rng.random() < 0.5:
            ops.append(_gemm_op(int(rng.integers(1, 600)), int(rng.integers(1, 600)), int(rng.integers(1, 600)),
                                int(rng.integers(1, 4))))
        else:
            c = int(rng.integers(1, 64))
            dw = rng.random() < 0.3
            ops.append(_conv(int(rng.integers(1, 3)), c, int(rng.integers(4, 40)), int(rng.integers(4, 40)),
                             c if dw else int(rng.integers(1, 128)), int(rng.choice([1, 3, 5])),
                             int(rng.choice([1, 2])), 1, c if dw else 1))
    return ops


def test_roofline_bound():
    """Never faster than the PE array's peak, than the op's DRAM traffic over the DRAM bandwidth,
    or than the compulsory traffic over the buffer bandwidth; the DRAM traffic is at least the
    weights, the output and every input pixel a window touches, read or written once."""
    model = SystolicCost()
    for op in _random_ops(120):
        used_input = _used_input_bytes(op)
        for d in SIM_DESIGNS:
            cost = model.op_cost(op, d)
            assert cost.time >= op.macs / (d.pes * d.clock) * (1 - 1e-12)
            assert cost.dram_bytes >= (op.weight_bytes + op.output_bytes + used_input) * (1 - 1e-12)
            assert cost.time >= cost.dram_bytes / d.dram_bandwidth * (1 - 1e-12)
            assert cost.time >= op.bytes_moved / d.sram_bandwidth * (1 - 1e-12)
            assert 0 < cost.utilisation <= 1 + 1e-12


def _used_input_bytes(op) -> int:
    """Bytes of the input pixels some window of ``op`` reads (a strided 1x1 convolution skips
    the others), by marking them; for GEMMs the whole input."""
    if op.kind.value != "conv":
        return op.input_bytes
    n, c, h, w = op.in_shapes[0]
    (sh, sw), (pt, pl, _, _) = op.param("stride"), op.param("pad")
    used = np.zeros((h, w), dtype=bool)
    for p in range(op.dim("P")):
        for q in range(op.dim("Q")):
            for r in range(op.dim("R")):
                for s in range(op.dim("S")):
                    y, x = p * sh + r - pt, q * sw + s - pl
                    if 0 <= y < h and 0 <= x < w:
                        used[y, x] = True
    return int(used.sum()) * n * c * op.input_bytes // (n * c * h * w)


def test_more_bandwidth_is_never_slower():
    model = SystolicCost()
    for op in _random_ops(80, seed=5):
        for d in SIM_DESIGNS:
            base = model.op_time(op, d)
            for update in ({"sram_bandwidth": d.sram_bandwidth * 2}, {"dram_bandwidth": d.dram_bandwidth * 3},
                           {"sram": d.sram * 4}):
                # 1e-12: a larger buffer may reach the same schedule through other roundings
                assert model.op_time(op, d.model_copy(update=update)) <= base * (1 + 1e-12)


def test_more_pes_never_slower_for_compute_bound_ops():
    """Scaling the array by whole factors never slows an op whose GEMM dims all reach the larger
    array (compute-bound: unbounded bandwidth). For smaller GEMMs a bigger array can be slower,
    because the skew fill grows with the array (next test)."""
    model = SystolicCost()
    rng = np.random.default_rng(11)
    checked = 0
    for _ in range(150):
        rows, cols = int(rng.integers(2, 9)), int(rng.integers(2, 9))
        fr, fc = int(rng.integers(1, 4)), int(rng.integers(1, 4))
        lo = max(rows * fr, cols * fc)
        m, n, k = (int(v) for v in rng.integers(lo, 5 * lo, size=3))
        op = _gemm_op(m, n, k)
        for df in ("os", "ws", "is"):
            small = model.op_cost(op, _design(df, rows, cols)).time
            large = model.op_cost(op, _design(df, rows * fr, cols * fc)).time
            assert large <= small, (df, rows, cols, fr, fc, m, n, k)
            checked += 1
    assert checked == 450


def test_a_larger_array_is_slower_on_a_tiny_gemm():
    """The cycle-level model agrees that fill latency grows with the array (1x1x1 GEMM)."""
    one = np.ones((1, 1, 1))
    for df in ("os", "ws", "is"):
        _, small = simulate(df, 2, 2, one, one)
        _, large = simulate(df, 6, 6, one, one)
        assert large > small
        assert fold_cycles(df, 6, 6, 1, 1, 1) == large


def test_flops_and_macs_are_conserved_across_shards():
    """Splitting an op along any loop dim keeps its FLOPs; the cost model's MAC accounting
    (utilisation x time x peak) and MAC energy add up to the whole op's."""
    energy = {"mac": 1e-12}
    d = _design("ws", 8, 8, energy=energy, sram_bandwidth=1e18, dram_bandwidth=1e18)
    model = SystolicCost()
    ops = [_conv(4, 16, 14, 14, 32, 3, 1, 1), _gemm_op(64, 48, 40, batch=3), _conv(2, 8, 9, 9, 8, 3, 1, 1, 8)]
    for op in ops:
        whole = model.op_cost(op, d)
        for dim, _ in op.loops:
            if op.dim(dim) < 2 or dim in ("R", "S") or (dim == "C" and op.param("depthwise")):
                continue
            for parts in (2, 3):
                shards = [op.with_loops(**{dim: s}) for s in split_sizes(op.dim(dim), parts) if s > 0]
                assert sum(s.flops for s in shards) == op.flops
                costs = [model.op_cost(s, d) for s in shards]
                macs = sum(c.utilisation * c.time * d.pes * d.clock for c in costs)
                assert macs == pytest.approx(op.macs, rel=1e-12)
                assert sum(c.energy for c in costs) == pytest.approx(whole.energy, rel=1e-12)


def test_memory_bound_layer_takes_its_traffic_time():
    """A batch-1 FC layer on a slow memory: time is the compulsory weight traffic over DRAM."""
    d = _design("ws", 32, 32, sram_bandwidth=1e15, dram_bandwidth=1e9)
    op = _gemm_op(1, 1024, 1024)
    cost = SystolicCost().op_cost(op, d)
    assert cost.time == pytest.approx(op.bytes_moved / 1e9, rel=1e-15)
    assert cost.memory_time == cost.time > cost.compute_time


def test_operands_too_big_for_the_buffer_are_refetched():
    """os with a shared buffer: any one operand may keep half of it. N outer (A streamed once per
    N fold unless it stays resident, a K x C tile of B reused over the M folds unless it
    overflows) or M outer (the roles swapped), whichever is faster; on a 1 B/s DRAM that is the
    one with fewer bytes, and the time is those bytes (closed form)."""
    rows = cols = 4
    m, n, k = 64, 12, 1000  # A: 64 x 1000 fp16 = 128000 B; B: 1000 x 12 fp16 = 24000 B
    op = _gemm_op(m, n, k)
    a_b, b_b, o_b = m * k * 2, k * n * 2, m * n * 2
    fm, fn = math.ceil(m / rows), math.ceil(n / cols)
    orders = {}
    for sram in (1 << 20, 100_000, 20_000):
        half = sram / 2
        n_outer = (a_b if a_b <= half else fn * a_b) + (b_b if b_b / fn <= half else fm * b_b)
        m_outer = (b_b if b_b <= half else fm * b_b) + (a_b if a_b / fm <= half else fn * a_b)
        d = _design("os", rows, cols, sram=sram, sram_bandwidth=1e18, dram_bandwidth=1.0)
        cost = SystolicCost().op_cost(op, d)
        assert cost.dram_bytes == min(n_outer, m_outer) + o_b
        assert cost.time == pytest.approx(min(n_outer, m_outer) + o_b, rel=1e-12)
        orders[sram] = "N" if n_outer <= m_outer else "M"
    assert orders == {1 << 20: "N", 100_000: "M", 20_000: "N"}  # the cases above exercise both orders


def test_partial_sums_stay_in_the_buffer_or_spill():
    """ws: the M x C block of outputs an N fold accumulates over ceil(K/R) folds stays in the ofmap
    buffer when it fits (outputs written once), else every fold writes it and all but the first
    read it back; under the scalesim convention every fold writes it and nothing is read back."""
    rows = cols = 8
    m, n, k = 256, 16, 64  # block: 256 x 8 int8 = 2048 B; K folds: 8
    b = GraphBuilder("g", batch=1, dtype="int8")
    b.linear("fc", b.input("x", c=k, h=m), n, bias=False)
    op = b.build().op("fc")
    a_b, b_b, o_b = m * k, k * n, m * n
    # (ifmap buffer, ofmap buffer, convention, DRAM bytes); a 64 B ifmap buffer holds no chunk of
    # A, so the fold order is kept (A streamed once per N fold: twice)
    cases = ((1 << 20, 8192, "marssim", a_b + b_b + o_b),
             (64, 2048, "marssim", 2 * a_b + b_b + 8 * o_b + 7 * o_b),
             (1 << 20, 8192, "scalesim", a_b + b_b + 8 * o_b))
    for ifmap, ofmap, convention, dram in cases:
        d = _design("ws", rows, cols, sram_bandwidth=1e18, dram_bandwidth=1e9,
                    buffers={"ifmap": ifmap, "filter": 1 << 20, "ofmap": ofmap, "convention": convention})
        assert SystolicCost().op_cost(op, d).dram_bytes == dram, (ifmap, ofmap, convention)


def test_dram_channels_shared_or_per_buffer():
    """A DRAM-bound op takes its total bytes over one shared channel, and its largest operand's
    bytes when each buffer has its own channel (then the last output block, 1 x 32 fp16, is
    written after the last fold on its own channel)."""
    op = _gemm_op(1, 1024, 1024)  # batch-1 FC: the weights dominate
    base = dict(sram_bandwidth=1e18, dram_bandwidth=1e9)
    shared = SystolicCost().op_cost(op, _design("ws", 32, 32, **base))
    per = SystolicCost().op_cost(op, _design("ws", 32, 32, buffers={"dram_channels": "per_operand"}, **base))
    assert shared.time == pytest.approx(op.bytes_moved / 1e9, rel=1e-12)
    assert per.time == pytest.approx((op.weight_bytes + 32 * 2) / 1e9, rel=1e-12)


def test_without_double_buffering_compute_and_dram_add_up():
    """Single-buffered: nothing overlaps, and every window refill pays the DRAM latency."""
    op = _gemm_op(64, 64, 64)
    base = dict(sram_bandwidth=1e18, dram_bandwidth=1e9)
    d = _design("os", 8, 8, buffers={"double_buffered": False, "dram_latency": 1e-6}, **base)
    cost = SystolicCost().op_cost(op, d)
    # every operand fits (1 GiB): one refill each, and the latency of the first fill
    assert cost.time == pytest.approx(cost.compute_time + op.bytes_moved / 1e9 + 4e-6, rel=1e-12)
    overlapped = SystolicCost().op_cost(op, _design("os", 8, 8, buffers={"dram_latency": 1e-6}, **base))
    assert overlapped.time < cost.time


def test_energy_formula_and_nan_without_figures():
    """Energy = MACs + static power x time + buffer reads and writes + DRAM reads and writes. The
    buffer is read by the array and by the drains to DRAM, written by the array and by the fills
    from DRAM (os, 8 x 8 x 8 fp16 on 4 x 4: A and B read twice, O written once; all fit)."""
    e = {"mac": 2e-12, "sram_read_byte": 1e-12, "sram_write_byte": 3e-12, "dram_read_byte": 10e-12,
         "dram_write_byte": 30e-12, "static_power": 0.5}
    d = _design("os", 4, 4, energy=e)
    op = _gemm_op(8, 8, 8)
    cost = SystolicCost().op_cost(op, d)
    tensor = 64 * 2  # bytes of A, B and O
    sram_read = 2 * tensor + 2 * tensor + tensor       # array reads A and B twice; O drained
    sram_write = tensor + 2 * tensor                    # array writes O; A and B filled
    expected = (op.macs * 2e-12 + 0.5 * cost.time, sram_read * 1e-12 + sram_write * 3e-12,
                2 * tensor * 10e-12 + tensor * 30e-12)
    assert (cost.energy_compute, cost.energy_sram, cost.energy_dram) == pytest.approx(expected, rel=1e-12)
    assert cost.energy == pytest.approx(sum(expected), rel=1e-12)
    assert cost.sram_bytes == sram_read + sram_write and cost.dram_bytes == 3 * tensor
    assert math.isnan(SystolicCost().op_cost(op, _design("os", 4, 4)).energy)
    assert isinstance(cost, OpCost) and cost.model == "systolic-os"
