"""Serving memory from the precision of each tensor: quantized GEMM weights (FP8 1 B, NVFP4
0.5625 B per parameter) with the embedding, the output layer and the norms in bf16, and an FP8 KV
cache at 1 B per element; closed forms from the model's dimensions."""

from __future__ import annotations

import pytest
from support import RooflineCost

from marssim.errors import InputError
from marssim.serve import SchedulerConfig, load_model
from marssim.serve.itermodel import IterationModel
from marssim.serve.memory import replica_memory
from marssim.system import load_system


@pytest.fixture(scope="module")
def cluster():
    return load_system("dgx-h100-cluster:nodes=1")


def _stages(tp: int, pp: int) -> tuple:
    return tuple(tuple(f"gpu{s * tp + r}" for r in range(tp)) for s in range(pp))


def llama_weight_bytes(t, tp: int, first: bool, last: bool, blocks: int, gemm_bytes: float) -> float:
    """Bytes of a rank's Llama weights: the blocks' GEMMs (column/row parallel, split by tp) at
    ``gemm_bytes`` per parameter, the two norms of a block, the vocabulary-parallel embedding, the
    final norm and the output projection at 2 B (bf16)."""
    h, f, d = t.hidden, t.ffn_size, t.d_head
    gemms = h * (t.heads + 2 * t.kv) * d // tp + t.heads * d * h // tp + 3 * h * f // tp
    out = blocks * (gemms * gemm_bytes + 2 * h * 2.0)
    if first:
        out += -(-t.vocab // tp) * h * 2.0
    if last:
        out += (h + h * t.vocab // tp) * 2.0
    return out


@pytest.mark.parametrize("dtype,gemm_bytes", [("bf16", 2.0), ("fp8", 1.0), ("fp4", 0.5625)])
@pytest.mark.parametrize("tp,pp", [(2, 1), (4, 1), (2, 2)])
def test_weights_are_held_at_each_tensors_precision(dtype, gemm_bytes, tp, pp, cluster):
    t = load_model(f"llama3-70b:dtype={dtype}")
    mem = replica_memory(IterationModel(t, cluster, _stages(tp, pp), RooflineCost()), SchedulerConfig(), 80 * 2**30)
    for s in range(pp):
        want = llama_weight_bytes(t, tp, s == 0, s == pp - 1, 80 // pp, gemm_bytes)
        assert mem.weights[s] == pytest.approx(want, rel=1e-12)


def test_fp8_weights_are_about_half_of_bf16(cluster):
    """70.6 B parameters of which 2.1 B (embedding and output, 128,256 x 8,192 each) stay bf16."""
    bf16 = replica_memory(IterationModel(load_model("llama3-70b"), cluster, _stages(4, 1), RooflineCost()),
                          SchedulerConfig(), 80 * 2**30)
    fp8 = replica_memory(IterationModel(load_model("llama3-70b:dtype=fp8"), cluster, _stages(4, 1), RooflineCost()),
                         SchedulerConfig(), 80 * 2**30)
    ratio = fp8.weights[0] / bf16.weights[0]
    kept = 2 * 128256 * 8192 / 70.55e9  # share of parameters kept in bf16
    assert ratio == pytest.approx(0.5 + kept / 2, abs=2e-3)


@pytest.mark.parametrize("dtype", ["bf16", "fp8"])
@pytest.mark.parametrize("tp", [2, 4, 8])
def test_an_fp8_kv_cache_halves_the_bytes_of_a_token(dtype, tp, cluster):
    t = load_model(f"llama3-70b:dtype={dtype},kv_dtype=fp8")
    mem = replica_memory(IterationModel(t, cluster, _stages(tp, 1), RooflineCost()), SchedulerConfig(), 80 * 2**30)
    # keys and values of 80 layers, the rank's share of 8 key/value heads of 128, 1 B each
    assert mem.kv_bytes_per_token[0] == 2 * 80 * (8 // tp) * 128 * 1
    plain = load_model(f"llama3-70b:dtype={dtype}")
    full = replica_memory(IterationModel(plain, cluster, _stages(tp, 1), RooflineCost()), SchedulerConfig(),
                          80 * 2**30)
    assert full.kv_bytes_per_token[0] == 2 * mem.kv_bytes_per_token[0]
    # the same memory left for the cache holds twice the blocks (to the block)
    assert mem.blocks in (2 * full.blocks, 2 * full.blocks + 1)


def test_70b_in_fp8_is_admitted_on_two_gpus_where_bf16_is_refused(cluster):
    cfg = SchedulerConfig(gpu_memory_utilization=0.8)  # 68.7 GB usable of 80 GiB: less than 70.6 GB of bf16
    with pytest.raises(InputError):
        replica_memory(IterationModel(load_model("llama3-70b"), cluster, _stages(2, 1), RooflineCost()), cfg,
                       80 * 2**30)
    t = load_model("llama3-70b:dtype=fp8,kv_dtype=fp8")
    mem = replica_memory(IterationModel(t, cluster, _stages(2, 1), RooflineCost()), cfg, 80 * 2**30)
    left = mem.usable - mem.weights[0] - mem.workspace[0]
    assert mem.blocks == int(left // (cfg.block_size * 2 * 80 * 4 * 128))
    assert mem.blocks * cfg.block_size > 100_000  # tokens of cache: room to serve
