"""`marssim search` and `marssim compare`: outputs, reproducibility, and clear errors."""

from __future__ import annotations

import json

import pandas as pd
import pytest
import yaml

import marssim.cost
from marssim.cli import main
from marssim.mapping import load_mapping
from marssim.workload import registry
from test_search_support import system_dict, two_models
from support import RooflineCost

FAST = ["--generations", "2", "--population", "4", "--quiet"]


@pytest.fixture
def case(tmp_path, monkeypatch):
    """A system file, a zoo entry for the two-model workload and the test cost model."""
    path = tmp_path / "ring3.yaml"
    path.write_text(yaml.safe_dump(system_dict(3)))
    monkeypatch.setitem(registry._ZOO, "two-small", registry.ZooEntry(
        "two-small", lambda batch: two_models(batch), {"batch": 4}, "CNN and MLP side by side (tests)", True))
    monkeypatch.setattr(marssim.cost, "default_cost_model", lambda **_: RooflineCost(), raising=False)
    return ["--system", str(path), "--workload", "two-small"]


def test_search_writes_every_output_and_the_mapping_simulates_to_the_reported_makespan(case, tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["search", *case, *FAST, "--workers", "1", "--seed", "3", "--out", str(out),
                 "--trace", str(out / "trace.json")]) == 0
    printed = capsys.readouterr().out
    assert "mars: makespan" in printed and "set 0:" in printed
    names = {p.name for p in out.iterdir()}
    assert {"best_mapping.yaml", "search.json", "history.csv", "convergence.png", "convergence.svg", "result",
            "trace.json"} <= names
    trace = json.loads((out / "trace.json").read_text())
    assert any(e.get("ph") == "X" for e in (trace["traceEvents"] if isinstance(trace, dict) else trace))
    summary = json.loads((out / "search.json").read_text())
    history = pd.read_csv(out / "history.csv")
    assert 1 <= len(history) <= 2 and history["best_fitness"].iloc[-1] == summary["fitness"]
    assert (out / "convergence.png").read_bytes()[:4] == b"\x89PNG"
    result = json.loads((out / "result" / "summary.json").read_text())
    assert result["makespan_s"] == summary["makespan_s"]
    mapping, graph, system = load_mapping(out / "best_mapping.yaml")
    assert mapping.key == summary["mapping_key"]
    capsys.readouterr()
    assert main(["simulate", "--mapping", str(out / "best_mapping.yaml")]) == 0
    shown = capsys.readouterr().out
    assert f"makespan     {summary['makespan_s'] * 1e3:.4f} ms" in shown


def test_search_is_reproducible_across_worker_counts(case, tmp_path):
    runs = {}
    for workers in ("1", "2"):
        out = tmp_path / f"w{workers}"
        assert main(["search", *case, *FAST, "--workers", workers, "--seed", "7", "--out", str(out)]) == 0
        runs[workers] = ((out / "best_mapping.yaml").read_text(), json.loads((out / "search.json").read_text()))
    assert runs["1"][0] == runs["2"][0]
    assert runs["1"][1]["fitness"] == runs["2"][1]["fitness"]


@pytest.mark.parametrize("algorithm", ["data_parallel", "h2h", "random", "exhaustive"])
def test_search_runs_each_baseline(case, tmp_path, algorithm, capsys):
    args = ["search", *case, "--algorithm", algorithm, "--workers", "1", "--quiet"]
    if algorithm == "random":  # the baselines spend no budget (a --budget would be refused as ignored)
        args += ["--budget", "10"]
    if algorithm == "exhaustive":  # a space small enough: one micro-batch count, 2 accelerators
        path = tmp_path / "ring2.yaml"
        path.write_text(yaml.safe_dump(system_dict(2)))
        args[2] = str(path)
        args[4] = "two-small:batch=1"
    assert main(args) == 0
    assert capsys.readouterr().out.startswith(f"{algorithm}: makespan")


@pytest.mark.parametrize("flags, message", [
    (["--budget", "0"], "expected a positive integer"),
    (["--algorithm", "annealing"], "invalid choice"),
    (["--objective", "speed"], "invalid choice"),
    (["--workers", "2", "--dask", "tcp://127.0.0.1:1"], "not both"),
    (["--objective", "energy"], "needs energy figures"),
    (["--algorithm", "exhaustive", "--workers", "1", "--system", "RING8"], "more than 20000 points"),
    (["--time-limit", "-1"], "expected a positive number"),
])
def test_bad_flags_exit_2_with_one_clear_line_and_write_nothing(case, tmp_path, capsys, flags, message):
    out = tmp_path / "never"
    ring8 = tmp_path / "ring8.yaml"
    ring8.write_text(yaml.safe_dump(system_dict(8)))
    flags = [str(ring8) if f == "RING8" else f for f in flags]
    with pytest.raises(SystemExit) if "invalid" in message or "expected a positive" in message else _no_raise():
        code = main(["search", *case, *flags, "--quiet", "--out", str(out)])
        assert code == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err
    assert not out.exists()


def test_unknown_workload_names_the_spec(case, capsys):
    assert main(["search", case[0], case[1], "--workload", "resnet5O", "--quiet"]) == 2
    assert "resnet5O" in capsys.readouterr().err


def test_compare_prints_one_table_with_every_algorithm(case, tmp_path, capsys, monkeypatch):
    import io
    import sys

    class Terminal(io.StringIO):
        def isatty(self):
            return True

    err = Terminal()
    monkeypatch.setattr(sys, "stderr", err)
    path = tmp_path / "ring2.yaml"
    path.write_text(yaml.safe_dump(system_dict(2)))
    csv = tmp_path / "table.csv"
    loud = [a for a in FAST if a != "--quiet"]
    args = ["compare", "--system", str(path), "--workload", "two-small:batch=1", *loud, "--workers", "1",
            "--csv", str(csv)]
    assert main(args) == 0
    printed = capsys.readouterr().out
    table = pd.read_csv(csv)
    assert list(table["algorithm"]) == ["data_parallel", "h2h", "mars", "random", "exhaustive"]
    # on a terminal each search says when it begins and, in its summary line, how it ended
    said = err.getvalue().splitlines()
    for name in table["algorithm"]:
        begun = said.index(f"{name}: running")
        assert said[begun + 1].startswith(f"{name}: {name}: ")
    for name in table["algorithm"]:
        assert f"\n{name}" in printed
    rows = table.set_index("algorithm")
    assert rows.loc["data_parallel", "vs_data_parallel_pct"] == 0.0
    # random search simulates as many mappings as the GA evaluated (fewer if the space runs out)
    assert 0 < rows.loc["random", "simulations"] <= rows.loc["mars", "simulations"] + rows.loc["mars", "estimates"]
    assert rows.loc["random", "estimates"] == 0
    # exhaustive is optimal; the seeded GA is never worse than data_parallel
    assert rows["makespan_ms"].min() == rows.loc["exhaustive", "makespan_ms"]
    assert rows.loc["mars", "makespan_ms"] <= rows.loc["data_parallel", "makespan_ms"]


class _no_raise:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def test_search_on_a_dask_cluster_gives_the_serial_mapping(case, tmp_path):
    distributed = pytest.importorskip("distributed")
    serial = tmp_path / "serial"
    assert main(["search", *case, *FAST, "--workers", "1", "--seed", "5", "--out", str(serial)]) == 0
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None,
                                  silence_logs=40) as cluster:
        out = tmp_path / "dask"
        assert main(["search", *case, *FAST, "--dask", cluster.scheduler_address, "--seed", "5",
                     "--out", str(out)]) == 0
    assert (out / "best_mapping.yaml").read_text() == (serial / "best_mapping.yaml").read_text()


def test_progress_bar_on_a_terminal_shows_generation_best_and_rate(case, monkeypatch):
    import io
    import sys

    class Terminal(io.StringIO):
        def isatty(self):
            return True

    err = Terminal()
    monkeypatch.setattr(sys, "stderr", err)
    assert main(["search", *case, "--generations", "2", "--population", "4", "--workers", "1"]) == 0
    shown = err.getvalue()
    assert "generation" in shown and "best " in shown and " ms" in shown and "eval/s" in shown
    quiet = Terminal()
    monkeypatch.setattr(sys, "stderr", quiet)
    assert main(["search", *case, "--generations", "2", "--population", "4", "--workers", "1", "--quiet"]) == 0
    assert "generation" not in quiet.getvalue()


def test_search_outputs_come_from_the_search_and_the_best_plan_is_simulated_again_only_for_a_trace(
        case, tmp_path, monkeypatch, capsys):
    import marssim.plan

    calls = []
    real_run = marssim.plan.run

    def counting_run(*args, **kwargs):
        calls.append(kwargs.get("detail", True))
        return real_run(*args, **kwargs)

    monkeypatch.setattr(marssim.plan, "run", counting_run)
    plain, traced = tmp_path / "plain", tmp_path / "traced"
    assert main(["search", *case, *FAST, "--workers", "1", "--seed", "3", "--out", str(plain)]) == 0
    without = len(calls)
    assert main(["search", *case, *FAST, "--workers", "1", "--seed", "3", "--out", str(traced),
                 "--trace", str(tmp_path / "best.json.gz")]) == 0
    assert len(calls) == 2 * without + 1  # the same search, then one simulation of the best plan
    capsys.readouterr()
    names = {p.name for p in plain.iterdir()}
    assert {"best_mapping.yaml", "search.json", "history.csv", "top10.csv", "convergence.png"} <= names
    assert "result" not in names and "trace.json" not in names
    assert (traced / "result" / "summary.json").exists() and (tmp_path / "best.json.gz").stat().st_size > 0
    a, b = (json.loads((d / "search.json").read_text()) for d in (plain, traced))
    assert (a["mapping_key"], a["fitness"], a["makespan_s"]) == (b["mapping_key"], b["fitness"], b["makespan_s"])
