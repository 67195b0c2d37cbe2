"""The three ways a serving benchmark sends requests: open loop (arrivals at their times), offline
(every request at time 0, the engines' ``throughput`` benchmarks) and a closed loop of N users
(``--concurrency N``, the engines' serving benchmarks at a fixed concurrency). Checked by what must
hold: one user sees each request alone; many users keep the engine as busy as an offline batch;
N users keep exactly N requests in the system; the benchmark figures add up from the requests."""

from __future__ import annotations

import json

import numpy as np
import pytest
import yaml

from support import TINY_SERVING_LLAMA, RooflineCost, switched_four, write_switch_system

from marssim.cli import main
from marssim.errors import InputError
from marssim.serve import (Arrivals, Deployment, Lengths, Pool, Requests, RequestSpec, SchedulerConfig, load_model,
                           parse_arrivals, simulate_serving)
from marssim.serve.requests import closed_loop
from marssim.serve.simulate import simulate_spec

MODEL = TINY_SERVING_LLAMA
ENGINE = SchedulerConfig(max_num_seqs=32, max_batched_tokens=2048)


@pytest.fixture(scope="module")
def model():
    return load_model(MODEL)


@pytest.fixture(scope="module")
def system():
    return switched_four()


def spec(arrivals: Arrivals, n: int) -> RequestSpec:
    return RequestSpec(arrivals, Lengths("uniform", low=20, high=600), Lengths("uniform", low=2, high=120), n)


def run(model, system, arrivals, n, replicas=1, router="least_tokens"):
    dep = Deployment((Pool(replicas=replicas, tp=1, scheduler=ENGINE),), router=router)
    return simulate_serving(dep, model, system, RooflineCost(), spec(arrivals, n).draw(0), seed=0)


def in_system_integral(result, until: float) -> float:
    """Request-seconds spent in the system over [0, until], from the per-request table alone."""
    pr = result.per_request
    stay = np.minimum(pr["finish_s"], until) - pr["arrival_s"]
    return float(np.clip(stay, 0.0, None).sum())


def test_one_user_sees_every_request_alone(model, system):
    result = run(model, system, closed_loop(1), 12)
    pr = result.per_request
    e2e = pr["finish_s"] - pr["arrival_s"]
    # each request is sent the instant the previous one ends ...
    assert pr["arrival_s"][0] == 0.0
    np.testing.assert_array_equal(pr["arrival_s"][1:], pr["finish_s"][:-1])
    # ... so the latencies add up to the run
    assert e2e.sum() == pytest.approx(pr["finish_s"][-1], rel=1e-12)
    # and each one is the latency of that request served alone on an idle replica
    dep = Deployment((Pool(replicas=1, tp=1, scheduler=ENGINE),))
    for i in range(len(e2e)):
        alone = simulate_serving(dep, model, system, RooflineCost(),
                                 Requests.of([0.0], [pr["prompt_tokens"][i]], [pr["output_tokens"][i]]))
        assert e2e[i] == pytest.approx(alone.per_request["finish_s"][0], rel=1e-12)
        assert pr["first_token_s"][i] - pr["arrival_s"][i] == pytest.approx(alone.per_request["first_token_s"][0],
                                                                             rel=1e-12)


@pytest.mark.parametrize("replicas,router,users", [(1, "least_tokens", 96), (2, "round_robin", 160)])
def test_many_users_give_the_offline_throughput_exactly(model, system, replicas, router, users):
    """With more users than an engine can run and admit at once (32 sequences here), every engine
    always has requests waiting; the engine admits the head of its queue, the same requests in
    the same order as offline (where the router's choice does not depend on time, as with one
    replica or round robin), so the batches, and the throughput, are identical."""
    offline = run(model, system, Arrivals("offline"), 400, replicas, router)
    closed = run(model, system, closed_loop(users), 400, replicas, router)
    for key in ("output_tokens_per_s", "throughput_rps", "total_tokens_per_s"):
        assert closed.summary[key] == pytest.approx(offline.summary[key], rel=1e-12)
    assert closed.summary["iterations"] == offline.summary["iterations"]


def test_many_users_behind_a_load_balancing_router_give_the_offline_throughput_within_1_percent(model, system):
    """Behind the least-tokens router a user's request is routed when it is sent, on the loads of
    that moment, where offline every request is routed at time 0; the replicas' shares of the
    requests differ a little, and so does the last replica to finish (measured: 0.15 %)."""
    offline = run(model, system, Arrivals("offline"), 400, 2)
    closed = run(model, system, closed_loop(128), 400, 2)
    assert closed.summary["output_tokens_per_s"] == pytest.approx(offline.summary["output_tokens_per_s"], rel=0.01)


def test_as_many_users_as_requests_is_the_offline_run(model, system):
    offline = run(model, system, Arrivals("offline"), 200, 2)
    closed = run(model, system, closed_loop(200), 200, 2)
    np.testing.assert_array_equal(closed.per_request["finish_s"], offline.per_request["finish_s"])


@pytest.mark.parametrize("users", [3, 40])
def test_n_users_keep_exactly_n_requests_in_the_system(model, system, users):
    result = run(model, system, closed_loop(users), 300, 2)
    last_sent = float(result.per_request["arrival_s"][-1])
    assert last_sent > 0
    # Little's law with N in the system: until the last request is sent, N requests are always in
    assert in_system_integral(result, last_sent) == pytest.approx(users * last_sent, rel=1e-9)
    little = result.summary["little"]
    assert little["mean_in_system"] == pytest.approx(little["rate_x_latency"], rel=1e-9)
    assert little["mean_in_system"] <= users
    assert result.summary["concurrency"] == users


def test_n_users_of_disaggregated_pools_keep_n_requests_in_the_system(model, system):
    """A request ends on a decode replica after its KV cache moved there: its user learns of it
    there, and the next request starts at the prefill pool."""
    dep = Deployment((Pool(replicas=1, tp=1, role="prefill", scheduler=SchedulerConfig(kind="chunked",
                                                                                        max_batched_tokens=512)),
                      Pool(replicas=1, tp=2, role="decode"), Pool(replicas=1, tp=1, role="decode")))
    result = simulate_serving(dep, model, system, RooflineCost(), spec(closed_loop(10), 200).draw(0), seed=0)
    last_sent = float(result.per_request["arrival_s"][-1])
    assert result.summary["completed"] == 200 and result.summary["kv_transfer_s"]["count"] == 200
    assert in_system_integral(result, last_sent) == pytest.approx(10 * last_sent, rel=1e-9)


def test_a_duration_keeps_every_user_busy_until_it_ends(model, system):
    loop = closed_loop(6, duration=0.02)
    result = simulate_spec(Deployment((Pool(replicas=2, tp=1, scheduler=ENGINE),)), model, system, RooflineCost(),
                           spec(loop, 8), seed=0)
    pr = result.per_request
    assert len(pr["arrival_s"]) > 8  # the count was a cap, grown as the users needed
    assert (pr["arrival_s"] < 0.02).all() and pr["finish_s"].max() >= 0.02
    assert in_system_integral(result, 0.02) == pytest.approx(6 * 0.02, rel=1e-9)
    # the grown count is the run's: the same stream with that many requests from the start
    cap = int(result.requests.source.split()[0])
    assert cap > 8
    again = simulate_serving(Deployment((Pool(replicas=2, tp=1, scheduler=ENGINE),)), model, system, RooflineCost(),
                             spec(loop, cap).draw(0), seed=0)
    np.testing.assert_array_equal(again.per_request["finish_s"], pr["finish_s"])


def test_token_throughputs_and_per_user_speed_add_up_from_the_requests(model, system):
    result = run(model, system, closed_loop(16), 120, 2)
    pr, s = result.per_request, result.summary
    span = pr["finish_s"].max() - pr["arrival_s"].min()
    assert s["input_tokens_per_s"] == pytest.approx(pr["prompt_tokens"].sum() / span, rel=1e-12)
    assert s["total_tokens_per_s"] == pytest.approx((pr["prompt_tokens"] + pr["output_tokens"]).sum() / span,
                                                    rel=1e-12)
    many = pr["output_tokens"] > 1
    speed = (pr["output_tokens"][many] - 1) / (pr["finish_s"][many] - pr["first_token_s"][many])
    assert s["user_tokens_per_s"]["mean"] == pytest.approx(speed.mean(), rel=1e-12)
    assert s["user_tokens_per_s"]["p50"] == pytest.approx(np.median(speed), rel=1e-12)


def test_closed_loop_specs_are_checked():
    assert parse_arrivals("closed:concurrency=8,duration=60") == closed_loop(8, 60.0)
    assert closed_loop(8, 60.0).text() == "closed:concurrency=8,duration=60"
    for text, key in (("closed", "arrival.concurrency"), ("closed:concurrency=0", "arrival.concurrency"),
                      ("closed:concurrency=2.5", "arrival.concurrency"),
                      ("closed:concurrency=4,rate=2", "arrival.rate"),
                      ("closed:concurrency=4,duration=-1", "arrival.duration")):
        with pytest.raises(InputError) as err:
            parse_arrivals(text)
        assert key in str(err.value)
    with pytest.raises(InputError, match="closed loop"):
        spec(closed_loop(4), 10).with_rate(3.0)


# ---------------------------------------------------------------------- the command line
CLI_MODEL = "llama:layers=2,hidden=256,heads=4,ffn=512,kv_heads=4,vocab=1000"


@pytest.fixture(scope="module")
def quad(tmp_path_factory) -> str:
    return write_switch_system(tmp_path_factory.mktemp("sys"))


def test_concurrency_from_the_command_line_and_a_deployment_file(quad, tmp_path, capsys):
    base = ["serve", "--system", quad, "--model", CLI_MODEL, "--pool", "replicas=2", "--prompt", "uniform:20-200",
            "--output", "uniform:2-40", "--requests", "60"]
    assert main([*base, "--concurrency", "4", "--out", str(tmp_path / "a")]) == 0
    text = capsys.readouterr().out
    assert "closed loop of 4 concurrent users" in text and "per user" in text and "total" in text
    summary = json.loads((tmp_path / "a" / "summary.json").read_text())
    assert summary["concurrency"] == 4 and summary["completed"] == 60
    dep = tmp_path / "dep.yaml"
    dep.write_text(yaml.safe_dump({"pools": [{"replicas": 2}], "requests": {
        "concurrency": 4, "prompt": "uniform:20-200", "output": "uniform:2-40", "count": 60}}))
    assert main(["serve", "--system", quad, "--model", CLI_MODEL, "--deployment", str(dep),
                 "--out", str(tmp_path / "b")]) == 0
    assert json.loads((tmp_path / "b" / "summary.json").read_text()) == summary
    assert main([*base, "--arrival", "offline"]) == 0
    assert "offline: all 60 requests at time 0" in capsys.readouterr().out


@pytest.mark.parametrize("extra,message", [
    (["--duration", "5"], "--duration: a duration bounds a closed loop; give --concurrency N too"),
    (["--concurrency", "4", "--rate", "3"], "--rate: a closed loop"),
    (["--concurrency", "4", "--arrival", "poisson:rate=3"], "--arrival: a closed loop"),
    (["--concurrency", "4", "--rates", "1,2"], "--rates: a closed loop's users set the rate"),
])
def test_bad_closed_loop_flags_are_one_line_and_exit_2(quad, extra, message, tmp_path, capsys):
    out = tmp_path / "o"
    assert main(["serve", "--system", quad, "--model", CLI_MODEL, "--pool", "replicas=1", "--prompt", "9",
                 "--output", "4", "--out", str(out), *extra]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1, err
    assert not out.exists()
