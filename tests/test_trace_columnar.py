"""The interval log as Parquet/CSV: unit-suffixed columns, one-call reads, exact round trip."""

from __future__ import annotations

import math
import sys
from decimal import Decimal
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from marssim.errors import InputError
from marssim.results.result import INTERVAL_COLUMNS
from marssim.trace import export_intervals, import_intervals, intervals_table
from marssim.trace.columnar import TABLE_COLUMNS
from test_trace_chrome import CASES

FLOATS = ("start", "end", "bytes", "flops", "energy")


def assert_identical(back: pd.DataFrame, original: pd.DataFrame) -> None:
    """Same columns, dtypes and values; floats equal bit for bit (NaN where NaN)."""
    assert list(back.columns) == list(original.columns)
    assert back.dtypes.tolist() == original.dtypes.tolist()
    pd.testing.assert_frame_equal(back, original, check_exact=True)
    for col in FLOATS:
        a = back[col].to_numpy(dtype=float)
        b = original[col].to_numpy(dtype=float)
        assert np.array_equal(np.isnan(a), np.isnan(b))
        ok = ~np.isnan(b)
        assert np.array_equal(a[ok].view(np.int64), b[ok].view(np.int64)), col


@pytest.mark.parametrize("suffix", [".csv", ".parquet"])
@pytest.mark.parametrize("name", sorted(CASES))
def test_round_trip_reproduces_the_log_exactly(name, suffix, tmp_path):
    result = CASES[name]()
    path = tmp_path / f"iv{suffix}"
    size = export_intervals(result, path)
    assert size == path.stat().st_size > 0
    assert_identical(import_intervals(path), result.intervals)


def _frame(starts, durations, energy):
    n = len(starts)
    return pd.DataFrame({
        "kind": ["compute", "transfer"] * (n // 2) + ["compute"] * (n % 2), "resource": ["acc0"] * n,
        "task": np.arange(n, dtype=np.int64), "op": ["conv,1 \"x\""] * n, "model": [""] * n,
        "micro_batch": np.zeros(n, dtype=np.int64), "start": starts, "end": [s + d for s, d in zip(starts, durations)],
        "bytes": [float(i) * 1.1 for i in range(n)], "flops": [1e15 / (i + 3) for i in range(n)],
        "energy": energy, "src": ["acc0"] * n, "dst": ["nan"] * n, "collective": ["NA"] * n,
        "collective_id": np.full(n, -1, dtype=np.int64), "links": ["a->b;b:mem"] * n,
    })[list(INTERVAL_COLUMNS)]


times = st.floats(min_value=0.0, max_value=1e4, allow_nan=False, allow_infinity=False)


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(times, times, st.one_of(st.just(float("nan")), times)), min_size=1, max_size=30))
def test_round_trip_of_awkward_floats_and_texts(tmp_path_factory, rows):
    frame = _frame([r[0] for r in rows], [r[1] for r in rows], [r[2] for r in rows])
    result = SimpleNamespace(intervals=frame)
    tmp = tmp_path_factory.mktemp("awkward")
    for suffix in (".csv", ".parquet"):
        export_intervals(result, tmp / f"x{suffix}")
        assert_identical(import_intervals(tmp / f"x{suffix}"), frame)


def test_unit_columns_hold_microseconds_and_si_units(tmp_path):
    frame = _frame([1.2345e-05, 0.25, 3.0], [2.5e-06, 0.5, 1e-9], [1e-3, float("nan"), 2.0])
    table = intervals_table(SimpleNamespace(intervals=frame))
    assert list(table.columns) == list(TABLE_COLUMNS)
    # the shortest decimal of the seconds, shifted by six places
    assert table["start_us"].tolist() == [12.345, 250000.0, 3000000.0]
    assert table["dur_us"].tolist() == [2.5, 500000.0, 0.001]  # 3 + 1e-9 is 3.000000001 exactly in decimal
    for s, e, su, eu, du in zip(frame["start"], frame["end"], table["start_us"], table["end_us"], table["dur_us"]):
        assert math.isclose(su, s * 1e6, rel_tol=1e-15) and math.isclose(eu, e * 1e6, rel_tol=1e-15)
        # the duration agrees with the stored times to their own precision (one ulp of each)
        exact = float((Decimal(e) - Decimal(s)) * 10**6)
        assert abs(du - exact) <= (math.ulp(e) + math.ulp(s)) * 1e6
    assert table["start_s"].tolist() == frame["start"].tolist()
    assert np.isnan(table["energy_j"].iloc[1]) and table["energy_j"].iloc[2] == 2.0


@pytest.mark.parametrize("suffix, reader", [(".csv", pd.read_csv), (".parquet", pd.read_parquet)])
def test_one_pandas_call_reads_the_file(suffix, reader, tmp_path):
    result = CASES["pipeline-oc"]()
    path = tmp_path / f"iv{suffix}"
    export_intervals(result, path)
    table = reader(path)
    assert list(table.columns) == list(TABLE_COLUMNS)
    assert len(table) == len(result.intervals)
    expected = result.intervals["end"] - result.intervals["start"]
    assert np.allclose(table["dur_us"], expected * 1e6, rtol=1e-9, atol=0)
    assert table["bytes"].sum() == result.intervals["bytes"].sum()


def test_bad_paths_and_files_are_input_errors(tmp_path, monkeypatch):
    result = CASES["spill"]()
    with pytest.raises(InputError, match=r"\.parquet or \.csv"):
        export_intervals(result, tmp_path / "iv.xlsx")
    assert not list(tmp_path.iterdir())
    with pytest.raises(InputError, match="no such file"):
        import_intervals(tmp_path / "missing.csv")
    (tmp_path / "other.csv").write_text("a,b\n1,2\n")
    with pytest.raises(InputError, match="missing kind"):
        import_intervals(tmp_path / "other.csv")
    monkeypatch.setitem(sys.modules, "pyarrow", None)  # as if the [parquet] extra were not installed
    with pytest.raises(InputError, match="pyarrow"):
        export_intervals(result, tmp_path / "iv.parquet")
    assert not (tmp_path / "iv.parquet").exists()
