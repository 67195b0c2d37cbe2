"""``marssim calibrate grid / measure / fit / check`` on the CPU: outputs, exit codes and the
errors for bad flags and bad tables (file, line, column). ``measure`` without a CUDA device
validates its arguments, then exits 2 saying a GPU is needed; ``--dry-run`` works anywhere."""

from __future__ import annotations

import csv
import json
import shutil
from pathlib import Path

import pytest

from marssim.calibrate.device import torch_cuda_status
from marssim.cli import main
from marssim.workload import OpKind, load_workload

TABLE = Path(__file__).parent / "data" / "calibration" / "synthetic-h100.csv"


def test_grid_writes_one_row_per_distinct_layer_shape(tmp_path, capsys):
    out = tmp_path / "grid.csv"
    assert main(["calibrate", "grid", "--workloads", "resnet50", "--kinds", "conv,gemm", "--dtype", "fp16",
                 "--no-sweep", "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "chunk 1:" in text and "kernels" in text
    rows = list(csv.DictReader(out.open()))
    graph = load_workload("resnet50")
    convs = {(op.gemm_view(), (op.in_shapes[0][1], *op.in_shapes[0][2:], op.dim("K"), op.dim("R"), op.dim("S"),
                               op.param("stride")[0], op.param("pad")[0]))
             for op in graph.ops if op.kind == OpKind.CONV}
    conv_rows = [r for r in rows if r["kind"] == "conv"]
    # one row per distinct convolution (23), not per distinct im2col GEMM (20): the geometry columns tell them apart
    assert {((int(r["batch"]), int(r["m"]), int(r["n"]), int(r["k"])),
             tuple(int(r[c]) for c in ("conv_c", "conv_h", "conv_w", "conv_k", "conv_r", "conv_s", "conv_stride",
                                       "conv_pad"))) for r in conv_rows} == convs
    assert len(conv_rows) == len(convs) == 23
    assert len({op.gemm_view() for op in graph.ops if op.kind == OpKind.CONV}) == 20
    gemm = [r for r in rows if r["kind"] == "gemm"]  # the fc layer, by cuBLAS and by the Triton GEMM
    assert sorted(r["kernel"] for r in gemm) == ["torch.matmul", "triton.gemm"]
    assert {r["chunk"] for r in rows} == {"1"}


def test_grid_splits_into_chunks_under_the_budget(capsys):
    assert main(["calibrate", "grid", "--workloads", "bert-base", "--kinds", "gemm", "--dtype", "fp16",
                 "--chunk-seconds", "1"]) == 0
    text = capsys.readouterr().out
    chunks = [line for line in text.splitlines() if line.strip().startswith("chunk ")]
    assert len(chunks) > 1
    for line in chunks:  # "chunk 3: kernels 40-61, about 1 s (...)": within the budget (or one kernel alone)
        seconds = float(line.split("about ")[1].split(" s")[0])
        first, last = (int(x) for x in line.split("kernels ")[1].split(",")[0].split("-"))
        assert seconds <= 1.0 or first == last


@pytest.mark.parametrize("flags,message", [
    (["--kinds", "gemm,matmul"], "--kinds: expected some of"),
    (["--dtype", "fp12"], "--dtype: expected some of"),
    (["--workloads", "no-such-model"], "no-such-model"),
    (["--repeats", "5"], "--repeats: expected at least 20 repetitions"),
    (["--chunk", "99"], "--chunk: expected a chunk from 1 to"),
    (["--out", "x.txt"], "--out: expected a file name ending in .csv"),
])
def test_measure_rejects_bad_flags_first(flags, message, capsys):
    assert main(["calibrate", "measure", "--workloads", "bert-base", "--kinds", "gemm", *flags]) == 2
    err = capsys.readouterr().err
    assert err.startswith("marssim calibrate: error:") and message in err
    assert "Traceback" not in err


def test_measure_refuses_a_bad_table_to_merge_into(tmp_path, capsys):
    bad = tmp_path / "H100.csv"
    bad.write_text(TABLE.read_text().replace("gemm,bf16,1,2048,1024,1024,4294967296", "gemm,bf16,1,2048,1024,1024,7"))
    assert main(["calibrate", "measure", "--workloads", "bert-base", "--kinds", "gemm", "--out", str(bad)]) == 2
    assert f"{bad}: line 5: flops: expected 2*batch*m*n*k" in capsys.readouterr().err


@pytest.mark.skipif(torch_cuda_status()[0], reason="a CUDA device is present: measure would time kernels")
def test_measure_without_a_gpu_exits_2_after_validating(tmp_path, capsys):
    out = tmp_path / "H100.csv"
    assert main(["calibrate", "measure", "--workloads", "bert-base", "--kinds", "gemm", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "a CUDA device is required to time kernels" in err and "--dry-run" in err
    assert not out.exists()


def test_measure_dry_run_prints_grid_and_estimate(capsys):
    assert main(["calibrate", "measure", "--workloads", "resnet50,bert-base", "--kinds", "gemm,conv,fused-attention",
                 "--dtype", "bf16", "--dry-run", "--chunk", "1"]) == 0
    text = capsys.readouterr().out
    assert text.startswith("dry run (chunk 1 of")
    assert "fused-attention" in text and "traces/fused-attention/<device>.csv" in text
    total = next(line for line in text.splitlines() if "total:" in line)
    assert "kernels, about" in total and "min" in total


def test_fit_prints_held_out_errors_and_writes_json(tmp_path, capsys):
    path = tmp_path / "H100.csv"
    shutil.copy(TABLE, path)
    assert main(["calibrate", "fit", str(path)]) == 0
    text = capsys.readouterr().out
    assert "held out" in text and "median" in text and "p90" in text and "met" in text
    doc = json.loads((tmp_path / "H100.fit.json").read_text())
    assert {g["kind"] for g in doc["groups"]} == {"gemm", "conv", "attention", "elementwise", "norm"}
    assert main(["calibrate", "fit", str(path), "--json", str(tmp_path / "x.txt")]) == 2


def test_fit_and_check_name_file_line_and_column(tmp_path, capsys):
    bad = tmp_path / "bad.csv"
    lines = TABLE.read_text().splitlines()
    lines[6] = lines[6].replace(",none,", ",autotuned,")
    bad.write_text("\n".join(lines) + "\n")
    assert main(["calibrate", "fit", str(bad)]) == 2
    assert main(["calibrate", "check", str(bad)]) == 2
    err = capsys.readouterr().err
    assert err.count(f"{bad}: line 7: tuning: expected one of none, vendor, triton-autotune, sip") == 2
    assert not (tmp_path / "bad.fit.json").exists()
    assert main(["calibrate", "check", str(tmp_path / "missing.csv")]) == 2


def test_check_reports_coverage_per_kind_and_workload(tmp_path, capsys):
    from marssim.calibrate.grid import build_grid
    from marssim.calibrate.table import CalibrationRow, merge_rows

    path = tmp_path / "H100.csv"
    points = build_grid(("bert-base",), ("gemm", "softmax"), ("fp16",), sweep=False)
    merge_rows(path, [CalibrationRow(p.kind, p.dtype, p.batch, p.m, p.n, p.k, float(p.flops), float(p.bytes), "H100",
                                     132, "test", "test", "vendor", 1e-5, 1e-7, 20, "2025-01-01", "test", "test")
                      for p in points])
    assert main(["calibrate", "check", str(path), "--workloads", "bert-base"]) == 0
    text = capsys.readouterr().out
    assert f"{path}: valid, {len(points)} rows, devices H100" in text
    gemm = next(line for line in text.splitlines() if " gemm " in line)
    assert gemm.split()[:5] == ["H100", "gemm", "fp16", "3", "3"]  # 128 tokens x 768->768, 768->3072, 3072->768
    graph = load_workload("bert-base")
    n_gemm = sum(op.kind == OpKind.GEMM for op in graph.ops)
    n_softmax = sum(op.kind == OpKind.SOFTMAX for op in graph.ops)
    assert (f"bert-base on H100: {n_gemm + n_softmax} of {len(graph.compute_ops)} compute ops have a measured "
            f"shape") in text
    assert f"gemm {n_gemm}/{n_gemm}" in text and "matmul 0/24" in text
