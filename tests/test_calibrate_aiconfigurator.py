"""AIConfigurator's measured GEMM timings as calibration rows: the converter on a small package laid
out as aiconfigurator-core lays out its data (closed forms of every converted column), the shipped
H100/H200/B200 subsets (provenance on every row, physical relations between dtypes), and the
cost model timing a design's GEMMs from them by its software stack: a grid shape as measured, a
shape between grid points between its measured neighbours."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from marssim.calibrate.aiconfigurator import AIC_LICENSE, AIC_SOURCE, gemm_rows
from marssim.cli import main
from marssim.cost import default_cost_model, load_table
from marssim.data import calibration
from marssim.errors import InputError
from marssim.serve import load_model
from marssim.system import load_system
from marssim.workload.llm import build_transformer
from marssim.workload.llm.config import with_overrides

STACK = "trtllm-1.3.0rc20"
SHIPPED = ("H100", "H200", "B200")


def _package(tmp_path: Path, rows: list[tuple], version: str = "1.3.0rc20") -> Path:
    """A directory laid out as the installed package: dist-info beside ``aiconfigurator_core/``,
    ``systems/data/h100_sxm/gemm/trtllm/<version>/gemm_perf.parquet`` holding ``rows``
    ``(gemm_dtype, m, n, k, latency_ms)``."""
    pd = pytest.importorskip("pandas")
    pytest.importorskip("pyarrow")
    root = tmp_path / "site"
    (root / "aiconfigurator_core-9.9.9.dist-info").mkdir(parents=True)
    where = root / "aiconfigurator_core" / "systems" / "data" / "h100_sxm" / "gemm" / "trtllm" / version
    where.mkdir(parents=True)
    frame = pd.DataFrame(rows, columns=["gemm_dtype", "m", "n", "k", "latency"])
    frame.insert(0, "kernel_source", "torch_flow")
    frame.insert(0, "device", "NVIDIA H100 80GB HBM3")
    frame.to_parquet(where / "gemm_perf.parquet")
    return root


def test_the_converter_writes_each_column_in_closed_form(tmp_path):
    given = [("bfloat16", 4096, 8192, 1024, 0.1), ("fp8", 4096, 8192, 1024, 0.06), ("fp8_block", 4096, 8192, 1024, 0.07),
             ("bfloat16", 4097, 8192, 1024, 0.11), ("nvfp4", 16, 256, 512, 0.004)]
    root = _package(tmp_path, given)
    out = tmp_path / "cal"
    assert main(["calibrate", "import", "aiconfigurator", "--from", str(root), "--date", "2026-01-02",
                 "--aic-gpus", "h100_sxm", "--out", str(out), "--families", "gemm"]) == 0
    table = load_table(out / "H100-aiconfigurator.csv")
    got = {(r.dtype, r.m, r.n, r.k): r for r in table.rows}
    # fp8_block has no dtype of the schema; m=4097 is outside the default subset
    assert set(got) == {("bf16", 4096, 8192, 1024), ("fp8", 4096, 8192, 1024), ("fp4", 16, 256, 512)}
    for (dtype, m, n, k), r in got.items():
        theirs = {"bf16": "bfloat16", "fp8": "fp8", "fp4": "nvfp4"}[dtype]
        ms = next(lat for d, mm, nn, kk, lat in given if (d, mm, nn, kk) == (theirs, m, n, k))
        assert r.median_s == pytest.approx(ms / 1e3, rel=1e-6)
        assert r.flops == 2 * m * n * k
        width = {"bf16": 2, "fp8": 1, "fp4": 0.5625}[dtype]
        assert r.bytes == round((m * k + k * n) * width + 2 * m * n)
        assert (r.kind, r.batch, r.device, r.sms, r.tuning, r.stack) == ("gemm", 1, "H100", 132, "vendor", STACK)
        assert f"source={AIC_SOURCE} 9.9.9" in r.note and f"license={AIC_LICENSE}" in r.note
        assert r.date == "2026-01-02"
    assert "aiconfigurator-core 9.9.9" in (out / "H100-aiconfigurator.csv").read_text().splitlines()[0]
    # every shape with --shapes all; re-running merges (idempotent)
    assert main(["calibrate", "import", "aiconfigurator", "--from", str(root), "--date", "2026-01-02",
                 "--aic-gpus", "h100_sxm", "--out", str(out), "--shapes", "all", "--families", "gemm"]) == 0
    assert len(load_table(out / "H100-aiconfigurator.csv")) == 4


def test_a_missing_version_is_one_error_naming_those_there(tmp_path, capsys):
    root = _package(tmp_path, [("bfloat16", 1, 256, 256, 0.003)])
    assert main(["calibrate", "import", "aiconfigurator", "--from", str(root), "--aic-gpus", "h100_sxm",
                 "--version", "0.1", "--out", str(tmp_path / "cal")]) == 2
    err = capsys.readouterr().err
    assert "0.1" in err and "1.3.0rc20" in err
    assert not (tmp_path / "cal" / "H100-aiconfigurator.csv").exists()
    assert main(["calibrate", "import", "aiconfigurator", "--from", str(tmp_path / "cal")]) == 2
    assert "systems/data" in capsys.readouterr().err
    assert main(["calibrate", "import", "aiconfigurator", "--from", str(root), "--families", "gemm,decode"]) == 2
    assert "--families" in capsys.readouterr().err
    with pytest.raises(InputError, match="x100"):
        gemm_rows(tmp_path / "none.parquet", "x100", STACK, "0", "2026-01-01")


@pytest.fixture(scope="module")
def shipped():
    return {gpu: load_table(calibration() / f"{gpu}-aiconfigurator.csv") for gpu in SHIPPED}


def test_every_shipped_row_names_its_source_version_licence_and_stack(shipped):
    for gpu, table in shipped.items():
        assert len(table) > 10_000
        assert {r.device for r in table.rows} == {gpu}
        assert {r.stack for r in table.rows} == {STACK}
        assert all("source=aiconfigurator-core 0.12.0" in r.note and "license=Apache-2.0" in r.note
                   for r in table.rows)
        assert {r.dtype for r in table.rows} >= {"bf16", "fp8"}


def test_fp8_is_faster_than_bf16_on_large_gemms_and_b200_faster_than_h100(shipped):
    """Physical relations the measurements must show: large FP8 GEMMs run at 1.4-2.0x the bf16
    rate (twice the tensor-core peak, less in practice), B200 beats H100 on the same shapes, and
    an H200 (the same GH100 die, faster HBM) is within 15 % of an H100 on compute-bound ones."""
    def times(gpu, dtype):
        return {(r.m, r.n, r.k): r.median_s for r in shipped[gpu].rows if r.dtype == dtype and r.m >= 4096
                and r.n >= 4096 and r.k >= 4096}
    bf16, fp8 = times("H100", "bf16"), times("H100", "fp8")
    speedup = np.median([bf16[s] / fp8[s] for s in bf16 if s in fp8])
    assert 1.4 < speedup < 2.0
    b200 = times("B200", "bf16")
    assert np.median([bf16[s] / b200[s] for s in bf16 if s in b200]) > 1.5
    h200 = times("H200", "bf16")
    assert abs(np.median([bf16[s] / h200[s] for s in bf16 if s in h200]) - 1) < 0.15


def _gemm(spec: str, name: str, **loops):
    """The op ``name`` of one block of ``spec`` (a decode step), with ``loops`` resized."""
    cfg = with_overrides(load_model(spec), mode="decode", context=512, batch=1, layers=1)
    op = build_transformer(cfg).op(name)
    return op.with_loops(**loops) if loops else op


@pytest.mark.parametrize("system,gpu,dtype", [
    (system, gpu, dtype) for system, gpu in (("dgx-h200-cluster:nodes=1", "H200"), ("dgx-b200-cluster:nodes=1", "B200"),
                                             (f"dgx-h100-cluster:nodes=1,stack={STACK}", "H100"))
    for dtype in ("bf16", "fp8")] + [("dgx-b200-cluster:nodes=1", "B200", "fp4")])
def test_a_design_times_grid_shapes_as_measured_and_others_between_neighbours(system, gpu, dtype, shipped):
    design = next(iter(load_system(system).designs.values()))
    assert design.gpu.stack == STACK
    model = default_cost_model()
    rows = {(r.m, r.n, r.k): r.median_s for r in shipped[gpu].rows if r.dtype == dtype}
    spec = f"llama3-70b:dtype={dtype}"
    on_grid = _gemm(spec, "layers.0.attn.qkv", M=64)  # 64 tokens x 10,240 x 8,192
    assert on_grid.math_dtype == dtype
    cost = model.op_cost(on_grid, design)
    assert (cost.model, cost.time) == ("measured", rows[(64, 10240, 8192)])
    # 14,336 (Llama's MLP width / 2) lies between the grid's 12,288 and 16,384
    between = _gemm(spec, "layers.0.mlp.gate", M=2048, N=14336)
    cost = model.op_cost(between, design)
    assert cost.model == "fitted"
    lo, hi = rows[(2048, 12288, 8192)], rows[(2048, 16384, 8192)]
    assert lo < cost.time < hi


def test_the_default_h100_stack_is_the_harness_and_ignores_imported_rows(shipped):
    design = next(iter(load_system("dgx-h100-cluster:nodes=1").designs.values()))
    assert design.gpu.stack == "pytorch-2.11.0+cu130"
    measured = default_cost_model().measured_for("H100", design.gpu.stack)
    assert all(r.stack != STACK for r in measured.values())


def test_a_stack_without_rows_is_one_error(capsys):
    design = next(iter(load_system("dgx-h200-cluster:nodes=1,stack=vllm-0.24.0").designs.values()))
    with pytest.raises(InputError, match="vllm-0.24.0"):
        default_cost_model().op_cost(_gemm("llama3-70b", "layers.0.attn.qkv"), design)


def test_the_default_h100_takes_fp8_gemms_from_the_fallback_stack_and_bf16_from_the_harness(shipped):
    design = next(iter(load_system("dgx-h100-cluster:nodes=1").designs.values()))
    assert design.gpu.fallback_stacks == [STACK]
    model = default_cost_model()
    fp8 = _gemm("llama3-70b:dtype=fp8", "layers.0.attn.qkv", M=64)
    rows = {(r.m, r.n, r.k): r.median_s for r in shipped["H100"].rows if r.dtype == "fp8"}
    cost = model.op_cost(fp8, design)
    assert (cost.model, cost.time) == ("measured", rows[(64, 10240, 8192)])
    stacks = {(code[0], code[1], r.stack) for code, r in model.measured_for("H100", (design.gpu.stack, STACK)).items()}
    assert {s for *_, s in stacks} - {""} == {"pytorch-2.11.0+cu130", STACK}  # "": rows of unknown stack
    from marssim.cost.features import DTYPES, KERNEL_KINDS
    gemm = KERNEL_KINDS.index("gemm")
    by_dtype = {DTYPES[d]: s for k, d, s in stacks if k == gemm}
    assert by_dtype["fp8"] == STACK and by_dtype["bf16"] == "pytorch-2.11.0+cu130"


def test_each_family_comes_from_the_first_stack_that_measured_it():
    from marssim.cost.calibrated import KernelTiming
    from marssim.cost.model import _first_stack_rows

    def row(kind, dtype, stack, backend=""):
        return KernelTiming(kind, dtype, 1, 8, 8, 8, 1024.0, 384.0, "X", 1, "d", "c", "vendor", 1e-6, 0.0, 1,
                            "2026-01-01", backend=backend, stack=stack)
    rows = [row("gemm", "bf16", "a"), row("gemm", "bf16", "b"), row("gemm", "fp8", "b"), row("gemm", "fp8", "c"),
            row("attention", "bf16", "b", "flash"), row("attention", "bf16", "a"), row("norm", "bf16", ""),
            row("gemm", "fp4", "z")]
    got = _first_stack_rows(rows, ("a", "b", "c"))
    assert [(r.kind, r.dtype, r.stack, r.backend) for r in got] == [
        ("gemm", "bf16", "a", ""), ("gemm", "fp8", "b", ""), ("attention", "bf16", "b", "flash"),
        ("attention", "bf16", "a", ""), ("norm", "bf16", "", "")]


def test_context_attention_becomes_fused_attention_rows_in_closed_form(tmp_path):
    pd = pytest.importorskip("pandas")
    root = _package(tmp_path, [("bfloat16", 1, 256, 256, 0.003)])
    where = root / "aiconfigurator_core" / "systems" / "data" / "h100_sxm" / "attention" / "trtllm" / "1.3.0rc20"
    where.mkdir(parents=True)
    cols = ["batch_size", "isl", "num_heads", "num_key_value_heads", "head_dim", "window_size", "beam_width",
            "attn_dtype", "kv_cache_dtype", "latency"]
    given = [(2, 2048, 16, 2, 128, 0, 1, "bfloat16", "bfloat16", 0.15),
             (2, 2048, 16, 2, 128, 0, 1, "fp8", "fp8", 0.09),          # fp8 attention: not imported
             (2, 2048, 16, 2, 128, 8192, 1, "bfloat16", "bfloat16", 0.1),  # sliding window: not imported
             (2, 2048, 16, 2, 64, 0, 1, "bfloat16", "bfloat16", 0.08),     # head dim 64: outside the subset
             (4, 64, 16, 2, 128, 0, 1, "bfloat16", "bfloat16", 0.01)]      # 64 tokens: outside the subset
    pd.DataFrame(given, columns=cols).to_parquet(where / "context_attention_perf.parquet")
    out = tmp_path / "cal"
    assert main(["calibrate", "import", "aiconfigurator", "--from", str(root), "--date", "2026-01-02",
                 "--aic-gpus", "h100_sxm", "--out", str(out)]) == 0
    rows = [r for r in load_table(out / "H100-aiconfigurator.csv").rows if r.kind == "attention"]
    assert len(rows) == 1
    r = rows[0]
    assert (r.dtype, r.batch, r.m, r.n, r.k, r.phase, r.backend) == ("bf16", 2 * 2 * 16, 2048, 2048, 128, "fwd", "flash")
    assert r.flops == 2 * r.batch * 2048 * 2048 * 128
    assert r.bytes == 2 * 2048 * 128 * 2 * (2 * 16 + 2 * 2)  # q, o with 16 heads; k, v with 2; bf16
    assert r.median_s == pytest.approx(0.15e-3) and "kv_heads=2" in r.note and r.stack == STACK


@pytest.mark.parametrize("system,gpu", [("dgx-h100-cluster:nodes=1", "H100"), ("dgx-h200-cluster:nodes=1", "H200"),
                                        ("dgx-b200-cluster:nodes=1", "B200")])
def test_fused_prefill_attention_is_timed_as_measured(system, gpu, shipped):
    """A prompt of 2,048 tokens of Llama 3 70B at tp 4 (16 query heads, head dim 128): the fused
    core takes the fastest measured kernel of its shape; the default H100 takes it from TensorRT-LLM's
    rows (the harness measured no fused attention), its unfused products stay the harness's."""
    design = next(iter(load_system(system).designs.values()))
    cfg = with_overrides(load_model("llama3-70b"), mode="prefill", seq=2048, batch=1, layers=1, attention="flash")
    core = build_transformer(cfg).op("layers.0.attn.core").with_loops(H=16)
    want = min(r.median_s for r in shipped[gpu].rows
               if (r.kind, r.backend, r.batch, r.m, r.n, r.k) == ("attention", "flash", 32, 2048, 2048, 128))
    cost = default_cost_model().op_cost(core, design)
    assert (cost.model, cost.time) == ("measured", want)
    # causal work at 2,048 tokens runs at 150-1,200 TFLOP/s on these GPUs, not the roofline's ~190 full-s^2 rate
    assert 150e12 < core.flops / 2 / cost.time < 1200e12
