"""Serving a mixture-of-experts model: the experts' piece of an iteration against the ops of a
freshly built graph, the busiest expert-parallel rank's tokens, the all-to-all of dispatch and
combine in closed form on the system's routes, the experts' weights per GPU, and the refusals."""

from __future__ import annotations

import math

import pytest

from marssim.errors import InputError
from marssim.serve import Deployment, Pool, Requests, load_model
from marssim.serve.memory import replica_memory
from marssim.serve.deployment import SchedulerConfig, parse_pool
from marssim.serve.itermodel import IterationModel
from marssim.serve.simulate import simulate_serving
from marssim.workload.llm import build_transformer
from marssim.workload.llm.config import with_overrides
from support import alone_in_serve_mode_times

SMALL = "moe:layers=2,hidden=512,heads=8,kv_heads=2,ffn=1024,experts=8,top_k=2,vocab=1000"
FOUR = ("gpu0", "gpu1", "gpu2", "gpu3")


@pytest.mark.parametrize("prompt,output,batch", [(300, 6, 4), (77, 5, 4), (100, 4, 7)])
def test_one_gpu_serves_in_the_serve_modes_times(prompt, output, batch, cost, dgx):
    """On one GPU (the parallel path's serving graphs split experts only over data-parallel
    ranks), a batch of equal requests alone takes ``serving_times``' TTFT and TPOT of the
    ``mode=serve`` graph, whose prefill and decode steps route their own tokens (batches whose
    decode steps route a token to every expert: the graph runs every expert)."""
    alone_in_serve_mode_times(SMALL, prompt, output, batch, cost, dgx)


@pytest.mark.parametrize("n,h", [(1, 300), (3, 100), (1, 7)])
def test_experts_on_one_gpu_cost_what_a_prefill_graphs_experts_cost(n, h, cost, dgx):
    """At tp = ep = 1 with uniform routing the experts of an iteration of ``n x h`` tokens are the
    dispatch, grouped GEMMs and combine of a ``mode=prefill`` graph of that batch, whose capacity
    is ``ceil(top_k n h / experts)`` tokens per expert: the piece costs exactly their sum."""
    model = load_model(SMALL)
    im = IterationModel(model, dgx, (("gpu0",),), cost)
    fresh = build_transformer(with_overrides(model, mode="prefill", seq=h, batch=n, layers=1))
    theirs = [op for op in fresh.ops if ".moe." in op.name and op.name.split(".")[-1] not in ("router", "topk")]
    assert [op.name.split(".")[-1] for op in theirs] == ["dispatch", "gate", "up", "act", "down", "combine"]
    assert theirs[1].loop_dict["M"] == math.ceil(2 * n * h / 8) == im.expert_tokens(n * h)
    expected = sum(float(cost.op_cost(op, im.design(0)).time) for op in theirs)
    seconds, comm, _, _ = im._experts_time(0, n * h)
    assert comm == 0.0
    assert seconds == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize("fused", [False, True])
def test_fp8_experts_cost_their_casts_and_gemms(fused, cost, dgx):
    """Under the FP8 recipe the experts' piece holds the casts of the grouped GEMMs' inputs
    (``moe.dispatch.fp8``, ``moe.act.fp8``): at tp = ep = 1 it costs exactly the experts' ops of a
    ``mode=prefill`` FP8 graph of the batch, a cast that ``fused_elementwise`` absorbs its bytes at
    the DRAM bandwidth; the iteration model builds (no token-wise op reads a cast), and the FP8
    model serves every request."""
    model = load_model(SMALL + ",dtype=fp8")
    im = IterationModel(model, dgx, (("gpu0",),), cost, fused_elementwise=fused)
    n, h = 3, 100
    fresh = build_transformer(with_overrides(model, mode="prefill", seq=h, batch=n, layers=1))
    theirs = [op for op in fresh.ops if ".moe." in op.name and op.name.split(".")[-1] not in ("router", "topk")]
    assert [op.name.split(".moe.")[-1] for op in theirs] == [
        "dispatch", "dispatch.fp8", "gate", "up", "act", "act.fp8", "down", "combine"]
    dram = float(dgx.accelerator("gpu0").memory.bandwidth)
    casts = [op for op in theirs if op.param("fn") == "quantize"]
    expected = sum(op.bytes_moved / dram if fused and op in casts else float(cost.op_cost(op, im.design(0)).time)
                   for op in theirs)
    seconds, comm, _, _ = im._experts_time(0, n * h)
    assert comm == 0.0
    assert seconds == pytest.approx(expected, rel=1e-12)
    requests = Requests.of([0.0, 0.001, 0.002], [300, 40, 120], [8, 5, 3])
    result = simulate_serving(Deployment((Pool(replicas=1, tp=1),)), model, dgx, cost, requests)
    assert result.summary["completed"] == 3


@pytest.mark.parametrize("count", [4, 37, 400])
def test_the_busiest_rank_sets_the_expert_tokens(count, cost, dgx):
    """Experts 0-1 on rank 0 receive (5 + 1) / 12 of the routed tokens: twice a uniform rank's
    quarter; each of its experts processes ``top_k T x 2 / experts`` tokens."""
    skewed = load_model(SMALL + ",expert_load=5/1/1/1/1/1/1/1")
    uniform = load_model(SMALL)
    im = IterationModel(skewed, dgx, (FOUR,), cost, ep=4)
    assert im.expert_tokens(count) == math.ceil(2 * count * 2 / 8)
    flat = IterationModel(uniform, dgx, (FOUR,), cost, ep=4)
    assert flat.expert_tokens(count) == math.ceil(2 * count / 8)
    # experts split over tp (ep = 1): every GPU sees every token and expert
    assert IterationModel(uniform, dgx, (FOUR,), cost).expert_tokens(count) == math.ceil(2 * count / 8)
    assert im._experts_time(0, count)[0] >= flat._experts_time(0, count)[0]


@pytest.mark.parametrize("count,work", [(1, (2, 1)), (3, (6, 1)), (4, (8, 1)), (5, (8, 2)), (33, (8, 9))])
def test_only_experts_with_tokens_run(count, work, cost, dgx):
    """Top-2 of 8 experts on one GPU: ``2 count`` routed tokens run on ``min(8, 2 count)`` experts,
    ``ceil(2 count / experts run)`` tokens each; the piece costs the grouped GEMMs of that many."""
    im = IterationModel(load_model(SMALL), dgx, (("gpu0",),), cost)
    assert im.expert_work(count) == work
    few = im._experts_time(0, 1)[0]
    assert few < im._experts_time(0, 4)[0]  # two experts' weights read, not eight


def test_all_to_all_is_one_step_per_peer_on_the_routes(cost, dgx):
    """ep = tp = 4: the dispatch and the combine each send every peer ``top_k ceil(T/4) hidden
    bytes / 4`` one after another at the route's latency and bottleneck bandwidth; with the ring
    all-gather that makes the hidden state whole, that is the piece's communication."""
    model = load_model(SMALL)
    im = IterationModel(model, dgx, (FOUR,), cost, ep=4)
    count = 250
    seconds, comm, _, _ = im._experts_time(0, count)
    per_peer = 2 * math.ceil(count / 4) * 512 * 2 / 4
    cap = dgx.resource_capacity
    a2a = 0.0
    for peer in FOUR[1:]:
        route = dgx.route("gpu0", peer)
        a2a += route.latency + per_peer / min(float(cap[r]) for r in route.resources)
    gather = im._ring(0, float(count * 512 * 2), "all_gather")[0]
    assert gather > 0
    assert comm == pytest.approx(2 * a2a + gather, rel=1e-12)
    # experts split over tp instead: the all-reduce of the combine's partial sums
    split = IterationModel(model, dgx, (FOUR,), cost, ep=1)
    assert split._experts_time(0, count)[1] == pytest.approx(split._ring(0, float(count * 512 * 2), "all_reduce")[0],
                                                              rel=1e-12)


def test_expert_weights_are_sharded_over_the_replicas_gpus(cost, dgx):
    """The weights per GPU of 8 and of 4 experts differ by 4 experts' three matrices of
    ``hidden x ffn`` per layer over tp (whichever ep) and the router's 4 columns of ``hidden``
    (replicated), in bf16."""
    per_gpu = {}
    for experts in (8, 4):
        model = load_model(SMALL.replace("experts=8", f"experts={experts}"))
        for ep in (1, 4):
            im = IterationModel(model, dgx, (FOUR,), cost, ep=ep)
            per_gpu[experts, ep] = replica_memory(im, SchedulerConfig(), 80e9).weights[0]
    assert per_gpu[8, 1] == per_gpu[8, 4]
    assert per_gpu[8, 4] - per_gpu[4, 4] == 2 * (4 * 3 * 512 * 1024 / 4 + 512 * 4) * 2


def test_a_moe_model_serves_every_request_with_expert_parallelism(cost, dgx):
    model = load_model(SMALL)
    requests = Requests.of([0.0, 0.001, 0.002, 0.01], [300, 40, 120, 64], [8, 5, 3, 6])
    out = {}
    for ep in (1, 4):
        dep = Deployment((Pool(replicas=2, tp=4, ep=ep),))
        result = simulate_serving(dep, model, dgx, cost, requests)
        assert result.summary["completed"] == 4
        out[ep] = result.per_request["finish_s"]
    assert list(out[1]) != list(out[4])  # the two layouts are timed differently


@pytest.mark.parametrize("model,pool,key", [
    (SMALL, "replicas=1,tp=4,ep=2", "ep"),  # ep is 1 or tp
    (SMALL.replace("experts=8", "experts=6"), "replicas=1,tp=4,ep=4", "ep"),  # experts % ep
    ("llama:layers=2,hidden=256,heads=4,ffn=512,kv_heads=4,vocab=1000", "replicas=1,tp=2,ep=2", "ep"),  # dense
])
def test_expert_parallelism_that_is_not_modelled_is_refused(model, pool, key, cost, dgx):
    with pytest.raises(InputError) as err:
        simulate_serving(Deployment((parse_pool(pool),)), load_model(model), dgx, cost,
                         Requests.of([0.0], [10], [2]))
    assert err.value.problems[0][0].endswith(key)


def test_network_collectives_refuse_the_all_to_all(cost, dgx):
    dep = Deployment((Pool(replicas=1, tp=4, ep=4),), tp_comm="network")
    with pytest.raises(InputError, match="tp_comm"):
        simulate_serving(dep, load_model(SMALL), dgx, cost, Requests.of([0.0], [10], [2]))


def test_pool_text_round_trips_ep():
    pool = parse_pool("replicas=2,tp=4,ep=4")
    assert pool.ep == 4 and parse_pool(pool.text()) == pool


def test_expert_parallelism_is_launched_with_the_engines_flags():
    """ep = tp adds vLLM's --enable-expert-parallel and SGLang's --ep-size and changes no other flag."""
    from dataclasses import replace

    from marssim.serve.launch import launch_commands

    model = load_model(SMALL)
    base = Pool(replicas=1, tp=4)
    before = launch_commands(Deployment((base,)), model, SMALL)
    after = launch_commands(Deployment((replace(base, ep=4),)), model, SMALL)
    for a, b, flag, value in zip(before, after, ("--enable-expert-parallel", "--ep-size"), ("", "4")):
        fa, fb = a.flags(), b.flags()
        assert flag not in fa and fb.pop(flag) == value
        assert fa == fb


def test_the_serving_search_chooses_expert_parallelism_for_a_moe_model():
    """Level 2 of the deployment search descends over ``ep`` (1 or the pool's tp) for a mixture of
    experts: the screened deployments hold both layouts, every one legal, and the answer is one of
    them, met by its simulation."""
    from support import small_moe_serving_search

    result = small_moe_serving_search("moe:layers=2,hidden=256,heads=8,kv_heads=4,ffn=512,experts=4,top_k=2,"
                                      "vocab=2000")
    pools = [p for c in result.candidates for p in c.plan.pools]
    assert all(p.ep in (1, p.tp) for p in pools)
    assert {p.ep > 1 for p in pools if p.tp > 1} == {True, False}
    assert result.evaluation.slo_ratio <= 1


def test_the_search_report_names_expert_parallelism():
    from marssim.search.report import short_deployment

    assert short_deployment(Deployment((Pool(replicas=2, tp=4, ep=4),))).startswith("2xtp4ep4 ")
    assert short_deployment(Deployment((Pool(replicas=2, tp=4),))).startswith("2xtp4 ")
