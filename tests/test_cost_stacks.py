"""Software stacks in the calibration tables: a design's gpu.stack picks the rows that time its
kernels, bf16 and fp16 stand in for each other where a table measured one of them, and the fit
report is per stack."""

from __future__ import annotations

import pytest

from marssim.calibrate.fitting import fit_report
from marssim.cost import DataflowCost
from marssim.cost.calibrated import KernelTable, KernelTiming, row_stack
from marssim.errors import InputError
from marssim.system import Design
from marssim.workload.builder import GraphBuilder


def _design(stack: str | None = None) -> Design:
    gpu = {"sms": 132, "peak_flops": {"bf16": 989.4e12, "fp16": 989.4e12, "fp32": 66.9e12}, "calibration": "T"}
    if stack is not None:
        gpu["stack"] = stack
    return Design(name="g", dataflow="gpu", clock=1.8e9, sram=50 * 2 ** 20, sram_bandwidth=9e12,
                  dram_bandwidth=3.35e12, gpu=gpu)


def _row(m: int, n: int, k: int, t: float, stack: str, dtype: str = "fp16", note: str = "") -> KernelTiming:
    return KernelTiming("gemm", dtype, 1, m, n, k, 2.0 * m * n * k, 2.0 * (m * k + k * n + m * n), "T", 132, "1",
                        "12", "vendor", t, 0.0, 20, "2024-01-01", note=note, stack=stack)


def _fc(m: int, n: int, k: int, dtype: str):
    b = GraphBuilder("t", batch=1, dtype=dtype)
    x = b.input("x", c=k, h=m)
    b.linear("fc", x, n, bias=False)
    return b.build().op("fc")


def _table() -> KernelTable:
    rows = []
    for i, (m, n, k) in enumerate([(256, 512, 1024), (512, 512, 1024), (1024, 1024, 1024), (2048, 1024, 2048),
                                   (4096, 2048, 2048), (128, 4096, 4096)]):
        flops = 2.0 * m * n * k
        rows.append(_row(m, n, k, flops / 500e12 + 4e-6, "a"))
        rows.append(_row(m, n, k, flops / 250e12 + 6e-6, "b"))  # stack b: half as fast
    rows.append(_row(64, 64, 64, 9e-6, ""))  # unknown stack: used by every design
    return KernelTable(tuple(rows))


def test_a_design_uses_its_stacks_rows_and_those_of_unknown_stack():
    model = DataflowCost(calibration=_table())
    op = _fc(1024, 1024, 1024, "fp16")
    ta = model.op_cost(op, _design("a"))
    tb = model.op_cost(op, _design("b"))
    assert (ta.model, tb.model) == ("measured", "measured")
    assert ta.time == pytest.approx(2.0 * 1024 ** 3 / 500e12 + 4e-6, rel=1e-12)
    assert tb.time == pytest.approx(2.0 * 1024 ** 3 / 250e12 + 6e-6, rel=1e-12)
    # without a stack: every row, the fastest of a shape measured twice
    assert model.op_time(op, _design()) == ta.time
    # the unknown-stack row serves both stacks
    small = _fc(64, 64, 64, "fp16")
    assert model.op_cost(small, _design("a")).time == model.op_cost(small, _design("b")).time == 9e-6
    # an unmeasured shape: each stack's own curve, b's about twice a's
    other = _fc(3000, 3000, 3000, "fp16")
    ca, cb = model.op_cost(other, _design("a")), model.op_cost(other, _design("b"))
    assert ca.model == cb.model == "fitted" and 1.6 < cb.time / ca.time < 2.4


def test_a_stack_the_table_lacks_is_one_clear_error():
    model = DataflowCost(calibration=KernelTable(tuple(r for r in _table().rows if r.stack == "a")))
    with pytest.raises(InputError, match="no rows of stack 'c'"):
        model.op_cost(_fc(1024, 1024, 1024, "fp16"), _design("c"))


def test_bf16_and_fp16_stand_in_for_each_other_only_where_one_is_missing():
    rows = _table().rows
    model = DataflowCost(calibration=KernelTable(rows))
    bf16 = _fc(1024, 1024, 1024, "bf16")
    fp16 = _fc(1024, 1024, 1024, "fp16")
    got = model.op_cost(bf16, _design("a"))
    assert (got.model, got.time) == ("measured", model.op_time(fp16, _design("a")))
    assert model.op_cost(_fc(3000, 3000, 3000, "bf16"), _design("a")).model == "fitted"
    # a bf16 row of the shape wins over the fp16 one
    own = KernelTable(rows + (_row(1024, 1024, 1024, 1e-3, "a", dtype="bf16"),))
    assert DataflowCost(calibration=own).op_time(bf16, _design("a")) == 1e-3
    # fp32 has no stand-in: the roofline
    assert model.op_cost(_fc(1024, 1024, 1024, "fp32"), _design("a")).model == "gpu-roofline"


def test_the_harness_note_gives_a_row_its_stack():
    assert row_stack("", "gpu=H100; torch=2.11.0+cu130; cublas=13") == "pytorch-2.11.0+cu130"
    assert row_stack("mine", "torch=2.1") == "mine" and row_stack("", "origin=x") == ""
    assert _row(8, 8, 8, 1e-6, "", note="torch=2.4.0").stack == "pytorch-2.4.0"


def test_the_fit_report_is_per_stack_with_the_unknown_stacks_rows_in_each():
    reports = fit_report(_table())
    by_stack = {r.stack: r for r in reports}
    assert set(by_stack) == {"a", "b"}
    for r in reports:
        assert r.n_rows == 6 + 1  # its six shapes and the unknown-stack row
    ratio = by_stack["b"].fit.params.rate / by_stack["a"].fit.params.rate
    assert 0.4 < ratio < 0.6  # b was measured at half a's rate
