"""Expert parallelism over a stage's tensor- and data-parallel ranks, as Megatron-LM lays it out:
along the stage's ranks (tensor-parallel innermost, then data x context parallel) first the
expert-tensor-parallel ranks (``etp``), then the expert-parallel ones (``ep``), then the expert
data parallelism. With ``etp = tp`` (the default) that is the data-parallel coordinate at one
tensor-parallel rank; with ``etp < tp`` an expert-parallel group takes tensor-parallel ranks
first, so ``ep`` may exceed ``dp`` (``tp=2,dp=16,ep=32,etp=1``) and each rank holds
``experts / ep`` whole experts. Checked: the groups and rings by construction, the weights a rank
holds and the all-to-all's bytes in closed form, the legality rules."""

from __future__ import annotations

import pytest

from marssim.cost import default_cost_model
from marssim.errors import InputError
from marssim.parallel import check_parallel, lower_parallel, parallel_problems, parse_parallel, prepare_graph
from marssim.parallel.experts import gradient_group
from marssim.parallel.memory import rank_parameters
from marssim.parallel.partition import op_rules
from marssim.parallel.patterns import EDP_RING, ep_peer
from marssim.parallel.placement import place
from marssim.system import load_system
from marssim.workload import load_workload
from marssim.workload.llm import transformer_of

COST = default_cost_model()
NODE = "dgx-h100-cluster:nodes=1"
MOE = "moe:layers=2,hidden=256,heads=4,kv_heads=2,ffn=512,vocab=500,seq=96,experts=8,top_k=2,mode=train"
WHOLE = 3 * 256 * 512  # gate, up and down of one expert


def _groups(system, cfg) -> tuple[dict, dict]:
    """Each GPU's expert-parallel group (itself and its ``ep+k`` peers) and its coordinates."""
    where = place(system, cfg)
    patterns = where.patterns()
    groups = {g: frozenset([g] + [patterns[ep_peer(k)](g) for k in range(1, cfg.ep)]) for g in where.gpus}
    return groups, where.coords


def _expert_index(coords, tp: int) -> int:
    dp, _, t = coords
    return t + tp * dp


@pytest.mark.parametrize("text", ["tp=2,dp=4,ep=4,etp=1,sp=true", "tp=2,dp=4,ep=8,etp=1,sp=true",
                                  "tp=4,dp=2,ep=4,etp=2,sp=true", "tp=2,dp=4,ep=2,sp=true"])
def test_expert_groups_follow_megatron_lms_expert_order(text):
    """A group is ``ep`` ranks ``etp`` apart along the stage's ranks; the groups partition the
    GPUs; the expert gradients reduce over the ranks ``etp x ep`` apart that hold the same
    experts, ``tp x dp / (etp x ep)`` of them."""
    system = load_system(NODE)
    cfg = parse_parallel(text)
    tp, etp, ep = cfg.tp, cfg.etp_of(0), cfg.ep
    groups, coords = _groups(system, cfg)
    assert len(set(groups.values())) == 8 // ep and all(len(g) == ep for g in groups.values())
    for g, members in groups.items():
        f = _expert_index(coords[g], tp)
        want = {f % etp + etp * (p + ep * (f // (etp * ep))) for p in range(ep)}
        assert {_expert_index(coords[m], tp) for m in members} == want
    pattern, size = gradient_group(cfg, 0)
    assert size == tp * cfg.dp // (etp * ep)
    if size > 1:
        ring = place(system, cfg).patterns()[pattern]
        for g in groups:
            f = _expert_index(coords[g], tp)
            assert _expert_index(coords[ring(g)], tp) == (f + etp * ep) % 8


def test_with_etp_equal_to_tp_the_groups_are_the_data_parallel_replicas():
    """The default ``etp = tp``: a group is ``ep`` consecutive data-parallel replicas at one
    tensor-parallel rank, its gradients over the replicas ``ep`` apart (``edp+1``)."""
    system = load_system(NODE)
    cfg = parse_parallel("tp=2,dp=4,ep=2,sp=true")
    groups, coords = _groups(system, cfg)
    for g, members in groups.items():
        dp, stage, t = coords[g]
        assert {coords[m] for m in members} == {(d, stage, t) for d in range(dp // 2 * 2, dp // 2 * 2 + 2)}
    assert gradient_group(cfg, 0) == (EDP_RING, 2)


@pytest.mark.parametrize("ep", [2, 4, 8])
def test_a_rank_holds_experts_over_ep_whole_experts(ep):
    """etp=1 on tp=2, dp=4: each rank holds ``8 / ep`` whole experts, ep = 8 spanning both
    tensor-parallel ranks of all four replicas."""
    cfg = parse_parallel(f"tp=2,dp=4,ep={ep},etp=1,sp=true")
    prepared = prepare_graph(load_workload(MOE), cfg)
    _, experts = rank_parameters(prepared, cfg, op_rules(prepared, cfg))
    assert experts[0] == 8 // ep * WHOLE


def test_a_folded_all_to_all_sends_a_ranks_tokens_to_its_peers():
    """tp=2, dp=4, ep=8, etp=1: each rank sends 7/8 of its routed tokens (its sequence-parallel
    share: tokens x top_k / tp, of hidden bf16 values) to its 7 peers, 1/8 to each, in the forward
    dispatch; the dispatch's transfers reach every other GPU of the node."""
    system = load_system(NODE)
    cfg = parse_parallel("tp=2,dp=4,ep=8,etp=1,sp=true,global_batch=4")
    graph = load_workload(MOE)
    t = transformer_of(graph)
    tg = lower_parallel(graph, system, cfg, COST)
    sends = [c for c in tg.collectives if c.kind == "all_to_all" and c.op == "layers.0.moe.dispatch"]
    assert sends
    routed = t.seq * t.top_k // cfg.tp * t.hidden * 2  # bytes a rank holds, before the all-to-all
    assert {len(c.devices) for c in sends} == {8}
    assert sum(c.nbytes for c in sends) / len(sends) == pytest.approx(routed)


@pytest.mark.parametrize("text, key", [
    ("tp=2,dp=4,ep=8,sp=true", "ep"),  # etp = tp = 2: 2 x 8 ranks do not fit in tp x dp = 8
    ("tp=2,dp=4,ep=4,etp=1", "sp"),  # without sp the tensor-parallel ranks would hold the same tokens
    ("tp=2,dp=4,ep=3,etp=1,sp=true", "ep"),  # not a divisor of the 8 experts
])
def test_expert_layouts_megatron_lm_refuses_are_refused(text, key):
    with pytest.raises(InputError) as err:
        check_parallel(parse_parallel(text), transformer_of(load_workload(MOE)), 8, "--parallel")
    assert err.value.problems[0][0] == key


def test_the_search_offers_expert_parallel_degrees_beyond_dp_and_keeps_only_legal_ones():
    """The LLM search's expert-parallel choices for a stage of ``tp x dp`` ranks divide ``tp x dp``
    and the experts; those beyond ``dp`` are legal with ``etp=1`` only (and, as every mixture of
    experts with tp > 1, with sequence parallelism)."""
    from marssim.search.llm import LLMSearchSettings, LLMSpace

    graph, system = load_workload(MOE), load_system(NODE)
    space = LLMSpace(graph, system, LLMSearchSettings())
    assert space.eps(4) == (1, 2, 4)
    assert space.eps(4, 2) == (1, 2, 4, 8)
    t = transformer_of(graph)
    for ep in space.eps(4, 2):
        for etp, sp in ((0, True), (1, True), (1, False)):
            cfg = parse_parallel(f"tp=2,dp=4,ep={ep},etp={etp},sp={str(sp).lower()}")
            problems = {key for key, _ in parallel_problems(cfg, t, 8)}
            fits = ep * (etp or 2) <= 8 and sp  # MoE layers with tp > 1 need sp, as Megatron-LM's
            assert (not problems) == fits, (ep, etp, sp, problems)
