"""Plain-text tables for the command line: left-aligned columns separated by two spaces."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

__all__ = ["format_table"]


def format_table(headers: Sequence[str], rows: Iterable[Sequence[str]], indent: str = "  ") -> list[str]:
    """Left-aligned columns separated by two spaces; trailing spaces stripped."""
    rows = [list(map(str, r)) for r in rows]
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(headers)]
    out = []
    for cells in [list(headers), *rows]:
        out.append((indent + "  ".join(c.ljust(w) for c, w in zip(cells, widths))).rstrip())
    return out
