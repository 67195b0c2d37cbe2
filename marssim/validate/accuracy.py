"""How close predictions came to published measurements: the mean and worst error over the rows
predicted, shared by the training (:mod:`.published`) and serving (:mod:`.published_serving`)
tables. An error is ``(predicted - measured) / measured``, a fraction."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Protocol

__all__ = ["summary", "summary_line"]


class Predicted(Protocol):
    """A row's prediction as :func:`summary` reads it: its error, and why it was not predicted
    (empty when it was)."""

    @property
    def error(self) -> float: ...

    @property
    def problem(self) -> str: ...


def summary(predictions: Sequence[Predicted]) -> dict[str, float]:
    """Mean and worst absolute error and mean signed error over the rows predicted; a row whose
    error is NaN (its figure not published) is left out."""
    errors = [p.error for p in predictions if not p.problem and not math.isnan(p.error)]
    if not errors:
        return {"rows": 0, "mean_abs": math.nan, "worst_abs": math.nan, "mean": math.nan}
    return {"rows": len(errors), "mean_abs": sum(abs(e) for e in errors) / len(errors),
            "worst_abs": max(abs(e) for e in errors), "mean": sum(errors) / len(errors)}


def summary_line(predictions: Sequence[Predicted]) -> str:
    """:func:`summary` as a table's closing line (rows, mean and worst absolute error, mean signed)."""
    s = summary(predictions)
    return (f"{s['rows']} rows: mean |error| {s['mean_abs']:.2%}, worst {s['worst_abs']:.2%}, "
            f"mean signed {s['mean']:+.2%}")
