"""The cost model's fits kept on disk (marssim.cost.fitcache): read back bit for bit what the fit
computes in memory, keyed by the rows' content, and never consulted when turned off."""

from __future__ import annotations

import numpy as np
import pytest

from marssim.cost import calibrated, fitcache, model
from marssim.cost.calibrated import KernelTable, fit, load_table

pytestmark = pytest.mark.filterwarnings("ignore")


@pytest.fixture()
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("MARSSIM_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("MARSSIM_NO_FIT_CACHE", raising=False)
    monkeypatch.setattr(model, "_SHARED_FITS", {})  # no in-process sharing: every fit goes to disk
    return tmp_path


def _rows():
    """A small table: the A100 table's first GEMM group and first streaming group."""
    table = load_table(calibrated.calibration_dir() / "A100.csv")
    groups = table.groups()
    gemm = next(rows for key, rows in groups.items() if key[1] == "gemm" and len(rows) >= 8)
    stream = next(rows for key, rows in groups.items() if key[1] not in calibrated.GEMM_KINDS and len(rows) >= 4)
    return list(gemm) + list(stream)


def _assert_identical(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for key in a:
        x, y = a[key], b[key]
        assert x == y  # params, counts and errors, compared as floats
        assert x.params == y.params
        assert (x.correction is None) == (y.correction is None)
        if x.correction is not None:
            assert np.array_equal(x.correction.points, y.correction.points)
            assert np.array_equal(x.correction.residuals, y.correction.residuals)
            assert x.correction.describe() == y.correction.describe()


def test_disk_fit_is_the_in_memory_fit(cache, monkeypatch):
    rows = _rows()
    device = rows[0].device.lower()
    peaks = {"bf16": 312e12, "fp16": 312e12}
    cost = model.DataflowCost(calibration=KernelTable(rows))
    first = cost._fitted(device, peaks, None)
    stored = list((cache / "fits").glob("*.pickle"))
    assert len(stored) == 1
    in_memory = fit(KernelTable(cost._device_rows(device, None)), peaks=peaks)
    _assert_identical(first, in_memory)

    def refuse(*a, **k):
        raise AssertionError("fitted again instead of reading the stored fit")

    monkeypatch.setattr(model, "fit", refuse)
    again = model.DataflowCost(calibration=KernelTable(rows))._fitted(device, peaks, None)
    _assert_identical(again, in_memory)
    shapes = np.array([64, 512, 4096])
    for key, f in again.items():
        assert np.array_equal(calibrated.predict(f, key[1], m=shapes, n=shapes, k=shapes, nbytes=shapes * 1e3),
                              calibrated.predict(in_memory[key], key[1], m=shapes, n=shapes, k=shapes,
                                                 nbytes=shapes * 1e3))


def test_key_follows_the_rows_content_and_the_peaks():
    rows = _rows()
    key = fitcache.fit_key(rows, None, "a100", None)
    assert key == fitcache.fit_key(list(rows), None, "a100", None)
    moved = [calibrated.KernelTiming(**{**{f: getattr(r, f) for f in r.__dataclass_fields__}, "source": "x:1"})
             for r in rows]
    assert fitcache.fit_key(moved, None, "a100", None) == key  # the file's place is not part of the content
    changed = list(rows)
    r = changed[0]
    changed[0] = calibrated.KernelTiming(**{**{f: getattr(r, f) for f in r.__dataclass_fields__},
                                            "median_s": r.median_s * 1.01})
    assert fitcache.fit_key(changed, None, "a100", None) != key
    assert fitcache.fit_key(rows, {"bf16": 1e15}, "a100", None) != key
    assert fitcache.fit_key(rows[1:], None, "a100", None) != key


def test_turned_off_neither_reads_nor_writes(cache, monkeypatch):
    monkeypatch.setenv("MARSSIM_NO_FIT_CACHE", "1")
    rows = _rows()
    model.DataflowCost(calibration=KernelTable(rows))._fitted(rows[0].device.lower(), None, None)
    assert not (cache / "fits").exists()


def test_unreadable_entry_is_recomputed(cache):
    rows = _rows()
    device = rows[0].device.lower()
    fitted_rows = model.DataflowCost(calibration=KernelTable(rows))._device_rows(device, None)
    key = fitcache.fit_key(fitted_rows, None, device, None)
    (cache / "fits").mkdir()
    (cache / "fits" / f"{fitcache.entry_name('fit', key)}.pickle").write_bytes(b"not a pickle")
    got = model.DataflowCost(calibration=KernelTable(rows))._fitted(device, None, None)
    _assert_identical(got, fit(KernelTable(rows), peaks=None))


def test_cached_table_is_the_parsed_table(cache, monkeypatch):
    path = calibrated.calibration_dir() / "A100.csv"
    first = fitcache.cached_table(path, load_table)
    assert len(list((cache / "fits").glob("table-*.pickle"))) == 1

    def refuse(p):
        raise AssertionError("parsed again instead of reading the stored table")

    again = fitcache.cached_table(path, refuse)
    parsed = load_table(path)
    assert again.rows == parsed.rows == first.rows
    assert again.files == parsed.files


def _small_tables(folder):
    """A folder holding one table: the rows of :func:`_rows` as they stand in A100.csv."""
    path = calibrated.calibration_dir() / "A100.csv"
    lines = path.read_text(encoding="utf-8-sig").splitlines(keepends=True)
    header = next(line for line in lines if not line.startswith("#"))
    wanted = sorted({int(r.source.rsplit(":", 1)[1]) for r in _rows()})
    folder.mkdir()
    (folder / "A100.csv").write_text(header + "".join(lines[i - 1] for i in wanted))
    return folder


def _op_times(cost):
    from marssim.system import load_system
    from marssim.workload import load_workload

    design = next(iter(load_system("dgx-a100-cluster:nodes=1").designs.values()))
    graph = load_workload("gpt:layers=1,hidden=512,heads=8,vocab=1024,seq=256,max_positions=256,batch=2")
    return [cost.op_cost(op, design) for op in graph.ops]


def test_design_tables_come_back_without_the_rows(cache, monkeypatch, tmp_path):
    source = _small_tables(tmp_path / "tables")
    monkeypatch.setattr(model, "_SHARED_TABLES", {})
    first = _op_times(model.DataflowCost(calibration=source))
    assert {c.model for c in first} >= {"measured", "fitted"}  # measured shapes and curves both read back
    assert len(list((cache / "fits").glob("design-*.pickle"))) == 1

    def refuse(*a, **k):
        raise AssertionError("the table's rows were read instead of the stored design tables")

    monkeypatch.setattr(model, "_SHARED_TABLES", {})  # as in a new process
    monkeypatch.setattr(model, "_SHARED_FITS", {})
    monkeypatch.setattr(model.DataflowCost, "_load_table", refuse)
    again = _op_times(model.DataflowCost(calibration=source))
    assert [(c.time, c.model) for c in again] == [(c.time, c.model) for c in first]  # bit for bit


def test_design_tables_key_follows_the_tables_bytes(tmp_path):
    source = _small_tables(tmp_path / "tables")
    args = ("a100", {"bf16": 312e12}, None, ("vendor",))
    key = fitcache.design_tables_key(source, *args)
    assert fitcache.design_tables_key(_small_tables(tmp_path / "moved"), *args) == key  # the folder is no part
    assert fitcache.design_tables_key(source, "a100", {"bf16": 1e15}, None, ("vendor",)) != key
    assert fitcache.design_tables_key(source, "a100", {"bf16": 312e12}, "other-stack", ("vendor",)) != key
    table = source / "A100.csv"
    text = table.read_text()
    table.write_text(text.replace("e-0", "e-1", 1))
    assert fitcache.design_tables_key(source, *args) != key
    table.write_text(text)
    assert fitcache.design_tables_key(source, *args) == key
    (source / "B.csv").write_text(text)  # another table beside it: the rows a design reads may change
    assert fitcache.design_tables_key(source, *args) != key
    assert fitcache.design_tables_key(tmp_path / "missing", *args) is None


def test_keys_follow_the_cost_code(monkeypatch):
    """An entry written by other code of the cost package is not read: its source is in every key."""
    rows = _rows()
    source = calibrated.calibration_dir()
    keys = (fitcache.fit_key(rows, None, "a100", None),
            fitcache.design_tables_key(source, "a100", None, None, ("vendor",)))
    monkeypatch.setattr(fitcache, "_CODE", ["another version of the code"])
    assert fitcache.fit_key(rows, None, "a100", None) != keys[0]
    assert fitcache.design_tables_key(source, "a100", None, None, ("vendor",)) != keys[1]
    monkeypatch.setattr(fitcache, "_CODE", [])
    assert (fitcache.fit_key(rows, None, "a100", None),
            fitcache.design_tables_key(source, "a100", None, None, ("vendor",))) == keys  # recomputed alike


def test_entries_other_code_wrote_are_removed_once_unused(cache, monkeypatch):
    """Writing an entry removes the entries of its kind that other code wrote and nothing read for
    a month; a recent one of another version (a second install sharing the folder) is kept, and so
    are this version's entries and entries of other kinds."""
    import os
    import time

    folder = cache / "fits"
    folder.mkdir()
    mine = fitcache.entry_name("table", "")
    other = fitcache.entry_name("table", "").replace(fitcache.code_digest()[:12], "0" * 12)
    old_other, recent_other = folder / f"{other}aaa.pickle", folder / f"{other}bbb.pickle"
    old_mine, old_design = folder / f"{mine}ccc.pickle", folder / f"design-{'0' * 12}-ddd.pickle"
    collective = folder / f"{'e' * 64}.pickle"
    month = time.time() - fitcache.STALE_AFTER_S - 10
    for path in (old_other, recent_other, old_mine, old_design, collective):
        path.write_bytes(b"x")
    for path in (old_other, old_mine, old_design, collective):
        os.utime(path, (month, month))
    fitcache.cached_table(calibrated.calibration_dir() / "A100.csv", load_table)
    assert not old_other.exists()  # the table kind, other code, unused for a month
    assert recent_other.exists() and old_mine.exists()
    assert old_design.exists() and collective.exists()  # another kind; the collectives' entries
    assert len(list(folder.glob(f"{mine}*.pickle"))) == 2  # the one written, and the old one of this code


def test_a_read_marks_the_entry_used(cache):
    from marssim.cachedir import read_entry, write_entry

    write_entry("fits", "probe", {"a": 1})
    path = cache / "fits" / "probe.pickle"
    import os

    os.utime(path, (1_000_000, 1_000_000))
    assert read_entry("fits", "probe") == {"a": 1}
    assert path.stat().st_mtime > 1_000_000
