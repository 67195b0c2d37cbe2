"""Pydantic field types for physical quantities: ``"400 GB/s"``, or a bare SI number from Python.

Files (validated with :data:`FILE_CONTEXT`, as :func:`marssim.system.load.system_from_dict`
does) must give every dimensioned value with its unit: a bare number is refused unless it is
zero, because ``bandwidth: 25`` would be 25 B/s, almost never what was meant. Python code that
builds designs and memories directly passes SI floats, which are taken as they are. Every value
is checked against the plausible bound of its kind (:data:`marssim.units.MAXIMA`).
"""

from __future__ import annotations

from typing import Annotated

from pydantic import AfterValidator, BeforeValidator, ValidationInfo

from marssim import units

__all__ = ["FILE_CONTEXT", "Bytes", "Bandwidth", "Seconds", "Hertz", "Joules", "FlopRate", "Watts", "EnergyPerByte",
           "PeCount", "SmCount", "TileSize"]

FILE_CONTEXT = {"units": "required"}
"""Validation context for values read from files: units required (see the module docstring)."""


def _quantity(kind: units.Kind, allow_zero: bool = False) -> BeforeValidator:
    def convert(value: object, info: ValidationInfo) -> float:
        required = bool(info.context) and info.context.get("units") == "required"
        try:
            return units.parse(value, kind, allow_zero=allow_zero, require_unit=required, bounded=True)
        except units.UnitError as err:  # pydantic reports ValueError with the key's location
            raise ValueError(str(err)) from None

    return BeforeValidator(convert)


Bytes = Annotated[float, _quantity("bytes")]
"""A size in bytes (``"96 GiB"``)."""
Bandwidth = Annotated[float, _quantity("bandwidth")]
"""Bytes per second (``"400 GB/s"``)."""
Seconds = Annotated[float, _quantity("time", allow_zero=True)]
"""A duration in seconds (``"1.5 us"``); zero allowed."""
Hertz = Annotated[float, _quantity("frequency")]
"""A clock frequency in Hz (``"1 GHz"``)."""
Joules = Annotated[float, _quantity("energy", allow_zero=True)]
"""An energy in joules (``"0.2 pJ"``); zero allowed."""
FlopRate = Annotated[float, _quantity("flop_rate")]
"""FLOP per second (``"989 TFLOP/s"``)."""
Watts = Annotated[float, _quantity("power", allow_zero=True)]
"""A power in watts (``"700 W"``); zero allowed."""
EnergyPerByte = Annotated[float, _quantity("energy_per_byte", allow_zero=True)]
"""Joules per byte (``"8 pJ/B"``, ``"1 pJ/bit"``); zero allowed."""


def _count(minimum: int, maximum: int, reason: str) -> AfterValidator:
    def check(value: int) -> int:
        if value < minimum or value > maximum:
            raise ValueError(f"expected an integer from {minimum} to {maximum:,} ({reason}), got {value}")
        return value

    return AfterValidator(check)


PeCount = Annotated[int, _count(0, 65_536, "a PE array dimension: the largest arrays built have a few hundred "
                                            "rows, and larger ones overflow the cost model's exact counts")]
"""Rows or columns of a PE array (0 for GPU-class designs)."""
SmCount = Annotated[int, _count(1, 10_000, "streaming multiprocessors: GPUs have at most a few hundred")]
"""Streaming multiprocessors of a GPU-class design."""
TileSize = Annotated[int, _count(1, 65_536, "a GEMM tile dimension: kernel libraries use at most 256")]
"""Rows or columns of a GEMM thread-block tile."""
