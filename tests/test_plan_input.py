"""Input to the plan-running verbs that used to be ignored or checked too late: refused at once,
on one line, with what to do instead."""

from __future__ import annotations

import pytest

from marssim.cli import main
from marssim.errors import InputError
from marssim.parallel import memory_estimate, parse_parallel, prepare_graph
from marssim.plan import bind_parallel, load_plan
from marssim.system import load_system
from marssim.workload import load_workload

GPT = "gpt:layers=4,hidden=512,heads=8,seq=256,vocab=8192,mode=train"
SYSTEM = "dgx-a100-cluster:nodes=1"


def _refused(argv, capsys, *words):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1, err
    for w in words:
        assert w in err, err
    return err


@pytest.mark.parametrize("flag", [["--estimate"], ["--no-fold"], ["--trace-gpus", "gpu0"]])
def test_parallel_only_flags_without_a_configuration_are_refused(flag, capsys):
    _refused(["simulate", "--system", "ring-8", "--workload", "resnet50", *flag], capsys, flag[0],
             "parallel configuration")


def test_an_empty_configuration_is_refused(capsys):
    _refused(["simulate", "--system", SYSTEM, "--workload", GPT, "--parallel", ""], capsys, "--parallel",
             "expected settings")


def test_an_llm_on_a_gpu_cluster_without_a_configuration_says_what_to_give(capsys):
    _refused(["simulate", "--system", "dgx-h100-cluster:nodes=1", "--workload", "llama3-8b:mode=train"], capsys,
             "--parallel", "marssim search")


def test_unknown_trace_gpus_are_refused_before_any_work(capsys, monkeypatch, tmp_path):
    import marssim.plan

    def never(*args, **kwargs):
        raise AssertionError("the plan was run before its flags were checked")

    monkeypatch.setattr(marssim.plan, "run", never)
    _refused(["simulate", "--system", SYSTEM, "--workload", GPT, "--parallel", "tp=8", "--trace-gpus", "gpu999",
              "--trace", str(tmp_path / "t.json")], capsys, "--trace-gpus", "gpu999")


def test_the_configurations_micro_batch_sets_the_workloads_batch():
    system = load_system(SYSTEM)
    cfg, graph = bind_parallel(parse_parallel("tp=8,micro_batch=2,global_batch=4"), load_workload(GPT), system,
                               "--parallel", micro_batch_given=True, batch_given=False)
    assert graph.batch == 2 == cfg.micro_batch
    cfg, graph = bind_parallel(parse_parallel("tp=8"), load_workload(GPT + ",batch=3"), system, "--parallel",
                               micro_batch_given=False, batch_given=True)
    assert cfg.micro_batch == graph.batch == 3
    with pytest.raises(InputError) as info:  # both given and different: which one holds is a guess
        bind_parallel(parse_parallel("tp=8,micro_batch=2"), load_workload(GPT + ",batch=4"), system, "--parallel",
                      micro_batch_given=True, batch_given=True)
    assert info.value.path == "micro_batch"


def test_micro_batch_on_the_command_line_runs(capsys):
    assert main(["simulate", "--system", SYSTEM, "--workload", GPT, "--parallel", "tp=8,micro_batch=2,global_batch=4",
                 "--no-report"]) == 0
    assert "batch=2" in capsys.readouterr().out


def _count_builds(monkeypatch, name: str) -> list[int]:
    """The batch of every build of zoo workload ``name`` from now on."""
    import dataclasses

    from marssim.workload import registry

    entry = registry.zoo_entries()[name]
    batches: list[int] = []

    def build(**params):
        batches.append(params["batch"])
        return entry.build(**params)

    monkeypatch.setitem(registry._ZOO, name, dataclasses.replace(entry, build=build))
    return batches


@pytest.mark.parametrize("verb", ["simulate", "estimate"])
def test_a_run_builds_a_training_workload_once_at_its_micro_batch(verb, capsys, monkeypatch, tmp_path):
    batches = _count_builds(monkeypatch, "gpt")
    assert main([verb, "--system", SYSTEM, "--workload", GPT, "--parallel", "tp=8,micro_batch=2,global_batch=4",
                 "--no-report"]) == 0
    assert batches == [2] and "gpt:batch=2," in capsys.readouterr().out
    # the same from a plan file, whose graph is the one the command line builds
    plan = tmp_path / "plan.yaml"
    plan.write_text(f"system: {SYSTEM}\nworkload: {GPT}\nparallel:\n  tp: 8\n  micro_batch: 2\n  global_batch: 4\n")
    batches.clear()
    cfg, graph, _ = load_plan(plan)
    assert batches == [2] and graph.batch == cfg.micro_batch == 2
    assert graph.spec == load_workload(GPT, batch=2).spec
    # a workload whose batch is needed (a serving one, whose batch is its own) is built at it, and refused
    serving = "gpt:layers=4,hidden=512,heads=8,seq=256,vocab=8192,mode=serve,prompt=64,generate=4"
    batches.clear()
    assert main([verb, "--system", SYSTEM, "--workload", serving, "--parallel", "tp=8,micro_batch=2"]) == 2
    assert batches == [1] and "serving workload's batch is its own (1)" in capsys.readouterr().err


@pytest.mark.parametrize("verb", ["simulate", "estimate"])
def test_a_run_builds_a_training_workload_once_with_its_recomputation(verb, capsys, monkeypatch):
    """A training LLM whose spec names no recomputation is built once, with the configuration's
    (no graph without it is built for the memory model either): the run's output is the output
    of the workload built as written and prepared for the configuration."""
    import marssim.workload.llm as llm

    argv = [verb, "--system", SYSTEM, "--workload", GPT, "--parallel",
            "tp=4,pp=2,micro_batch=1,global_batch=4,recompute=full"]
    assert main(argv) == 0
    want = capsys.readouterr().out
    built = []
    original = llm.build_transformer
    monkeypatch.setattr(llm, "build_transformer", lambda cfg, **kw: built.append(cfg.recompute) or original(cfg, **kw))
    batches = _count_builds(monkeypatch, "gpt")
    assert main(argv) == 0
    assert capsys.readouterr().out == want and "recompute=full" not in want.splitlines()[0].split(" on ")[0]
    assert batches == [1] and built == ["full"]  # the zoo's one build; no rebuild for the configuration
    graph = load_workload(GPT, batch=1, recompute="full")
    cfg = parse_parallel("tp=4,pp=2,micro_batch=1,global_batch=4,recompute=full")
    assert graph.spec == load_workload(GPT, batch=1).spec and prepare_graph(graph, cfg) is graph
    # a spec naming its own recomputation is built as written, then prepared for the configuration
    batches.clear()
    built.clear()
    assert main([verb, "--system", SYSTEM, "--workload", GPT + ",recompute=selective", "--parallel",
                 "tp=4,pp=2,micro_batch=1,global_batch=4,recompute=full"]) == 0
    assert batches == [1] and built == ["selective", "full"]


def test_the_check_refuses_by_the_memory_the_report_would_show(capsys):
    """One memory model: the refusal's peak is the closed form's, in GiB, with no time."""
    system = load_system(SYSTEM)
    cfg, graph = bind_parallel(parse_parallel("tp=8"), load_workload("gpt3-175b:mode=train,seq=2048"), system,
                               "--parallel", micro_batch_given=False, batch_given=False)
    capacity = min(a.memory.capacity for a in system.accelerators)
    est = memory_estimate(prepare_graph(graph, cfg), cfg, capacity)
    err = _refused(["simulate", "--system", SYSTEM, "--workload", "gpt3-175b:mode=train,seq=2048", "--parallel",
                    "tp=8"], capsys, "does not fit")
    assert f"needs {est.peak(est.worst_stage) / 2**30:.2f} GiB" in err and "t=" not in err


def test_a_shipped_example_is_found_by_name_from_anywhere(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    plan, graph, system = load_plan("topologies/mappings/dgx-h100-bert-base.yaml")  # as the tour writes it
    assert graph.spec.startswith("bert-base")
    assert load_plan("dgx-h100-bert-base")[1].spec == graph.spec
    err = _refused(["simulate", "--mapping", "no-such-example"], capsys, "no-such-example",
                   "dgx-h100-bert-base", "mappings")
    assert "topologies" in err


def test_a_symbolic_onnx_batch_is_said_and_can_be_set(tmp_path):
    onnx = pytest.importorskip("onnx")
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper

    w = numpy_helper.from_array(np.zeros((8, 4), dtype=np.float32), "w")
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"], name="mm")], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 4])], [w])
    path = tmp_path / "m.onnx"
    onnx.save(helper.make_model(graph), path)
    from marssim.errors import InputWarning

    with pytest.warns(InputWarning, match="symbolic"):
        assert load_workload(str(path)).batch == 1
    assert load_workload(f"{path}:batch=8").batch == 8
