"""What ``--out`` writes: no per-link timeline unless asked for (``--per-link``), large tables
gzip-compressed, and either form read back to the very tables that were saved."""

from __future__ import annotations

import gzip
from pathlib import Path

import pandas as pd
import pytest

from marssim.cli import main
from marssim.results import result as result_module
from marssim.sim import Result
from test_trace_chrome import CASES

EXAMPLE = Path(__file__).resolve().parents[1] / "topologies" / "mappings" / "mars-adaptive-16-resnet50.yaml"


@pytest.fixture(scope="module")
def result():
    return CASES["pipeline-oc"]()


def test_the_link_timeline_is_written_only_when_asked(result, tmp_path):
    result.save(tmp_path / "plain")
    result.save(tmp_path / "links", per_link=True)
    assert not (tmp_path / "plain" / "link_timeline.csv").exists()
    assert (tmp_path / "links" / "link_timeline.csv").exists()
    assert len(result.link_timeline) > 0
    pd.testing.assert_frame_equal(Result.load(tmp_path / "links").link_timeline, result.link_timeline,
                                  check_dtype=False)
    assert len(Result.load(tmp_path / "plain").link_timeline) == 0


def test_large_tables_are_gzipped_and_read_back_exactly(result, tmp_path, monkeypatch):
    n = len(result.intervals)
    monkeypatch.setattr(result_module, "GZIP_ROWS", n - 1)  # the interval log counts as large here
    result.save(tmp_path / "run")
    files = {p.name for p in (tmp_path / "run").iterdir()}
    assert "intervals.csv.gz" in files and "intervals.csv" not in files
    with gzip.open(tmp_path / "run" / "intervals.csv.gz", "rt") as fh:
        assert sum(1 for _ in fh) == n + 1
    back = Result.load(tmp_path / "run")
    pd.testing.assert_frame_equal(back.intervals[list(result.intervals.columns)], result.intervals,
                                  check_dtype=False)
    # the same table, saved twice, gives the same bytes (no time stamp in the gzip header)
    result.save(tmp_path / "again")
    assert (tmp_path / "run" / "intervals.csv.gz").read_bytes() == (tmp_path / "again" / "intervals.csv.gz").read_bytes()


def test_per_link_without_out_is_refused_in_one_line(tmp_path, capsys):
    if not EXAMPLE.is_file():
        pytest.skip("example mapping not shipped")
    assert main(["simulate", "--mapping", str(EXAMPLE), "--per-link"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--per-link" in err and "--out" in err
