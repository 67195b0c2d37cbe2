"""Serving a fine-grained mixture of experts (DeepSeekMoE, Qwen-MoE): a batch of equal requests
alone takes the closed form's TTFT and TPOT (the shared experts and the dense first block timed as
the ``mode=serve`` graph's ops), the blocks of each kind counted per pipeline stage, the weights
per GPU, serving with expert parallelism on H100 and H200 clusters, and the deployment search
choosing ep and tp under latency constraints."""

from __future__ import annotations

import pytest

from marssim.serve import Deployment, Pool, Requests, load_model
from marssim.serve.deployment import SchedulerConfig
from marssim.serve.itermodel import IterationModel
from marssim.serve.memory import replica_memory
from marssim.serve.simulate import simulate_serving
from marssim.system import load_system
from marssim.workload import load_workload
from marssim.workload.llm import footprint
from support import alone_in_serve_mode_times

DS = ("moe:layers=3,hidden=512,heads=8,kv_heads=8,ffn=1536,expert_ffn=256,experts=8,top_k=3,shared_experts=2,"
      "dense_layers=1,vocab=1000")
QW = ("moe:layers=2,hidden=512,heads=8,kv_heads=2,ffn=1024,expert_ffn=256,experts=8,top_k=2,shared_experts=1,"
      "shared_ffn=1024,shared_gate=true,vocab=1000")
FOUR = ("gpu0", "gpu1", "gpu2", "gpu3")


@pytest.mark.parametrize("model", [DS, QW], ids=["deepseek", "qwen"])
@pytest.mark.parametrize("prompt,output,batch", [(300, 6, 4), (77, 5, 7)])
def test_one_gpu_serves_in_the_serve_modes_times(model, prompt, output, batch, cost, dgx):
    """A batch of equal requests alone takes ``serving_times``' TTFT and TPOT of the
    ``mode=serve`` graph, whose every block is in it (the dense first one, the routed and
    shared experts, the shared experts' gate) -- batches whose decode steps route a token to
    every expert, so the graph runs every expert."""
    alone_in_serve_mode_times(model, prompt, output, batch, cost, dgx)


def test_dense_first_blocks_are_counted_per_pipeline_stage(cost, dgx):
    """With 5 blocks, the first 3 dense, over 2 stages (3 + 2 blocks): stage 0 holds the 3 dense
    blocks, stage 1 two with experts. One block more of a kind adds that kind's block time,
    which the dense block and the expert block differ in."""
    model = load_model(DS.replace("layers=3", "layers=5").replace("dense_layers=1", "dense_layers=3"))
    im = IterationModel(model, dgx, (("gpu0",), ("gpu1",)), cost)
    assert im.stage_blocks == ((3, 0), (0, 2))
    shape = ((1, 64), (1, 64), ((1, 64, 64),), 0, 0, 1)

    def times(layers: int, dense: int) -> tuple[float, ...]:
        spec = DS.replace("layers=3", f"layers={layers}").replace("dense_layers=1", f"dense_layers={dense}")
        return IterationModel(load_model(spec), dgx, (("gpu0",),), cost).stage_times(*shape)

    # times(layers, dense) = ends + dense x D + (layers - dense) x M
    moe_block = times(4, 1)[0] - times(3, 1)[0]
    dense_block = times(3, 2)[0] - times(2, 1)[0]
    assert times(5, 3)[0] == pytest.approx(times(2, 1)[0] + 2 * dense_block + moe_block, rel=1e-12)
    assert dense_block != pytest.approx(moe_block, rel=1e-3)


def test_weights_per_gpu_are_the_models_parameters_over_tp(cost, dgx):
    """Four GPUs hold the parameters once between them (the routed experts split or whole, the
    shared expert split as the MLP, the fused QKV projection by its columns), but for what every
    rank keeps whole: the norms, the router's and the shared gate's columns. In bf16."""
    h, layers, experts = 512, 2, 8
    params = footprint(load_workload(f"{QW},mode=forward,seq=2")).parameters
    whole = layers * (2 * h + h * experts + h) + h  # norms, router, shared gate per block; final norm
    for ep in (1, 4):
        im = IterationModel(load_model(QW), dgx, (FOUR,), cost, ep=ep)
        weights = replica_memory(im, SchedulerConfig(), 80e9).weights[0]
        expected = 2 * ((params - whole) / 4 + whole)
        assert weights == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize("system", ["dgx-h100-cluster:nodes=1", "dgx-h200-cluster:nodes=1"])
def test_deepseek_moe_16b_serves_with_expert_parallelism(system, cost):
    """The DeepSeekMoE 16B preset on 8-GPU H100 and H200 nodes, two replicas of tp = ep = 4:
    every request completes, the all-to-all layout timed apart from the split experts'."""
    sys = load_system(system)
    model = load_model("deepseek-moe-16b")
    requests = Requests.of([0.0, 0.002, 0.004, 0.02, 0.03], [512, 128, 900, 64, 300], [8, 4, 6, 5, 3])
    finish = {}
    for ep in (1, 4):
        result = simulate_serving(Deployment((Pool(replicas=2, tp=4, ep=ep),)), model, sys, cost, requests)
        assert result.summary["completed"] == 5
        finish[ep] = list(result.per_request["finish_s"])
    assert finish[1] != finish[4]


def test_the_serving_search_picks_ep_and_tp_for_a_deepseek_style_model():
    """Level 2 of the deployment search descends over ``ep`` for a model with shared experts and a
    dense first block; the answer's simulation meets the constraints."""
    from support import small_moe_serving_search

    result = small_moe_serving_search("moe:layers=3,hidden=256,heads=8,kv_heads=4,ffn=768,expert_ffn=128,"
                                      "experts=8,top_k=3,shared_experts=2,dense_layers=1,vocab=2000")
    pools = [p for c in result.candidates for p in c.plan.pools]
    assert all(p.ep in (1, p.tp) for p in pools)
    assert {p.ep > 1 for p in pools if p.tp > 1} == {True, False}
    assert result.evaluation.slo_ratio <= 1
