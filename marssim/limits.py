"""Bounds on what a user's file may hold, checked before it is parsed: its size in bytes, and for
YAML the nodes it expands to (aliases counted at their full size) and how deeply it nests.

A file someone was sent must end in a result or one :class:`~marssim.errors.InputError`, never
a hang or an exhausted interpreter: a 390-byte YAML "alias bomb" expands to billions of nodes,
a few kilobytes of ``[[[[...`` exhaust Python's recursion limit, and a multi-megabyte YAML file
takes the parser seconds per megabyte. Every limit is far above what the shipped files and the
files marssim writes hold (the largest shipped YAML is 6 kB; a mapping written for GPT-3 175B's
4,052 ops holds a few hundred kB; the largest shipped CSV is 3 MB).
"""

from __future__ import annotations

import os
from pathlib import Path

from marssim.errors import InputError

__all__ = ["MAX_YAML_BYTES", "MAX_YAML_NODES", "MAX_YAML_DEPTH", "MAX_CSV_BYTES", "MAX_ONNX_BYTES",
           "check_file_size", "read_bounded", "size_text"]

MAX_YAML_BYTES = 4 * 2**20
"""The largest YAML file read (system, mapping, deployment): 4 MiB, about two seconds of parsing."""

MAX_YAML_NODES = 1_000_000
"""The most nodes (scalars, sequences, mappings) a YAML document may expand to, an alias
counting as every node of what it names."""

MAX_YAML_DEPTH = 64
"""The deepest nesting of sequences and mappings in a YAML document (the shipped files: 6)."""

MAX_CSV_BYTES = 256 * 2**20
"""The largest CSV table read (request traces, calibration and measured tables): 256 MiB."""

MAX_ONNX_BYTES = 2 * 2**30
"""The largest ONNX model file read: 2 GiB, protobuf's own limit on one message (weights larger
than that are kept in external data files, which are not read)."""


def size_text(n_bytes: float) -> str:
    """``n_bytes`` in the largest binary unit that keeps it >= 1 (``4 MiB``, ``43.2 MiB``), with
    the exact count when rounding changed it (``9.8 KiB (10,007 bytes)``)."""
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n_bytes >= scale:
            if n_bytes % scale == 0:
                return f"{n_bytes // scale:,} {unit}"
            return f"{n_bytes / scale:.1f} {unit} ({int(n_bytes):,} bytes)"
    return f"{int(n_bytes):,} bytes"


def check_file_size(path: str | Path, limit: int, what: str) -> None:
    """InputError naming the file, its size and ``limit`` (bytes) when the file is larger; a
    file that does not exist or cannot be examined is left to the reader to report. ``what``:
    the kind of file (``a YAML file``), for the message."""
    try:
        size = os.stat(path).st_size
    except OSError:
        return
    if size > limit:
        raise InputError(str(path), "", f"{size_text(size)}: larger than the {size_text(limit)} {what} may be; "
                                        "not read")


def read_bounded(path: str | Path, limit: int, what: str) -> bytes:
    """The bytes of the file ``path``, refused (InputError with its size and ``limit``) when it
    is larger than ``limit`` bytes, whether its size is known beforehand or only while it is read
    (a device or a file of ``/proc``). Missing and unreadable files are InputErrors too."""
    p = Path(path)
    if p.is_dir():
        raise InputError(str(p), "", f"is a directory; expected {what}")
    check_file_size(p, limit, what)
    try:
        with open(p, "rb") as f:
            data = f.read(limit + 1)
    except FileNotFoundError:
        raise InputError(str(p), "", "file not found") from None
    except OSError as exc:
        raise InputError(str(p), "", f"cannot read file ({exc.strerror or exc})") from None
    if len(data) > limit:
        raise InputError(str(p), "", f"more than the {size_text(limit)} {what} may be; not read")
    return data
