"""Plain-text tables for the command line: left-aligned columns separated by two spaces."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

__all__ = ["format_table", "wrap_last_cell"]


def format_table(headers: Sequence[str], rows: Iterable[Sequence[str]], indent: str = "  ") -> list[str]:
    """Left-aligned columns separated by two spaces; trailing spaces stripped."""
    rows = [list(map(str, r)) for r in rows]
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(headers)]
    out = []
    for cells in [list(headers), *rows]:
        out.append((indent + "  ".join(c.ljust(w) for c, w in zip(cells, widths))).rstrip())
    return out


def wrap_last_cell(head: str, text: str, width: int = 120, breaks: str = ", ") -> list[str]:
    """``head`` followed by ``text``, the table's last cell, within ``width`` columns where the
    cell allows it: a cell too long for what is left of the line goes on over continuation lines
    indented to where it starts, broken after one of ``breaks`` (a configuration's commas), never
    cut. A piece with no break in it longer than the room is kept whole."""
    room = max(width - len(head), 16)
    pieces: list[str] = []
    rest = text
    while len(rest) > room:
        cut = max(rest.rfind(b, 0, room) for b in breaks)
        if cut <= 0:  # no break within the room: the next break, however far
            found = [i for i in (rest.find(b, room) for b in breaks) if i > 0]
            if not found:
                break
            cut = min(found)
        pieces.append(rest[:cut + 1].rstrip())
        rest = rest[cut + 1:].lstrip()
    pieces.append(rest)
    indent = " " * len(head)
    return [head + pieces[0]] + [indent + piece for piece in pieces[1:]]
