"""Speculative decoding in serving: the time of a lone request against the closed form summed from
the iteration model's own times (every proposal accepted, or none), the mean tokens per step
against ``(1 - alpha^(k+1)) / (1 - alpha)`` within four standard errors, conservation of tokens,
requests and blocks under load and preemption, the draft's memory, the settings' round trip and
the refused combinations."""

from __future__ import annotations

import math

import numpy as np
import pytest

from support import TINY_SERVING_LLAMA, RooflineCost, switched_four, write_switch_system

from marssim.errors import InputError
from marssim.serve import Deployment, Pool, Requests, SchedulerConfig, load_model, simulate_serving
from marssim.serve.deployment import deployment_from_dict, deployment_to_dict, parse_pool
from marssim.serve.simulate import iteration_model
from marssim.serve.speculative import draw_accepted, expected_tokens_per_step

MODEL = TINY_SERVING_LLAMA
DRAFT = "llama:layers=1,hidden=128,heads=4,kv_heads=2,ffn=256,vocab=2000"


@pytest.fixture(scope="module")
def model():
    return load_model(MODEL)


@pytest.fixture(scope="module")
def system():
    return switched_four()


def spec_cfg(method: str, k: int, alpha: float, **kw) -> SchedulerConfig:
    extra = {"spec_model": DRAFT} if method == "draft" else {}
    return SchedulerConfig(spec_method=method, spec_k=k, spec_alpha=alpha, **extra, **kw)


def lone(model, system, cfg: SchedulerConfig, prompt: int, output: int, tp: int = 2, seed: int = 0):
    req = Requests(np.array([0.0]), np.array([prompt]), np.array([output]), "one")
    dep = Deployment((Pool(replicas=1, tp=tp, scheduler=cfg),))
    return simulate_serving(dep, model, system, RooflineCost(), req, seed=seed)


def draft_model(model, method: str):
    from dataclasses import replace

    return load_model(DRAFT) if method == "draft" else replace(model, layers=1)


@pytest.mark.parametrize("method", ["draft", "mtp"])
@pytest.mark.parametrize("alpha", [1.0, 0.0])
def test_lone_request_tpot_is_the_closed_form(method, alpha, model, system):
    """One request alone, acceptance deterministic: each step is k draft passes of one token at
    contexts c+1..c+k, then the verification of k+1 tokens over c+k+1 keys; it emits k+1 tokens
    (alpha 1) or 1 (alpha 0), each gap the step's time over them; TTFT is the prompt's prefill by
    the model and by the draft."""
    k, prompt = 3, 40
    steps = 5
    emitted = k + 1 if alpha == 1.0 else 1
    output = 1 + steps * emitted
    r = lone(model, system, spec_cfg(method, k, alpha), prompt, output)
    stages = r.replicas[0].gpus
    target = iteration_model(model, system, stages, RooflineCost())
    draft = iteration_model(draft_model(model, method), system, stages, RooflineCost())
    cost = RooflineCost()
    assert target.cost is not cost  # the shared models are timed by an equal, separate roofline
    prefill = ((1, prompt), (1, prompt), ((1, prompt, prompt),), 0, 0, 1)
    ttft = target.stage_times(*prefill)[0] + draft.stage_times(*prefill)[0]
    gaps = []
    computed = prompt
    for _ in range(steps):
        step = sum(draft.stage_times((1, 1), (0, 0), (), 1, computed + 1 + j, 1)[0] for j in range(k))
        step += target.stage_times((1, k + 1), (1, k + 1), ((1, k + 1, computed + k + 1),), 0, 0, k + 1)[0]
        gaps += [step / emitted] * emitted
        computed += emitted
    pr = r.per_request
    assert pr["first_token_s"][0] - pr["arrival_s"][0] == pytest.approx(ttft, rel=1e-12)
    assert np.allclose(r.gaps, gaps, rtol=1e-12, atol=0)
    tpot = (pr["finish_s"][0] - pr["first_token_s"][0]) / (output - 1)
    assert tpot == pytest.approx(sum(gaps) / (output - 1), rel=1e-12)
    sp = r.summary["speculative"]
    assert sp["steps"] == steps and sp["tokens_per_step"] == emitted and sp["acceptance_rate"] == alpha
    assert 0 < sp["draft_share"] < 1 and sp["draft_share"] + sp["verify_share"] == pytest.approx(1.0)


def test_mean_tokens_per_step_matches_the_closed_form(model, system):
    """Many requests, alpha 0.7, k 4: the mean of (accepted + 1) over every sequence step is the
    truncated geometric mean sum_{j<=k} alpha^j, within four standard errors of that mean."""
    k, alpha = 4, 0.7
    rng = np.random.default_rng(3)
    n = 200
    req = Requests(np.sort(rng.uniform(0, 0.05, n)), rng.integers(20, 200, n), rng.integers(30, 120, n), "many")
    dep = Deployment((Pool(replicas=2, tp=2, scheduler=spec_cfg("mtp", k, alpha, max_num_seqs=64)),))
    r = simulate_serving(dep, model, system, RooflineCost(), req, seed=5)
    sp = r.summary["speculative"]
    mean = expected_tokens_per_step(k, alpha)
    assert mean == pytest.approx(sum(alpha ** j for j in range(k + 1)), rel=1e-12)
    # tokens per step T: P(T = t) = alpha^(t-1) (1 - alpha) for t <= k, P(T = k + 1) = alpha^k
    probs = [alpha ** (t - 1) * (1 - alpha) for t in range(1, k + 1)] + [alpha ** k]
    var = sum(p * t * t for t, p in zip(range(1, k + 2), probs)) - mean ** 2
    se = math.sqrt(var / sp["steps"])
    assert sp["steps"] > 3000
    assert abs(sp["tokens_per_step"] - mean) < 4 * se, (sp["tokens_per_step"], mean, se)
    assert sp["acceptance_rate"] == pytest.approx((sp["tokens_per_step"] - 1) / k, rel=1e-12)
    # the tokens emitted are the outputs' tokens, every one of them once
    assert sp["emitted_per_step"] * sp["steps"] == pytest.approx(float((req.output - 1).sum()), rel=1e-12)


def test_draw_accepted_is_a_truncated_geometric():
    rng = np.random.default_rng(0)
    k, alpha, n = 5, 0.6, 200_000
    a = draw_accepted(rng, n, k, alpha)
    assert a.min() >= 0 and a.max() <= k
    for j in range(1, k + 1):  # P(a >= j) = alpha^j, binomial standard error
        p = alpha ** j
        assert abs((a >= j).mean() - p) < 4 * math.sqrt(p * (1 - p) / n)
    assert (draw_accepted(rng, 7, k, 1.0) == k).all() and (draw_accepted(rng, 7, k, 0.0) == 0).all()


@pytest.mark.parametrize("sched", [{"max_batched_tokens": 2048}, {"kind": "chunked", "max_batched_tokens": 256},
                                   {"mixed": True, "max_batched_tokens": 2048},
                                   {"gpu_memory_utilization": 0.35, "max_batched_tokens": 2048, "preemption": "swap"},
                                   {"gpu_memory_utilization": 0.35, "max_batched_tokens": 2048}])
def test_every_token_request_and_block_accounted_under_load(sched, model, system):
    rng = np.random.default_rng(1)
    n = 150
    req = Requests(np.sort(rng.uniform(0, 0.02, n)), rng.integers(20, 500, n), rng.integers(2, 150, n), "load")
    dep = Deployment((Pool(replicas=2, tp=2, scheduler=spec_cfg("draft", 3, 0.6, **sched)),))
    r = simulate_serving(dep, model, system, RooflineCost(), req, seed=2)
    s = r.summary
    pr = r.per_request
    assert s["completed"] == n and s["rejected"] == 0
    assert len(r.gaps) == int((req.output - 1).sum())
    # the gaps of each request add up to its decoding time
    assert float(np.sum(r.gaps)) == pytest.approx(float(np.sum(pr["finish_s"] - pr["first_token_s"])), rel=1e-9)
    assert s["little"]["mean_in_system"] == pytest.approx(s["little"]["rate_x_latency"], rel=1e-9)
    it = r.iterations
    assert (it["kv_blocks"] <= it["kv_capacity"]).all() and (it["kv_blocks"] >= 0).all()
    if sched.get("gpu_memory_utilization"):
        assert s["preemptions"] > 0
    # the same seed, the same run
    again = simulate_serving(dep, model, system, RooflineCost(), req, seed=2)
    assert np.array_equal(again.per_request["finish_s"], pr["finish_s"])


def test_speculation_shortens_a_memory_bound_decode(model, system):
    """A lone request on a bandwidth-bound roofline: verifying k+1 tokens costs little more than
    one decode step, so with every proposal accepted TPOT falls."""
    plain = lone(model, system, SchedulerConfig(), 40, 41)
    fast = lone(model, system, spec_cfg("mtp", 3, 1.0), 40, 41)
    assert fast.summary["tpot_s"]["mean"] < plain.summary["tpot_s"]["mean"]


def test_the_draft_takes_its_weights_and_kv_cache_from_the_blocks(model, system):
    """Blocks = (usable - weights - workspace) // (block bytes), the draft's parameters (counted
    here from its dimensions) added to the weights and its per-token KV to the block."""
    plain = lone(model, system, SchedulerConfig(), 40, 2, tp=1).replicas[0].memory
    withd = lone(model, system, spec_cfg("draft", 2, 0.5), 40, 2, tp=1).replicas[0].memory
    d = load_model(DRAFT)
    h, f, v, dh = d.hidden, d.ffn_size, d.vocab, d.hidden // d.heads
    per_layer = h * d.heads * dh + 2 * h * d.kv * dh + d.heads * dh * h + 3 * h * f + 2 * h
    params = d.layers * per_layer + v * h + h + (0 if d.tie_embeddings else v * h)
    weights = params * 2  # bf16
    kv = d.layers * 2 * d.kv * dh * 2
    assert withd.weights[0] - plain.weights[0] == weights
    assert withd.kv_bytes_per_token[0] - plain.kv_bytes_per_token[0] == kv
    left = plain.usable - plain.weights[0] - weights - plain.workspace[0]
    assert withd.blocks == int(left // (16 * (plain.kv_bytes_per_token[0] + kv)))
    assert withd.blocks < plain.blocks


def test_settings_round_trip():
    pool = parse_pool("replicas=2,tp=2,spec_method=draft,spec_model=llama3-8b,spec_k=4,spec_alpha=0.7")
    cfg = pool.scheduler
    assert (cfg.spec_method, cfg.spec_model, cfg.spec_k, cfg.spec_alpha) == ("draft", "llama3-8b", 4, 0.7)
    assert parse_pool(pool.text()) == pool
    dep = Deployment((pool,))
    assert deployment_from_dict(deployment_to_dict(dep), "x.yaml") == dep
    byhand = parse_pool(f"replicas=1,spec_method=draft,spec_model={DRAFT},tp=2,spec_k=2,spec_alpha=0.5")
    assert byhand.scheduler.spec_model == DRAFT and byhand.tp == 2 and parse_pool(byhand.text()) == byhand
    mtp = parse_pool("replicas=1,spec_method=mtp,spec_layers=2,spec_k=2,spec_alpha=0")
    assert mtp.scheduler.spec_alpha == 0.0 and mtp.scheduler.lookahead == 2 and parse_pool(mtp.text()) == mtp


@pytest.mark.parametrize("text,key,message", [
    ("replicas=1,spec_k=4", "spec_k", "applies with spec_method"),
    ("replicas=1,spec_method=mtp,spec_alpha=0.7", "spec_k", "tokens proposed per step"),
    ("replicas=1,spec_method=mtp,spec_k=4", "spec_alpha", "acceptance probability"),
    ("replicas=1,spec_method=mtp,spec_k=4,spec_alpha=1.5", "spec_alpha", "from 0 to 1"),
    ("replicas=1,spec_method=draft,spec_k=4,spec_alpha=0.7", "spec_model", "expected the draft model"),
    ("replicas=1,spec_method=mtp,spec_model=llama3-8b,spec_k=4,spec_alpha=0.7", "spec_model", "spec_method=draft"),
    ("replicas=1,spec_method=eagle,spec_k=4", "spec_method", "expected one of none, draft, mtp"),
    ("replicas=1,role=prefill,spec_method=mtp,spec_k=4,spec_alpha=0.7", "spec_method", "prefill pool"),
    ("replicas=1,scheduler=static,spec_method=mtp,spec_k=4,spec_alpha=0.7", "spec_method", "scheduler=static"),
    ("replicas=1,pp=2,spec_method=mtp,spec_k=4,spec_alpha=0.7", "spec_method", "pp=1"),
])
def test_bad_settings_are_refused(text, key, message):
    with pytest.raises(InputError) as err:
        parse_pool(text)
    assert err.value.problems[0][0] == key and message in str(err.value)


def test_a_draft_of_another_vocabulary_is_refused(model, system):
    cfg = SchedulerConfig(spec_method="draft", spec_model="llama:layers=1,hidden=128,heads=4,kv_heads=2,vocab=3000", spec_k=2,
                          spec_alpha=0.5)
    with pytest.raises(InputError, match="vocabulary") as err:
        lone(model, system, cfg, 40, 4)
    assert err.value.problems[0][0] == "pools[0].spec_model"
    cfg = SchedulerConfig(spec_method="draft", spec_model="llama:layers=1,hidden=96,heads=3,kv_heads=3,vocab=2000", spec_k=2,
                          spec_alpha=0.5)
    with pytest.raises(InputError, match="the draft model") as err:
        lone(model, system, cfg, 40, 4, tp=2)
    assert err.value.problems[0][0] == "pools[0].spec_model"


def test_collectives_on_the_network_give_the_closed_form_alone(model, system):
    """A lone request on a switch of equal hops: the tensor-parallel collectives as flows take
    their closed form, speculative steps included."""
    req = Requests(np.array([0.0]), np.array([40]), np.array([17]), "one")
    cfg = spec_cfg("draft", 3, 1.0)
    ends = []
    for comm in ("closed", "network"):
        dep = Deployment((Pool(replicas=1, tp=2, scheduler=cfg),), tp_comm=comm)
        ends.append(simulate_serving(dep, model, system, RooflineCost(), req).per_request["finish_s"][0])
    assert ends[1] == pytest.approx(ends[0], rel=1e-9)


CLI_MODEL = "llama:layers=2,hidden=256,heads=4,ffn=512,kv_heads=4,vocab=1000"
def test_the_command_line_runs_reports_and_refuses(tmp_path, capsys):
    """A deployment file with a draft model (its spec's commas in YAML), the report's line and
    summary, the launch flags; a bad combination is one line and exit 2, nothing written."""
    import json

    import yaml

    from marssim.cli import main

    system = write_switch_system(tmp_path)
    pool = {"replicas": 1, "tp": 2, "spec_method": "draft", "spec_k": 3, "spec_alpha": 0.75,
            "spec_model": "llama:layers=1,hidden=128,heads=2,ffn=256,kv_heads=2,vocab=1000"}
    dep = {"model": CLI_MODEL, "system": str(system), "pools": [pool],
           "requests": {"arrival": "poisson:rate=50", "prompt": "uniform:20-200", "output": 40, "count": 30}}
    path = tmp_path / "dep.yaml"
    path.write_text(yaml.safe_dump(dep))
    out = tmp_path / "run"
    assert main(["serve", "--deployment", str(path), "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "tokens per step on average" in text and "--speculative-config" in text
    summary = json.loads((out / "summary.json").read_text())
    sp = summary["speculative"]
    assert sp["steps"] > 0 and sp["proposed"] == 3 * sp["steps"]
    assert sp["emitted_per_step"] * sp["steps"] == 30 * 39
    bad = tmp_path / "bad"
    assert main(["serve", "--system", str(system), "--model", CLI_MODEL, "--pool",
                 "replicas=1,spec_method=draft,spec_model=llama3-8b,spec_k=2,spec_alpha=0.5", "--rate", "2",
                 "--prompt", "9", "--output", "4", "--out", str(bad)]) == 2
    err = capsys.readouterr().err
    assert "spec_model" in err and "vocabulary" in err and len(err.strip().splitlines()) == 1, err
    assert not bad.exists()


def test_a_decode_pool_decodes_speculatively_behind_a_prefill_pool(model, system):
    rng = np.random.default_rng(4)
    n = 100
    req = Requests(np.sort(rng.uniform(0, 0.02, n)), rng.integers(20, 500, n), rng.integers(2, 150, n), "pd")
    dep = Deployment((Pool(replicas=1, tp=1, role="prefill", scheduler=SchedulerConfig(kind="chunked",
                                                                                       max_batched_tokens=512)),
                      Pool(replicas=1, tp=2, role="decode", scheduler=spec_cfg("mtp", 2, 0.8))))
    r = simulate_serving(dep, model, system, RooflineCost(), req)
    s = r.summary
    assert s["completed"] == n and len(r.gaps) == int((req.output - 1).sum())
    assert s["little"]["mean_in_system"] == pytest.approx(s["little"]["rate_x_latency"], rel=1e-9)
    assert s["speculative"]["emitted_per_step"] * s["speculative"]["steps"] == pytest.approx(
        float((req.output - 1).sum()), rel=1e-12)
