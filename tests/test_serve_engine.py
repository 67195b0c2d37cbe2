"""Serving simulations checked by what must hold whatever the cost model says: Little's law, every
request finishing exactly once with all its tokens, KV blocks within capacity, the schedulers'
budgets and batches, M/D/1's closed form for a single-server static batcher at low load, prefix
caching saving exactly the cached prefix, the disaggregated handoff, routers, determinism.

A transparent roofline cost model and small systems keep the runs fast (the iteration model's
agreement with the cost model's own serving times is tests/test_serve_itermodel.py)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from support import TINY_SERVING_LLAMA, RooflineCost, make_system, switched_four

from marssim.serve import (Arrivals, Deployment, Lengths, Pool, RequestSpec, Requests, SchedulerConfig,
                           load_model, simulate_serving)
from marssim.serve.disagg import kv_plan
from marssim.serve.fabric import TRANSFER_KINDS, Fabric

MODEL = TINY_SERVING_LLAMA


@pytest.fixture(scope="module")
def model():
    return load_model(MODEL)


@pytest.fixture(scope="module")
def system():
    return switched_four()


def run(model, system, pools, requests, **kw):
    dep = Deployment(tuple(pools), **{k: kw.pop(k) for k in ("router", "decode_router") if k in kw})
    return simulate_serving(dep, model, system, RooflineCost(), requests, **kw)


def spec(n=300, rate=2000.0, prompt=(20, 600), output=(2, 120), seed=0) -> Requests:
    return RequestSpec(Arrivals("poisson", rate=rate), Lengths("uniform", low=prompt[0], high=prompt[1]),
                       Lengths("uniform", low=output[0], high=output[1]), n).draw(seed)


POOLS = {
    "static": [Pool(replicas=2, tp=1, scheduler=SchedulerConfig(kind="static", max_num_seqs=16))],
    "continuous": [Pool(replicas=2, tp=2, scheduler=SchedulerConfig(max_num_seqs=32, max_batched_tokens=2048))],
    "orca": [Pool(replicas=2, tp=1, scheduler=SchedulerConfig(mixed=True, max_batched_tokens=2048))],
    "chunked": [Pool(replicas=1, tp=4, scheduler=SchedulerConfig(kind="chunked", max_batched_tokens=256))],
    "pipeline": [Pool(replicas=1, tp=2, pp=2, scheduler=SchedulerConfig(kind="chunked", max_batched_tokens=512))],
    "swap": [Pool(replicas=2, tp=1, scheduler=SchedulerConfig(gpu_memory_utilization=0.6, preemption="swap",
                                                               max_batched_tokens=2048))],
    "recompute": [Pool(replicas=2, tp=1, scheduler=SchedulerConfig(gpu_memory_utilization=0.6,
                                                                    max_batched_tokens=2048))],
    "disaggregated": [Pool(replicas=1, tp=1, role="prefill", scheduler=SchedulerConfig(kind="chunked",
                                                                                        max_batched_tokens=512)),
                      Pool(replicas=1, tp=2, role="decode"), Pool(replicas=1, tp=1, role="decode")],
}


@pytest.mark.parametrize("name", list(POOLS))
def test_littles_law_every_request_once_and_blocks_within_capacity(name, model, system):
    requests = spec()
    r = run(model, system, POOLS[name], requests)
    s = r.summary
    pr = r.per_request
    assert s["rejected"] == 0 and s["completed"] == len(requests)
    # Little's law: requests in the system, integrated as they came and went, against rate x latency
    assert s["little"]["mean_in_system"] == pytest.approx(s["little"]["rate_x_latency"], rel=1e-9)
    area = float(np.sum(pr["finish_s"] - pr["arrival_s"]))
    assert r.meta["little_area"] == pytest.approx(area, rel=1e-9)
    # every token of every request, once: one from the prefill, then one gap per token after it
    assert len(r.gaps) == int(np.sum(requests.output - 1))
    assert (pr["arrival_s"] <= pr["started_s"]).all() and (pr["started_s"] < pr["first_token_s"]).all()
    assert (pr["first_token_s"] <= pr["finish_s"]).all()
    it = r.iterations
    assert (it["kv_blocks"] <= it["kv_capacity"]).all() and (it["kv_blocks"] >= 0).all()
    assert (it["end"] >= it["start"]).all()
    if name in ("swap", "recompute"):
        assert s["preemptions"] > 0, "the KV cache was meant to run out"
        assert it["kv_blocks"].max() > 0.9 * it["kv_capacity"].max()


def test_swapped_blocks_come_back_and_preempted_requests_still_finish(model, system):
    r = run(model, system, POOLS["swap"], spec())
    t = r.transfers
    out = t["kind"] == TRANSFER_KINDS.index("swap_out")
    back = t["kind"] == TRANSFER_KINDS.index("swap_in")
    assert out.any() and back.any()
    assert t["bytes"][out].sum() == pytest.approx(t["bytes"][back].sum(), rel=1e-12)
    assert (r.per_request["preemptions"] > 0).sum() > 0


def test_chunked_prefill_keeps_the_token_budget_and_splits_long_prompts(model, system):
    r = run(model, system, POOLS["chunked"], spec())
    it = r.iterations
    assert (it["prefill_tokens"] + it["decode_tokens"] <= 256).all()
    assert ((it["prefill_tokens"] > 0) & (it["decode_tokens"] > 0)).any()  # decodes ride with prefill chunks
    # a prompt longer than the budget is prefilled over several iterations
    assert (r.requests.prompt > 256).any()
    assert r.summary["completed"] == len(r.requests)


def test_continuous_prefills_run_alone_unless_mixed(model, system):
    it = run(model, system, POOLS["continuous"], spec()).iterations
    assert (it["decode_seqs"][it["prefill_seqs"] > 0] == 0).all()
    assert (it["prefill_tokens"] <= 2048).all()
    mixed = run(model, system, POOLS["orca"], spec()).iterations
    assert ((mixed["prefill_seqs"] > 0) & (mixed["decode_seqs"] > 0)).any()


def test_a_static_batch_admits_nobody_until_its_last_request_is_done(model, system):
    r = run(model, system, [Pool(replicas=1, tp=1, scheduler=SchedulerConfig(kind="static", max_num_seqs=8))],
            spec(n=120), trace=True)
    ids, offsets = r.iteration_requests
    finish = r.per_request["finish_s"]
    it = r.iterations
    previous: set[int] = set()
    for k in range(len(it["start"])):
        now = set(ids[offsets[k]:offsets[k + 1]].tolist())
        new = now - previous
        if new and previous:
            # a new batch: everything of the previous one finished by this iteration's start
            assert now.isdisjoint(previous)
            assert all(finish[i] <= it["start"][k] for i in previous)
        previous = now
        assert len(now) <= 8


def test_static_single_server_queueing_matches_md1(model, system):
    """Batches of one request of fixed lengths: a single server with deterministic service time D.
    Under Poisson arrivals at load rho the mean wait is rho D / (2 (1 - rho)) (M/D/1,
    Pollaczek-Khinchine); the simulated mean is within four batch-means standard errors."""
    pools = [Pool(replicas=1, tp=1, scheduler=SchedulerConfig(kind="static", max_num_seqs=1))]
    one = run(model, system, pools, Requests.of([0.0], [64], [3]))
    service = float(one.per_request["finish_s"][0])
    for rho in (0.3, 0.5):
        n = 20000
        req = RequestSpec(Arrivals("poisson", rate=rho / service), Lengths("fixed", 64), Lengths("fixed", 3),
                          n).draw(7)
        r = run(model, system, pools, req)
        pr = r.per_request
        np.testing.assert_allclose(pr["finish_s"] - pr["started_s"], service, rtol=1e-9)  # deterministic service
        wait = pr["started_s"] - pr["arrival_s"]
        closed = rho * service / (2 * (1 - rho))
        batches = wait[: n // 40 * 40].reshape(40, -1).mean(axis=1)
        se = batches.std(ddof=1) / math.sqrt(len(batches))
        assert abs(wait.mean() - closed) < 4 * se, (rho, wait.mean(), closed, se)
        assert abs(wait.mean() / closed - 1) < 0.1


def test_prefix_caching_skips_exactly_the_cached_full_blocks(model, system):
    """Requests far apart in time, all starting with one shared prefix of 200 tokens (12 full
    blocks of 16): the first prefills everything, every later one only what follows the cached
    192 tokens."""
    n, own, prefix = 40, 50, 200
    req = Requests(np.arange(n) * 1.0, np.full(n, own + prefix), np.full(n, 4), "t", np.zeros(n, dtype=np.int64),
                   np.full(n, prefix))
    on = run(model, system, [Pool(replicas=1, tp=1, scheduler=SchedulerConfig(prefix_caching=True))], req)
    off = run(model, system, [Pool(replicas=1, tp=1)], req)
    assert off.iterations["prefill_tokens"].sum() == n * (own + prefix)
    assert on.iterations["prefill_tokens"].sum() == n * (own + prefix) - (n - 1) * (prefix // 16 * 16)
    assert on.summary["ttft_s"]["p50"] < off.summary["ttft_s"]["p50"]


@pytest.mark.parametrize("src,dst", [((1, 1), (1, 1)), ((2, 1), (4, 1)), ((4, 1), (1, 2)), ((1, 2), (2, 2)),
                                     ((2, 2), (8, 1))])
def test_kv_plan_moves_each_decode_gpus_heads_of_its_layers(src, dst, model):
    """Bytes per token: every decode GPU receives 2 x its layers x its key/value heads x head
    dimension x 2 bytes (a head replicated when tp exceeds the key/value heads)."""
    def stages(tp, pp, base):
        return tuple(tuple(f"{base}{s}.{r}" for r in range(tp)) for s in range(pp))

    plan = kv_plan(model, stages(*src, "p"), stages(*dst, "d"))
    tp_d, pp_d = dst
    heads = max(1, model.kv // tp_d)
    expected = 2 * model.layers * tp_d * heads * model.d_head * 2
    assert sum(b for _, _, b in plan) == expected
    for gd in {d for _, d, _ in plan}:
        stage = int(gd[1:].split(".")[0])
        layers = model.layers // pp_d + (1 if stage < model.layers % pp_d else 0)
        assert sum(b for _, d, b in plan if d == gd) == 2 * layers * heads * model.d_head * 2


def test_a_disaggregated_request_waits_for_its_kv_cache_then_decodes(model, system):
    """One request: its first token when the prefill replica is done, its second one KV transfer
    and one decode step later. The prefill GPU sends each decode GPU its heads, both flows over
    the prefill GPU's one link to the switch: they share it, so the transfer takes the route
    latency plus all the bytes over that link's bandwidth (twice what a flow alone would take)."""
    pools = [Pool(replicas=1, tp=1, role="prefill"), Pool(replicas=1, tp=2, role="decode")]
    prompt = 300
    r = run(model, system, pools, Requests.of([0.0], [prompt], [3]))
    alone = run(model, system, [Pool(replicas=1, tp=1)], Requests.of([0.0], [prompt], [3]))
    pr = r.per_request
    assert pr["first_token_s"][0] == pytest.approx(alone.per_request["first_token_s"][0], rel=1e-12)
    info = {i.role: i for i in r.replicas}
    plan = kv_plan(model, info["prefill"].gpus, info["decode"].gpus)
    assert len(plan) == 2 and len({a for a, _, _ in plan}) == 1 and plan[0][2] == plan[1][2]
    route = system.route(plan[0][0], plan[0][1])
    link = min(system.resource_capacity[list(route.resources)])
    transfer = route.latency + sum(per for _, _, per in plan) * prompt / link
    assert pr["kv_transfer_end_s"][0] - pr["kv_transfer_start_s"][0] == pytest.approx(transfer, rel=1e-9)
    decode_only = run(model, system, [Pool(replicas=1, tp=2)], Requests.of([0.0], [prompt], [3]))
    step = decode_only.per_request["finish_s"][0] - decode_only.per_request["first_token_s"][0]
    # second token: the transfer, then one decode step on the decode replica; the third one step later
    assert pr["finish_s"][0] - pr["first_token_s"][0] == pytest.approx(transfer + step, rel=1e-9)


def test_routers(model, system):
    req = spec(n=60, rate=50.0)
    pools = [Pool(replicas=3, tp=1)]
    rr = run(model, system, pools, req, router="round_robin")
    assert (rr.per_request["replica"] == np.arange(60) % 3).all()
    # least outstanding tokens: with arrivals far apart every replica is idle, so replica 0 always
    far = Requests.of(np.arange(20) * 10.0, [100] * 20, [5] * 20)
    assert (run(model, system, pools, far).per_request["replica"] == 0).all()
    # under load it spreads the work
    busy = run(model, system, pools, spec(n=200, rate=5000.0)).per_request["replica"]
    assert set(busy.tolist()) == {0, 1, 2}


def test_concurrent_transfers_share_a_link_max_min_fairly():
    import simpy

    system = make_system(2, topology="chain", bandwidth="10 GB/s", latency="2 us")
    env = simpy.Environment()
    fabric = Fabric(env, system, log=True)
    ends = []

    def go(n):
        yield fabric.transfers([("acc0", "acc1", 1e6)] * n, "kv")
        ends.append(env.now)

    env.process(go(1))
    env.run()
    env.process(go(2))
    start = env.now
    env.run()
    route = system.route("acc0", "acc1")
    bw = min(system.resource_capacity[list(route.resources)])
    assert ends[0] == pytest.approx(route.latency + 1e6 / bw, rel=1e-12)
    assert ends[1] - start == pytest.approx(route.latency + 2e6 / bw, rel=1e-12)


def test_same_seed_same_bytes(model, system, tmp_path):
    from marssim.serve.outputs import write_tables, write_trace

    pools = POOLS["disaggregated"]
    paths = []
    for k in range(2):
        r = run(model, system, pools, spec(n=80, seed=5), trace=True, router="random")
        write_tables(r, tmp_path / f"o{k}")
        write_trace(r, tmp_path / f"o{k}" / "t.json")
        paths.append(tmp_path / f"o{k}")
    for name in ("summary.json", "requests.csv", "iterations.csv", "transfers.csv", "t.json"):
        assert (paths[0] / name).read_bytes() == (paths[1] / name).read_bytes(), name
    other = run(model, system, pools, spec(n=80, seed=6), router="random")
    assert other.summary["e2e_s"]["mean"] != r.summary["e2e_s"]["mean"]


def test_requests_that_can_never_fit_are_rejected_not_simulated(model, system):
    pools = [Pool(replicas=1, tp=1, scheduler=SchedulerConfig(max_batched_tokens=1024))]
    r = run(model, system, pools, Requests.of([0.0, 0.1, 0.2], [100, 5000, 100], [10, 10, 10**7]))
    assert r.per_request["rejected"].tolist() == [False, True, True]
    assert r.summary["completed"] == 1 and r.summary["rejected"] == 2


def test_a_recomputation_longer_than_the_token_budget_runs_alone(model, system):
    """Prompts of 250 tokens under a 256-token budget, preempted by recompute after generating:
    their prompt and generated tokens (up to 399) exceed the budget, and are prefilled alone."""
    cfg = SchedulerConfig(max_batched_tokens=256, gpu_memory_utilization=0.3)
    r = run(model, system, [Pool(replicas=1, tp=1, scheduler=cfg)], Requests.of(np.zeros(60), [250] * 60, [150] * 60))
    assert r.summary["preemptions"] > 0 and r.summary["completed"] == 60
    it = r.iterations
    over = it["prefill_tokens"] > 256
    assert over.any() and (it["prefill_seqs"][over] == 1).all()


def test_tensor_parallel_collectives_as_flows_equal_the_closed_form_alone_and_slow_down_when_shared(model):
    """tp_comm=network: with nothing else on the links an iteration takes the closed form's time
    (a ring of equal hops); when KV caches stream into the decode GPUs over the same links (slow
    links and fast accelerators here, so that the KV moves never stop and the all-reduces count),
    the decode replica's all-reduces share them and its tokens come later."""
    fast = {"big": {"dataflow": "os", "pe_rows": 256, "pe_cols": 256, "clock": "2 GHz", "sram": "64 MiB",
                    "sram_bandwidth": "4 TB/s"}}
    system = make_system(4, topology="switch", capacity="64 MiB", bandwidth="1 GB/s", latency="1 us", designs=fast)

    def go(pools, requests, tp_comm):
        dep = Deployment(tuple(pools), tp_comm=tp_comm)
        return simulate_serving(dep, model, system, RooflineCost(), requests)

    alone = Requests.of([0.0], [300], [20])
    for pools in ([Pool(replicas=1, tp=4)], [Pool(replicas=1, tp=2, pp=2)]):
        closed, network = go(pools, alone, "closed"), go(pools, alone, "network")
        for key in ("first_token_s", "finish_s"):
            assert network.per_request[key][0] == pytest.approx(closed.per_request[key][0], rel=1e-9)
    pools = [Pool(replicas=1, tp=1, role="prefill"), Pool(replicas=1, tp=2, role="decode")]
    busy = spec(n=200, rate=3000.0, prompt=(1000, 2000), output=(20, 60))
    closed, network = go(pools, busy, "closed"), go(pools, busy, "network")
    assert network.summary["tbt_s"]["mean"] > closed.summary["tbt_s"]["mean"] * 1.02
    assert network.summary["little"]["mean_in_system"] == pytest.approx(network.summary["little"]["rate_x_latency"],
                                                                        rel=1e-9)


def test_guaranteed_no_evict_never_preempts_and_runs_as_many_requests_as_whole_outputs_fit(model, system):
    """TensorRT-LLM's capacity policy: a request is admitted only when its prompt and whole output
    fit beside the running requests' whole prompts and outputs, so the cache that preempts under
    the default policy preempts nothing, and a burst of equal requests runs floor((blocks -
    watermark) / blocks of one whole request) at once."""
    guaranteed = SchedulerConfig(gpu_memory_utilization=0.6, max_batched_tokens=2048, capacity="guaranteed_no_evict")
    r = run(model, system, [Pool(replicas=2, tp=1, scheduler=guaranteed)], spec())
    assert r.summary["preemptions"] == 0 and r.summary["completed"] == 300
    assert run(model, system, POOLS["recompute"], spec()).summary["preemptions"] > 0  # the same cache, by default
    prompt, output, n = 200, 100, 400
    burst = RequestSpec(Arrivals("poisson", rate=1e9), Lengths("fixed", value=prompt), Lengths("fixed", value=output),
                        n).draw(0)
    one = SchedulerConfig(max_num_seqs=1024, max_batched_tokens=8192, capacity="guaranteed_no_evict")
    r = run(model, system, [Pool(replicas=1, tp=1, scheduler=one)], burst)
    it = r.iterations
    blocks = int(it["kv_capacity"].max())
    whole = -(-(prompt + output) // one.block_size)
    expected = (blocks - int(one.watermark * blocks)) // whole
    assert 0 < expected < n and r.summary["preemptions"] == 0
    assert int(it["decode_tokens"].max()) == expected


def test_the_capacity_policy_reads_back_and_a_bad_one_is_refused_by_name():
    from marssim.errors import InputError
    from marssim.serve.deployment import deployment_from_dict, deployment_to_dict, parse_pool

    pool = parse_pool("replicas=1,tp=1,capacity=guaranteed_no_evict")
    assert pool.scheduler.capacity == "guaranteed_no_evict" and parse_pool(pool.text()) == pool
    assert deployment_from_dict(deployment_to_dict(Deployment((pool,))), "f").pools == (pool,)
    assert "capacity" not in parse_pool("replicas=1,tp=1").text()  # the default is not written
    with pytest.raises(InputError, match="capacity.*max_utilization, guaranteed_no_evict"):
        parse_pool("replicas=1,tp=1,capacity=lots")


def test_multi_step_scheduling_makes_a_prompt_wait_for_the_block_under_way(model, system):
    """vLLM's multi-step scheduling (scheduler_steps=N): a decode-only iteration opens a block of N
    decode iterations, so a request arriving just after the first of them is prefilled when the
    N-th ends (with N=1, when the first ends); everything else as without it: every token, no
    preemption, and the same decode iterations of the running request before the arrival."""
    from marssim.serve import Requests

    first = run(model, system, [Pool(replicas=1, tp=1, scheduler=SchedulerConfig())],
                Requests.of(np.array([0.0]), np.array([64]), np.array([40])))
    it = first.iterations
    decode_ends = np.asarray(it["end"])[np.asarray(it["decode_tokens"]) > 0]
    arrive = float(decode_ends[0]) - 1e-9  # during the first decode iteration of the lone request
    two = Requests.of(np.array([0.0, arrive]), np.array([64, 64]), np.array([40, 40]))
    for steps in (1, 4, 7):
        r = run(model, system, [Pool(replicas=1, tp=1, scheduler=SchedulerConfig(scheduler_steps=steps))], two)
        it = r.iterations
        start, end = np.asarray(it["start"]), np.asarray(it["end"])
        prefill, decode = np.asarray(it["prefill_tokens"]), np.asarray(it["decode_tokens"])
        second = int(np.flatnonzero(prefill > 0)[1])  # the second request's prefill iteration
        decodes_before = int(((decode > 0) & (np.arange(len(start)) < second)).sum())
        assert decodes_before == steps  # the whole block of the first request's decodes
        assert start[second] == pytest.approx(end[second - 1], abs=1e-12)
        assert r.summary["completed"] == 2 and r.summary["preemptions"] == 0
        assert int(decode.sum()) + int((prefill > 0).sum()) == 80  # every output token once


def test_scheduler_steps_read_back_and_are_refused_where_vllm_has_no_multi_step():
    from marssim.errors import InputError
    from marssim.serve.deployment import parse_pool

    pool = parse_pool("replicas=1,tp=1,scheduler_steps=10")
    assert pool.scheduler.scheduler_steps == 10 and parse_pool(pool.text()) == pool
    assert "scheduler_steps" not in parse_pool("replicas=1,tp=1").text()
    for text in ("scheduler=chunked,scheduler_steps=4", "mixed=true,scheduler_steps=4",
                 "spec_method=mtp,spec_k=2,spec_alpha=0.7,scheduler_steps=4"):
        with pytest.raises(InputError, match="scheduler_steps.*multi-step"):
            parse_pool("replicas=1,tp=1," + text)
    with pytest.raises(InputError, match="scheduler_steps.*integer from 1 to 64"):
        parse_pool("replicas=1,tp=1,scheduler_steps=0")
