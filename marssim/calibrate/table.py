"""Measured kernel timings as rows of the calibration tables under ``traces/calibration/``.

Shared by the measurement harness (``marssim calibrate measure``) and the SIP tuner
(``marssim sip tune``). The columns are those of the calibrated cost model's table format
(:mod:`marssim.cost.calibrated`): ``kind, dtype, batch, m, n, k, flops, bytes, device, sms,
driver, cuda, tuning, median_s, spread_s, samples, date, kernel, phase, backend``, the
convolution geometry ``conv_c ... conv_groups`` and ``note``; times in seconds, ``spread_s`` the
inter-quartile range, ``date`` ``YYYY-MM-DD``. Tables written before the optional columns
existed are read as they are (the columns empty) and written back with them.

Writing merges into an existing file: a row with the same device, kind, dtype, shape, flops,
bytes, convolution geometry, phase, kernel, backend, tuning and software stack is replaced; the file is
rewritten atomically. Comment lines (``#``)
already in the file are kept and a new one is added when it differs from all of them, so a
table measured in several runs keeps one provenance line per run. Re-running is idempotent.

:func:`short_device_name` turns the name a GPU reports (``NVIDIA H100 80GB HBM3``) into the
name designs use in ``gpu.calibration`` (``H100``), and so the table's file name.
"""

from __future__ import annotations

import csv
import re
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

from marssim.cost.calibrated import (
    CONV_COLUMNS, OPTIONAL_COLUMNS, PHASES, REQUIRED_COLUMNS, KernelTiming, conv_cells,
    parse_conv_cells, row_stack,
)
from marssim.cost.features import attention_geometry
from marssim.errors import InputError
from marssim.fsutil import atomic_file

__all__ = ["CalibrationRow", "COLUMNS", "row_key", "merge_rows", "read_rows", "read_comments", "short_device_name",
           "format_note", "parse_note"]


CalibrationRow = KernelTiming
"""A row of a calibration table: the calibrated cost model's :class:`KernelTiming` (its
``source``, where a row was read from, is not written)."""

COLUMNS = REQUIRED_COLUMNS + OPTIONAL_COLUMNS


def row_key(row: KernelTiming) -> tuple:
    """What makes two rows the same measurement (a later one replaces an earlier one); a fused
    attention row's heads, key/value heads and cache type
    (:func:`~marssim.cost.calibrated.attention_geometry`) tell apart kernels of equal shape and
    bytes."""
    return (row.device, row.kind, row.dtype, row.batch, row.m, row.n, row.k, round(row.flops), round(row.bytes),
            row.conv.key if row.conv is not None else (), row.phase, row.kernel, row.backend, row.tuning, row.stack,
            attention_geometry(row.kind, row.backend, row.note, row.dtype))


_FLOATS = {"flops", "bytes", "median_s", "spread_s"}
_INTS = {"batch", "m", "n", "k", "sms", "samples"}


def short_device_name(name: str) -> str:
    """``NVIDIA H100 80GB HBM3`` -> ``H100``; ``NVIDIA H200`` -> ``H200``; ``NVIDIA A100-SXM4-80GB``
    -> ``A100``; ``Tesla V100-SXM2-16GB`` -> ``V100``; ``NVIDIA GeForce RTX 4090`` -> ``RTX4090``.
    The first token with a letter followed by digits, vendor and product-line words dropped; the
    whole name (spaces removed) when no token looks like a model number."""
    words = [w for w in re.split(r"[\s_]+", name.strip()) if w]
    drop = {"nvidia", "tesla", "geforce", "quadro", "amd", "radeon", "instinct"}
    words = [w for w in words if w.lower() not in drop]
    for i, w in enumerate(words):
        head = w.split("-")[0]
        if re.fullmatch(r"[A-Za-z]+\d+[A-Za-z]*", head):
            if i > 0 and words[i - 1].isalpha() and words[i - 1].isupper() and len(words[i - 1]) <= 3:
                return words[i - 1] + head  # RTX 4090 -> RTX4090
            return head
        if head.isdigit() and i > 0 and words[i - 1].isalpha():
            return words[i - 1] + head
    return "".join(words) or "gpu"


def format_note(fields_: Mapping[str, object]) -> str:
    """``key=value`` pairs joined by ``; `` (values must not contain ``;``), for the ``note``
    column: the harness records the GPU's full name, clocks and library versions there."""
    parts = []
    for key, value in fields_.items():
        text = str(value)
        if ";" in text or "=" in key or ";" in key:
            raise ValueError(f"note field {key}={text!r} must not contain ';'")
        parts.append(f"{key}={text}")
    return "; ".join(parts)


def parse_note(note: str) -> dict[str, str]:
    """Inverse of :func:`format_note` (free text without ``=`` is returned under ``""``)."""
    out: dict[str, str] = {}
    for part in note.split(";"):
        part = part.strip()
        if not part:
            continue
        key, sep, value = part.partition("=")
        if sep:
            out[key.strip()] = value.strip()
        else:
            out[""] = (out.get("", "") + " " + part).strip()
    return out


def read_comments(path: str | Path) -> list[str]:
    """The comment lines (``#`` ...) of a table, in order."""
    return [ln.rstrip() for ln in Path(path).read_text(encoding="utf-8-sig").splitlines()
            if ln.lstrip().startswith("#")]


def read_rows(path: str | Path) -> list[CalibrationRow]:
    """Rows of a calibration CSV written by :func:`merge_rows` (an :class:`InputError` naming
    the line and column on bad data). Comment lines start with ``#``. For the full schema check
    use :func:`marssim.cost.calibrated.load_table`."""
    name = str(path)
    from marssim.limits import MAX_CSV_BYTES, check_file_size

    check_file_size(path, MAX_CSV_BYTES, "a calibration table")
    numbered = [(i + 1, ln) for i, ln in enumerate(Path(path).read_text(encoding="utf-8-sig").splitlines())
                if ln.strip() and not ln.lstrip().startswith("#")]
    if not numbered:
        raise InputError(name, "header", f"expected a header line with the columns {', '.join(COLUMNS)}")
    reader = csv.DictReader([ln for _, ln in numbered])
    missing = [c for c in REQUIRED_COLUMNS if c not in (reader.fieldnames or ())]
    if missing:
        raise InputError(name, f"line {numbered[0][0]}", f"missing columns: {', '.join(missing)}")
    rows = []
    plain = [c for c in COLUMNS if c not in CONV_COLUMNS]
    for (lineno, _), raw in zip(numbered[1:], reader):
        values: dict[str, object] = {}
        for col in plain:
            text = (raw.get(col) or "").strip()
            try:
                values[col] = float(text) if col in _FLOATS else int(text) if col in _INTS else text
            except ValueError:
                raise InputError(name, f"line {lineno}: {col}", f"expected a number, got {text!r}") from None
        values["phase"] = values["phase"] or "fwd"
        values["stack"] = row_stack(str(values["stack"]), str(values["note"]))
        if values["phase"] not in PHASES:
            raise InputError(name, f"line {lineno}: phase", f"expected one of {', '.join(PHASES)}, "
                                                            f"got {values['phase']!r}")
        try:
            values["conv"] = parse_conv_cells(raw)
        except ValueError as err:
            column, message = err.args
            raise InputError(name, f"line {lineno}: {column}", message) from None
        rows.append(CalibrationRow(**values))  # type: ignore[arg-type]
    return rows


def _sort_key(r: CalibrationRow) -> tuple:
    return (r.device, r.stack, r.kind, r.dtype, r.kernel, r.batch, r.m, r.n, r.k, r.flops, r.bytes,
            r.conv.key if r.conv is not None else (), r.phase, r.backend, r.tuning)


def merge_rows(path: str | Path, new: Iterable[CalibrationRow], comment: str = "", *,
               replace_all: bool = False, comments: Sequence[str] | None = None) -> list[CalibrationRow]:
    """Add ``new`` rows to the CSV at ``path`` (created if absent), replacing rows with the same
    :func:`row_key` (with ``replace_all``, the file's rows are dropped and ``new`` is the whole
    table); keep the file's comment lines (or start from ``comments``) and add ``comment`` (one
    line, ``# `` prepended when missing) unless already there; write atomically; return the
    rows."""
    p = Path(path)
    existing = read_rows(p) if p.exists() and not replace_all else []
    comments = list(comments) if comments is not None else read_comments(p) if p.exists() else []
    if comment:
        line = comment if comment.startswith("#") else f"# {comment}"
        if "\n" in line:
            raise ValueError("a table comment is one line")
        if line not in comments:
            comments.append(line)
    rows = {row_key(r): r for r in existing}
    for r in new:
        rows[row_key(r)] = r
    ordered = sorted(rows.values(), key=_sort_key)
    with atomic_file(p, "w", newline="") as fh:
        for line in comments:
            fh.write(line + "\n")
        writer = csv.DictWriter(fh, fieldnames=list(COLUMNS), lineterminator="\n")
        writer.writeheader()
        for r in ordered:
            d = {col: getattr(r, col) for col in COLUMNS if col not in CONV_COLUMNS}
            d.update(conv_cells(r.conv))
            for col in ("median_s", "spread_s"):
                d[col] = f"{d[col]:.6e}"
            d["flops"] = f"{r.flops:.0f}"
            d["bytes"] = f"{r.bytes:.0f}"
            writer.writerow(d)
    return ordered
