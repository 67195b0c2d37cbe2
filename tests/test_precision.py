"""Transformer Engine's FP8 (and NVFP4) recipe: which ops read and write which element types,
the FP8 GEMMs' FLOPs and bytes against closed forms, their time at the FP8 peak through the same
cost model (roofline and fitted curve alike, bounded by the FP8 peak), no FP4 GEMM without an
FP4 peak, and memory per term per precision (weights, activations kept for backward, KV cache;
closed forms from the configuration, not from the graph)."""

from __future__ import annotations

import dataclasses

import pytest

from marssim.cost import CalibratedCost, DataflowCost, KernelTable, fit, load_table
from marssim.errors import InputError
from marssim.parallel import lower_parallel, memory_estimate, parse_parallel, prepare_graph
from marssim.sim import simulate
from marssim.system import Design, load_system
from marssim.workload import load_workload
from marssim.workload.llm import transformer_of
from marssim.workload.llm.footprint import footprint
from marssim.workload.llm.precision import AMAX_HISTORY, LOW_PRECISION_GEMMS

SMALL_GPT = "gpt:layers=3,hidden=256,heads=4,vocab=1000,seq=64,batch=2,max_positions=128"
SMALL_LLAMA = "llama:layers=2,hidden=256,heads=8,kv_heads=2,ffn=640,vocab=1000,seq=64,batch=2"
SMALL_MOE = "moe:layers=2,hidden=128,heads=4,kv_heads=2,ffn=256,vocab=500,seq=32,batch=2,experts=4,top_k=2"


def _design(peaks: dict, calibration: str | None = None) -> Design:
    return Design(name="g", dataflow="gpu", clock=1.83e9, sram=50 * 2**20, sram_bandwidth=9.4e12,
                  dram_bandwidth=3.35e12, gpu={"sms": 132, "peak_flops": peaks, "calibration": calibration})


H100 = {"bf16": 989.4e12, "fp8": 1979e12, "fp32": 66.9e12}


# ---------------------------------------------------------------- which ops read what


def test_only_the_blocks_gemms_read_fp8_and_everything_else_stays_bf16() -> None:
    graph = load_workload(SMALL_GPT + ",mode=train,dtype=fp8")
    cfg = transformer_of(graph)
    assert (cfg.dtype, cfg.gemm_dtype) == ("bf16", "fp8")
    for op in graph.ops:
        block_gemm = op.kind.value == "gemm" and any(
            op.name.split(".dgrad")[0].split(".wgrad")[0].endswith("." + s) for s in LOW_PRECISION_GEMMS)
        if block_gemm:
            assert op.math_dtype == "fp8" and op.dtype == "bf16", op.name
            assert all(t == "fp8" for t in op.input_dtypes), op.name
        elif op.param("fn") == "quantize":
            assert op.dtype == "fp8" and op.input_dtypes[0] in ("bf16", "fp32"), op.name
        elif op.param("fn") == "cross_entropy":  # Megatron-LM's loss casts the logits to fp32 first
            assert op.math_dtype == "fp32", op.name
        elif op.kind.value in ("gemm", "matmul", "norm", "softmax"):
            assert op.math_dtype == "bf16" or op.param("phase") == "opt", op.name  # output layer, attention, norms
    # the output layer (tied to the embedding) and attention stay bf16
    assert graph.op("output").math_dtype == "bf16" and graph.op("layers.0.attn.qk").math_dtype == "bf16"
    # forward casts in E4M3, gradient casts in E5M2
    assert graph.op("layers.0.input_norm.fp8").param("fp8") == "e4m3"
    assert graph.op("layers.0.mlp.fc1.grad_fp8").param("fp8") == "e5m2"


def test_fp8_gemm_flops_and_bytes_are_the_closed_forms() -> None:
    """A GEMM of M tokens, K in and N out features: 2MNK FLOPs in every precision; FP8 reads
    1-byte inputs and weights and writes 2-byte bf16: forward MK + KN + N(bias) + 2MN, input
    gradient MN + KN + 2MK, weight gradient MK + MN + 2KN; a training cast reads 2 B and writes
    the FP8 tensor and its transpose, 4 B per element."""
    s, b, h = 64, 2, 256
    fp8 = load_workload(SMALL_GPT + ",mode=train,dtype=fp8")
    bf16 = load_workload(SMALL_GPT + ",mode=train")
    m = s * b
    for name, k, n in (("layers.1.attn.qkv", h, 3 * h), ("layers.1.mlp.fc2", 4 * h, h)):
        fwd, dgrad, wgrad = (fp8.op(name + sfx) for sfx in ("", ".dgrad", ".wgrad"))
        for op in (fwd, dgrad, wgrad):
            assert op.flops == 2 * m * n * k == bf16.op(op.name).flops
        assert fwd.bytes_moved == m * k + k * n + n + 2 * m * n
        assert dgrad.bytes_moved == m * n + k * n + 2 * m * k
        assert wgrad.bytes_moved == m * k + m * n + 2 * k * n
    cast = fp8.op("layers.1.input_norm.fp8")
    assert cast.bytes_moved == 4 * m * h and cast.output_bytes == m * h
    # model FLOPs do not depend on the precision; the casts and amax updates are counted apart
    f8, f16 = footprint(fp8), footprint(bf16)
    assert f8.model_flops == f16.model_flops
    casts = [op for op in fp8.ops if op.param("fn") in ("quantize", "amax_update")]
    assert f8.flops["cast"] == sum(op.flops for op in casts) > 0
    assert f8.total_flops == f16.total_flops + f8.flops["cast"]


def test_serving_casts_without_transposes_and_with_no_amax_history() -> None:
    g = load_workload("llama:layers=2,hidden=256,heads=8,kv_heads=2,ffn=640,vocab=1000,seq=64,mode=prefill,dtype=fp8")
    cast = g.op("layers.0.input_norm.fp8")
    assert cast.bytes_moved == 3 * 64 * 256  # reads bf16, writes FP8 once
    assert not any(op.param("fn") == "amax_update" for op in g.ops)


def test_amax_updates_read_and_rewrite_every_fp8_tensors_history() -> None:
    g = load_workload(SMALL_LLAMA + ",mode=train,dtype=fp8")
    gemms = 2 * 4  # qkv, proj, fc1 (gate and up in one GEMM), down per block
    fwd, bwd = g.op("fp8.amax_fwd"), g.op("fp8.amax_bwd")
    assert fwd.out_elems == gemms * 3 * AMAX_HISTORY and bwd.out_elems == gemms * 2 * AMAX_HISTORY
    assert fwd.bytes_moved == 8 * fwd.out_elems  # fp32 history read and written


# ---------------------------------------------------------------- time: the FP8 peak, the same cost model


def _gemm_graph(dtype: str, m: int = 8192, k: int = 8192, n: int = 8192):
    return load_workload(f"llama:layers=1,hidden={k},heads=64,kv_heads=8,ffn={n},vocab=1000,seq={m},mode=forward,"
                         f"dtype={dtype}")


def test_a_compute_bound_fp8_gemm_takes_the_bf16_time_scaled_by_the_peaks() -> None:
    cost = DataflowCost()  # the analytical roofline
    d = _design(H100)
    t8 = cost.op_cost(_gemm_graph("fp8").op("layers.0.mlp.fc1"), d)
    t16 = cost.op_cost(_gemm_graph("bf16").op("layers.0.mlp.fc1"), d)
    launch = d.gpu.launch_overhead
    assert t8.memory_time < t8.compute_time < t8.time  # compute-bound
    assert (t8.time - launch) / (t16.time - launch) == pytest.approx(989.4 / 1979, rel=1e-12)
    assert t8.model == t16.model == "gpu-roofline"


def test_fp8_rows_fit_a_curve_bounded_by_the_fp8_peak_and_every_op_says_which_model_timed_it() -> None:
    from pathlib import Path

    table = load_table(Path(__file__).parent / "data" / "calibration" / "synthetic-h100.csv")
    bf16_rows = [r for r in table.rows if (r.kind, r.dtype) == ("gemm", "bf16")]

    def as_fp8(speedup: float) -> KernelTable:  # the bf16 GEMM rows, relabelled FP8 and faster
        rows = [dataclasses.replace(r, dtype="fp8", median_s=r.median_s / speedup) for r in bf16_rows]
        return KernelTable(tuple(rows) + tuple(table.rows))

    # twice as fast: a curve past the bf16 peak, within the FP8 peak that bounds it
    f = fit(as_fp8(2.0), peaks=H100)[("synthetic-H100", "gemm", "fp8", "none")]
    assert 989.4e12 < f.params.rate <= 1979e12
    # three times: rows past the FP8 peak (what the bound gives way to: no curve above the best measured)
    f = fit(as_fp8(3.0), peaks=H100)[("synthetic-H100", "gemm", "fp8", "none")]
    assert f.best_rate > 1979e12 and f.params.rate <= f.best_rate * (1 + 1e-9)
    fp8_table = as_fp8(2.0)
    model = CalibratedCost(fp8_table, measured=False)
    d = _design(H100, "synthetic-H100")
    op = _gemm_graph("fp8", 4096, 4096, 4096).op("layers.0.mlp.fc1")
    c = model.op_cost(op, d)
    assert c.model == "fitted" and c.time >= op.flops / 1979e12
    # a table without FP8 rows: the FP8 GEMM falls back to the roofline at the FP8 peak, and says so
    plain = CalibratedCost(table, measured=False)
    assert plain.op_cost(op, d).model == "gpu-roofline"
    assert plain.op_cost(_gemm_graph("bf16", 4096, 4096, 4096).op("layers.0.mlp.fc1"), d).model == "fitted"


def test_no_fp4_gemm_without_a_published_fp4_peak() -> None:
    graph = _gemm_graph("fp4", 1024, 1024, 1024)
    op = graph.op("layers.0.mlp.fc1")
    assert op.math_dtype == "fp4" and graph.op("layers.0.post_norm.amax").param("fn") == "amax"
    cost = DataflowCost()
    with pytest.raises(InputError, match="designs.g.gpu.peak_flops.*fp4"):
        cost.op_cost(op, _design(H100))
    with pytest.raises(InputError, match="fp4"):
        DataflowCost().op_times([op], [_design(H100)])
    blackwell = _design({"bf16": 2.25e15, "fp8": 4.5e15, "fp4": 9e15, "fp32": 75e12})
    t4, t8 = cost.op_cost(op, blackwell), cost.op_cost(_gemm_graph("fp8", 1024, 1024, 1024).op("layers.0.mlp.fc1"),
                                                       blackwell)
    assert op.bytes_moved < _gemm_graph("fp8", 1024, 1024, 1024).op("layers.0.mlp.fc1").bytes_moved
    assert t4.time < t8.time


# ---------------------------------------------------------------- memory per term per precision


def _gpt_gemm_params(layers: int, h: int) -> int:
    """The blocks' GEMM weights and biases: QKV 3h^2 + 3h, projection h^2 + h, MLP 8h^2 + 5h."""
    return layers * (12 * h * h + 9 * h)


@pytest.mark.parametrize("spec,gemm_bytes,other_bytes", [
    (",mode=train", 2, 2),
    (",mode=train,dtype=fp8", 2 + 2, 2),  # bf16 weight + FP8 copy and its transpose
    (",mode=train,dtype=fp8,fp8_param_gather=true", 1 + 1, 2),  # the FP8 parameter and its transpose
    (",mode=train,dtype=fp4", 2 + 2 * 0.5625, 2),  # NVFP4 copies with their block scales
    (",mode=train,dtype=fp4,fp4_param_gather=true", 2 * 0.5625, 2),  # the NVFP4 parameter and its transpose
    (",mode=prefill,dtype=fp8", 1, 2),  # a quantized checkpoint: FP8 weights only
])
def test_weights_held_per_precision(spec, gemm_bytes, other_bytes) -> None:
    graph = load_workload(SMALL_GPT + spec)
    f = footprint(graph)
    gemm = _gpt_gemm_params(3, 256)
    assert f.weight_bytes == pytest.approx(gemm * gemm_bytes + (f.parameters - gemm) * other_bytes, abs=1)
    if "train" in spec:  # fp32 main gradients and optimizer state whatever the GEMMs' precision
        assert (f.gradient_bytes, f.optimizer_bytes) == (4 * f.parameters, 12 * f.parameters)


@pytest.mark.parametrize("dtype,q", [("fp8", 1), ("fp4", 0.5625)])
def test_the_first_and_last_blocks_kept_in_bf16_read_bf16_and_hold_bf16_weights(dtype, q) -> None:
    """first_layers_bf16 / last_layers_bf16 (Megatron-LM's layers at start and end in bf16): those
    blocks' GEMMs read bf16 (no cast, no low-precision weight copy), the others the recipe's type;
    the FLOPs of the GEMMs are the same, the casts fewer, and the weights held follow per block."""
    spec = "gpt:layers=5,hidden=256,heads=4,vocab=1000,seq=64,batch=2,max_positions=128,mode=train"
    every = load_workload(spec + f",dtype={dtype}")
    kept = load_workload(spec + f",dtype={dtype},first_layers_bf16=1,last_layers_bf16=2")
    low = {op.param("layer") for op in kept.ops if op.param("w_dtype")}
    assert low == {1, 2}  # blocks 0, 3 and 4 in bf16
    assert {op.param("layer") for op in every.ops if op.param("w_dtype")} == {0, 1, 2, 3, 4}
    gemm = lambda g: sum(op.flops for op in g.ops if op.kind.name == "GEMM")  # noqa: E731
    assert gemm(kept) == pytest.approx(gemm(every), rel=1e-12)
    casts = lambda g: [op.name for op in g.ops if op.param("fn") == "quantize"]  # noqa: E731
    assert 0 < len(casts(kept)) < len(casts(every))
    assert not any(name.startswith(("layers.0.", "layers.3.", "layers.4.")) for name in casts(kept))
    block = _gpt_gemm_params(1, 256)
    f_kept, f_every = footprint(kept), footprint(every)
    assert f_every.weight_bytes - f_kept.weight_bytes == pytest.approx(3 * block * 2 * q, abs=1)
    with pytest.raises(InputError, match="first_layers_bf16: keeps blocks out of a low-precision training recipe"):
        load_workload(spec + ",first_layers_bf16=1")
    with pytest.raises(InputError, match="last_layers_bf16: .* got dtype=fp8, mode=prefill"):
        load_workload(spec.replace("mode=train", "mode=prefill") + ",dtype=fp8,last_layers_bf16=1")
    with pytest.raises(InputError, match="last_layers_bf16: expected first_layers_bf16 \\+ last_layers_bf16 at most"):
        load_workload(spec + f",dtype={dtype},first_layers_bf16=3,last_layers_bf16=3")


def test_a_block_kept_in_bf16_runs_its_gemms_at_the_bf16_rate() -> None:
    """On a B200 (measured bf16 and NVFP4 GEMMs), Llama 3 8B with its last block kept in bf16:
    that block's MLP GEMM takes the bf16 kernel's time, the others the NVFP4 kernel's, faster."""
    from marssim.cost import default_cost_model

    design = next(iter(load_system("dgx-b200-cluster:nodes=1").designs.values()))
    graph = load_workload("llama3-8b:mode=train,seq=4096,layers=4,dtype=fp4,last_layers_bf16=1")
    plain = load_workload("llama3-8b:mode=train,seq=4096,layers=4")
    cost = default_cost_model()
    t = {name: cost.op_time(graph.op(name), design) for name in ("layers.2.mlp.fc1", "layers.3.mlp.fc1")}
    assert not graph.op("layers.3.mlp.fc1").param("w_dtype") and graph.op("layers.2.mlp.fc1").param("w_dtype") == "fp4"
    assert t["layers.3.mlp.fc1"] == pytest.approx(cost.op_time(plain.op("layers.3.mlp.fc1"), design), rel=1e-12)
    assert t["layers.2.mlp.fc1"] < 0.7 * t["layers.3.mlp.fc1"]


@pytest.mark.parametrize("recompute", ["none", "selective", "full"])
def test_activations_kept_for_backward_with_fp8_gemm_inputs(recompute) -> None:
    """Korthikanti et al.'s per-block s*b*h*(16e + 2) + a*s^2*b*(2e + 1) with the four GEMM
    inputs (QKV's, the projection's, fc1's: e*sbh each; fc2's: 4e*sbh) kept as their 1-byte FP8
    copies: s*b*h*(9e + 9) + a*s^2*b*(2e + 1)."""
    s, b, h, a, e = 64, 2, 256, 4, 2
    graph = load_workload(SMALL_GPT + f",mode=train,dtype=fp8,recompute={recompute}")
    per_layer = footprint(graph).activation_bytes_per_layer
    sbh = s * b * h
    expected = {"none": sbh * (9 * e + 9) + a * s * s * b * (2 * e + 1), "selective": sbh * (9 * e + 9),
                "full": e * sbh}[recompute]
    assert [per_layer[i] for i in range(3)] == [expected] * 3


def test_an_fp8_kv_cache_holds_and_reads_one_byte_per_element() -> None:
    spec = "llama:layers=2,hidden=256,heads=8,kv_heads=2,ffn=640,vocab=1000,mode=decode,context=512,batch=4"
    bf16, fp8 = load_workload(spec), load_workload(spec + ",kv_dtype=fp8")
    elems = 2 * 2 * 2 * 32 * 512 * 4  # K and V, layers, kv heads x head dim, tokens, batch
    assert footprint(bf16).kv_cache_bytes == 2 * elems and footprint(fp8).kv_cache_bytes == elems
    q, k = (fp8.op("layers.0.attn.qk").in_shapes[i] for i in range(2))
    qk = fp8.op("layers.0.attn.qk")
    assert qk.math_dtype == "bf16" and qk.input_bytes == 2 * q[0] * q[1] * q[2] + k[0] * k[1] * k[2]
    prefill = load_workload(spec.replace("mode=decode,context=512", "mode=prefill,seq=512") + ",kv_dtype=fp8")
    write = prefill.op("layers.0.attn.kv_write")
    assert write.dtype == "fp8" and write.output_bytes == write.out_elems


@pytest.mark.parametrize("tp", [1, 2])
def test_memory_per_gpu_adds_the_fp8_copies_of_the_rank_s_gemm_weights(tp) -> None:
    """Per rank: the column-parallel QKV and fc1 split all their weights and biases, the
    row-parallel projection and fc2 their weights (their biases replicated): (12h^2 + 7h)/tp + 2h
    GEMM parameters per block, each holding 2 B more under FP8."""
    h, layers = 256, 3
    cfg = parse_parallel(f"tp={tp},pp=1,dp=1,global_batch=2")
    static = {}
    for dtype in ("bf16", "fp8"):
        graph = prepare_graph(load_workload(SMALL_GPT + f",mode=train,dtype={dtype}"), cfg)
        static[dtype] = memory_estimate(graph, cfg, 80e9).static[0]
    per_rank = layers * ((12 * h * h + 7 * h) // tp + 2 * h)
    assert static["fp8"].weights - static["bf16"].weights == pytest.approx(2 * per_rank)
    assert static["fp8"].gradients == static["bf16"].gradients
    assert static["fp8"].optimizer == static["bf16"].optimizer


# ---------------------------------------------------------------- parallel runs


@pytest.mark.parametrize("spec,config", [
    (SMALL_LLAMA.replace("batch=2", "batch=1") + ",mode=train,dtype=fp8", "tp=2,pp=2,dp=2,sp=true,global_batch=8"),
    (SMALL_MOE.replace("batch=2", "batch=1") + ",mode=train,dtype=fp8", "tp=2,pp=1,dp=4,ep=2,sp=true,global_batch=8"),
])
def test_fp8_training_lowers_and_folds_exactly_with_no_collective_more(spec, config) -> None:
    system = load_system("dgx-h100-cluster:nodes=1")
    cost = DataflowCost()
    cfg = parse_parallel(config)
    graph = load_workload(spec)
    folded = lower_parallel(graph, system, cfg, cost, folding=True)
    full = lower_parallel(graph, system, cfg, cost, folding=False)
    assert simulate(folded, system).makespan == pytest.approx(simulate(full, system).makespan, rel=1e-9)
    # the casts keep their input's layout (the experts' run on the exchanged tokens): no collective
    # of any kind more than under bf16, the tensor-parallel gathers of a cast moving FP8 bytes
    from collections import Counter

    bf16 = lower_parallel(load_workload(spec.replace(",dtype=fp8", "")), system, cfg, cost, folding=True)
    fp8_kinds, bf16_kinds = (Counter(c.kind for c in tg.collectives) for tg in (folded, bf16))
    assert all(fp8_kinds[k] <= bf16_kinds[k] for k in fp8_kinds), (fp8_kinds, bf16_kinds)
    gathered = [c for c in folded.collectives if c.kind == "all_gather" and c.op.endswith(".fp8")]
    assert gathered
    for c in gathered:
        cast = graph.op(c.op)
        assert c.nbytes == pytest.approx(cast.output_bytes)  # one byte per element
