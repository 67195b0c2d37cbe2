"""Where marssim keeps what it computes once and reuses across processes: the cost model's
fitted curves (:mod:`marssim.cost.fitcache`), the measured collectives' fitted efficiencies
(:mod:`marssim.collectives.plan`) and numba's compiled kernels (:func:`numba_cache_dir`).

The folder is ``$MARSSIM_CACHE_DIR`` if set, else ``$XDG_CACHE_HOME/marssim``, else
``~/.cache/marssim``: a folder the user can write even when marssim is installed in a read-only
``site-packages``. Everything in it can be deleted at any time; it is rebuilt on the next run.

:func:`read_entry` and :func:`write_entry` keep pickled values under a name in a sub-folder; the
name is a digest of what the value was computed from (:func:`entry_key`). The cache is best
effort: an entry that cannot be read or written is recomputed by its caller, never an error;
``MARSSIM_NO_FIT_CACHE=1`` turns the entries off."""

from __future__ import annotations

import contextlib
import hashlib
import os
import pickle
from pathlib import Path

__all__ = [
    "entries_enabled",
    "entry_key",
    "numba_cache_dir",
    "read_entry",
    "use_numba_cache_dir",
    "user_cache_dir",
    "write_entry",
]


def user_cache_dir() -> Path:
    """marssim's cache folder (see the module docstring); not created here."""
    given = os.environ.get("MARSSIM_CACHE_DIR")
    if given:
        return Path(given).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".cache"
    return base / "marssim"


def numba_cache_dir() -> Path:
    """Where numba's cache of marssim's compiled kernels goes unless ``NUMBA_CACHE_DIR`` is set."""
    return user_cache_dir() / "numba"


def use_numba_cache_dir() -> None:
    """Point numba's cache (``cache=True`` kernels) at :func:`numba_cache_dir` unless the user
    set ``NUMBA_CACHE_DIR``; takes effect only before numba is first imported (numba reads its
    configuration then), which is why the command line calls it first thing."""
    if "NUMBA_CACHE_DIR" not in os.environ:
        os.environ["NUMBA_CACHE_DIR"] = str(numba_cache_dir())


def entries_enabled() -> bool:
    """Whether pickled entries are read and written (``MARSSIM_NO_FIT_CACHE`` unset or 0)."""
    return os.environ.get("MARSSIM_NO_FIT_CACHE", "0") in ("", "0")


def entry_key(*parts: object) -> str:
    """The hex SHA-256 of the ``repr`` of ``parts`` (values whose ``repr`` is exact: numbers,
    strings, tuples and frozen dataclasses of them)."""
    return hashlib.sha256(repr(parts).encode()).hexdigest()


def read_entry(folder: str, name: str):
    """The value kept as ``name`` in ``folder`` of the cache folder, or None (none kept, entries
    off, or one that cannot be read). A read marks the entry's modification time as its last use."""
    if not entries_enabled():
        return None
    path = user_cache_dir() / folder / f"{name}.pickle"
    try:
        with open(path, "rb") as handle:
            value = pickle.load(handle)
    except (OSError, EOFError, pickle.UnpicklingError, AttributeError, ImportError, TypeError, ValueError):
        return None
    with contextlib.suppress(OSError):
        os.utime(path)  # its last use, which a clean-up of entries other code wrote reads
    return value


def write_entry(folder: str, name: str, value: object) -> None:
    """Keep ``value`` as ``name`` in ``folder`` of the cache folder, atomically (a reader sees the
    whole entry or none); a folder that cannot be written is passed over."""
    if not entries_enabled():
        return
    from marssim.fsutil import atomic_file

    with contextlib.suppress(OSError), atomic_file(user_cache_dir() / folder / f"{name}.pickle", "wb") as handle:
        pickle.dump(value, handle, protocol=pickle.HIGHEST_PROTOCOL)
