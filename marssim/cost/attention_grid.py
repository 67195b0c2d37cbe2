"""Fused attention kernels between measured shapes: multilinear interpolation in log space.

A fused attention kernel's time is not a GEMM's: a context (prefill) kernel is bound by the
causal ``s^2`` products, a decode (generation) kernel by the keys and values it streams from the
cache, and both by launch and tail effects at small sizes. The kind's efficiency curve, fitted
on the unfused products (:mod:`marssim.cost.calibrated`), times them poorly (errors of tens of
percent). Measured fused attention tables (AIConfigurator's, :mod:`marssim.calibrate.aiconfigurator`)
are dense grids, so a shape between their points is timed from them instead::

    ln t(h, b, s) = sum over the 2^3 corners c of  w_c ln t_c         (multilinear)

over the measured points of one *slice* -- rows of one (dtype, phase, backend, head dimension,
family, grouped-query ratio ``heads / kv_heads``, key/value element bits) -- with axes ``ln h``
(query heads), ``ln b`` (sequences: ``batch / (products x h)``) and ``ln s`` (keys: the prompt
length of a context kernel, the KV length of a decode kernel), ``w_c`` the products of the
linear weights along each axis. The axes are taken one after the other, each between the
nearest values measured on its line: along ``s`` between the key counts measured for the
corner's ``(h, b)``, along ``b`` between the sequence counts measured for its ``h``, along ``h``
between the head counts of the slice; so a hole in the grid (a shape not measured) is bridged
by its measured neighbours on the line. The family is ``context`` (``m == n``: a prompt attending to
itself) or ``decode`` (``m == 1``: one query per sequence over its cache); other shapes
(chunked prefill, speculative verification) have no slice. A value on a grid line takes weight
1 there, so a measured shape gives its measured time back exactly. A shape outside the
measured range of a line it needs (decode grids stop where the cache would not fit) is not
interpolated: the caller falls back to the fitted curve -- except a context kernel longer than
the longest prompt of a line that reaches :data:`SATURATED_KEYS` keys, which is extrapolated as
the ``s^2`` products of a kernel at its plateau throughput (``OpCost.model == "extrapolated"``;
the measured grids stop at 16k-token prompts, long-context training runs 32k-128k per rank).

Only rows that carry their heads (:func:`marssim.cost.features.attention_geometry`) take part;
the ops carry theirs in their feature tuples (:func:`marssim.cost.features.attention_geometry_key`).
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Iterable
from dataclasses import dataclass, replace
from enum import Enum

from .features import (
    DTYPES, F_BACKEND, F_DTYPE, F_G, F_KK, F_M, F_NN, F_PHASE, KERNEL_BACKENDS, KERNEL_PHASES, attention_geometry,
    attention_geometry_key, lookup_backend,
)

__all__ = ["AttentionFamily", "SliceKey", "AttentionGrid", "family_of", "PRODUCTS", "row_entries", "op_slice",
           "op_seconds", "STANDINS"]

PRODUCTS = {"fwd": 2, "bwd": 4}
"""Products a fused attention kernel of a phase counts in its ``batch`` (``Q K^T`` and ``P V``
forward; four backward: :mod:`marssim.workload.op`)."""


class AttentionFamily(Enum):
    """Which grid a fused attention shape belongs to."""

    CONTEXT = "context"
    DECODE = "decode"


def family_of(m: int, n: int) -> AttentionFamily | None:
    """``context`` for ``m == n`` queries and keys, ``decode`` for one query (``m == 1 < n``),
    None otherwise."""
    if m == n:
        return AttentionFamily.CONTEXT
    if m == 1:
        return AttentionFamily.DECODE
    return None


@dataclass(frozen=True)
class SliceKey:
    """The rows one grid interpolates between: element type, phase, backend, head dimension,
    family, grouped-query ratio (query heads per key/value head) and key/value element bits."""

    dtype: str
    phase: str
    backend: str
    head_dim: int
    family: AttentionFamily
    group: int
    kv_bits: int


SATURATED_KEYS = 4096
"""Keys from which a context kernel runs at its plateau throughput (FlashAttention-3's and cuDNN's
published H100 rates at 4k tokens are within 3 % of those at 16k: Shah et al., 2024), so that
beyond the longest measured prompt its time grows as the ``s^2`` products it computes."""

TAIL_EXPONENTS = {AttentionFamily.CONTEXT: 2.0}
"""Per family, the power of the key count a kernel's time follows past the longest measured one
(context: compute-bound ``s^2``); a family without one is not extrapolated."""


class _Slice:
    """One slice: ``ln t`` by heads, then sequences, then keys, each level's keys sorted;
    ``tail``: the power of the keys its lines extend by past their longest measured key count
    (None: no extrapolation)."""

    def __init__(self, tail: float | None = None) -> None:
        self.tail = tail
        self.points: dict[tuple[int, int, int], float] = {}
        self.tree: dict[int, dict[int, tuple[tuple[int, ...], dict[int, float]]]] = {}
        self.heads: tuple[int, ...] = ()
        self.seqs: dict[int, tuple[int, ...]] = {}

    def freeze(self) -> None:
        lines: dict[int, dict[int, list[tuple[int, float]]]] = {}
        for (h, b, s), lt in self.points.items():
            lines.setdefault(h, {}).setdefault(b, []).append((s, lt))
        self.tree = {h: {b: (tuple(sorted(s for s, _ in v)), dict(v)) for b, v in by_b.items()}
                     for h, by_b in lines.items()}
        self.heads = tuple(sorted(self.tree))
        self.seqs = {h: tuple(sorted(by_b)) for h, by_b in self.tree.items()}

    def along_keys(self, h: int, b: int, s: int, extrapolate: bool) -> float | None:
        keys, values = self.tree[h][b]
        last = keys[-1]
        if extrapolate and self.tail is not None and s > last >= SATURATED_KEYS:
            return values[last] + self.tail * math.log(s / last)
        return _blend(keys, s, values.__getitem__)

    def along_seqs(self, h: int, b: int, s: int, extrapolate: bool) -> float | None:
        return _blend(self.seqs[h], b, lambda v: self.along_keys(h, v, s, extrapolate))

    def value(self, h: int, b: int, s: int, extrapolate: bool = True) -> float | None:
        return _blend(self.heads, h, lambda v: self.along_seqs(v, b, s, extrapolate))


def _blend(axis: tuple[int, ...], x: int, inner) -> float | None:
    """The weighted sum of ``inner(v)`` over the grid values ``v`` of ``axis`` that bracket ``x``
    (:func:`_bracket`); None outside the axis or where ``inner`` has no value."""
    got = _bracket(axis, x)
    if got is None:
        return None
    total = 0.0
    for v, w in got:
        lt = inner(v)
        if lt is None:
            return None
        total += w * lt
    return total


def _bracket(axis: tuple[int, ...], v: int) -> list[tuple[int, float]] | None:
    """``[(grid value, weight)]`` of ``v`` on ``axis``, linear in ``ln v``: one entry on a grid
    value, two between, None outside."""
    if not axis or v < axis[0] or v > axis[-1]:
        return None
    i = bisect.bisect_left(axis, v)
    if axis[i] == v:
        return [(v, 1.0)]
    lo, hi = axis[i - 1], axis[i]
    u = (math.log(v) - math.log(lo)) / (math.log(hi) - math.log(lo))
    return [(lo, 1.0 - u), (hi, u)]


class AttentionGrid:
    """Measured fused attention times of one GPU design, by slice (see the module docstring).

    Built from ``(SliceKey, heads, sequences, keys, seconds)`` entries; a second entry of one
    point keeps the faster time (as the measured lookups do)."""

    def __init__(self, entries: Iterable[tuple[SliceKey, int, int, int, float]] = ()) -> None:
        self._slices: dict[SliceKey, _Slice] = {}
        for key, h, b, s, seconds in entries:
            if h < 1 or b < 1 or s < 1 or not seconds > 0:
                continue
            sl = self._slices.get(key)
            if sl is None:
                sl = self._slices[key] = _Slice(TAIL_EXPONENTS.get(key.family))
            lt = math.log(seconds)
            old = sl.points.get((h, b, s))
            sl.points[(h, b, s)] = lt if old is None else min(old, lt)
        for sl in self._slices.values():
            sl.freeze()

    def __len__(self) -> int:
        return sum(len(s.points) for s in self._slices.values())

    def __bool__(self) -> bool:
        return bool(self._slices)

    def slices(self) -> tuple[SliceKey, ...]:
        """The slices held, in insertion order."""
        return tuple(self._slices)

    def seconds(self, key: SliceKey, heads: int, sequences: int, keys: int, extrapolate: bool = True) -> float | None:
        """The interpolated time (s) of a kernel of slice ``key`` with ``heads`` query heads,
        ``sequences`` sequences and ``keys`` keys; None where the slice cannot interpolate it.
        ``extrapolate``: a context kernel past the longest measured prompt of a grid line that
        reaches :data:`SATURATED_KEYS` takes that prompt's time times ``(keys / longest)^2``."""
        sl = self._slices.get(key)
        if sl is None:
            return None
        lt = sl.value(heads, sequences, keys, extrapolate)
        return None if lt is None else math.exp(lt)


def row_entries(rows: Iterable) -> list[tuple[SliceKey, int, int, int, float]]:
    """The grid entries of calibration rows (:class:`~marssim.cost.calibrated.KernelTiming`):
    the fused attention rows with their heads (:func:`~marssim.cost.features.attention_geometry`)
    of a family, a whole number of sequences and query heads a multiple of key/value heads."""
    out = []
    for r in rows:
        backend = lookup_backend(r.kind, r.backend)
        geo = attention_geometry(r.kind, r.backend, r.note, r.dtype) if backend else ()
        family = family_of(r.m, r.n)
        products = PRODUCTS.get(r.phase or "fwd")
        if not geo or family is None or products is None:
            continue
        heads, kv, bits = geo
        if heads % kv or r.batch % (products * heads):
            continue
        key = SliceKey(r.dtype, r.phase or "fwd", backend, int(r.k), family, heads // kv, bits)
        out.append((key, heads, r.batch // (products * heads), int(r.n), float(r.median_s)))
    return out


def op_slice(x: tuple[int, ...]) -> tuple[SliceKey, int, int, int] | None:
    """``(slice, heads, sequences, keys)`` of the op with feature tuple ``x``
    (:func:`marssim.cost.features.op_features`), None when it is not a fused attention kernel of
    a family."""
    geo = attention_geometry_key(x)
    if not geo:
        return None
    heads, kv, bits = geo
    family = family_of(x[F_M], x[F_NN])
    phase = KERNEL_PHASES[x[F_PHASE]]
    products = PRODUCTS.get(phase)
    if family is None or products is None or heads < 1 or kv < 1 or heads % kv or x[F_G] % (products * heads):
        return None
    key = SliceKey(DTYPES[x[F_DTYPE]], phase, KERNEL_BACKENDS[x[F_BACKEND]], x[F_KK], family, heads // kv, bits)
    return key, heads, x[F_G] // (products * heads), x[F_NN]


STANDINS = {"bf16": "fp16", "fp16": "bf16"}
"""Element types whose fused attention kernels stand in for each other's (as
:data:`marssim.cost.calibrated.DTYPE_STANDINS` for measured rows)."""


def op_seconds(grid: AttentionGrid, x: tuple[int, ...], extrapolate: bool = True) -> float | None:
    """The interpolated time (s) of the op with feature tuple ``x``, or None (not a fused
    attention kernel of a family, or no slice interpolates it); a bf16 kernel without a bf16
    slice takes the fp16 one, and vice versa."""
    got = op_slice(x)
    if got is None:
        return None
    key, heads, seqs, keys = got
    t = grid.seconds(key, heads, seqs, keys, extrapolate)
    twin = STANDINS.get(key.dtype)
    if t is None and twin is not None:
        t = grid.seconds(replace(key, dtype=twin), heads, seqs, keys, extrapolate)
    return t
