"""The tensor-parallel split of every GEMM of a transformer graph is known by its name: column-,
row-parallel or replicated (the MoE router); a GEMM of any other name is refused, naming it,
where it used to take the router's replicated rule silently."""

from __future__ import annotations

from dataclasses import replace

import pytest

from marssim.errors import InputError
from marssim.parallel.roles import COLUMN, REPLICATED, ROW, rule_for
from marssim.workload import OpKind, load_workload

MOE = "moe:layers=2,hidden=256,heads=4,kv_heads=2,ffn=512,vocab=500,seq=64,experts=4,top_k=2,mode=train"


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


def test_a_gemm_of_unknown_name_is_refused_naming_it():
    op = _gemms(load_workload(MOE))[0]
    odd = replace(op, name="layers.0.attn.mystery")
    with pytest.raises(InputError, match=r"layers\.0\.attn\.mystery.*'attn\.mystery'"):
        rule_for(odd, {}, tp=2, sp=False, ep=1)
    assert not set(COLUMN) & set(ROW) and not set(REPLICATED) & (set(COLUMN) | set(ROW))
