"""Local residual correction of a fitted efficiency curve from measured neighbours.

The four-parameter curve of :mod:`marssim.cost.gpu` cannot follow what a real kernel library
does between shapes: cuBLAS/cuDNN switch algorithms and tile configurations with the shape,
Triton GEMMs fall off a cliff when ``N`` or ``K`` is not a multiple of the tile, fp32 without
TF32 runs on CUDA cores. Those effects are local in shape space, and the table measures shapes
close to most of the ones a simulation asks for (the same layer at another batch or another
model-parallel split). So a kernel of shape ``x`` not in the table is predicted as::

    pred(x) = curve(x) * exp( sum_i w_i r_i / (sum_i w_i + prior) )
    r_i     = ln(measured_i / curve(x_i))                 residual of measured shape i
    w_i     = (1 - (d_i / radius)^3)^3  for d_i < radius, else 0   (tricube weight)

over the ``neighbours`` nearest measured shapes of the same (device, kind, dtype, tuning)
group, ``d_i`` the Euclidean distance in a scaled log-feature space:

* GEMM-class kinds: ``s_m ln batch, s_m ln m, ln n, ln k, s_a a(n), s_a a(k)`` where ``a(x)``
  is ``log2`` of the largest power of two dividing ``x`` (capped at 128): the alignment that
  decides vectorised loads and tile fit; ``s_m`` < 1 makes the batch-like dimensions (scaled
  by batch size and data-parallel splits) cheaper to cross than the channel-like ones, along
  which libraries change algorithm.
* convolutions whose rows all carry their geometry (:mod:`marssim.cost.convgeom`): the GEMM
  features and ``s_g ln(R S), s_g ln(stride_h stride_w), s_g s_m ln(images)``: the kernel
  window (a 1x1 convolution is a plain GEMM, a 3x3 one an implicit GEMM with another
  algorithm), the stride (the input access pattern) and how the GEMM's ``m = images x P x Q``
  splits into images and output plane -- what tells apart convolutions with the same im2col
  GEMM. ``s_g = 0`` is the GEMM view alone.
* streaming kinds: ``ln(1 + flops), ln bytes``.

With no measured shape within ``radius`` the correction is exactly 0 and the prediction is
the curve (extrapolation falls back to the fitted physics); ``prior`` shrinks the correction
toward 0 when the neighbours are few or far. The hyperparameters (``s_m``, ``s_a``, ``s_g``,
``neighbours``, ``radius``, ``prior``, or no correction at all) are chosen per group by
leave-one-out cross-validation on the group's own fitting rows (:func:`fit_correction`):
each distinct shape is predicted from the others, and the setting with the smallest mean
``|ln(pred / measured)|`` wins (ties: the earlier in :data:`GRID` order), provided it is at
least :data:`MIN_GAIN` below the curve alone's; otherwise the group keeps the curve.

Determinism and speed: :meth:`ResidualCorrection.log_factors` finds each shape's neighbours
among a group's measured shapes by exact search (the distances to all of them, column by
column, in blocks of shapes) when the group holds at most :data:`EXACT_SEARCH_POINTS` shapes,
and with a KD-tree query (``scipy.spatial.cKDTree``, imported only then) in larger groups; the
choice depends on the group alone, each query is independent of the others and uses only
exactly rounded arithmetic, so one shape alone and the same shape in a batch give the same
bits. :meth:`ResidualCorrection.factors` turns them into multipliers with
``math.exp`` per shape.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

__all__ = ["ResidualCorrection", "fit_correction", "gemm_features", "conv_features", "stream_features", "GRID",
           "ALIGN_CAP", "GEOMETRY_FIELDS"]

ALIGN_CAP = 128
"""Largest power of two the alignment features distinguish."""

EXACT_SEARCH_POINTS = 4096
"""Measured shapes of a group up to which a query's neighbours come from the distances to every
one of them (no ``scipy.spatial`` import, which costs a command-line run more than the search);
larger groups (imported kernel databases) use a KD-tree."""

EXACT_SEARCH_PAIRS = 1 << 20
"""Distances computed at once by the exact search (queries per block x shapes): bounds its memory."""

GRID = {
    "m_scale": (0.25, 0.5, 1.0),
    "align_scale": (0.0, 0.25, 0.5, 1.0),
    "neighbours": (1, 2, 4, 8, 16),
    "radius": (0.25, 0.5, 1.0, 2.0, 3.0),
    "prior": (0.0, 0.05, 0.2),
    "geom_scale": (0.0, 0.5, 1.0, 2.0),
}
"""Hyperparameters tried by leave-one-out (``m_scale``/``align_scale``: GEMM-class kinds only;
``geom_scale``: convolutions with their geometry only)."""

GEOMETRY_FIELDS = ("images", "c", "k", "r", "s", "stride_h", "stride_w", "pad_h", "pad_w", "dilation", "groups",
                   "p", "q")
"""Columns of the geometry arrays :func:`conv_features` reads: the image count of the GEMM's
``m`` and the :attr:`~marssim.cost.convgeom.ConvGeometry.match_key`."""

MIN_SHAPES = 50
"""Fewest distinct shapes a group needs before a correction is considered: choosing among the
~900 settings of :data:`GRID` by leave-one-out over a few dozen shapes picks noise (on the
H100 table, the 28-shape pooling groups got corrections that doubled their held-out error)."""

MIN_GAIN = 0.1
"""Relative reduction of the leave-one-out error a correction must bring over the curve alone
to be used: the best of the ~900 settings of :data:`GRID` on a group whose curve is already
exact up to noise still looks a little better than the curve by chance; this keeps such
groups on the curve."""


def _align(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x, dtype=np.int64)
    return np.log2(np.minimum(x & -x, ALIGN_CAP).astype(np.float64))


def gemm_features(batch, m, n, k, m_scale: float, align_scale: float) -> np.ndarray:
    """Scaled log features ``[shapes, 6]`` of GEMM-class shapes (see the module docstring)."""
    b, m_, n_, k_ = (np.atleast_1d(np.asarray(v, dtype=np.int64)) for v in (batch, m, n, k))
    return np.ascontiguousarray(np.stack([
        m_scale * np.log(b.astype(np.float64)), m_scale * np.log(m_.astype(np.float64)),
        np.log(n_.astype(np.float64)), np.log(k_.astype(np.float64)),
        align_scale * _align(n_), align_scale * _align(k_)], axis=1))


def conv_features(batch, m, n, k, geometry, m_scale: float, align_scale: float, geom_scale: float) -> np.ndarray:
    """Scaled log features ``[shapes, 9]`` of convolutions with their geometry (integer array
    ``[shapes, len(GEOMETRY_FIELDS)]``): :func:`gemm_features` and the geometry terms of the
    module docstring."""
    g = np.atleast_2d(np.asarray(geometry, dtype=np.int64))
    col = {name: g[:, i].astype(np.float64) for i, name in enumerate(GEOMETRY_FIELDS)}
    extra = np.stack([geom_scale * np.log(col["r"] * col["s"]),
                      geom_scale * np.log(col["stride_h"] * col["stride_w"]),
                      geom_scale * (m_scale * np.log(col["images"]))], axis=1)
    return np.ascontiguousarray(np.concatenate([gemm_features(batch, m, n, k, m_scale, align_scale), extra], axis=1))


def stream_features(flops, nbytes) -> np.ndarray:
    """Log features ``[shapes, 2]`` of streaming shapes: ``ln(1 + flops), ln bytes``."""
    f = np.atleast_1d(np.asarray(flops, dtype=np.float64))
    b = np.atleast_1d(np.asarray(nbytes, dtype=np.float64))
    return np.ascontiguousarray(np.stack([np.log1p(f), np.log(b)], axis=1))


def _weights(d: np.ndarray, radius: float) -> np.ndarray:
    """Tricube weights of distances ``d`` (0 at and beyond ``radius``; inf -> 0)."""
    u = np.minimum(d / radius, 1.0)
    v = 1.0 - u * u * u
    return v * v * v


def _combine(d: np.ndarray, r: np.ndarray, radius: float, prior: float) -> np.ndarray:
    """Correction of each row from its neighbours' distances ``d`` and residuals ``r``
    (``[rows, neighbours]``), summed column by column (fixed order)."""
    w = _weights(d, radius)
    num = np.zeros(d.shape[0])
    den = np.zeros(d.shape[0])
    for j in range(d.shape[1]):
        num += w[:, j] * r[:, j]
        den += w[:, j]
    den += prior
    return np.where(den > 0, num / np.where(den > 0, den, 1.0), 0.0)


@dataclass(frozen=True, eq=False)
class ResidualCorrection:
    """The correction of one group: settings, the measured shapes (scaled features) and their
    residuals ``ln(measured / curve)``. ``loo_error``/``curve_error``: mean ``|ln(pred /
    measured)|`` over the fitting shapes, leave-one-out with the correction and for the curve
    alone."""

    gemm: bool
    m_scale: float
    align_scale: float
    neighbours: int
    radius: float
    prior: float
    points: np.ndarray = field(repr=False)
    residuals: np.ndarray = field(repr=False)
    loo_error: float = 0.0
    curve_error: float = 0.0
    geometry: bool = False
    geom_scale: float = 0.0
    _tree: list = field(default_factory=list, repr=False)

    def __getstate__(self) -> dict:
        state = {f: getattr(self, f) for f in self.__dataclass_fields__ if f != "_tree"}
        return state

    def __setstate__(self, state: dict) -> None:
        for k, v in state.items():
            object.__setattr__(self, k, v)
        object.__setattr__(self, "_tree", [])

    def features(self, batch=1, m=1, n=1, k=1, flops=0.0, nbytes=1.0, geometry=None) -> np.ndarray:
        """Scaled features of shapes; ``geometry`` (``[shapes, len(GEOMETRY_FIELDS)]``) is
        required by a correction fitted with the convolutions' geometry (ValueError without)."""
        if self.geometry:
            if geometry is None:
                raise ValueError("this correction was fitted on convolution geometry: pass the shapes' geometry")
            return conv_features(batch, m, n, k, geometry, self.m_scale, self.align_scale, self.geom_scale)
        if self.gemm:
            return gemm_features(batch, m, n, k, self.m_scale, self.align_scale)
        return stream_features(flops, nbytes)

    def _kdtree(self):
        if not self._tree:
            from scipy.spatial import cKDTree

            self._tree.append(cKDTree(self.points))
        return self._tree[0]

    def _neighbours(self, x: np.ndarray, kk: int) -> tuple[np.ndarray, np.ndarray]:
        """Distances and indices of the ``kk`` nearest measured shapes of each row of ``x``
        within ``radius``, nearest first (``inf`` and ``len(points)`` where fewer lie within):
        an exact search in groups of at most :data:`EXACT_SEARCH_POINTS` shapes (equidistant
        ones by index), the KD-tree in larger ones."""
        n = len(self.points)
        if n > EXACT_SEARCH_POINTS:
            d, i = self._kdtree().query(x, k=kk, distance_upper_bound=self.radius)
            return np.asarray(d, dtype=np.float64).reshape(len(x), kk), np.asarray(i).reshape(len(x), kk)
        dist = np.empty((len(x), kk))
        idx = np.empty((len(x), kk), dtype=np.intp)
        step = max(1, EXACT_SEARCH_PAIRS // n)
        for s in range(0, len(x), step):
            block = x[s:s + step]
            d2 = np.zeros((len(block), n))
            for j in range(x.shape[1]):
                diff = block[:, j][:, None] - self.points[:, j][None, :]
                d2 += diff * diff
            order = _nearest(d2, kk)
            d = np.sqrt(np.take_along_axis(d2, order, axis=1))
            within = d < self.radius
            dist[s:s + step] = np.where(within, d, np.inf)
            idx[s:s + step] = np.where(within, order, n)
        return dist, idx

    def log_factors(self, x: np.ndarray) -> np.ndarray:
        """Corrections ``ln(pred / curve)`` of shapes with features ``x`` ``[shapes, dims]``."""
        x = np.ascontiguousarray(np.atleast_2d(x), dtype=np.float64)
        kk = min(self.neighbours, len(self.points))
        d, i = self._neighbours(x, kk)
        found = np.isfinite(d)
        r = np.where(found, self.residuals[np.where(found, i, 0)], 0.0)
        return _combine(np.where(found, d, self.radius), r, self.radius, self.prior)

    def factors(self, x: np.ndarray) -> list[float]:
        """Multipliers ``pred / curve`` of shapes with features ``x``: exactly 1.0 where no
        measured shape lies within ``radius``."""
        return [math.exp(v) for v in self.log_factors(x).tolist()]

    def describe(self) -> dict:
        """The settings as a JSON-ready dict (the points and residuals are the table's rows)."""
        out: dict = {"kernel": "tricube", "neighbours": self.neighbours, "radius": self.radius,
                     "prior_weight": self.prior, "points": int(len(self.points)),
                     "loo_mean_abs_log_error": self.loo_error, "curve_mean_abs_log_error": self.curve_error}
        if self.gemm:
            out["features"] = ["m_scale*ln(batch)", "m_scale*ln(m)", "ln(n)", "ln(k)",
                               "align_scale*log2(pow2(n))", "align_scale*log2(pow2(k))"]
            out["m_scale"] = self.m_scale
            out["align_scale"] = self.align_scale
            if self.geometry:
                out["features"] += ["geom_scale*ln(R*S)", "geom_scale*ln(stride_h*stride_w)",
                                    "geom_scale*m_scale*ln(images)"]
                out["geom_scale"] = self.geom_scale
        else:
            out["features"] = ["ln(1+flops)", "ln(bytes)"]
        return out


def _square_distances(x: np.ndarray, start: np.ndarray | None = None) -> np.ndarray:
    """Squared Euclidean distances between the rows of ``x``, summed column by column (fixed
    order) onto a copy of ``start`` (the sum over earlier columns) when given."""
    d2 = np.zeros((len(x), len(x))) if start is None else start.copy()
    diff = np.empty_like(d2)  # one buffer for every column's differences and their squares
    for j in range(x.shape[1]):
        np.subtract(x[:, j][:, None], x[:, j][None, :], out=diff)
        np.multiply(diff, diff, out=diff)
        d2 += diff
    return d2


LARGE_GROUP = 4096
"""Shapes above which the leave-one-out neighbours come from a k-d tree instead of the full
matrix of distances (whose memory and time grow with the square of the shapes: a group of
imported measurements holds thousands); the same neighbours, equidistant ones in the tree's
order."""


def _loo_neighbours(x: np.ndarray, kmax: int, d2: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Distances and indices of the ``kmax`` nearest other points of each point (``d2``: the
    squared distances of ``x`` when already computed)."""
    if d2 is None and len(x) > LARGE_GROUP:
        from scipy.spatial import cKDTree

        kk = min(kmax, len(x) - 1)
        dist, idx = cKDTree(x).query(x, k=kk + 1)
        own = idx == np.arange(len(x))[:, None]  # drop each point itself (the first of its zero distances)
        keep = np.where(own.any(axis=1)[:, None], ~own, np.arange(kk + 1)[None, :] < kk)
        return dist[keep].reshape(len(x), kk), idx[keep].reshape(len(x), kk)
    d2 = _square_distances(x) if d2 is None else d2
    np.fill_diagonal(d2, np.inf)
    kk = min(kmax, len(x) - 1)
    order = _nearest(d2, kk)
    return np.sqrt(np.take_along_axis(d2, order, axis=1)), order


def _nearest(d2: np.ndarray, kk: int) -> np.ndarray:
    """Per row, the column indices of the ``kk`` smallest values, smallest first, ties by
    index: exactly ``argsort(d2, kind="stable")[:, :kk]``, in linear time per row (a partial
    selection, then a sort of the ``kk`` chosen; rows with ties at the ``kk``-th value are
    sorted in full)."""
    n = d2.shape[1]
    if kk >= n or kk <= 0:
        return np.argsort(d2, axis=1, kind="stable")[:, :max(kk, 0)]
    part = np.argpartition(d2, kk - 1, axis=1)[:, :kk]
    vals = np.take_along_axis(d2, part, axis=1)
    kth = vals.max(axis=1)
    order = np.lexsort((part, vals), axis=1)  # by value, then by index
    out = np.take_along_axis(part, order, axis=1)
    tied = np.flatnonzero(np.count_nonzero(d2 <= kth[:, None], axis=1) > kk)
    if len(tied):
        out[tied] = np.argsort(d2[tied], axis=1, kind="stable")[:, :kk]
    return out


def fit_correction(gemm: bool, batch, m, n, k, flops, nbytes, residuals,
                   grid: dict | None = None, geometry=None) -> ResidualCorrection | None:
    """Choose and build the correction of one group from its distinct measured shapes and
    their residuals ``ln(measured / curve)`` (arrays of equal length, one entry per distinct
    shape) by leave-one-out (see the module docstring); with ``geometry`` (convolutions:
    ``[shapes, len(GEOMETRY_FIELDS)]``) in the space that includes it. None when no setting
    beats the curve alone by :data:`MIN_GAIN`, or with fewer than :data:`MIN_SHAPES` shapes."""
    grid = GRID if grid is None else grid
    r = np.asarray(residuals, dtype=np.float64)
    if len(r) < MIN_SHAPES:
        return None
    use_geometry = gemm and geometry is not None
    curve_error = float(np.mean(np.abs(r)))
    best_error, best = curve_error * (1.0 - MIN_GAIN), None
    scales = grid.get("geom_scale", (0.0,)) if use_geometry else (0.0,)
    metrics = [(ms, sa, gs) for ms in grid["m_scale"] for sa in grid["align_scale"] for gs in scales] if gemm \
        else [(1.0, 0.0, 0.0)]
    kmax = max(grid["neighbours"])
    gemm_d2: dict[tuple[float, float], np.ndarray] = {}
    for ms, sa, gs in metrics:
        if use_geometry:  # the GEMM columns' distances once per (ms, sa), then the geometry's added
            x = conv_features(batch, m, n, k, geometry, ms, sa, gs)
            n_gemm = x.shape[1] - 3
            if (ms, sa) not in gemm_d2:
                gemm_d2 = {(ms, sa): _square_distances(x[:, :n_gemm])}
            d, idx = _loo_neighbours(x, kmax, _square_distances(x[:, n_gemm:], gemm_d2[(ms, sa)]))
        else:
            x = gemm_features(batch, m, n, k, ms, sa) if gemm else stream_features(flops, nbytes)
            d, idx = _loo_neighbours(x, kmax)
        rn = r[idx]
        for kk in grid["neighbours"]:
            kk = min(kk, d.shape[1])
            for radius in grid["radius"]:
                for prior in grid["prior"]:
                    c = _combine(d[:, :kk], rn[:, :kk], radius, prior)
                    error = float(np.mean(np.abs(r - c)))
                    if error < best_error:
                        best_error, best = error, (ms, sa, gs, kk, radius, prior, x)
    if best is None:
        return None
    ms, sa, gs, kk, radius, prior, x = best
    return ResidualCorrection(gemm, ms, sa, kk, radius, prior, x, r.copy(), best_error, curve_error, use_geometry, gs)
