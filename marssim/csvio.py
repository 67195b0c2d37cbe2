"""Read CSV tables with floats parsed exactly (so a write then read gives the same bits), and the
measured tables shipped under ``traces/``: ``#`` comment lines (provenance), a header, rows."""

from __future__ import annotations

import csv
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from marssim.errors import InputError
from marssim.fsutil import atomic_file
from marssim.lazymodule import lazy_module

pd = lazy_module("pandas")  # imported when a table is first built

__all__ = ["read_csv_exact", "exact_floats", "read_commented_table", "write_commented_table"]


def exact_floats() -> dict[str, str]:
    """Keyword options for :func:`pandas.read_csv` that make float parsing exact: pandas >= 3.1
    always parses exactly (and deprecates the option); older versions need
    ``float_precision="round_trip"``."""
    major, minor = (int(x) for x in pd.__version__.split(".")[:2])
    return {} if (major, minor) >= (3, 1) else {"float_precision": "round_trip"}


def read_csv_exact(path: str | Path, **kwargs: Any) -> pd.DataFrame:
    """:func:`pandas.read_csv` with exact float parsing; ``kwargs`` go to it unchanged."""
    return pd.read_csv(path, **exact_floats(), **kwargs)


def write_commented_table(path: str | Path, columns: Sequence[str], rows: Iterable[Sequence[Any]],
                          comments: Sequence[str]) -> None:
    """Write a table atomically: ``comments`` first (``# `` prepended where missing), the header
    ``columns``, then ``rows`` (cells already formatted, or values ``str()`` gives)."""
    with atomic_file(Path(path), "w", newline="") as fh:
        for line in comments:
            fh.write((line if line.startswith("#") else f"# {line}") + "\n")
        w = csv.writer(fh, lineterminator="\n")
        w.writerow(columns)
        w.writerows(rows)


def read_commented_table(path: str | Path, columns: Sequence[str], what: str) -> list[tuple[int, dict[str, str]]]:
    """The rows of a table written by :func:`write_commented_table` as ``(line number, cells by
    column)``; blank and ``#`` lines skipped. ``what`` names the table in errors: an
    :class:`~marssim.errors.InputError` names the file (and line) when it cannot be read or lacks
    one of ``columns``."""
    name = str(path)
    from marssim.limits import MAX_CSV_BYTES, check_file_size

    check_file_size(path, MAX_CSV_BYTES, what)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as err:
        raise InputError(name, "", f"cannot read {what}: {err.strerror or err}") from None
    except UnicodeDecodeError as err:
        raise InputError(name, "", f"not a text file (byte {err.start:,} is not UTF-8); expected {what}") from None
    lines = [(i + 1, ln) for i, ln in enumerate(text.splitlines()) if ln.strip() and not ln.lstrip().startswith("#")]
    if not lines:
        raise InputError(name, "", f"expected a header with the columns {', '.join(columns)}")
    header = [h.strip() for h in next(csv.reader([lines[0][1]]))]
    missing = [c for c in columns if c not in header]
    if missing:
        raise InputError(name, f"line {lines[0][0]}", f"missing columns: {', '.join(missing)}")
    return [(lineno, dict(zip(header, next(csv.reader([ln]))))) for lineno, ln in lines[1:]]
