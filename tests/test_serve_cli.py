"""``marssim serve`` from the command line: one line and exit 2 for bad input (before any work,
nothing written), the files a run and a sweep write, deployment files with key paths, and a sweep
on two processes giving the numbers of a serial one."""

from __future__ import annotations

import json

import pytest
import yaml

from marssim.cli import main
from support import write_switch_system

MODEL = "llama:layers=2,hidden=256,heads=4,ffn=512,kv_heads=4,vocab=1000"


@pytest.fixture(scope="module")
def system(tmp_path_factory) -> str:
    """Four small GPUs on a switch (timed in microseconds by the roofline, with no calibration
    table to fit)."""
    return write_switch_system(tmp_path_factory.mktemp("sys"))


def serve(*args: str) -> int:
    return main(["serve", *args])


@pytest.mark.parametrize("args,message", [
    (["--pool", "replicas=2,tpp=1"], "--pool: tpp: unknown pool setting"),
    (["--pool", "replicas=0"], "--pool: replicas: expected an integer from 1"),
    (["--pool", "replicas=1,scheduler=fifo"], "scheduler: expected one of static, continuous, chunked"),
    (["--pool", "replicas=1,mixed=true,scheduler=chunked"], "mixed: applies to scheduler=continuous"),
    (["--pool", "role=prefill,replicas=1"], "needs a prefill pool and a decode pool"),
    (["--pool", "replicas=1", "--replay", "no-such-trace"], "no such request trace"),
    (["--pool", "replicas=1", "--arrival", "poisson:rate=2"], "--prompt"),
    (["--pool", "replicas=1", "--rate", "2", "--prompt", "uniform:9-3", "--output", "4"], "--prompt.high"),
    (["--pool", "replicas=1", "--rate", "2", "--prompt", "9", "--output", "4", "--slo", "ttft=fast"], "--slo.ttft"),
    (["--pool", "replicas=1", "--rate", "2", "--prompt", "9", "--output", "4", "--rates", "1,x"], "--rates"),
    (["--pool", "replicas=3,tp=2", "--rate", "2", "--prompt", "9", "--output", "4"], "need 6 GPUs"),
    (["--pool", "replicas=1,tp=3", "--rate", "2", "--prompt", "9", "--output", "4"], "divisor of the 4 attention"),
])
def test_bad_input_is_one_line_and_exit_2(args, message, system, capsys):
    assert serve("--system", system, "--model", MODEL, *args) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1, err


def test_bad_model_and_output_paths_fail_before_any_work(system, tmp_path, capsys):
    base = ["--system", system, "--pool", "replicas=1", "--rate", "2", "--prompt", "9", "--output", "4"]
    assert serve(*base, "--model", "llama3-8b:batch=4") == 2
    assert "batch: is set by the requests" in capsys.readouterr().err
    afile = tmp_path / "f"
    afile.write_text("x")
    assert serve(*base, "--model", MODEL, "--out", str(afile)) == 2
    assert serve(*base, "--model", MODEL, "--trace", str(tmp_path / "t.txt")) == 2
    assert afile.read_text() == "x" and not (tmp_path / "t.txt").exists()


def test_a_run_writes_its_tables_trace_and_figures(system, tmp_path, capsys):
    out = tmp_path / "run"
    assert serve("--system", system, "--model", MODEL, "--pool", "role=prefill,replicas=1,tp=1",
                 "--pool", "role=decode,replicas=1,tp=2", "--replay", "azure-code-2023", "--requests", "40",
                 "--rate", "20", "--slo", "ttft=50ms,tpot=5ms", "--out", str(out), "--trace",
                 str(tmp_path / "t.json.gz"), "--plot", str(tmp_path / "f.png")) == 0
    text = capsys.readouterr().out
    for word in ("TTFT", "TPOT", "TBT", "E2E", "goodput", "Little's law", "KV moves"):
        assert word in text
    summary = json.loads((out / "summary.json").read_text())
    assert summary["completed"] == 40 and summary["slo"] == "TTFT <= 50 ms, TPOT <= 5 ms"
    for name in ("requests.csv", "iterations.csv", "replicas.csv", "transfers.csv"):
        assert (out / name).stat().st_size > 0
    assert len((out / "requests.csv").read_text().splitlines()) == 41
    import gzip

    from decimal import Decimal

    trace = json.loads(gzip.decompress((tmp_path / "t.json.gz").read_bytes()), parse_float=Decimal)
    events = trace["traceEvents"]
    assert {"iteration", "kv"} <= {e.get("cat") for e in events}
    phases = {e["ph"] for e in events if e.get("cat") == "kv"}
    assert {"X", "s", "f"} <= phases  # KV transfers as slices with flow arrows
    slices: dict = {}
    for e in events:
        if e["ph"] == "X":
            slices.setdefault((e["pid"], e["tid"]), []).append((Decimal(e["ts"]), Decimal(e["ts"]) + Decimal(e["dur"])))
    flows = [e for e in events if e["ph"] in "stf"]
    moves = [e for e in events if e["ph"] == "X" and e.get("cat") == "kv"]
    assert len(moves) == 2 * 40  # a flow from the prefill GPU to each of the two decode GPUs, per request
    assert len(flows) == 3 * len(moves)  # each: prefill iteration -> transfer -> first decode iteration
    for e in flows:  # every arrow end lies inside a slice of its track (bound to the enclosing slice)
        assert any(a <= Decimal(e["ts"]) < b for a, b in slices[(e["pid"], e["tid"])]), e
    for name in ("f.png", "f.svg", "f-timeline.png", "f-timeline.svg"):
        assert (tmp_path / name).stat().st_size > 0


def test_a_deployment_file_with_its_key_paths(system, tmp_path, capsys):
    good = {"model": MODEL, "system": system, "router": "round_robin", "tp_comm": "network",
            "pools": [{"replicas": 2, "tp": 2, "scheduler": "chunked", "max_batched_tokens": 512}],
            "requests": {"arrival": "gamma:rate=30,cv=3", "prompt": "uniform:20-200", "output": 8, "count": 50},
            "slo": {"ttft": "100 ms"}}
    path = tmp_path / "dep.yaml"
    path.write_text(yaml.safe_dump(good))
    assert serve("--deployment", str(path)) == 0
    assert ("replicas=2,tp=2,scheduler=chunked,max_batched_tokens=512; router round_robin, tensor-parallel "
            "collectives on the network") in capsys.readouterr().out
    bad = dict(good, pools=[good["pools"][0], {"replicas": 1, "tp": 2, "block_size": "big"}])
    path.write_text(yaml.safe_dump(bad))
    assert serve("--deployment", str(path)) == 2
    assert f"{path}: pools[1].block_size: expected an integer" in capsys.readouterr().err
    bad = dict(good, slo={"ttft": 0.1})
    path.write_text(yaml.safe_dump(bad))
    assert serve("--deployment", str(path)) == 2
    assert "slo.ttft" in capsys.readouterr().err


def test_a_sweep_on_two_processes_is_the_serial_sweep(system, tmp_path, capsys):
    base = ["--system", system, "--model", MODEL, "--pool", "replicas=2,tp=1", "--arrival", "poisson:rate=1",
            "--prompt", "uniform:20-300", "--output", "uniform:2-40", "--requests", "60", "--rates", "5,50,500"]
    assert serve(*base, "--workers", "1", "--out", str(tmp_path / "a"), "--plot", str(tmp_path / "s.png")) == 0
    text = capsys.readouterr().out
    assert len([line for line in text.splitlines() if line.strip().startswith(("5 ", "50 ", "500 "))]) == 3
    assert serve(*base, "--workers", "2", "--out", str(tmp_path / "b")) == 0
    assert (tmp_path / "a" / "sweep.csv").read_bytes() == (tmp_path / "b" / "sweep.csv").read_bytes()
    rows = json.loads((tmp_path / "a" / "sweep.json").read_text())
    assert [r["rate"] for r in rows] == [5.0, 50.0, 500.0]
    e2e = [r["summary"]["e2e_s"]["mean"] for r in rows]
    assert e2e[1] >= e2e[0] * (1 - 1e-9) and e2e[2] > e2e[1]  # more load, longer latency
    assert (tmp_path / "s.png").stat().st_size > 0
