"""The engine's host time in a serving iteration (``engine``, ``cuda_graphs``, ``host_overlap``):
closed forms against the simulation of a lone request, the figures from the shipped tables
(recomputed here independently), the kernels an iteration launches, and the settings' checks."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from marssim.cost.engine_host import (
    CPU_STAGES,
    ENGINE_TABLE,
    EngineSpec,
    cpu_fits,
    engine_spec,
    engine_specs,
    load_engine_table,
)
from marssim.cost.host_overheads import load_host_overheads
from marssim.data import host_overheads
from marssim.errors import InputError
from marssim.parallel.host import launch_seconds
from marssim.serve import Deployment, Pool, Requests, SchedulerConfig, load_model, parse_pool
from marssim.serve.deployment import deployment_from_dict, deployment_to_dict
from marssim.serve.hosttime import host_time
from marssim.serve.simulate import iteration_model, simulate_serving
from marssim.workload import OpKind, load_workload

TINY = "llama:layers=2,hidden=256,heads=4,kv_heads=2,ffn=512,vocab=1024"


def _cpu(seqs: int, several: bool) -> float:
    """The CPU stages' seconds at ``seqs`` sequences, fitted here by numpy to the shipped A100 table."""
    rows = load_host_overheads(host_overheads() / "A100.csv")
    total = 0.0
    for stage in CPU_STAGES:
        pts = [(r.batch_size, r.seconds) for r in rows
               if r.stage == stage and r.statistic == "median" and (r.tp > 1) == several]
        slope, intercept = np.polyfit([b for b, _ in pts], [t for _, t in pts], 1)
        total += max(0.0, intercept + slope * seqs)
    return total


def _lone(spec: str, dgx, cost, prompt: int = 200, output: int = 6, tp: int = 1, **sched) -> tuple[float, float]:
    """``(time to first token, time per output token)`` of one request alone."""
    dep = Deployment((Pool(replicas=1, tp=tp, scheduler=SchedulerConfig(**sched)),))
    pr = simulate_serving(dep, load_model(spec), dgx, cost, Requests.of([0.0], [prompt], [output])).per_request
    return float(pr["first_token_s"][0]), float((pr["finish_s"][0] - pr["first_token_s"][0]) / (output - 1))


def test_the_cpu_stage_lines_are_the_least_squares_lines_of_the_host_table():
    for several in (False, True):
        fits = cpu_fits("A100", "vidur-2024", several)
        assert tuple(f.stage for f in fits) == CPU_STAGES
        for seqs in (1, 7, 64, 200):
            assert sum(f.seconds(seqs) for f in fits) == pytest.approx(_cpu(seqs, several), rel=1e-9)
    # the host work grows with the batch, and broadcasting to workers (tp > 1) costs more per step
    assert _cpu(64, False) > _cpu(1, False) > 0
    assert _cpu(1, True) > _cpu(1, False)


@pytest.mark.parametrize("tp", [1, 2])
def test_without_overlap_a_lone_request_pays_the_host_time_every_step(tp, dgx, cost):
    ttft0, tpot0 = _lone("llama3-8b", dgx, cost, tp=tp)
    ttft, tpot = _lone("llama3-8b", dgx, cost, tp=tp, engine="vllm", host_overlap="false")
    im = iteration_model(load_model("llama3-8b"), dgx, (tuple(f"gpu{i}" for i in range(tp)),), cost)
    graph_launch = im.kernels(0, False) * engine_spec("vllm").graph_launch_per_kernel
    assert graph_launch < tpot0  # the GPU step is longer than the graph's launch: C(1) alone shows
    assert tpot - tpot0 == pytest.approx(_cpu(1, tp > 1), rel=1e-9)
    assert ttft - ttft0 == pytest.approx(_cpu(1, tp > 1), rel=1e-9)  # the prefill's launches hide too


def test_overlapped_host_time_hides_under_a_longer_gpu_step(dgx, cost):
    base = _lone("llama3-8b", dgx, cost)
    for engine in ("vllm", "sglang", "trtllm"):
        assert engine_spec(engine).overlap
        assert _lone("llama3-8b", dgx, cost, engine=engine) == base  # bit for bit: the GPU step is longer


def test_overlapped_host_time_sets_the_pace_when_it_is_longer(dgx, cost):
    _, gpu = _lone(TINY, dgx, cost)
    im = iteration_model(load_model(TINY), dgx, (("gpu0",),), cost)
    launch = im.kernels(0, False) * engine_spec("sglang").graph_launch_per_kernel
    host = _cpu(1, False) + launch
    assert host > gpu  # a small model decodes faster than its host prepares a step
    _, tpot = _lone(TINY, dgx, cost, engine="sglang")
    assert tpot == pytest.approx(host, rel=1e-9)
    _, serial = _lone(TINY, dgx, cost, engine="sglang", host_overlap="false")
    assert serial == pytest.approx(_cpu(1, False) + max(gpu, launch), rel=1e-9)


def test_without_cuda_graphs_every_kernel_is_launched(dgx, cost):
    _, gpu = _lone(TINY, dgx, cost)
    im = iteration_model(load_model(TINY), dgx, (("gpu0",),), cost)
    eager = im.kernels(0, False) * launch_seconds("A100", "vidur-2024")
    _, tpot = _lone(TINY, dgx, cost, engine="vllm", cuda_graphs="false", host_overlap="false")
    assert tpot == pytest.approx(_cpu(1, False) + max(gpu, eager), rel=1e-9)


@pytest.mark.parametrize("spec", ["llama3-8b", "gpt3-1.3b"])
def test_an_iteration_launches_the_kernels_of_its_graph(spec, dgx, cost):
    im = iteration_model(load_model(spec), dgx, (("gpu0",),), cost)
    for mode, prefill in (("mode=decode,context=100,batch=2", False), ("mode=prefill,seq=100,batch=2", True)):
        graph = load_workload(f"{spec}:{mode}")
        kernels = [op for op in graph.ops if op.kind != OpKind.INPUT and not op.param("view")]
        assert im.kernels(0, prefill) == len(kernels)
    im2 = iteration_model(load_model(spec), dgx, (("gpu0", "gpu1"),), cost)
    assert im2.kernels(0, False) == im.kernels(0, False) + 2 * load_model(spec).layers  # the all-reduces


def test_a_decode_batch_replays_a_graph_only_at_a_captured_size():
    trt, vllm, sglang = engine_spec("trtllm"), engine_spec("vllm"), engine_spec("sglang")
    assert [trt.graph_fits(b) for b in (1, 31, 32, 33, 40, 64, 100, 128, 129)] == \
        [True, True, True, False, False, True, False, True, False]  # no padding: the captured sizes only
    assert all(vllm.graph_fits(b) for b in (1, 33, 100, 512)) and not vllm.graph_fits(513)
    assert sglang.graph_fits(256) and not sglang.graph_fits(257)


def test_a_batch_without_a_graph_pays_each_launch(dgx, cost):
    im = iteration_model(load_model("llama3-8b"), dgx, (("gpu0",),), cost)
    host = host_time("trtllm", True, im)
    k = im.kernels(0, False)
    assert host.parts(32, True).graph and host.parts(32, True).launch == k * engine_spec("trtllm").graph_launch_per_kernel
    assert not host.parts(40, True).graph and host.parts(40, True).launch == k * launch_seconds("A100", "vidur-2024")
    assert not host.parts(32, False).graph  # an iteration with prefill tokens runs eagerly
    assert host_time("none", True, im) is None


def test_the_shipped_engine_table_reads_and_every_row_has_a_source():
    rows = load_engine_table(host_overheads() / ENGINE_TABLE)
    assert {r.engine for r in rows} == {"vllm", "sglang", "trtllm"}
    assert all(r.source and r.file and r.license for r in rows)
    specs = engine_specs(host_overheads() / ENGINE_TABLE)
    assert all(isinstance(s, EngineSpec) for s in specs.values())


def test_a_bad_engine_table_names_the_file_line_and_column(tmp_path):
    good = (host_overheads() / ENGINE_TABLE).read_text().splitlines()
    bad = tmp_path / "engines.csv"
    bad.write_text("\n".join(good + ["tgi,overlap,true,flag,x,1,f,MIT,,"]) + "\n")
    with pytest.raises(InputError, match=f"line {len(good) + 1}: engine"):
        load_engine_table(bad)
    bad.write_text("\n".join([ln for ln in good if "vllm,overlap" not in ln]) + "\n")
    with pytest.raises(InputError, match="vllm.*missing overlap"):
        engine_specs(bad)


def test_the_settings_read_back_and_refuse_what_does_not_apply():
    pool = parse_pool("replicas=2,tp=1,engine=trtllm,cuda_graphs=false,host_overlap=false")
    assert (pool.scheduler.engine, pool.scheduler.cuda_graphs, pool.scheduler.overlap) == ("trtllm", False, False)
    assert parse_pool(pool.text()) == pool
    dep = Deployment((pool,))
    assert deployment_from_dict(deployment_to_dict(dep), "f") == dep
    assert Pool().scheduler.engine == "none" and SchedulerConfig().overlap is None
    with pytest.raises(InputError, match="cuda_graphs"):
        parse_pool("replicas=1,tp=1,cuda_graphs=false")
    with pytest.raises(InputError, match="host_overlap"):
        parse_pool("replicas=1,tp=1,host_overlap=true")
    with pytest.raises(InputError, match="engine.*none, vllm, sglang, trtllm"):
        parse_pool("replicas=1,tp=1,engine=tgi")
    assert replace(pool.scheduler, engine="none").overlap is False  # the setting stays, unused without an engine


@pytest.mark.parametrize("pp,tp_comm", [(2, "closed"), (1, "network")])
def test_the_host_time_falls_on_the_first_stage_and_on_the_network_path(pp, tp_comm, dgx, cost):
    model = load_model("llama3-8b")

    def lone(**sched):
        dep = Deployment((Pool(replicas=1, tp=2, pp=pp, scheduler=SchedulerConfig(**sched)),), tp_comm=tp_comm)
        pr = simulate_serving(dep, model, dgx, cost, Requests.of([0.0], [200], [6])).per_request
        return float(pr["first_token_s"][0]), float((pr["finish_s"][0] - pr["first_token_s"][0]) / 5)

    ttft0, tpot0 = lone()
    ttft, tpot = lone(engine="vllm", host_overlap="false")
    assert tpot - tpot0 == pytest.approx(_cpu(1, True), rel=1e-9)
    assert ttft - ttft0 == pytest.approx(_cpu(1, True), rel=1e-9)


def test_the_screen_times_an_iteration_with_the_same_host_time(dgx, cost):
    from marssim.serve.screen import _times

    im = iteration_model(load_model("llama3-8b"), dgx, (("gpu0",),), cost)
    sched = SchedulerConfig(engine="trtllm", host_overlap="false")
    host = host_time("trtllm", True, im, False)
    for b in (1, 40, 64):
        gpu = im.stage_times((b, 1), (0, 0), (), b, b * 300, b)[0]
        assert _times(im, dgx, sched).decode(b, 300)[0] == host.step(gpu, b, True)
        assert _times(im, dgx).decode(b, 300)[0] == gpu


def test_engine_none_and_a_hidden_host_leave_a_busy_run_bit_identical(dgx, cost):
    model = load_model("llama3-8b")
    reqs = Requests.of([0.0, 0.01, 0.02, 0.05, 0.08, 0.3], [300, 120, 700, 64, 500, 200], [20, 9, 14, 30, 5, 12])

    def run(**sched):
        dep = Deployment((Pool(replicas=1, tp=1, scheduler=SchedulerConfig(kind="chunked", max_batched_tokens=512,
                                                                          **sched)),))
        return simulate_serving(dep, model, dgx, cost, reqs).per_request

    base = run()
    for other in (run(engine="none"), run(engine="vllm")):  # vLLM overlaps: its host hides under these steps
        for col in ("first_token_s", "finish_s"):
            assert np.array_equal(other[col], base[col])
    slower = run(engine="vllm", host_overlap="false")
    assert (slower["finish_s"] > base["finish_s"]).all()
