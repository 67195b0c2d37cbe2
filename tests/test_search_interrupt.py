"""Ctrl-C during a search keeps the best mapping found so far (written, and the user told where)
and exits 130; the progress bar counts toward the budget that ends the search."""

from __future__ import annotations

import pytest

from marssim.cli import main
from marssim.cli._searching import progress_plan
from marssim.cost import default_cost_model
from marssim.lower import lower
from marssim.mapping import load_mapping
from marssim.progress import GenerationDone
from marssim.search import GAConfig, SearchSettings
from marssim.search.ga import mars
from marssim.search.result import SearchInterrupted
from marssim.sim import simulate
from marssim.system import load_system
from marssim.workload import load_workload

CASE = ["--system", "ring-8", "--workload", "resnet50:batch=2", "--workers", "1", "--quiet"]


def _interrupt_at(generation: int):
    def progress(event: GenerationDone) -> None:
        if event.generation + 1 >= generation:
            raise KeyboardInterrupt

    return progress


def test_the_ga_hands_back_its_best_so_far_when_interrupted():
    graph, system = load_workload("resnet50:batch=2"), load_system("ring-8")
    with pytest.raises(SearchInterrupted) as info:
        mars(graph, system, config=GAConfig(population=4, inner_population=2), progress=_interrupt_at(2))
    partial = info.value.result
    assert isinstance(info.value, KeyboardInterrupt) and partial.notes["interrupted"]
    assert len(partial.history) == 2 and partial.history["best_fitness"].iloc[-1] == partial.fitness
    again = simulate(lower(graph, system, partial.best, default_cost_model()), system, record=False, setup=False)
    assert again.makespan == partial.makespan  # its evaluation is a simulation


@pytest.mark.parametrize("with_out", [True, False])
def test_ctrl_c_writes_the_best_mapping_and_exits_130(with_out, tmp_path, monkeypatch, capsys):
    import marssim.cli._searching as verb
    import marssim.cli.search as search_verb

    original = verb.progress_bar

    def interrupting_bar(args, cfg, objective):
        bar, _ = original(args, cfg, objective)
        return bar, _interrupt_at(2)

    monkeypatch.setattr(verb, "progress_bar", interrupting_bar)
    monkeypatch.chdir(tmp_path)
    out = ["--out", "found"] if with_out else []
    assert main(["search", *CASE, "--population", "4", *out]) == 130
    err = capsys.readouterr().err
    path = tmp_path / ("found/best_mapping.yaml" if with_out else search_verb.INTERRUPTED_FILE)
    assert path.is_file() and str(path.relative_to(tmp_path)) in err and "interrupted after 2 generations" in err
    mapping, graph, system = load_mapping(path)
    shown = float(err.split("so far (")[1].split(" ms")[0])
    again = simulate(lower(graph, system, mapping, default_cost_model()), system, record=False, setup=False)
    assert again.makespan * 1e3 == pytest.approx(shown, abs=5e-5)  # printed with 4 decimals


def test_the_progress_bar_counts_toward_the_budget_that_ends_the_search():
    assert progress_plan(GAConfig()) == (GAConfig().max_evaluations, "evaluations")
    assert progress_plan(SearchSettings(budget=40).ga_config()) == (40, "simulations")
    assert progress_plan(GAConfig(max_evaluations=None, generations=7)) == (7, "generations")


# ---------------------------------------------------------------- an LLM on a GPU cluster
LLM_CASE = ["--system", "mixed-a100-h100-cluster:nodes_a100=1,nodes_h100=1,gpus_per_node=4",
            "--workload", "gpt:layers=4,hidden=512,heads=8,seq=256,vocab=8192,mode=train,batch=8", "--quiet"]


def _check_kept(path, err: str) -> None:
    """The file named on stderr holds a parallel configuration that simulates to the time shown."""
    from marssim.parallel import ParallelConfig
    from marssim.plan import load_plan, run

    assert path.is_file() and path.name in err and "Traceback" not in err
    plan, graph, system = load_plan(path)
    assert isinstance(plan, ParallelConfig)
    shown = float(err.split("so far (")[1].split(" ms")[0])
    assert run(plan, graph, system, detail=False).makespan * 1e3 == pytest.approx(shown, abs=5e-5)


@pytest.mark.parametrize("workers", [["--workers", "1"], ["--workers", "2"], ["dask"]])
def test_ctrl_c_during_an_llm_search_keeps_its_best_and_exits_130(workers, tmp_path, monkeypatch, capsys):
    import marssim.cli._searching as verb

    original = verb.progress_bar

    def interrupting_bar(args, cfg, objective):
        bar, _ = original(args, cfg, objective)
        return bar, _interrupt_at(2)

    monkeypatch.setattr(verb, "progress_bar", interrupting_bar)
    monkeypatch.chdir(tmp_path)
    argv = ["search", *LLM_CASE, "--budget", "40", "--generations", "20", "--out", "found"]
    if workers == ["dask"]:
        distributed = pytest.importorskip("distributed")
        with distributed.LocalCluster(n_workers=1, threads_per_worker=1, processes=False,
                                      dashboard_address=None) as cluster:
            assert main([*argv, "--dask", cluster.scheduler_address]) == 130
    else:
        assert main([*argv, *workers]) == 130
    err = capsys.readouterr().err
    assert "interrupted after 2 generations" in err
    _check_kept(tmp_path / "found" / "best_mapping.yaml", err)
    assert (tmp_path / "found" / "history.csv").is_file() and (tmp_path / "found" / "search.json").is_file()


@pytest.mark.slow
def test_a_real_ctrl_c_reaches_only_the_parent_and_leaves_no_traceback(tmp_path):
    """SIGINT to the whole process group, as a terminal sends it: the workers ignore it, the
    parent keeps its best so far, says where in one line and exits 130."""
    import os
    import pathlib
    import signal
    import subprocess
    import sys
    import time

    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    # a search long enough to interrupt (about 12 s on a 2-core machine: 14 generations of 48
    # before six without improvement end it)
    case = ["--system", "mixed-a100-h100-cluster:nodes_a100=2,nodes_h100=2,gpus_per_node=4",
            "--workload", "gpt:layers=8,hidden=512,heads=8,seq=256,vocab=8192,mode=train,batch=16", "--quiet",
            "--population", "48"]
    proc = subprocess.Popen([sys.executable, "-m", "marssim", "search", *case, "--workers", "2", "--budget", "400",
                             "--generations", "200", "--out", "found"], cwd=tmp_path, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
                            # as from a terminal: Ctrl-C reaches it (a runner started in the background
                            # hands its children SIGINT ignored, and Python then never raises it)
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    # interrupt while it searches: once its worker processes run (the first screens), a few
    # seconds on (writing its outputs after is not what this tests)
    children = pathlib.Path(f"/proc/{proc.pid}/task/{proc.pid}/children")
    deadline = time.monotonic() + 60.0
    while children.exists() and not children.read_text().split() and time.monotonic() < deadline:
        time.sleep(0.1)
    time.sleep(3.0 if children.exists() else 12.0)
    assert proc.poll() is None, "the search ended before it could be interrupted"
    os.killpg(proc.pid, signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    assert "Traceback" not in err and "KeyboardInterrupt" not in err
    lines = [x for x in err.strip().splitlines() if x]
    assert len(lines) == 1, err
    if "best plan so far" in err:
        _check_kept(tmp_path / "found" / "best_mapping.yaml", err)
    else:
        assert "nothing" in err and not (tmp_path / "found").exists()
