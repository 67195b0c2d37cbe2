"""FP8 current scaling (``fp8_recipe=current``, Transformer Engine's ``Float8CurrentScaling``)
against delayed scaling: an amax kernel before every cast and no amax history; the bytes a step
moves differ by one read of every cast tensor (closed form from the configuration) less the
histories; each amax kernel's time is that read at the cost model's bandwidth; delayed scaling,
named or not, is the same graph; the option is refused where it does not apply."""

from __future__ import annotations

import pytest

from marssim.cost import DataflowCost
from marssim.cost.gpu import DEFAULT_EFFICIENCY
from marssim.errors import InputError
from marssim.parallel import lower_parallel, parse_parallel
from marssim.sim import simulate
from marssim.system import Design, load_system
from marssim.workload import load_workload
from marssim.workload.llm import transformer_of
from marssim.workload.llm.precision import AMAX_HISTORY, FP8_TENSORS_BWD, FP8_TENSORS_FWD

L, H, HEADS, KV, FFN, S, B = 2, 256, 8, 2, 640, 64, 2
SPEC = (f"llama:layers={L},hidden={H},heads={HEADS},kv_heads={KV},ffn={FFN},vocab=1000,seq={S},batch={B},"
        "mode=train,dtype=fp8")


def _graphs():
    return load_workload(SPEC), load_workload(SPEC + ",fp8_recipe=current")


def _casts(graph) -> list:
    """The casts of activations and gradients (not the per-step weight casts)."""
    return [op for op in graph.ops if op.param("fn") == "quantize" and not op.param("weights")]


def test_current_scaling_puts_an_amax_before_every_cast_and_keeps_no_history() -> None:
    delayed, current = _graphs()
    assert transformer_of(current).current_scaling and not transformer_of(delayed).current_scaling
    casts = _casts(current)
    # per block: 4 forward casts (the inputs of qkv, proj, fc1 -- gate and up in one GEMM -- and down) and
    # 4 gradient casts (their output gradients)
    assert len(casts) == L * (4 + 4) == len(_casts(delayed))
    for cast in casts:
        amax = current.op(cast.name.rpartition("fp8")[0] + "amax")
        assert amax.param("fn") == "amax" and amax.dtype == "fp32" and amax.out_elems == 1
        assert cast.inputs == (cast.inputs[0], amax.name)  # the cast reads its tensor and its amax
        assert amax.inputs == (cast.inputs[0],)  # the amax reads the same tensor
        assert cast.param("fp8") in ("e4m3", "e5m2")
    amaxes = [op for op in current.ops if op.param("fn") == "amax"]
    assert len(amaxes) == len(casts)
    assert not any(op.param("fn") == "amax_update" for op in current.ops)
    assert [op.name for op in delayed.ops if op.param("fn") == "amax_update"] == ["fp8.amax_fwd", "fp8.amax_bwd"]
    assert not any(op.param("fn") == "amax" for op in delayed.ops)
    # the rest of the graph is the same ops
    extra = {op.name for op in amaxes}
    assert [op.name for op in current.ops if op.name not in extra] == \
        [op.name for op in delayed.ops if op.param("fn") != "amax_update"]


def test_current_scaling_moves_one_more_read_of_every_cast_tensor_less_the_histories() -> None:
    delayed, current = _graphs()
    d = H // HEADS
    tokens = S * B
    # elements cast per block: forward the inputs of qkv, proj, gate/up (one cast) and down;
    # backward the output gradients of qkv, proj, fc1 (gate and up: 2 x ffn features), down
    forward = 3 * H + FFN
    backward = (H + 2 * KV * d) + H + 2 * FFN + H
    cast_elems = L * tokens * (forward + backward)
    gemm_params = L * (H * (H + 2 * KV * d) + H * H + 3 * H * FFN)  # the weights the per-step casts read
    casts = L * 8
    gemms = L * 4
    history = gemms * (FP8_TENSORS_FWD + FP8_TENSORS_BWD) * AMAX_HISTORY * 8  # fp32 read and written
    # each amax reads its bf16 tensor and writes 4 B, which its cast reads
    expected = 2 * cast_elems + 8 * casts + 2 * gemm_params - history
    assert sum(op.bytes_moved for op in current.ops) - sum(op.bytes_moved for op in delayed.ops) == expected
    # the casts themselves move the same bytes but the 4 B amax they read
    for cast in _casts(current):
        assert cast.bytes_moved == delayed.op(cast.name).bytes_moved + 4
    # model FLOPs unchanged
    assert sum(op.flops for op in current.ops if op.kind.value == "gemm") == \
        sum(op.flops for op in delayed.ops if op.kind.value == "gemm")


def test_each_amax_takes_the_time_of_one_read_of_its_tensor() -> None:
    design = Design(name="g", dataflow="gpu", clock=1.83e9, sram=50 * 2**20, sram_bandwidth=9.4e12,
                    dram_bandwidth=3.35e12, gpu={"sms": 132, "peak_flops": {"bf16": 989.4e12, "fp8": 1979e12,
                                                                            "fp32": 66.9e12}})
    big = load_workload("llama:layers=1,hidden=4096,heads=32,kv_heads=8,ffn=14336,vocab=1000,seq=4096,batch=1,"
                        "mode=train,dtype=fp8,fp8_recipe=current")
    cost = DataflowCost()
    bandwidth = design.dram_bandwidth * DEFAULT_EFFICIENCY["elementwise"].mem_eff
    launch = design.gpu.launch_overhead
    amaxes = [op for op in big.ops if op.param("fn") == "amax"]
    assert amaxes
    for op in amaxes:
        elems = big.op(op.inputs[0]).out_elems
        assert op.bytes_moved == 2 * elems + 4
        assert cost.op_cost(op, design).time == pytest.approx(launch + (2 * elems + 4) / bandwidth, rel=1e-9)


def test_delayed_scaling_named_or_not_is_the_same_graph() -> None:
    default, named = load_workload(SPEC), load_workload(SPEC + ",fp8_recipe=delayed")
    assert default.ops == named.ops
    assert transformer_of(named).fp8_recipe == "delayed" and not transformer_of(named).current_scaling


def test_the_description_names_the_recipe() -> None:
    from marssim.workload.describe import describe_transformer

    delayed, current = (" ".join(describe_transformer(g)) for g in _graphs())
    assert "delayed scaling" in delayed and "current scaling" not in delayed
    assert "current scaling" in current and "delayed scaling" not in current


@pytest.mark.parametrize("spec,expected", [
    ("llama:layers=1,mode=train,fp8_recipe=current", "dtype=bf16"),
    ("llama:layers=1,mode=train,dtype=fp4,fp8_recipe=current", "dtype=fp4"),
    ("llama:layers=1,mode=prefill,dtype=fp8,fp8_recipe=current", "mode=prefill"),
    ("llama:layers=1,mode=train,dtype=fp8,fp8_recipe=tensorwise", "expected one of delayed, current"),
])
def test_the_recipe_is_refused_where_it_does_not_apply(spec, expected) -> None:
    with pytest.raises(InputError, match=f"fp8_recipe.*{expected}"):
        load_workload(spec)


def test_current_scaling_lowers_with_sequence_parallelism_and_costs_more_than_delayed() -> None:
    system = load_system("dgx-h100-cluster:nodes=1")
    cost = DataflowCost()
    cfg = parse_parallel("tp=2,pp=2,dp=2,sp=true,global_batch=8")
    spans = {}
    for recipe in ("delayed", "current"):
        graph = load_workload(SPEC.replace(f"batch={B}", "batch=1") + f",fp8_recipe={recipe}")
        folded = lower_parallel(graph, system, cfg, cost, folding=True)
        full = lower_parallel(graph, system, cfg, cost, folding=False)
        spans[recipe] = simulate(folded, system).makespan
        assert spans[recipe] == pytest.approx(simulate(full, system).makespan, rel=1e-9)
    assert spans["current"] > spans["delayed"]


@pytest.mark.parametrize("tp,sp", [(1, False), (2, True), (4, True)])
def test_a_rank_takes_the_amax_of_its_own_share(tp, sp) -> None:
    """An amax kernel is a reduction over its input: its loops are the input's, so a tensor-parallel
    rank reads its share of the tensor (the sequence-parallel slice of a norm's output, the heads'
    slice of the attention output), writes one fp32 value, and the cast after it the same share."""
    from marssim.calibrate.llm import tp_shards
    from marssim.parallel.config import ParallelConfig

    graph = load_workload(SPEC.replace(f"batch={B}", "batch=1") + ",fp8_recipe=current")
    shards = {op.name: (op, shard) for op, shard in tp_shards(graph, ParallelConfig(tp=tp, sp=sp, micro_batch=1))}
    checked = 0
    for name, (op, shard) in shards.items():
        if op.param("fn") != "amax":
            continue
        full = op.in_shapes[0][0] * op.in_shapes[0][1] * op.in_shapes[0][2] * op.in_shapes[0][3]
        assert shard.out_shape == (1, 1, 1, 1)
        assert shard.bytes_moved == 2 * full // tp + 4, name
        cast = shards[name.removesuffix("amax") + "fp8"][1] if name.endswith(".amax") else None
        if cast is not None:
            assert cast.out_elems == full // tp, name
        checked += 1
    assert checked >= 4 * L


def test_a_serving_amax_reads_the_tokens_of_the_iteration() -> None:
    """In serving, an iteration's amax (NVFP4 casts take one) reads its own tokens' activations:
    ``n x hidden`` elements for ``n`` decode tokens, not the template's prompt."""
    from marssim.cost import default_cost_model
    from marssim.serve import load_model
    from marssim.serve.itermodel import IterationModel, resize_tokens

    b200 = load_system("dgx-b200-cluster:nodes=1")
    im = IterationModel(load_model("llama:layers=2,hidden=256,heads=8,kv_heads=2,ffn=640,vocab=1000,dtype=fp4"),
                        b200, (("gpu0",),), default_cost_model())
    amax = next(op for op, _ in im.token_ops if op.param("fn") == "amax")
    for n in (1, 7, 300):
        part = resize_tokens(amax, n, 1, im.ref_tokens)
        assert part.bytes_moved == n * 256 * 2 + 4
