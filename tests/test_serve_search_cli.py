"""``marssim search`` and ``marssim compare`` over serving deployments (``--model``): the best
deployment's file re-simulates (``marssim serve --deployment``) to the figures the search
reported, a too-tight SLO and every flag that does not apply are one line and exit 2 before any
work, Ctrl-C keeps the best deployment so far, compare prints the grid and the GA."""

from __future__ import annotations

import json

import pytest
import yaml

from marssim.cli import main
from support import write_switch_system

MODEL = "llama:layers=2,hidden=256,heads=4,ffn=512,kv_heads=4,vocab=1000"


@pytest.fixture(scope="module")
def system(tmp_path_factory) -> str:
    """Four small GPUs on a switch (timed by the roofline, with no calibration table to fit)."""
    return write_switch_system(tmp_path_factory.mktemp("sys"))


def case(system: str, *extra: str, slo: str = "ttft_p99=5ms,tbt_p99=1ms") -> list[str]:
    return ["--system", system, "--model", MODEL, "--rate", "200", "--prompt", "uniform:16-256", "--output",
            "uniform:2-64", "--requests", "120", "--slo", slo, "--workers", "1", "--quiet", *extra]


def served_again(path, tmp_path, capsys) -> dict:
    """``marssim serve --deployment path --out ...``'s summary.json."""
    capsys.readouterr()
    assert main(["serve", "--deployment", str(path), "--out", str(tmp_path / "again")]) == 0
    return json.loads((tmp_path / "again" / "summary.json").read_text())


@pytest.mark.parametrize("objective, algorithm", [("gpus", "mars"), ("goodput", "uniform_grid")])
def test_the_best_deployment_file_resimulates_to_the_reported_figures(objective, algorithm, system, tmp_path,
                                                                      capsys):
    flags = ["--budget", "4", "--generations", "2", "--population", "4"] if algorithm == "mars" else []
    out = tmp_path / "found"
    assert main(["search", *case(system, "--objective", objective, "--algorithm", algorithm, "--gpu-price",
                                 "g8=1.5", "--out", str(out), *flags)]) == 0
    text = capsys.readouterr().out
    assert "best_deployment.yaml" in text and "TTFT P99" in text
    for name in ("best_deployment.yaml", "search.json", "history.csv", "top10.csv", "convergence.png",
                 "result/summary.json", "result/requests.csv"):
        assert (out / name).is_file(), name
    found = json.loads((out / "search.json").read_text())
    data = yaml.safe_load((out / "best_deployment.yaml").read_text())
    assert data["requests"]["seed"] == 0 and data["model"] == MODEL
    if objective == "goodput":
        assert data["requests"]["rate"] == found["goodput_rps"] == found["rate_rps"] > 0
    again = served_again(out / "best_deployment.yaml", tmp_path, capsys)
    assert again["ttft_s"]["p99"] == found["latency_s"]["ttft_p99"] <= 0.005
    assert again["tbt_s"]["p99"] == found["latency_s"]["tbt_p99"] <= 0.001
    assert again["output_tokens_per_s"] == found["output_tokens_per_s"]
    assert again["gpus"] == found["gpus"] and again["rejected"] == 0
    assert found["cost_per_mtok"] == pytest.approx(found["gpus"] * 1.5 / (again["output_tokens_per_s"] * 3600) * 1e6,
                                                   rel=1e-12)


def test_a_too_tight_slo_is_one_line_and_exit_2(system, tmp_path, capsys):
    out = tmp_path / "none"
    assert main(["search", *case(system, "--objective", "gpus", "--algorithm", "uniform_grid", "--out", str(out),
                                 slo="ttft_p99=1us")]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "--slo: no deployment meets TTFT P99 <= 0.001 ms" in err and "the closest" in err
    assert not out.exists()


@pytest.mark.parametrize("args, message", [
    (["--workload", "resnet50"], "--workload: give --workload"),
    (["--objective", "cost"], "--gpu-price: --objective cost needs a price per GPU-hour of every GPU design"),
    (["--objective", "latency"], "--objective: serving deployments are searched for goodput, gpus, cost"),
    (["--algorithm", "h2h"], "--algorithm: serving deployments are searched by mars, uniform_grid, exhaustive"),
    (["--algorithm", "uniform_grid", "--generations", "3"], "--generations: does not apply"),
    (["--gpu-price", "h100=2"], "--gpu-price.h100: not a GPU design of the system"),
    (["--batch", "4"], "--batch: does not apply to serving deployments"),
])
def test_bad_serving_flags_are_one_line_and_exit_2(args, message, system, tmp_path, capsys):
    assert main(["search", *case(system, *args), "--out", str(tmp_path / "x")]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and "\n" not in err
    assert not (tmp_path / "x").exists()


@pytest.mark.parametrize("args, message", [
    (["--system", "ring-8", "--model", MODEL, "--rate", "2", "--prompt", "9", "--output", "4"],
     "--slo: give the constraints"),
    (["--system", "ring-8", "--model", MODEL, "--arrival", "offline", "--prompt", "9", "--output", "4", "--slo",
      "ttft_p99=1s"], "--arrival: a serving search needs arrivals at a rate"),
    (["--system", "ring-8", "--model", MODEL, "--rate", "2", "--prompt", "9", "--output", "4", "--slo", "ttft=1s"],
     "(a bound on a statistic: ttft_p99=...)"),
    (["--system", "ring-8", "--workload", "resnet50", "--slo", "ttft_p99=1s"], "--slo: applies to a search over "
                                                                              "serving deployments"),
    (["--system", "ring-8", "--workload", "resnet50", "--objective", "goodput"], "--objective: goodput applies to "
                                                                                "serving deployments"),
    (["--system", "ring-8"], "--workload: give the workload"),
])
def test_inputs_that_do_not_make_a_serving_search(args, message, capsys):
    assert main(["search", *args, "--quiet"]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and "\n" not in err


@pytest.mark.parametrize("with_out", [True, False])
def test_ctrl_c_keeps_the_best_deployment_and_exits_130(with_out, system, tmp_path, monkeypatch, capsys):
    import marssim.cli._searching as verb
    from marssim.cli._serve_search import INTERRUPTED_FILE

    original = verb.progress_bar

    def interrupting_bar(args, cfg, objective):
        bar, _ = original(args, cfg, objective)

        def progress(row):
            raise KeyboardInterrupt

        return bar, progress

    monkeypatch.setattr(verb, "progress_bar", interrupting_bar)
    monkeypatch.chdir(tmp_path)
    out = ["--out", "found"] if with_out else []
    assert main(["search", *case(system, "--objective", "gpus", "--population", "4", *out)]) == 130
    err = capsys.readouterr().err
    path = tmp_path / ("found/best_deployment.yaml" if with_out else INTERRUPTED_FILE)
    assert path.is_file() and "interrupted after 1 generations" in err and str(path.name) in err
    data = yaml.safe_load(path.read_text())
    assert data["pools"] and "(interrupted)" in path.read_text().splitlines()[0]
    again = served_again(path, tmp_path, capsys)
    shown = float(err.split("TTFT P99 ")[1].split(" ms")[0])
    assert round(again["ttft_s"]["p99"] * 1e3, 1) == shown


def test_compare_prints_the_grid_and_the_ga(system, tmp_path, capsys):
    table = tmp_path / "table.csv"
    assert main(["compare", *case(system, "--objective", "gpus", "--budget", "4", "--generations", "2",
                                  "--population", "4", "--csv", str(table))]) == 0
    text = capsys.readouterr().out
    lines = text.splitlines()
    grid = next(line for line in lines if line.startswith("uniform-grid"))
    ga = next(line for line in lines if line.startswith("mars"))
    assert float(ga.split()[1]) <= float(grid.split()[1])  # GPUs: the GA seeded with the grid's best
    assert max(len(line) for line in lines[1:]) <= 120
    import pandas as pd

    rows = pd.read_csv(table)
    assert list(rows["algorithm"][:2]) == ["uniform-grid", "mars"]
