"""Legality of swapping two adjacent instructions of a kernel's current order.

A *schedule* is a permutation of a kernel's instructions: ``order[slot]`` is the original index
of the instruction now at ``slot``. :func:`check_swap` decides whether the instructions at slots
``pos`` and ``pos + 1`` may trade places, and names the rule that forbids it otherwise. Every
rule is conservative: when the model cannot prove a swap safe, it refuses.

Rules (the ``reason`` strings returned):

``block``        the two slots lie in different basic blocks.
``fence``        either instruction is a fence: control flow, BSSY/BSYNC, barriers, memory
                 fences, DEPBAR, wgmma (HGMMA, WARPGROUP), TMA, timers, NOPs, strong/volatile
                 memory accesses, or an opcode the model does not know.
``pinned``       either instruction is named by a relocation or an offset-carrying ``.nv.info``
                 attribute (EXIT offsets, ...).
``raw`` / ``war`` / ``waw``  register, predicate or uniform-register dependencies.
``scoreboard``   one instruction sets a scoreboard the other waits on (a producer may not move
                 below the wait that guards it), or both set a scoreboard that a DEPBAR counts.
``guarded``      the upper instruction waits on a scoreboard that guards registers the lower one
                 uses: a consumer may not move above its wait.
``queue``        a variable-latency producer without a scoreboard (its completion is observed
                 through a later instruction's scoreboard, relying on in-order completion) may
                 not trade places with another variable-latency instruction. The same for
                 operand reads: a variable-latency reader without a read scoreboard may not
                 trade places with a variable-latency instruction that sets one, because a later
                 overwriter of the first one's sources may wait on the second one's read
                 scoreboard, relying on in-order operand reads (ptxas sets a read scoreboard
                 only on the last of several shared-memory loads from one address register).
``latency``      a fixed-latency producer would be followed by its consumer sooner than
                 ``min(original distance, latency)`` stall cycles; the same for a scoreboard's
                 setter and its first waiter (``SCOREBOARD_SETUP_CYCLES``), and for a
                 variable-latency reader without read scoreboard and the next overwriter
                 of its sources (``OPERAND_READ_CYCLES``).
``reuse``        the swap would separate an instruction with operand-reuse flags from its
                 successor.
``memory``       both access memory, one writes, and their spaces may alias (no load past a
                 store, no store past a store; different threads of a warp may alias even with
                 distinct offsets, so only thread-private local memory is disambiguated).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property

from .sass import Instruction, Listing

__all__ = ["Legality", "check_swap", "FIXED_LATENCY_CYCLES", "SCOREBOARD_SETUP_CYCLES", "OPERAND_READ_CYCLES",
           "NEVER_SHRINK"]

#: stall cycles a consumer of these fixed-latency producers needs at most (an upper bound on the
#: published 4-5 cycle ALU latencies of Volta to Hopper; ptxas places consumers of these
#: opcodes 1-4 cycles after them in the test kernels). Producers not listed keep their original
#: distance to every consumer (``NEVER_SHRINK``).
FIXED_LATENCY_CYCLES: dict[str, int] = {op: 6 for op in (
    "IADD3", "IMAD", "LOP3", "LEA", "SHF", "SEL", "FSEL", "MOV", "FADD", "FMUL", "FFMA", "FMNMX", "FSETP",
    "ISETP", "IABS", "VIADD", "VIMNMX", "IMNMX", "SGXT", "PLOP3", "PRMT", "HADD2", "HMUL2", "HFMA2", "CS2R",
    "UIADD3", "UMOV", "ULEA", "ULOP3", "USEL", "USHF", "UISETP", "USGXT", "UIMAD", "ULDC", "UPLOP3", "UPRMT",
)}
#: cycles between an instruction that sets a scoreboard and the first one that waits on it
#: (ptxas never places them closer than 2 in the test kernels; 4 leaves a margin)
SCOREBOARD_SETUP_CYCLES = 4
#: cycles after issue within which a variable-latency instruction without a read scoreboard may
#: still read its source registers (ptxas protects longer reads with a read scoreboard); a later
#: overwriter of such a source keeps ``min(original distance, this)``
OPERAND_READ_CYCLES = 4
NEVER_SHRINK = 10**9

_ALIAS = {
    "global": {"global", "generic"}, "shared": {"shared", "generic"}, "local": {"local", "generic"},
    "generic": {"global", "shared", "local", "generic"},
}


@dataclass(frozen=True, slots=True)
class Verdict:
    """Outcome of :func:`check_swap`: ``ok`` and, when not, the rule that forbids the swap."""

    ok: bool
    reason: str = ""
    detail: str = ""

    def __bool__(self) -> bool:
        return self.ok


class Legality:
    """Dependency model of one kernel: precomputed facts used by every swap check."""

    def __init__(self, listing: Listing) -> None:
        self.listing = listing
        self.insns = listing.instructions
        self.block_of = listing.block_of()
        self.blocks = listing.blocks

    @cached_property
    def counted_scoreboards(self) -> frozenset[int]:
        """Scoreboards named by ``DEPBAR.LE SBn, count`` anywhere in the kernel: their setters
        complete in order and a partial wait relies on that order."""
        out = set()
        for ins in self.insns:
            if ins.opcode == "DEPBAR":
                for op in ins.operands:
                    if op.startswith("SB") and op[2:].isdigit():
                        out.add(int(op[2:]))
        return frozenset(out)

    @cached_property
    def _unscoreboarded_writes(self) -> frozenset[str]:
        """Registers written by variable-latency producers that set no write scoreboard."""
        out: set[str] = set()
        for ins in self.insns:
            if self.no_sb_producer(ins):
                out |= ins.writes
        return frozenset(out)

    @cached_property
    def _setter_union(self) -> dict[int, tuple[frozenset[str], frozenset[str]]]:
        """Per scoreboard, (registers written by its write-setters, registers read by its
        read-setters), over the whole kernel: what a wait may guard when its setter lies in
        another block."""
        w: dict[int, set[str]] = {s: set() for s in range(6)}
        r: dict[int, set[str]] = {s: set() for s in range(6)}
        for ins in self.insns:
            if ins.control.write_sb is not None:
                w[ins.control.write_sb] |= ins.writes
            if ins.control.read_sb is not None:
                r[ins.control.read_sb] |= ins.reads
        return {s: (frozenset(w[s] | self._unscoreboarded_writes), frozenset(r[s])) for s in range(6)}

    @cached_property
    def _incoming_latency(self) -> dict[str, int]:
        """Per register: the largest stall distance a consumer at the top of a block may need from
        a producer in another block (0 when every writer is scoreboard-tracked)."""
        out: dict[str, int] = {}
        for ins in self.insns:
            if ins.control.write_sb is not None:
                continue
            need = self.latency(ins)
            for r in ins.writes:
                out[r] = max(out.get(r, 0), need)
        return out

    @staticmethod
    def is_variable(ins: Instruction) -> bool:
        return ins.category in ("memory", "variable")

    def no_sb_producer(self, ins: Instruction) -> bool:
        """A variable-latency instruction writing registers without setting a write scoreboard."""
        return self.is_variable(ins) and ins.control.write_sb is None and bool(ins.writes)

    def unscoreboarded_reader(self, ins: Instruction) -> bool:
        """A variable-latency instruction reading registers without setting a read scoreboard."""
        return self.is_variable(ins) and ins.control.read_sb is None and bool(ins.reads)

    def read_sb_setter(self, ins: Instruction) -> bool:
        """A variable-latency instruction that sets a read scoreboard."""
        return self.is_variable(ins) and ins.control.read_sb is not None

    def latency(self, ins: Instruction) -> int:
        """Stall cycles consumers of ``ins`` (a producer without write scoreboard) may need."""
        if self.is_variable(ins):
            return NEVER_SHRINK
        return FIXED_LATENCY_CYCLES.get(ins.opcode, NEVER_SHRINK)

    # ------------------------------------------------------------------ the check
    def check(self, order: Sequence[int], pos: int) -> Verdict:
        """May the instructions at slots ``pos`` and ``pos + 1`` of ``order`` swap?"""
        n = len(order)
        if pos < 0 or pos + 1 >= n:
            return Verdict(False, "block", "no neighbour")
        a, b = self.insns[order[pos]], self.insns[order[pos + 1]]
        # blocks are slot ranges that never change: the slot's block is the original block
        if self.block_of[pos] != self.block_of[pos + 1]:
            return Verdict(False, "block", "the slots are in different basic blocks")
        for ins in (a, b):
            if ins.category == "fence":
                return Verdict(False, "fence", f"{ins.mnemonic} never moves")
            if ins.index in self.listing.pinned:
                return Verdict(False, "pinned", f"{ins.mnemonic} at {ins.offset:#x} is named by .nv.info or a relocation")
        if a.writes & b.reads:
            return Verdict(False, "raw", f"{sorted(a.writes & b.reads)}")
        if a.reads & b.writes:
            return Verdict(False, "war", f"{sorted(a.reads & b.writes)}")
        if a.writes & b.writes:
            return Verdict(False, "waw", f"{sorted(a.writes & b.writes)}")
        ca, cb = a.control, b.control
        if ca.sets & cb.waits or ca.waits & cb.sets:
            return Verdict(False, "scoreboard", "one sets a scoreboard the other waits on")
        if ca.sets & cb.sets & self.counted_scoreboards:
            return Verdict(False, "scoreboard", "both set a scoreboard counted by DEPBAR")
        guarded = self._guarded_conflict(order, pos, a, b)
        if guarded:
            return Verdict(False, "guarded", guarded)
        if (self.no_sb_producer(a) and self.is_variable(b)) or (self.no_sb_producer(b) and self.is_variable(a)):
            return Verdict(False, "queue", "in-order completion of a producer without scoreboard")
        if self.unscoreboarded_reader(a) and self.read_sb_setter(b) or \
                self.unscoreboarded_reader(b) and self.read_sb_setter(a):
            return Verdict(False, "queue", "in-order operand reads: a reader without read scoreboard and one with")
        if pos > 0 and self.block_of[pos - 1] == self.block_of[pos] and self.insns[order[pos - 1]].control.reuse:
            return Verdict(False, "reuse", "the previous instruction caches operands for the upper one")
        if ca.reuse or cb.reuse:
            return Verdict(False, "reuse", "an operand-reuse flag would feed a different instruction")
        mem = self._memory_conflict(a, b)
        if mem:
            return Verdict(False, "memory", mem)
        lat = self._latency_conflict(order, pos, a, b)
        if lat:
            return Verdict(False, "latency", lat)
        return Verdict(True)

    def _guarded_conflict(self, order: Sequence[int], pos: int, a: Instruction, b: Instruction) -> str:
        """Registers guarded by the scoreboards ``a`` waits on, that ``b`` touches."""
        if not a.control.wait_mask:
            return ""
        block = self.blocks[self.block_of[pos]]
        for s in a.control.waits:
            g_w: set[str] = set()
            g_r: set[str] = set()
            stopped = False
            for slot in range(pos - 1, block.start - 1, -1):
                x = self.insns[order[slot]]
                if x.control.write_sb == s:
                    g_w |= x.writes
                if x.control.read_sb == s:
                    g_r |= x.reads
                if self.no_sb_producer(x):
                    g_w |= x.writes
                if s in x.control.waits:
                    stopped = True
                    break
            if not stopped:
                uw, ur = self._setter_union[s]
                g_w |= uw
                g_r |= ur
            hit = (b.reads | b.writes) & g_w or b.writes & g_r
            if hit:
                return f"SB{s} guards {sorted(hit)}"
        return ""

    def _distance(self, order: Sequence[int], start: int, end: int) -> int:
        """Stall cycles from the instruction at slot ``start`` to the one at ``end`` (sum of the
        stall fields of slots start .. end-1)."""
        return sum(self.insns[order[k]].control.stall for k in range(start, end))

    def _latency_conflict(self, order: Sequence[int], pos: int, a: Instruction, b: Instruction) -> str:
        block = self.blocks[self.block_of[pos]]
        sa, sb = a.control.stall, b.control.stall
        # (1) b moves up by one slot: its producers above come sa cycles closer
        for r in b.reads:
            for slot in range(pos - 1, block.start - 1, -1):
                x = self.insns[order[slot]]
                if r in x.writes:
                    if x.control.write_sb is None:
                        old = self._distance(order, slot, pos + 1)
                        if old - sa < min(old, self.latency(x)):
                            return f"{r}: {x.mnemonic} -> {b.mnemonic} would be {old - sa} cycles apart"
                    break
            else:
                need = self._incoming_latency.get(r, 0)
                old = self._distance(order, block.start, pos + 1)
                if need and old - sa < min(old, need):
                    return f"{r} from a previous block would be read {old - sa} cycles into the block"
        # b overwrites a source of a variable-latency reader above that has no read scoreboard
        for r in b.writes:
            for slot in range(pos - 1, block.start - 1, -1):
                x = self.insns[order[slot]]
                if r in x.reads and self.is_variable(x) and x.control.read_sb is None:
                    old = self._distance(order, slot, pos + 1)
                    if old - sa < min(old, OPERAND_READ_CYCLES):
                        return f"{r}: {b.mnemonic} would overwrite a source of {x.mnemonic} {old - sa} cycles after it"
                    break
                if r in x.writes:
                    break
        for s in b.control.waits:
            for slot in range(pos - 1, block.start - 1, -1):
                x = self.insns[order[slot]]
                if s in x.control.sets:
                    old = self._distance(order, slot, pos + 1)
                    if old - sa < min(old, SCOREBOARD_SETUP_CYCLES):
                        return f"SB{s} set by {x.mnemonic} would be waited on {old - sa} cycles later"
                    break
            else:
                old = self._distance(order, block.start, pos + 1)
                if old - sa < min(old, SCOREBOARD_SETUP_CYCLES):
                    return f"SB{s} (set before the block) would be waited on {old - sa} cycles into it"
        # (2) a moves down by one slot: its consumers below come sb cycles closer
        if a.control.write_sb is None:
            for r in a.writes:
                for slot in range(pos + 2, block.end):
                    y = self.insns[order[slot]]
                    if r in y.reads:
                        old = self._distance(order, pos, slot)
                        if old - sb < min(old, self.latency(a)):
                            return f"{r}: {a.mnemonic} -> {y.mnemonic} would be {old - sb} cycles apart"
                        break
                    if r in y.writes:
                        break
                else:
                    old = self._distance(order, pos, block.end)
                    if old - sb < min(old, self.latency(a)):
                        return f"{r} leaves the block {old - sb} cycles after {a.mnemonic}"
        if self.is_variable(a) and a.control.read_sb is None:
            # a reads its sources after issue within a short window: keep later overwriters away
            for r in a.reads:
                for slot in range(pos + 2, block.end):
                    y = self.insns[order[slot]]
                    if r in y.writes:
                        old = self._distance(order, pos, slot)
                        if old - sb < min(old, OPERAND_READ_CYCLES):
                            return f"{r}: {y.mnemonic} would overwrite a source of {a.mnemonic} {old - sb} cycles after it"
                        break
        for s in a.control.sets:
            for slot in range(pos + 2, block.end):
                y = self.insns[order[slot]]
                if s in y.control.waits:
                    old = self._distance(order, pos, slot)
                    if old - sb < min(old, SCOREBOARD_SETUP_CYCLES):
                        return f"SB{s}: the waiter {y.mnemonic} would follow {a.mnemonic} by {old - sb} cycles"
                    break
            else:
                old = self._distance(order, pos, block.end)
                if old - sb < min(old, SCOREBOARD_SETUP_CYCLES):
                    return f"SB{s} set {old - sb} cycles before the block ends"
        return ""

    @staticmethod
    def _memory_conflict(a: Instruction, b: Instruction) -> str:
        ma, mb = a.mem, b.mem
        if ma is None or mb is None:
            return ""
        for w, other in ((ma, mb), (mb, ma)):
            for space in w.spaces_written():
                touched = other.spaces_written() | other.spaces_read()
                if not touched & _ALIAS[space]:
                    continue
                if space == "local" and other.space == "local" and w.kind != "ldgsts" and other.kind != "ldgsts" \
                        and w.address == other.address and _disjoint(w, other):
                    continue  # thread-private: same base, disjoint byte ranges
                return f"{a.mnemonic} and {b.mnemonic} may alias in {space} memory"
        return ""


def _disjoint(x, y) -> bool:
    return x.offset + x.size <= y.offset or y.offset + y.size <= x.offset


def check_swap(listing: Listing, order: Sequence[int], pos: int) -> Verdict:
    """Convenience: :meth:`Legality.check` on a fresh model (build one :class:`Legality` per
    kernel when checking many swaps)."""
    return Legality(listing).check(order, pos)
