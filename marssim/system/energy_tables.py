"""Published energy-per-access figures a design can name instead of writing them out.

A design's ``energy: {table: horowitz-45nm-int8}`` takes the MAC, SRAM read/write and DRAM
read/write energies of the named table (fields written beside ``table`` override it) and the
table's ``source``. The SRAM figure depends on the buffer's size: Horowitz gives a 64-bit read
from an 8 KB, a 32 KB and a 1 MB SRAM as 10, 20 and 100 pJ, which ``10 pJ * sqrt(size / 8 KiB)``
follows within 13% (20 pJ at 32 KiB, 113 pJ at 1 MiB): the energy of an access grows with the
wire length across the array, the square root of its area. A design's ``sram`` (its largest
buffer when split per operand) sets the size.

Sources
-------
* M. Horowitz, "Computing's energy problem (and what we can do about it)", ISSCC 2014, 45 nm,
  0.9 V: 8-bit integer multiply 0.2 pJ, 32-bit integer add 0.1 pJ, fp16 multiply 1.1 pJ and
  add 0.4 pJ, fp32 multiply 3.7 pJ and add 0.9 pJ; 64-bit SRAM read 10 pJ (8 KB), 20 pJ
  (32 KB), 100 pJ (1 MB); DRAM 1.3-2.6 nJ per 64-bit access (the low end is used: 162.5 pJ/B).
  Horowitz gives one figure per access; reads and writes take it alike.
* Cross-check: Eyeriss (Y.-H. Chen et al., ISCA 2016, Fig. 1; V. Sze et al., Proc. IEEE 2017,
  Fig. 19), 65 nm, energy per 16-bit access relative to a 16-bit MAC: global buffer (100-500 KB)
  6x, DRAM 200x. With Horowitz's fp16 MAC (1.5 pJ) that is 4.5 pJ/B and 150 pJ/B, against
  3.1-6.3 pJ/B (128-512 KiB) and 162.5 pJ/B here.
"""

from __future__ import annotations

import math

__all__ = ["ENERGY_TABLES", "table_energy"]

_PJ = 1e-12
_DRAM_BYTE = 1.3e-9 / 8  # Horowitz, low end of 1.3-2.6 nJ per 64-bit access
_HOROWITZ = "Horowitz, ISSCC 2014, 45 nm (MAC, SRAM by size, DRAM low end)"

ENERGY_TABLES: dict[str, dict[str, float | str]] = {
    "horowitz-45nm-int8": {"mac": (0.2 + 0.1) * _PJ, "source": _HOROWITZ + "; int8 multiply + 32-bit accumulate"},
    "horowitz-45nm-fp16": {"mac": (1.1 + 0.4) * _PJ, "source": _HOROWITZ + "; fp16 multiply + add"},
    "horowitz-45nm-fp32": {"mac": (3.7 + 0.9) * _PJ, "source": _HOROWITZ + "; fp32 multiply + add"},
}
"""Named tables: MAC energy (J) and source; SRAM and DRAM per byte come from :func:`table_energy`."""


def sram_byte_energy(size: float) -> float:
    """Joules per byte read from an SRAM of ``size`` bytes (Horowitz's three points, square-root fit)."""
    return 10 * _PJ / 8 * math.sqrt(max(size, 1.0) / 8192)


def table_energy(name: str, sram_size: float) -> dict[str, float | str]:
    """The fields of :class:`~marssim.system.design.DesignEnergy` that table ``name`` gives a
    design whose largest buffer holds ``sram_size`` bytes. Raises ``KeyError`` for an unknown table."""
    entry = ENERGY_TABLES[name]
    sram = sram_byte_energy(sram_size)
    return {"mac": entry["mac"], "sram_byte": sram, "sram_read_byte": sram, "sram_write_byte": sram,
            "dram_byte": _DRAM_BYTE, "dram_read_byte": _DRAM_BYTE, "dram_write_byte": _DRAM_BYTE,
            "source": entry["source"]}
