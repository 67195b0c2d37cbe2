"""Convolution geometry in calibration tables: the ``conv_*`` columns (schema, round trip, the
errors for bad values), tables without them (they still load and match by GEMM shape), the
lookup of a convolution by its own geometry, the correction from neighbours in a space that
includes it, the harness writing the geometry, and the back-fill of rows measured without it.

Geometry expected here is computed from the Op API (loops, input shapes, ``stride``/``pad``
params) or from ``torch.nn.functional.conv2d``'s output-size formula, not from
:mod:`marssim.cost.convgeom`."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest

from marssim.calibrate.backfill import backfill_conv_geometry, is_shard_origin, rebuild_origin
from marssim.calibrate.fitting import fit_report
from marssim.calibrate.grid import build_grid, grid_from_graphs
from marssim.calibrate.harness import Task, _row
from marssim.calibrate.kernels import kernels_for
from marssim.calibrate.stats import summarize
from marssim.calibrate.table import COLUMNS, format_note, merge_rows, read_rows, row_key
from marssim.cost import CalibratedCost, DataflowCost, KernelTable, fit_group, load_table, predict
from marssim.cost.calibrated import CONV_COLUMNS, OPTIONAL_COLUMNS, REQUIRED_COLUMNS, KernelTiming, geometry_array
from marssim.cost.convgeom import ConvGeometry, conv_geometry, conv_launch, format_pair, parse_pair
from marssim.cost.gpu import CurveParams, gemm_curve
from marssim.errors import InputError
from marssim.system import load_system
from marssim.workload import OpKind, load_workload

from test_calibrate_table import H100

DATA = __import__("pathlib").Path(__file__).parent / "data"
ZOO_CONVS = ("resnet50", "mobilenetv2", "vgg16", "vit-b16")


def _out(size: int, kernel: int, stride: int, pad: int, dilation: int = 1) -> int:
    """conv2d's output size along one axis (PyTorch's documented formula)."""
    return math.floor((size + 2 * pad - dilation * (kernel - 1) - 1) / stride + 1)


# ----------------------------------------------------------------------------- geometry of ops
@pytest.mark.parametrize("workload", ZOO_CONVS)
def test_every_zoo_layer_runs_with_its_own_padding_and_gives_its_output(workload):
    graph = load_workload(workload)
    convs = [op for op in graph.ops if op.kind == OpKind.CONV]
    assert convs
    for op in convs:
        g = conv_geometry(op)
        n, c, h, w = op.in_shapes[0]
        top, left, bottom, right = op.param("pad")
        assert (top, left) == (bottom, right)  # the zoo pads symmetrically
        assert (g.c, g.h, g.w, g.k, g.r, g.s) == (c, h, w, op.dim("K"), op.dim("R"), op.dim("S"))
        assert (g.stride_h, g.stride_w, g.pad_h, g.pad_w) == (*op.param("stride"), top, left)
        assert g.groups == (op.dim("K") if op.param("depthwise", False) else op.param("groups", 1))
        assert g.out_size == (_out(h, g.r, g.stride_h, top), _out(w, g.s, g.stride_w, left)) == op.out_shape[2:]
        assert g.gemm_view(n) == op.gemm_view()
        assert conv_launch(op).pre_pad == (0, 0, 0, 0)


def test_shards_and_variants_give_the_ops_output_and_gemm():
    """Every conv point of the grid with the sweep and 2/3/4/8-way shards: the kernel's output
    is the op's, its GEMM the op's, and a spatial shard pads no more than the layer does."""
    points = build_grid(ZOO_CONVS, ("conv",), ("fp16",), max_batch_factor=4, shards=(2, 3, 4, 8))
    spatial = 0
    for p in points:
        launch = conv_launch(p.op)
        g = launch.geometry
        assert g == p.conv
        left, right, top, bottom = launch.pre_pad
        rows, cols = launch.rows + top + bottom, launch.cols + left + right
        assert (rows, cols) == (g.h, g.w)
        assert g.out_size == (_out(g.h, g.r, g.stride_h, g.pad_h), _out(g.w, g.s, g.stride_w, g.pad_w))
        assert g.out_size == p.op.out_shape[2:]
        assert g.gemm_view(launch.n) == (p.batch, p.m, p.n, p.k) == p.op.gemm_view()
        layer_pad = p.op.param("pad")
        assert g.pad_h + max(top, bottom) <= max(layer_pad[0], layer_pad[2])
        spatial += "spatial/" in p.origin
    assert spatial > 100


def test_strided_layer_keeps_its_padding_where_the_last_row_is_unread():
    """A 3x3/2 convolution of a 14x14 input with padding 1: the last padding row is read by no
    output, yet a framework runs it as conv2d(padding=1) on the 14x14 input, and so does the
    harness (the ``need`` rule of an earlier harness pre-padded it to 15x15 without padding)."""
    op = load_workload("resnet50").op("layer4.0.conv2")
    assert op.in_shapes[0][2:] == (14, 14) and op.param("stride") == (2, 2) and op.out_shape[2:] == (7, 7)
    assert conv_geometry(op).key == (512, 14, 14, 512, 3, 3, 2, 2, 1, 1, 1, 1)
    assert conv_geometry(op, "layer") == conv_geometry(op)
    assert conv_geometry(op, "need").key == (512, 15, 15, 512, 3, 3, 2, 2, 0, 0, 1, 1)
    assert conv_geometry(op, "need").match_key != conv_geometry(op).match_key  # padding applied in the kernel or not


def test_unread_input_rows_do_not_make_another_kernel():
    """A 1x1/2 convolution reads 55 of a 56-row input: the batch-8 layer (56 rows) and the
    batch-1 layer scaled by 8 (``with_loops`` keeps the 55 rows read) are one kernel."""
    whole = load_workload("resnet50:batch=8").op("layer2.0.downsample.0")
    scaled = load_workload("resnet50").op("layer2.0.downsample.0").with_loops(N=8)
    assert whole.in_shapes[0][2] == 56 and scaled.in_shapes[0][2] == 55
    assert conv_geometry(whole).key != conv_geometry(scaled).key
    assert conv_geometry(whole).match_key == conv_geometry(scaled).match_key


def test_pairs_round_trip_and_refuse_garbage():
    assert format_pair(2, 2) == "2" and format_pair(2, 1) == "2x1"
    for h, w in ((1, 1), (3, 3), (2, 1), (0, 4)):
        assert parse_pair(format_pair(h, w)) == (h, w)
    for bad in ("", "x", "-1", "2x", "1x2x3", "a"):
        with pytest.raises(ValueError):
            parse_pair(bad)


# ----------------------------------------------------------------------------- table schema
def _conv_rows(workload: str = "resnet50", dtype: str = "fp16", **grid):
    points = grid_from_graphs([load_workload(workload)], ("conv",), (dtype,), **grid)
    rows = []
    for i, p in enumerate(points):
        (impl,) = kernels_for(p)
        stats = summarize([1e-5 * (1 + i % 7)] * 20)
        rows.append(_row(Task(p, impl, 0.1, i), H100, stats, impl.name, {"layout": "NHWC"}, "1965", "2025-03-14"))
    return points, rows


def test_harness_rows_carry_the_geometry_and_round_trip(tmp_path):
    points, rows = _conv_rows(sweep=False)
    assert [r.conv for r in rows] == [p.conv for p in points] and all(r.conv is not None for r in rows)
    path = tmp_path / "H100.csv"
    merge_rows(path, rows, "test")
    header = [line for line in path.read_text().splitlines() if not line.startswith("#")][0].split(",")
    assert header == list(COLUMNS) and set(CONV_COLUMNS) <= set(header)
    loaded = load_table(path)  # the full schema check, geometry consistency included
    by_key = {row_key(r): r for r in loaded.rows}
    for r in rows:
        got = by_key[row_key(r)]
        assert got.conv == r.conv and got.phase == "fwd" and got.backend == ""
    assert {row_key(r) for r in read_rows(path)} == set(by_key)


def _write(tmp_path, header: list[str], cells: list[list[str]]):
    path = tmp_path / "t.csv"
    path.write_text("\n".join([",".join(header)] + [",".join(c) for c in cells]) + "\n")
    return path


def _one_conv_row(tmp_path):
    _, rows = _conv_rows(sweep=False)
    path = tmp_path / "one.csv"
    merge_rows(path, rows[:1])
    lines = path.read_text().splitlines()
    return lines[0].split(","), lines[1].split(",")


@pytest.mark.parametrize("column,value,expect", [
    ("conv_k", "128", "does not give batch, m, n, k"),          # n = conv_k / groups disagrees
    ("conv_h", "", "expected all of"),                           # partly given
    ("conv_stride", "2y1", "expected an integer or HxW"),
    ("conv_groups", "3", "not divisible by groups"),
    ("conv_r", "0", "an integer >= 1"),
    ("phase", "backward", "expected one of fwd, dgrad"),
])
def test_bad_geometry_or_phase_names_line_and_column(tmp_path, column, value, expect):
    header, cells = _one_conv_row(tmp_path)
    cells[header.index(column)] = value
    path = _write(tmp_path, header, [cells])
    with pytest.raises(InputError) as err:
        load_table(path)
    text = str(err.value)
    assert "line 2" in text and expect in text
    if column != "phase":
        assert column in text or "conv_c" in text


def test_geometry_on_a_gemm_row_is_refused(tmp_path):
    header, cells = _one_conv_row(tmp_path)
    conv_cells = {c: cells[header.index(c)] for c in CONV_COLUMNS}
    gemm = load_workload("bert-base")
    point = grid_from_graphs([gemm], ("gemm",), ("fp16",), sweep=False)[0]
    impl = kernels_for(point)[0]
    row = _row(Task(point, impl, 0.1, 0), H100, summarize([1e-5] * 20), impl.name, {}, "1965", "2025-03-14")
    path = tmp_path / "g.csv"
    merge_rows(path, [row])
    lines = path.read_text().splitlines()
    g = lines[1].split(",")
    for c, v in conv_cells.items():
        g[lines[0].split(",").index(c)] = v
    with pytest.raises(InputError, match="only conv rows carry a convolution geometry"):
        load_table(_write(tmp_path, lines[0].split(","), [g]))


def test_a_table_without_the_new_columns_still_loads_and_merges(tmp_path):
    """The header of tables measured before the optional columns existed."""
    _, rows = _conv_rows(sweep=False)
    path = tmp_path / "new.csv"
    merge_rows(path, rows)
    lines = path.read_text().splitlines()
    header = lines[0].split(",")
    keep = [i for i, c in enumerate(header) if c in REQUIRED_COLUMNS or c in ("kernel", "note")]
    old = _write(tmp_path, [header[i] for i in keep], [[ln.split(",")[i] for i in keep] for ln in lines[1:]])
    table = load_table(old)
    assert len(table) == len(rows) and all(r.conv is None and r.phase == "fwd" for r in table.rows)
    assert all(r.conv is None for r in read_rows(old))
    merge_rows(old, rows[:2], "a later run")  # merging into it rewrites it with every column
    again = load_table(old)
    assert len(again) == len(rows) + 2  # the measured geometry makes them other rows than the old ones
    assert sum(r.conv is not None for r in again.rows) == 2
    assert set(OPTIONAL_COLUMNS) <= set(old.read_text().splitlines()[1].split(","))


# ----------------------------------------------------------------------------- lookups
def _twins():
    """Two ResNet-50 convolutions with the same im2col GEMM: the first block's 3x3/2 conv2 of
    stage 2 and the next blocks' 3x3/1 one."""
    graph = load_workload("resnet50")
    strided, plain = graph.op("layer2.0.conv2"), graph.op("layer2.1.conv2")
    assert strided.gemm_view() == plain.gemm_view() and strided.param("stride") != plain.param("stride")
    return strided, plain


def _table_of(ops, times, conv: bool = True) -> KernelTable:
    rows = []
    for op, t in zip(ops, times):
        b, m, n, k = op.gemm_view()
        rows.append(KernelTiming("conv", op.dtype, b, m, n, k, 2.0 * b * m * n * k, float(op.bytes_moved), "H100",
                                 132, "d", "c", "vendor", t, 0.0, 20, "2025-01-01",
                                 conv=conv_geometry(op) if conv else None))
    return KernelTable(tuple(rows))


def test_a_conv_takes_the_measured_time_of_its_own_geometry_only():
    strided, plain = _twins()
    design = load_system("dgx-h100").design("gpu0", "h100")
    with_geometry = DataflowCost(calibration=_table_of([strided], [3e-5]))
    assert with_geometry.op_cost(strided, design).model == "measured"
    assert with_geometry.op_time(strided, design) == 3e-5
    assert with_geometry.measured_time(plain, design) is None
    assert with_geometry.op_cost(plain, design).model != "measured"
    # the same row without its geometry (a table measured before the columns): any conv of its GEMM
    old = DataflowCost(calibration=_table_of([strided], [3e-5], conv=False))
    assert old.op_time(plain, design) == old.op_time(strided, design) == 3e-5
    # both measured: each its own, in the scalar and the vectorised path
    both = DataflowCost(calibration=_table_of([strided, plain], [3e-5, 2e-5]))
    assert [both.op_time(op, design) for op in (strided, plain)] == [3e-5, 2e-5]
    assert both.op_times([strided, plain, plain], [design] * 3).tolist() == [3e-5, 2e-5, 2e-5]


def test_rows_of_other_phases_are_neither_fitted_nor_looked_up():
    strided, _ = _twins()
    design = load_system("dgx-h100").design("gpu0", "h100")
    table = _table_of([strided], [3e-5])
    dgrad = dataclasses.replace(table.rows[0], phase="dgrad", median_s=1.0)
    model = DataflowCost(calibration=KernelTable(table.rows + (dgrad,)))
    assert model.op_time(strided, design) == 3e-5
    assert KernelTable(table.rows + (dgrad,)).groups() == table.groups()


# ----------------------------------------------------------------------------- correction
TRUE = CurveParams(rate=5.2e14, bandwidth=2.6e12, k_half=40.0, launch=6e-6, sms=132)


def _slowdown(g: ConvGeometry) -> float:
    """What the GEMM view cannot see: strided and 1x1 convolutions run other kernels."""
    return (1.6 if g.stride_h > 1 else 1.0) * (0.8 if g.r * g.s == 1 else 1.0)


@pytest.fixture(scope="module")
def geometry_table() -> KernelTable:
    """Convolutions of the zoo and the sweep around them (fp16), timed by a known curve of
    their GEMM view times :func:`_slowdown` of their geometry, with 0.5 % noise."""
    rng = np.random.default_rng(3)
    points = build_grid(("resnet50", "mobilenetv2", "vgg16"), ("conv",), ("fp16",), max_batch_factor=8)
    rows = []
    for p in points:
        t = gemm_curve(p.batch, p.m, p.n, p.k, float(p.flops), float(p.bytes), *TRUE.as_row(), max, min)[0]
        t *= _slowdown(p.conv) * math.exp(0.005 * rng.standard_normal())
        rows.append(KernelTiming("conv", "fp16", p.batch, p.m, p.n, p.k, float(p.flops), float(p.bytes), "H100", 132,
                                 "d", "c", "vendor", t, 0.0, 20, "2025-01-01", conv=p.conv))
    return KernelTable(tuple(rows))


def test_geometry_correction_sees_what_the_gemm_view_cannot(geometry_table):
    (report,) = fit_report(geometry_table)
    assert report.fit.correction is not None and report.fit.correction.geometry
    by_geometry, by_view = report.holdout, report.gemm_view_holdout
    assert by_view is not None
    # the slowdown is a function of two geometry features the correction has; the GEMM view
    # mixes strided and unstrided shapes, so its neighbours disagree by up to 1.6x
    assert by_geometry.median < 0.02 and by_geometry.p90 < 0.06
    assert by_view.p90 > 2 * by_geometry.p90


def test_model_and_predict_agree_bit_for_bit_with_geometry(geometry_table):
    from marssim.cost.gpu import dtype_peak

    design = load_system("dgx-h100").design("gpu0", "h100")
    # the cost model fits with the design's dense peak as the bound of the curve's rate
    fit = fit_group(list(geometry_table.rows), max_rate=dtype_peak(design, "fp16"))
    assert fit.correction.geometry
    model = CalibratedCost(geometry_table, measured=False)
    strided, plain = _twins()
    ops = [strided, plain, plain.with_loops(N=3), strided.with_loops(K=96), plain.with_loops(P=7)]
    ops = [dataclasses.replace(op, dtype="fp16") for op in ops]
    rows = _table_of(ops, [1.0] * len(ops)).rows
    expected = predict(fit, "conv", batch=[r.batch for r in rows], m=[r.m for r in rows], n=[r.n for r in rows],
                       k=[r.k for r in rows], flops=[r.flops for r in rows], nbytes=[r.bytes for r in rows],
                       geometry=geometry_array(rows))
    assert [model.op_time(op, design) for op in ops] == expected.tolist()
    assert model.op_times(ops, [design] * len(ops)).tolist() == expected.tolist()
    with pytest.raises(ValueError, match="geometry"):
        predict(fit, "conv", batch=1, m=784, n=128, k=1152)


# ----------------------------------------------------------------------------- back-fill
def test_backfill_recovers_the_grids_geometry_exactly():
    points, rows = _conv_rows("resnet50", shards=(2, 4), max_batch_factor=4)
    stripped = [dataclasses.replace(r, conv=None) for r in rows]
    done, report = backfill_conv_geometry(stripped)
    assert report.recovered == report.conv_rows == len(rows) and not report.failed
    assert [r.conv for r in done] == [p.conv for p in points]
    assert any(is_shard_origin(p.origin) for p in points) and not is_shard_origin("resnet50:conv1 x4 N")


def test_backfill_leaves_what_does_not_rebuild():
    _, rows = _conv_rows(sweep=False)
    r = dataclasses.replace(rows[0], conv=None)
    bad = [dataclasses.replace(r, note=format_note({"origin": "nosuchnet:conv1"})),
           dataclasses.replace(r, note="compiler schedule"),
           dataclasses.replace(r, note=format_note({"origin": "resnet50:conv1 K=77"})),  # another shape
           dataclasses.replace(r, note=format_note({"origin": "resnet50:fc"}))]
    done, report = backfill_conv_geometry(bad)
    assert report.recovered == 0 and report.conv_rows == 4 and sum(report.failed.values()) == 4
    assert all(x.conv is None for x in done)


def test_backfill_under_the_layer_rule_refuses_spatial_shards_it_could_not_have_run():
    """The first harness padded every axis as the layer does: a spatial shard of a padded 3x3
    conv then gave more rows than the shard has, the harness's output check failed, and no
    such row exists; back-filling one under that rule is refused, under ``need`` it is not."""
    points, rows = _conv_rows("resnet50", sweep=False, shards=(2,))
    spatial = [dataclasses.replace(r, conv=None) for p, r in zip(points, rows)
               if "spatial/" in p.origin and p.op.dim("R") == 3 and p.op.param("stride") == (1, 1)]
    assert spatial
    _, layer = backfill_conv_geometry(spatial, "layer")
    assert layer.recovered == 0
    done, need = backfill_conv_geometry(spatial, "need")
    assert need.recovered == len(spatial)
    origin = rebuild_origin(spatial[0].note.split("origin=")[1], "fp16", load_workload)
    assert done[0].conv == conv_geometry(origin, "need")


def test_committed_table_geometry_is_reproduced_from_the_origins():
    """``traces/calibration/H100.csv`` was converted by ``marssim calibrate backfill --padding
    layer --shard-padding need``: stripping its geometry and back-filling again gives it back."""
    table = load_table(DATA.parent.parent / "traces" / "calibration" / "H100.csv")
    convs = [r for r in table.rows if r.kind == "conv"][::7]
    assert all(r.conv is not None for r in convs)
    done, report = backfill_conv_geometry([dataclasses.replace(r, conv=None) for r in convs], "layer", "need")
    assert report.recovered == len(convs)
    assert [r.conv for r in done] == [r.conv for r in convs]
