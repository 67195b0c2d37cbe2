"""The tensor-parallel split of every GEMM of a transformer graph is the role the graph builder
declares on it (``tp_role``): column-, row-parallel or replicated (the MoE router, the shared
experts' gate score), carried by the backward and recomputed GEMMs; a GEMM without one is refused,
naming it, where it used to take the router's replicated rule silently."""

from __future__ import annotations

from dataclasses import replace

import pytest

from marssim.errors import InputError
from marssim.parallel.roles import rule_for
from marssim.workload import OpKind, load_workload
from marssim.workload.llm.tprole import TP_ROLE, TpRole, tp_role

MOE = "moe:layers=2,hidden=256,heads=4,kv_heads=2,ffn=512,vocab=500,seq=64,experts=4,top_k=2,mode=train"
SHARED = ("moe:layers=2,hidden=256,heads=4,kv_heads=2,ffn=512,expert_ffn=128,experts=8,top_k=2,shared_experts=1,"
          "shared_gate=true,dense_layers=1,vocab=500,seq=64,mode=train,recompute=full")
GPT = "gpt:layers=2,hidden=128,heads=4,vocab=500,seq=32,max_positions=64,mode=train,recompute=full"
SERVE = "llama:layers=2,hidden=128,heads=4,kv_heads=2,ffn=320,vocab=500,mode=serve,prompt=8,generate=2"

# Megatron-LM's layers, by the name of the forward GEMM within its block: ColumnParallelLinear
# (linear_qkv, linear_fc1 with the gate and up halves, the output layer), RowParallelLinear
# (linear_proj, linear_fc2), the router and the shared experts' gate with replicated weights
MEGATRON = {"attn.qkv": TpRole.COLUMN, "attn.proj": TpRole.ROW, "mlp.fc1": TpRole.COLUMN, "mlp.gate": TpRole.COLUMN,
            "mlp.up": TpRole.COLUMN, "mlp.fc2": TpRole.ROW, "mlp.down": TpRole.ROW, "moe.gate": TpRole.COLUMN,
            "moe.up": TpRole.COLUMN, "moe.fc1": TpRole.COLUMN, "moe.down": TpRole.ROW, "shared.gate": TpRole.COLUMN,
            "shared.up": TpRole.COLUMN, "shared.fc1": TpRole.COLUMN, "shared.down": TpRole.ROW,
            "shared.fc2": TpRole.ROW, "moe.router": TpRole.REPLICATED, "shared.router": TpRole.REPLICATED,
            "output": TpRole.COLUMN}


def _gemms(graph):
    return [op for op in graph.ops if op.kind == OpKind.GEMM and not op.param("grouped")]


def test_every_gemm_of_a_moe_training_step_has_a_known_split():
    gemms = _gemms(load_workload(MOE))
    rules = [rule_for(op, {}, tp=2, sp=True, ep=2) for op in gemms]
    router = [r for op, r in zip(gemms, rules) if op.name.endswith("moe.router")]
    # the router's weights are replicated: its output stays in the hidden state's layout
    assert router and all(r.out == "S" for r in router)
    assert {r.out for op, r in zip(gemms, rules) if op.name.endswith("attn.qkv")} == {"F"}
    assert {r.out for op, r in zip(gemms, rules) if op.name.endswith("attn.proj")} == {"P"}


def _within_block(name: str) -> str:
    """``decode.2.layers.1.mlp.up.wgrad`` -> ``mlp.up``; ``output.dgrad`` -> ``output``."""
    parts = name.split(".")
    while parts[-1] in ("dgrad", "wgrad", "recompute"):
        parts.pop()
    return ".".join(parts[parts.index("layers") + 2:]) if "layers" in parts else parts[-1]


@pytest.mark.parametrize("spec", [MOE, SHARED, GPT, SERVE])
def test_every_gemm_declares_megatrons_role_and_its_gradients_and_copies_carry_it(spec):
    graph = load_workload(spec)
    gemms = [op for op in graph.ops if op.kind == OpKind.GEMM]
    assert {_within_block(op.name) for op in gemms} <= set(MEGATRON)
    for op in gemms:
        assert tp_role(op) is MEGATRON[_within_block(op.name)], op.name
    phases = {op.param("grad") or op.param("phase") for op in gemms}
    if "train" in spec:  # the backward GEMMs of both kinds, and (recompute=full) the recomputed forward ones
        assert {"input", "weight", "fwd"} <= phases
        assert "recompute" in phases or "recompute" not in spec


def test_a_row_parallel_gemms_rules_swap_in_its_input_gradient():
    graph = load_workload(GPT)
    proj = {op.param("grad"): rule_for(op, {}, tp=4, sp=False, ep=1) for op in graph.ops
            if op.kind == OpKind.GEMM and _within_block(op.name) == "attn.proj"}
    assert proj[None].want == ("F",) and proj[None].out == "P"
    assert proj["input"].want == ("R",) and proj["input"].out == "F"
    assert proj["weight"].want == ("F", "R")


def test_a_gemm_without_a_role_is_refused_naming_it():
    op = _gemms(load_workload(MOE))[0]
    bare = replace(op, name="layers.0.attn.mystery", params=tuple((k, v) for k, v in op.params if k != TP_ROLE))
    with pytest.raises(InputError, match=r"layers\.0\.attn\.mystery.*declares none"):
        rule_for(bare, {}, tp=2, sp=False, ep=1)
    # the name no longer decides: a GEMM of any name splits as the role it declares
    renamed = replace(op, name="layers.0.attn.mystery")
    assert rule_for(renamed, {}, tp=2, sp=False, ep=1) == rule_for(op, {}, tp=2, sp=False, ep=1)


def test_an_expert_gemm_under_expert_tensor_parallelism_needs_a_split_role():
    expert = next(op for op in load_workload(MOE).ops if op.param("grouped") and op.name.endswith("moe.down"))
    assert rule_for(expert, {}, tp=2, sp=True, ep=2, etp=2).out == "Z"  # row-parallel over the etp ranks
    bare = replace(expert, params=tuple((k, v) for k, v in expert.params if k != TP_ROLE))
    with pytest.raises(InputError, match=r"layers\.\d\.moe\.down: .*declares none"):
        rule_for(bare, {}, tp=2, sp=True, ep=2, etp=2)
    router = replace(expert, params=tuple(sorted({**dict(expert.params), TP_ROLE: TpRole.REPLICATED}.items())))
    with pytest.raises(InputError, match="declares 'replicated'"):
        rule_for(router, {}, tp=2, sp=True, ep=2, etp=2)
