"""GEMMs between measured shapes: multilinear interpolation in log space over ``(m, n, k)``.

A measured GEMM table of a serving stack (AIConfigurator's, :mod:`marssim.calibrate.aiconfigurator`)
is a dense grid: every token count ``m`` of a ladder (1 to 32,768) at every pair of widths ``n`` and
depths ``k`` of another (256 to 65,536). A layer of a real model is rarely on it (Llama 3 70B's MLP
at tensor parallelism 2 is ``n = 28,672``; a decode batch of 300 sequences is ``m = 300``), and the
fitted curve (:mod:`marssim.cost.calibrated`) times such a shape with a fixed thread-block tile: a
GEMM of 257 rows pays for three tiles of 128 where cuBLAS picks another tile and runs it in the time
of 256 rows (measured: within 2 %; the curve: 1.5x). So a GEMM shape inside the measured ranges of
its slice is timed from the grid instead::

    ln t(m, n, k) = sum over the 2^3 corners c of  w_c ln t_c

over the measured points of one *slice* -- rows of one kernel kind (``gemm``: the linear layers),
element type, batch (1), phase and backend, without a convolution's or attention's geometry, that
is a measured grid (:data:`DENSE`: the measurement harness's rows, at the shapes of particular
models, are not, and stay with the fitted curve) -- each axis taken between the nearest values
measured on its line: along ``k`` between the depths measured for the corner's ``(m, n)``, along
``n`` between the widths measured for its ``m``, along ``m`` between the token counts of the slice
(:mod:`.loggrid`, shared with the fused attention grid). A measured shape gives its measured time
back (a grid value takes weight 1). A shape outside the measured range of a line it needs is not
interpolated (the caller falls back to the fitted curve). A gradient GEMM (``dgrad``, ``wgrad``)
without a slice of its phase takes the forward slice (a gradient GEMM is a GEMM of its view, as the
measured lookups do).

Held out (``analysis/aiconfigurator_holdout.py``, section 9): the package's token counts between
the shipped powers of two come out within a median of 1.6-2.3 % (p90 6-11 %) on H100 and H200 and
1.6-4.5 % (p90 8-15 %) on B200 and GB200, where the fitted curve with its local correction gave
3.3-4.4 % (p90 16-20 %) and 2.4-5.7 % (p90 9-19 %) on the same rows (section 2); each interior width
or depth held out, 1.1-4.1 % (p90 4-13 %).

Units: seconds.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

from .features import F_BACKEND, F_DTYPE, F_G, F_KERNEL, F_KK, F_M, F_NN, F_PHASE, KERNEL_KINDS
from .loggrid import Point, SlicedGrid, Tree, blend, nest

__all__ = ["GEMM_KIND", "DENSE", "MIN_AXIS", "GemmGrid", "grid_from_measured", "op_seconds"]

GEMM_KIND = KERNEL_KINDS.index("gemm")
"""The kernel kind interpolated: the linear layers' GEMMs (not convolutions, not the batched
attention products, whose geometry a grid of ``(m, n, k)`` does not carry)."""

SliceKey = tuple[int, int, int, int, int]
"""``(kernel kind, dtype, batch, phase, backend)`` codes of a slice (feature codes of
:mod:`marssim.cost.features`)."""


class _Slice:
    """``ln t`` by token count, then width, then depth (:func:`.loggrid.nest`)."""

    def __init__(self) -> None:
        self.points: dict[Point, float] = {}
        self.tree: Tree = {}
        self.ms: tuple[int, ...] = ()
        self.ns: dict[int, tuple[int, ...]] = {}

    def freeze(self) -> None:
        self.tree, self.ms, self.ns = nest(self.points)

    def value(self, m: int, n: int, k: int) -> float | None:
        def along_k(mv: int, nv: int) -> float | None:
            keys, values = self.tree[mv][nv]
            return blend(keys, k, values.__getitem__)

        return blend(self.ms, m, lambda mv: blend(self.ns[mv], n, lambda nv: along_k(mv, nv)))


class GemmGrid(SlicedGrid):
    """Measured GEMM times of one GPU design by slice (see the module docstring), built from
    ``(slice key, m, n, k, seconds)`` entries; a second entry of one point keeps the faster time."""

    def __init__(self, entries: Iterable[tuple[SliceKey, int, int, int, float]] = ()) -> None:
        super().__init__(entries, lambda key: _Slice())

    def seconds(self, key: SliceKey, m: int, n: int, k: int) -> float | None:
        """The interpolated time (s) of a GEMM of slice ``key`` and shape ``(m, n, k)``; None where
        the slice does not bracket it."""
        sl = self._slices.get(key)
        if sl is None:
            return None
        lt = sl.value(m, n, k)
        return None if lt is None else math.exp(lt)


DENSE = 0.9
"""The share of its widths x depths pairs a slice must have measured to be a grid (and
interpolated): AIConfigurator's GEMM tables hold 360 of 19 x 19; the measurement harness's and
Vidur's rows, taken at the shapes of particular models, 8-30 % of theirs (those stay with the
fitted curve and its local correction)."""
MIN_AXIS = 3
"""The fewest widths and depths a slice must have measured to be a grid."""


def grid_from_measured(measured: dict[tuple, float]) -> GemmGrid:
    """The grid of the ``gemm`` kind's measured shapes among ``measured`` (shape codes of
    :func:`marssim.cost.model._measured_code` to seconds), without a geometry, in the slices that
    are measured grids (:data:`DENSE`, :data:`MIN_AXIS`)."""
    by_slice: dict[SliceKey, list[tuple[int, int, int, float]]] = {}
    for code, seconds in measured.items():
        kind, dtype, batch, m, n, k, _, _, geometry, phase, backend = code
        if kind == GEMM_KIND and not geometry and m > 0:
            by_slice.setdefault((kind, dtype, batch, phase, backend), []).append((m, n, k, float(seconds)))
    entries = []
    for key, points in by_slice.items():
        ns, ks = {p[1] for p in points}, {p[2] for p in points}
        pairs = {(p[1], p[2]) for p in points}
        if len(ns) >= MIN_AXIS and len(ks) >= MIN_AXIS and len(pairs) >= DENSE * len(ns) * len(ks):
            entries.extend((key, m, n, k, t) for m, n, k, t in points)
    return GemmGrid(entries)


def op_seconds(grid: GemmGrid, x: tuple[int, ...], geometry: tuple = ()) -> float | None:
    """The interpolated time (s) of the op with feature tuple ``x`` (a ``gemm`` kernel without
    ``geometry``), its own phase's slice first, then the forward one; None otherwise."""
    if x[F_KERNEL] != GEMM_KIND or geometry:
        return None
    key = (x[F_KERNEL], x[F_DTYPE], x[F_G], x[F_PHASE], x[F_BACKEND])
    t = grid.seconds(key, x[F_M], x[F_NN], x[F_KK])
    if t is None and x[F_PHASE] and not x[F_BACKEND]:  # phase index 0 is fwd
        t = grid.seconds((*key[:3], 0, key[4]), x[F_M], x[F_NN], x[F_KK])
    return t
