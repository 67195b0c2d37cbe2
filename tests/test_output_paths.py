"""Every output path is checked before any work: a bad --out, --trace, --plot or --intervals is
refused at once (exit 2, one line), before loading, simulating or searching, and nothing is
written."""

from __future__ import annotations

import time

import pytest

from marssim.cli import main

CASE = ["--system", "ring-8", "--workload", "resnet50:batch=2"]


@pytest.fixture
def a_file(tmp_path):
    path = tmp_path / "existing"
    path.write_text("keep me\n")
    return path


def _refused(argv, capsys, flag, words, monkeypatch):
    """Run ``argv``; it must exit 2 naming ``flag`` and ``words`` without evaluating anything."""
    import marssim.lower

    def no_work(*args, **kwargs):  # any evaluation means the path was checked too late
        raise AssertionError("the run started before its output paths were checked")

    monkeypatch.setattr(marssim.lower, "lower", no_work)
    monkeypatch.setattr("marssim.system.load_system", no_work)
    started = time.perf_counter()
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and flag in err and words in err, err
    assert time.perf_counter() - started < 5


@pytest.mark.parametrize("flag, value, words", [
    ("--trace", "t.txt", "ending in .json or .json.gz"),
    ("--plot", "p.jpg", "ending in .png"),
    ("--intervals", "i.xlsx", "ending in .parquet or .csv"),
])
def test_simulate_refuses_bad_file_names_first(flag, value, words, tmp_path, capsys, monkeypatch):
    _refused(["simulate", *CASE, flag, str(tmp_path / value)], capsys, flag, words, monkeypatch)


def test_a_directory_where_a_file_is_expected_is_refused(tmp_path, capsys, monkeypatch):
    target = tmp_path / "trace.json"
    target.mkdir()
    _refused(["simulate", *CASE, "--trace", str(target)], capsys, "--trace", "is a directory", monkeypatch)


@pytest.mark.parametrize("verb", [["simulate", *CASE], ["demo"], ["search", *CASE], ["validate", *CASE]])
def test_an_existing_file_as_output_directory_is_refused(verb, a_file, capsys, monkeypatch):
    _refused([*verb, "--out", str(a_file)], capsys, "--out", "is not a directory", monkeypatch)
    assert a_file.read_text() == "keep me\n"


def test_a_file_in_the_way_of_the_output_path_is_refused(a_file, capsys, monkeypatch):
    _refused(["simulate", *CASE, "--trace", str(a_file / "t.json")], capsys, "--trace", "is a file, not a directory",
             monkeypatch)


def test_the_trace_verb_checks_before_reading(tmp_path, capsys, monkeypatch):
    assert main(["trace", str(tmp_path / "missing"), "--plot", str(tmp_path / "p.jpg")]) == 2
    assert "--plot" in capsys.readouterr().err
