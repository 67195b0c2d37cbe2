"""Where marssim keeps what it computes once and reuses across processes: the cost model's
fitted curves (:mod:`marssim.cost.fitcache`) and numba's compiled kernels (:func:`numba_cache_dir`).

The folder is ``$MARSSIM_CACHE_DIR`` if set, else ``$XDG_CACHE_HOME/marssim``, else
``~/.cache/marssim``: a folder the user can write even when marssim is installed in a read-only
``site-packages``. Everything in it can be deleted at any time; it is rebuilt on the next run."""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["user_cache_dir", "numba_cache_dir", "use_numba_cache_dir"]


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
