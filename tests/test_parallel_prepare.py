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


def test_working_set_read_from_the_recomputing_graph_is_the_graphs_without():
    """The activations a layer would keep without recomputation, read from the graph that
    recomputes it (its backward's reads of the recomputed copies), are those of the graph built
    without recomputation: the same tensors in the same order, so the same floats per layer,
    under tensor, sequence, pipeline and expert parallelism, FP8 and a dropout mask."""
    from marssim.parallel.memory import _saved_per_layer, _saved_per_layer_without_recompute
    from marssim.parallel.partition import op_rules
    from marssim.workload.llm.footprint import saved_tensors, saved_without_recompute

    cases = [("gpt:layers=3,hidden=512,heads=8,vocab=1000,seq=128,max_positions=128,mode=train,batch=1",
              "tp=2,pp=3,dp=1,sp=true,global_batch=6"),
             (LLAMA + ",seq=256,dtype=fp8", "tp=4,pp=2,dp=1,global_batch=4"),
             ("mixtral-8x7b:layers=2,hidden=512,heads=8,kv_heads=4,ffn=1024,vocab=1000,mode=train,seq=128,batch=1",
              "tp=2,pp=1,dp=2,ep=2,global_batch=4")]
    checked = 0
    for spec, text in cases:
        graph = load_workload(spec)
        for recompute in ("full", "selective"):
            cfg = parse_parallel(f"{text},recompute={recompute}")
            prepared = prepare_graph(graph, cfg)
            derived = saved_without_recompute(prepared)
            assert list(derived.items()) == list(saved_tensors(graph).items())
            assert derived != saved_tensors(prepared)  # recomputation keeps other tensors
            want = _saved_per_layer(graph, cfg, op_rules(graph, cfg))
            got = _saved_per_layer_without_recompute(prepared, cfg, op_rules(prepared, cfg))
            assert list(got.items()) == list(want.items())
            checked += any(v > 0 for v in got.values())
    assert checked == 6
