"""The convolution a kernel computes: its geometry as ``torch.nn.functional.conv2d`` takes it.

A calibration table keys a convolution by this geometry (the ``conv_*`` columns of
:mod:`marssim.cost.calibrated`), not by its GEMM view alone: a 1x1 convolution over 576
channels and a 3x3 one over 64 have the same im2col GEMM (``K = C*R*S = 576``) and run
different kernels. The measurement harness times exactly the geometry :func:`conv_geometry`
returns for an op, and the cost model looks the op up by the same function, so the two agree
by construction. Lookups compare :attr:`ConvGeometry.match_key`, which holds the output size
instead of the input size (input rows no output reads do not make another kernel).

=============  ==========================================================================
field          meaning (what the kernel is called with)
=============  ==========================================================================
c              input channels, all groups (``in_channels``)
h, w           input rows and columns the kernel reads, after any padding applied to the
               input beforehand (see below)
k              output channels (``out_channels``)
r, s           kernel rows and columns
stride_h/_w    strides
pad_h/_w       padding the kernel applies on both sides of each axis
dilation       kernel dilation (both axes)
groups         ``groups`` of ``conv2d`` (``c`` for a depthwise convolution)
=============  ==========================================================================

The geometry of an op is the layer's own where its padding is symmetric (``pad_h`` the top
and bottom padding, ``pad_w`` left and right). A layer with asymmetric padding
(``(top, left, bottom, right)`` differing per side, as ONNX allows) is run as ``conv2d`` does
not allow: its input is padded once, outside the timed kernel, and the kernel runs with no
padding on the larger input (``h = rows + top + bottom``). A spatial shard of a layer (an
op whose output rows ``P`` were split, :meth:`marssim.workload.Op.with_loops`) reads its rows
with the halo of the neighbouring shards, so along an axis where the layer's own padding
does not give the shard's output size only the padding its output still needs is kept, low
side first (none for an inner shard), and the input is cut where even no padding gives too
many outputs (:func:`axis_padding`).

That is the ``current`` padding rule. Tables measured by earlier versions of the harness
used others, which :mod:`marssim.calibrate.backfill` needs to recover their rows' geometry:
``layer`` (the layer's padding on every axis, whatever the output: until spatial shards were
measured) and ``need`` (only the padding the output needs, unless that is exactly the
layer's: the first harness that measured spatial shards; it pre-padded whole stride-2 layers
whose last padding row no output reads, such as a 3x3/2 convolution of a 14x14 input, to a
15x15 input without padding).

Stride and padding are written in tables as one integer when both axes agree (``2``) and as
``HxW`` otherwise (``2x1``): :func:`format_pair`, :func:`parse_pair`.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

from marssim.workload import Op, OpKind

__all__ = ["ConvGeometry", "ConvLaunch", "conv_geometry", "conv_launch", "format_pair", "parse_pair",
           "axis_padding", "PADDING_RULES"]

PADDING_RULES = ("current", "layer", "need")
"""How a convolution's padding was chosen for the kernel: see the module docstring."""


@dataclass(frozen=True, slots=True)
class ConvGeometry:
    """One convolution kernel's geometry (see the module docstring; all integers)."""

    c: int
    h: int
    w: int
    k: int
    r: int
    s: int
    stride_h: int = 1
    stride_w: int = 1
    pad_h: int = 0
    pad_w: int = 0
    dilation: int = 1
    groups: int = 1

    def check(self) -> None:
        """ValueError naming the first field that no ``conv2d`` call could have (the table
        reader checks what it reads; ops are not checked: a shard is what it is)."""
        for name, value in zip((f.name for f in fields(self)), self.key):
            if not isinstance(value, int) or isinstance(value, bool):
                raise ValueError(f"conv geometry: {name} must be an integer, got {value!r}")
            if value < (0 if name in ("pad_h", "pad_w") else 1):
                raise ValueError(f"conv geometry: {name} must be >= {0 if name.startswith('pad') else 1}, got {value}")
        if self.c % self.groups or self.k % self.groups:
            raise ValueError(f"conv geometry: channels {self.c} -> {self.k} are not divisible by groups {self.groups}")
        p, q = self.out_size
        if p < 1 or q < 1:
            raise ValueError(f"conv geometry: a {self.r}x{self.s} window (dilation {self.dilation}) does not fit "
                             f"a {self.h}x{self.w} input padded by {self.pad_h}x{self.pad_w}")

    @property
    def key(self) -> tuple[int, ...]:
        """The fields as a tuple, in declaration order (what shape keys hold)."""
        return (self.c, self.h, self.w, self.k, self.r, self.s, self.stride_h, self.stride_w, self.pad_h, self.pad_w,
                self.dilation, self.groups)

    @property
    def match_key(self) -> tuple[int, ...]:
        """What tells convolution kernels apart (shape keys hold this): ``c, k, r, s, stride_h,
        stride_w, pad_h, pad_w, dilation, groups`` and the output size ``P, Q`` in place of
        the input size: input rows or columns no output reads (a 1x1/2 convolution of a 56-row
        input reads 55) do not make another kernel."""
        return (self.c, self.k, self.r, self.s, self.stride_h, self.stride_w, self.pad_h, self.pad_w, self.dilation,
                self.groups, *self.out_size)

    @property
    def out_size(self) -> tuple[int, int]:
        """``(P, Q)``: output rows and columns."""
        p = (self.h + 2 * self.pad_h - self.dilation * (self.r - 1) - 1) // self.stride_h + 1
        q = (self.w + 2 * self.pad_w - self.dilation * (self.s - 1) - 1) // self.stride_w + 1
        return p, q

    def gemm_view(self, n: int) -> tuple[int, int, int, int]:
        """``(batch, m, n, k)`` of the kernel over ``n`` images: the im2col GEMM per group,
        as :meth:`marssim.workload.Op.gemm_view` gives it (``batch`` = groups)."""
        p, q = self.out_size
        return self.groups, n * p * q, self.k // self.groups, (self.c // self.groups) * self.r * self.s

    def images(self, m: int) -> int | None:
        """The image count ``n`` for which the kernel's GEMM has ``m`` rows, or None when ``m``
        is not a multiple of the output plane."""
        p, q = self.out_size
        return m // (p * q) if m % (p * q) == 0 and m > 0 else None


@dataclass(frozen=True, slots=True)
class ConvLaunch:
    """How the harness runs an op's convolution: ``n`` images of ``geometry``, after padding
    the op's input ``(n, c, rows, cols)`` once by ``pre_pad`` = ``(left, right, top, bottom)``
    (zeros when the kernel pads by itself); ``rows``, ``cols`` the input before that."""

    n: int
    rows: int
    cols: int
    pre_pad: tuple[int, int, int, int]
    geometry: ConvGeometry


def axis_padding(size: int, out: int, kernel: int, stride: int, dilation: int, lo: int,
                 hi: int, rule: str = "current") -> tuple[int, int, int]:
    """``(low pad, high pad, input size)`` for ``out`` output positions along one axis of
    ``size`` input positions, under padding ``rule`` (:data:`PADDING_RULES`): ``current``, the
    layer's own padding ``lo, hi`` when it gives ``out`` (a whole layer), else the padding
    ``out`` still needs, low side first, with the input cut when even no padding is too much
    (a spatial shard); ``layer``, always ``lo, hi``; ``need``, the layer's padding only when
    ``out`` needs exactly as much."""
    if rule not in PADDING_RULES:
        raise ValueError(f"unknown padding rule {rule!r}; expected one of {', '.join(PADDING_RULES)}")
    window = dilation * (kernel - 1) + 1
    if rule == "layer" or (rule == "current" and (size + lo + hi - window) // stride + 1 == out):
        return lo, hi, size
    need = (out - 1) * stride + window - size
    if need == lo + hi:
        return lo, hi, size
    if need <= 0:
        return 0, 0, size + need
    return min(lo, need), need - min(lo, need), size


def conv_launch(op: Op, rule: str = "current") -> ConvLaunch:
    """The convolution kernel the harness runs for the ``conv`` op ``op`` under padding ``rule``
    (see the module docstring; under ``layer`` a spatial shard's kernel may not give the op's
    output). Pure; ValueError for an op that is not a convolution."""
    if op.kind != OpKind.CONV:
        raise ValueError(f"op {op.name} is a {op.kind}, not a convolution")
    n, c_in, h, w = op.in_shapes[0]
    k, r, s = op.dim("K"), op.dim("R"), op.dim("S")
    groups = k if op.param("depthwise", False) else op.param("groups", 1)
    sh, sw = op.param("stride", (1, 1))
    top, left, bottom, right = op.param("pad", (0, 0, 0, 0))
    dilation = op.param("dilation", 1)
    top, bottom, h = axis_padding(h, op.out_shape[2], r, sh, dilation, top, bottom, rule)
    left, right, w = axis_padding(w, op.out_shape[3], s, sw, dilation, left, right, rule)
    if (top, left) != (bottom, right):
        pre_pad = (left, right, top, bottom)
        geometry = ConvGeometry(c_in, h + top + bottom, w + left + right, k, r, s, sh, sw, 0, 0, dilation, groups)
    else:
        pre_pad = (0, 0, 0, 0)
        geometry = ConvGeometry(c_in, h, w, k, r, s, sh, sw, top, left, dilation, groups)
    return ConvLaunch(n, h, w, pre_pad, geometry)


def conv_geometry(op: Op, rule: str = "current") -> ConvGeometry:
    """:attr:`ConvLaunch.geometry` of :func:`conv_launch`: the geometry an op is measured and
    looked up by (``current`` rule)."""
    return conv_launch(op, rule).geometry


def format_pair(h: int, w: int) -> str:
    """``(2, 2) -> "2"``, ``(2, 1) -> "2x1"``."""
    return str(h) if h == w else f"{h}x{w}"


def parse_pair(text: str) -> tuple[int, int]:
    """Inverse of :func:`format_pair`; ValueError for anything else (negative numbers included)."""
    parts = text.strip().lower().split("x")
    if len(parts) not in (1, 2) or not all(p.strip().isdigit() for p in parts):
        raise ValueError(f"expected an integer or HxW like 2x1, got {text!r}")
    values = [int(p) for p in parts]
    return (values[0], values[0]) if len(values) == 1 else (values[0], values[1])
