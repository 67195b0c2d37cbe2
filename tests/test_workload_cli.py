"""`marssim workloads` and `marssim show WORKLOAD`: what they print and how bad specs fail."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from marssim.cli import main
from marssim.workload import load_workload, zoo_entries
from marssim.workload.describe import describe_graph, fmt_count

# GMACs at the defaults, to the precision REFERENCE.md gives (mixes: sums of their parts)
EXPECTED_GMACS = {"resnet50": "4.089", "vgg16": "15.47", "bert-base": "11.17", "gpt2": "106.3",
                  "vit-b16": "17.56", "mix-vision": "19.86", "mix-nlp-vision": "15.26"}


def _mib(n: int) -> str:
    return f"{n / 2**20:.4g} MiB"


def test_workloads_lists_the_zoo_with_defaults_gmacs_and_onnx(capsys) -> None:
    assert main(["workloads"]) == 0
    out = capsys.readouterr().out
    rows = {line.split()[0]: line for line in out.splitlines()[1:] if line and not line.startswith(" ")}
    for name, entry in zoo_entries().items():
        if entry.group != "zoo":  # LLM families and presets: their own table (test_llm_workloads)
            continue
        row = rows[name]
        assert entry.description in row
        assert f" {len(load_workload(name))} " in row
        for key, value in entry.defaults.items():
            assert f"{key}={str(value).lower() if isinstance(value, bool) else value}" in row
    for name, gmacs in EXPECTED_GMACS.items():
        assert f"  {gmacs}  " in rows[name], rows[name]
    assert "model.onnx:batch=8" in out and "marssim[onnx]" in out


def test_show_resnet50_prints_totals_kinds_and_every_layer(capsys) -> None:
    assert main(["show", "resnet50"]) == 0
    out = capsys.readouterr().out
    graph = load_workload("resnet50")
    assert out.startswith("Workload resnet50  (spec resnet50)\n  batch 1, 1 model (resnet50), dtype fp16")
    assert "4.089 GMACs (4,089,184,256 MACs)" in out
    assert f"weights {_mib(2 * 25_557_032)} (25,557,032 parameters)" in out
    kinds = {line.split()[0]: line.split()[1] for line in out.split("Ops by kind")[1].split("\n\n")[0].splitlines()[2:]}
    assert kinds == {"input": "1", "conv": "53", "gemm": "1", "pool": "2", "eltwise": "65", "norm": "53",
                     "reshape": "1"}
    table = out.split("GEMM-like layers (54 of 176 ops")[1]
    names = [line.split()[0] for line in table.splitlines()[2:]]
    assert names == [op.name for op in graph.ops if op.is_gemm_like]
    assert "  conv1  " in table and "3->64 7x7/2 224x224->112x112" in table
    assert "  fc  " in table and "2048->1000" in table


def test_show_bert_512_shortens_the_layer_table_with_a_note(capsys) -> None:
    assert main(["show", "bert-base:seq=512"]) == 0
    out = capsys.readouterr().out
    assert "48.32 GMACs" in out and "(spec bert-base:seq=512)" in out
    assert "GEMM-like layers (96 of 175 ops" in out
    assert "... 36 more layers not shown ..." in out  # 96 layers, 30 first and 30 last shown
    assert "encoder.layer.0.attention.self.query " in out and "encoder.layer.11.output.dense " in out
    assert "encoder.layer.5." not in out
    assert "12x 512x64 @ 64x512" in out  # Q K^T per head


def test_small_graphs_list_every_op() -> None:
    graph = load_workload("vgg16")
    text = describe_graph(graph)
    assert f"Ops ({len(graph)})" in text
    for op in graph.ops:
        assert f"\n  {op.name} " in text
    assert "max 2x2/2 ->112x112" in text


def test_show_multi_model_lists_each_model(capsys) -> None:
    assert main(["show", "mix-nlp-vision:batch=2"]) == 0
    out = capsys.readouterr().out
    models = out.split("\nModels\n")[1].split("\n\n")[0].splitlines()
    assert models[1].split()[:3] == ["bert-base", "175", "22.35"] and models[2].split()[:3] == ["resnet50", "176", "8.178"]


def test_show_an_onnx_file(capsys) -> None:
    onnx = pytest.importorskip("onnx")
    path = Path(os.path.dirname(onnx.__file__)) / "backend/test/data/light/light_resnet50.onnx"
    assert main(["show", f"{path}:batch=2"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("Workload light_resnet50")
    assert "batch 2" in out and "8.178 GMACs" in out and "dtype fp32" in out


@pytest.mark.parametrize("spec,message", [
    ("resnet50:batch=0", "resnet50:batch=0: batch: expected a positive integer, got '0'"),
    ("resnet50:depth=101", "resnet50:depth=101: depth: unknown parameter for resnet50"),
    ("bert-base:seq=4096", "bert-base:seq=4096: seq: expected 1..512 tokens"),
    ("no-such-model:batch=2", "no-such-model:batch=2: no such file, shipped system or workload"),
])
def test_bad_specs_exit_2_with_one_line(spec: str, message: str, capsys) -> None:
    assert main(["show", spec]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"marssim show: error: {message}")


def test_a_broken_onnx_file_exits_2(tmp_path: Path, capsys) -> None:
    pytest.importorskip("onnx")
    broken = tmp_path / "broken.onnx"
    broken.write_bytes(b"\x08\x07garbage")
    assert main(["show", str(broken)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"marssim show: error: {broken}: not a valid ONNX model") and "Traceback" not in err


def test_fmt_count() -> None:
    assert fmt_count(4_089_184_256, "MACs") == "4.089 GMACs"
    assert fmt_count(999) == "999" and fmt_count(1500, "FLOP") == "1.5 kFLOP"
