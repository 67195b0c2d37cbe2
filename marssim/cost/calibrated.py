"""Kernel timing tables (``traces/calibration/*.csv``) and the efficiency-curve fit.

A calibrated GPU model predicts the time of a kernel of any shape from measured timings of
kernels of a few shapes: for every (device, kernel kind, dtype, tuning) group of a table it fits
the four parameters of the GPU efficiency curve of :mod:`marssim.cost.gpu` (``rate``,
``bandwidth``, ``k_half``, ``launch``; wave quantisation and tile padding use the device's SM
count and the tile) by least squares on log time (``scipy.optimize.least_squares``). The curve
captures the physics (roofline, waves, tile padding, short K) but not what a kernel library
does between shapes (algorithm and tile switches, misaligned N or K, fp32 on CUDA cores), which
on a real H100 table leaves 10-50 % errors. So the prediction for an unmeasured shape is the
curve times a local residual correction (:mod:`marssim.cost.residual`): the tricube-weighted
mean of ``ln(measured / curve)`` over the nearest measured shapes of the group in a scaled
log-shape space, shrunk toward 0 by a prior weight, exactly 0 (the curve alone) when no
measured shape lies within the group's radius, so extrapolation falls back to the curve. The
settings are chosen per group by leave-one-out on the group's rows (no correction at all
where that is not clearly better than the curve, e.g. a table the curve explains up to
noise). Kinds without data fall back to the analytical curve, and say so (the ``model`` of
their :class:`~marssim.cost.base.OpCost` is ``gpu-roofline``; see
:meth:`marssim.cost.DataflowCost.coverage`).

Measured shapes are used as measured. A kernel whose shape is in the table takes the table's
median time, not the model's value there (``OpCost.model == "measured"``): a user who measured
a layer expects the simulator to charge what was measured. The shape is :func:`shape_key`:
GEMM-class kinds by ``(kind, dtype, batch, m, n, k)`` -- the GEMM the kernel computes -- and,
for a convolution row with the ``conv_*`` geometry columns, by that geometry too
(:mod:`marssim.cost.convgeom`: channels, input size, kernel, stride, padding, dilation,
groups), so a convolution matches only a row of its own geometry, not another convolution
with the same im2col GEMM; streaming kinds by ``(kind, dtype, flops, bytes)``. A convolution
row without geometry (tables measured before the columns existed) matches any convolution of
its GEMM shape, as it always did. Among rows of one shape the most tuned tuning wins (as for
the fits), then the fastest median (a framework that measured several kernels for a shape
runs the fastest). The curve still times every other shape; ``DataflowCost(measured=False)``
uses the model (curve x correction) everywhere and ``DataflowCost(correction=False)`` the
curve alone for unmeasured shapes. A group of convolution rows that all carry their geometry
is corrected from its neighbours in a space that includes the geometry
(:mod:`marssim.cost.residual`).

The kinds cover the kernels of transformer training and inference without new columns: a
GEMM's gradients are ``gemm`` rows of phase ``dgrad``/``wgrad`` (the weight gradient by its
``K x N`` by tokens view); the backward attention products ``attention`` rows of phase ``dgrad``
(the first operand's gradient) and ``wgrad`` (the second's: a contraction over the queries);
fused attention (forward, backward, decode over a KV cache: one query row) is ``attention``
with ``backend`` naming the scaled-dot-product attention implementation (``flash``,
``efficient``, ``cudnn``, ``math``) and phase ``fwd``/``bwd``, its shape ``batch = products x
batch x heads`` (2 forward, 4 backward: :mod:`marssim.workload.op`), ``m`` queries, ``n`` keys,
``k`` the head dimension; norms and their gradients are ``norm`` (phase ``fwd``/``bwd``), GeLU,
SwiGLU, dropout, rotary embedding and their gradients ``elementwise``, the AdamW step
``elementwise`` of phase ``update``, a token lookup ``embedding``.

The phase and the fused attention backend are part of the shape a row is looked up by
(:func:`shape_key`), and so are a fused attention kernel's heads, key/value heads and cache type
where the row's note gives them (:func:`attention_geometry`: a decode kernel's time follows its
key/value heads and their width, which ``batch = products x batch x heads`` does not say): an
op's kernel phase and backend come from the op
(:func:`marssim.cost.features.kernel_phase`, :func:`~marssim.cost.features.kernel_backend`),
so a weight-gradient GEMM takes the ``wgrad`` row of its shape and a fused attention op
(``attention=flash``) the ``flash`` row of its own, never a row of the unfused products; a
gradient kernel whose shape has no row of its phase takes the ``fwd`` row of the same shape
(:func:`lookup_keys`: a GEMM's gradient is a GEMM of that shape, and tables measured before
the phases were kept time training graphs as before), except a fused attention backward, which
without a row of its own is its measured (or interpolated) forward twin times the published
ratio of the two (:mod:`marssim.cost.attention_backward`, ``OpCost.model == "derived"``).
The efficiency curves are fitted on the forward rows of the unfused kernels only -- rows of phase ``fwd`` without a fused attention
backend (:meth:`KernelTable.groups`) -- so every other shape of a kind, gradients included, is
timed by its kind's forward curve: gradient GEMMs are GEMMs of their view. A fused attention
shape between measured fused attention kernels with their heads (a context or decode kernel of
the same heads ratio, cache type and head dimension) is interpolated between them in log space
(:mod:`marssim.cost.attention_grid`; ``OpCost.model == "interpolated"``); any other fused
attention op's products are timed by the curve as the batched attention products they fuse, at
its own (smaller) traffic. The LLM calibration grid (:mod:`marssim.calibrate.llm`)
measures exactly the shapes the LLM workloads ask for, so those take measured rows.

CSV schema
----------
One header line, then one row per kernel shape; lines starting with ``#`` are comments (a table
says where it came from there). Columns, in any order:

==========  =======================================================================================
column      meaning
==========  =======================================================================================
kind        kernel kind: gemm, conv, attention (GEMM-class); elementwise, norm, softmax, pool,
            embedding, reshape (streaming)
dtype       element type the kernel computes in: fp32, tf32, fp16, bf16, fp8, int8, int32, int64, fp4;
            a GEMM's is its inputs' (an FP8 GEMM of Transformer Engine reading FP8 and writing bf16 is
            ``fp8``, its ``bytes`` counting each operand at its own width; ``fp4`` is NVFP4), and a
            fit of its rows is bounded by the device's peak of that type
batch       GEMM-class: independent GEMMs (groups, batch x heads), integer >= 1; others: empty or 0
m, n, k     GEMM-class: the GEMM ``m x k`` times ``k x n`` (convs: im2col ``N*P*Q``, ``K``,
            ``C*R*S``), integers >= 1; others: empty or 0
flops       floating-point operations of the kernel; GEMM-class: exactly ``2*batch*m*n*k``
bytes       compulsory DRAM traffic of the kernel (inputs + weights + outputs), > 0
device      device name, matched (case-insensitively) against a design's ``gpu.calibration``
sms         streaming multiprocessors of the device, integer >= 1
driver      driver version (``550.54.15``)
cuda        CUDA version (``12.4``)
tuning      how the kernel was tuned: none, vendor (cuBLAS/cuDNN heuristics), triton-autotune, sip
median_s    median time of the samples, seconds, > 0
spread_s    inter-quartile range (p75 - p25) of the samples, seconds, >= 0
samples     number of timed runs, integer >= 1
date        date of the measurement, ISO ``YYYY-MM-DD``
kernel      optional: kernel name or source
phase       optional: ``fwd`` (the default when empty or absent), ``dgrad`` (gradient of the input),
            ``wgrad`` (gradient of the weights), ``bwd`` (any other backward kernel: a fused
            attention backward computing all gradients, norm and activation gradients),
            ``update`` (an optimizer step)
backend     optional: the implementation a framework chose among several for the same call
            (``flash``, ``efficient``, ``cudnn``, ``math`` for scaled-dot-product attention,
            ``fused``/``foreach`` for the AdamW step; free text); rows differing only in backend
            are different kernels of one shape. On ``attention`` rows a scaled-dot-product
            attention backend is part of the shape looked up (:func:`shape_key`)
conv_c      optional, ``conv`` rows only: input channels (all groups); with conv_h, conv_w (input
            rows and columns the kernel reads), conv_k (output channels), conv_r, conv_s (kernel
            rows and columns), conv_stride, conv_pad (an integer, or ``HxW`` when the axes differ),
            conv_dilation and conv_groups: the convolution's geometry
            (:mod:`marssim.cost.convgeom`). All empty, or all given and consistent with
            ``batch, m, n, k`` (``batch = groups``, ``n = conv_k / groups``, ``k = conv_c / groups
            x conv_r x conv_s``, ``m`` a multiple of the output plane)
stack       optional: the software stack the kernel was measured on, a short name (``pytorch-2.11.0+cu130``,
            ``vidur-2024``); empty: ``pytorch-<version>`` when the ``note`` has ``torch=<version>``
            (what the measurement harness records), else unknown. A GPU design that names a
            ``gpu.stack`` uses the rows of that stack and the rows of unknown stack only
            (:meth:`KernelTable.for_stack`); see "Software stacks" below
note        optional: free text (the harness and the importers of published data write
            ``key=value`` pairs: the source, its commit, file and license, the conditions); on a
            fused attention row, ``heads``, ``kv_heads`` and ``kv_dtype`` (default: ``dtype``) are
            part of the shape looked up (:func:`attention_geometry`)
==========  =======================================================================================

Software stacks
---------------
Kernel speed depends on the software that runs it (CUDA, cuBLAS, the framework and its kernels),
so every row says which stack measured it (``stack``) and a design says which stack it models
(``gpu.stack`` of :class:`marssim.system.design.GpuSpec`): its measured lookups and its curve
fits use that stack's rows (and rows of unknown stack, e.g. the SIP tuner's), never another
stack's. A design without ``gpu.stack`` uses every row of its device, as tables with one stack
always did. A design may also name ``gpu.fallback_stacks``: the kernel families (kind, dtype,
attention backend) its stack did not measure take the rows of the first of them that did
(:func:`marssim.cost.model.design_stacks`). Shipped tables: ``H100.csv`` holds
``pytorch-2.11.0+cu130`` (the measurement harness, 2026) and ``vidur-2024`` (Vidur's published
profiles, :mod:`marssim.calibrate.published`); ``A100.csv`` holds ``vidur-2024``;
``H100-aiconfigurator.csv``, ``H200-aiconfigurator.csv``, ``B200-aiconfigurator.csv`` and
``GB200-aiconfigurator.csv`` hold
``trtllm-1.3.0rc20`` (NVIDIA AIConfigurator's GEMMs and context and decode attention kernels,
:mod:`marssim.calibrate.aiconfigurator`).

Bad rows raise :class:`~marssim.errors.InputError` naming the file, the line and the column.

API: :func:`load_table` / :func:`load_tables` read tables; :func:`fit` fits every group of a
table and returns :class:`KernelFit` values (curve parameters and correction); :func:`predict`
evaluates a fit on shapes;
:func:`holdout_errors` fits on part of a table and reports the prediction error on the rest.
"""

from __future__ import annotations

import csv
import datetime as _dt
import math
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from marssim.errors import InputError

from .convgeom import ConvGeometry, format_pair, parse_pair
from .features import (DTYPES, KERNEL_KINDS, KERNEL_PHASES, N_GEMM_KERNELS, attention_geometry,
                       lookup_backend)
from .gpu import TILE_K, CurveParams, gemm_curve, stream_curve
from .residual import ResidualCorrection, fit_correction

__all__ = [
    "REQUIRED_COLUMNS", "OPTIONAL_COLUMNS", "CONV_COLUMNS", "PHASES", "TUNINGS", "KernelTiming", "KernelTable",
    "KernelFit", "FitKey", "load_table", "load_tables", "fit", "fit_group", "predict", "holdout_errors",
    "traces_dir", "calibration_dir", "shape_key", "lookup_keys", "conv_cells", "parse_conv_cells", "geometry_array",
    "KEY_GEOMETRY", "KEY_PHASE", "row_stack", "DTYPE_STANDINS",
]

REQUIRED_COLUMNS = ("kind", "dtype", "batch", "m", "n", "k", "flops", "bytes", "device", "sms", "driver", "cuda",
                    "tuning", "median_s", "spread_s", "samples", "date")
CONV_COLUMNS = ("conv_c", "conv_h", "conv_w", "conv_k", "conv_r", "conv_s", "conv_stride", "conv_pad",
                "conv_dilation", "conv_groups")
"""The convolution geometry columns (see the module docstring), in written order."""
OPTIONAL_COLUMNS = ("kernel", "phase", "backend", *CONV_COLUMNS, "stack", "note")
PHASES = KERNEL_PHASES
"""Accepted ``phase`` values (empty means ``fwd``; :data:`marssim.cost.features.KERNEL_PHASES`)."""
TUNINGS = ("none", "vendor", "triton-autotune", "sip")
"""Accepted ``tuning`` values, least to most tuned."""
DTYPE_STANDINS = {"bf16": "fp16", "fp16": "bf16", "fp8": "mxfp8"}
"""Dtypes whose kernels stand in for another's (key -> the dtype it stands in for) where a table
measured none of the latter: ``bf16`` and ``fp16`` run on the same tensor cores at the same dense
peak (A100, H100 datasheets) and move the same bytes, so a ``bf16`` kernel without ``bf16`` rows
is timed by the ``fp16`` rows of its shape and curve, and vice versa (Vidur's published profiles
are ``fp16``; Megatron-LM trains in ``bf16``); the per-tensor ``fp8`` kernels time ``mxfp8``
ones (no table measures MXFP8 GEMMs; Blackwell's block-scaled MMA applies the scales at the FP8
rate, and its operands are 3 % larger), not the other way round."""
GEMM_KINDS = KERNEL_KINDS[:N_GEMM_KERNELS]

FitKey = tuple[str, str, str, str]
"""``(device, kind, dtype, tuning)``: one fitted group (device as written in the table)."""


def traces_dir() -> Path:
    """Directory of traces and calibration tables: ``$MARSSIM_TRACES`` or the checkout's ``traces/``."""
    env = os.environ.get("MARSSIM_TRACES")
    if env:
        return Path(env)
    return Path(__file__).resolve().parents[2] / "traces"


def calibration_dir() -> Path:
    """Where :func:`marssim.cost.default_cost_model` looks: ``$MARSSIM_TRACES/calibration``, else
    the calibration tables that ship with marssim (package data; :func:`marssim.data.calibration`)."""
    if os.environ.get("MARSSIM_TRACES"):
        return traces_dir() / "calibration"
    from marssim.data import calibration

    return calibration()


def shape_key(kind: str, dtype: str, batch: int, m: int, n: int, k: int, flops: float,
              nbytes: float, conv: ConvGeometry | tuple[int, ...] | None = None, phase: str = "fwd",
              backend: str = "", attention: tuple[int, ...] = ()) -> tuple:
    """The shape by which a measured kernel time is looked up (see the module docstring):
    ``(kind, dtype, batch, m, n, k, 0, 0, geometry, phase, backend)`` for GEMM-class kinds,
    ``geometry`` the convolution's :attr:`~marssim.cost.convgeom.ConvGeometry.match_key`, a fused
    attention kernel's ``attention`` (:func:`attention_geometry`: heads, key/value heads and
    their bits), else ``()``, and ``(kind, dtype, 0, 0, 0, 0, flops, bytes, (), phase, backend)``
    for streaming kinds (numbers rounded to integers); ``backend`` as :func:`lookup_backend`
    gives it."""
    tail = (phase or "fwd", lookup_backend(kind, backend))
    if kind in GEMM_KINDS:
        if kind == "conv" and conv is not None:
            geometry = tuple(conv.match_key if isinstance(conv, ConvGeometry) else conv)
        else:
            geometry = tuple(attention) if kind == "attention" and tail[1] else ()
        return (kind, dtype, int(batch), int(m), int(n), int(k), 0, 0, geometry, *tail)
    return (kind, dtype, 0, 0, 0, 0, int(round(flops)), int(round(nbytes)), (), *tail)


KEY_GEOMETRY, KEY_PHASE = 8, 9
"""Positions of the geometry and the phase in a :func:`shape_key` (``key[:KEY_GEOMETRY]``: the
kind, dtype and GEMM shape or FLOPs and bytes)."""


def lookup_keys(key: tuple) -> tuple[tuple, ...]:
    """The :func:`shape_key` values under which a kernel of shape ``key`` finds its measured row,
    in order: its own; for a convolution with geometry, its GEMM shape without geometry (rows of
    tables measured before the geometry columns existed); for a kernel of another phase than
    ``fwd``, the same shapes of phase ``fwd`` (a gradient GEMM is a GEMM of its view; tables
    without gradient rows). The backend is never relaxed: a fused attention kernel never takes
    a row of the unfused products, nor one backend another's; nor is a fused attention kernel's
    phase (its backward is no forward kernel of another shape:
    :mod:`marssim.cost.attention_backward` derives it from its forward twin)."""
    keys = [key]
    if key[KEY_GEOMETRY]:
        keys.append((*key[:KEY_GEOMETRY], (), *key[KEY_GEOMETRY + 1:]))
    if key[KEY_PHASE] != "fwd" and not key[KEY_PHASE + 1]:
        keys += [(*k[:KEY_PHASE], "fwd", *k[KEY_PHASE + 1:]) for k in keys]
    return tuple(keys)


def row_stack(stack: str, note: str) -> str:
    """The software stack of a row: ``stack`` when given, else ``pytorch-<version>`` when the
    ``note`` records ``torch=<version>`` (rows of the measurement harness), else ``""`` (unknown)."""
    if stack:
        return stack
    for part in note.split(";"):
        key, sep, value = part.partition("=")
        if sep and key.strip() == "torch" and value.strip():
            return f"pytorch-{value.strip()}"
    return ""


def conv_cells(conv: ConvGeometry | None) -> dict[str, str]:
    """The :data:`CONV_COLUMNS` cells of a geometry (all empty for None)."""
    if conv is None:
        return {c: "" for c in CONV_COLUMNS}
    return {"conv_c": str(conv.c), "conv_h": str(conv.h), "conv_w": str(conv.w), "conv_k": str(conv.k),
            "conv_r": str(conv.r), "conv_s": str(conv.s), "conv_stride": format_pair(conv.stride_h, conv.stride_w),
            "conv_pad": format_pair(conv.pad_h, conv.pad_w), "conv_dilation": str(conv.dilation),
            "conv_groups": str(conv.groups)}


def parse_conv_cells(cells: dict[str, str]) -> ConvGeometry | None:
    """The geometry in the :data:`CONV_COLUMNS` cells (absent columns count as empty): None
    when all are empty; ValueError ``(column, message)`` when some are missing or a value is not
    a geometry ``conv2d`` accepts."""
    texts = {c: (cells.get(c) or "").strip() for c in CONV_COLUMNS}
    given = [c for c in CONV_COLUMNS if texts[c]]
    if not given:
        return None
    missing = [c for c in CONV_COLUMNS if not texts[c]]
    if missing:
        raise ValueError(missing[0], f"expected all of {', '.join(CONV_COLUMNS)} or none; {', '.join(missing)} empty")
    ints = {}
    for c in ("conv_c", "conv_h", "conv_w", "conv_k", "conv_r", "conv_s", "conv_dilation", "conv_groups"):
        try:
            ints[c] = _int(texts[c], "an integer >= 1", 1)
        except ValueError as err:
            raise ValueError(c, str(err)) from None
    pairs = {}
    for c in ("conv_stride", "conv_pad"):
        try:
            pairs[c] = parse_pair(texts[c])
        except ValueError as err:
            raise ValueError(c, str(err)) from None
    geo = ConvGeometry(ints["conv_c"], ints["conv_h"], ints["conv_w"], ints["conv_k"], ints["conv_r"], ints["conv_s"],
                       *pairs["conv_stride"], *pairs["conv_pad"], ints["conv_dilation"], ints["conv_groups"])
    try:
        geo.check()
    except ValueError as err:
        raise ValueError("conv_c", str(err)) from None
    return geo


@dataclass(frozen=True, slots=True)
class KernelTiming:
    """One row of a calibration table (see the module docstring for the columns); an empty
    ``stack`` is derived from the note (:func:`row_stack`)."""

    kind: str
    dtype: str
    batch: int
    m: int
    n: int
    k: int
    flops: float
    bytes: float
    device: str
    sms: int
    driver: str
    cuda: str
    tuning: str
    median_s: float
    spread_s: float
    samples: int
    date: str
    kernel: str = ""
    note: str = ""
    source: str = ""  # "file:line"
    phase: str = "fwd"
    backend: str = ""
    conv: ConvGeometry | None = None
    stack: str = ""

    def __post_init__(self) -> None:
        if not self.stack and self.note:  # the harness's rows: the stack its note records
            object.__setattr__(self, "stack", row_stack("", self.note))

    @property
    def shape(self) -> tuple:
        """The row's :func:`shape_key` (with its phase and, for fused attention, its backend)."""
        return shape_key(self.kind, self.dtype, self.batch, self.m, self.n, self.k, self.flops, self.bytes, self.conv,
                         self.phase, self.backend, attention_geometry(self.kind, self.backend, self.note, self.dtype))

    @property
    def fitted(self) -> bool:
        """Whether the row takes part in its group's curve fit: a forward kernel (``phase``
        ``fwd``) that is not a fused attention kernel (see the module docstring)."""
        return self.phase == "fwd" and not lookup_backend(self.kind, self.backend)


@dataclass(frozen=True)
class KernelTable:
    """Rows of one or more calibration tables."""

    rows: tuple[KernelTiming, ...]
    files: tuple[str, ...] = ()

    def __len__(self) -> int:
        return len(self.rows)

    def select(self, *, device: str | None = None, kind: str | None = None, dtype: str | None = None,
               tuning: str | None = None) -> "KernelTable":
        """Rows matching every given field (``device`` compared case-insensitively)."""
        dev = device.lower() if device is not None else None
        rows = tuple(r for r in self.rows
                     if (dev is None or r.device.lower() == dev) and (kind is None or r.kind == kind)
                     and (dtype is None or r.dtype == dtype) and (tuning is None or r.tuning == tuning))
        return KernelTable(rows, self.files)

    def devices(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(r.device for r in self.rows))

    def stacks(self) -> tuple[str, ...]:
        """The software stacks of the rows, first seen first (``""``: unknown)."""
        return tuple(dict.fromkeys(r.stack for r in self.rows))

    def for_stack(self, stack: str | None) -> "KernelTable":
        """The rows a design modelling software ``stack`` uses: those of that stack and those of
        unknown stack (``""``); every row for ``stack=None``."""
        if stack is None:
            return self
        return KernelTable(tuple(r for r in self.rows if r.stack in (stack, "")), self.files)

    def groups(self) -> dict[FitKey, list[KernelTiming]]:
        """The rows that are fitted (:attr:`KernelTiming.fitted`: forward kernels, fused attention
        aside; see the module docstring) by ``(device, kind, dtype, tuning)``, in table order."""
        out: dict[FitKey, list[KernelTiming]] = {}
        for r in self.rows:
            if r.fitted:
                out.setdefault((r.device, r.kind, r.dtype, r.tuning), []).append(r)
        return out

    def __add__(self, other: "KernelTable") -> "KernelTable":
        return KernelTable(self.rows + other.rows, self.files + other.files)


# ----------------------------------------------------------------------------- reading
def _int(text: str, what: str, minimum: int) -> int:
    try:
        value = int(text)
    except ValueError:
        try:
            f = float(text)
        except ValueError:
            raise ValueError(f"expected {what}, got {text!r}") from None
        if not f.is_integer():
            raise ValueError(f"expected {what}, got {text!r}") from None
        value = int(f)
    if value < minimum:
        raise ValueError(f"expected {what}, got {text!r}")
    return value


def _float(text: str, what: str, positive: bool) -> float:
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"expected {what}, got {text!r}") from None
    if not math.isfinite(value) or value < 0 or (positive and value == 0):
        raise ValueError(f"expected {what}, got {text!r}")
    return value


def _row(cells: dict[str, str], source: str) -> KernelTiming:
    """Parse one row of cells (column -> text); raises :class:`_Cell` naming the bad column."""
    kind = cells["kind"].strip()
    if kind not in KERNEL_KINDS:
        raise _Cell("kind", f"expected one of {', '.join(KERNEL_KINDS)}, got {kind!r}")
    dtype = cells["dtype"].strip()
    if dtype not in DTYPES:
        raise _Cell("dtype", f"expected one of {', '.join(DTYPES)}, got {dtype!r}")
    gemm = kind in GEMM_KINDS
    dims = []
    for col in ("batch", "m", "n", "k"):
        text = cells[col].strip()
        try:
            if gemm:
                dims.append(_int(text, "an integer >= 1 for a GEMM-class kernel", 1))
            else:
                dims.append(_int(text, "an integer >= 0 or nothing", 0) if text else 0)
        except ValueError as err:
            raise _Cell(col, str(err)) from None
    values = {}
    for col, what, positive in (("flops", "a number of FLOPs >= 0", False), ("bytes", "a byte count > 0", True),
                                ("median_s", "a time in seconds > 0", True),
                                ("spread_s", "a time in seconds >= 0", False)):
        try:
            values[col] = _float(cells[col].strip(), what, positive)
        except ValueError as err:
            raise _Cell(col, str(err)) from None
    if gemm:
        expected = 2.0 * dims[0] * dims[1] * dims[2] * dims[3]
        if not math.isclose(values["flops"], expected, rel_tol=1e-9):
            raise _Cell("flops", f"expected 2*batch*m*n*k = {expected:.17g} for a {kind} kernel, "
                                 f"got {cells['flops'].strip()!r}")
    ints = {}
    for col, what in (("sms", "an integer >= 1"), ("samples", "an integer >= 1")):
        try:
            ints[col] = _int(cells[col].strip(), what, 1)
        except ValueError as err:
            raise _Cell(col, str(err)) from None
    strings = {}
    for col in ("device", "driver", "cuda"):
        text = cells[col].strip()
        if not text:
            raise _Cell(col, "expected a non-empty value")
        strings[col] = text
    tuning = cells["tuning"].strip()
    if tuning not in TUNINGS:
        raise _Cell("tuning", f"expected one of {', '.join(TUNINGS)}, got {tuning!r}")
    date = cells["date"].strip()
    try:
        _dt.date.fromisoformat(date)
    except ValueError:
        raise _Cell("date", f"expected an ISO date like 2025-03-14, got {date!r}") from None
    phase = (cells.get("phase") or "").strip() or "fwd"
    if phase not in PHASES:
        raise _Cell("phase", f"expected one of {', '.join(PHASES)} or nothing, got {phase!r}")
    try:
        conv = parse_conv_cells(cells)
    except ValueError as err:
        raise _Cell(*err.args) from None
    note = (cells.get("note") or "").strip()
    stack = row_stack((cells.get("stack") or "").strip(), note)
    if any(c in stack for c in ",;= "):
        raise _Cell("stack", f"expected a short name without spaces, ',', ';' or '=', got {stack!r}")
    if conv is not None:
        if kind != "conv":
            raise _Cell("conv_c", f"only conv rows carry a convolution geometry, this row is {kind!r}")
        images = conv.images(dims[1])
        got = (dims[0], dims[1], dims[2], dims[3])
        if images is None or conv.gemm_view(images) != got:
            p, q = conv.out_size
            raise _Cell("conv_c", f"the geometry ({p}x{q} outputs, GEMM per image "
                                  f"{conv.gemm_view(1)[0]}x{p * q}x{conv.gemm_view(1)[2]}x{conv.gemm_view(1)[3]}) "
                                  f"does not give batch, m, n, k = {got}")
    return KernelTiming(kind, dtype, *dims, values["flops"], values["bytes"], strings["device"], ints["sms"],
                        strings["driver"], strings["cuda"], tuning, values["median_s"], values["spread_s"],
                        ints["samples"], date, (cells.get("kernel") or "").strip(), note,
                        source, phase, (cells.get("backend") or "").strip(), conv, stack)


class _Cell(Exception):
    def __init__(self, column: str, message: str) -> None:
        super().__init__(column, message)
        self.column = column
        self.message = message


def load_table(path: str | Path) -> KernelTable:
    """Read and validate one calibration CSV. Raises InputError (file, line, column)."""
    path = Path(path)
    name = str(path)
    from marssim.limits import MAX_CSV_BYTES, check_file_size

    check_file_size(path, MAX_CSV_BYTES, "a calibration table")
    try:
        text = path.read_text(encoding="utf-8-sig")
    except OSError as err:
        raise InputError(name, "", f"cannot read calibration table: {err.strerror or err}") from None
    except UnicodeDecodeError as err:
        raise InputError(name, "", f"not a text file (byte {err.start:,} is not UTF-8); expected a CSV table") from None
    lines = [(i + 1, line) for i, line in enumerate(text.splitlines()) if line.strip() and not line.lstrip().startswith("#")]
    if not lines:
        raise InputError(name, "", f"expected a header line with the columns {', '.join(REQUIRED_COLUMNS)}")
    header_line, header_text = lines[0]
    header = [h.strip() for h in next(csv.reader([header_text]))]
    problems: list[tuple[str, str]] = []
    missing = [c for c in REQUIRED_COLUMNS if c not in header]
    unknown = [c for c in header if c not in REQUIRED_COLUMNS and c not in OPTIONAL_COLUMNS]
    dupes = sorted({c for c in header if header.count(c) > 1})
    if missing:
        problems.append((f"line {header_line}", f"missing columns: {', '.join(missing)}"))
    if unknown:
        problems.append((f"line {header_line}", f"unknown columns: {', '.join(unknown)}; expected "
                                                f"{', '.join(REQUIRED_COLUMNS + OPTIONAL_COLUMNS)}"))
    if dupes:
        problems.append((f"line {header_line}", f"duplicate columns: {', '.join(dupes)}"))
    if problems:
        raise InputError(name, problems=problems)
    rows = []
    for lineno, line in lines[1:]:
        cells = next(csv.reader([line]))
        if len(cells) != len(header):
            problems.append((f"line {lineno}", f"expected {len(header)} cells like the header, got {len(cells)}"))
            continue
        try:
            rows.append(_row(dict(zip(header, cells)), f"{name}:{lineno}"))
        except _Cell as err:
            problems.append((f"line {lineno}: {err.column}", err.message))
        if len(problems) >= 20:
            break
    if problems:
        raise InputError(name, problems=problems)
    return KernelTable(tuple(rows), (name,))


def load_tables(paths: Iterable[str | Path]) -> KernelTable:
    """Read several tables into one (files in the given order)."""
    table = KernelTable(())
    for p in paths:
        table = table + load_table(p)
    return table


# ----------------------------------------------------------------------------- fitting
@dataclass(frozen=True)
class KernelFit:
    """The fitted curve of one (device, kind, dtype, tuning) group and how well it fits.

    ``rms_log_error``: root mean square of ``ln(predicted / measured)`` over the fitting points;
    ``median_rel_error``/``max_rel_error``: of ``|predicted / measured - 1|`` over them (all
    three of the curve alone). ``correction``: the local residual correction from the fitting
    rows (:mod:`marssim.cost.residual`), None where leave-one-out found none better than the
    curve alone."""

    device: str
    kind: str
    dtype: str
    tuning: str
    params: CurveParams
    n_points: int
    rms_log_error: float
    median_rel_error: float
    max_rel_error: float
    correction: ResidualCorrection | None = field(default=None, compare=False, repr=False)
    best_rate: float = 0.0  # FLOP/s: the highest throughput measured in the group (GEMM-class)

    @property
    def key(self) -> FitKey:
        return (self.device, self.kind, self.dtype, self.tuning)


MIN_POINTS = {True: 4, False: 2}
"""Fewest rows a group needs to be fitted (GEMM-class: 4 parameters; streaming: 2)."""


def _arrays(rows: Sequence[KernelTiming]):
    g = np.array([r.batch for r in rows], dtype=np.int64)
    m = np.array([r.m for r in rows], dtype=np.int64)
    n = np.array([r.n for r in rows], dtype=np.int64)
    k = np.array([r.k for r in rows], dtype=np.int64)
    flops = np.array([r.flops for r in rows], dtype=np.float64)
    nbytes = np.array([r.bytes for r in rows], dtype=np.float64)
    t = np.array([r.median_s for r in rows], dtype=np.float64)
    return g, m, n, k, flops, nbytes, t


def geometry_array(rows: Sequence[KernelTiming]) -> np.ndarray | None:
    """The convolution geometry of ``rows`` as :mod:`marssim.cost.residual` reads it (int array
    ``[rows, len(GEOMETRY_FIELDS)]``: image count, then the geometry key), or None unless every
    row is a convolution with its geometry."""
    if not rows or any(r.kind != "conv" or r.conv is None or r.conv.images(r.m) is None for r in rows):
        return None
    return np.array([(r.conv.images(r.m), *r.conv.match_key) for r in rows], dtype=np.int64)


def predict(fit_or_params: KernelFit | CurveParams, kind: str, *, batch=1, m=1, n=1, k=1, flops=0.0,
            nbytes=0.0, corrected: bool = True, geometry=None) -> np.ndarray:
    """Seconds of ``kind`` kernels of the given shapes (numbers or arrays) under a fit: the
    curve times the fit's local residual correction (with ``corrected`` and a fit that has
    one; see :mod:`marssim.cost.residual`), else the curve alone. ``nbytes`` is the ``bytes``
    column. For GEMM-class kinds ``flops`` defaults to ``2*batch*m*n*k``. ``geometry``: the
    convolutions' geometry (:func:`geometry_array`), required by a correction fitted on it.
    Measured shapes are not looked up here (the cost model does that)."""
    p = fit_or_params.params if isinstance(fit_or_params, KernelFit) else fit_or_params
    g, m_, n_, k_ = (np.asarray(v, dtype=np.int64) for v in (batch, m, n, k))
    nbytes = np.asarray(nbytes, dtype=np.float64)
    if kind in GEMM_KINDS:
        fl = np.asarray(flops, dtype=np.float64)
        fl = np.where(fl > 0, fl, 2.0 * g * m_ * n_ * k_)
        t = gemm_curve(g, m_, n_, k_, fl, nbytes, *p.as_row(), np.maximum, np.minimum)[0]
    elif kind not in KERNEL_KINDS:
        raise ValueError(f"unknown kernel kind {kind!r}; expected one of {', '.join(KERNEL_KINDS)}")
    else:
        fl = np.asarray(flops, dtype=np.float64)
        t = stream_curve(fl, nbytes, p.rate, p.bandwidth, p.launch, np.maximum)[0]
    corr = fit_or_params.correction if isinstance(fit_or_params, KernelFit) and corrected else None
    if corr is None:
        return t
    shape = np.shape(t)
    g, m_, n_, k_, fl, nb = np.broadcast_arrays(g, m_, n_, k_, fl, nbytes)
    factors = corr.factors(corr.features(g.ravel(), m_.ravel(), n_.ravel(), k_.ravel(), fl.ravel(), nb.ravel(),
                                         geometry))
    return t * np.asarray(factors, dtype=np.float64).reshape(shape)


def fit_group(rows: Sequence[KernelTiming], *, tile_m: int = 128, tile_n: int = 128,
              tile_k: int = TILE_K, correct: bool = True, geometry: bool = True,
              max_rate: float | None = None) -> KernelFit:
    """Fit the curve of one group (rows of a single device, kind, dtype and tuning), then,
    with ``correct``, the local residual correction from the same rows -- for convolution rows
    that all carry their geometry, with ``geometry``, in the space that includes it (else by
    the GEMM view alone, as for tables without geometry).

    GEMM-class kinds fit ``rate, bandwidth, k_half, launch``; streaming kinds ``bandwidth,
    launch`` (their compute term is dropped: ``rate = inf``). ``max_rate`` (FLOP/s, the device's
    dense peak for the dtype) bounds ``rate``: without it a curve fitted on small shapes can
    extrapolate to large ones above what the hardware can issue. Minimises the squared log error
    with ``scipy.optimize.least_squares`` from a few starting points and keeps the best. The
    correction (:func:`marssim.cost.residual.fit_correction`) takes per distinct shape the
    residual ``ln(measured / curve)`` of its fastest median. Raises ValueError for a mixed
    group or too few rows."""
    from scipy.optimize import least_squares

    if not rows:
        raise ValueError("no rows to fit")
    first = rows[0]
    key = (first.device, first.kind, first.dtype, first.tuning)
    if any((r.device, r.kind, r.dtype, r.tuning) != key for r in rows):
        raise ValueError("fit_group needs rows of one device, kind, dtype and tuning")
    sms = {r.sms for r in rows}
    if len(sms) != 1:
        raise ValueError(f"rows of {first.device} disagree on the SM count: {sorted(sms)}")
    sm = sms.pop()
    gemm = first.kind in GEMM_KINDS
    if len(rows) < MIN_POINTS[gemm]:
        raise ValueError(f"{first.kind}/{first.dtype} on {first.device}: {len(rows)} rows, need {MIN_POINTS[gemm]}")
    g, m, n, k, flops, nbytes, t = _arrays(rows)
    log_t = np.log(t)
    t_min = float(t.min())
    bw0 = float(np.max(nbytes / t)) * 1.5
    if gemm:
        rate0 = float(np.max(flops / t)) * 1.5

        def params_of(theta):
            return CurveParams(math.exp(theta[0]), math.exp(theta[1]), float(theta[2]), float(theta[3]), sm,
                               tile_m, tile_n, tile_k)

        def residual(theta):
            p = params_of(theta)
            pred = gemm_curve(g, m, n, k, flops, nbytes, *p.as_row(), np.maximum, np.minimum)[0]
            return np.log(pred) - log_t

        lower = [math.log(rate0 / 1e4), math.log(bw0 / 1e4), 0.0, 0.0]
        upper = [math.log(rate0 * 1e3), math.log(bw0 * 1e3), 1e5, t_min]
        if max_rate:  # the datasheet's peak, unless the rows beat it (fp32 convolutions run as TF32 in cuDNN)
            upper[0] = min(upper[0], math.log(max(max_rate, float(np.max(flops / t)))))
            lower[0] = min(lower[0], upper[0] - 1e-6)
        starts = [[math.log(rate0), math.log(bw0), kh, 0.3 * t_min] for kh in (0.0, 32.0, 256.0)]
        scale = [1.0, 1.0, 64.0, t_min]
    else:
        def params_of(theta):
            return CurveParams(math.inf, math.exp(theta[0]), 0.0, float(theta[1]), sm, tile_m, tile_n, tile_k)

        def residual(theta):
            p = params_of(theta)
            pred = stream_curve(flops, nbytes, p.rate, p.bandwidth, p.launch, np.maximum)[0]
            return np.log(pred) - log_t

        lower = [math.log(bw0 / 1e4), 0.0]
        upper = [math.log(bw0 * 1e3), t_min]
        starts = [[math.log(bw0), frac * t_min] for frac in (0.1, 0.5, 0.9)]
        scale = [1.0, t_min]
    best = None
    for x0 in starts:
        x0 = np.clip(x0, lower, upper)
        res = least_squares(residual, x0, bounds=(lower, upper), x_scale=scale, method="trf")
        if best is None or res.cost < best.cost:
            best = res
    params = params_of(best.x)
    err = residual(best.x)
    rel = np.abs(np.expm1(err))
    correction = _correction(rows, err, gemm, geometry) if correct else None
    best_rate = float(np.max(flops / t)) if gemm else 0.0
    return KernelFit(first.device, first.kind, first.dtype, first.tuning, params, len(rows),
                     float(np.sqrt(np.mean(err ** 2))), float(np.median(rel)), float(rel.max()), correction,
                     best_rate)


def _correction(rows: Sequence[KernelTiming], log_error: np.ndarray, gemm: bool,
                geometry: bool = True) -> ResidualCorrection | None:
    """The residual correction of one fitted group: per distinct shape (first seen order; with
    the convolutions' geometry when every row has one and ``geometry``), the residual
    ``ln(measured / curve)`` of its fastest row."""
    use_geometry = geometry and geometry_array(rows) is not None
    best: dict[tuple, int] = {}
    for i, r in enumerate(rows):
        key = r.shape if use_geometry else shape_key(r.kind, r.dtype, r.batch, r.m, r.n, r.k, r.flops, r.bytes)
        j = best.get(key)
        if j is None or r.median_s < rows[j].median_s:
            best[key] = i
    idx = list(best.values())
    pick = [rows[i] for i in idx]
    return fit_correction(gemm, [r.batch for r in pick], [r.m for r in pick], [r.n for r in pick],
                          [r.k for r in pick], [r.flops for r in pick], [r.bytes for r in pick],
                          -log_error[idx], geometry=geometry_array(pick) if use_geometry else None)


def fit(table: KernelTable, *, tile_m: int = 128, tile_n: int = 128, tile_k: int = TILE_K,
        strict: bool = False, correct: bool = True, peaks: dict[str, float] | None = None
        ) -> dict[FitKey, KernelFit]:
    """Fit every (device, kind, dtype, tuning) group of ``table`` (with ``correct``, also its
    residual correction). ``peaks``: the device's dense peak FLOP/s per dtype, bounding the
    GEMM-class curves' rate (:func:`fit_group`). Groups with too few rows are left out (the cost
    model then falls back to the analytical curve for them), or, with ``strict``, raise
    ValueError."""
    out: dict[FitKey, KernelFit] = {}
    for key, rows in table.groups().items():
        bound = (peaks or {}).get(key[2]) if key[1] in GEMM_KINDS else None
        try:
            out[key] = fit_group(rows, tile_m=tile_m, tile_n=tile_n, tile_k=tile_k, correct=correct,
                                 max_rate=bound)
        except ValueError:
            if strict:
                raise
    return out


@dataclass(frozen=True)
class HoldoutError:
    """Prediction error of a group's fit on rows it did not see (``|pred / measured - 1|``)."""

    key: FitKey
    n_fit: int
    n_held: int
    median_rel_error: float
    max_rel_error: float


def holdout_errors(table: KernelTable, *, every: int = 4, tile_m: int = 128, tile_n: int = 128,
                   tile_k: int = TILE_K) -> list[HoldoutError]:
    """Per group: fit on all rows but every ``every``-th (in table order, starting with the
    last of each run of ``every``), predict the held-out rows, report the relative errors."""
    if every < 2:
        raise ValueError("every must be >= 2")
    out = []
    for key, rows in table.groups().items():
        held = [r for i, r in enumerate(rows) if i % every == every - 1]
        train = [r for i, r in enumerate(rows) if i % every != every - 1]
        if not held:
            continue
        try:
            f = fit_group(train, tile_m=tile_m, tile_n=tile_n, tile_k=tile_k)
        except ValueError:
            continue
        g, m, n, k, flops, nbytes, t = _arrays(held)
        pred = predict(f, key[1], batch=g, m=m, n=n, k=k, flops=flops, nbytes=nbytes, geometry=geometry_array(held))
        rel = np.abs(pred / t - 1.0)
        out.append(HoldoutError(key, len(train), len(held), float(np.median(rel)), float(rel.max())))
    return out
