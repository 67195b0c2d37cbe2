"""Read CSV tables with floats parsed exactly (so a write then read gives the same bits)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd

__all__ = ["read_csv_exact", "EXACT_FLOATS"]


def _exact_floats() -> dict[str, str]:
    """read_csv options that parse floats exactly: pandas >= 3.1 always does (and deprecates the
    option); older versions need ``float_precision="round_trip"``."""
    major, minor = (int(x) for x in pd.__version__.split(".")[:2])
    return {} if (major, minor) >= (3, 1) else {"float_precision": "round_trip"}


EXACT_FLOATS = _exact_floats()
"""Keyword options for :func:`pandas.read_csv` that make float parsing exact."""


def read_csv_exact(path: str | Path, **kwargs: Any) -> pd.DataFrame:
    """:func:`pandas.read_csv` with exact float parsing; ``kwargs`` go to it unchanged."""
    return pd.read_csv(path, **EXACT_FLOATS, **kwargs)
