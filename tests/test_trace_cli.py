"""`marssim trace RESULT_DIR`: re-export a saved result; clear errors for bad paths."""

from __future__ import annotations

from pathlib import Path

import pytest

from marssim.cli import main
from marssim.sim import Result
from marssim.trace import write_chrome_trace
from test_trace_chrome import CASES, check_faithful
from test_trace_columnar import assert_identical


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    result = CASES["pipeline-oc"]()
    directory = tmp_path_factory.mktemp("result") / "run"
    result.save(directory, per_link=True)  # the links' bandwidth counters of the trace come from link_timeline
    return result, directory


def test_trace_verb_writes_every_output_and_reports_sizes(saved, tmp_path, capsys):
    result, directory = saved
    out = tmp_path / "out"
    code = main(["trace", str(directory), "--trace", f"{out}.json.gz", "--intervals", f"{out}.parquet",
                 "--plot", f"{out}.png", "--color-by", "model"])
    assert code == 0
    text = capsys.readouterr().out
    for name in ("out.json.gz", "out.parquet", "out.png", "out.svg", "out-utilisation.png", "out-memory.svg"):
        assert (tmp_path / name).stat().st_size > 0
        assert any(name in line and ("KiB" in line or " B" in line or "MiB" in line) for line in text.splitlines())
    loaded = Result.load(directory)
    check_faithful(loaded, Path(f"{out}.json.gz"))
    # the saved result re-exports to the very bytes the in-memory result gives
    write_chrome_trace(result, tmp_path / "direct.json.gz")
    assert (tmp_path / "direct.json.gz").read_bytes() == Path(f"{out}.json.gz").read_bytes()
    from marssim.trace import import_intervals

    assert_identical(import_intervals(f"{out}.parquet"), result.intervals)


@pytest.mark.parametrize("argv, message", [
    (["--trace", "{tmp}/t.txt"], "--trace: expected a file name ending in .json or .json.gz"),
    (["--intervals", "{tmp}/t.xlsx"], "--intervals: expected a file name ending in .parquet or .csv"),
    (["--plot", "{tmp}/t.jpg"], "--plot: expected a file name ending in .png"),
    ([], "nothing to write"),
])
def test_bad_outputs_exit_2_with_one_line_and_write_nothing(saved, tmp_path, capsys, argv, message):
    _, directory = saved
    code = main(["trace", str(directory), *[a.format(tmp=tmp_path) for a in argv]])
    err = capsys.readouterr().err
    assert code == 2
    assert message in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert not list(tmp_path.iterdir())


def test_missing_or_foreign_directory_exits_2(tmp_path, capsys):
    assert main(["trace", str(tmp_path / "nowhere"), "--trace", str(tmp_path / "t.json")]) == 2
    assert "no such directory" in capsys.readouterr().err
    (tmp_path / "empty").mkdir()
    assert main(["trace", str(tmp_path / "empty"), "--trace", str(tmp_path / "t.json")]) == 2
    assert "summary.json: missing" in capsys.readouterr().err
    assert not (tmp_path / "t.json").exists()


def test_simulate_output_flags_go_through_the_trace_package(saved, tmp_path):
    # `marssim simulate --out --trace --intervals --plot` hands its result to write_outputs
    import argparse

    from marssim.cli._common import write_outputs

    result, _ = saved
    args = argparse.Namespace(out=str(tmp_path / "res"), trace=str(tmp_path / "t.json"),
                              intervals=str(tmp_path / "iv.csv"), plot=str(tmp_path / "f.png"))
    lines = write_outputs(result, args)
    assert any(line.startswith("trace") and "MiB" in line for line in lines)
    check_faithful(result, tmp_path / "t.json")
    assert (tmp_path / "iv.csv").is_file() and (tmp_path / "f-memory.png").is_file()
    assert (tmp_path / "res" / "intervals.csv").is_file()
