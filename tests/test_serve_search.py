"""The search over serving deployments: the GA against its grid and against an exhaustive search of
a small space, the constraints on its answer, the goodput's bracket, the same search on one or two
processes, the closed-form screen ranking deployments as their simulations do, and the pieces in
closed form (Erlang's C, constraint ratios, costs, deployment files).

A transparent roofline cost model and four or eight small accelerators keep every simulation
to a fraction of a second (the CLI, the files it writes and their re-simulation are
tests/test_serve_search_cli.py)."""

from __future__ import annotations

import math
from concurrent.futures import ProcessPoolExecutor
from dataclasses import replace

import pytest
from scipy.stats import spearmanr

from support import RooflineCost, make_system

from marssim.errors import InputError
from marssim.search.evaluate import Evaluator
from marssim.search.serve import (ServeSearchSettings, ServeSpace, all_deployments, level1_deployments, mars_serve,
                                  serve_exhaustive, serve_grid_search, serve_problem, uniform_grid)
from marssim.serve import Arrivals, Deployment, Lengths, Pool, RequestSpec, SchedulerConfig, load_model
from marssim.serve.case import ServeCase, evaluate_case, highest_rate, simulate_case
from marssim.serve.deployment import deployment_from_dict, deployment_to_dict
from marssim.serve.screen import StreamStats, erlang_c, screen_deployment
from marssim.serve.slo import Constraints, cost_per_million_tokens, dollars_per_hour, parse_constraints, parse_prices

MODEL = "llama:layers=4,hidden=256,heads=8,kv_heads=4,ffn=768,vocab=2000"
SLO = "ttft_p99=15ms,tbt_p99=3ms"
# one level-2 choice: the space is its 18 level-1 deployments on four accelerators
SMALL = dict(schedulers=("chunked",), max_num_seqs=(64,), max_batched_tokens=(512,), block_sizes=(16,), max_pp=1,
             population=6, generations=10, patience=10, grid_simulate=1)


@pytest.fixture(scope="module")
def model():
    return load_model(MODEL)


@pytest.fixture(scope="module")
def quad():
    return make_system(4, topology="switch", capacity="64 MiB", bandwidth="50 GB/s", latency="1 us")


@pytest.fixture(scope="module")
def octo():
    return make_system(8, topology="switch", capacity="64 MiB", bandwidth="50 GB/s", latency="1 us")


def stream(rate: float, n: int = 200) -> RequestSpec:
    return RequestSpec(Arrivals("poisson", rate=rate), Lengths("uniform", low=20, high=600),
                       Lengths("uniform", low=2, high=120), n)


def case_of(model, rate=250.0, slo=SLO, goodput=False, n=150, prices=()) -> ServeCase:
    return ServeCase(model, stream(rate, n), 0, parse_constraints(slo), prices, goodput=goodput)


# ----------------------------------------------------------------------------- the GA
def test_the_ga_never_returns_worse_than_the_grid_it_is_seeded_with(model, octo):
    case = case_of(model, rate=400.0)
    settings = ServeSearchSettings(objective="gpus", generations=3, max_simulations=8, population=6, max_pp=1,
                                   max_num_seqs=(64, 256), max_batched_tokens=(512, 2048), block_sizes=(16,))
    grid = serve_grid_search(case, octo, RooflineCost(), settings)
    seeds = [c.plan for c in grid.top(2) if c.simulated is not None]
    ga = mars_serve(case, octo, RooflineCost(), replace(settings, seed_with_grid=False), seeds=seeds)
    assert math.isfinite(grid.fitness)
    assert ga.fitness <= grid.fitness
    # the grid's deployments are uniform: one pool of one kind
    assert all(len(d.pools) == 1 and d.pools[0].role == "both" for d in uniform_grid(ServeSpace.of(case, octo,
                                                                                                  settings)))


@pytest.fixture(scope="module")
def exhaustive(model, quad):
    case = case_of(model)
    settings = ServeSearchSettings(objective="gpus", max_simulations=12, seed_with_grid=False, **SMALL)
    space = ServeSpace.of(case, quad, settings)
    assert len(list(all_deployments(space))) == len(list(level1_deployments(space))) == 18
    return case, settings, serve_exhaustive(case, quad, RooflineCost(), settings)


@pytest.mark.parametrize("seed", [0, 1])
def test_the_ga_finds_the_exhaustive_optimum_of_a_small_space(exhaustive, quad, seed):
    case, settings, best = exhaustive
    ga = mars_serve(case, quad, RooflineCost(), replace(settings, seed=seed))
    assert best.simulations == 18 and ga.simulations <= 12
    assert ga.fitness == best.fitness and ga.best == best.best
    # the optimum is not the whole system: fewer GPUs than there are serve the load
    assert best.evaluation.gpus < 4


def test_the_answer_meets_the_constraints_and_a_too_tight_slo_is_one_error(model, octo):
    settings = ServeSearchSettings(objective="gpus", generations=2, max_simulations=6, population=4, max_pp=1,
                                   max_num_seqs=(64, 256), max_batched_tokens=(512, 2048), block_sizes=(16,))
    result = mars_serve(case_of(model, rate=400.0), octo, RooflineCost(), settings)
    e = result.evaluation
    assert e.latency["ttft_p99"] <= 0.015 and e.latency["tbt_p99"] <= 0.003 and e.slo_met
    # every candidate the search ranks met them too
    assert all(c.evaluation.slo_met for c in result.top(10))
    with pytest.raises(InputError) as err:
        mars_serve(case_of(model, rate=400.0, slo="ttft_p99=1us"), octo, RooflineCost(), settings)
    text = str(err.value)
    assert "no deployment meets TTFT P99 <= 0.001 ms" in text and "the closest" in text and "\n" not in text


def test_the_goodput_is_the_highest_rate_meeting_the_constraints(model, quad):
    case = case_of(model, goodput=True, n=120)
    dep = Deployment((Pool(replicas=2, tp=2, scheduler=SchedulerConfig(kind="chunked", max_batched_tokens=512)),))
    run = evaluate_case(dep, case, quad, RooflineCost())
    assert run.goodput > 0 and run.rate == run.goodput and run.ratio <= 1
    # the bracket: the next rate tried above it missed them, within the tolerance
    assert run.goodput < run.ceiling <= run.goodput * (1 + case.tolerance) * (1 + 1e-3)
    above = simulate_case(dep, case, quad, RooflineCost(), run.ceiling).summary
    assert not case.constraints.met(above)
    assert simulate_case(dep, case, quad, RooflineCost(), run.goodput).summary == run.summary


def test_a_watched_run_stops_only_when_a_bound_is_certainly_missed(model, quad):
    """Stopping a run early changes nothing but its length: it stops exactly when the run to its
    end misses a bound, and a run that meets them is the same run."""
    from marssim.serve.metrics import ConstraintsMissed

    deps = [Deployment((Pool(replicas=r, tp=tp, scheduler=SchedulerConfig(kind="chunked", max_batched_tokens=512)),))
            for r, tp in ((1, 1), (2, 1), (2, 2))]
    outcomes = set()
    for dep in deps:
        for slo in ("ttft_p99=15ms", "tbt_p99=3ms", "e2e_p90=200ms,queue_p50=1ms", "ttft_max=20ms,tpot_p99=2ms"):
            case = case_of(model, slo=slo, n=100)
            full = simulate_case(dep, case, quad, RooflineCost()).summary
            met = case.constraints.met(full)
            try:
                watched = simulate_case(dep, case, quad, RooflineCost(), watch=True).summary
            except ConstraintsMissed:
                assert not met, (dep.text(), slo)
                outcomes.add("stopped")
            else:
                assert met and watched == full, (dep.text(), slo)
                outcomes.add("met")
    assert outcomes == {"stopped", "met"}


def test_a_burst_too_short_for_a_steady_state_does_not_meet_the_constraints(model, quad):
    """40 requests arriving within a few milliseconds meet generous bounds, but they arrive over
    less than 4 times their mean end-to-end latency: a system filling up, not a steady state."""
    dep = Deployment((Pool(replicas=1, tp=1, scheduler=SchedulerConfig(kind="chunked", max_batched_tokens=512)),))
    case = case_of(model, rate=20000.0, slo="ttft_p99=10s,tbt_p99=1s", n=40)
    run = evaluate_case(dep, case, quad, RooflineCost())
    arrival = case.requests().arrival
    span = arrival[-1] - arrival[0]
    assert case.constraints.ratio(run.summary) <= 1  # the bounds themselves hold
    assert run.ratio == pytest.approx(4.0 * run.summary["e2e_s"]["mean"] / span, rel=1e-12) and run.ratio > 1
    assert any("not a steady state" in v for v in case.violations(run.summary))
    assert evaluate_case(dep, replace(case, settle=0.0), quad, RooflineCost()).ratio <= 1


@pytest.mark.parametrize("threshold", [0.37, 37.3, 5123.0])
def test_highest_rate_brackets_a_threshold(threshold):
    calls = []

    def meets(rate):
        calls.append(rate)
        return rate <= threshold

    for start in (threshold / 7, threshold * 1.9):
        calls.clear()
        found = highest_rate(meets, start, tolerance=0.02)
        assert threshold / 1.02 / 1.0005 <= found <= threshold
        assert len(calls) <= 12
    # more than 1.95 times below the start: given up on (goodput 0) after three runs
    calls.clear()
    assert highest_rate(meets, threshold * 2.1) == 0.0 and len(calls) == 3
    assert highest_rate(lambda r: False, 10.0) == 0.0


def test_the_same_seed_gives_the_same_search_on_one_or_two_workers(model, quad):
    case = case_of(model)
    settings = ServeSearchSettings(objective="gpus", max_simulations=6, seed=3, **{**SMALL, "generations": 3})
    one = mars_serve(case, quad, RooflineCost(), settings)
    with ProcessPoolExecutor(2) as pool:
        two = mars_serve(case, quad, RooflineCost(), settings, executor=pool)
    assert one.best == two.best and one.fitness == two.fitness
    assert one.evaluation.latency == two.evaluation.latency and one.evaluation.rate == two.evaluation.rate
    assert list(one.history["best_fitness"]) == list(two.history["best_fitness"])
    assert [c.plan for c in one.candidates] == [c.plan for c in two.candidates]


# ----------------------------------------------------------------------------- the screen
def test_the_screen_ranks_deployments_as_their_simulations_do(model, octo):
    case = case_of(model, rate=300.0, n=200)
    chunked = SchedulerConfig(kind="chunked", max_batched_tokens=256)
    plain = SchedulerConfig(max_batched_tokens=1024)
    deps = [Deployment((Pool(replicas=r, tp=tp, scheduler=s),)) for r, tp in ((2, 1), (4, 1), (8, 1), (1, 2),
                                                                              (2, 2), (4, 2), (1, 4), (2, 4))
            for s in (chunked, plain)]
    deps += [Deployment((Pool(replicas=2, tp=1, role="prefill"), Pool(replicas=4, tp=1, role="decode"))),
             Deployment((Pool(replicas=1, tp=2, role="prefill"), Pool(replicas=2, tp=2, role="decode")))]
    screened = Evaluator(serve_problem(case, octo, RooflineCost())).estimate(deps)
    simulated = [simulate_case(d, case, octo, RooflineCost()).summary for d in deps]  # to their ends
    for key in ("ttft", "tbt"):
        rho = spearmanr([e.latency[f"{key}_p99"] for e in screened], [s[f"{key}_s"]["p99"] for s in simulated]).statistic
        assert rho > 0.75, (key, rho)
    # capacity: the screen's against the throughput each sustains under twice its load
    over = case_of(model, rate=3000.0, n=200)
    caps = [screen_deployment(d, model, octo, RooflineCost(), over.stats(), 3000.0).capacity_rps for d in deps[:8]]
    served = [simulate_case(d, over, octo, RooflineCost()).summary["throughput_rps"] for d in deps[:8]]
    assert spearmanr(caps, served).statistic > 0.9
    for c, s in zip(caps, served):
        assert 0.8 < c / s < 1.25


def test_a_deployment_that_cannot_hold_a_kv_cache_is_screened_infeasible(model):
    tiny = make_system(4, topology="switch", capacity="2 MiB", bandwidth="50 GB/s", latency="1 us")
    case = case_of(model)
    ev = Evaluator(serve_problem(case, tiny, RooflineCost()))
    e = ev.estimate([Deployment((Pool(replicas=1, tp=1),))])[0]
    assert not e.feasible and "KV cache" in e.error and math.isinf(e.fitness("gpus"))


# ----------------------------------------------------------------------------- closed forms
def test_erlang_c_against_its_closed_forms():
    for rho in (0.1, 0.5, 0.9):
        assert erlang_c(1, rho) == pytest.approx(rho, rel=1e-12)  # M/M/1: P(wait) = rho
        assert erlang_c(2, rho) == pytest.approx(2 * rho * rho / (1 + rho), rel=1e-12)
    assert erlang_c(64, 0.5) < 1e-6 and erlang_c(3, 1.0) == 1.0


def test_constraints_parse_and_rank_a_summary():
    c = parse_constraints("ttft_p99=2s,tbt_p99=100ms,e2e_mean=30s")
    summary = {"completed": 10, "rejected": 0, "ttft_s": {"p99": 1.0}, "tbt_s": {"p99": 0.15}, "e2e_s": {"mean": 3.0}}
    assert c.ratio(summary) == pytest.approx(1.5) and not c.met(summary)
    assert c.violations(summary) == ["TBT P99 <= 100 ms: 150 ms"]
    assert c.ratio({**summary, "rejected": 1}) == math.inf
    assert c.request_slo().ttft == 2.0 and c.request_slo().e2e == 30.0 and c.request_slo().tpot is None
    for bad, hint in (("ttft=2s", "ttft_p99"), ("ttft_p99=fast", "--slo.ttft_p99"), ("foo_p99=1s", "METRIC_STAT")):
        with pytest.raises(InputError, match=hint):
            parse_constraints(bad)
    assert Constraints().ratio(summary) == 0.0


def test_cost_per_million_tokens_in_closed_form():
    prices = parse_prices(["h100=2.5", "a100=1.2"], {"h100", "a100"})
    per_hour = dollars_per_hour({"h100": 8, "a100": 4}, prices)
    assert per_hour == pytest.approx(8 * 2.5 + 4 * 1.2)
    assert cost_per_million_tokens(per_hour, 1000.0) == pytest.approx(per_hour / 3.6)
    assert math.isnan(dollars_per_hour({"b200": 1}, prices))
    with pytest.raises(InputError, match="b200"):
        parse_prices("b200=9", {"h100"})


def test_a_deployment_file_reads_back_to_the_same_deployment():
    deps = [Deployment((Pool(replicas=3, tp=2, pp=2, gpu="h100",
                             scheduler=SchedulerConfig(kind="chunked", max_batched_tokens=2048, block_size=32)),),
                       context_bucket=16),
            Deployment((Pool(replicas=1, tp=4, role="prefill", scheduler=SchedulerConfig(mixed=True)),
                        Pool(replicas=5, tp=1, role="decode", scheduler=SchedulerConfig(preemption="swap",
                                                                                        swap_space=3 * 2**30))),
                       router="round_robin")]
    for dep in deps:
        assert deployment_from_dict(deployment_to_dict(dep), "f") == dep


def test_the_stream_statistics_the_screen_reads(model):
    requests = stream(100.0, 400).draw(0)
    stats = StreamStats.of(requests)
    steps = requests.output - 1
    assert stats.decode_mean == pytest.approx(steps.mean())
    expected = float((steps * (requests.prompt + requests.output / 2)).sum() / steps.sum())
    assert stats.decode_context == pytest.approx(expected)
    assert stats.prompts_above(int(requests.prompt.max())) == 0
    assert stats.longer_than(0) == len(requests)


def test_a_mixed_cluster_prices_each_pool_by_its_kind(model):
    designs = {"fast": {"dataflow": "os", "pe_rows": 32, "pe_cols": 32, "clock": "1 GHz", "sram": "4 MiB",
                        "sram_bandwidth": "400 GB/s"},
               "slow": {"dataflow": "os", "pe_rows": 16, "pe_cols": 16, "clock": "1 GHz", "sram": "4 MiB",
                        "sram_bandwidth": "200 GB/s"}}
    from marssim.system import system_from_dict

    system = system_from_dict({
        "name": "mixed", "designs": designs,
        "accelerators": [{"id": "acc[0-1]", "designs": ["fast"], "memory": {"capacity": "64 MiB",
                                                                           "bandwidth": "10 TB/s"}},
                         {"id": "acc[2-5]", "designs": ["slow"], "memory": {"capacity": "64 MiB",
                                                                           "bandwidth": "10 TB/s"}}],
        "hosts": [{"id": "host0", "dram": {"capacity": "1 TiB", "bandwidth": "1 TB/s"}}],
        "switches": [{"id": "sw0", "latency": "0 s"}],
        "links": [{"pattern": "star", "hub": "sw0", "nodes": "acc[0-5]", "bandwidth": "50 GB/s", "latency": "1 us"},
                  {"between": ["host0", "sw0"], "bandwidth": "32 GB/s", "latency": "1 us"}]}, "<mixed>")
    case = case_of(model, rate=150.0, slo="ttft_p99=40ms,tbt_p99=5ms", prices=(("fast", 4.0), ("slow", 1.0)))
    settings = ServeSearchSettings(objective="cost", **{**SMALL, "max_simulations": 10, "generations": 4})
    space = ServeSpace.of(case, system, settings)
    assert space.kinds == ("fast", "slow") and space.available == {"fast": 2, "slow": 4}
    # every level-1 deployment fits each kind's GPUs; some use both kinds
    deps = list(level1_deployments(space))
    assert deps and all(space.fits(d.pools) for d in deps)
    assert any(len({p.gpu for p in d.pools}) == 2 for d in deps)
    result = mars_serve(case, system, RooflineCost(), settings)
    e = result.evaluation
    kinds = {p.gpu: 0 for p in result.best.pools}
    for p in result.best.pools:
        kinds[p.gpu] += p.gpus
    per_hour = 4.0 * kinds.get("fast", 0) + 1.0 * kinds.get("slow", 0)
    assert e.cost_per_mtok == pytest.approx(per_hour / (e.throughput * 3600) * 1e6, rel=1e-12)
    assert e.slo_met
