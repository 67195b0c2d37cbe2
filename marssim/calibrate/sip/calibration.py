"""Tuned kernel timings as rows of the calibration tables under ``traces/calibration/``.

The columns are those of the calibrated cost model's table format
(``marssim.cost.calibrated``): ``kind, dtype, batch, m, n, k, flops, bytes, device, sms,
driver, cuda, tuning, median_s, spread_s, samples, date, kernel, note``; times in seconds,
``spread_s`` the inter-quartile range, ``date`` ``YYYY-MM-DD``. ``tuning`` is ``none`` for
the compiler's schedule and ``sip`` for the tuned one.

GEMM-class shapes: a GEMM is ``batch=1, m, n, k``; the fused attention forward pass is two GEMMs
per (batch, head) — ``Q K^T`` (``N_CTX x N_CTX x HEAD_DIM``) and ``P V`` (``N_CTX x HEAD_DIM x
N_CTX``), the same FLOPs — written as ``batch = 2 * Z * H, m = n = N_CTX, k = HEAD_DIM`` so
that ``flops = 2 * batch * m * n * k`` holds. ``bytes`` is the compulsory DRAM traffic
(inputs and outputs once).

Writing merges into an existing file: a row with the same device, kind, dtype, shape, kernel and
tuning is replaced; the file is rewritten atomically with a comment line saying where it came
from, so re-running a tune is idempotent.
"""

from __future__ import annotations

import csv
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, fields
from pathlib import Path

from marssim.errors import InputError
from marssim.fsutil import atomic_file

__all__ = ["CalibrationRow", "COLUMNS", "merge_rows", "read_rows", "gemm_class_shape"]

_COMMENT = "# Kernel timings measured by `marssim sip tune` (tuning=none: compiler schedule; tuning=sip: tuned)."


@dataclass(frozen=True, slots=True)
class CalibrationRow:
    """One measured kernel time (see the module docstring)."""

    kind: str
    dtype: str
    batch: int
    m: int
    n: int
    k: int
    flops: float
    bytes: float
    device: str
    sms: int
    driver: str
    cuda: str
    tuning: str
    median_s: float
    spread_s: float
    samples: int
    date: str
    kernel: str = ""
    note: str = ""

    def key(self) -> tuple:
        return (self.device, self.kind, self.dtype, self.batch, self.m, self.n, self.k, self.kernel, self.tuning)


COLUMNS = tuple(f.name for f in fields(CalibrationRow))
_FLOATS = {"flops", "bytes", "median_s", "spread_s"}
_INTS = {"batch", "m", "n", "k", "sms", "samples"}


def gemm_class_shape(kernel: str, shape: Mapping[str, int]) -> dict[str, float | int | str]:
    """``kind, batch, m, n, k, flops, bytes`` of a registered kernel at ``shape`` (fp16)."""
    if kernel.startswith("attention"):
        z, h, n_ctx, d = shape["Z"], shape["H"], shape["N_CTX"], shape["HEAD_DIM"]
        batch, m, n, k = 2 * z * h, n_ctx, n_ctx, d
        traffic = 4 * z * h * n_ctx * d * 2  # Q, K, V read, O written
        kind = "attention"
    else:
        batch, m, n, k = 1, shape["M"], shape["N"], shape["K"]
        traffic = 2 * (m * k + k * n + m * n)
        kind = "gemm"
    return {"kind": kind, "batch": batch, "m": m, "n": n, "k": k, "flops": 2.0 * batch * m * n * k,
            "bytes": float(traffic)}


def read_rows(path: str | Path) -> list[CalibrationRow]:
    """Rows of a calibration CSV written by :func:`merge_rows` (an :class:`InputError` naming
    the line and column on bad data). Comment lines start with ``#``."""
    name = str(path)
    lines = [ln for ln in Path(path).read_text().splitlines() if ln.strip() and not ln.lstrip().startswith("#")]
    reader = csv.DictReader(lines)
    missing = [c for c in COLUMNS if c not in (reader.fieldnames or ())]
    if missing:
        raise InputError(name, "header", f"missing columns: {', '.join(missing)}")
    rows = []
    for i, raw in enumerate(reader):
        values: dict[str, object] = {}
        for col in COLUMNS:
            text = raw.get(col) or ""
            try:
                values[col] = float(text) if col in _FLOATS else int(text) if col in _INTS else text
            except ValueError:
                raise InputError(name, (f"row {i + 1}", col), f"expected a number, got {text!r}") from None
        rows.append(CalibrationRow(**values))  # type: ignore[arg-type]
    return rows


def merge_rows(path: str | Path, new: Iterable[CalibrationRow]) -> list[CalibrationRow]:
    """Add ``new`` rows to the CSV at ``path`` (created if absent), replacing rows with the same
    key; write atomically; return the file's rows."""
    p = Path(path)
    rows = {r.key(): r for r in (read_rows(p) if p.exists() else [])}
    for r in new:
        rows[r.key()] = r
    ordered = sorted(rows.values(), key=lambda r: (r.device, r.kind, r.kernel, r.batch, r.m, r.n, r.k, r.tuning))
    with atomic_file(p, "w", newline="") as fh:
        fh.write(_COMMENT + "\n")
        writer = csv.DictWriter(fh, fieldnames=list(COLUMNS), lineterminator="\n")
        writer.writeheader()
        for r in ordered:
            d = asdict(r)
            for col in ("median_s", "spread_s"):
                d[col] = f"{d[col]:.6e}"
            d["flops"] = f"{r.flops:.0f}"
            d["bytes"] = f"{r.bytes:.0f}"
            writer.writerow(d)
    return ordered
