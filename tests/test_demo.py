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


def test_demo_writes_a_mapping_that_re_simulates_to_the_reported_latency(tmp_path, capsys):
    out = tmp_path / "demo"
    assert main(["demo", "--system", "herald-soc", "--workload", "mobilenetv2:batch=2", "--time-limit", "1",
                 "--out", str(out)]) == 0
    text = capsys.readouterr().out
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


def test_demo_rejects_a_bad_time_limit(capsys):
    with pytest.raises(SystemExit) as info:
        main(["demo", "--time-limit", "0"])
    assert info.value.code == 2
    assert "positive number of seconds" in capsys.readouterr().err
