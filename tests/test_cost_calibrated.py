"""Calibration tables: schema validation, the curve fit, held-out error, fallback and the
default model's lookup under $MARSSIM_TRACES. Uses the SYNTHETIC table in tests/data (generated
from known curve parameters, see tests/data/make_synthetic_calibration.py)."""

from __future__ import annotations

import math
import pickle
import shutil
from pathlib import Path

import numpy as np
import pytest

from marssim.cost import (
    CalibratedCost, CurveParams, KernelTable, default_cost_model, fit, fit_group, holdout_errors, load_table, predict,
)
from marssim.errors import InputError, InputWarning
from marssim.system import Design
from marssim.workload import GraphBuilder

TABLE = Path(__file__).parent / "data" / "calibration" / "synthetic-h100.csv"
TRUE = {  # the generator's parameters, written out again here: rate, bandwidth, k_half, launch
    ("gemm", "bf16"): (720e12, 2.9e12, 96.0, 4.5e-6),
    ("conv", "bf16"): (560e12, 2.6e12, 48.0, 5.0e-6),
    ("attention", "bf16"): (450e12, 2.5e12, 40.0, 4.0e-6),
    ("elementwise", "bf16"): (math.inf, 2.95e12, 0.0, 3.2e-6),
}


@pytest.fixture(scope="module")
def table() -> KernelTable:
    return load_table(TABLE)


@pytest.fixture(scope="module")
def fits(table):
    return fit(table)


def _h100(calibration: str | None = "synthetic-H100") -> Design:
    return Design(name="h100", dataflow="gpu", clock=1.83e9, sram=50 * 2**20, sram_bandwidth=9.4e12,
                  dram_bandwidth=3.35e12,
                  gpu={"sms": 132, "peak_flops": {"bf16": 989.4e12, "fp32": 66.9e12}, "calibration": calibration})


def test_table_is_labelled_synthetic(table):
    assert TABLE.read_text().startswith("# SYNTHETIC TABLE FOR TESTS ONLY")
    assert table.devices() == ("synthetic-H100",)
    data_lines = [line for line in TABLE.read_text().splitlines() if line and not line.startswith("#")]
    assert len(table) == len(data_lines) - 1  # all but the header


def test_fit_reproduces_its_points_within_two_percent(table, fits):
    assert len(fits) == 6
    for key, rows in table.groups().items():
        f = fits[key]
        assert f.max_rel_error < 0.02
        pred = predict(f, key[1], batch=[r.batch for r in rows], m=[r.m for r in rows], n=[r.n for r in rows],
                       k=[r.k for r in rows], flops=[r.flops for r in rows], nbytes=[r.bytes for r in rows])
        measured = np.array([r.median_s for r in rows])
        assert np.max(np.abs(pred / measured - 1)) < 0.02


def test_fit_recovers_the_generating_parameters(fits):
    for (kind, dtype), (rate, bw, k_half, launch) in TRUE.items():
        p = fits[("synthetic-H100", kind, dtype, "none")].params
        if math.isinf(rate):
            assert math.isinf(p.rate)
        else:
            assert p.rate == pytest.approx(rate, rel=0.02)
            assert p.k_half == pytest.approx(k_half, rel=0.1)
        assert p.bandwidth == pytest.approx(bw, rel=0.02)
        assert p.launch == pytest.approx(launch, rel=0.05)


def test_prediction_is_a_curve_not_a_lookup(fits):
    """Between measured shapes the prediction follows the curve: monotone in K and exactly
    doubling when a second wave starts (a nearest-neighbour table could do neither)."""
    f = fits[("synthetic-H100", "gemm", "bf16", "none")]
    ks = np.array([1000, 1100, 1200, 1300])
    t = predict(f, "gemm", m=4096, n=4096, k=ks, nbytes=2 * (4096 * ks * 2 + 4096 * 4096))
    assert np.all(np.diff(t) > 0)
    one = predict(f, "attention", batch=132, m=128, n=128, k=4096, nbytes=1.0)
    two = predict(f, "attention", batch=133, m=128, n=128, k=4096, nbytes=1.0)
    launch = f.params.launch
    assert (two - launch) == pytest.approx(2 * (one - launch), rel=1e-12)


def test_holdout_errors_are_reported(table):
    errors = holdout_errors(table, every=4)
    assert {e.key[1] for e in errors} == {"gemm", "conv", "attention", "elementwise", "norm"}
    for e in errors:
        assert e.n_held >= 8 and e.n_fit >= 3 * e.n_held - 3
        assert 0 <= e.median_rel_error <= e.max_rel_error < 0.05


def test_calibrated_model_uses_fits_and_falls_back_per_kind(table, fits):
    model = CalibratedCost(table, measured=False)  # the curve everywhere, also at measured shapes
    d = _h100()
    b = GraphBuilder("t", batch=8, dtype="bf16")
    x = b.input("x", c=768, h=128)
    y = b.linear("fc", x, 3072)
    y = b.eltwise("gelu", y, fn="gelu")
    s = b.input("s", c=12 * 128, h=128)
    b.softmax("sm", s, heads=12)
    g = b.build()
    fc = model.op_cost(g.op("fc"), d)
    assert fc.model == "fitted"
    f = fits[("synthetic-H100", "gemm", "bf16", "none")]
    op = g.op("fc")
    expected = predict(f, "gemm", m=8 * 128, n=3072, k=768, nbytes=op.bytes_moved)
    assert fc.time == pytest.approx(float(expected), rel=1e-12)
    assert model.op_cost(g.op("gelu"), d).model == "fitted"
    assert model.op_cost(g.op("sm"), d).model == "gpu-roofline"  # no softmax rows: analytical
    cov = model.coverage(d, dtypes=("bf16",))
    assert cov["gemm"].startswith("bf16: fitted") and "gpu-roofline" in cov["softmax"]
    # a design naming another device is an error, or analytical throughout when that is asked for
    with pytest.raises(InputError, match="no calibration table 'A100'"):
        model.op_cost(g.op("fc"), _h100("A100"))
    lax = CalibratedCost(table, measured=False, allow_uncalibrated=True)
    with pytest.warns(InputWarning, match="'A100'"):
        assert lax.op_cost(g.op("fc"), _h100("A100")).model == "gpu-roofline"
    # by default a measured shape (fc's 1024x3072x768 is a row of the table) takes the table's time
    row = next(r for r in table.rows
               if (r.kind, r.dtype, r.batch, r.m, r.n, r.k) == ("gemm", "bf16", 1, 1024, 3072, 768))
    measured = CalibratedCost(table).op_cost(g.op("fc"), d)
    assert (measured.model, measured.time) == ("measured", row.median_s)


def test_most_tuned_group_wins(table):
    base = fit(table)
    key = ("synthetic-H100", "gemm", "bf16", "none")
    p = base[key].params
    faster = CurveParams(p.rate * 1.2, p.bandwidth, p.k_half, p.launch, p.sms)
    tuned = dict(base)
    tuned[("synthetic-H100", "gemm", "bf16", "sip")] = type(base[key])(
        "synthetic-H100", "gemm", "bf16", "sip", faster, 10, 0.0, 0.0, 0.0)
    b = GraphBuilder("t", batch=1, dtype="bf16")
    x = b.input("x", c=4096, h=4096)
    b.linear("fc", x, 4096)
    op = b.build().op("fc")
    t_tuned = CalibratedCost(tuned).op_time(op, _h100())
    t_plain = CalibratedCost(tuned, tuning=("none",)).op_time(op, _h100())
    assert t_tuned < t_plain


def test_default_model_reads_tables_under_marssim_traces(tmp_path, monkeypatch):
    (tmp_path / "calibration").mkdir()
    shutil.copy(TABLE, tmp_path / "calibration" / "any-name.csv")
    monkeypatch.setenv("MARSSIM_TRACES", str(tmp_path))
    b = GraphBuilder("t", batch=4, dtype="bf16")
    x = b.input("x", c=1024, h=256)
    b.linear("fc", x, 1024)
    op = b.build().op("fc")
    model = default_cost_model()
    assert model.op_cost(op, _h100()).model == "fitted"
    with pytest.raises(InputError, match="no calibration table 'H100'"):
        model.op_cost(op, _h100("H100"))
    # file-name match: a table file named after the calibration device
    shutil.copy(TABLE, tmp_path / "calibration" / "H100.csv")
    assert default_cost_model().op_cost(op, _h100("H100")).model == "fitted"
    # pickled with its fits; caches rebuilt on the other side
    clone = pickle.loads(pickle.dumps(model))
    assert clone.op_time(op, _h100()) == model.op_time(op, _h100())
    monkeypatch.setenv("MARSSIM_TRACES", str(tmp_path / "missing"))
    with pytest.raises(InputError, match="missing"):
        default_cost_model().op_cost(op, _h100())
    with pytest.warns(InputWarning):
        assert default_cost_model(allow_uncalibrated=True).op_cost(op, _h100()).model == "gpu-roofline"


HEADER = ("kind,dtype,batch,m,n,k,flops,bytes,device,sms,driver,cuda,tuning,median_s,spread_s,samples,date\n")
GOOD = "gemm,bf16,1,64,64,64,524288,24576,dev,132,550,12.4,none,5e-6,1e-7,20,2025-02-03\n"


@pytest.mark.parametrize("row,column", [
    (GOOD.replace("gemm", "matmul"), "kind"),
    (GOOD.replace("bf16", "fp12"), "dtype"),
    (GOOD.replace(",64,64,64,", ",64,0,64,"), "n"),
    (GOOD.replace("524288", "524289"), "flops"),
    (GOOD.replace("24576", "-1"), "bytes"),
    (GOOD.replace(",132,", ",zero,"), "sms"),
    (GOOD.replace("none", "autotune"), "tuning"),
    (GOOD.replace("5e-6", "0"), "median_s"),
    (GOOD.replace("1e-7", "nan"), "spread_s"),
    (GOOD.replace(",20,", ",1.5,"), "samples"),
    (GOOD.replace("2025-02-03", "03/02/2025"), "date"),
    (GOOD.replace(",dev,", ",,"), "device"),
])
def test_bad_rows_name_file_line_and_column(tmp_path, row, column):
    path = tmp_path / "bad.csv"
    path.write_text("# comment\n" + HEADER + GOOD + row)
    with pytest.raises(InputError) as err:
        load_table(path)
    assert err.value.file == str(path)
    assert err.value.path == f"line 4: {column}"


def test_bad_header_and_cell_count(tmp_path):
    path = tmp_path / "h.csv"
    path.write_text(HEADER.replace("spread_s", "spread") + GOOD)
    with pytest.raises(InputError, match="missing columns: spread_s") as err:
        load_table(path)
    assert "unknown columns: spread" in str(err.value)
    path.write_text(HEADER + GOOD.rstrip("\n") + ",extra\n")
    with pytest.raises(InputError, match="line 2: expected 17 cells"):
        load_table(path)
    with pytest.raises(InputError, match="cannot read"):
        load_table(tmp_path / "nope.csv")


def test_fit_group_needs_enough_rows(table):
    rows = table.select(kind="gemm", dtype="bf16").rows
    with pytest.raises(ValueError, match="need 4"):
        fit_group(rows[:3])
    assert fit(KernelTable(rows[:3])) == {}
