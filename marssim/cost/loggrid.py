"""Measured times on a three-level grid, interpolated in log space: the pieces the fused
attention grid (:mod:`.attention_grid`) and the GEMM grid (:mod:`.gemm_grid`) share.

A grid holds ``ln t`` by three integer axes ``(a, b, c)``, nested as lines: for each ``a`` the
``b`` values measured, for each ``(a, b)`` the ``c`` values measured (:func:`nest`). A value between
grid points is the weighted sum of its bracketing points' ``ln t``, each axis linear in the log of
its coordinate between the nearest values measured on its line (:func:`bracket`, :func:`blend`).

Units: whatever the caller's times are (seconds); the axes are counts.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Callable, Hashable, Iterable
from typing import Protocol

__all__ = ["Point", "Tree", "bracket", "blend", "nest", "keep_faster", "GridSlice", "SlicedGrid"]

Point = tuple[int, int, int]
"""A grid point ``(a, b, c)``."""
Tree = dict[int, dict[int, tuple[tuple[int, ...], dict[int, float]]]]
"""``tree[a][b] == (sorted c values, {c: ln t})``."""


def bracket(axis: tuple[int, ...], v: float) -> list[tuple[int, float]] | None:
    """``[(grid value, weight)]`` of ``v`` on ``axis``, linear in ``ln v``: one entry on a grid
    value, two between, None outside."""
    if not axis or v < axis[0] or v > axis[-1]:
        return None
    i = bisect.bisect_left(axis, v)
    if axis[i] == v:
        return [(axis[i], 1.0)]
    lo, hi = axis[i - 1], axis[i]
    u = (math.log(v) - math.log(lo)) / (math.log(hi) - math.log(lo))
    return [(lo, 1.0 - u), (hi, u)]


def blend(axis: tuple[int, ...], x: float, inner: Callable[[int], float | None]) -> float | None:
    """The weighted sum of ``inner(v)`` over the grid values ``v`` of ``axis`` that bracket ``x``
    (:func:`bracket`); None outside the axis or where ``inner`` has no value."""
    got = bracket(axis, x)
    if got is None:
        return None
    total = 0.0
    for v, w in got:
        lt = inner(v)
        if lt is None:
            return None
        total += w * lt
    return total


def nest(points: dict[Point, float]) -> tuple[Tree, tuple[int, ...], dict[int, tuple[int, ...]]]:
    """``(tree, a values, b values by a)`` of ``points`` (``ln t`` by ``(a, b, c)``), each level
    sorted."""
    lines: dict[int, dict[int, list[tuple[int, float]]]] = {}
    for (a, b, c), lt in points.items():
        lines.setdefault(a, {}).setdefault(b, []).append((c, lt))
    tree = {a: {b: (tuple(sorted(c for c, _ in v)), dict(v)) for b, v in by_b.items()} for a, by_b in lines.items()}
    return tree, tuple(sorted(tree)), {a: tuple(sorted(by_b)) for a, by_b in tree.items()}


def keep_faster(points: dict[Point, float], point: Point, seconds: float) -> None:
    """Record ``ln seconds`` at ``point``; a second time of one point keeps the faster (as the
    measured lookups do)."""
    lt = math.log(seconds)
    old = points.get(point)
    points[point] = lt if old is None else min(old, lt)


class GridSlice(Protocol):
    """What :class:`SlicedGrid` needs of a slice: its points (``ln t`` by ``(a, b, c)``) and a
    ``freeze`` that builds its lines once every point is in."""

    points: dict[Point, float]

    def freeze(self) -> None: ...


class SlicedGrid:
    """Measured points by slice key, each slice a grid of its own: built from ``(key, a, b, c,
    seconds)`` entries (entries with a count below 1 or no positive time skipped; a second time of
    one point keeps the faster, :func:`keep_faster`), each slice made by ``new_slice(key)`` and
    frozen once filled. The fused attention and GEMM grids are such sets of slices."""

    def __init__(self, entries: Iterable[tuple[Hashable, int, int, int, float]],
                 new_slice: Callable[[Hashable], GridSlice]) -> None:
        self._slices: dict = {}
        for key, a, b, c, seconds in entries:
            if a < 1 or b < 1 or c < 1 or not seconds > 0:
                continue
            sl = self._slices.get(key)
            if sl is None:
                sl = self._slices[key] = new_slice(key)
            keep_faster(sl.points, (a, b, c), seconds)
        for sl in self._slices.values():
            sl.freeze()

    def __len__(self) -> int:
        return sum(len(s.points) for s in self._slices.values())

    def __bool__(self) -> bool:
        return bool(self._slices)
