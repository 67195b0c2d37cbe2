"""The cost model's fitted curves kept on disk: a table's fit (:func:`marssim.cost.calibrated.fit`,
seconds of least squares and leave-one-out per GPU) is computed once per table and read back by
every later process.

An entry is keyed by what the fit reads and the code that computes it: every field of the rows
fitted (their file name and line excepted, so a moved install hits the same entry), the device's
peaks, :data:`FIT_VERSION` (raise it whenever a change to the fitting code changes what it
computes), the source of the cost package itself (:func:`code_digest`: an upgrade never reads an
entry another version wrote) and the numpy and scipy versions. It holds the pickled fits, which are the very objects
the fit returned (the same floats, bit for bit). The entries live in ``fits/`` of
:func:`marssim.cachedir.user_cache_dir`; ``MARSSIM_NO_FIT_CACHE=1`` turns the cache off. Parsed
calibration tables are kept beside them (:func:`cached_table`, keyed by the file's name and
bytes), so that a later process neither parses nor fits; and what a GPU design reads of them (its
fits, measured medians and fused attention grid, :class:`DesignTables`), keyed by the bytes of every
table file with the design's table name, stack and peaks, so that a later process does not even read
the tables' rows. Writing an entry removes the entries of its kind that other code wrote
and no process has read for a month (:func:`entry_name`, :data:`STALE_AFTER_S`), so that upgrades
do not pile up tables no version reads again. The cache
is best effort: an entry that cannot be read or written is recomputed, never an error."""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from marssim.cachedir import entries_enabled, read_entry, user_cache_dir, write_entry

__all__ = ["FIT_VERSION", "ENTRY_KINDS", "DesignTables", "cached_table", "code_digest", "design_tables_key",
           "entry_name", "fit_key", "load_design_tables", "STALE_AFTER_S",
           "load_fits", "store_design_tables", "store_fits"]

FIT_VERSION = 1
"""The version of the fitting code (:mod:`.calibrated`'s fit, :mod:`.residual`'s correction):
raise it with any change to what they compute, so that no stale entry is read."""

_ROW_FIELDS: tuple[str, ...] | None = None
_CODE: list[str] = []


def code_digest() -> str:
    """The hex SHA-256 of the source of every module of :mod:`marssim.cost` (their file names and
    bytes): part of every key here, so that an entry computed, or pickled, by other code -- a
    fit, a parsed row's class, an attention grid's layout -- is never read back after an upgrade."""
    if not _CODE:
        h = hashlib.sha256()
        for path in sorted(Path(__file__).resolve().parent.glob("*.py")):
            h.update(path.name.encode() + b"\0")
            h.update(hashlib.sha256(path.read_bytes()).digest())
        _CODE.append(h.hexdigest())
    return _CODE[0]


@dataclass(frozen=True)
class DesignTables:
    """What one GPU design reads from the calibration tables: the fits by (kind, dtype)
    (:class:`~.calibrated.KernelFit`), the measured median (s) of each kernel shape by shape code
    (:meth:`~.model.DataflowCost.measured_for`) and the measured fused attention kernels
    (:class:`~.attention_grid.AttentionGrid`)."""

    fits: dict
    measured: dict
    attention: Any


def fit_key(rows: Sequence, peaks: dict[str, float] | None, device: str, stack: str | None) -> str:
    """The hex SHA-256 naming the fit of ``rows`` (KernelTiming) of ``device`` and ``stack``
    under ``peaks`` (FLOP/s by dtype) by this code and these numpy and scipy versions."""
    import numpy
    import scipy

    global _ROW_FIELDS
    if _ROW_FIELDS is None and rows:
        _ROW_FIELDS = tuple(f.name for f in dataclasses.fields(rows[0]) if f.name != "source")
    h = hashlib.sha256()
    h.update(repr((FIT_VERSION, code_digest(), numpy.__version__, scipy.__version__, device, stack,
                   sorted((peaks or {}).items()))).encode())
    for r in rows:
        h.update(repr(tuple(getattr(r, f) for f in _ROW_FIELDS)).encode())
        h.update(b"\n")
    return h.hexdigest()


def design_tables_key(source: Path, device: str, peaks: dict[str, float] | None, stack,
                      tuning: Sequence[str]) -> str | None:
    """The hex SHA-256 naming the :class:`DesignTables` of table ``device`` and ``stack`` under
    ``peaks`` and ``tuning`` read from ``source`` (a directory of ``*.csv`` or one file): every
    table's file name and bytes, the device's settings, :data:`FIT_VERSION` and the numpy and
    scipy versions (the fits'); None when no table can be read."""
    import numpy
    import scipy

    paths = sorted(source.glob("*.csv")) if source.is_dir() else [source] if source.is_file() else []
    h = hashlib.sha256(repr(("design-tables", FIT_VERSION, code_digest(), numpy.__version__, scipy.__version__,
                             device, stack, sorted((peaks or {}).items()), tuple(tuning))).encode())
    try:
        for path in paths:
            h.update(path.name.encode() + b"\0")
            h.update(hashlib.sha256(path.read_bytes()).digest())
    except OSError:
        return None
    return h.hexdigest() if paths else None


def load_design_tables(key: str) -> DesignTables | None:
    """The :class:`DesignTables` kept under ``key``, or None."""
    got = read_entry("fits", entry_name("design", key))
    return got if isinstance(got, DesignTables) else None


def store_design_tables(key: str, tables: DesignTables) -> None:
    """Keep ``tables`` under ``key`` (best effort, as :func:`store_fits`)."""
    _store("design", key, tables)


def load_fits(key: str) -> dict | None:
    """The fits stored under ``key``, or None (no entry, or one that cannot be read)."""
    got = read_entry("fits", entry_name("fit", key))
    return got if isinstance(got, dict) else None


def store_fits(key: str, fits: dict) -> None:
    """Keep ``fits`` under ``key`` (atomically: a reader sees the whole entry or none); a folder
    that cannot be written is passed over."""
    _store("fit", key, fits)


def cached_table(path: str | Path, load):
    """``load(path)`` (a calibration table's parse, :func:`marssim.cost.calibrated.load_table`),
    read from the cache when this file's name and bytes were parsed before by this code (a table
    that does not parse raises as ``load`` does, and is not kept)."""
    if not entries_enabled():
        return load(path)
    try:
        data = Path(path).read_bytes()
    except OSError:
        return load(path)  # its own error
    h = hashlib.sha256(repr((FIT_VERSION, code_digest(), str(path))).encode())
    h.update(data)
    got = read_entry("fits", entry_name("table", h.hexdigest()))
    if got is not None and hasattr(got, "rows"):
        return got
    table = load(path)
    _store("table", h.hexdigest(), table)
    return table


ENTRY_KINDS = ("fit", "table", "design")
"""The kinds of entry kept here; each entry's name is ``<kind>-<code>-<key>``."""


def entry_name(kind: str, key: str) -> str:
    """The name of the entry of ``kind`` (:data:`ENTRY_KINDS`) under ``key``: led by the kind and
    the first 12 hex digits of :func:`code_digest`, so that entries other code wrote can be told
    apart (the key itself already depends on the code)."""
    return f"{kind}-{code_digest()[:12]}-{key}"


STALE_AFTER_S = 30 * 86400.0
"""Seconds after its last use (:func:`marssim.cachedir.read_entry` marks each read) from which an
entry that other code wrote is removed."""


def _store(kind: str, key: str, value: object) -> None:
    """Keep ``value`` as the entry of ``kind`` under ``key``, then remove the entries of that kind
    that other code wrote and no process has read for :data:`STALE_AFTER_S` (an upgrade's
    predecessors), so that upgrades do not pile up entries no version reads; two installs sharing
    the folder keep theirs while both are used. Best effort, as every write here."""
    write_entry("fits", entry_name(kind, key), value)
    if not entries_enabled():
        return
    mine, now = entry_name(kind, ""), time.time()
    with contextlib.suppress(OSError):
        for path in (user_cache_dir() / "fits").glob(f"{kind}-*.pickle"):
            if not path.name.startswith(mine):
                with contextlib.suppress(OSError):
                    if now - path.stat().st_mtime > STALE_AFTER_S:
                        path.unlink()
