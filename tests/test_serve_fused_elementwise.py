"""An engine that fuses a block's element-wise ops (``fused_elementwise``, TensorRT-LLM's Llama
block): the residual adds, FP8 quantizations and rotary embeddings launch no kernel and cost their
traffic at the DRAM bandwidth; every other op, and every collective, is timed as without fusion."""

from __future__ import annotations

import pytest

from marssim.errors import InputError
from marssim.parallel.partition import shard_loops
from marssim.serve import Deployment, Pool, Requests, SchedulerConfig, load_model
from marssim.serve.deployment import parse_pool
from marssim.serve.itermodel import ABSORBED_FUNCTIONS, IterationModel, absorbed_op, resize_tokens
from marssim.serve.simulate import simulate_serving
from marssim.system import load_system


@pytest.fixture(scope="module")
def h100():
    return load_system("dgx-h100-cluster:nodes=1,stack=trtllm-1.3.0rc20")


def _pair(spec: str, tp: int, system, cost) -> tuple[IterationModel, IterationModel]:
    stages = (tuple(system.accelerator_ids[:tp]),)
    model = load_model(spec)
    return (IterationModel(model, system, stages, cost),
            IterationModel(model, system, stages, cost, fused_elementwise=True))


@pytest.mark.parametrize("spec,tp", [("llama3-8b:dtype=fp8,attention=flash", 1), ("llama3-8b:attention=flash", 2)])
@pytest.mark.parametrize("batch", [1, 238])
def test_a_fused_block_saves_each_absorbed_ops_time_beyond_its_traffic(spec, tp, batch, h100, cost):
    plain, fused = _pair(spec, tp, h100, cost)
    names = {op.name.split(".layers.0.")[-1] for op, _ in fused.token_ops if op.name in fused.absorbed}
    fp8 = "dtype=fp8" in spec
    # the residual adds, the rotary embeddings and, in FP8, the quantizations before the GEMMs
    assert names == {"attn.residual", "mlp.residual", "attn.q_rope", "attn.k_rope"} | (
        {"input_norm.fp8", "attn.core.fp8", "post_norm.fp8", "mlp.act.fp8"} if fp8 else set())
    assert not plain.absorbed
    design = plain.design(0)
    bandwidth = h100.accelerator(h100.accelerator_ids[0]).memory.bandwidth
    saved = 0.0
    for op, rule in plain.token_ops:
        if op.name not in fused.absorbed:
            continue
        part = resize_tokens(op, batch, 1, plain.ref_tokens)
        sizes = shard_loops(part, rule, {}, 1)
        part = part.with_loops(**sizes) if sizes else part
        scale = max(1, rule.scale)
        saved += (cost.op_cost(part, design).time - part.bytes_moved / bandwidth) / scale
    shape = ((batch, 1), (0, 0), (), batch, batch * 700, batch)
    blocks = plain.blocks[0]
    assert plain.stage_times(*shape)[0] - fused.stage_times(*shape)[0] == pytest.approx(blocks * saved, rel=1e-9)
    assert saved > 0
    # the all-reduces the residual adds wait for are kept, byte for byte
    (_, nbytes_plain, latency_plain), = plain.stage_parts(*shape)
    (_, nbytes_fused, latency_fused), = fused.stage_parts(*shape)
    assert (nbytes_fused, latency_fused) == (nbytes_plain, latency_plain)
    # the absorbed ops launch no kernel
    per_block = len(names)
    assert plain.kernels(0, False) - fused.kernels(0, False) == blocks * per_block


def test_only_adds_quantizations_and_rotary_embeddings_are_absorbed(h100, cost):
    _, fused = _pair("gpt3-1.3b", 1, h100, cost)  # LayerNorm, GeLU, biases, learned positions
    kept = {op.param("fn") for op, _ in fused.token_ops if op.kind.name == "ELTWISE" and op.name not in fused.absorbed}
    assert "gelu" in kept and not kept & set(ABSORBED_FUNCTIONS)
    assert all(absorbed_op(op) for op, _ in fused.token_ops if op.name in fused.absorbed)
    assert all(op.kind.name != "NORM" for op, _ in fused.token_ops if op.name in fused.absorbed)


def test_the_pool_key_reaches_the_simulation(h100, cost):
    pool = parse_pool("replicas=1,tp=1,fused_elementwise=true", "x")
    assert pool.scheduler.fused_elementwise and parse_pool(pool.text(), "x") == pool
    with pytest.raises(InputError):
        parse_pool("replicas=1,fused_elementwise=maybe", "pools[0]")
    model = load_model("llama3-8b:dtype=fp8,attention=flash")
    requests = Requests.of([0.0] * 4, [64] * 4, [8] * 4)
    runs = [simulate_serving(Deployment((Pool(replicas=1, tp=1, scheduler=SchedulerConfig(fused_elementwise=f)),)),
                             model, h100, cost, requests).summary["duration_s"] for f in (False, True)]
    assert runs[1] < runs[0]
