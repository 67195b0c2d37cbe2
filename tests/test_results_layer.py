"""The results layer both evaluators feed: one aggregation of bytes and of energy, the per-op and
per-layer report (checked against a schedule computed by hand and against invariants on real
mappings), the typed TaskGraph labels, the cost model recorded per op, and an estimate that gives
the same tables and a trace."""

from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd
import pytest

from marssim.analytical import estimate
from marssim.cli import main
from marssim.cost import default_cost_model
from marssim.data import topologies
from marssim.lower import lower
from marssim.mapping import Mapping, load_mapping
from marssim.results import layer_groups, resource_bytes
from marssim.sim import simulate
from marssim.system import load_system, system_from_dict
from marssim.taskgraph import COMPUTE, OpInfo, TaskGraphBuilder
from marssim.trace import write_chrome_trace
from marssim.workload import load_workload
from support import RooflineCost, make_system

GB = 1e9
EXAMPLE = topologies() / "mappings" / "mars-adaptive-16-resnet50.yaml"


# --------------------------------------------------------------------------- a schedule by hand
def _hand_graph():
    """acc0 runs op a (1 s) then op c (0.5 s); a's output (2 GB) goes to acc1 over a 50 GB/s link
    with 1 us latency, where op b runs 2 s. Critical path: a, the transfer, b."""
    system = make_system(2, topology="chain", bandwidth="50 GB/s", latency="1 us")
    b = TaskGraphBuilder(system)
    a = b.compute("acc0", 1.0, op="a", flops=10.0, energy=3.0)
    b.compute("acc0", 0.5, preds=[a], op="c", flops=5.0, energy=1.0, priority=2)
    x = b.transfer("acc0", "acc1", 2 * GB, preds=[a], op="b")
    b.compute("acc1", 2.0, preds=[x], op="b", flops=20.0, energy=float("nan"), priority=1)
    ops = (OpInfo("a", "conv", set=0, cost_model="systolic-os"), OpInfo("b", "gemm", set=1, cost_model="m1"),
           OpInfo("c", "eltwise", set=0, cost_model="bandwidth"))
    return b.build({"workload": "hand"}, ops=ops, device_design={"acc0": "os16", "acc1": "os16"}, batch=1), system


@pytest.mark.parametrize("evaluate", ["simulation", "estimate"])
def test_the_report_of_a_schedule_computed_by_hand(evaluate):
    tg, system = _hand_graph()
    result = simulate(tg, system, setup=False) if evaluate == "simulation" else estimate(tg, system).result()
    # the transfer: 1 us of latency plus 2e9 bytes over the tighter of the link (50 GB/s) and the
    # memory ports at both ends (make_system's 10 TB/s)
    xfer = 1e-6 + 2 * GB / (50 * GB)
    makespan = 1.0 + xfer + 2.0
    assert result.makespan == pytest.approx(makespan, rel=1e-12)
    ops = result.ops
    assert list(ops.index) == ["a", "b", "c"]
    assert ops.loc["a", "critical_s"] == pytest.approx(1.0) and ops.loc["c", "critical_s"] == 0.0
    assert ops.loc["b", "critical_s"] == pytest.approx(xfer + 2.0, rel=1e-12)
    assert ops["critical_share"].sum() == pytest.approx(1.0, rel=1e-12)
    assert ops.loc["b", "critical_share"] == pytest.approx((xfer + 2.0) / makespan, rel=1e-12)
    assert ops.loc["b", "bytes"] == 2 * GB and ops.loc["a", "bytes"] == 0
    assert ops.loc["b", "transfer_s"] == pytest.approx(xfer, rel=1e-12)
    assert ops.loc["c", "start_s"] == pytest.approx(1.0) and ops.loc["c", "end_s"] == pytest.approx(1.5)
    assert ops.loc["b", "start_s"] == pytest.approx(1.0) and ops.loc["b", "end_s"] == pytest.approx(makespan)
    assert list(ops["busy_max_s"]) == pytest.approx([1.0, 2.0, 0.5])
    assert list(ops["compute_energy_j"].fillna(-1)) == [3.0, -1, 1.0]  # b's design has no figure: unknown
    assert ops["comm_energy_j"].isna().all()  # no link has an energy figure
    assert list(ops["cost_model"]) == ["systolic-os", "m1", "bandwidth"]
    assert list(ops["flops"]) == [10.0, 20.0, 5.0]
    busy = result.op_devices.set_index(["op", "device"])["busy_s"]
    assert busy[("a", "acc0")] == pytest.approx(1.0) and busy[("b", "acc1")] == pytest.approx(2.0)
    assert result.compute_energy == pytest.approx(4.0) and math.isnan(result.communication_energy)


def test_communication_energy_is_bytes_times_the_links_energy_per_byte():
    data = {"name": "e", "designs": {"d": {"dataflow": "os", "pe_rows": 8, "pe_cols": 8, "clock": "1 GHz",
                                           "sram": "1 MiB", "sram_bandwidth": "64 GB/s"}},
            "accelerators": [{"id": "acc[0-2]", "design": "d", "memory": {"capacity": "1 GiB", "bandwidth": "1 TB/s"}}],
            "hosts": [{"id": "host0", "dram": {"capacity": "8 GiB", "bandwidth": "100 GB/s"}}],
            "links": [{"between": ["acc0", "acc1"], "bandwidth": "10 GB/s", "energy_per_byte": "8 pJ/B"},
                      {"between": ["acc1", "acc2"], "bandwidth": "10 GB/s", "energy_per_byte": "1 pJ/bit"},
                      {"between": ["host0", "acc0"], "bandwidth": "10 GB/s"}]}
    system = system_from_dict(data, "e.yaml")
    b = TaskGraphBuilder(system)
    first = b.compute("acc0", 1e-3, op="p")
    b.transfer("acc0", "acc2", 1000.0, preds=[first], op="q")  # over both links: 8 + 8 pJ per byte
    b.transfer("acc0", "acc1", 500.0, preds=[first], op="r")  # 8 pJ per byte
    tg = b.build(ops=(OpInfo("p"), OpInfo("q"), OpInfo("r")))
    expected = 1000.0 * 16e-12 + 500.0 * 8e-12
    sim = simulate(tg, system, setup=False)
    est = estimate(tg, system)
    assert sim.communication_energy == pytest.approx(expected, rel=1e-12)
    assert est.result().communication_energy == sim.communication_energy
    assert sim.ops.loc["q", "comm_energy_j"] == pytest.approx(1000.0 * 16e-12, rel=1e-12)
    assert sim.energy == pytest.approx(expected, rel=1e-12)  # no compute energy figure: communication alone
    assert est.energy == sim.energy


# --------------------------------------------------------------------------- real mappings
@pytest.fixture(scope="module")
def example():
    mapping, graph, system = load_mapping(EXAMPLE)
    return lower(graph, system, mapping, default_cost_model()), graph, system, mapping


def test_one_aggregation_of_bytes_agrees_with_a_route_by_route_sum(example):
    tg, _, system, _ = example
    expected = np.zeros(len(system.resource_names))
    for t in range(tg.n_tasks):  # every transfer's bytes on every resource of its route, by hand
        if tg.kind[t] != COMPUTE:
            for res in tg.routes[tg.route[t]].resources:
                expected[res] += tg.nbytes[t]
    sim = simulate(tg, system, setup=False)
    est = estimate(tg, system)
    assert np.allclose(resource_bytes(tg, system), expected, rtol=1e-12, atol=0)
    assert np.allclose(sim.links["bytes"].to_numpy(), expected, rtol=1e-12, atol=0)
    assert np.array_equal(est.links["bytes"].to_numpy(), sim.links["bytes"].to_numpy())
    assert np.array_equal(est.result().links["bytes"].to_numpy(), sim.links["bytes"].to_numpy())


def test_one_aggregation_of_energy(example):
    tg, _, system, _ = example
    e = tg.energy[tg.kind == COMPUTE]
    sim = simulate(tg, system, setup=False)
    assert sim.compute_energy == pytest.approx(float(np.nansum(e)), rel=1e-12)
    assert sim.energy == estimate(tg, system).energy  # one aggregation: bit-identical
    # the per-device column adds the same terms in another order (float rounding only)
    assert sim.devices["energy_j"].sum() == pytest.approx(sim.energy, rel=1e-12)
    assert sim.ops["compute_energy_j"].sum() == pytest.approx(sim.compute_energy, rel=1e-12)


def test_report_invariants_on_a_pipelined_mapping(example):
    tg, graph, system, mapping = example
    result = simulate(tg, system, setup=False)
    ops, layers = result.ops, result.layers
    assert list(ops.index) == [graph.ops[gi].name for gi in graph.compute_ops]
    assert ops["busy_s"].sum() == pytest.approx(result.devices["busy_s"].sum(), rel=1e-12)
    assert ops["bytes"].sum() == pytest.approx(float(tg.nbytes.sum()), rel=1e-12)
    assert ops["critical_s"].sum() <= result.makespan * (1 + 1e-12)
    assert (ops["start_s"] >= 0).all() and (ops["end_s"] <= result.makespan * (1 + 1e-12)).all()
    assert ops["tasks"].sum() == int((tg.op >= 0).sum())
    per_device = result.op_devices.groupby("device")["busy_s"].sum()
    assert np.allclose(per_device.reindex(result.devices.index).fillna(0.0), result.devices["busy_s"], rtol=1e-12)
    for col in ("tasks", "flops", "critical_s", "busy_s", "bytes"):
        assert layers[col].sum() == pytest.approx(ops[col].sum(), rel=1e-12), col
    assert list(layers.index) == list(dict.fromkeys(layer_groups(list(ops.index))))
    assert layers.loc["layer1.0", "ops"] == sum(1 for n in ops.index if n.startswith("layer1.0."))
    # the typed labels of the TaskGraph, not a dict the evaluators look into
    assert [op.sharding for op in tg.ops] == list(mapping.op_sharding)
    assert [op.set for op in tg.ops] == list(mapping.op_set)
    assert tg.device_design == {d: s.design for s in mapping.sets for d in s.devices}
    assert tg.batch == graph.batch
    assert not {"op_model", "op_kind", "op_loops", "op_sharding", "op_set", "device_design"} & set(tg.meta)


def test_each_op_records_the_cost_model_that_timed_it():
    """One device, sharding none: an op's shard is the op itself, so its cost model is what the
    cost model names for the op on that design."""
    system = load_system("mars-adaptive-16")
    graph = load_workload("resnet50:batch=1")
    cost = default_cost_model()
    mapping = Mapping.single_set(graph, system, devices=("acc0",), design="os32", sharding="none")
    tg = lower(graph, system, mapping, cost)
    design = system.design("acc0", "os32")
    expected = {graph.ops[gi].name: cost.op_cost(graph.ops[gi], design).model for gi in graph.compute_ops}
    assert {op.name: op.cost_model for op in tg.ops} == expected
    assert set(expected.values()) == {"systolic-os", "bandwidth"}
    report = simulate(tg, system, setup=False).layer_report()
    assert "systolic-os" in report.splitlines()[1] and "cost model" in report.splitlines()[0]


def test_the_estimate_gives_the_same_tables_and_a_trace(example, tmp_path):
    tg, _, system, _ = example
    sim = simulate(tg, system, setup=False)
    est = estimate(tg, system).result()
    for name in ("intervals", "devices", "links", "memories", "memory_timeline", "link_timeline", "ops", "layers",
                 "op_devices"):
        assert list(getattr(est, name).columns) == list(getattr(sim, name).columns), name
        assert getattr(est, name).index.name == getattr(sim, name).index.name, name
    assert est.makespan == estimate(tg, system).makespan and est.meta["evaluator"] == "analytical"
    assert len(est.intervals) == tg.n_tasks
    size = write_chrome_trace(est, tmp_path / "est.json")
    events = json.loads((tmp_path / "est.json").read_text())["traceEvents"]
    assert size > 0 and sum(1 for e in events if e.get("ph") == "X" and e.get("cat") == "compute") == \
        int((tg.kind == COMPUTE).sum())


def test_the_estimated_timelines_of_one_flow():
    """One transfer alone: the link carries it at its bottleneck rate for bytes/rate seconds; the
    receiver's memory holds it from the transfer's start until its reader ends."""
    tg, system = _hand_graph()
    est = estimate(tg, system)
    result = est.result()
    link = result.links.loc["acc0->acc1"]
    assert link["busy_s"] == pytest.approx(2 * GB / (50 * GB), rel=1e-12)
    rates = result.link_timeline[result.link_timeline.resource == "acc0->acc1"]
    assert list(rates["rate"]) == [50 * GB, 0.0] and list(rates["time"]) == pytest.approx([1.0, 1.0 + 0.04])
    assert result.memories.loc["acc1", "peak_bytes"] == 2 * GB


# --------------------------------------------------------------------------- files and CLI
def test_simulate_out_writes_ops_with_times_and_layers(tmp_path, capsys):
    assert main(["simulate", "--mapping", str(EXAMPLE), "--out", str(tmp_path / "run")]) == 0
    out = capsys.readouterr().out
    assert "layer group" in out and "critical" in out and "layer4.2" in out
    ops = pd.read_csv(tmp_path / "run" / "ops.csv", index_col="op")
    for col in ("start_s", "end_s", "critical_s", "critical_share", "busy_s", "bytes", "cost_model", "group"):
        assert col in ops.columns, col
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert ops["end_s"].max() == pytest.approx(summary["makespan_s"], rel=1e-12)
    layers = pd.read_csv(tmp_path / "run" / "layers.csv", index_col="group")
    assert layers["critical_s"].sum() == pytest.approx(ops["critical_s"].sum(), rel=1e-9)
    from marssim.results import Result

    again = Result.load(tmp_path / "run")
    assert again.ops["critical_s"].tolist() == pytest.approx(ops["critical_s"].tolist(), rel=1e-12)


def test_estimate_verb_prints_the_same_report(tmp_path, capsys):
    args = ["--system", "ring-8", "--workload", "resnet50:batch=2", "--group", "stage"]
    assert main(["estimate", *args, "--trace", str(tmp_path / "t.json")]) == 0
    out = capsys.readouterr().out
    assert "analytical estimate" in out and "lower bound" in out and "layer3" in out and "layer3.1" not in out
    assert (tmp_path / "t.json").is_file()


def test_layer_groups_from_names():
    names = ["conv1", "bn1", "layer1.0.conv1", "layer1.0.relu", "layer1.1.conv1", "avgpool", "fc"]
    assert layer_groups(names) == ["conv1 .. bn1", "conv1 .. bn1", "layer1.0", "layer1.0", "layer1.1",
                                   "avgpool .. fc", "avgpool .. fc"]
    assert layer_groups(names, "stage")[2:5] == ["layer1"] * 3
    assert layer_groups(["h.0.attn", "h.11.mlp", "ln_f"]) == ["h.0", "h.11", "ln_f"]
    assert layer_groups(["a/conv1", "a/fc", "b/conv1"]) == ["a/conv1 .. fc", "a/conv1 .. fc", "b/conv1"]


def test_missing_calibration_table_is_an_error_unless_the_fallback_is_asked_for(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("MARSSIM_TRACES", str(tmp_path))  # no calibration/ here
    case = ["simulate", "--system", "dgx-h100", "--workload", "gpt2:batch=1,seq=64", "--no-report"]
    assert main(case) == 2
    err = capsys.readouterr().err
    assert "'H100'" in err and str(tmp_path / "calibration") in err and "--allow-uncalibrated" in err
    assert main([*case, "--allow-uncalibrated", "--out", str(tmp_path / "run")]) == 0
    err = capsys.readouterr().err
    assert "warning" in err and "'H100'" in err
    ops = pd.read_csv(tmp_path / "run" / "ops.csv", index_col="op")
    assert set(ops["cost_model"]) == {"gpu-roofline"}


def test_the_shipped_table_times_the_gpu_ops():
    system = load_system("dgx-h100")
    graph = load_workload("gpt2:batch=1,seq=64")
    tg = lower(graph, system, Mapping.single_set(graph, system), default_cost_model())
    models = {op.cost_model for op in tg.ops}
    assert models <= {"measured", "fitted", "gpu-roofline", "measured+fitted", "fitted+measured"}
    assert any("measured" in m or "fitted" in m for m in models)


def test_a_roofline_model_asked_for_is_not_an_error():
    graph = load_workload("gpt2:batch=1,seq=64")
    system = load_system("dgx-h100")
    tg = lower(graph, system, Mapping.single_set(graph, system), RooflineCost())
    assert {op.cost_model for op in tg.ops} == {"test-roofline"}
