"""Physical quantities written as strings in YAML: ``"400 GB/s"``, ``"96 GiB"``, ``"1.5 us"``.

Everything inside marssim is SI: seconds, bytes, bytes/s, hertz, joules, FLOP/s. This module
turns a number or a unit string into that SI value and checks it is the kind of quantity the
key expects. (A general units library treats bytes as dimensionless and so cannot tell
``"400 GB/s"`` from ``"400 GHz"``; here each key names its kind and is checked against it.)
"""

from __future__ import annotations

import math
import re
from typing import Literal

__all__ = ["Kind", "parse", "UnitError", "MAXIMA", "fmt_bytes", "fmt_time", "fmt_rate"]

Kind = Literal["bytes", "bandwidth", "time", "frequency", "energy", "flops", "flop_rate", "power",
               "energy_per_byte"]

_DECIMAL = {"": 1.0, "k": 1e3, "K": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15, "E": 1e18, "Z": 1e21, "Y": 1e24}
_BINARY = {"Ki": 2.0**10, "Mi": 2.0**20, "Gi": 2.0**30, "Ti": 2.0**40, "Pi": 2.0**50, "Ei": 2.0**60,
           "Zi": 2.0**70}
_SMALL = {"": 1.0, "m": 1e-3, "u": 1e-6, "\u00b5": 1e-6, "\u03bc": 1e-6, "n": 1e-9, "p": 1e-12, "f": 1e-15}
# micro is accepted as "u", the micro sign U+00B5 and the Greek letter mu U+03BC (both are typed as "µ")

# unit symbol (without prefix) -> (kind, factor to SI, allowed prefix table)
_UNITS: dict[str, tuple[str, float, str]] = {
    "B": ("bytes", 1.0, "big"),
    "b": ("bytes", 0.125, "big"),  # bits
    "bit": ("bytes", 0.125, "big"),
    "B/s": ("bandwidth", 1.0, "big"),
    "Bps": ("bandwidth", 1.0, "big"),
    "b/s": ("bandwidth", 0.125, "big"),
    "bps": ("bandwidth", 0.125, "big"),
    "bit/s": ("bandwidth", 0.125, "big"),
    "s": ("time", 1.0, "small"),
    "sec": ("time", 1.0, "small"),
    "cycle": ("cycles", 1.0, "none"),
    "Hz": ("frequency", 1.0, "big"),
    "J": ("energy", 1.0, "both"),
    "W": ("power", 1.0, "both"),
    "FLOP": ("flops", 1.0, "big"),
    "FLOP/s": ("flop_rate", 1.0, "big"),
    "FLOPS": ("flop_rate", 1.0, "big"),
    "OP/s": ("flop_rate", 1.0, "big"),
    "OPS": ("flop_rate", 1.0, "big"),
    "J/B": ("energy_per_byte", 1.0, "small"),
    "J/bit": ("energy_per_byte", 8.0, "small"),
    "J/b": ("energy_per_byte", 8.0, "small"),
}

_EXAMPLES: dict[str, str] = {
    "bytes": '"96 GiB"',
    "bandwidth": '"400 GB/s"',
    "time": '"1.5 us"',
    "frequency": '"1 GHz"',
    "energy": '"0.2 pJ"',
    "flops": '"4.1 GFLOP"',
    "flop_rate": '"989 TFLOP/s"',
    "power": '"700 W"',
    "energy_per_byte": '"8 pJ/B"',
}

_SI_UNIT: dict[str, str] = {
    "bytes": "B", "bandwidth": "B/s", "time": "s", "frequency": "Hz", "energy": "J", "flops": "FLOP",
    "flop_rate": "FLOP/s", "power": "W", "energy_per_byte": "J/B",
}

MAXIMA: dict[str, tuple[float, str, str]] = {
    "bytes": (2.0**70, "1 ZiB", "a thousand times the largest memories built"),
    "bandwidth": (1e18, "1 EB/s", "a thousand times the fastest on-chip memories"),
    "time": (86400.0, "1 day", "no latency or kernel overhead comes near it"),
    "frequency": (1e12, "1 THz", "two hundred times the fastest clocks of digital logic"),
    "energy": (1.0, "1 J", "per event: a million times the energy of a DRAM access"),
    "flops": (1e24, "1 YFLOP", "far beyond any workload's operations"),
    "flop_rate": (1e21, "1 ZFLOP/s", "a thousand times the fastest supercomputers"),
    "power": (1e6, "1 MW", "per accelerator: a thousand times the hungriest chips"),
    "energy_per_byte": (1e-6, "1 uJ/B", "a thousand times the energy of moving a byte off-chip"),
}
"""The largest value accepted per kind (SI), as written, and why: a larger one is most likely a
typo (a unit prefix too many), and sizes past them overflow the exact counts the models keep."""

_NUMBER = r"[+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?"
_PATTERN = re.compile(rf"^\s*({_NUMBER})\s*([A-Za-z\u00b5\u03bc/]*)\s*$")


class UnitError(ValueError):
    """A value that is not a quantity of the expected kind; the message says what was expected."""


def _split_unit(unit: str) -> tuple[str, float]:
    """Return (kind, factor) for a unit string with an optional prefix, or raise KeyError."""
    if unit in _UNITS:
        kind, factor, _ = _UNITS[unit]
        return kind, factor
    for plen in (2, 1):
        prefix, base = unit[:plen], unit[plen:]
        if base not in _UNITS:
            continue
        kind, factor, table = _UNITS[base]
        if table == "big":
            scale = _BINARY.get(prefix) if plen == 2 else _DECIMAL.get(prefix)
        elif table == "small":
            scale = _SMALL.get(prefix) if plen == 1 else None
        elif table == "both":  # energy and power: "0.2 pJ" and "1.2 kW" alike
            scale = (_SMALL.get(prefix) or _DECIMAL.get(prefix)) if plen == 1 else None
        else:
            scale = None
        if scale is not None:
            return kind, factor * scale
    raise KeyError(unit)


def parse(value: object, kind: Kind, *, allow_zero: bool = False, require_unit: bool = False,
          bounded: bool = False) -> float:
    """Convert ``value`` (a number in SI units, or a string with a unit) to a float in SI units.

    ``kind`` is the quantity the key expects. Raises :class:`UnitError` with a message of the
    form ``expected a bandwidth like "400 GB/s", got 'fast'`` when the value does not parse, has
    the wrong kind of unit, is negative, not finite, zero where zero is not allowed, overflows a
    64-bit float once scaled, or (with ``bounded``, as every field of a system gets) exceeds the
    plausible bound of its kind (:data:`MAXIMA`, the reason in the message). With ``require_unit`` (what the YAML files get) a number without a
    unit is refused unless it is zero, whatever its unit: ``bandwidth: 25`` would be 25 B/s,
    almost never what was meant.
    """
    what = f"a {kind.replace('_', ' ')} like {_EXAMPLES[kind]}"
    if isinstance(value, bool):
        raise UnitError(f"expected {what}, got {value!r}")
    unit = ""
    if isinstance(value, (int, float)):
        try:
            number = float(value)
        except OverflowError:  # an int too large for a float
            number = math.inf
        literal = number
    elif isinstance(value, str):
        match = _PATTERN.match(value)
        if not match:
            raise UnitError(f"expected {what}, got {value!r}")
        number = literal = float(match.group(1))
        unit = match.group(2)
        if unit:
            try:
                unit_kind, factor = _split_unit(unit)
            except KeyError:
                raise UnitError(f"expected {what}, got {value!r} (unknown unit {unit!r})") from None
            if unit_kind != kind:
                raise UnitError(f"expected {what}, got {value!r} (a {unit_kind.replace('_', ' ')})")
            number *= factor
    else:
        raise UnitError(f"expected {what}, got {value!r}")
    if require_unit and not unit and math.isfinite(literal) and literal != 0:
        shown = value if isinstance(value, str) else repr(value)
        raise UnitError(f"expected {what} with its unit, got the bare number {shown} (a number without a unit "
                        f"would be read as {_SI_UNIT[kind]}; write \"{str(value).strip()} {_SI_UNIT[kind]}\" if "
                        "that is meant)")
    if math.isinf(number) and math.isfinite(literal):
        raise UnitError(f"expected {what}, got {value!r}, which overflows a 64-bit float (about 1.8e308 "
                        f"{_SI_UNIT[kind]}) once in {_SI_UNIT[kind]}")
    if not math.isfinite(number) or number < 0 or (number == 0 and not allow_zero):
        if math.isinf(number) and not isinstance(value, float):
            raise UnitError(f"expected {what}, got {value!r}, which is too large for a 64-bit float")
        raise UnitError(f"expected {what} that is {'non-negative' if allow_zero else 'positive'}, got {value!r}")
    limit, written, reason = MAXIMA[kind]
    if bounded and number > limit:
        raise UnitError(f"expected {what} of at most {written} ({reason}; a larger value is most likely a typo), "
                        f"got {value!r}")
    return number


def _fmt(value: float, unit: str, base: float, prefixes: tuple[str, ...]) -> str:
    scale = 1.0
    for prefix in prefixes:
        if abs(value) < scale * base:
            return f"{value / scale:.4g} {prefix}{unit}"
        if prefix != prefixes[-1]:
            scale *= base
    return f"{value / scale:.4g} {prefixes[-1]}{unit}"


def fmt_bytes(n: float) -> str:
    """Human-readable bytes with binary prefixes: ``fmt_bytes(3 * 2**30) == '3 GiB'``."""
    return _fmt(n, "B", 1024.0, ("", "Ki", "Mi", "Gi", "Ti", "Pi"))


def fmt_rate(bps: float) -> str:
    """Human-readable bandwidth with decimal prefixes: ``'450 GB/s'``."""
    return _fmt(bps, "B/s", 1000.0, ("", "k", "M", "G", "T", "P"))


def fmt_time(seconds: float) -> str:
    """Human-readable duration: ``'1.5 us'``, ``'12.3 ms'``."""
    a = abs(seconds)
    if a == 0:
        return "0 s"
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("us", 1e-6), ("ns", 1e-9)):
        if a >= scale:
            return f"{seconds / scale:.4g} {unit}"
    return f"{seconds / 1e-12:.4g} ps"
