"""What a serving run's outputs say about themselves: swap transfers carry the request they move,
directories print with one separator, byte sizes print as a person writes them (and read back)."""

from __future__ import annotations

import numpy as np
import pytest

from support import RooflineCost, make_system, write_switch_system

from marssim.cli import main
from marssim.serve import Arrivals, Deployment, Lengths, Pool, RequestSpec, SchedulerConfig, load_model, parse_pool
from marssim.serve.deployment import deployment_from_dict, deployment_to_dict
from marssim.serve.fabric import TRANSFER_KINDS

MODEL = "llama:layers=4,hidden=256,heads=8,kv_heads=4,ffn=768,vocab=2000"


def test_swap_transfers_carry_the_request_they_move():
    from marssim.serve import simulate_serving

    model = load_model(MODEL)
    system = make_system(4, topology="switch", capacity="64 MiB", bandwidth="50 GB/s", latency="1 us")
    requests = RequestSpec(Arrivals("poisson", rate=2000.0), Lengths("uniform", low=20, high=600),
                           Lengths("uniform", low=2, high=120), 300).draw(0)
    dep = Deployment((Pool(replicas=2, tp=1, scheduler=SchedulerConfig(gpu_memory_utilization=0.5, preemption="swap",
                                                                        max_batched_tokens=2048)),))
    result = simulate_serving(dep, model, system, RooflineCost(), requests, seed=0)
    tr = result.transfers
    kind = np.asarray(tr["kind"]).astype(int)
    out = kind == TRANSFER_KINDS.index("swap_out")
    back = kind == TRANSFER_KINDS.index("swap_in")
    assert out.sum() > 1 and back.sum() > 1
    request = np.asarray(tr["request"]).astype(int)
    assert (request[out | back] >= 0).all()
    preempted = set(np.flatnonzero(result.per_request["preemptions"] > 0).tolist())
    assert set(request[out].tolist()) <= preempted
    for r in set(request[out].tolist()):
        # every request swapped out came back with the same blocks (all requests finish)
        sent = float(np.asarray(tr["bytes"])[out & (request == r)].sum())
        returned = float(np.asarray(tr["bytes"])[back & (request == r)].sum())
        assert sent == returned > 0
        assert (out & (request == r)).sum() <= result.per_request["preemptions"][r]


def test_swap_space_prints_in_binary_units_and_reads_back():
    pool = parse_pool("replicas=2,preemption=swap,swap_space=16GiB", "--pool")
    assert "swap_space=16GiB" in pool.text() and "17179869184" not in pool.text()
    assert parse_pool(pool.text(), "--pool") == pool
    dep = Deployment((pool,))
    assert deployment_to_dict(dep)["pools"][0]["swap_space"] == "16 GiB"
    odd = Deployment((parse_pool("replicas=1,preemption=swap,swap_space=4294967297B", "--pool"),))
    assert deployment_to_dict(odd)["pools"][0]["swap_space"] == "4294967297 B"  # exact when a unit would round
    for d in (dep, odd):
        assert deployment_from_dict(deployment_to_dict(d), "f") == d


@pytest.mark.parametrize("given", ["run/", "run//", "run"])
def test_output_directories_print_with_one_separator(given, tmp_path, capsys, monkeypatch):
    system = write_switch_system(tmp_path, accelerators=2)
    monkeypatch.chdir(tmp_path)
    model = "llama:layers=1,hidden=128,heads=2,kv_heads=2,ffn=256,vocab=500"
    assert main(["serve", "--system", str(system), "--model", model,
                 "--pool", "replicas=1", "--rate", "100", "--prompt", "16", "--output", "4", "--requests", "5",
                 "--out", given]) == 0
    text = capsys.readouterr().out
    assert "result    run/ (summary.json" in text and "//" not in text
    assert (tmp_path / "run" / "summary.json").is_file()
