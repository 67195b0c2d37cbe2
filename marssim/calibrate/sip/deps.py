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

:meth:`Legality.reasons` names every rule that refuses a swap, not only the first.

Options (:class:`LegalityOptions`). The defaults are the model verified on an H100 (random walks
of legal moves on both paper kernels, outputs compared bit for bit), with one tightening: the
stall distance a fixed-latency producer keeps to a consumer is at least the smallest distance
ptxas leaves for that producer opcode and consumer operand in the reference cubins
(:mod:`.latency_table`, :func:`.latency.tightening`) where that exceeds the 6-cycle table and
ptxas packs the consumer at exactly that distance at least :data:`TIGHTEN_AT_MIN` times -- a
requirement, not slack: ptxas
places a guarded instruction, a branch or a memory instruction's predicate operand 13 cycles
after the compare that sets the predicate (ISETP.GT.U32.AND -> guard: 22 of 23 times exactly 13
on sm_90), where the table alone allowed 6. Three widenings, each
argued from the hardware's documented or observed semantics but NOT yet verified on a GPU
(``tests/test_sip_gpu.py`` has the check that will), are off by default:

``latency="observed"``  the distance a fixed-latency producer keeps to its consumer may shrink
                        to the smallest one ptxas leaves for that producer mnemonic, consumer
                        category and operand in the reference cubins (ptxas never places a
                        consumer closer than the latency, so that distance is at least the
                        latency), instead of ``min(original, 6)`` -- and opcodes the 6-cycle
                        table does not list (``F2FP``, ``HMMA``, ...) get a bound at all instead
                        of never shrinking; unobserved pairs keep the table's rule.
``reuse="clear"``        a swap that separates an instruction with operand-reuse flags from its
                        successor is allowed, and the patched cubin clears the reuse flags of
                        every instruction whose successor changed (:func:`reuse_cleared`): a
                        reuse flag only lets the next instruction read an operand from the
                        operand cache instead of the register file, which holds the same value,
                        and ptxas itself emits most instructions without one.
``commit_group=True``   an ``LDGSTS`` may move above the ``LDGDEPBAR`` right before it: the copy
                        joins the group committed there instead of the next one, and a
                        ``DEPBAR.LE SBn, k`` (``cp.async.wait_group k``) that waits for the next
                        group waits for every older one too, so the copy is complete no later
                        than before. (Moving an ``LDGSTS`` below an ``LDGDEPBAR`` stays refused:
                        its group would be waited on too early.)
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from functools import cached_property

from .latency import LatencyKey, arch_family, consumer_key, tightening
from .sass import Instruction, Listing

__all__ = ["Legality", "LegalityOptions", "check_swap", "reuse_cleared", "RULES", "FIXED_LATENCY_CYCLES",
           "SCOREBOARD_SETUP_CYCLES", "OPERAND_READ_CYCLES", "NEVER_SHRINK"]

RULES = ("block", "fence", "pinned", "raw", "war", "waw", "scoreboard", "guarded", "queue", "reuse", "memory",
         "latency")
"""The rules, in the order :meth:`Legality.check` applies them."""


@dataclass(frozen=True)
class LegalityOptions:
    """Which widenings of the legality model are on (see the module docstring): ``latency``
    ``"table"`` (default), ``"observed"`` or ``"table-only"`` (the 6-cycle table without the
    ptxas-observed tightening: the model schedules were tuned and verified under before the
    options existed, kept to replay them); ``reuse`` ``"keep"`` (default: refuse) or
    ``"clear"``; ``commit_group``."""

    latency: str = "table"
    reuse: str = "keep"
    commit_group: bool = False

    def __post_init__(self) -> None:
        if self.latency not in ("table", "observed", "table-only"):
            raise ValueError(f"latency must be 'table', 'observed' or 'table-only', got {self.latency!r}")
        if self.reuse not in ("keep", "clear"):
            raise ValueError(f"reuse must be 'keep' or 'clear', got {self.reuse!r}")

    @property
    def widened(self) -> tuple[str, ...]:
        """Names of the widenings that are on (empty for the verified default)."""
        return tuple(name for name, on in (("latency=observed", self.latency == "observed"),
                                           ("reuse=clear", self.reuse == "clear"),
                                           ("commit_group", self.commit_group)) if on)

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def parse(cls, text: str) -> "LegalityOptions":
        """``"latency=observed,reuse=clear,commit_group"`` (or ``""``/``"strict"`` for the
        default; ``"all"`` for every widening); ValueError naming the bad item."""
        items = [t.strip() for t in text.split(",") if t.strip() and t.strip() != "strict"]
        if items == ["all"]:
            return cls("observed", "clear", True)
        values: dict = {}
        for item in items:
            key, sep, value = item.partition("=")
            if key == "commit_group" and not sep:
                values["commit_group"] = True
            elif key in ("latency", "reuse") and sep:
                values[key] = value
            else:
                raise ValueError(f"unknown widening {item!r}; expected latency=observed, reuse=clear, commit_group "
                                 f"or all")
        return cls(**values)


STRICT = LegalityOptions()

#: stall cycles a consumer of these fixed-latency producers needs at most (an upper bound on the
#: published 4-5 cycle ALU latencies of Volta to Hopper; ptxas places consumers of these
#: opcodes 1-4 cycles after them in the test kernels). Producers not listed keep their original
#: distance to every consumer (``NEVER_SHRINK``).
FIXED_LATENCY_CYCLES: dict[str, int] = {op: 6 for op in (
    "IADD3", "IMAD", "LOP3", "LEA", "SHF", "SEL", "FSEL", "MOV", "FADD", "FMUL", "FFMA", "FMNMX", "FSETP",
    "ISETP", "IABS", "VIADD", "VIMNMX", "IMNMX", "SGXT", "PLOP3", "PRMT", "HADD2", "HMUL2", "HFMA2", "CS2R",
    "UIADD3", "UMOV", "ULEA", "ULOP3", "USEL", "USHF", "UISETP", "USGXT", "UIMAD", "ULDC", "UPLOP3", "UPRMT",
)}
#: how often ptxas must leave exactly the smallest observed distance for the default bound to be
#: raised to it (see the module docstring)
TIGHTEN_AT_MIN = 3
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
    """Dependency model of one kernel: precomputed facts used by every swap check, under
    ``options`` (default: the verified model)."""

    def __init__(self, listing: Listing, options: LegalityOptions = STRICT) -> None:
        self.listing = listing
        self.options = options
        self.insns = listing.instructions
        self.block_of = listing.block_of()
        self.blocks = listing.blocks
        self.family = arch_family(listing.arch)
        from .latency_table import OBSERVED

        # the default's tightening, per producer opcode (all its mnemonics together) and consumer
        # operand; with latency="observed", the smallest distance per producer mnemonic
        table_only = options.latency == "table-only"
        self._tight = {} if table_only else tightening(OBSERVED, self.family, FIXED_LATENCY_CYCLES, TIGHTEN_AT_MIN)
        self._tight_any: dict[str, int] = {}
        for (opcode, *_rest), bound in self._tight.items():
            self._tight_any[opcode] = max(self._tight_any.get(opcode, 0), bound)
        self._observed: dict[LatencyKey, int] = {k: v[0] for k, v in OBSERVED.items() if k.family == self.family} \
            if options.latency == "observed" else {}

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
    def _writers(self) -> dict[str, tuple[Instruction, ...]]:
        """Per register: the instructions without write scoreboard that write it."""
        out: dict[str, list[Instruction]] = {}
        for ins in self.insns:
            if ins.control.write_sb is None:
                for r in ins.writes:
                    out.setdefault(r, []).append(ins)
        return {r: tuple(v) for r, v in out.items()}

    def _incoming_need(self, reg: str, consumer: Instruction) -> int:
        """The largest stall distance ``consumer`` at the top of a block may need from a writer of
        ``reg`` in another block (0 when every writer is scoreboard-tracked)."""
        return max((self.need(w, consumer, reg) for w in self._writers.get(reg, ())), default=0)

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
        """Stall cycles any consumer of ``ins`` (a producer without write scoreboard) may need,
        when the consumer is not known (it lies in another block): the table's value, raised to
        the largest tightened bound of its opcode; never widened, since the observed bounds of
        the consumers seen need not cover an unknown one."""
        if self.is_variable(ins):
            return NEVER_SHRINK
        table = FIXED_LATENCY_CYCLES.get(ins.opcode, NEVER_SHRINK)
        return max(table, self._tight_any.get(ins.opcode, 0))

    def need(self, producer: Instruction, consumer: Instruction, reg: str) -> int:
        """Stall cycles ``consumer`` needs after ``producer`` (no write scoreboard) for ``reg``:
        the table's latency of the producer's opcode, raised where ptxas shows it needs more for
        that kind of consumer operand (the default's tightening); with ``latency="observed"``
        lowered to the smallest distance ptxas leaves for the producer mnemonic and consumer
        operand, where observed."""
        if self.is_variable(producer):
            return NEVER_SHRINK
        table = FIXED_LATENCY_CYCLES.get(producer.opcode, NEVER_SHRINK)
        key = consumer_key(consumer, reg)
        if key is None:
            return max(table, self._tight_any.get(producer.opcode, 0))
        bound = max(table, self._tight.get((producer.opcode, consumer.category, *key), 0))
        if self._observed:
            seen = self._observed.get(LatencyKey(self.family, producer.mnemonic, consumer.category, *key))
            if seen is not None:
                return min(seen, bound)  # a widening of the default, never narrower
        return bound

    # ------------------------------------------------------------------ the check
    def check(self, order: Sequence[int], pos: int) -> Verdict:
        """May the instructions at slots ``pos`` and ``pos + 1`` of ``order`` swap? The first
        rule (in :data:`RULES` order) that forbids it names the verdict."""
        for verdict in self._refusals(order, pos):
            return verdict
        return Verdict(True)

    def reasons(self, order: Sequence[int], pos: int) -> tuple[Verdict, ...]:
        """Every rule that forbids the swap at ``pos`` (empty when it is legal), in
        :data:`RULES` order: which rules a widening would have to lift."""
        return tuple(self._refusals(order, pos))

    def _refusals(self, order: Sequence[int], pos: int):
        n = len(order)
        if pos < 0 or pos + 1 >= n:
            yield Verdict(False, "block", "no neighbour")
            return
        a, b = self.insns[order[pos]], self.insns[order[pos + 1]]
        # blocks are slot ranges that never change: the slot's block is the original block
        if self.block_of[pos] != self.block_of[pos + 1]:
            yield Verdict(False, "block", "the slots are in different basic blocks")
            return
        commit = self._commit_group_move(a, b)
        for ins in (a, b):
            if ins.category == "fence" and not (commit and ins is a):
                yield Verdict(False, "fence", f"{ins.mnemonic} never moves")
                break
        for ins in (a, b):
            if ins.index in self.listing.pinned:
                yield Verdict(False, "pinned", f"{ins.mnemonic} at {ins.offset:#x} is named by .nv.info or a relocation")
                break
        if a.writes & b.reads:
            yield Verdict(False, "raw", f"{sorted(a.writes & b.reads)}")
        if a.reads & b.writes:
            yield Verdict(False, "war", f"{sorted(a.reads & b.writes)}")
        if a.writes & b.writes:
            yield Verdict(False, "waw", f"{sorted(a.writes & b.writes)}")
        ca, cb = a.control, b.control
        if ca.sets & cb.waits or ca.waits & cb.sets:
            yield Verdict(False, "scoreboard", "one sets a scoreboard the other waits on")
        elif ca.sets & cb.sets & self.counted_scoreboards and not commit:
            yield Verdict(False, "scoreboard", "both set a scoreboard counted by DEPBAR")
        guarded = self._guarded_conflict(order, pos, a, b)
        if guarded:
            yield Verdict(False, "guarded", guarded)
        if (self.no_sb_producer(a) and self.is_variable(b)) or (self.no_sb_producer(b) and self.is_variable(a)):
            yield Verdict(False, "queue", "in-order completion of a producer without scoreboard")
        elif self.unscoreboarded_reader(a) and self.read_sb_setter(b) or \
                self.unscoreboarded_reader(b) and self.read_sb_setter(a):
            yield Verdict(False, "queue", "in-order operand reads: a reader without read scoreboard and one with")
        if self.options.reuse == "keep":
            if pos > 0 and self.block_of[pos - 1] == self.block_of[pos] and self.insns[order[pos - 1]].control.reuse:
                yield Verdict(False, "reuse", "the previous instruction caches operands for the upper one")
            elif ca.reuse or cb.reuse:
                yield Verdict(False, "reuse", "an operand-reuse flag would feed a different instruction")
        mem = self._memory_conflict(a, b)
        if mem:
            yield Verdict(False, "memory", mem)
        lat = self._latency_conflict(order, pos, a, b)
        if lat:
            yield Verdict(False, "latency", lat)

    def _commit_group_move(self, a: Instruction, b: Instruction) -> bool:
        """With ``commit_group``: ``b`` is an ``LDGSTS`` moving above the ``LDGDEPBAR`` ``a``."""
        return self.options.commit_group and a.opcode == "LDGDEPBAR" and b.opcode == "LDGSTS"

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
                        if old - sa < min(old, self.need(x, b, r)):
                            return f"{r}: {x.mnemonic} -> {b.mnemonic} would be {old - sa} cycles apart"
                    break
            else:
                need = self._incoming_need(r, b)
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
                        if old - sb < min(old, self.need(a, y, r)):
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


def check_swap(listing: Listing, order: Sequence[int], pos: int, options: LegalityOptions = STRICT) -> Verdict:
    """Convenience: :meth:`Legality.check` on a fresh model (build one :class:`Legality` per
    kernel when checking many swaps)."""
    return Legality(listing, options).check(order, pos)


def reuse_cleared(listing: Listing, order: Sequence[int]) -> frozenset[int]:
    """Original indices of the instructions with operand-reuse flags whose successor in
    ``order`` is not their original successor: the flags ``reuse="clear"`` removes. Empty for
    the original order."""
    n = len(order)
    out = set()
    for slot, idx in enumerate(order):
        if not listing.instructions[idx].control.reuse:
            continue
        following = order[slot + 1] if slot + 1 < n else None
        if following != (idx + 1 if idx + 1 < n else None):
            out.add(idx)
    return frozenset(out)
