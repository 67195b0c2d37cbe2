"""A training stack's fused attention kernels, from their published forward and backward rates.

The fused attention grid of a GPU design (:mod:`marssim.cost.attention_grid`) holds the kernels
an inference engine measured (AIConfigurator's TensorRT-LLM context kernels on Hopper and
Blackwell), and a backward kernel is derived from its forward twin with FlashAttention-3's
published ratio (:mod:`marssim.cost.attention_backward`). A training stack runs other kernels,
of other speeds: on a Hopper GPU in 2024, FlashAttention-2 ran causal attention at about 330
TFLOP/s, cuDNN 9.1 at 540-590 and TensorRT-LLM's kernels reach 500-650. A *kernel set* is what a
public benchmark measured of one stack's kernels: the forward and backward TFLOP/s of
scaled-dot-product attention per backend (``flash``: FlashAttention-2; ``cudnn``: cuDNN's fused
attention), element type, mask and sequence length (``traces/attention-kernels/<name>.csv``, each
with its source; the names: :func:`kernel_sets`). A GPU design that names one
(``gpu.attention_kernels``) times its causal context attention kernels (``m == n``; the project's
LLM attention is causal) of a backend, element type and head dimension the set measured as::

    t_fwd(x) = W(x) / R(s)                  x of at least FULL_WAVES waves of query tiles
    t_fwd(x) = t_grid(x) * F(s)             fewer:  F(s) = t_set,fwd(S_s) / t_grid(S_s)
    t_bwd(x) = t_fwd(twin(x)) * B(s)                B(s) = t_set,bwd(S_s) / t_set,fwd(S_s)

with ``s`` the kernel's keys, ``W(x)`` its FLOPs as the benchmark counts them (``4 b s^2 h d``,
halved for the causal mask), ``R(s)`` the set's measured forward rate, ``S_s`` the set's measured
shape at ``s`` keys (its sequences and heads, in ``x``'s slice), ``t_grid`` the design's grid
(the slice of ``x``'s backend, else of the ``flash`` backend the engines' rows carry) and
``twin(x)`` the backward's forward kernel; ``R``, ``F`` and ``B`` are linear in ``ln s`` between
the set's lengths and constant outside them. A kernel of at least :data:`FULL_WAVES` waves of
query tiles (:data:`TILE_ROWS` rows of one sequence and head, one per SM at a time) fills the GPU
as the set's shapes did (they run 15 or more), so it runs at the set's rate whatever its heads and
batch; a smaller one keeps the grid's dependence on heads and batch, rescaled to the set at its
length. The backward is the set's own measured ratio in place of FlashAttention-3's
(``OpCost.model == "rescaled"``).
Assumption: the set's GPU and the design's share their SM array and clocks (a set names its GPU
and applies to designs of that generation: :data:`GENERATIONS`; TensorRT-LLM's H100 and H200
rows differ by 1-4% at 2k-16k tokens).
"""

from __future__ import annotations

import csv
import functools
import math
from dataclasses import dataclass, replace
from pathlib import Path

from marssim.errors import InputError

from .attention_backward import between, forward_twin
from .attention_grid import STANDINS, AttentionFamily, AttentionGrid, SliceKey, op_slice

__all__ = ["KernelPoint", "KernelSet", "kernel_sets", "load_kernel_set", "AttentionRescale", "GENERATIONS",
           "generation_of", "forward_flops", "TILE_ROWS", "FULL_WAVES"]

GENERATIONS = {"A100": "ampere", "H100": "hopper", "H200": "hopper", "B200": "blackwell", "GB200": "blackwell",
               "B300": "blackwell", "GB300": "blackwell"}
"""GPU (a calibration table's name) -> the SM generation a kernel set measured on it applies to."""

TILE_ROWS = 128
"""Query rows of one thread block of a fused attention kernel (FlashAttention-2's and cuDNN's
forward tile at head dimension 128)."""

FULL_WAVES = 4
"""Waves of query tiles over the GPU's SMs from which a kernel runs at a set's measured rate
(the last, partly filled wave then costs at most a fifth; the sets' shapes run 15 or more)."""

_COLUMNS = ("backend", "dtype", "causal", "batch", "heads", "kv_heads", "seq", "head_dim", "fwd_tflops", "bwd_tflops")


def generation_of(gpu: str) -> str | None:
    """The SM generation of GPU ``gpu`` (a calibration table's name, any case), None if unknown."""
    return GENERATIONS.get(gpu.upper())


@dataclass(frozen=True)
class KernelPoint:
    """One measured shape of a kernel set: ``batch`` sequences of ``seq`` tokens, ``heads``
    query heads over ``kv_heads`` key/value heads; forward and backward times in seconds (from
    the published TFLOP/s)."""

    batch: int
    heads: int
    kv_heads: int
    seq: int
    fwd_s: float
    bwd_s: float


@dataclass(frozen=True)
class KernelSet:
    """A stack's measured fused attention kernels: ``points[(backend, dtype, causal, head_dim)]``
    sorted by sequence length; ``gpu`` the GPU they were measured on; ``source`` the file's
    header (where the figures come from)."""

    name: str
    gpu: str
    source: str
    points: dict[tuple[str, str, bool, int], tuple[KernelPoint, ...]]

    def line(self, backend: str, dtype: str, head_dim: int, causal: bool = True) -> tuple[KernelPoint, ...]:
        """The measured points of one kernel (empty when the set has none)."""
        return self.points.get((backend, dtype, causal, head_dim), ())


def _directory() -> Path:
    from marssim.data import attention_kernels

    return attention_kernels()


def kernel_sets() -> dict[str, Path]:
    """The shipped kernel sets by name (file stem)."""
    return {p.stem: p for p in sorted(_directory().glob("*.csv"))}


def forward_flops(batch: int, heads: int, seq: int, head_dim: int, causal: bool) -> float:
    """The benchmark's count of one forward kernel's FLOPs: 4 b s^2 h d, halved when causal."""
    return 4.0 * batch * seq * seq * heads * head_dim / (2.0 if causal else 1.0)


@functools.lru_cache(maxsize=None)
def load_kernel_set(name: str) -> KernelSet:
    """The shipped kernel set ``name``; InputError naming the file, the row and the column for
    a malformed one, or the sets there are for an unknown name."""
    sets = kernel_sets()
    path = sets.get(name)
    if path is None:
        raise InputError(None, "attention_kernels",
                         f"unknown attention kernel set {name!r}; expected one of {', '.join(sets) or 'none'}")
    text = path.read_text(encoding="utf-8")
    header = [ln[1:].strip() for ln in text.splitlines() if ln.startswith("#")]
    gpu = next((ln.split(":", 1)[1].split()[0] for ln in header if ln.startswith("gpu:")), "")
    if gpu.upper() not in GENERATIONS:
        raise InputError(path, "header", f"expected a line '# gpu: <name>' naming one of {', '.join(GENERATIONS)}, "
                                         f"got {gpu or 'none'!r}")
    rows = csv.DictReader(ln for ln in text.splitlines() if ln and not ln.startswith("#"))
    if tuple(rows.fieldnames or ()) != _COLUMNS:
        raise InputError(path, "columns", f"expected {','.join(_COLUMNS)}, got {','.join(rows.fieldnames or ())}")
    lines: dict[tuple[str, str, bool, int], list[KernelPoint]] = {}
    for i, r in enumerate(rows, start=1):
        try:
            causal = {"true": True, "false": False}[r["causal"]]
            b, h, kv, s, d = (int(r[c]) for c in ("batch", "heads", "kv_heads", "seq", "head_dim"))
            fwd, bwd = float(r["fwd_tflops"]), float(r["bwd_tflops"])
            if min(b, h, kv, s, d) < 1 or h % kv or not (fwd > 0 and bwd > 0):
                raise ValueError("sizes and rates must be positive, heads a multiple of kv_heads")
        except (KeyError, ValueError) as exc:
            raise InputError(path, f"row {i}", f"expected causal true/false, positive whole sizes and TFLOP/s; {exc}")
        f = forward_flops(b, h, s, d, causal)
        lines.setdefault((r["backend"], r["dtype"], causal, d), []).append(
            KernelPoint(b, h, kv, s, f / (fwd * 1e12), 2.5 * f / (bwd * 1e12)))
    return KernelSet(name, gpu.upper(), " ".join(header),
                     {k: tuple(sorted(v, key=lambda p: p.seq)) for k, v in lines.items()})


class AttentionRescale:
    """The causal context attention kernels of one GPU design of ``sms`` SMs timed as kernel set
    ``kernels`` runs them, from the design's fused attention ``grid`` (see the module docstring)."""

    def __init__(self, kernels: KernelSet, grid: AttentionGrid, sms: int) -> None:
        self.kernels = kernels
        self.grid = grid
        self.full = FULL_WAVES * sms
        """Query tiles from which a kernel runs at the set's rate (:data:`FULL_WAVES` waves)."""
        self._factors: dict[tuple[SliceKey, bool], list[tuple[float, float]] | None] = {}
        self._rate_lines: dict[SliceKey, list[tuple[float, float]] | None] = {}

    def _reference(self, key: SliceKey, heads: int, sequences: int, keys: int) -> tuple[SliceKey, float] | None:
        """The grid's time of a forward kernel of slice ``key`` (its backend's slice, else the
        ``flash`` one; bf16 and fp16 standing in for each other) and the slice that gave it."""
        for backend in dict.fromkeys((key.backend, "flash")):
            for dtype in dict.fromkeys((key.dtype, STANDINS.get(key.dtype, key.dtype))):
                k = replace(key, backend=backend, dtype=dtype)
                t = self.grid.seconds(k, heads, sequences, keys)
                if t is not None:
                    return k, t
        return None

    def _curve(self, key: SliceKey, backward: bool) -> list[tuple[float, float]] | None:
        """``(ln s, F(s))`` (forward) or ``(ln s, B(s))`` (backward) at the set's measured lengths
        for forward slice ``key``; None when the set has no such kernel or the grid no reference."""
        memo = (key, backward)
        if memo in self._factors:
            return self._factors[memo]
        line = self.kernels.line(key.backend, key.dtype, key.head_dim)
        curve = []
        for p in line:
            if backward:
                curve.append((math.log(p.seq), p.bwd_s / p.fwd_s))
                continue
            heads = max(key.group, p.heads - p.heads % key.group)  # a whole number of key/value heads
            ref = self._reference(key, heads, p.batch, p.seq)
            if ref is not None:
                curve.append((math.log(p.seq), p.fwd_s * heads / p.heads / ref[1]))
        self._factors[memo] = curve or None
        return self._factors[memo]

    def _rates(self, key: SliceKey) -> list[tuple[float, float]] | None:
        """``(ln s, forward FLOP/s)`` at the set's measured lengths for forward slice ``key``;
        None when the set has no such kernel."""
        if key not in self._rate_lines:
            line = self.kernels.line(key.backend, key.dtype, key.head_dim)
            self._rate_lines[key] = [(math.log(p.seq), forward_flops(p.batch, p.heads, p.seq, key.head_dim, True)
                                      / p.fwd_s) for p in line] or None
        return self._rate_lines[key]

    def seconds(self, x: tuple[int, ...]) -> float | None:
        """The time (s) of the op with feature tuple ``x`` as the set's stack runs it; None for
        an op the set does not time (not a causal context kernel of a backend, element type and
        head dimension it measured, or one the grid has no reference for)."""
        got = op_slice(x)
        if got is None or got[0].family is not AttentionFamily.CONTEXT:
            return None
        key, heads, sequences, keys = got
        if key.phase == "bwd":
            twin = forward_twin(x)
            fwd = None if twin is None else self.seconds(twin)
            curve = None if fwd is None else self._curve(replace(key, phase="fwd"), backward=True)
            return None if curve is None else fwd * between(curve, math.log(keys))
        if key.phase != "fwd":
            return None
        rates = self._rates(key)
        if rates is None:
            return None
        if sequences * heads * math.ceil(keys / TILE_ROWS) >= self.full:  # the GPU filled: the set's rate
            return forward_flops(sequences, heads, keys, key.head_dim, True) / between(rates, math.log(keys))
        curve = self._curve(key, backward=False)
        ref = None if curve is None else self._reference(key, heads, sequences, keys)
        return None if ref is None else ref[1] * between(curve, math.log(keys))
