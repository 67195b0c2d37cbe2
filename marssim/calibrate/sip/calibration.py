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

Rows are :class:`marssim.calibrate.table.CalibrationRow` values, read and merged by
:mod:`marssim.calibrate.table` (shared with the measurement harness); re-running a tune replaces
its rows, so it is idempotent.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path

from marssim.calibrate.table import COLUMNS, CalibrationRow, read_rows
from marssim.calibrate.table import merge_rows as _merge_rows

__all__ = ["CalibrationRow", "COLUMNS", "merge_rows", "read_rows", "gemm_class_shape"]

_COMMENT = "# Kernel timings measured by `marssim sip tune` (tuning=none: compiler schedule; tuning=sip: tuned)."


def gemm_class_shape(kernel: str, shape: Mapping[str, int], elem_bytes: int = 2) -> dict[str, float | int | str]:
    """``kind, batch, m, n, k, flops, bytes`` of a registered kernel at ``shape`` (``elem_bytes``
    per element: 2 for fp16)."""
    if kernel.startswith("attention"):
        z, h, n_ctx, d = shape["Z"], shape["H"], shape["N_CTX"], shape["HEAD_DIM"]
        batch, m, n, k = 2 * z * h, n_ctx, n_ctx, d
        traffic = 4 * z * h * n_ctx * d * elem_bytes  # Q, K, V read, O written
        kind = "attention"
    else:
        batch, m, n, k = 1, shape["M"], shape["N"], shape["K"]
        traffic = elem_bytes * (m * k + k * n + m * n)
        kind = "gemm"
    return {"kind": kind, "batch": batch, "m": m, "n": n, "k": k, "flops": 2.0 * batch * m * n * k,
            "bytes": float(traffic)}


def merge_rows(path: str | Path, new: Iterable[CalibrationRow]) -> list[CalibrationRow]:
    """Merge tuned timings into the CSV at ``path`` (see :func:`marssim.calibrate.table.merge_rows`),
    adding the line that says they come from ``marssim sip tune``."""
    return _merge_rows(path, new, comment=_COMMENT)
