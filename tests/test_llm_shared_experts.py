"""Fine-grained mixtures of experts with shared experts and dense first blocks (DeepSeekMoE,
Qwen-MoE): the checks of the configuration, the graph's work in closed form, the backward of the
shared experts' sigmoid gate, the tensor-parallel roles of the new GEMMs, and a training step
split over tensor-, expert- and pipeline-parallel ranks, its closed-form screen timing every
block by its kind."""

from __future__ import annotations

import pytest

from marssim.errors import InputError
from marssim.parallel import parse_parallel
from marssim.parallel.roles import rule_for
from marssim.workload import OpKind, load_workload
from marssim.workload.llm import footprint
from support import small_gpu_cluster

# DeepSeek-style: first block dense (ffn 768), then 8 routed experts of 128, top-3, 2 shared of 128
DS = ("moe:layers=3,hidden=256,heads=4,kv_heads=4,ffn=768,expert_ffn=128,experts=8,top_k=3,shared_experts=2,"
      "dense_layers=1,vocab=500,seq=64")
# Qwen-MoE-style: one shared expert of 512 behind a sigmoid gate, every block with experts
QW = ("moe:layers=2,hidden=256,heads=4,kv_heads=2,ffn=512,expert_ffn=128,experts=8,top_k=2,shared_experts=1,"
      "shared_ffn=512,shared_gate=true,vocab=500,seq=64")


@pytest.mark.parametrize("params,key", [
    ("shared_ffn=64", "shared_ffn"),  # no shared experts
    ("shared_gate=true", "shared_gate"),
    ("shared_experts=1,dense_layers=3", "dense_layers"),  # more than the layers
    ("shared_experts=-1", "shared_experts"),
])
def test_inconsistent_expert_settings_are_refused_by_name(params, key):
    with pytest.raises(InputError) as err:
        load_workload(f"moe:layers=2,hidden=256,heads=4,kv_heads=4,ffn=512,experts=4,top_k=2,vocab=500,seq=8,{params}")
    assert err.value.problems[0][0].endswith(key)


@pytest.mark.parametrize("key", ["expert_ffn=64", "shared_experts=1", "dense_layers=1"])
def test_expert_settings_on_a_dense_model_are_refused(key):
    with pytest.raises(InputError, match="mixture-of-experts"):
        load_workload(f"llama:layers=2,hidden=256,heads=4,kv_heads=4,ffn=512,vocab=500,seq=8,{key}")


def test_forward_flops_of_dense_first_block_shared_and_routed_experts():
    """Forward GEMM FLOPs per block, by hand: attention projections; the dense block's MLP of
    ``ffn``; an expert block's router, ``experts x capacity`` routed tokens through three
    ``hidden x expert_ffn`` matrices and every token through the shared experts' three
    ``hidden x shared_experts x expert_ffn``."""
    graph = load_workload(DS + ",mode=forward,batch=2")
    tokens, h = 2 * 64, 256
    capacity = -(-3 * tokens // 8)
    per_layer: dict[int, float] = {}
    for op in graph.ops:
        if op.kind == OpKind.GEMM and 0 <= op.param("layer") < 3:
            per_layer[op.param("layer")] = per_layer.get(op.param("layer"), 0.0) + op.flops
    attention = 2 * tokens * h * (3 * h) + 2 * tokens * h * h
    assert per_layer[0] == attention + 2 * tokens * 3 * h * 768
    moe = attention + 2 * tokens * h * 8 + 8 * 2 * capacity * 3 * h * 128 + 2 * tokens * 3 * h * (2 * 128)
    assert per_layer[1] == per_layer[2] == moe


def test_the_shared_gate_has_a_backward_and_a_parameter():
    graph = load_workload(QW + ",mode=train")
    names = {op.name for op in graph.ops}
    for i in range(2):
        assert {f"layers.{i}.shared.scale.grad", f"layers.{i}.shared.scale.grad_score",
                f"layers.{i}.shared.router.wgrad", f"layers.{i}.shared.down.dgrad"} <= names
    f = footprint(graph)
    plain = footprint(load_workload(QW.replace("shared_gate=true", "shared_gate=false") + ",mode=train"))
    assert f.parameters - plain.parameters == 2 * 256  # one score column of hidden per block
    # the gate's score gradient reads the gate's output and score, both kept for backward
    grad = next(op for op in graph.ops if op.name == "layers.1.shared.scale.grad_score")
    assert grad.inputs[1:] == ("layers.1.shared.scale", "layers.1.shared.router")


def test_shared_experts_are_tensor_parallel_as_the_mlp_and_the_gate_score_replicated():
    graph = load_workload(QW + ",mode=train")
    by = {op.name: op for op in graph.ops}
    tp = 4
    for name, out, loop in (("layers.0.shared.fc1", "F", "N"), ("layers.0.shared.down", "P", "K")):
        rule = rule_for(by[name], {}, tp=tp, sp=True, ep=2)
        assert rule.out == out and (loop, 1, tp) in rule.split
    score = rule_for(by["layers.0.shared.router"], {}, tp=tp, sp=True, ep=2)
    assert score.out == "S" and score.split == (("M", 1, tp),)


@pytest.fixture(scope="module")
def cluster():
    """Two nodes of four GPUs on NVSwitch, one NIC per GPU into a leaf switch."""
    return small_gpu_cluster(nodes=2, per_leaf=2, gpus=4)


@pytest.mark.parametrize("config", ["tp=2,pp=1,dp=4,ep=2,sp=true,global_batch=8",
                                    "tp=2,pp=2,dp=2,ep=2,sp=true,global_batch=8"])
def test_the_screen_times_every_block_by_its_kind(config, cost, cluster):
    """The closed-form screen times one block per kind and place: a stage's busy time is the sum
    of every block of its chunks timed on its own (the dense first block differs from the
    others), plus the embedding's and head's ops."""
    from marssim.parallel.analytic import _split_units, screen, screen_model
    from marssim.parallel.unittimer import UnitTimer

    graph = load_workload(DS + ",mode=train")
    cfg = parse_parallel(config)
    got = screen(graph, cluster, cfg, cost)
    low, _, representative = screen_model(graph, cluster, cfg, cost)
    units = _split_units(low)
    for stage in range(cfg.pp):
        timer = UnitTimer(low, representative[stage])
        busy = 0.0
        for (chunk, direction), (of_layer, ends) in units.items():
            if chunk % cfg.pp != stage or direction == "O":
                continue
            for layer in of_layer:
                if 0 <= layer < 3:
                    busy += timer.unit(of_layer[layer])[0]
            if ends:
                busy += timer.unit(ends)[0]
        assert got.stage_s[stage] == pytest.approx(busy, rel=1e-12)


def test_a_training_step_simulates_with_experts_and_shared_experts(cost, cluster):
    """Tensor, sequence, expert and pipeline parallelism: the step lowers, simulates and its
    estimate is within the contention the simulation adds; the shared experts' GEMMs run a
    ``1/tp`` column or row share on every rank."""
    from marssim.analytical import estimate
    from marssim.parallel import lower_parallel
    from marssim.sim import simulate

    graph = load_workload(DS + ",mode=train")
    cfg = parse_parallel("tp=2,pp=2,dp=2,ep=2,sp=true,global_batch=8")
    tg = lower_parallel(graph, cluster, cfg, cost)
    result = simulate(tg, cluster, memory_policy="ignore", setup=False)
    est = estimate(tg, cluster)
    assert 0 < est.makespan <= result.makespan * (1 + 1e-9)
    assert result.makespan < 1.2 * est.makespan
    iv = result.intervals
    ops = set(iv["op"].astype(str))
    assert any(".shared.fc1" in o for o in ops) and any(".mlp.down" in o for o in ops)


def test_shared_experts_are_dense_weights_split_over_tp_and_kept_by_every_expert_rank():
    """tp=2, ep=2 (etp = tp): a rank holds half of the attention, of the dense first block's MLP
    and of the shared experts (dense weights, their gradients reduced over every data-parallel
    rank), the router and norms whole, and of the routed experts ``experts / ep`` at ``1 / etp``
    of their weights (reduced over the expert-data-parallel replicas)."""
    from marssim.parallel import prepare_graph
    from marssim.parallel.partition import op_rules
    from marssim.parallel.memory import rank_parameters

    h, tp = 256, 2
    graph = load_workload(DS + ",mode=train")
    cfg = parse_parallel("tp=2,dp=4,ep=2,sp=true")
    prepared = prepare_graph(graph, cfg)
    per, experts = rank_parameters(prepared, cfg, op_rules(prepared, cfg))
    attention = 4 * h * h // tp
    norms = 2 * h
    assert per[0] == attention + 3 * h * 768 // tp + norms and not experts.get(0)
    routed = 8 // 2 * 3 * h * 128 // tp
    shared = 3 * h * (2 * 128) // tp
    for layer in (1, 2):
        assert experts[layer] == routed
        assert per[layer] == attention + shared + h * 8 + norms + routed
