"""`marssim demo`: runs end to end, writes what it says, and what it writes is consistent."""

from __future__ import annotations

import json
import re

import pytest

from marssim.cli import main
from marssim.lower import lower
from marssim.cost import default_cost_model
from marssim.mapping import load_mapping
from marssim.sim import simulate


def _run_demo(out, capsys) -> str:
    assert main(["demo", "--system", "herald-soc", "--workload", "mobilenetv2:batch=2", "--out", str(out)]) == 0
    return capsys.readouterr().out


def test_demo_writes_a_mapping_that_re_simulates_to_the_reported_latency(tmp_path, capsys, monkeypatch):
    out = tmp_path / "demo"
    text = _run_demo(out, capsys)
    rows = dict(re.findall(r"^(data_parallel|h2h|mars)\s+([0-9.]+)\s", text, re.MULTILINE))
    assert set(rows) == {"data_parallel", "h2h", "mars"}
    # the GA is seeded with the data-parallel baseline: it is never worse
    assert float(rows["mars"]) <= float(rows["data_parallel"]) + 1e-9
    for name in ("best_mapping.yaml", "trace.json.gz", "timeline.png", "timeline.svg", "result/summary.json"):
        assert (out / name).is_file(), name
    mapping, graph, system = load_mapping(out / "best_mapping.yaml")
    fresh = simulate(lower(graph, system, mapping, default_cost_model()), system, record=False, setup=False)
    saved = json.loads((out / "result" / "summary.json").read_text())
    assert fresh.makespan == pytest.approx(saved["makespan_s"], rel=1e-12)
    assert fresh.makespan * 1e3 == pytest.approx(float(rows["mars"]), abs=5e-4)  # printed with 3 decimals

    # on a machine a thousand times slower (the search's clock jumps 1000 s per reading) the search
    # stops on the same evaluation budget and finds the same mapping
    import types

    from marssim.search import ga

    clock = iter(range(0, 10**9, 1000))
    monkeypatch.setattr(ga, "time", types.SimpleNamespace(perf_counter=lambda: float(next(clock))))
    slow = _run_demo(tmp_path / "slow", capsys)
    assert dict(re.findall(r"^(mars)\s+([0-9.]+)\s", slow, re.MULTILINE)) == {"mars": rows["mars"]}
    assert (tmp_path / "slow" / "best_mapping.yaml").read_text() == (out / "best_mapping.yaml").read_text()


def test_demo_rejects_a_bad_budget(capsys):
    with pytest.raises(SystemExit) as info:
        main(["demo", "--evaluations", "0"])
    assert info.value.code == 2
    assert "expected a positive integer" in capsys.readouterr().err
