"""The on-chip memory hierarchy of a PE-array design: buffers per operand and the DRAM behind them.

A design's ``sram`` is its on-chip buffer capacity. On its own it is the shorthand for one
*shared* buffer whose space goes, layer by layer, to whichever operand needs it (``split:
dynamic``: any one operand may hold half of the buffer, the rest of it holding the other
operands' tiles). The optional ``buffers:`` section of a design says more::

    buffers:
      ifmap: 64 KiB            # per-operand buffers (sram is then their sum and may be omitted),
      filter: 64 KiB           # or no sizes and a split of sram:
      ofmap: 64 KiB            #   split: {ifmap: 0.5, filter: 0.25, ofmap: 0.25}
      double_buffered: true    # half of each buffer is filled while the other half is computed on
      dram_latency: 100 ns     # paid once per fill that compute cannot hide
      dram_channels: shared    # shared: one DRAM interface (dram_bandwidth) for all operands;
                               # per_operand: each buffer has its own channel of dram_bandwidth
      convention: marssim      # or scalesim: SCALE-Sim 3.0.0's traffic conventions (see below)

``convention: scalesim`` reproduces what SCALE-Sim 3.0.0 counts, for comparing with it: the
ifmap moves between DRAM and its buffer as its im2col matrix (every window element a separate
word, so a 3x3 convolution moves up to 9x its input tensor), every fold's partial outputs are
written to DRAM with no read-back (its ofmap buffer only drains), operands are refetched in the
fixed fold order of the dataflow, a buffer only keeps its active half and fetches whole halves,
and each buffer has its own DRAM channel. (It applies to the systolic dataflows, the ones
SCALE-Sim models; the loop-mapping ones keep marssim's rules but for the channels.) ``marssim`` (the
default) moves tensors (an input element once per pass), keeps partial sums in the ofmap buffer
when the block being accumulated fits and otherwise writes and reads them back, and picks the
cheaper of the fold order and the order that tiles the streamed dimension to fit the buffer.
``docs/memory-model.md`` gives the formulas and their sources.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from .quantities import Bytes, Seconds

__all__ = ["Buffers", "OPERANDS", "operand_windows", "buffer_sizes"]

OPERANDS = ("ifmap", "filter", "ofmap")
"""Operands with a buffer: the input activations (GEMM A), the weights (B) and the outputs."""

Operand = Literal["ifmap", "filter", "ofmap"]


class Buffers(BaseModel):
    """Buffers per operand, double buffering, the DRAM interface and the traffic convention."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    ifmap: Bytes | None = Field(None, description="input-activation buffer, bytes")
    filter: Bytes | None = Field(None, description="weight buffer, bytes")
    ofmap: Bytes | None = Field(None, description="output / partial-sum buffer, bytes")
    split: Literal["dynamic"] | dict[Operand, float] = Field(
        "dynamic", description="how a shared sram is divided when no sizes are given: 'dynamic' or fractions")
    double_buffered: bool = Field(True, description="fill half of each buffer while computing on the other half")
    dram_latency: Seconds = Field(0.0, description="latency of a DRAM access, s")
    dram_channels: Literal["shared", "per_operand"] | None = Field(
        None, description="one DRAM interface for all operands, or one per buffer (default: shared; "
                          "per_operand under convention scalesim)")
    convention: Literal["marssim", "scalesim"] = Field("marssim", description="traffic convention")

    @field_validator("split")
    @classmethod
    def _fractions(cls, value: object) -> object:
        if isinstance(value, dict):
            missing = [op for op in OPERANDS if op not in value]
            if missing:
                raise ValueError(f"expected a fraction for each of ifmap, filter, ofmap; missing {', '.join(missing)}")
            if any(not 0.0 < f <= 1.0 for f in value.values()):
                raise ValueError("expected fractions in (0, 1]")
            if sum(value.values()) > 1.0 + 1e-9:
                raise ValueError(f"expected fractions that sum to at most 1, got {sum(value.values()):g}")
        return value

    @model_validator(mode="after")
    def _sizes(self) -> "Buffers":
        given = [getattr(self, op) is not None for op in OPERANDS]
        if any(given) and not all(given):
            raise ValueError("give the size of all three buffers (ifmap, filter, ofmap) or of none "
                             "(then split divides sram)")
        if all(given) and isinstance(self.split, dict):
            raise ValueError("give either buffer sizes or a split of sram, not both")
        if all(given) and min(self.ifmap, self.filter, self.ofmap) <= 0:
            raise ValueError("buffer sizes must be positive")
        return self

    @property
    def sizes(self) -> tuple[float, float, float] | None:
        """The three buffer sizes in bytes, or None when the buffer is a shared ``sram``."""
        if self.ifmap is None:
            return None
        return (float(self.ifmap), float(self.filter), float(self.ofmap))

    @property
    def channels(self) -> str:
        """``shared`` or ``per_operand`` (the convention's default when not given)."""
        if self.dram_channels is not None:
            return self.dram_channels
        return "per_operand" if self.convention == "scalesim" else "shared"


DEFAULT_BUFFERS = Buffers()


def operand_windows(sram: float, buffers: Buffers | None) -> tuple[tuple[float, float, float],
                                                                  tuple[float, float, float]]:
    """``(windows, resident)`` bytes per operand (ifmap, filter, ofmap).

    A *window* is what the array works from while the next one is fetched: half of the
    operand's buffer when double-buffered, all of it otherwise. *Resident* is the largest
    operand that, once read, stays for the rest of the op: its whole buffer (nothing needs to be
    fetched behind it), except under ``convention: scalesim``, whose buffers only ever hold a
    window (SCALE-Sim's active half). Under ``split: dynamic`` any one operand gets half of the
    shared ``sram`` for both."""
    b = buffers or DEFAULT_BUFFERS
    if b.sizes is None and b.split == "dynamic":
        return (0.5 * sram,) * 3, (0.5 * sram,) * 3
    sizes = buffer_sizes(sram, b)
    scale = 0.5 if b.double_buffered else 1.0
    windows = tuple(scale * size for size in sizes)
    resident = windows if b.convention == "scalesim" else tuple(sizes)
    return windows, resident


def buffer_sizes(sram: float, buffers: Buffers | None) -> tuple[float, float, float]:
    """Bytes of the ifmap, filter and ofmap buffers (each the whole ``sram`` when shared dynamically)."""
    b = buffers or DEFAULT_BUFFERS
    if b.sizes is not None:
        return b.sizes
    if b.split == "dynamic":
        return (sram,) * 3
    return tuple(b.split[op] * sram for op in OPERANDS)
