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
1 there, so a measured shape gives its measured time back exactly. The measured decode grids
stop where ``sequences x keys`` reaches 256k-512k cached tokens (on the H100 grid of 16 query
heads over one key/value head, 256 sequences have no point past 2,048 keys and 512 none past
1,024; on that of Llama 3 8B's heads, 256 none past 1,024), so a decode kernel between two
lines of sequences of which one stops short of its keys is interpolated at its *cached tokens*
instead: between the nearest lines of fewer and of more sequences that measured ``b x s`` cached
tokens, each at its own key count (``s b / v`` on the line of ``v`` sequences), linear in
``ln b`` (:meth:`_Slice.same_cache`; each line's last measured point predicted this way from its
neighbours is within 2.0-4.5 % (median; p90 13-16 %) on the shipped H100, H200, B200 and GB200 decode grids;
``analysis/aiconfigurator_holdout.py``, section 8). A shape outside the measured range of every
line it needs is not interpolated: the caller falls back to the fitted curve -- except a kernel
past the longest key count of a line, which is extrapolated from that point
(``OpCost.model == "extrapolated"``): a context kernel longer than the longest prompt of a line
that reaches :data:`SATURATED_KEYS` keys as the ``s^2`` products it computes (the measured grids
stop at 16k-token prompts, long-context training runs 32k-128k per rank); a decode kernel over a
longer cache than a line's last measured one, where that point streams at least
:data:`SATURATED_DECODE_ROWS` key/value-head rows, as the cache it streams, linear in the keys;
below that plateau, as the line's own last slope of ``ln t`` over ``ln s`` continues, between 0
and linear (each line's last point so predicted: median 10-17 %, mean -4 to -6 %; linear in the
keys there, median 21-30 %, mean +29 to +38 %; section 8).

Only rows that carry their heads (:func:`marssim.cost.features.attention_geometry`) take part;
the ops carry theirs in their feature tuples (:func:`marssim.cost.features.attention_geometry_key`).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, replace
from enum import Enum

from marssim.workload.op import DTYPE_BYTES

from .features import (
    DTYPES, F_BACKEND, F_DTYPE, F_G, F_KK, F_M, F_NN, F_PHASE, KERNEL_BACKENDS, KERNEL_PHASES, attention_geometry,
    attention_geometry_key, lookup_backend,
)
from .loggrid import Point, SlicedGrid, Tree, blend, nest

__all__ = ["AttentionFamily", "SliceKey", "AttentionGrid", "family_of", "PRODUCTS", "row_entries", "op_slice",
           "op_seconds", "STANDINS", "SATURATED_KEYS", "SATURATED_DECODE_ROWS", "TAIL_EXPONENTS", "saturated"]

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

SATURATED_DECODE_ROWS = 1 << 20
"""Key/value-head rows (``sequences x keys x key/value heads``) from which a decode kernel streams
its cache at its plateau rate, so that past a line's last measured key count its time grows as
the keys it reads: on AIConfigurator's H100 decode grids a doubling of the keys past 1M rows
doubles the time within 15 % (mean ratio 1.85 between 1M and 3M rows, 2.01 past 3M; below 100k
rows launch and tail effects leave it at 1.05-1.45)."""

TAIL_EXPONENTS = {AttentionFamily.CONTEXT: 2.0, AttentionFamily.DECODE: 1.0}
"""Per family, the power of the key count a kernel's time follows past the longest measured one
(context: compute-bound ``s^2``; decode: the cache it streams, ``s``); a family without one is
not extrapolated."""


def saturated(family: AttentionFamily, group: int, heads: int, sequences: int, keys: int) -> bool:
    """Whether a measured point (``heads`` query heads, ``group`` of them per key/value head) runs
    at its family's plateau, so that a line may be extended past it: a context kernel of at least
    :data:`SATURATED_KEYS` keys, a decode kernel streaming at least :data:`SATURATED_DECODE_ROWS`
    key/value-head rows."""
    if family is AttentionFamily.CONTEXT:
        return keys >= SATURATED_KEYS
    return sequences * keys * max(1, heads // max(1, group)) >= SATURATED_DECODE_ROWS


class _Slice:
    """One slice: ``ln t`` by heads, then sequences, then keys, each level's keys sorted;
    ``key``: the slice's key; its family's tail (:data:`TAIL_EXPONENTS`) is the power of the keys
    its lines extend by past their longest measured key count where that point is
    :func:`saturated` (no tail: no extrapolation)."""

    def __init__(self, key: SliceKey) -> None:
        self.key = key
        self.tail = TAIL_EXPONENTS.get(key.family)
        self.points: dict[Point, float] = {}
        self.tree: Tree = {}
        self.heads: tuple[int, ...] = ()
        self.seqs: dict[int, tuple[int, ...]] = {}

    def freeze(self) -> None:
        self.tree, self.heads, self.seqs = nest(self.points)

    def along_keys(self, h: int, b: int, s: float, extrapolate: bool) -> float | None:
        keys, values = self.tree[h][b]
        last = keys[-1]
        if extrapolate and self.tail is not None and s > last:
            if saturated(self.key.family, self.key.group, h, b, last):
                return values[last] + self.tail * math.log(s / last)
            if self.key.family is AttentionFamily.DECODE and len(keys) > 1:
                # below the plateau: the line's own last slope in ln t over ln s, within [0, tail]
                prev = keys[-2]
                slope = (values[last] - values[prev]) / math.log(last / prev)
                return values[last] + min(max(slope, 0.0), self.tail) * math.log(s / last)
        return blend(keys, s, values.__getitem__)

    def along_seqs(self, h: int, b: int, s: int, extrapolate: bool) -> float | None:
        """Between the lines of the sequences that bracket ``b`` at ``s`` keys; where one stops short,
        a decode kernel between the lines at its cached tokens (:meth:`same_cache`); only then, with
        ``extrapolate``, each line extended past its last key count."""
        got = blend(self.seqs[h], b, lambda v: self.along_keys(h, v, s, False))
        if got is None and self.key.family is AttentionFamily.DECODE:
            got = self.same_cache(h, b, s)
        if got is None and extrapolate:
            got = blend(self.seqs[h], b, lambda v: self.along_keys(h, v, s, True))
        return got

    def same_cache(self, h: int, b: int, s: int) -> float | None:
        """A decode kernel of ``b`` sequences whose bracketing lines do not reach ``s`` keys: between
        the nearest lines of fewer and of more sequences that measured the same cached tokens
        (``b x s``), each at its own key count, linear in ``ln b``; None where no line on either
        side reaches them."""
        tokens = b * s
        seqs = self.seqs[h]

        def reaches(v: int) -> bool:
            keys = self.tree[h][v][0]
            return keys[0] <= tokens / v <= keys[-1]

        lo = next((v for v in reversed(seqs) if v < b and reaches(v)), None)
        hi = next((v for v in seqs if v > b and reaches(v)), None)
        if lo is None or hi is None:
            return None
        u = (math.log(b) - math.log(lo)) / (math.log(hi) - math.log(lo))
        t_lo, t_hi = self.along_keys(h, lo, tokens / lo, False), self.along_keys(h, hi, tokens / hi, False)
        return None if t_lo is None or t_hi is None else (1.0 - u) * t_lo + u * t_hi

    def value(self, h: int, b: int, s: int, extrapolate: bool = True) -> float | None:
        return blend(self.heads, h, lambda v: self.along_seqs(v, b, s, extrapolate))


class AttentionGrid(SlicedGrid):
    """Measured fused attention times of one GPU design, by slice (see the module docstring).

    Built from ``(SliceKey, heads, sequences, keys, seconds)`` entries; a second entry of one
    point keeps the faster time (as the measured lookups do)."""

    def __init__(self, entries: Iterable[tuple[SliceKey, int, int, int, float]] = ()) -> None:
        super().__init__(entries, _Slice)

    def slices(self) -> tuple[SliceKey, ...]:
        """The slices held, in insertion order."""
        return tuple(self._slices)

    def seconds(self, key: SliceKey, heads: int, sequences: int, keys: int, extrapolate: bool = True) -> float | None:
        """The interpolated time (s) of a kernel of slice ``key`` with ``heads`` query heads,
        ``sequences`` sequences and ``keys`` keys; None where the slice cannot interpolate it.
        ``extrapolate``: a kernel past the longest measured key count of a grid line whose last
        point is :func:`saturated` takes that point's time times ``(keys / longest)^p``, ``p``
        its family's :data:`TAIL_EXPONENTS` (context 2, decode 1)."""
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
    slice takes the fp16 one, and vice versa; a context kernel over keys and values of a
    narrower type (a prefill writing an FP8 cache) without a slice of its own takes that of keys
    and values of its own type (the engine's kernel over a bf16 cache: the time the prefill had
    before the stack measured its kernel with such a cache). A decode kernel has no such
    stand-in: its time is the cache it streams."""
    got = op_slice(x)
    if got is None:
        return None
    key, heads, seqs, keys = got
    keys_of = [key]
    own_bits = int(round(8 * DTYPE_BYTES.get(key.dtype, 0)))
    if key.family is AttentionFamily.CONTEXT and 0 < key.kv_bits < own_bits:
        keys_of.append(replace(key, kv_bits=own_bits))
    for k in keys_of:
        t = grid.seconds(k, heads, seqs, keys, extrapolate)
        twin = STANDINS.get(k.dtype)
        if t is None and twin is not None:
            t = grid.seconds(replace(k, dtype=twin), heads, seqs, keys, extrapolate)
        if t is not None:
            return t
    return None
