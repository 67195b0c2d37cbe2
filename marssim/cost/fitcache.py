"""The cost model's fitted curves kept on disk: a table's fit (:func:`marssim.cost.calibrated.fit`,
seconds of least squares and leave-one-out per GPU) is computed once per table and read back by
every later process.

An entry is keyed by what the fit reads and the code that computes it: every field of the rows
fitted (their file name and line excepted, so a moved install hits the same entry), the device's
peaks, :data:`FIT_VERSION` (raise it whenever a change to the fitting code changes what it
computes), and the numpy and scipy versions. It holds the pickled fits, which are the very objects
the fit returned (the same floats, bit for bit). The entries live in ``fits/`` of
:func:`marssim.cachedir.user_cache_dir`; ``MARSSIM_NO_FIT_CACHE=1`` turns the cache off. Parsed
calibration tables are kept beside them (:func:`cached_table`, keyed by the file's name and
bytes), so that a later process neither parses nor fits. The cache is best effort: an entry that
cannot be read or written is recomputed, never an error."""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Sequence
from pathlib import Path

from marssim.cachedir import entries_enabled, read_entry, write_entry

__all__ = ["FIT_VERSION", "cached_table", "fit_key", "load_fits", "store_fits"]

FIT_VERSION = 1
"""The version of the fitting code (:mod:`.calibrated`'s fit, :mod:`.residual`'s correction):
raise it with any change to what they compute, so that no stale entry is read."""

_ROW_FIELDS: tuple[str, ...] | None = None


def fit_key(rows: Sequence, peaks: dict[str, float] | None, device: str, stack: str | None) -> str:
    """The hex SHA-256 naming the fit of ``rows`` (KernelTiming) of ``device`` and ``stack``
    under ``peaks`` (FLOP/s by dtype) by this code and these numpy and scipy versions."""
    import numpy
    import scipy

    global _ROW_FIELDS
    if _ROW_FIELDS is None and rows:
        _ROW_FIELDS = tuple(f.name for f in dataclasses.fields(rows[0]) if f.name != "source")
    h = hashlib.sha256()
    h.update(repr((FIT_VERSION, numpy.__version__, scipy.__version__, device, stack,
                   sorted((peaks or {}).items()))).encode())
    for r in rows:
        h.update(repr(tuple(getattr(r, f) for f in _ROW_FIELDS)).encode())
        h.update(b"\n")
    return h.hexdigest()


def load_fits(key: str) -> dict | None:
    """The fits stored under ``key``, or None (no entry, or one that cannot be read)."""
    got = read_entry("fits", key)
    return got if isinstance(got, dict) else None


def store_fits(key: str, fits: dict) -> None:
    """Keep ``fits`` under ``key`` (atomically: a reader sees the whole entry or none); a folder
    that cannot be written is passed over."""
    write_entry("fits", key, fits)


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
    h = hashlib.sha256(repr((FIT_VERSION, str(path))).encode())
    h.update(data)
    entry = f"table-{h.hexdigest()}"
    got = read_entry("fits", entry)
    if got is not None and hasattr(got, "rows"):
        return got
    table = load(path)
    write_entry("fits", entry, table)
    return table
