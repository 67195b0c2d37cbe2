"""A training stack's fused attention kernels timed from a published kernel set: a kernel that
fills the GPU at the set's measured rate, its backward at the set's measured backward over
forward ratio, a small one as the grid times it rescaled to the set at its length (closed forms
from the shipped CSV read here independently), scalar and vectorised paths alike, and the
settings refused with the key named."""

from __future__ import annotations

import csv
import math

import pytest

from marssim.cost import default_cost_model
from marssim.cost.attention_kernels import FULL_WAVES, TILE_ROWS, kernel_sets
from marssim.errors import InputError
from marssim.serve import load_model
from marssim.system import load_system
from marssim.workload.llm import build_transformer
from marssim.workload.llm.config import with_overrides

SET = "pytorch-24.03-h200"


def _published(backend: str = "flash", dtype: str = "bf16", name: str = SET) -> dict[int, tuple]:
    """seq -> (batch, heads, forward TFLOP/s, backward TFLOP/s) of set ``name``'s causal head-dim-128 rows."""
    with kernel_sets()[name].open() as f:
        rows = csv.DictReader(line for line in f if not line.startswith("#"))
        return {int(r["seq"]): (int(r["batch"]), int(r["heads"]), float(r["fwd_tflops"]), float(r["bwd_tflops"]))
                for r in rows if r["backend"] == backend and r["dtype"] == dtype and r["causal"] == "true"
                and r["head_dim"] == "128"}


def _ops(seq: int, batch: int = 1, attention: str = "flash", **model):
    """A Llama 3 8B training layer's fused attention (32 query heads over 8 key/value heads, head
    dimension 128) at ``seq`` tokens: forward, backward."""
    cfg = with_overrides(load_model("llama3-8b"), mode="train", seq=seq, batch=batch, layers=1, attention=attention,
                         **model)
    graph = build_transformer(cfg)
    return graph.op("layers.0.attn.core"), graph.op("layers.0.attn.core.grad")


def _design(kernels: str = SET, system: str = "dgx-h100-cluster:nodes=1"):
    spec = system + (f",attention_kernels={kernels}" if kernels else "")
    return next(iter(load_system(spec).designs.values()))


CASES = [("pytorch-24.03-h200", "flash", "dgx-h100-cluster:nodes=1", 132),  # FlashAttention-2, 2024, on Hopper
         ("pytorch-25.09-b200", "cudnn", "dgx-b200-cluster:nodes=1", 148)]  # cuDNN 9.13 on a B200


@pytest.mark.parametrize("name,backend,system,sms", CASES)
@pytest.mark.parametrize("seq", [16384, 32768, 24576])
def test_a_kernel_that_fills_the_gpu_runs_at_the_sets_rate_and_its_backward_at_the_sets_ratio(seq, name, backend,
                                                                                                system, sms):
    rows = _published(backend, name=name)
    assert 32 * math.ceil(seq / TILE_ROWS) >= FULL_WAVES * sms  # 32 heads of one sequence: many waves

    def at(s: int, i: int) -> float:  # TFLOP/s, linear in ln s between the published lengths
        lo = max(x for x in rows if x <= s)
        hi = min(x for x in rows if x >= s)
        u = 0.0 if lo == hi else (math.log(s) - math.log(lo)) / (math.log(hi) - math.log(lo))
        return (1 - u) * rows[lo][i] + u * rows[hi][i]

    fwd, bwd = _ops(seq, attention=backend)
    model, design = default_cost_model(), _design(name, system)
    assert design.gpu.sms == sms
    f, b = model.op_cost(fwd, design), model.op_cost(bwd, design)
    work = 4.0 * seq * seq * 32 * 128 / 2  # causal, as the benchmark counts it
    assert f.model == b.model == "rescaled"
    assert f.time == pytest.approx(work / (at(seq, 2) * 1e12), rel=1e-9)
    lo, hi = max(x for x in rows if x <= seq), min(x for x in rows if x >= seq)
    ratio = {s: 2.5 * rows[s][2] / rows[s][3] for s in (lo, hi)}  # backward over forward time, published
    u = 0.0 if lo == hi else (math.log(seq) - math.log(lo)) / (math.log(hi) - math.log(lo))
    assert b.time == pytest.approx(f.time * ((1 - u) * ratio[lo] + u * ratio[hi]), rel=1e-9)
    assert model.op_times([bwd, fwd], [design, design]).tolist() == pytest.approx([b.time, f.time], rel=1e-12)


def test_flashattention2_of_2024_is_slower_than_the_engines_kernels_it_replaces():
    """The published FlashAttention-2 forward (327 TFLOP/s at 16k tokens) is below what
    TensorRT-LLM's measured kernels reach on the same GPU; the backward too, by its own ratio."""
    fwd, bwd = _ops(16384)
    model = default_cost_model()
    plain, stack = _design(""), _design()
    assert model.op_cost(fwd, plain).model in ("measured", "interpolated", "extrapolated")
    assert model.op_time(fwd, stack) > 1.2 * model.op_time(fwd, plain)
    assert model.op_time(bwd, stack) > 1.2 * model.op_time(bwd, plain)


def test_a_small_kernel_keeps_the_grids_shape_rescaled_to_the_set_at_its_length():
    """256 query tiles (under four waves of 132 SMs): the grid's time times the set's forward over
    the grid's at the set's shortest measured length (4,096 tokens: 4 sequences of 16 heads), the
    factor held below it."""
    rows = _published()
    batch, heads, tflops, _ = rows[4096]
    model, plain, stack = default_cost_model(), _design(""), _design()
    small, _ = _ops(1024)
    assert 32 * math.ceil(1024 / TILE_ROWS) < FULL_WAVES * 132
    # the set's shape in the small op's slice (4 query heads per key/value head): 16 heads over 4
    reference, _ = _ops(4096, batch=batch, heads=heads, kv_heads=heads // 4, hidden=heads * 128)
    published = 4.0 * batch * 4096 * 4096 * heads * 128 / 2 / (tflops * 1e12)
    factor = published / model.op_time(reference, plain)
    assert model.op_cost(small, stack).model == "rescaled"
    assert model.op_time(small, stack) == pytest.approx(model.op_time(small, plain) * factor, rel=1e-9)


def test_an_unknown_set_is_refused_naming_the_parameter():
    with pytest.raises(InputError, match="attention_kernels"):
        load_system("dgx-h100-cluster:nodes=1,attention_kernels=pytorch-00.00")


def test_a_set_of_another_gpu_generation_is_refused():
    design = _design()
    blackwell = design.model_copy(update={"gpu": design.gpu.model_copy(update={"calibration": "B200"})})
    fwd, _ = _ops(4096)
    with pytest.raises(InputError, match="generation"):
        default_cost_model().op_cost(fwd, blackwell)


def test_every_shipped_set_names_its_gpu_source_and_licence():
    from marssim.cost.attention_kernels import load_kernel_set

    for name in kernel_sets():
        ks = load_kernel_set(name)
        assert ks.gpu in ("H200", "B200", "GB200") and "cudnn-frontend" in ks.source and "licence" in ks.source
        for points in ks.points.values():
            assert [p.seq for p in points] == sorted(p.seq for p in points) and all(p.bwd_s > p.fwd_s for p in points)
