"""The configuration an LLM graph was built from, read through one accessor: the graph builder's
``transformer_of`` and ``require_transformer`` give it back, refuse other workloads by name, and
no other module of marssim reads the graph's ``meta`` for it."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from marssim.errors import InputError
from marssim.workload import load_workload
from marssim.workload.llm import config_from, require_transformer, transformer_of
from marssim.workload.llm.build import build_transformer

ROOT = Path(__file__).resolve().parents[1]
SMALL = "gpt:layers=2,hidden=128,heads=4,vocab=500,seq=16,batch=2,max_positions=32"


def test_an_llm_graph_gives_back_the_configuration_it_was_built_from():
    cfg = config_from({"family": "llama"}, "tiny", layers=1, hidden=64, heads=4, kv_heads=2, ffn=160, vocab=300,
                      seq=8, batch=3)
    graph = build_transformer(cfg)
    assert transformer_of(graph) is cfg
    assert require_transformer(graph, "a parallel configuration") is cfg
    loaded = transformer_of(load_workload(SMALL))
    assert (loaded.family, loaded.layers, loaded.hidden, loaded.batch, loaded.seq) == ("gpt", 2, 128, 2, 16)


def test_other_workloads_have_none_and_are_refused_naming_what_needs_an_llm():
    graph = load_workload("resnet50")
    assert transformer_of(graph) is None
    with pytest.raises(InputError) as err:
        require_transformer(graph, "a parallel configuration")
    assert err.value.file == graph.spec
    assert "a parallel configuration needs an LLM workload" in str(err.value) and graph.spec in str(err.value)
    with pytest.raises(InputError) as err:
        require_transformer(graph, "the search over parallel configurations", "--workload")
    assert err.value.file == "--workload"
    assert "the search over parallel configurations needs an LLM workload" in str(err.value)


def _meta_reads(tree: ast.AST) -> list[int]:
    """Lines that index or ``.get`` a ``meta`` attribute with the literal ``"transformer"``."""
    lines = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Subscript) and isinstance(node.value, ast.Attribute) and node.value.attr == "meta":
            key = node.slice
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get"
              and isinstance(node.func.value, ast.Attribute) and node.func.value.attr == "meta" and node.args):
            key = node.args[0]
        else:
            continue
        if isinstance(key, ast.Constant) and key.value == "transformer":
            lines.append(node.lineno)
    return lines


def test_no_module_reads_the_configuration_from_meta_by_its_key():
    builder = ROOT / "marssim" / "workload" / "llm" / "build.py"
    found = {}
    for path in sorted((ROOT / "marssim").rglob("*.py")):
        lines = _meta_reads(ast.parse(path.read_text(encoding="utf-8")))
        if lines and path != builder:
            found[str(path.relative_to(ROOT))] = lines
    assert found == {}
    # the check finds such a read where one is written
    assert _meta_reads(ast.parse('a = graph.meta["transformer"]\nb = g.meta.get("transformer")\n')) == [1, 2]
