"""Loop-mapping dataflows (Eyeriss row-stationary, NVDLA-like, ShiDianNao-like).

For small convolutions every MAC is placed explicitly -- on a PE (row, column) and a cycle --
by the mapping rule each docstring describes, written here independently; the test checks that
no PE does two MACs in one cycle, that every PE is inside the array, that every MAC is placed,
and that the last cycle matches the model's cycle count.
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from marssim.cost import LoopMapCost, SystolicCost
from marssim.system import Design
from marssim.workload import GraphBuilder


def _design(dataflow: str, rows: int, cols: int, **kw) -> Design:
    spec = dict(name="t", dataflow=dataflow, pe_rows=rows, pe_cols=cols, clock=1e9, sram=2.0**30,
                sram_bandwidth=1e18, dram_bandwidth=None)
    spec.update(kw)
    return Design(**spec)


def _conv(n, c, h, w, k, kernel, stride=1, pad=0, groups=1):
    b = GraphBuilder("c", batch=n)
    x = b.input("x", c=c, h=h, w=w)
    b.conv("conv", x, k, kernel, stride=stride, pad=pad, groups=groups)
    return b.build().op("conv")


def _gemm(m, n, k, batch=1):
    b = GraphBuilder("g", batch=batch)
    x = b.input("x", c=k, h=m)
    b.linear("fc", x, n, bias=False)
    return b.build().op("fc")


def _conv_loops(op):
    """(G, n, k, c, p, q, r, s) of a conv op, from its loops and params."""
    lp = op.loop_dict
    g = lp["K"] if op.param("depthwise") else op.param("groups", 1)
    return g, lp["N"], lp["K"] // g, lp["C"], lp["P"], lp["Q"], lp["R"], lp["S"]


def _check_schedule(placements, count_expected, rows, cols) -> int:
    seen = set()
    last = -1
    for cycle, row, col in placements:
        assert 0 <= row < rows and 0 <= col < cols
        assert (cycle, row, col) not in seen, "two MACs on one PE in one cycle"
        seen.add((cycle, row, col))
        last = max(last, cycle)
    assert len(seen) == count_expected
    return last + 1


def nvdla_schedule(op, rows, cols):
    """Atomic-K cells x atomic-C lanes: cell (k % rows, c % cols); cycles run over groups,
    K folds, C folds, then pixels and taps."""
    g_n, n, k, c, p, q, r, s = _conv_loops(op)
    kf, cf = math.ceil(k / rows), math.ceil(c / cols)
    for g, kk, cc, nn, pp, qq, rr, ss in itertools.product(*(range(v) for v in (g_n, k, c, n, p, q, r, s))):
        t = ((((((g * kf + kk // rows) * cf + cc // cols) * n + nn) * p + pp) * q + qq) * r + rr) * s + ss
        yield t, kk % rows, cc % cols


def shidiannao_schedule(op, rows, cols):
    """Output pixel (p % rows, q % cols); cycles over groups, samples, output tiles, output
    channels, input channels and taps."""
    g_n, n, k, c, p, q, r, s = _conv_loops(op)
    pf, qf = math.ceil(p / rows), math.ceil(q / cols)
    for g, nn, pp, qq, kk, cc, rr, ss in itertools.product(*(range(v) for v in (g_n, n, p, q, k, c, r, s))):
        tile = (pp // rows) * qf + qq // cols
        t = (((((g * n + nn) * pf * qf + tile) * k + kk) * c + cc) * r + rr) * s + ss
        yield t, pp % rows, qq % cols


def rs_schedule(op, rows, cols):
    """Eyeriss: a PE set is r rows (filter rows) x p columns (output rows); sets stacked
    vertically take different input channels, side by side different filters, left-over
    replicas different groups; each PE runs a 1-D convolution (q outputs x s taps)."""
    g_n, n, k, c, p, q, r, s = _conv_loops(op)
    u_r = max(1, rows // r)
    u_c = max(1, cols // p)
    c_par = min(u_r, c)
    k_par = min(u_c, k)
    g_row = u_r // c_par
    g_col = u_c // k_par
    g_par = g_row * g_col
    set_h, set_w = min(r, rows), min(p, cols)
    row_folds, col_folds = math.ceil(r / rows), math.ceil(p / cols)
    k_folds, c_folds, g_folds = math.ceil(k / k_par), math.ceil(c / c_par), math.ceil(g_n / g_par)
    for g, nn, kk, cc, pp, qq, rr, ss in itertools.product(*(range(v) for v in (g_n, n, k, c, p, q, r, s))):
        gl = g % g_par
        gr, gc = gl % g_row, gl // g_row
        vrep = gr * c_par + cc % c_par           # vertical replica
        hrep = gc * k_par + kk % k_par           # horizontal replica
        row = vrep * set_h + rr % set_h
        col = hrep * set_w + pp % set_w
        step = qq * s + ss                       # the PE's 1-D convolution
        t = ((((((nn * g_folds + g // g_par) * k_folds + kk // k_par) * c_folds + cc // c_par) * row_folds
               + rr // set_h) * col_folds + pp // set_w) * q * s + step)
        yield t, row, col


CONVS = [  # (n, c, h, w, k, kernel, stride, pad, groups)
    (1, 3, 6, 6, 5, 3, 1, 1, 1), (2, 5, 5, 4, 3, 3, 2, 1, 1), (1, 7, 4, 4, 9, 1, 1, 0, 1),
    (1, 6, 6, 6, 6, 3, 1, 1, 6), (1, 4, 5, 5, 4, 3, 1, 0, 2), (1, 2, 9, 9, 2, 5, 1, 2, 1),
    (1, 1, 3, 3, 1, 3, 1, 1, 1),
]
ARRAYS = [(4, 4), (3, 5), (6, 2), (2, 7), (12, 14), (1, 1)]
SCHEDULES = {"nvdla": nvdla_schedule, "shidiannao": shidiannao_schedule, "rs": rs_schedule}


@pytest.mark.parametrize("dataflow", ["nvdla", "shidiannao", "rs"])
@pytest.mark.parametrize("conv", CONVS)
def test_cycles_match_an_explicit_conflict_free_schedule(dataflow, conv):
    op = _conv(*conv[:6], stride=conv[6], pad=conv[7], groups=conv[8])
    model = LoopMapCost()
    for rows, cols in ARRAYS:
        cycles = _check_schedule(SCHEDULES[dataflow](op, rows, cols), op.macs, rows, cols)
        assert model.op_cost(op, _design(dataflow, rows, cols)).cycles == cycles, (rows, cols)


@pytest.mark.parametrize("m,n,k,rows,cols", [(5, 7, 9, 4, 4), (1, 30, 20, 4, 8), (33, 2, 3, 8, 4)])
def test_gemm_cycles_by_hand(m, n, k, rows, cols):
    """GEMMs: NVDLA lays N on atomic-K and K on atomic-C, one output row per cycle; ShiDianNao
    spreads the M x N output over the PEs and runs K; row-stationary sees a 1x1 conv whose
    output rows are the M tokens (cols) and input channels K stack vertically."""
    op = _gemm(m, n, k)
    model = LoopMapCost()
    assert model.op_cost(op, _design("nvdla", rows, cols)).cycles == math.ceil(n / rows) * math.ceil(k / cols) * m
    assert model.op_cost(op, _design("shidiannao", rows, cols)).cycles == math.ceil(m / rows) * math.ceil(n / cols) * k
    c_par = min(rows, k)
    if m <= cols:
        k_par = min(cols // m, n)
        expected = math.ceil(n / k_par) * math.ceil(k / c_par)
    else:
        expected = n * math.ceil(k / c_par) * math.ceil(m / cols)
    assert model.op_cost(op, _design("rs", rows, cols)).cycles == expected


def test_full_utilisation_when_the_mapping_tiles_exactly():
    """Hand-derived: Eyeriss 12x14, 3x3 kernel, 14 output rows and 4 channels fill the array
    (4 sets of 3 rows, 14 columns); NVDLA with K, C multiples of the cells; ShiDianNao with P, Q
    multiples of the array."""
    model = LoopMapCost()
    op = _conv(1, 4, 16, 16, 1, 3)  # P = Q = 14
    assert model.op_cost(op, _design("rs", 12, 14)).utilisation == pytest.approx(1.0, rel=1e-12)
    op = _conv(2, 64, 8, 8, 32, 3, pad=1)
    assert model.op_cost(op, _design("nvdla", 16, 64)).utilisation == pytest.approx(1.0, rel=1e-12)
    op = _conv(1, 8, 34, 34, 8, 3)  # P = Q = 32
    assert model.op_cost(op, _design("shidiannao", 32, 32)).utilisation == pytest.approx(1.0, rel=1e-12)


def test_depthwise_conv_favours_shidiannao_over_nvdla():
    """The Herald observation: a channel-parallel array idles on depthwise convs (one channel
    per group), an output-pixel-parallel one does not."""
    op = _conv(1, 64, 56, 56, 64, 3, pad=1, groups=64)
    model = LoopMapCost()
    nv = model.op_cost(op, _design("nvdla", 16, 64))
    shi = model.op_cost(op, _design("shidiannao", 32, 32))
    assert nv.utilisation == pytest.approx(1 / (16 * 64), rel=1e-12)
    assert shi.time < nv.time / 100


def _random_ops(count, seed):
    rng = np.random.default_rng(seed)
    ops = []
    for _ in range(count):
        if rng.random() < 0.3:
            ops.append(_gemm(int(rng.integers(1, 300)), int(rng.integers(1, 300)), int(rng.integers(1, 300)),
                             int(rng.integers(1, 3))))
            continue
        c = int(rng.integers(1, 48))
        kind = rng.random()
        groups = c if kind < 0.25 else 1
        k = c if groups > 1 else int(rng.integers(1, 96))
        kernel = int(rng.choice([1, 3, 5, 7]))
        ops.append(_conv(int(rng.integers(1, 3)), c, int(rng.integers(kernel, 40)), int(rng.integers(kernel, 40)),
                         k, kernel, stride=int(rng.choice([1, 2])), pad=kernel // 2, groups=groups))
    return ops


def test_more_pes_are_never_slower_for_compute_bound_ops():
    """Without fill terms, adding a PE row or column (any amount) never adds cycles."""
    model = LoopMapCost()
    rng = np.random.default_rng(5)
    for op in _random_ops(100, seed=9):
        for df in ("nvdla", "shidiannao", "rs"):
            rows, cols = int(rng.integers(1, 20)), int(rng.integers(1, 20))
            base = model.op_cost(op, _design(df, rows, cols)).time
            for dr, dc in ((1, 0), (0, 1), (int(rng.integers(1, 9)), int(rng.integers(1, 9)))):
                assert model.op_cost(op, _design(df, rows + dr, cols + dc)).time <= base, (df, rows, cols, dr, dc)


def test_roofline_bound_and_bandwidth_monotonicity():
    designs = [_design(df, 16, 32, sram=512 * 1024, sram_bandwidth=100e9, dram_bandwidth=10e9)
               for df in ("nvdla", "shidiannao", "rs")]
    model = LoopMapCost()
    for op in _random_ops(80, seed=21):
        for d in designs:
            cost = model.op_cost(op, d)
            assert cost.time >= op.macs / (d.pes * d.clock) * (1 - 1e-12)
            assert cost.time >= op.bytes_moved / d.dram_bandwidth * (1 - 1e-12)
            assert 0 < cost.utilisation <= 1 + 1e-12
            faster = d.model_copy(update={"sram_bandwidth": 2 * d.sram_bandwidth, "dram_bandwidth": 2 * d.dram_bandwidth})
            assert model.op_time(op, faster) <= cost.time


def test_restricted_models_reject_other_dataflows():
    op = _gemm(4, 4, 4)
    with pytest.raises(ValueError, match="loopmap|nvdla|dataflow"):
        LoopMapCost().op_cost(op, _design("os", 4, 4))
    with pytest.raises(ValueError, match="dataflow"):
        SystolicCost().op_cost(op, _design("rs", 4, 4))
