"""Tuned kernel timings as rows of the calibration tables under ``traces/calibration/``.

One row per (kernel, shape, device, tuning): ``tuning`` is ``none`` for the compiler's schedule
and ``sip`` for the tuned one. Columns (times in seconds, SI):

``kind`` (gemm, attention), ``kernel``, ``shape`` (``M=512;N=512;K=2048``), ``dtype``,
``device``, ``driver``, ``cuda``, ``tuning``, ``median_s``, ``spread`` (inter-quartile range
over the median), ``samples`` (timed launches), ``flops``, ``date`` (UTC, ISO 8601),
``schedule`` (the schedule file a ``sip`` row came from).

Writing merges into an existing file: a row with the same kernel, shape, device and tuning is
replaced, the file is rewritten atomically and its rows are sorted, so re-running a tune is
idempotent.
"""

from __future__ import annotations

import csv
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, fields
from pathlib import Path

from marssim.errors import InputError
from marssim.fsutil import atomic_file

__all__ = ["CalibrationRow", "COLUMNS", "merge_rows", "read_rows", "shape_text"]


@dataclass(frozen=True, slots=True)
class CalibrationRow:
    """One measured kernel time."""

    kind: str
    kernel: str
    shape: str
    dtype: str
    device: str
    driver: str
    cuda: str
    tuning: str
    median_s: float
    spread: float
    samples: int
    flops: float
    date: str
    schedule: str = ""

    def key(self) -> tuple[str, str, str, str]:
        return (self.kernel, self.shape, self.device, self.tuning)


COLUMNS = tuple(f.name for f in fields(CalibrationRow))
_FLOATS = {"median_s", "spread", "flops"}
_INTS = {"samples"}


def shape_text(shape: Mapping[str, int]) -> str:
    """``{"M": 512, "N": 512}`` -> ``"M=512;N=512"`` (keys in the given order)."""
    return ";".join(f"{k}={v}" for k, v in shape.items())


def read_rows(path: str | Path) -> list[CalibrationRow]:
    """Rows of an existing calibration CSV (an :class:`InputError` naming the row on bad data)."""
    rows = []
    with open(path, newline="") as fh:
        reader = csv.DictReader(fh)
        missing = [c for c in COLUMNS if c != "schedule" and c not in (reader.fieldnames or ())]
        if missing:
            raise InputError(str(path), "columns", f"missing {', '.join(missing)}")
        for i, raw in enumerate(reader):
            values = {}
            for name in COLUMNS:
                text = raw.get(name) or ""
                try:
                    values[name] = float(text) if name in _FLOATS else int(text) if name in _INTS else text
                except ValueError:
                    raise InputError(str(path), (f"row {i + 2}", name), f"expected a number, got {text!r}") from None
            rows.append(CalibrationRow(**values))
    return rows


def merge_rows(path: str | Path, new: Iterable[CalibrationRow]) -> list[CalibrationRow]:
    """Add ``new`` rows to the CSV at ``path`` (created if absent), replacing rows with the same
    key; write atomically; return the file's rows."""
    p = Path(path)
    rows = {r.key(): r for r in (read_rows(p) if p.exists() else [])}
    for r in new:
        rows[r.key()] = r
    ordered = sorted(rows.values(), key=lambda r: (r.kind, r.kernel, r.shape, r.device, r.tuning))
    with atomic_file(p, "w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(COLUMNS), lineterminator="\n")
        writer.writeheader()
        for r in ordered:
            d = asdict(r)
            d["median_s"] = f"{r.median_s:.6e}"
            d["spread"] = f"{r.spread:.4f}"
            d["flops"] = f"{r.flops:.6e}"
            writer.writerow(d)
    return ordered
