"""``marssim cost``: per-layer table of a workload on every design of a system."""

from __future__ import annotations

import csv

import pytest

from marssim.cli import main
from marssim.cost import default_cost_model
from marssim.cost.report import design_costs
from marssim.system import load_system
from marssim.workload import GraphBuilder, register
from marssim.workload import registry


def _toynet(batch: int = 1):
    b = GraphBuilder("toynet", batch=batch)
    x = b.input("img", c=3, h=64, w=64)
    y = b.conv("conv1", x, 32, 3, stride=2)
    y = b.norm("bn1", y)
    y = b.eltwise("relu1", y, fn="relu")
    y = b.conv("dw", y, 32, 3, groups=32)
    y = b.conv("pw", y, 128, 1)
    y = b.global_pool("gap", y)
    y = b.flatten("flat", y)
    b.linear("fc", y, 100)
    return b.build()


@pytest.fixture
def toynet():
    register("cost-test-toynet", description="a small CNN for the cost verb's tests", batch=1)(_toynet)
    yield "cost-test-toynet"
    registry._ZOO.pop("cost-test-toynet", None)


def test_design_costs_marks_the_fastest_design_per_layer():
    graph, system = _toynet(), load_system("mars-adaptive-16")
    model = default_cost_model()
    result = design_costs(graph, system, model)
    assert [layer.op.name for layer in result.layers] == ["conv1", "dw", "pw", "fc"]
    assert result.design_names == tuple(system.designs)
    for layer in result.layers:
        times = [model.op_time(layer.op, system.design("acc0", n)) for n in result.design_names]
        assert layer.fastest == times.index(min(times))
    # layers disagree on the best design: the premise of computation-aware selection
    assert len({layer.fastest for layer in result.layers}) > 1
    everything = design_costs(graph, system, model, all_ops=True)
    assert len(everything.layers) == len(graph.compute_ops)


def test_cost_verb_prints_table_and_writes_csv(toynet, tmp_path, capsys):
    out = tmp_path / "costs.csv"
    assert main(["cost", toynet, "--system", "mars-adaptive-16", "--energy", "--csv", str(out)]) == 0
    text = capsys.readouterr().out
    for name in ("os32", "ws32", "nvdla64", "shi32", "rs16x32", "conv1", "fastest on", "energy uJ"):
        assert name in text
    dw_line = next(line for line in text.splitlines() if line.startswith("dw "))
    assert dw_line.split()[-1] == "shi32"  # depthwise: the output-pixel-parallel design wins
    rows = list(csv.DictReader(out.open()))
    assert [r["op"] for r in rows] == ["conv1", "dw", "pw", "fc"]
    graph, system = _toynet(), load_system("mars-adaptive-16")
    model = default_cost_model()
    for r in rows:
        op = graph.op(r["op"])
        assert float(r["ws32_s"]) == model.op_time(op, system.design("acc0", "ws32"))
        assert r["ws32_model"] == "systolic-ws"


def test_cost_verb_gpu_says_when_it_is_uncalibrated(toynet, capsys, monkeypatch, tmp_path):
    monkeypatch.setenv("MARSSIM_TRACES", str(tmp_path))
    assert main(["cost", toynet + ":batch=4", "--system", "dgx-h100", "--all"]) == 2  # the table is missing
    assert "no calibration table 'H100'" in capsys.readouterr().err
    assert main(["cost", toynet + ":batch=4", "--system", "dgx-h100", "--all", "--allow-uncalibrated"]) == 0
    text = capsys.readouterr().out
    assert "analytical GPU roofline" in text and "bn1" in text


def test_cost_verb_bad_input(toynet, tmp_path, capsys):
    assert main(["cost", toynet, "--system", "no-such-system"]) == 2
    assert main(["cost", "no-such-workload", "--system", "ring-8"]) == 2
    assert main(["cost", toynet, "--system", "ring-8", "--csv", str(tmp_path / "x.txt")]) == 2
    assert not (tmp_path / "x.txt").exists()
    err = capsys.readouterr().err
    assert err.count("marssim cost: error:") == 3


def test_cost_verb_on_resnet50(tmp_path, capsys):
    """The zoo's ResNet-50: 53 convs and 1 FC listed; per-layer winners differ between designs
    of the Herald-like SoC; the CSV agrees with the printed winners."""
    out = tmp_path / "r50.csv"
    assert main(["cost", "resnet50", "--system", "herald-soc", "--csv", str(out)]) == 0
    text = capsys.readouterr().out
    rows = list(csv.DictReader(out.open()))
    assert len(rows) == 54
    assert sum(r["kind"] == "conv" for r in rows) == 53 and rows[-1]["kind"] == "gemm"
    winners = {r["fastest"] for r in rows}
    assert len(winners) >= 2
    for r in rows:
        times = {name: float(r[f"{name}_s"]) for name in ("nvdla64", "shi32", "os16", "rs12x14")}
        assert r["fastest"] == min(times, key=times.get)
        line = next(line for line in text.splitlines() if line.startswith(r["op"] + " "))
        assert line.split()[-1] == r["fastest"]
