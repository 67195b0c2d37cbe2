"""Errors that reach users.

Every error about user input (YAML, ONNX, mapping files, CLI flags) is an :class:`InputError`
that names the file, the key path inside it and what was expected. The CLI prints its message
and exits with status 2, without a traceback.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from typing import Any

__all__ = ["InputError", "InputWarning", "MarssimError", "CapacityError", "format_path", "summarise_names",
           "warn_input", "plain_reprs"]


class MarssimError(Exception):
    """Base class of the errors marssim raises on purpose."""


def format_path(path: Iterable[str | int]) -> str:
    """Render a key path like ``links[3].bandwidth`` from ``("links", 3, "bandwidth")``."""
    out = ""
    for part in path:
        if isinstance(part, int):
            out += f"[{part}]"
        elif out:
            out += f".{part}"
        else:
            out = str(part)
    return out


def summarise_names(names: Sequence[str], *, contiguous: bool = False, limit: int = 4) -> str:
    """Many names in one phrase: ``first .. last`` when they are ``contiguous`` (a run in the
    file's order; two names are joined by a comma), else the first ``limit`` and how many more."""
    names = list(names)
    if len(names) <= 2 or (len(names) <= limit and not contiguous):
        return ", ".join(names)
    if contiguous:
        return f"{names[0]} .. {names[-1]}"
    return f"{', '.join(names[:limit])} and {len(names) - limit} more"


_NUMPY_REPR = re.compile(r"\bnp\.(?:float|int|uint|complex|str_|bytes_)\d*_?\((.*?)\)|\bnp\.(True|False)_")


def plain_reprs(text: str) -> str:
    """``text`` with numpy 2's scalar reprs (``np.float64(1.0)``, ``np.int64(3)``, ``np.True_``)
    written as the plain values a user typed (``1.0``, ``3``, ``True``)."""
    return _NUMPY_REPR.sub(lambda m: m.group(1) if m.group(1) is not None else m.group(2), text)


class InputError(MarssimError, ValueError):
    """Bad user input: names the file, the key path and what was expected.

    ``problems`` holds one ``(path, message)`` pair per violation so that a validator can report
    all of them at once; ``str(err)`` lists them one per line, each prefixed by the file.
    """

    def __init__(
        self,
        file: str | None,
        path: Sequence[str | int] | str = (),
        message: str = "",
        *,
        problems: Sequence[tuple[str, str]] | None = None,
    ) -> None:
        self.file = str(file) if file is not None else None
        if problems is None:
            key = path if isinstance(path, str) else format_path(path)
            problems = [(key, message)]
        self.problems = list(problems)
        super().__init__(self._render())

    def _render(self) -> str:
        prefix = f"{self.file}: " if self.file else ""
        lines = []
        for key, message in self.problems:
            lines.append(f"{prefix}{key}: {message}" if key else f"{prefix}{message}")
        return plain_reprs("\n".join(lines))

    @property
    def path(self) -> str:
        """Key path of the first problem."""
        return self.problems[0][0]

    @classmethod
    def expected(cls, file: str | None, path: Sequence[str | int] | str, what: str, got: Any) -> "InputError":
        """``file: path: expected WHAT, got GOT`` — the usual shape of an input error."""
        return cls(file, path, f"expected {what}, got {got!r}")


class InputWarning(UserWarning):
    """Input that is accepted but most likely not what was meant (a set that gets no ops, a
    fallback asked for); the CLI prints it on one line as ``marssim VERB: warning: ...``."""


def warn_input(file: str | None, message: str) -> None:
    """Issue an :class:`InputWarning` naming ``file`` (when given)."""
    import warnings

    message = plain_reprs(message)
    warnings.warn(InputWarning(f"{file}: {message}" if file else message), stacklevel=3)


class CapacityError(MarssimError):
    """A plan does not fit a memory: names the device, the peak and the capacity, and the time of
    the overflow when a simulation found it (``time_s`` None: a check made before simulating)."""

    def __init__(self, device: str, time_s: float | None, peak_bytes: float, capacity_bytes: float,
                 detail: str = "") -> None:
        # the values are the exception's args so that copies (SimPy re-raises a copy) keep them
        super().__init__(device, time_s, peak_bytes, capacity_bytes, detail)
        self.device = device
        self.time_s = time_s
        self.peak_bytes = peak_bytes
        self.capacity_bytes = capacity_bytes
        self.detail = detail

    def __str__(self) -> str:
        unit, scale = ("GiB", 2**30) if self.capacity_bytes >= 2**30 else ("MiB", 2**20)
        when = f" at t={self.time_s * 1e3:.6g} ms" if self.time_s is not None else ""
        msg = (f"memory of {self.device} overflows{when}: needs {self.peak_bytes / scale:.2f} {unit}, capacity "
               f"{self.capacity_bytes / scale:.2f} {unit}")
        if self.detail:
            msg += f" ({self.detail})"
        return msg
