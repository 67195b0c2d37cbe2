"""Pydantic field types for physical quantities: accept ``"400 GB/s"`` or a bare SI number."""

from __future__ import annotations

from typing import Annotated

from pydantic import BeforeValidator

from marssim import units


def _quantity(kind: units.Kind, allow_zero: bool = False) -> BeforeValidator:
    def convert(value: object) -> float:
        try:
            return units.parse(value, kind, allow_zero=allow_zero)
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
