"""The interval log as a table on disk: Parquet (with the ``[parquet]`` extra) or CSV.

Columns carry their units in their names. Times are given twice: ``start_us``, ``end_us`` and
``dur_us`` (microseconds, as in the trace; each the double nearest to the exact decimal value)
to read beside a trace, and ``start_s``/``end_s`` (seconds, the log's own values) so that
:func:`import_intervals` gives back ``result.intervals`` bit for bit. ``bytes``, ``flops``,
``energy_j`` (joules, empty/NaN when unknown) and the text columns are the log's.

One call reads either file: ``pandas.read_parquet(path)`` or ``pandas.read_csv(path)``.
"""

from __future__ import annotations

from decimal import Decimal
from pathlib import Path

import numpy as np
import pandas as pd

from marssim.csvio import exact_floats
from marssim.errors import InputError
from marssim.fsutil import atomic_file
from marssim.results.result import INTERVAL_COLUMNS

__all__ = ["export_intervals", "import_intervals", "intervals_table", "TABLE_COLUMNS", "SUFFIXES"]

SUFFIXES = (".parquet", ".csv")

TABLE_COLUMNS = ("kind", "resource", "task", "op", "model", "micro_batch", "start_us", "dur_us", "end_us",
                 "bytes", "flops", "energy_j", "src", "dst", "collective", "collective_id", "links",
                 "start_s", "end_s")
"""Columns of the exported table, in order."""

_RENAMED = {"start": "start_s", "end": "end_s", "energy": "energy_j"}
_TEXT = ("kind", "resource", "op", "model", "src", "dst", "collective", "links")
_INTEGER = ("task", "micro_batch", "collective_id")
_FLOAT = ("start_us", "dur_us", "end_us", "bytes", "flops", "energy_j", "start_s", "end_s")


def intervals_table(result) -> pd.DataFrame:
    """The export table of ``result.intervals``: unit-suffixed columns, times in µs and s."""
    iv = result.intervals
    start = iv["start"].to_numpy(dtype=float)
    end = iv["end"].to_numpy(dtype=float)
    table = iv.rename(columns=_RENAMED).copy()
    table["start_us"] = _seconds_to_us(start)
    table["end_us"] = _seconds_to_us(end)
    table["dur_us"] = _duration_us(start, end)
    return table[list(TABLE_COLUMNS)]


def export_intervals(result, path: str | Path) -> int:
    """Write the interval log to ``path`` (``.parquet`` or ``.csv``) atomically; return its size
    in bytes. Raises InputError for another suffix, or for Parquet without pyarrow."""
    path = Path(path)
    fmt = _format(path)
    table = intervals_table(result)
    if fmt == ".parquet":
        _need_pyarrow(path)
        with atomic_file(path, "wb") as handle:
            table.to_parquet(handle, index=False, engine="pyarrow")
    else:
        with atomic_file(path, "w", encoding="utf-8", newline="") as handle:
            # the shortest repr of each float: exact when read back with float_precision="round_trip"
            table.to_csv(handle, index=False, lineterminator="\n")
    return path.stat().st_size


def import_intervals(path: str | Path) -> pd.DataFrame:
    """Read a file written by :func:`export_intervals` back into the interval log's columns
    (``marssim.results.result.INTERVAL_COLUMNS``, SI units), identical to the one exported."""
    path = Path(path)
    fmt = _format(path)
    if not path.is_file():
        raise InputError(str(path), "", "no such file")
    if fmt == ".parquet":
        _need_pyarrow(path)
        table = pd.read_parquet(path, engine="pyarrow")
    else:
        table = pd.read_csv(path, dtype={c: str for c in _TEXT}, keep_default_na=False,
                            na_values={"energy_j": ["", "nan", "NaN"]}, **exact_floats())
    missing = [c for c in TABLE_COLUMNS if c not in table.columns]
    if missing:
        raise InputError(str(path), "columns", f"missing {', '.join(missing)}; expected a file written by "
                                               f"`marssim trace --intervals` or `marssim simulate --intervals`")
    out = pd.DataFrame({c: table[c] for c in TABLE_COLUMNS}).rename(columns={v: k for k, v in _RENAMED.items()})
    for c in _TEXT:
        out[c] = out[c].astype(str)
    for c in _INTEGER:
        out[c] = out[c].astype(np.int64)
    for c in ("start", "end", "bytes", "flops", "energy"):
        out[c] = out[c].astype(np.float64)
    return out[list(INTERVAL_COLUMNS)].reset_index(drop=True)


def _format(path: Path) -> str:
    for suffix in SUFFIXES:
        if path.name.endswith(suffix):
            return suffix
    raise InputError(str(path), "", f"expected a file name ending in {' or '.join(SUFFIXES)}")


def _need_pyarrow(path: Path) -> None:
    try:
        import pyarrow  # noqa: F401
    except ImportError:
        raise InputError(str(path), "", "Parquet needs pyarrow: pip install 'marssim[parquet]', "
                                        "or write a .csv file") from None


def _seconds_to_us(seconds: np.ndarray) -> np.ndarray:
    """Each time in µs: the double nearest to (the shortest decimal of the seconds) x 10^6, so
    that 1.2345e-05 s reads 12.345 µs, not 12.345000000000001."""
    out = np.empty(seconds.shape[0], dtype=float)
    for i, x in enumerate(seconds.tolist()):
        if x != x or x in (float("inf"), float("-inf")):
            out[i] = x
            continue
        text = repr(x)
        mantissa, _, exponent = text.partition("e")
        out[i] = float(f"{mantissa}e{int(exponent or 0) + 6}")
    return out


def _duration_us(start: np.ndarray, end: np.ndarray) -> np.ndarray:
    """``end - start`` in µs, from the exact decimal difference of the two times."""
    out = np.empty(start.shape[0], dtype=float)
    for i, (s, e) in enumerate(zip(start.tolist(), end.tolist())):
        if s != s or e != e:
            out[i] = float("nan")
            continue
        out[i] = float((Decimal(repr(e)) - Decimal(repr(s))).scaleb(6))
    return out
