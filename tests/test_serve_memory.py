"""KV-cache capacity of a replica: weights per GPU in closed form from the model's dimensions, the
KV bytes of a token, and the blocks as exactly what is left of the usable memory."""

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


def llama_weights_per_gpu(t, tp: int, first: bool, last: bool, blocks: int) -> float:
    """Megatron-style shards of a Llama block (column/row parallel GEMMs split, norms replicated),
    the vocabulary-parallel embedding and output; bf16."""
    h, f, d = t.hidden, t.ffn_size, t.d_head
    block = h * (t.heads + 2 * t.kv) * d // tp + t.heads * d * h // tp + 3 * h * f // tp + 2 * h
    params = blocks * block
    if first:
        params += -(-t.vocab // tp) * h
    if last:
        params += h + h * t.vocab // tp
    return 2.0 * params


@pytest.mark.parametrize("tp,pp", [(4, 1), (8, 1), (2, 2)])
def test_llama3_70b_weights_and_kv_bytes_per_gpu(tp, pp, cluster):
    t = load_model("llama3-70b")
    im = IterationModel(t, cluster, _stages(tp, pp), RooflineCost())
    mem = replica_memory(im, SchedulerConfig(), 80 * 2**30)
    for s in range(pp):
        blocks = 80 // pp
        assert mem.weights[s] == llama_weights_per_gpu(t, tp, s == 0, s == pp - 1, blocks)
        # keys and values of the stage's layers, its share of the 8 key/value heads of 128
        assert mem.kv_bytes_per_token[s] == 2 * blocks * (8 // tp) * 128 * 2
    assert mem.weights[0] / 2**30 == pytest.approx(70.55e9 * 2 / tp / pp / 2**30, rel=0.03)  # 70.6 B parameters


@pytest.mark.parametrize("spec,tp,pp", [("llama3-8b", 1, 1), ("llama3-70b", 4, 2), ("gpt3-13b", 2, 1),
                                        ("gpt3-1.3b", 2, 2)])
def test_the_cache_is_what_the_weights_and_workspace_leave(spec, tp, pp, cluster):
    t = load_model(spec)
    cfg = SchedulerConfig(block_size=32, gpu_memory_utilization=0.85, max_batched_tokens=4096)
    mem = replica_memory(IterationModel(t, cluster, _stages(tp, pp), RooflineCost()), cfg, 80 * 2**30)
    assert mem.usable == 0.85 * 80 * 2**30
    fill = [w + ws + kv for w, ws, kv in zip(mem.weights, mem.workspace, mem.kv_bytes)]
    assert max(fill) <= mem.usable
    # the tightest stage could not hold one more block
    tight = min(range(pp), key=lambda s: (mem.usable - mem.weights[s] - mem.workspace[s]) / mem.block_bytes(s))
    assert fill[tight] + mem.block_bytes(tight) > mem.usable


def test_the_last_stage_keeps_a_copy_of_a_tied_embedding(cluster):
    t = load_model("gpt3-1.3b")
    one = replica_memory(IterationModel(t, cluster, _stages(2, 1), RooflineCost()), SchedulerConfig(), 80 * 2**30)
    two = replica_memory(IterationModel(t, cluster, _stages(2, 2), RooflineCost()), SchedulerConfig(), 80 * 2**30)
    assert two.weights[0] + two.weights[1] - one.weights[0] == 2 * -(-t.vocab // 2) * t.hidden


def test_a_model_that_does_not_fit_is_one_error(cluster):
    t = load_model("llama3-70b")
    im = IterationModel(t, cluster, _stages(1, 1), RooflineCost())
    with pytest.raises(InputError) as err:
        replica_memory(im, SchedulerConfig(), 80 * 2**30, where="pools[0]")
    assert "pools[0]" in str(err.value) and "weights" in str(err.value)


@pytest.mark.parametrize("spec,tp,pp", [("llama3-8b", 1, 1), ("llama3-70b", 4, 2)])
def test_tensorrt_llms_rule_gives_the_cache_its_share_of_the_free_memory(spec, tp, pp, cluster):
    """``kv_cache_free_gpu_mem_fraction`` ``f``: the cache holds the whole blocks of ``f`` of what the
    weights and the workspace leave of the whole GPU, which the ``gpu_memory_utilization`` rule at
    the same fraction (``f x capacity - weights - workspace``) undercounts by ``(1 - f) x (weights +
    workspace)``."""
    t = load_model(spec)
    im = IterationModel(t, cluster, _stages(tp, pp), RooflineCost())
    capacity = 80 * 2**30
    trt = replica_memory(im, SchedulerConfig(block_size=32, kv_cache_free_gpu_mem_fraction=0.95), capacity)
    vllm = replica_memory(im, SchedulerConfig(block_size=32, gpu_memory_utilization=0.95), capacity)
    assert trt.weights == vllm.weights and trt.workspace == vllm.workspace
    free = [capacity - w - ws for w, ws in zip(trt.weights, trt.workspace)]
    assert trt.blocks == min(int(0.95 * f // trt.block_bytes(s)) for s, f in enumerate(free))
    assert vllm.blocks == min(int((0.95 * capacity - capacity + f) // vllm.block_bytes(s)) for s, f in enumerate(free))
    gained = max(0.05 * (w + ws) for w, ws in zip(trt.weights, trt.workspace))  # at most, on some stage
    assert 0 < (trt.blocks - vllm.blocks) * trt.block_bytes(0) <= gained + trt.block_bytes(0)


def test_one_memory_rule_a_pool():
    from marssim.serve.deployment import parse_pool

    pool = parse_pool("replicas=1,tp=1,kv_cache_free_gpu_mem_fraction=0.95", "x")
    assert pool.scheduler.kv_cache_free_gpu_mem_fraction == 0.95
    assert parse_pool(pool.text(), "x") == pool  # reads back from its own text
    with pytest.raises(InputError) as err:
        parse_pool("replicas=1,gpu_memory_utilization=0.9,kv_cache_free_gpu_mem_fraction=0.95", "pools[0]")
    assert "kv_cache_free_gpu_mem_fraction" in str(err.value) and "not both" in str(err.value)
    with pytest.raises(InputError):
        parse_pool("replicas=1,kv_cache_free_gpu_mem_fraction=1.5", "pools[0]")
