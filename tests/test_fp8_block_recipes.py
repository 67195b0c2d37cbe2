"""FP8 with block scales (``fp8_recipe=blockwise``, Transformer Engine's ``Float8BlockScaling``;
``fp8_recipe=mxfp8``, ``MXFP8BlockScaling``) against delayed scaling: the same casts and GEMMs,
reading the recipe's element type (1.03125 B per element: E4M3 and a scale per 128 or 32
elements), no amax kernel and no amax history; the weights held at that width; the blockwise
GEMMs timed by the measured ``fp8_block`` rows, the MXFP8 ones by the per-tensor FP8 kernels of
their shapes on Blackwell and refused on Hopper."""

from __future__ import annotations

import math

import pytest

from marssim.cli import main
from marssim.cost import default_cost_model
from marssim.cost.gpu import dtype_peak
from marssim.errors import InputError
from marssim.system import load_system
from marssim.workload import load_workload
from marssim.workload.llm import transformer_of
from marssim.workload.llm.precision import held_weight_bytes, param_gather_bytes
from marssim.workload.op import DTYPE_BYTES

L, H, HEADS, KV, FFN, S, B = 2, 256, 8, 2, 640, 64, 2
SPEC = (f"llama:layers={L},hidden={H},heads={HEADS},kv_heads={KV},ffn={FFN},vocab=1000,seq={S},batch={B},"
        "mode=train,dtype=fp8")
WIDTH = {"blockwise": 1 + 4 / 128, "mxfp8": 1 + 1 / 32}
"""Bytes per element with the block scales: an fp32 scale per 128 (blockwise), an E8M0 per 32 (MXFP8)."""


@pytest.mark.parametrize("recipe,element", [("blockwise", "fp8_block"), ("mxfp8", "mxfp8")])
def test_a_block_recipe_is_delayed_scaling_without_histories_at_its_element_width(recipe, element) -> None:
    delayed, block = load_workload(SPEC), load_workload(SPEC + f",fp8_recipe={recipe}")
    t = transformer_of(block)
    assert (t.gemm_dtype, t.low_dtype, t.current_scaling, t.amax_history) == ("fp8", element, False, False)
    assert DTYPE_BYTES[element] == WIDTH[recipe]
    # the same ops by name, less the two amax-history updates; no amax kernel
    history = {"fp8.amax_fwd", "fp8.amax_bwd"}
    assert [op.name for op in block.ops] == [op.name for op in delayed.ops if op.name not in history]
    assert not any(op.param("fn") in ("amax", "amax_update") for op in block.ops)
    for op in block.ops:
        ref = delayed.op(op.name)
        if op.param("fn") == "quantize":  # every cast writes the element type, and its other copy in training
            assert op.dtype == element and ref.dtype == "fp8"
            assert op.param("extra_per_elem") == pytest.approx(ref.param("extra_per_elem") * WIDTH[recipe])
            if not op.param("weights"):  # reads bf16 once, writes two copies at the element's width
                assert op.bytes_moved == pytest.approx(op.out_elems * (2 + 2 * WIDTH[recipe]), abs=1)
        elif op.param("w_dtype") or (op.param("in_dtypes") and "fp8" in ref.param("in_dtypes")):
            assert set(op.input_dtypes) - {"bf16"} == {element}  # the GEMMs and their gradients read it
            assert op.flops == ref.flops and op.dtype == ref.dtype
    gemm_params = L * (H * (H + 2 * KV * (H // HEADS)) + H * H + 3 * H * FFN)
    weights = [op for op in block.ops if op.param("weights")]
    assert sum(op.out_elems for op in weights) == gemm_params


def test_the_weights_are_held_and_gathered_at_the_element_width() -> None:
    for recipe, width in WIDTH.items():
        g = load_workload(SPEC + f",fp8_recipe={recipe}")
        t = transformer_of(g)
        gemm = g.op("layers.0.mlp.fc1")
        assert held_weight_bytes(gemm, t) == pytest.approx(2 + 2 * width)  # bf16 weight + two scaled copies
        gathered = transformer_of(load_workload(SPEC + f",fp8_recipe={recipe},fp8_param_gather=true"))
        assert held_weight_bytes(gemm, gathered) == pytest.approx(2 * width)
        assert param_gather_bytes(gathered) == pytest.approx(width)
        assert held_weight_bytes(g.op("layers.0.input_norm"), t) == 2


def test_mxfp8_needs_blackwell_and_blockwise_needs_fp8_tensor_cores() -> None:
    h100 = next(iter(load_system("dgx-h100-cluster:nodes=1").designs.values()))
    b200 = next(iter(load_system("dgx-b200-cluster:nodes=1").designs.values()))
    a100 = next(iter(load_system("dgx-a100-cluster:nodes=1").designs.values()))
    assert dtype_peak(b200, "mxfp8") == dtype_peak(b200, "fp8") == 4.5e15
    assert dtype_peak(h100, "fp8_block") == dtype_peak(h100, "fp8")
    assert math.isnan(dtype_peak(h100, "mxfp8")) and math.isnan(dtype_peak(a100, "fp8_block"))
    with pytest.raises(InputError, match="peak_flops"):
        default_cost_model().op_cost(load_workload(SPEC + ",fp8_recipe=mxfp8").op("layers.0.mlp.fc1"), h100)


def test_the_command_line_refuses_mxfp8_on_hopper_naming_it(capsys) -> None:
    argv = ["estimate", "--system", "dgx-h100-cluster:nodes=1", "--workload", SPEC + ",fp8_recipe=mxfp8",
            "--parallel", "dp=8"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "mxfp8" in err and "h100" in err and "--workload" in err


def _gemm(recipe: str, tokens: int = 4096, hidden: int = 4096):
    """Llama 3 8B's attention output projection (4,096 x 4,096) over ``tokens`` tokens under ``recipe``."""
    spec = f"llama3-8b:layers=1,seq={tokens},batch=1,mode=train,dtype=fp8,fp8_recipe={recipe}"
    return load_workload(spec).op("layers.0.attn.proj")


@pytest.mark.parametrize("system,gpu", [("dgx-h100-cluster:nodes=1,stack=trtllm-1.3.0rc20", "H100"),
                                        ("dgx-b200-cluster:nodes=1", "B200")])
def test_a_blockwise_gemm_on_the_grid_is_its_measured_row(system, gpu) -> None:
    """attn.proj of Llama 3 8B at 4,096 tokens (4,096 x 4,096, a grid shape): the blockwise GEMM takes
    AIConfigurator's measured fp8_block row, the per-tensor one the fp8 row of the same shape."""
    from marssim.cost import load_table
    from marssim.data import calibration

    table = load_table(calibration() / f"{gpu}-aiconfigurator.csv")
    rows = {r.dtype: r.median_s for r in table.rows
            if (r.kind, r.m, r.n, r.k) == ("gemm", 4096, 4096, 4096) and r.dtype in ("fp8", "fp8_block")}
    assert set(rows) == {"fp8", "fp8_block"}
    design = next(iter(load_system(system).designs.values()))
    model = default_cost_model()
    for recipe, dtype in (("blockwise", "fp8_block"), ("current", "fp8")):
        cost = model.op_cost(_gemm(recipe), design)
        assert (cost.model, cost.time) == ("measured", rows[dtype])
        assert model.op_times([_gemm(recipe)], [design])[0] == cost.time


def test_an_mxfp8_gemm_on_blackwell_takes_the_per_tensor_fp8_kernel_of_its_shape() -> None:
    design = next(iter(load_system("gb200-nvl72:racks=1,gpus_per_rack=8").designs.values()))
    model = default_cost_model()
    for tokens in (4096, 3000):  # a grid shape, and one between grid points
        mx, pt = model.op_cost(_gemm("mxfp8", tokens), design), model.op_cost(_gemm("current", tokens), design)
        assert mx.time == pt.time and mx.model == pt.model in ("measured", "interpolated")
