"""Preparing a workload's graph for a configuration: a graph prepared before is prepared again
from the workload as written. Context parallelism cuts the sequence once (the working set of a
recomputed layer under ``cp`` is that of a rank's own tokens), and a preparation that asks for
the workload as written gives its own graph back while it lives (no rebuilt copy)."""

from __future__ import annotations

from marssim.parallel import memory_estimate, parse_parallel, prepare_graph
from marssim.workload import load_workload
from marssim.workload.llm import transformer_of

LLAMA = "llama:layers=4,hidden=512,heads=8,kv_heads=8,ffn=1024,vocab=1000,mode=train,batch=1"


def test_context_parallel_recomputation_is_sized_by_a_ranks_tokens():
    split = parse_parallel("tp=1,pp=1,dp=1,cp=2,recompute=full,global_batch=1")
    whole = parse_parallel("tp=1,pp=1,dp=1,recompute=full,global_batch=1")
    prepared = prepare_graph(load_workload(LLAMA + ",seq=1024"), split)
    assert transformer_of(prepared).seq == 512
    # prepared again (the memory model's graph without recomputation): still 512 tokens, not 256
    assert transformer_of(prepare_graph(prepared, split.with_(recompute="none"))).seq == 512
    a = memory_estimate(prepared, split, 80e9)
    b = memory_estimate(prepare_graph(load_workload(LLAMA + ",seq=512"), whole), whole, 80e9)
    assert a.working == b.working and a.working[0] > 0


def test_the_workload_as_written_is_its_own_graph():
    graph = load_workload(LLAMA + ",seq=256")
    cfg = parse_parallel("tp=1,pp=1,dp=1,recompute=full,global_batch=1")
    prepared = prepare_graph(graph, cfg)
    assert prepared is not graph and transformer_of(prepared).recompute == "full"
    assert prepare_graph(prepared, cfg.with_(recompute="none")) is graph
    assert prepare_graph(graph, cfg.with_(recompute="none")) is graph
