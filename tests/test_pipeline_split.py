"""The embedding and the loss counted as layers of the pipeline split (Megatron-LM's
``--account-for-embedding-in-pipeline-split`` and ``--account-for-loss-in-pipeline-split``):
``layers + 2`` split evenly over the model chunks, the first and the last chunk one block fewer;
the split the interleaved schedule then accepts (Llama 3.1 405B's 126 layers in 64 chunks), the
stages' work that follows from it, and the settings it is refused with."""

from __future__ import annotations

import pytest

from marssim.cost import DataflowCost
from marssim.errors import InputError
from marssim.parallel import chunk_layers, lower_parallel, parse_parallel
from marssim.parallel.config import check_parallel
from marssim.sim import simulate
from marssim.system import load_system
from marssim.workload import load_workload
from marssim.workload.llm import transformer_of


def _blocks(chunk: tuple[int, ...], layers: int) -> list[int]:
    return [layer for layer in chunk if 0 <= layer < layers]


def test_405b_splits_into_64_chunks_of_two_with_the_embedding_and_loss_counted() -> None:
    cfg = parse_parallel("tp=8,pp=8,cp=2,dp=8,sp=true,global_batch=512,schedule=interleaved,virtual_stages=8,"
                         "account_for_embedding=true,account_for_loss=true")
    chunks = chunk_layers(126, cfg)
    assert len(chunks) == 64
    assert chunks[0] == (-1, 0) and chunks[-1] == (125, 126)  # embedding + 1 block, 1 block + head
    assert all(len(_blocks(c, 126)) == 2 for c in chunks[1:-1])
    assert [layer for c in chunks for layer in _blocks(c, 126)] == list(range(126))  # each block once, in order
    t = transformer_of(load_workload("llama3-405b:mode=train,attention=flash"))
    check_parallel(cfg, t, 1024)  # accepted
    plain = parse_parallel("tp=8,pp=8,cp=2,dp=8,sp=true,global_batch=512,schedule=interleaved,virtual_stages=8")
    with pytest.raises(InputError, match="virtual_stages: the 126 layers must split into pp x virtual_stages = 64"):
        check_parallel(plain, t, 1024)


@pytest.mark.parametrize("embedding,loss,sizes", [
    (True, False, [3, 4]),  # 7 + 1 counted: 4 and 4, the first one fewer
    (False, True, [4, 3]),  # 7 + 1 counted: 4 and 4, the last one fewer
    (True, True, [4, 3]),  # 7 + 2 counted: 5 and 4, the first and the last one fewer
    (False, False, [4, 3]),  # balanced, the larger first
])
def test_the_counted_split_of_an_odd_model_over_two_stages(embedding, loss, sizes) -> None:
    cfg = parse_parallel(f"pp=2,account_for_embedding={str(embedding).lower()},account_for_loss={str(loss).lower()}")
    assert [len(_blocks(c, 7)) for c in chunk_layers(7, cfg)] == sizes


def test_the_counted_split_moves_a_block_from_the_first_stage_to_a_middle_one() -> None:
    """Six blocks on four 1F1B stages: balanced 2/2/1/1, counted (6 + 2 = 8, 2 per stage) 1/2/2/1.
    Per GPU, the FLOPs of a step follow: the first stage loses one block's (the third stage's
    under the balanced split), the third gains one, the others are unchanged."""
    spec = "llama:layers=6,hidden=256,heads=8,kv_heads=2,ffn=640,vocab=2560,seq=256,batch=1,mode=train"
    system = load_system("dgx-h100-cluster:nodes=1")
    cost = DataflowCost()
    graph = load_workload(spec)
    flops = {}
    for counted in (False, True):
        flag = str(counted).lower()
        cfg = parse_parallel(f"tp=1,pp=4,dp=2,global_batch=16,account_for_embedding={flag},account_for_loss={flag}")
        assert [len(_blocks(c, 6)) for c in chunk_layers(6, cfg)] == ([1, 2, 2, 1] if counted else [2, 2, 1, 1])
        result = simulate(lower_parallel(graph, system, cfg, cost, folding=False), system)
        flops[counted] = [float(result.devices.loc[f"gpu{s}", "flops"]) for s in range(4)]  # stage s: gpu s
    balanced, split = flops[False], flops[True]
    block = balanced[2]  # the third stage's one block, under the balanced split
    assert split[0] == pytest.approx(balanced[0] - block, rel=1e-9)
    assert split[2] == pytest.approx(balanced[1], rel=1e-9) == pytest.approx(2 * block, rel=1e-9)
    assert split[1] == pytest.approx(balanced[1], rel=1e-9) and split[3] == pytest.approx(balanced[3], rel=1e-9)


def test_counting_the_embedding_is_refused_with_explicit_stages_or_empty_chunks() -> None:
    t = transformer_of(load_workload("llama:layers=8,mode=train"))
    with pytest.raises(InputError, match="account_for_embedding: applies to the balanced split"):
        check_parallel(parse_parallel("pp=2,layers_per_stage=4/4,account_for_embedding=true"), t, 2)
    short = transformer_of(load_workload("llama:layers=5,mode=train"))  # 5 + 2 counted over 8 chunks
    with pytest.raises(InputError, match="account_for_embedding: splits 7 counted layers over 8 model chunks"):
        check_parallel(parse_parallel("pp=8,account_for_embedding=true,account_for_loss=true"), short, 8)


def test_a_chunk_may_hold_the_embedding_or_the_head_alone() -> None:
    """Megatron-Bridge's Llama 3.1 405B on GB200 (pp 16, 8 virtual stages: 126 + 2 counted over
    128 chunks) runs the embedding and the head as model chunks of their own. Six blocks on two
    stages of four chunks, counted: the first chunk is the embedding, the last the head, each
    block in a chunk of its own; the step does the same work as the balanced split, moved: per
    GPU the FLOPs of the embedding's stage lose a block, and the whole is unchanged."""
    t = transformer_of(load_workload("llama:layers=6,mode=train"))
    counted = parse_parallel("tp=1,pp=2,dp=4,global_batch=8,schedule=interleaved,virtual_stages=4,"
                             "account_for_embedding=true,account_for_loss=true")
    check_parallel(counted, t, 8)  # accepted
    chunks = chunk_layers(6, counted)
    assert chunks[0] == (-1,) and chunks[-1] == (6,)
    assert all(len(c) == 1 and 0 <= c[0] < 6 for c in chunks[1:-1])
    spec = "llama:layers=6,hidden=256,heads=8,kv_heads=2,ffn=640,vocab=2560,seq=256,batch=1,mode=train"
    system = load_system("dgx-h100-cluster:nodes=1")
    graph = load_workload(spec)
    flops = {}
    for flag, chunks_per_stage in (("false", 3), ("true", 4)):
        cfg = parse_parallel(f"tp=1,pp=2,dp=4,global_batch=8,schedule=interleaved,virtual_stages={chunks_per_stage},"
                             f"account_for_embedding={flag},account_for_loss={flag}")
        check_parallel(cfg, t, 8)
        result = simulate(lower_parallel(graph, system, cfg, DataflowCost(), folding=False), system)
        assert result.makespan > 0
        flops[flag] = [float(result.devices.loc[f"gpu{s}", "flops"]) for s in range(2)]
    assert sum(flops["true"]) == pytest.approx(sum(flops["false"]), rel=1e-9)
    # balanced (6 chunks): stage 0 holds the embedding and blocks 0, 2, 4; counted (8 chunks): the
    # embedding and blocks 1, 3, 5 -- three blocks either way (block 0 differs from the others by
    # an element-wise op of seq x hidden), the head on stage 1 both times
    assert flops["true"][0] == pytest.approx(flops["false"][0], rel=1e-4)
    assert flops["true"][1] == pytest.approx(flops["false"][1], rel=1e-4)
