"""AIConfigurator's measured GEMM timings as calibration rows: the converter on a small package laid
out as aiconfigurator-core lays out its data (closed forms of every converted column), the shipped
H100/H200/B200 subsets (provenance on every row, physical relations between dtypes), and the
cost model timing a design's GEMMs from them by its software stack: a grid shape as measured, a
shape between grid points between its measured neighbours."""

from __future__ import annotations

import math

from pathlib import Path

import numpy as np
import pytest

from marssim.calibrate.aiconfigurator import (
    AIC_LICENSE, AIC_SOURCE, gemm_rows, generation_attention_row, generation_attention_rows,
)
from marssim.cli import main
from marssim.cost import default_cost_model, load_table
from marssim.data import calibration
from marssim.errors import InputError
from marssim.serve import load_model
from marssim.system import load_system
from marssim.workload.llm import build_transformer
from marssim.workload.llm.config import with_overrides

STACK = "trtllm-1.3.0rc20"
SHIPPED = ("H100", "H200", "B200", "B300", "GB200", "GB300")


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
    # m=4097 is outside the default subset
    assert set(got) == {("bf16", 4096, 8192, 1024), ("fp8", 4096, 8192, 1024), ("fp8_block", 4096, 8192, 1024),
                        ("fp4", 16, 256, 512)}
    for (dtype, m, n, k), r in got.items():
        theirs = {"bf16": "bfloat16", "fp8": "fp8", "fp8_block": "fp8_block", "fp4": "nvfp4"}[dtype]
        ms = next(lat for d, mm, nn, kk, lat in given if (d, mm, nn, kk) == (theirs, m, n, k))
        assert r.median_s == pytest.approx(ms / 1e3, rel=1e-6)
        assert r.flops == 2 * m * n * k
        width = {"bf16": 2, "fp8": 1, "fp8_block": 1 + 4 / 128, "fp4": 0.5625}[dtype]  # block scales: fp32 per 128
        assert r.bytes == round((m * k + k * n) * width + 2 * m * n)
        assert (r.kind, r.batch, r.device, r.sms, r.tuning, r.stack) == ("gemm", 1, "H100", 132, "vendor", STACK)
        assert f"source={AIC_SOURCE} 9.9.9" in r.note and f"license={AIC_LICENSE}" in r.note
        assert r.date == "2026-01-02"
    assert "aiconfigurator-core 9.9.9" in (out / "H100-aiconfigurator.csv").read_text().splitlines()[0]
    # every shape with --shapes all; re-running merges (idempotent)
    assert main(["calibrate", "import", "aiconfigurator", "--from", str(root), "--date", "2026-01-02",
                 "--aic-gpus", "h100_sxm", "--out", str(out), "--shapes", "all", "--families", "gemm"]) == 0
    assert len(load_table(out / "H100-aiconfigurator.csv")) == 5


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
    rate (twice the tensor-core peak, less in practice), B200 beats H100 on the same shapes, an
    H200 (the same GH100 die, faster HBM) is within 15 % of an H100 on compute-bound ones, a GB300
    beats a GB200 and a B300 a B200, each within its own peaks."""
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
    # GB300 (Blackwell Ultra: a GB200's bf16 and FP8 peaks, 1.5x its NVFP4 peak, a higher power limit) runs
    # large GEMMs faster than a GB200 in every dtype, and none faster than the GB300 design's dense peak
    peaks = next(iter(load_system("gb300-nvl72:racks=1").designs.values())).gpu.peak_flops
    for dtype in ("bf16", "fp8", "fp4"):
        gb200, gb300 = times("GB200", dtype), times("GB300", dtype)
        assert np.median([gb200[s] / gb300[s] for s in gb200 if s in gb300]) > 1.0
        assert max(2 * m * n * k / t for (m, n, k), t in gb300.items()) < peaks[dtype]
    # B300 (Blackwell Ultra in an HGX board: a B200's bf16 and FP8 peaks, 14 against 9 PFLOP/s NVFP4, 1,100 W)
    # runs large GEMMs faster than a B200, NVFP4 ones most, and slower than a GB300 (1,400 W); none faster than
    # the B300 design's dense peak
    peaks = next(iter(load_system("dgx-b300-cluster:nodes=1").designs.values())).gpu.peak_flops
    gain = {}
    for dtype in ("bf16", "fp8", "fp4"):
        b200, b300, gb300 = times("B200", dtype), times("B300", dtype), times("GB300", dtype)
        gain[dtype] = np.median([b200[s] / b300[s] for s in b200 if s in b300])
        assert gain[dtype] > 1.0
        assert np.median([b300[s] / gb300[s] for s in b300 if s in gb300]) > 1.0
        assert max(2 * m * n * k / t for (m, n, k), t in b300.items()) < peaks[dtype]
    assert gain["fp4"] > max(gain["bf16"], gain["fp8"])


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
    # 14,336 (Llama's MLP width / 2) lies between the grid's 12,288 and 16,384: ln t linear in ln n
    between = _gemm(spec, "layers.0.mlp.fc1", M=2048, N=14336)
    cost = model.op_cost(between, design)
    lo, hi = rows[(2048, 12288, 8192)], rows[(2048, 16384, 8192)]
    u = math.log(14336 / 12288) / math.log(16384 / 12288)
    assert cost.model == "interpolated"
    assert cost.time == pytest.approx(math.exp((1 - u) * math.log(lo) + u * math.log(hi)), rel=1e-12)
    # 300 tokens, between the grid's 256 and 512, at a width and depth of the grid: ln t linear in ln m
    tokens = _gemm(spec, "layers.0.attn.qkv", M=300)
    w = math.log(300 / 256) / math.log(2)
    assert model.op_cost(tokens, design).time == pytest.approx(
        math.exp((1 - w) * math.log(rows[(256, 10240, 8192)]) + w * math.log(rows[(512, 10240, 8192)])), rel=1e-12)
    assert model.op_times([between, tokens], [design] * 2).tolist() == [cost.time, model.op_time(tokens, design)]
    # narrower than the grid's 256: no measured neighbours on that side, the fitted curve
    assert model.op_cost(_gemm(spec, "layers.0.attn.qkv", M=300, N=128), design).model == "fitted"


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
    by_dtype = {DTYPES[d]: s for k, d, s in stacks if k == gemm and s}  # not the rows of unknown stack
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
             (2, 2048, 16, 2, 128, 0, 1, "bfloat16", "fp8", 0.11),     # over an FP8 cache: its own row
             (2, 2048, 16, 2, 128, 0, 1, "fp8", "fp8", 0.09),          # fp8 attention: not imported
             (2, 2048, 16, 2, 128, 8192, 1, "bfloat16", "bfloat16", 0.1),  # sliding window: not imported
             (2, 2048, 16, 2, 64, 0, 1, "bfloat16", "bfloat16", 0.08),     # head dim 64: outside the subset
             (4, 64, 16, 2, 128, 0, 1, "bfloat16", "bfloat16", 0.01)]      # 64 tokens: outside the subset
    pd.DataFrame(given, columns=cols).to_parquet(where / "context_attention_perf.parquet")
    out = tmp_path / "cal"
    argv = ["calibrate", "import", "aiconfigurator", "--from", str(root), "--date", "2026-01-02",
            "--aic-gpus", "h100_sxm", "--out", str(out), "--families", "gemm,context-attention"]
    assert main(argv) == 0
    rows = {_heads(r)[2]: r for r in load_table(out / "H100-aiconfigurator.csv").rows if r.kind == "attention"}
    assert set(rows) == {"bf16", "fp8"}
    for kv, width, ms in (("bf16", 2, 0.15), ("fp8", 1, 0.11)):
        r = rows[kv]
        assert (r.dtype, r.batch, r.m, r.n, r.k, r.phase, r.backend) == \
            ("bf16", 2 * 2 * 16, 2048, 2048, 128, "fwd", "flash")
        assert r.flops == 2 * r.batch * 2048 * 2048 * 128
        assert r.bytes == 2 * 2048 * 128 * (2 * 16 * 2 + 2 * 2 * width)  # q, o: 16 heads, bf16; k, v: 2, the cache's
        assert r.median_s == pytest.approx(ms * 1e-3) and "kv_heads=2" in r.note and r.stack == STACK
    assert "kv_dtype" not in rows["bf16"].note  # a bf16 cache's rows keep the key they always had
    # importing again replaces the rows and the source file's comment line, adding neither
    before = (out / "H100-aiconfigurator.csv").read_text()
    assert main(argv) == 0
    assert (out / "H100-aiconfigurator.csv").read_text() == before
    assert sum("context_attention_perf.parquet" in line for line in before.splitlines() if line.startswith("#")) == 1


@pytest.mark.parametrize("system,gpu", [("dgx-h100-cluster:nodes=1", "H100"), ("dgx-h200-cluster:nodes=1", "H200"),
                                        ("dgx-b200-cluster:nodes=1", "B200"), ("dgx-b300-cluster:nodes=1", "B300"),
                                        ("gb300-nvl72:racks=1", "GB300")])
def test_fused_prefill_attention_is_timed_as_measured(system, gpu, shipped):
    """A prompt of 2,048 tokens of Llama 3 70B at tp 4 (16 query heads over 2 key/value heads,
    head dim 128): the fused core takes the measured kernel of its shape and heads; the default
    H100 takes it from TensorRT-LLM's rows (the harness measured no fused attention), its unfused
    products stay the harness's."""
    design = next(iter(load_system(system).designs.values()))
    cfg = with_overrides(load_model("llama3-70b"), mode="prefill", seq=2048, batch=1, layers=1, attention="flash")
    core = build_transformer(cfg).op("layers.0.attn.core").with_loops(H=16)
    (want,) = [r.median_s for r in shipped[gpu].rows
               if (r.kind, r.backend, r.batch, r.m, r.n, r.k) == ("attention", "flash", 32, 2048, 2048, 128)
               and _heads(r) == (16, 2, "bf16")]
    cost = default_cost_model().op_cost(core, design)
    assert (cost.model, cost.time) == ("measured", want)
    # causal work at 2,048 tokens runs at 150-1,200 TFLOP/s on these GPUs, not the roofline's ~190 full-s^2 rate
    assert 150e12 < core.flops / 2 / cost.time < 1200e12


@pytest.mark.parametrize("system,gpu", [("dgx-h100-cluster:nodes=1", "H100"), ("dgx-h200-cluster:nodes=1", "H200"),
                                        ("dgx-b200-cluster:nodes=1", "B200")])
def test_a_prefill_writing_an_fp8_cache_takes_the_kernel_measured_with_one(system, gpu, shipped):
    """The same prompt with ``kv_dtype=fp8``: the fused core reads its keys and values as FP8
    and takes the engine's context kernel measured with an FP8 cache, faster at 8,192 tokens
    (TensorRT-LLM's kernels, as measured); without such rows the bf16 cache's kernel stands in."""
    from marssim.cost.attention_grid import AttentionGrid, op_seconds, row_entries
    from marssim.cost.features import op_features

    design = next(iter(load_system(system).designs.values()))
    model = default_cost_model()

    def core(seq, **over):
        cfg = with_overrides(load_model("llama3-70b"), mode="prefill", seq=seq, batch=1, layers=1,
                             attention="flash", **over)
        return build_transformer(cfg).op("layers.0.attn.core").with_loops(H=16)

    def measured(seq, kv):
        (t,) = [r.median_s for r in shipped[gpu].rows
                if (r.kind, r.backend, r.batch, r.m, r.n, r.k) == ("attention", "flash", 32, seq, seq, 128)
                and _heads(r) == (16, 2, kv)]
        return t

    fp8 = core(8192, kv_dtype="fp8")
    assert fp8.input_dtypes[1:] == ("fp8", "fp8") and core(8192).param("in_dtypes") is None
    for seq in (2048, 8192):
        cost = model.op_cost(core(seq, kv_dtype="fp8"), design)
        assert (cost.model, cost.time) == ("measured", measured(seq, "fp8"))
        assert model.op_times([core(seq, kv_dtype="fp8")], [design])[0] == cost.time
    assert measured(8192, "fp8") < measured(8192, "bf16")
    # a grid of the bf16 cache's rows only: the FP8 prefill takes their time; a decode kernel does not
    bf16_rows = [r for r in shipped[gpu].rows if r.kind == "attention" and r.m == r.n and "kv_dtype" not in r.note]
    grid = AttentionGrid(row_entries(bf16_rows))
    x = op_features(fp8)
    assert op_seconds(grid, x) == pytest.approx(measured(8192, "bf16"), rel=1e-12)
    decode = op_features(_decode_core(1024, kv_dtype="fp8"))
    assert op_seconds(AttentionGrid(row_entries([r for r in shipped[gpu].rows if r.kind == "attention"
                                                 and r.m == 1 and "kv_dtype" not in r.note])), decode) is None


def _heads(r) -> tuple[int, int, str]:
    """``(heads, kv_heads, kv_dtype)`` of a shipped attention row, read from its note."""
    note = dict(part.split("=", 1) for part in r.note.split("; "))
    return int(note["heads"]), int(note["kv_heads"]), note.get("kv_dtype", r.dtype)


GEN_COLUMNS = ["batch_size", "isl", "step", "num_heads", "num_key_value_heads", "head_dim", "window_size", "beam_width",
               "attn_dtype", "kv_cache_dtype", "latency"]


def test_generation_attention_becomes_fused_decode_rows_in_closed_form(tmp_path):
    pd = pytest.importorskip("pandas")
    root = _package(tmp_path, [("bfloat16", 1, 256, 256, 0.003)])
    where = root / "aiconfigurator_core" / "systems" / "data" / "h100_sxm" / "attention" / "trtllm" / "1.3.0rc20"
    where.mkdir(parents=True)
    given = [(4, 1, 1023, 16, 2, 128, 0, 1, "bfloat16", "bfloat16", 0.02),
             (4, 1, 1023, 16, 2, 128, 0, 1, "bfloat16", "fp8", 0.012),      # an FP8 cache: its own row
             (2, 1, 1023, 32, 4, 128, 0, 1, "bfloat16", "bfloat16", 0.021),  # equal batch x heads and bytes: kept apart
             (4, 1, 1023, 16, 2, 128, 8192, 1, "bfloat16", "bfloat16", 0.01),  # sliding window: not imported
             (4, 1, 1023, 16, 2, 64, 0, 1, "bfloat16", "bfloat16", 0.01),      # head dim 64: outside the subset
             (4, 1, 1023, 12, 2, 128, 0, 1, "bfloat16", "bfloat16", 0.01)]     # 12 heads: outside the subset
    pd.DataFrame(given, columns=GEN_COLUMNS).to_parquet(where / "generation_attention_perf.parquet")
    out = tmp_path / "cal"
    assert main(["calibrate", "import", "aiconfigurator", "--from", str(root), "--date", "2026-01-02",
                 "--aic-gpus", "h100_sxm", "--out", str(out), "--families", "generation-attention"]) == 0
    rows = load_table(out / "H100-aiconfigurator.csv").rows
    got = {(_heads(r), r.batch): r for r in rows}
    assert set(got) == {((16, 2, "bf16"), 128), ((16, 2, "fp8"), 128), ((32, 4, "bf16"), 128)}
    for ((h, kvh, kv), batch), r in got.items():
        b = batch // (2 * h)
        assert (r.kind, r.dtype, r.m, r.n, r.k, r.phase, r.backend, r.stack) == \
            ("attention", "bf16", 1, 1024, 128, "fwd", "flash", STACK)  # n = isl + step keys
        assert r.flops == 2 * batch * 1 * 1024 * 128
        width = {"bf16": 2, "fp8": 1}[kv]
        assert r.bytes == b * 128 * (2 * h * 2 + 2 * kvh * 1024 * width)  # q, o in bf16; k, v at the cache's width
        ms = next(g[-1] for g in given if (g[0], g[3], g[4], g[5], g[6]) == (b, h, kvh, 128, 0)
                  and {"bfloat16": "bf16", "fp8": "fp8"}[g[9]] == kv)
        assert r.median_s == pytest.approx(ms * 1e-3, rel=1e-6)
        assert f"license={AIC_LICENSE}" in r.note and f"source={AIC_SOURCE} 9.9.9" in r.note
    with pytest.raises(InputError, match="kv_cache_dtype"):
        generation_attention_row("h100_sxm", STACK, "0", "2026-01-01", 1, 1, 3, 8, 1, 128, "int4", 0.01)
    with pytest.raises(InputError, match="positive"):
        generation_attention_row("h100_sxm", STACK, "0", "2026-01-01", 0, 1, 3, 8, 1, 128, "bfloat16", 0.01)
    assert generation_attention_rows(where / "generation_attention_perf.parquet", "h100_sxm", STACK, "0",
                                     "2026-01-01", heads=None, head_dims=None)[-1].median_s == pytest.approx(1e-5)


def _decode_core(context: int, **over):
    """Llama 3 70B's fused decode attention at tp 4: one query of each of 16 heads (2 key/value
    heads) over ``context`` keys."""
    cfg = with_overrides(load_model("llama3-70b"), mode="decode", context=context, batch=1, layers=1,
                         attention="flash", **over)
    return build_transformer(cfg).op("layers.0.attn.core").with_loops(H=16)


def _decode_rows(table, kv: str = "bf16") -> dict[int, float]:
    """Keys -> seconds of the shipped decode rows of one sequence of 16 heads over 2, cache ``kv``."""
    return {r.n: r.median_s for r in table.rows if r.kind == "attention" and r.m == 1 and r.batch == 32
            and _heads(r) == (16, 2, kv)}


@pytest.mark.parametrize("system,gpu", [("dgx-h100-cluster:nodes=1", "H100"), ("dgx-h200-cluster:nodes=1", "H200"),
                                        ("dgx-b200-cluster:nodes=1", "B200"), ("dgx-b300-cluster:nodes=1", "B300"),
                                        ("gb300-nvl72:racks=1", "GB300")])
def test_a_decode_attention_op_on_the_grid_takes_its_measured_row(system, gpu, shipped):
    design = next(iter(load_system(system).designs.values()))
    model = default_cost_model()
    for kv in ("bf16", "fp8"):
        core = _decode_core(1024, **({"kv_dtype": "fp8"} if kv == "fp8" else {}))
        cost = model.op_cost(core, design)
        assert (cost.model, cost.time) == ("measured", _decode_rows(shipped[gpu], kv)[1024])
        assert model.op_times([core], [design])[0] == cost.time


@pytest.mark.parametrize("system,gpu", [("dgx-h100-cluster:nodes=1", "H100"), ("dgx-h200-cluster:nodes=1", "H200"),
                                        ("dgx-b200-cluster:nodes=1", "B200")])
def test_an_off_grid_decode_attention_lies_between_its_neighbours(system, gpu, shipped):
    """1,536 keys lie between the grid's 1,024 and 2,048: the time is the log-log interpolation
    of the two measured neighbours, on the scalar and the vectorised path alike."""
    design = next(iter(load_system(system).designs.values()))
    model = default_cost_model()
    rows = _decode_rows(shipped[gpu])
    lo, hi = rows[1024], rows[2048]
    core = _decode_core(1536)
    cost = model.op_cost(core, design)
    assert cost.model == "interpolated"
    assert min(lo, hi) <= cost.time <= max(lo, hi)
    u = np.log(1536 / 1024) / np.log(2)
    assert cost.time == pytest.approx(np.exp((1 - u) * np.log(lo) + u * np.log(hi)), rel=1e-12)
    assert model.op_times([core], [design])[0] == cost.time


def test_the_attention_grid_follows_a_power_law_exactly_and_bridges_holes():
    """ln t linear in ln heads, ln sequences and ln keys is what the interpolation assumes: a grid
    sampled from t = c h^0.3 b^0.7 s^0.9 gives the law back between its points, also across a
    missing point, and nothing outside its range."""
    from marssim.cost.attention_grid import AttentionFamily, AttentionGrid, SliceKey

    key = SliceKey("bf16", "fwd", "flash", 128, AttentionFamily.DECODE, 8, 16)

    def law(h, b, s):
        return 1e-6 * h ** 0.3 * b ** 0.7 * s ** 0.9

    points = [(h, b, s) for h in (8, 16, 64) for b in (1, 4, 16) for s in (256, 1024, 4096)]
    grid = AttentionGrid((key, h, b, s, law(h, b, s)) for h, b, s in points if (h, b, s) != (16, 4, 1024))
    for h, b, s in ((16, 4, 1024), (12, 2, 512), (32, 9, 3000), (8, 1, 256)):
        assert grid.seconds(key, h, b, s) == pytest.approx(law(h, b, s), rel=1e-12)
    assert grid.seconds(key, 128, 4, 1024) is None and grid.seconds(key, 16, 4, 8192, extrapolate=False) is None
    # past a line's last keys below the plateau, the line's own last slope (the law's 0.9) goes on
    assert grid.seconds(key, 16, 4, 8192) == pytest.approx(law(16, 4, 8192), rel=1e-12)
    assert grid.seconds(SliceKey("bf16", "fwd", "flash", 128, AttentionFamily.DECODE, 4, 16), 16, 4, 1024) is None


def test_the_per_op_report_says_which_kernels_are_measured_interpolated_or_fitted(capsys):
    assert main(["estimate", "--system", "dgx-h200-cluster:nodes=1", "--workload",
                 "llama3-70b:mode=decode,context=1536,batch=1,layers=1,attention=flash", "--parallel", "tp=4,dp=2",
                 "--per-op"]) == 0
    lines = capsys.readouterr().out.splitlines()
    model_of = {line.split()[0]: line.split()[1] for line in lines if line.startswith("layers.0.")}
    assert model_of["layers.0.attn.core"] == "interpolated"
    assert model_of["layers.0.attn.qkv"] in ("measured", "fitted")
    assert main(["cost", "llama3-70b:mode=decode,context=1024,layers=1,attention=flash", "--system",
                 "dgx-h200-cluster:nodes=1"]) == 0
    out = capsys.readouterr().out
    core = next(line for line in out.splitlines() if line.startswith("layers.0.attn.core"))  # the time table's
    assert core.split()[-2] == "measured" and "interpolated = between measured fused attention" in out
    assert "fused attention interpolated between" in out  # the design's note


@pytest.mark.parametrize("kv", ["bf16", "fp8"])
def test_serving_times_decode_attention_by_the_row_of_its_cache_type(kv, shipped):
    """A replica of Llama 3 70B at tp 4 on an H200 decoding one sequence over 1,024 keys: the
    iteration's attention is the measured decode kernel of 16 heads over 2 at the cache's type."""
    from marssim.serve.itermodel import IterationModel

    system = load_system("dgx-h200-cluster:nodes=1")
    spec = "llama3-70b:attention=flash" + (",kv_dtype=fp8" if kv == "fp8" else "")
    im = IterationModel(load_model(spec), system, (("gpu0", "gpu1", "gpu2", "gpu3"),), default_cost_model())
    seconds = im._attention_time(0, 1, 1, 1024)[0]
    assert seconds == _decode_rows(shipped["H200"], kv)[1024]


def test_collectives_import_writes_every_gpus_nccl_curves_and_the_engines_all_reduces(tmp_path, capsys):
    pd = pytest.importorskip("pandas")
    pytest.importorskip("pyarrow")
    from marssim.calibrate.aiconfigurator import AIC_CUSTOM_ALLREDUCE, AIC_NCCL_VERSIONS
    from marssim.collectives.measured import load_collectives

    root = tmp_path / "site"
    (root / "aiconfigurator_core-0.12.0.dist-info").mkdir(parents=True)
    data = root / "aiconfigurator_core" / "systems" / "data"
    for gpu, ver in AIC_NCCL_VERSIONS.items():
        where = data / gpu / "comm" / "nccl" / ver
        where.mkdir(parents=True)
        pd.DataFrame([("half", 2, 1024, "NCCL", "all_gather", 0.01), ("half", 2, 1024, "NCCL", "all_reduce", 0.02)],
                     columns=["nccl_dtype", "num_gpus", "message_size", "kernel_source", "op_name", "latency"]
                     ).to_parquet(where / "nccl_perf.parquet")
    for gpu, fw, ver in AIC_CUSTOM_ALLREDUCE:
        where = data / gpu / "comm" / fw / ver
        where.mkdir(parents=True)
        pd.DataFrame([("bfloat16", 8, 4096, "all_reduce", 0.005)],
                     columns=["allreduce_dtype", "num_gpus", "message_size", "op_name", "latency"]
                     ).to_parquet(where / "custom_allreduce_perf.parquet")
    out = tmp_path / "coll"
    assert main(["calibrate", "import", "aiconfigurator-collectives", "--from", str(root), "--date", "2026-12-07",
                 "--out", str(out)]) == 0
    rows = load_collectives(out / "aiconfigurator-0.12.0.csv")
    assert len(rows) == 2 * len(AIC_NCCL_VERSIONS) + len(AIC_CUSTOM_ALLREDUCE)
    assert {r.stack for r in rows} == {"nccl-2.27.3", "nccl-2.29.2", "trtllm-1.3.0rc20", "vllm-0.24.0",
                                       "sglang-0.5.14"}
    b200 = next(r for r in rows if r.gpu == "B200" and r.collective == "all_reduce")
    assert (b200.bytes, b200.time_s, b200.commit, b200.date) == (2048.0, 2e-5, "0.12.0", "2026-12-07")
    # importing one GPU again replaces its rows only: the others keep theirs, their dates and their comment lines
    assert main(["calibrate", "import", "aiconfigurator-collectives", "--from", str(root), "--date", "2026-12-08",
                 "--aic-gpus", "b200_sxm", "--out", str(out)]) == 0
    again = load_collectives(out / "aiconfigurator-0.12.0.csv")
    assert len(again) == len(rows)
    assert {r.date for r in again if r.gpu == "B200"} == {"2026-12-08"}
    assert {r.date for r in again if r.gpu != "B200"} == {"2026-12-07"}
    text = (out / "aiconfigurator-0.12.0.csv").read_text()
    assert all(f"# {gpu}/comm/nccl/{ver}/nccl_perf.parquet: 2 rows" in text for gpu, ver in AIC_NCCL_VERSIONS.items())
    capsys.readouterr()
    assert main(["calibrate", "import", "aiconfigurator-collectives", "--from", str(root), "--aic-gpus", "b900",
                 "--out", str(out)]) == 2
    assert "--aic-gpus" in capsys.readouterr().err and (out / "aiconfigurator-0.12.0.csv").read_text() == text
    (data / "gb200" / "comm" / "nccl" / "2.29.2" / "nccl_perf.parquet").unlink()
    capsys.readouterr()
    assert main(["calibrate", "import", "aiconfigurator-collectives", "--from", str(root), "--out",
                 str(tmp_path / "again")]) == 2
    assert "gb200/comm/nccl/2.29.2/nccl_perf.parquet" in capsys.readouterr().err
    assert not (tmp_path / "again").exists()
