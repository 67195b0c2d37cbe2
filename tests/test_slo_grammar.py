"""One grammar of service-level objectives: ``--slo`` of ``marssim serve``, ``search`` and
``compare`` and a deployment file's ``slo`` section read alike; bounds on every request
(``ttft=2s``) and on a run's statistics (``ttft_p99=2s``) side by side, each verb told which
applies; the serving report says whether the statistics' bounds hold, from the run's own
figures."""

from __future__ import annotations

import json
import re

import pytest

from marssim.cli import main
from marssim.errors import InputError
from marssim.serve.metrics import SLO
from marssim.serve.slo import Constraints, parse_constraints, parse_slo, slo_from_mapping
from support import write_switch_system

MODEL = "llama:layers=2,hidden=256,heads=4,ffn=512,kv_heads=4,vocab=1000"


@pytest.fixture(scope="module")
def system(tmp_path_factory) -> str:
    return write_switch_system(tmp_path_factory.mktemp("sys"))


def test_a_flag_and_a_file_section_read_to_the_same_constraints():
    flag = parse_slo("ttft=2s,tbt_p99=100ms,e2e_mean=30s")
    assert flag == slo_from_mapping({"ttft": "2 s", "tbt_p99": "100 ms", "e2e_mean": "30 s"}, "dep.yaml")
    assert flag.per_request == SLO(ttft=2.0) and [b.key for b in flag.bounds] == ["tbt_p99", "e2e_mean"]
    assert parse_slo(flag.spec()) == flag  # written back as --slo takes it


def test_the_goodput_counts_the_tightest_bound_of_each_metric():
    c = parse_slo("ttft=2s,ttft_p99=500ms,tpot_p90=80ms,e2e=30s,tbt_p99=10ms")
    assert c.request_slo() == SLO(ttft=0.5, tpot=0.08, e2e=30.0)  # TBT has no per-request bound


def test_a_flag_overrides_the_file_key_by_key():
    merged = slo_from_mapping({"ttft": "2 s", "tbt_p99": "100 ms"}, "f").overridden_by(parse_slo("ttft=1s,tbt_p99=5ms"))
    assert merged.per_request == SLO(ttft=1.0) and [(b.key, b.limit) for b in merged.bounds] == [("tbt_p99", 0.005)]
    assert Constraints().overridden_by(merged) == merged


@pytest.mark.parametrize("text,path,words", [
    ("ttft=1s,ttft=2s", "--slo.ttft", "given twice (1s and 2s)"),
    ("ttft", "--slo", "METRIC_STAT=TIME"),
    ("tbt=1s", "--slo", "(a bound on a statistic: tbt_p99=...)"),
    ("ttft_p98=1s", "--slo", "STAT one of p50, p90, p99"),
    ("e2e=1", "--slo.e2e", "time"),
    ("", "--slo", "at least one bound"),
])
def test_bad_bounds_name_the_flag_and_key(text, path, words):
    with pytest.raises(InputError) as info:
        parse_slo(text)
    assert info.value.problems[0][0] == path and words in str(info.value)


def test_a_file_names_the_key_path():
    with pytest.raises(InputError) as info:
        slo_from_mapping({"latency": "1 s"}, "dep.yaml")
    assert info.value.file == "dep.yaml" and info.value.problems[0][0] == "slo.latency"
    with pytest.raises(InputError, match="slo: expected a mapping"):
        slo_from_mapping(["ttft"], "dep.yaml")


def test_a_search_takes_only_bounds_on_statistics():
    assert parse_constraints("ttft_p99=2s").bounds[0].limit == 2.0
    with pytest.raises(InputError, match=re.escape("(a bound on a statistic: tpot_p99=...)")):
        parse_constraints("ttft_p99=2s,tpot=1s")


@pytest.mark.parametrize("bound", ["1000s", "1us"])
def test_serve_reports_whether_the_runs_statistics_meet_their_bounds(system, tmp_path, capsys, bound):
    out = tmp_path / "run"
    assert main(["serve", "--system", system, "--model", MODEL, "--pool", "replicas=1,tp=1", "--rate", "20",
                 "--prompt", "uniform:20-200", "--output", "8", "--requests", "30", "--slo",
                 f"ttft_p99={bound},tpot=5ms", "--out", str(out)]) == 0
    text = capsys.readouterr().out
    summary = json.loads((out / "summary.json").read_text())
    limit = 1000.0 if bound == "1000s" else 1e-6
    met = summary["ttft_s"]["p99"] <= limit and not summary["rejected"]
    line = next(x for x in text.splitlines() if x.startswith("constraints TTFT P99"))
    assert line.endswith(": met") == met and ("missed" in line) == (not met)
    # the goodput counts the tightest TTFT bound with the per-request TPOT bound
    assert summary["slo"] == SLO(ttft=limit, tpot=0.005).text()
