"""Request traces: CSV files of ``arrival_s, prompt_tokens, output_tokens``, shipped or the user's.

A trace is named by a shipped name (``azure-conv-2023``, ``azure-code-2023``: the files of
``traces/requests/``, with their source and license in its ``README.md``) or by a path to a CSV
file with those three columns (others are ignored): arrival times in seconds, not decreasing,
token counts positive integers below 2^31. A bad file gets one :class:`~marssim.errors.InputError`
naming the row and the column, and the line (the header is line 1); a file larger than
:data:`~marssim.limits.MAX_CSV_BYTES` is refused before it is read.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from marssim.errors import InputError

__all__ = ["Trace", "load_trace", "shipped_traces", "COLUMNS"]

COLUMNS = ("arrival_s", "prompt_tokens", "output_tokens")


@dataclass(frozen=True, eq=False)
class Trace:
    """The rows of a request trace: arrival times (s, from 0), prompt and output tokens."""

    name: str
    arrival: np.ndarray
    prompt: np.ndarray
    output: np.ndarray

    def __len__(self) -> int:
        return len(self.arrival)

    @property
    def span(self) -> float:
        """Seconds from the first arrival to the last."""
        return float(self.arrival[-1] - self.arrival[0]) if len(self.arrival) else 0.0

    @property
    def rate(self) -> float:
        """Mean arrival rate (requests/s) over the trace's span."""
        return (len(self) - 1) / self.span if self.span > 0 else float("inf")


def shipped_traces() -> dict[str, Path]:
    """The shipped traces by name."""
    from marssim.data import requests

    return {p.stem: p for p in sorted(requests().glob("*.csv"))}


def _path_of(name: str) -> Path:
    shipped = shipped_traces()
    if name in shipped:
        return shipped[name]
    path = Path(name)
    if path.suffix.lower() == ".csv" and path.is_file():
        return path
    raise InputError(name, "", f"no such request trace; expected a CSV file or one of: {', '.join(shipped)}")


@functools.lru_cache(maxsize=16)
def _load(path: str, mtime: float) -> Trace:
    import pandas as pd

    from marssim.limits import MAX_CSV_BYTES, check_file_size

    check_file_size(path, MAX_CSV_BYTES, "a request trace")
    try:
        frame = pd.read_csv(path, dtype=str, keep_default_na=False)
    except (OSError, UnicodeDecodeError, pd.errors.ParserError, pd.errors.EmptyDataError) as err:
        text = " ".join(str(err).split()).removeprefix("Error tokenizing data. C error: ")
        raise InputError(path, "", f"cannot read the trace as CSV ({text})") from None
    missing = [c for c in COLUMNS if c not in frame.columns]
    if missing:
        raise InputError(path, "", f"expected the columns {', '.join(COLUMNS)}; missing {', '.join(missing)}")
    if not len(frame):
        raise InputError(path, "", "the trace has no rows")
    out = {}
    for column in COLUMNS:
        text = frame[column].str.strip()
        values = pd.to_numeric(text, errors="coerce").to_numpy(dtype=float)
        bad = np.flatnonzero(~np.isfinite(values))
        if column != "arrival_s":
            bad = np.union1d(bad, np.flatnonzero((values < 1) | (values != np.floor(values)) | (values >= 2**31)))
        elif (values < 0).any():
            bad = np.union1d(bad, np.flatnonzero(values < 0))
        if len(bad):
            row = int(bad[0])
            what = "a time in seconds >= 0" if column == "arrival_s" else "a positive integer below 2^31"
            raise InputError(path, f"row {row + 1}.{column}",
                             f"expected {what}, got {frame[column].iloc[row]!r} (line {row + 2})"
                             + (f" ({len(bad)} rows like it)" if len(bad) > 1 else ""))
        out[column] = values
    back = np.flatnonzero(np.diff(out["arrival_s"]) < 0)
    if len(back):
        row = int(back[0]) + 1
        raise InputError(path, f"row {row + 1}.arrival_s", f"(line {row + 2}) arrival times must not decrease; got "
                                                           f"{out['arrival_s'][row]!r} after {out['arrival_s'][row - 1]!r}")
    arrival = out["arrival_s"] - out["arrival_s"][0]
    return Trace(Path(path).stem, arrival, out["prompt_tokens"].astype(np.int64), out["output_tokens"].astype(np.int64))


def load_trace(name: str) -> Trace:
    """The trace ``name`` (a shipped name or a CSV path), arrival times from 0. Read once per
    process (and again when the file changes)."""
    path = _path_of(name)
    return _load(str(path), path.stat().st_mtime)
