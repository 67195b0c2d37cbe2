"""Bit fields of Volta-and-later 128-bit SASS instructions (sm_70 .. sm_90a).

Verified against ``nvdisasm`` on every instruction of the test cubins (sm_80, sm_90, sm_90a):
the guard predicate, the operand-reuse flags and the destination register agree with the text
``nvdisasm`` prints; the opcode field maps one-to-one onto mnemonics; the scoreboard fields agree
with which instructions are variable latency. Field positions (bit 0 = least significant bit of
the first little-endian 64-bit half):

=================  =========  ==========================================================
field              bits       meaning
=================  =========  ==========================================================
opcode             0-11       bits 0-8 the operation, 9-11 the operand form (reg/imm/const)
guard predicate    12-14      P0-P6, 7 = PT (always); UP0-UP6 for uniform-datapath ops
guard negate       15         ``@!P``
Rd                 16-23      destination register (255 = RZ)
Ra                 24-31      first source register
Rb                 32-39      second source register (register forms)
Rc                 64-71      third source register
stall              105-108    cycles before the next instruction may issue (0-15)
yield              109        yield hint
write scoreboard   110-112    scoreboard set when the result is written (7 = none)
read scoreboard    113-115    scoreboard set when the sources have been read (7 = none)
wait mask          116-121    scoreboards (bit i = SB i) waited on before issue
reuse              122-125    operand reuse cache flags: 122 Ra, 123 Rb, 124 Rc, 125 (4th)
=================  =========  ==========================================================

Branch offsets are PC-relative; ``marssim.calibrate.sip`` never moves a branch or a block
boundary, so no offset field is rewritten.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Control", "decode_control", "guard_predicate", "opcode_bits", "register_field", "reuse_slots",
           "NO_SCOREBOARD", "SUPPORTED_SM"]

#: SM versions whose 128-bit layout this module describes.
SUPPORTED_SM = frozenset({70, 72, 75, 80, 86, 87, 89, 90})
#: the value of a scoreboard field meaning "none"
NO_SCOREBOARD = 7

_FIELDS = {"Rd": 16, "Ra": 24, "Rb": 32, "Rc": 64}


@dataclass(frozen=True, slots=True)
class Control:
    """The 17-bit control code of one instruction plus its reuse flags.

    stall: cycles (0-15) the scheduler waits after issuing this instruction before the next.
    yield_: the yield hint bit. write_sb / read_sb: scoreboard index 0-5 set on result write /
    on source read, ``None`` when unused. wait_mask: bit i set = wait for scoreboard i before
    issue. reuse: 4-bit operand reuse mask (bit 0 = Ra).
    """

    stall: int
    yield_: bool
    write_sb: int | None
    read_sb: int | None
    wait_mask: int
    reuse: int

    @property
    def sets(self) -> frozenset[int]:
        """Scoreboards this instruction sets (write and read)."""
        return frozenset(s for s in (self.write_sb, self.read_sb) if s is not None)

    @property
    def waits(self) -> frozenset[int]:
        """Scoreboards this instruction waits on."""
        return frozenset(i for i in range(6) if self.wait_mask >> i & 1)

    def describe(self) -> str:
        """Compact text like ``S04 Y W0 R- [0,2] reuse=a`` (stall, yield, write SB, read SB, waits)."""
        wr = "-" if self.write_sb is None else str(self.write_sb)
        rd = "-" if self.read_sb is None else str(self.read_sb)
        waits = ",".join(str(i) for i in sorted(self.waits))
        reuse = "".join(s for i, s in enumerate("abcd") if self.reuse >> i & 1)
        return (f"S{self.stall:02d} {'Y' if self.yield_ else '-'} W{wr} R{rd} [{waits}]"
                + (f" reuse={reuse}" if reuse else ""))


def decode_control(word: int) -> Control:
    """The control code of a 128-bit instruction word."""
    wr = (word >> 110) & 7
    rd = (word >> 113) & 7
    return Control(stall=(word >> 105) & 0xF, yield_=bool((word >> 109) & 1),
                   write_sb=None if wr == NO_SCOREBOARD else wr, read_sb=None if rd == NO_SCOREBOARD else rd,
                   wait_mask=(word >> 116) & 0x3F, reuse=(word >> 122) & 0xF)


def guard_predicate(word: int) -> tuple[int, bool]:
    """(predicate index 0-7, negated) of the guard; index 7 is PT (UPT for uniform ops)."""
    return (word >> 12) & 7, bool((word >> 15) & 1)


def opcode_bits(word: int) -> int:
    """The 12-bit opcode field (bits 0-11)."""
    return word & 0xFFF


def register_field(word: int, name: str) -> int:
    """Register number in field ``Rd``, ``Ra``, ``Rb`` or ``Rc`` (255 = RZ)."""
    return (word >> _FIELDS[name]) & 0xFF


def reuse_slots(word: int) -> tuple[str, ...]:
    """Source slots (``"Ra"``, ``"Rb"``, ``"Rc"``, ``"Rd4"``) whose reuse flag is set."""
    return tuple(s for i, s in enumerate(("Ra", "Rb", "Rc", "Rd4")) if (word >> (122 + i)) & 1)
