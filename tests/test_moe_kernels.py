"""Measured fused mixture-of-experts operators: the curve between measured token counts, the
table's round trip and refusals, the importer's columns, and a serving iteration's experts timed
by the operator where the design's stacks measured the layer."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

import marssim.cost.moe_kernels as mk
from marssim.cli import main
from marssim.cost.moe_kernels import (
    BALANCED, MoeKernelRow, MoeShape, curves, load_moe_kernels, merge_moe_kernels, moe_curve, shipped_moe_curves,
)
from marssim.errors import InputError
from marssim.serve import load_model
from marssim.serve.itermodel import IterationModel

SMALL = "moe:layers=2,hidden=512,heads=8,kv_heads=2,ffn=1024,experts=8,top_k=2,vocab=1000"
STACK = "trtllm-1.3.0rc20"


def _shape(**kw) -> MoeShape:
    base = dict(device="H100", stack=STACK, dtype="bf16", hidden=512, inter=1024, top_k=2, experts=8, moe_tp=1,
                moe_ep=1, distribution=BALANCED)
    base.update(kw)
    return MoeShape(**base)


def _rows(shape: MoeShape, points: dict[int, float], kernel: str = "moe_torch_flow_cutlass") -> list[MoeKernelRow]:
    return [MoeKernelRow(shape, t, s, kernel, "aiconfigurator-core", "9.9.9", "Apache-2.0", "f.parquet", "2026-01-02")
            for t, s in points.items()]


def test_the_curve_is_exact_at_measured_tokens_log_linear_between_and_proportional_beyond():
    curve = curves(_rows(_shape(), {1: 1e-4, 4: 4e-4, 16: 8e-4}))[_shape()]
    assert curve(1) == 1e-4 and curve(4) == 4e-4 and curve(16) == 8e-4
    assert curve(2) == pytest.approx(2e-4, rel=1e-12)  # on the line through (ln 1, ln 1e-4) and (ln 4, ln 4e-4)
    assert curve(8) == pytest.approx(math.sqrt(4e-4 * 8e-4), rel=1e-12)  # the geometric mean at the log midpoint
    assert curve(64) == pytest.approx(8e-4 * 64 / 16, rel=1e-12)
    assert all(curve(t) <= curve(t + 1) for t in range(1, 80))


def test_of_two_operators_at_one_token_count_the_faster_times_it():
    shape = _shape()
    rows = _rows(shape, {8: 3e-4}, "moe_torch_flow") + _rows(shape, {8: 2e-4, 16: 5e-4})
    assert curves(rows)[shape](8) == 2e-4


def test_the_table_round_trips_and_a_merge_replaces_its_device_and_stack(tmp_path):
    path = tmp_path / "H100-x.csv"
    first = _rows(_shape(), {1: 1e-4, 2: 2e-4}) + _rows(_shape(stack="vllm-0.24.0"), {1: 3e-4})
    merge_moe_kernels(path, first, "first import")
    assert set(load_moe_kernels(path)) == set(first)
    again = _rows(_shape(), {4: 5e-4})
    merge_moe_kernels(path, again, "second import")
    got = load_moe_kernels(path)
    assert {(r.shape.stack, r.tokens) for r in got} == {("vllm-0.24.0", 1), (STACK, 4)}
    text = path.read_text()
    assert "# first import" in text and "# second import" in text


@pytest.mark.parametrize("cell,value,expected", [("tokens", "x", "integer"), ("seconds", "-1", "positive"),
                                                  ("moe_ep", "0", "positive"), ("device", "", "empty")])
def test_a_bad_cell_names_the_file_line_and_column(tmp_path, cell, value, expected):
    path = tmp_path / "bad.csv"
    merge_moe_kernels(path, _rows(_shape(), {1: 1e-4}), "c")
    lines = path.read_text().splitlines()
    header = lines[1].split(",")
    cells = lines[2].split(",")
    cells[header.index(cell)] = value
    path.write_text("\n".join(lines[:2] + [",".join(cells)]) + "\n")
    with pytest.raises(InputError) as err:
        load_moe_kernels(path)
    text = str(err.value)
    assert str(path) in text and f"line 3, {cell}" in text and expected in text


def test_a_row_with_more_cells_than_columns_is_refused(tmp_path):
    path = tmp_path / "bad.csv"
    merge_moe_kernels(path, _rows(_shape(), {1: 1e-4}), "c")
    path.write_text(path.read_text().rstrip("\n") + ",extra\n")
    with pytest.raises(InputError, match="line 3"):
        load_moe_kernels(path)


def test_a_missing_column_is_named(tmp_path):
    path = tmp_path / "bad.csv"
    path.write_text("device,stack\nH100,x\n")
    with pytest.raises(InputError, match="missing dtype, tokens, hidden"):
        load_moe_kernels(path)


def test_a_merge_of_no_rows_is_refused(tmp_path):
    with pytest.raises(InputError, match="got none"):
        merge_moe_kernels(tmp_path / "x.csv", [], "c")
    assert not (tmp_path / "x.csv").exists()


def test_the_tables_are_read_from_marssim_traces_where_set(tmp_path, monkeypatch):
    """As the calibration tables: ``$MARSSIM_TRACES/moe-kernels`` replaces the shipped tables."""
    monkeypatch.setenv("MARSSIM_TRACES", str(tmp_path))
    (tmp_path / "moe-kernels").mkdir()
    merge_moe_kernels(tmp_path / "moe-kernels" / "mine.csv", _rows(_shape(), {1: 7e-5}), "mine")
    assert mk.moe_kernels_dir() == tmp_path / "moe-kernels"
    table = shipped_moe_curves()
    assert list(table) == [_shape()] and table[_shape()](1) == 7e-5


def test_the_lookup_takes_the_first_stack_that_measured_the_layer():
    table = curves(_rows(_shape(), {1: 1e-4}) + _rows(_shape(stack="vllm-0.24.0"), {1: 3e-4}))
    assert moe_curve("H100", ("pytorch-2.11.0+cu130", "vllm-0.24.0", STACK), "bf16", 512, 1024, 2, 8, 1, 1,
                     table=table)(1) == 3e-4
    assert moe_curve("H100", STACK, "bf16", 512, 1024, 2, 8, 1, 1, table=table)(1) == 1e-4
    assert moe_curve("H100", STACK, "fp8", 512, 1024, 2, 8, 1, 1, table=table) is None
    assert moe_curve("H200", STACK, "bf16", 512, 1024, 2, 8, 1, 1, table=table) is None


def _measured(monkeypatch, points: dict[int, float], **kw) -> None:
    table = curves(_rows(_shape(**kw), points))
    monkeypatch.setattr(mk, "shipped_moe_curves", lambda: table)


@pytest.mark.parametrize("tp,ep", [(1, 1), (4, 1), (4, 4)])
def test_a_serving_iteration_takes_the_measured_operator(monkeypatch, cost, dgx, tp, ep):
    """With the operator measured for the layer split as the replica splits it (``moe_tp = tp /
    ep``, ``moe_ep = ep``), the experts' compute is the curve at the iteration's tokens and their
    communication is unchanged; under skewed routing, or for another split, the ops one by one."""
    gpus = tuple(f"gpu{i}" for i in range(tp))
    model = load_model(SMALL)
    plain = IterationModel(model, dgx, (gpus,), cost, ep=ep)
    assert plain.expert_curves == (None,)
    assert "one by one" in plain.experts_timing
    _measured(monkeypatch, {1: 1e-4, 64: 2e-4, 4096: 9e-4}, moe_tp=tp // ep, moe_ep=ep)
    im = IterationModel(model, dgx, (gpus,), cost, ep=ep)
    assert im.expert_curves[0] is not None
    assert im.experts_timing.startswith("the measured fused MoE operator") and f"tp {tp // ep} x ep {ep}" in \
        im.experts_timing
    for count in (1, 37, 64, 5000):
        seconds, comm, _, _ = im._experts_time(0, count)
        _, comm_plain, _, _ = plain._experts_time(0, count)
        assert comm == comm_plain
        assert seconds - comm == pytest.approx(im.expert_curves[0](count), rel=1e-12)
    skewed = IterationModel(load_model(SMALL + ",expert_load=5/1/1/1/1/1/1/1"), dgx, (gpus,), cost, ep=ep)
    assert skewed.expert_curves == (None,)
    if tp > 1:  # the other split of the replica was not measured
        assert IterationModel(model, dgx, (gpus,), cost, ep=tp if ep == 1 else 1).expert_curves == (None,)


def test_the_fp8_experts_take_the_fp8_operator(monkeypatch, cost, dgx):
    _measured(monkeypatch, {1: 1e-4, 64: 2e-4}, dtype="fp8")
    assert IterationModel(load_model(SMALL), dgx, (("gpu0",),), cost).expert_curves == (None,)
    assert IterationModel(load_model(SMALL + ",dtype=fp8"), dgx, (("gpu0",),), cost).expert_curves[0](64) == 2e-4


def test_the_measured_operator_routes_itself(monkeypatch, cost, dgx):
    """With the measured operator the token-wise piece leaves out the router's top-k (the operator
    runs it): exactly that op's time less, at every token count."""
    model = load_model(SMALL)
    plain = IterationModel(model, dgx, (("gpu0",),), cost)
    topk = next((op, r) for op, r in plain.token_ops if op.name.endswith(".moe.topk"))
    _measured(monkeypatch, {1: 1e-4, 64: 2e-4})
    im = IterationModel(model, dgx, (("gpu0",),), cost)
    from marssim.serve.itermodel import resize_tokens

    for tokens in ((1, 1), (4, 33), (2, 300)):
        alone = im._shards([(resize_tokens(topk[0], *tokens, im.ref_tokens), topk[1])], 0)[0]
        assert plain._tokens_time(0, tokens)[0] - im._tokens_time(0, tokens)[0] == pytest.approx(alone, rel=1e-9)


def test_an_nvfp4_moe_model_serves_its_experts_one_by_one(cost):
    """NVFP4 (no measured operator shipped): the amax and cast before each expert GEMM are in the
    experts' piece, the model builds on a B200 node and serves every request."""
    from marssim.serve import Deployment, Pool, Requests
    from marssim.serve.simulate import simulate_serving
    from marssim.system import load_system

    b200 = load_system("dgx-b200-cluster:nodes=1")
    model = load_model(SMALL + ",dtype=fp4")
    im = IterationModel(model, b200, (("gpu0", "gpu1"),), cost)
    names = {op.name.split(".moe.")[-1] for op, _ in im._experts.ops}
    assert {"dispatch.amax", "dispatch.fp4", "act.amax", "act.fp4"} <= names
    assert im.expert_curves == (None,)
    result = simulate_serving(Deployment((Pool(replicas=1, tp=2),)), model, b200, cost,
                              Requests.of([0.0, 0.001], [100, 40], [4, 3]))
    assert result.summary["completed"] == 2


def test_fp8_casts_of_the_experts_at_tp2_are_sized_as_their_buffers(cost, dgx):
    """At tp 2 (ep 1) every GPU casts its experts' whole dispatched tokens (the hidden width not
    split) and its half of the activation (the column-parallel split), for the tokens each of its
    experts runs."""
    model = load_model(SMALL + ",dtype=fp8")
    seen = {}

    class Recording:
        def __getattr__(self, name):
            return getattr(cost, name)

        def op_cost(self, op, design):
            seen[op.name.split(".moe.")[-1]] = op.loop_dict
            return cost.op_cost(op, design)

    im = IterationModel(model, dgx, (("gpu0", "gpu1"),), Recording())
    count = 300
    local, m = im.expert_work(count)
    seen.clear()
    im._experts_time(0, count)
    assert seen["dispatch.fp8"] == {"N": local, "C": 512, "H": m, "W": 1}
    assert seen["act.fp8"] == {"N": local, "C": 1024 // 2, "H": m, "W": 1}
    assert seen["gate"]["N"] == 1024 // 2 and seen["down"]["K"] == 1024 // 2


def test_the_shipped_tables_cover_mixtral_on_hopper_and_blackwell():
    """Every shipped GPU has Mixtral 8x7B's layer at tp 1-8 in bf16 and fp8 (the presets' subset),
    each curve measured from 1 to 16,384 tokens, the largest count the slowest."""
    table = shipped_moe_curves()
    for device in ("H100", "H200", "B200", "GB200"):
        for dtype in ("bf16", "fp8"):
            for tp in (1, 2, 4, 8):
                c = moe_curve(device, STACK, dtype, 4096, 14336, 2, 8, tp, 1, table=table)
                assert c is not None, (device, dtype, tp)
                assert c.tokens[0] == 1 and c.tokens[-1] == 16384
                assert c.seconds[-1] == max(c.seconds)
        fp4 = moe_curve(device, STACK, "fp4", 4096, 14336, 2, 8, 1, 1, table=table)
        assert (fp4 is not None) == (device in ("B200", "GB200"))  # NVFP4: Blackwell only


def test_the_importer_writes_each_column(tmp_path):
    pd = pytest.importorskip("pandas")
    pytest.importorskip("pyarrow")
    root = tmp_path / "site"
    (root / "aiconfigurator_core-9.9.9.dist-info").mkdir(parents=True)
    where = root / "aiconfigurator_core" / "systems" / "data" / "h100_sxm" / "moe" / "trtllm" / "1.3.0rc20"
    where.mkdir(parents=True)
    cols = ["kernel_source", "moe_dtype", "num_tokens", "hidden_size", "inter_size", "topk", "num_experts",
            "moe_tp_size", "moe_ep_size", "distribution", "latency"]
    given = [("moe_torch_flow_cutlass", "fp8", 16, 4096, 14336, 2, 8, 2, 1, "balanced", 0.25),
             ("moe_torch_flow_cutlass", "bfloat16", 16, 4096, 14336, 2, 8, 2, 1, "balanced", 0.5),
             ("moe_torch_flow_cutlass", "bfloat16", 16, 4096, 14336, 2, 8, 2, 1, "power_law_1.2", 0.6),
             ("moe_torch_flow_nongated", "bfloat16", 16, 4096, 14336, 2, 8, 2, 1, "balanced", 0.4),
             ("moe_torch_flow_cutlass", "fp8_block", 16, 4096, 14336, 2, 8, 2, 1, "balanced", 0.3),
             ("moe_torch_flow_cutlass", "bfloat16", 16, 1024, 2688, 22, 512, 2, 1, "balanced", 0.1)]
    pd.DataFrame(given, columns=cols).to_parquet(where / "moe_perf.parquet")
    out = tmp_path / "moe"
    assert main(["calibrate", "import", "aiconfigurator", "--from", str(root), "--date", "2026-01-02",
                 "--aic-gpus", "h100_sxm", "--out", str(out), "--families", "moe"]) == 0
    rows = load_moe_kernels(out / "H100-aiconfigurator-moe.csv")
    # default subset: the presets' shapes, balanced routing, gated operators, bf16 and fp8
    assert sorted((r.shape.dtype, r.seconds) for r in rows) == [("bf16", pytest.approx(5e-4)),
                                                                ("fp8", pytest.approx(2.5e-4))]
    r = rows[0]
    assert (r.shape.device, r.shape.stack, r.shape.hidden, r.shape.inter, r.shape.top_k, r.shape.experts,
            r.shape.moe_tp, r.shape.moe_ep, r.tokens) == ("H100", STACK, 4096, 14336, 2, 8, 2, 1, 16)
    assert (r.source, r.version, r.license, r.date) == ("aiconfigurator-core", "9.9.9", "Apache-2.0", "2026-01-02")
    assert main(["calibrate", "import", "aiconfigurator", "--from", str(root), "--date", "2026-01-02",
                 "--aic-gpus", "h100_sxm", "--out", str(out), "--families", "moe", "--shapes", "all"]) == 0
    assert len(load_moe_kernels(out / "H100-aiconfigurator-moe.csv")) == 4  # every distribution and shape
    assert Path(out / "H100-aiconfigurator-moe.csv").read_text().startswith("# aiconfigurator-core 9.9.9")
    # GEMMs and MoE operators imported into one directory: two tables, each its own schema
    gemm = root / "aiconfigurator_core" / "systems" / "data" / "h100_sxm" / "gemm" / "trtllm" / "1.3.0rc20"
    gemm.mkdir(parents=True)
    pd.DataFrame([("NVIDIA H100 80GB HBM3", "torch_flow", "bfloat16", 16, 4096, 4096, 0.02)],
                 columns=["device", "kernel_source", "gemm_dtype", "m", "n", "k", "latency"]).to_parquet(
        gemm / "gemm_perf.parquet")
    both = tmp_path / "both"
    assert main(["calibrate", "import", "aiconfigurator", "--from", str(root), "--date", "2026-01-02",
                 "--aic-gpus", "h100_sxm", "--out", str(both), "--families", "gemm,moe"]) == 0
    from marssim.cost.calibrated import load_table

    assert len(load_table(both / "H100-aiconfigurator.csv").rows) == 1
    assert len(load_moe_kernels(both / "H100-aiconfigurator-moe.csv")) == 2


def test_the_report_and_replicas_table_name_the_measured_operator(cost, dgx, tmp_path):
    """Mixtral 8x7B's layer (two blocks) at tp 2 on the H100 node: the shipped TensorRT-LLM
    operator times its experts, and the text report and ``replicas.csv`` say so."""
    import pandas as pd

    from marssim.serve import Deployment, Pool, Requests
    from marssim.serve.outputs import report_lines, write_tables
    from marssim.serve.simulate import simulate_serving

    model = load_model("mixtral-8x7b:layers=2")
    result = simulate_serving(Deployment((Pool(replicas=1, tp=2),)), model, dgx, cost,
                              Requests.of([0.0, 0.001], [100, 40], [4, 3]))
    line = next(x for x in report_lines(result) if x.startswith("pool 0 experts: "))
    assert "the measured fused MoE operator (aiconfigurator-core 0.12.0 trtllm-1.3.0rc20, H100, bf16, tp 2 x ep 1" \
        in line
    kernels = next(x for x in report_lines(result) if x.startswith("pool 0 kernels: "))
    assert kernels == "pool 0 kernels: h100: H100 tables of stack pytorch-2.11.0+cu130 (trtllm-1.3.0rc20 for the " \
        "families it lacks), collectives by NCCL's model"
    write_tables(result, tmp_path)
    table = pd.read_csv(tmp_path / "replicas.csv")
    assert table["experts"].iloc[0] == line.removeprefix("pool 0 experts: ")
    assert table["kernels"].iloc[0] == kernels.removeprefix("pool 0 kernels: ")


def test_kernel_sources_name_tables_stacks_attention_and_collectives():
    from marssim.cost.model import kernel_sources
    from marssim.system import load_system

    h100 = load_system("dgx-h100-cluster:nodes=1,attention_kernels=pytorch-24.03-h200").designs["h100"]
    assert kernel_sources(h100) == ("h100: H100 tables of stack pytorch-2.11.0+cu130 (trtllm-1.3.0rc20 for the "
                                    "families it lacks), prompt attention pytorch-24.03-h200, collectives "
                                    "nccl-2.29.2")
    h200 = load_system("dgx-h200-cluster:nodes=1").designs["h200"]
    assert kernel_sources(h200) == "h200: H200 tables of stack trtllm-1.3.0rc20, collectives nccl-2.29.2"
    bare = h200.model_copy(update={"gpu": h200.gpu.model_copy(update={"calibration": None})})
    assert kernel_sources(bare) == "h200: every kernel by the roofline (no calibration table named)"
    eyeriss = next(d for d in load_system("mars-adaptive-16").designs.values() if d.gpu is None)
    assert kernel_sources(eyeriss) == ""


def test_a_run_report_names_what_timed_each_gpu_design(cost):
    """A parallel run's report has one ``kernels`` line per GPU design it uses, in order."""
    from marssim.parallel.config import ParallelConfig
    from marssim.plan.run import run
    from marssim.system import load_system
    from marssim.workload import load_workload

    system = load_system("mixed-a100-h100-cluster")
    graph = load_workload("gpt:layers=2,hidden=256,heads=4,vocab=1000,seq=64,mode=train,max_positions=64,batch=1")
    done = run(ParallelConfig(tp=1, pp=2, dp=32, global_batch=64, micro_batch=1), graph, system, cost,
               how="estimate")
    kernels = [x for x in done.report.lines() if x.startswith("kernels") or x.startswith(" " * 19 + "h100")]
    assert len(done.report.kernels) == 2
    assert done.report.kernels[0].startswith("a100: A100 tables of stack vidur-2024")
    assert done.report.kernels[1].startswith("h100: H100 tables of stack pytorch-2.11.0+cu130")
    assert kernels[0] == "kernels            " + done.report.kernels[0]
