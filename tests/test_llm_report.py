"""What an LLM user sees of a parallel run: every GPU a folded run stood for reports what its
representative ran; timelines get one row per class (or per pipeline stage) that says how many
GPUs it is; the per-stage table adds up; the memory reported is the closed form the pre-check
refuses by; HFU counts recomputation; estimate takes --parallel."""

from __future__ import annotations

import json

import numpy as np
import pytest

from marssim.cli import main
from marssim.parallel import memory_estimate, parse_parallel, prepare_graph
from marssim.plan import bind_parallel, run
from marssim.results.view import folded_view, shown_devices
from marssim.system import load_system
from marssim.workload import load_workload
from marssim.workload.llm import transformer_of

SYSTEM = "dgx-a100-cluster:nodes=2"
GPT = "gpt:layers=8,hidden=512,heads=8,seq=256,vocab=8192,mode=train"


def _run(cfg_text: str, cost, workload: str = GPT, system: str = SYSTEM, **kwargs):
    sys_ = load_system(system)
    cfg, graph = bind_parallel(parse_parallel(cfg_text), load_workload(workload), sys_, "--parallel",
                               micro_batch_given="micro_batch" in cfg_text, batch_given=False)
    return run(cfg, graph, sys_, cost, **kwargs), cfg, graph, sys_


@pytest.fixture(scope="module")
def folded(cost):
    return _run("tp=2,pp=2,dp=4,micro_batch=1,global_batch=16,recompute=full", cost)


def test_every_gpu_a_folded_run_stood_for_reports_its_representatives_figures(folded):
    done, cfg, _, system = folded
    devices = done.result.devices
    fold = done.result.meta["fold"]
    assert len(devices) == len(system.accelerators) == cfg.gpus
    assert len(set(fold.values())) < len(fold)  # the run is folded
    for gpu, rep in fold.items():
        assert devices.loc[gpu, "represented_by"] == ("" if gpu == rep else rep)
        for column in ("busy_s", "utilisation", "flops", "tasks", "design"):
            assert devices.loc[gpu, column] == devices.loc[rep, column]
        assert devices.loc[gpu, "busy_s"] > 0 and devices.loc[gpu, "design"] == "a100"


def test_a_timeline_shows_a_row_per_class_or_per_stage_saying_how_many_gpus(folded):
    done, cfg, _, _ = folded
    result = done.result
    reps = sorted(set(result.meta["fold"].values()), key=lambda g: int(g[3:]))
    assert shown_devices(result) == reps
    view = folded_view(result)
    assert list(view.devices.index) == reps
    classes = {r: sum(1 for v in result.meta["fold"].values() if v == r) for r in reps}
    for rep in reps:
        label = view.devices.loc[rep, "label"]
        assert f"stage {result.meta['stage_of'][rep]}" in label and f"x{classes[rep]} GPUs" in label
    # more classes than rows allowed: one row per pipeline stage, its largest class
    per_stage = shown_devices(result, max_rows=1)
    assert len(per_stage) == cfg.pp
    assert sorted(result.meta["stage_of"][g] for g in per_stage) == list(range(cfg.pp))
    compact = folded_view(result, max_rows=1)
    assert all("of" in compact.devices.loc[g, "label"] for g in per_stage)


def test_a_gpu_asked_for_shows_what_its_representative_ran(folded):
    done, _, _, _ = folded
    result = done.result
    fold = result.meta["fold"]
    other = next(g for g, rep in fold.items() if g != rep)
    view = folded_view(result, [other])
    iv = view.intervals
    mine = iv[(iv["kind"] == "compute") & (iv["resource"] == other)]
    rep = result.intervals[(result.intervals["kind"] == "compute") & (result.intervals["resource"] == fold[other])]
    assert len(mine) == len(rep) > 0
    assert np.array_equal(mine["start"].to_numpy(), rep["start"].to_numpy())
    assert set(iv.loc[iv["kind"] == "compute", "resource"]) == {other}


def test_the_stage_table_adds_up_and_its_memory_is_the_closed_form(folded):
    done, cfg, graph, system = folded
    rep = done.report
    est = memory_estimate(prepare_graph(graph, cfg), cfg, min(a.memory.capacity for a in system.accelerators))
    assert len(rep.stages) == cfg.pp
    for st in rep.stages:
        # per GPU: computing + waiting for communication + pipeline bubble = the iteration
        total = st.busy_s + st.bubble_s + sum(st.exposed_s.values())
        assert total == pytest.approx(rep.iteration_s, rel=1e-9)
        assert st.memory == est.terms(st.stage) and st.memory_peak == pytest.approx(est.peak(st.stage))
        assert st.gpus == cfg.tp * cfg.dp
    assert max(rep.memory_peak.values()) == pytest.approx(max(est.peak(s) for s in range(cfg.pp)))
    assert sum(st.gpus for st in rep.stages) == rep.gpus
    # the stages' layers cover the model once: embedding, blocks, head
    covered = [layer for st in rep.stages for layer in range(st.layers[0], st.layers[1] + 1)]
    assert sorted(covered) == list(range(-1, transformer_of(graph).layers + 1))


def test_tensor_parallel_volume_is_the_rings_closed_form(cost):
    """No sequence parallelism, tp=2, one micro-batch: per block and micro-batch two all-reduces
    forward and two backward of s*b*h*2 bytes, each sending 2(n-1)/n of it."""
    done, cfg, graph, _ = _run("tp=2,pp=1,dp=4,micro_batch=1,global_batch=4", cost, system="dgx-a100-cluster:nodes=1")
    t = transformer_of(graph)
    size = t.seq * t.batch * t.hidden * 2
    per_block = 4 * size * 2 * (cfg.tp - 1) / cfg.tp
    volume = done.report.stages[0].volume["tp"]
    blocks = t.layers * per_block
    assert blocks <= volume <= blocks * 1.25  # the embedding's and the head's own all-reduces on top


def test_hfu_counts_recomputation_and_mfu_does_not(cost):
    plain, _, _, _ = _run("tp=2,pp=2,dp=4,micro_batch=1,global_batch=16", cost, detail=False)
    full, _, _, _ = _run("tp=2,pp=2,dp=4,micro_batch=1,global_batch=16,recompute=full", cost, detail=False)
    a, b = plain.report, full.report
    assert a.model_flops == b.model_flops
    assert a.hfu == pytest.approx(a.mfu, rel=0.05)  # without recomputation: only the optimizer on top
    # full recomputation runs the forward again: 4 passes of the forward's FLOPs where the model counts 3
    assert b.hardware_flops / b.model_flops == pytest.approx(4 / 3, rel=0.05)
    assert b.hfu > b.mfu
    t = transformer_of(load_workload(GPT))
    assert a.tokens == 16 * t.seq and a.samples == 16


def test_estimate_takes_a_parallel_configuration_and_prints_the_stage_table(capsys):
    code = main(["estimate", "--system", SYSTEM, "--workload", GPT, "--parallel",
                 "tp=2,pp=2,dp=4,global_batch=16"])
    out = capsys.readouterr().out
    assert code == 0
    assert "iteration" in out and "HFU" in out and "per pipeline stage" in out and "lower bound" in out


def test_group_stage_reports_pipeline_stages_and_per_op_is_honoured(capsys):
    base = ["simulate", "--system", SYSTEM, "--workload", GPT, "--parallel", "tp=2,pp=2,dp=4,global_batch=16"]
    assert main([*base, "--group", "stage"]) == 0
    out = capsys.readouterr().out
    assert "pipeline stage 0" in out and "pipeline stage 1" in out
    assert main([*base, "--per-op"]) == 0
    out = capsys.readouterr().out
    assert "layers.0.attn.qkv" in out


def test_outputs_of_a_folded_run_draw_one_row_per_class(tmp_path):
    trace = tmp_path / "t.json"
    plot = tmp_path / "fig.png"
    assert main(["simulate", "--system", SYSTEM, "--workload", GPT, "--parallel", "tp=2,pp=2,dp=4,global_batch=16",
                 "--trace", str(trace), "--plot", str(plot), "--out", str(tmp_path / "run")]) == 0
    events = json.loads(trace.read_text())["traceEvents"]
    names = [e["args"]["name"] for e in events if e.get("ph") == "M" and e.get("name") == "process_name"]
    gpus = [n for n in names if n.startswith("gpu")]
    assert 0 < len(gpus) <= 4 and all("GPUs" in n for n in gpus)
    assert (tmp_path / "fig-memory.png").is_file()
    import pandas as pd

    devices = pd.read_csv(tmp_path / "run" / "devices.csv", index_col=0)
    assert len(devices) == 16 and (devices["busy_s"] > 0).all()
