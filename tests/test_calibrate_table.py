"""Calibration rows as the harness writes them: device names, provenance notes, merging with
comments kept, and the schema check of :func:`marssim.cost.calibrated.load_table` on the result.
No GPU: the harness's row builder is fed a device description and timing summary by hand."""

from __future__ import annotations

import dataclasses

import pytest

from marssim.calibrate.grid import FUSED_ATTENTION, grid_from_graphs
from marssim.calibrate.harness import DeviceInfo, Task, _row
from marssim.calibrate.kernels import KERNELS, kernels_for
from marssim.calibrate.stats import summarize
from marssim.calibrate.table import (
    COLUMNS, format_note, merge_rows, parse_note, read_comments, read_rows, row_key,
    short_device_name,
)
from marssim.cost.calibrated import REQUIRED_COLUMNS, load_table
from marssim.errors import InputError
from marssim.workload import load_workload

H100 = DeviceInfo(name="NVIDIA H100 80GB HBM3", short="H100", sms=132, l2_bytes=50 << 20, memory_bytes=80 << 30,
                  capability="9.0", driver="550.54.15", cuda="12.4", torch="2.5.1", cudnn="90100", cublas="12.4.5.8",
                  triton="3.1.0", sm_clock_mhz="1980", max_sm_clock_mhz="1980", mem_clock_mhz="2619",
                  power_limit_w="700.00")


@pytest.mark.parametrize("name,short", [
    ("NVIDIA H100 80GB HBM3", "H100"), ("NVIDIA H200", "H200"), ("NVIDIA H100 PCIe", "H100"),
    ("NVIDIA A100-SXM4-80GB", "A100"), ("Tesla V100-SXM2-16GB", "V100"), ("NVIDIA GeForce RTX 4090", "RTX4090"),
    ("NVIDIA L40S", "L40S"), ("NVIDIA GH200 480GB", "GH200"),
])
def test_short_device_name(name, short):
    assert short_device_name(name) == short


def test_notes_round_trip_and_refuse_separators():
    fields = {"gpu": "NVIDIA H100 80GB HBM3", "sm_clock_mhz": "1980", "origin": "resnet50:conv1 x4 N"}
    assert parse_note(format_note(fields)) == fields
    with pytest.raises(ValueError):
        format_note({"origin": "a;b"})
    assert parse_note("compiler schedule") == {"": "compiler schedule"}


def _rows_for(points, dates=("2025-03-14",)):
    rows = []
    for i, p in enumerate(points):
        for impl in kernels_for(p):
            stats = summarize([1e-5 * (1 + i), 1.1e-5 * (1 + i), 1.2e-5 * (1 + i)] * 7)
            rows.append(_row(Task(p, impl, 0.1, i), H100, stats, impl.name, {"layout": "NHWC"}, "1965", dates[0]))
    return rows


def test_harness_rows_pass_the_cost_models_schema(tmp_path):
    graph = load_workload("bert-base")
    points = grid_from_graphs([graph], ("gemm", "attention", "elementwise", "norm", "softmax", "embedding"),
                              ("bf16", "fp32"), sweep=False)
    rows = _rows_for(points)
    path = tmp_path / "H100.csv"
    merge_rows(path, rows, "measured on a test bench")
    table = load_table(path)  # the full schema check: flops = 2*b*m*n*k, positive times, ISO dates ...
    assert len(table) == len(rows)
    assert set(REQUIRED_COLUMNS) <= set(COLUMNS)
    got = {(r.kind, r.dtype, r.batch, r.m, r.n, r.k, r.flops, r.bytes, r.tuning, r.kernel): r for r in table.rows}
    for r in rows:
        t = got[(r.kind, r.dtype, r.batch, r.m, r.n, r.k, r.flops, r.bytes, r.tuning, r.kernel)]
        assert t.median_s == pytest.approx(r.median_s, rel=1e-6)  # written with 7 significant digits
        assert (t.device, t.sms, t.driver, t.cuda, t.samples) == ("H100", 132, "550.54.15", "12.4", 21)
        note = parse_note(t.note)
        assert note["gpu"] == "NVIDIA H100 80GB HBM3" and note["sm_clock_mhz"] == "1965"
        assert {"torch", "cublas", "cudnn", "triton", "mem_clock_mhz", "power_limit_w", "origin"} <= set(note)
    gemm = next(r for r in table.rows if r.kind == "gemm" and r.kernel == "triton.gemm")
    assert gemm.tuning == "none" and gemm.dtype == "bf16"  # the Triton GEMM: bf16/fp16 only
    # IQR of the samples: 7 copies each of 1.0, 1.1, 1.2 (x1e-5 x (1+i)): p75 - p25 = 0.2e-5 x (1+i)
    first = rows[0]
    assert first.spread_s == pytest.approx(0.2e-5, rel=1e-9) and first.median_s == pytest.approx(1.1e-5)


def test_merge_replaces_same_measurement_and_keeps_comments(tmp_path):
    path = tmp_path / "H100.csv"
    points = grid_from_graphs([load_workload("resnet50")], ("conv",), ("fp16",), sweep=False)[:3]
    first = _rows_for(points)
    merge_rows(path, first, "run 1")
    again = [dataclasses.replace(r, median_s=2 * r.median_s) for r in first[:1]]
    merge_rows(path, again, "# run 2")
    merge_rows(path, [], "run 1")  # the same comment is not repeated
    assert read_comments(path) == ["# run 1", "# run 2"]
    rows = read_rows(path)
    assert len(rows) == 3
    replaced = next(r for r in rows if row_key(r) == row_key(first[0]))
    assert replaced.median_s == pytest.approx(2 * first[0].median_s, rel=1e-6)
    load_table(path)


def test_bad_table_names_file_line_and_column(tmp_path):
    path = tmp_path / "H100.csv"
    points = grid_from_graphs([load_workload("resnet50")], ("conv",), ("fp16",), sweep=False)[:2]
    merge_rows(path, _rows_for(points), "a comment")
    lines = path.read_text().splitlines()
    header = lines[1].split(",")
    cells = lines[3].split(",")
    cells[header.index("median_s")] = "-3"
    lines[3] = ",".join(cells)
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(InputError) as err:
        load_table(path)
    assert err.value.file == str(path) and err.value.path == "line 4: median_s"
    with pytest.raises(InputError, match="line 4: samples"):
        path.write_text("\n".join(lines[:3] + [lines[3].replace(",-3,", ",1e-5,").replace(",21,", ",x,")]) + "\n")
        read_rows(path)


def test_every_kernel_family_has_one_tuning_and_backend_per_kind():
    """The harness's resume check identifies a family by (kind, tuning, backend): they must not
    collide."""
    seen = {}
    for k in KERNELS:
        family = (k.measure_kind, k.tuning, k.backend)
        assert family not in seen, (k.name, seen.get(family))
        seen[family] = k.name
    assert {k.measure_kind for k in KERNELS} >= {"gemm", "conv", "attention", "elementwise", "norm", FUSED_ATTENTION}
