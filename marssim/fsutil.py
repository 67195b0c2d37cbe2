"""Write outputs atomically: a file or a directory appears whole or not at all."""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import IO

__all__ = ["atomic_file", "staged_dir"]


@contextlib.contextmanager
def atomic_file(path: str | Path, mode: str = "w", **kwargs) -> Iterator[IO]:
    """Open a temporary file beside ``path``; on success rename it over ``path``, on error delete it.

    ``mode`` is ``"w"`` (text) or ``"wb"`` (binary); ``kwargs`` go to :func:`open`."""
    target = Path(path)
    with _naming(target):
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    os.close(fd)
    try:
        with open(tmp, mode, **kwargs) as handle:
            yield handle
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp makes the file private (0600); a new file is not
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


@contextlib.contextmanager
def _naming(target: Path) -> Iterator[None]:
    """An OSError while the temporary file or directory beside ``target`` is made names
    ``target`` (the path the user gave), not the temporary name."""
    try:
        yield
    except OSError as err:
        raise OSError(err.errno, err.strerror, str(target)) from None


def _umask() -> int:
    """The process's file-creation mask (read by setting it and putting it back)."""
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


@contextlib.contextmanager
def staged_dir(path: str | Path) -> Iterator[Path]:
    """Yield a fresh temporary directory beside ``path``; on success its files are moved into
    ``path`` (created if needed, existing files of the same names replaced); on error it is removed."""
    target = Path(path)
    with _naming(target):
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    try:
        yield tmp
        target.mkdir(parents=True, exist_ok=True)
        for item in sorted(tmp.iterdir()):
            dest = target / item.name
            if dest.is_dir() and not dest.is_symlink():
                shutil.rmtree(dest)
            os.replace(item, dest)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
