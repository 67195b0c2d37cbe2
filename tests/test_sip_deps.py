"""Legality rules of adjacent swaps, each shown on real instruction sequences from the test cubins
(the nvdisasm text is quoted and checked, so the sequences are the real ones): a forbidden swap
rejected with the rule's reason and an allowed one accepted.

Two kinds of fixtures: ``in_place`` checks a swap inside the full kernel (all of its context
counts); ``sequence`` builds a short straight-line listing from chosen real instructions (text and
128-bit word, so the real control codes), for rules whose pattern ptxas never emits adjacently."""

from __future__ import annotations

import dataclasses
from functools import lru_cache
from pathlib import Path

import pytest

from marssim.calibrate.sip.cubin import read_cubin
from marssim.calibrate.sip.deps import Legality
from marssim.calibrate.sip.sass import Listing, NvdisasmMissing, disassemble, find_blocks, find_nvdisasm, \
    parse_instruction

DATA = Path(__file__).parent / "data" / "sip"


def _have_nvdisasm() -> bool:
    try:
        find_nvdisasm()
        return True
    except NvdisasmMissing:
        return False


pytestmark = pytest.mark.skipif(not _have_nvdisasm(), reason="nvdisasm not installed (pip install nvidia-cuda-nvdisasm)")


@lru_cache(maxsize=None)
def listing(cubin: str) -> Listing:
    return next(iter(disassemble(read_cubin(DATA / cubin)).values()))


def in_place(cubin: str, offset: int, upper: str, lower: str):
    """(legality, original order, slot) for the swap of the instruction at ``offset`` with the
    next one, after checking that nvdisasm prints them as ``upper`` and ``lower``."""
    lst = listing(cubin)
    pos = offset // 16
    assert lst.instructions[pos].text == upper
    assert lst.instructions[pos + 1].text == lower
    return Legality(lst), tuple(range(len(lst))), pos


def verdict(cubin: str, offset: int, upper: str, lower: str):
    lg, order, pos = in_place(cubin, offset, upper, lower)
    return lg.check(order, pos)


def sequence(*items: tuple[str, int, str]) -> Listing:
    """A one-block listing of real instructions: (cubin, offset, quoted text) each."""
    insns = []
    for i, (cubin, offset, text) in enumerate(items):
        real = listing(cubin).instructions[offset // 16]
        assert real.text == text
        insns.append(parse_instruction(real.text, real.word, i))
    return Listing("sequence", "sm_90", tuple(insns), find_blocks(insns))


def check_seq(lst: Listing, pos: int):
    return Legality(lst).check(tuple(range(len(lst))), pos)


# ---------------------------------------------------------------- block boundaries
def test_no_swap_across_a_basic_block_boundary():
    # tiled_gemm.sm_90: the loop body starts at 0x2e0 (label .L_x_1)
    v = verdict("tiled_gemm.sm_90.cubin", 0x2D0, "IMAD R17, R17, 0x10, R6",
                "LOP3.LUT R11, R19.reuse, 0x1, RZ, 0xc0, !PT")
    assert (v.ok, v.reason) == (False, "block")
    assert listing("tiled_gemm.sm_90.cubin").instructions[0x2E0 // 16].labels
    ok = verdict("tiled_gemm.sm_90.cubin", 0x10, "S2R R3, SR_CTAID.Y", "S2UR UR5, SR_CgaCtaId")
    assert ok.ok


# ---------------------------------------------------------------- fences
@pytest.mark.parametrize("cubin,offset,upper,lower", [
    ("tiled_gemm.sm_90.cubin", 0x200, "LDGSTS.E [R21], desc[UR8][R6.64]", "LDGDEPBAR"),
    ("smem_reduce.sm_90.cubin", 0x110, "STS [R5], R0", "BAR.SYNC.DEFER_BLOCKING 0x0"),
    ("saxpy_loop.sm_90.cubin", 0x190, "STG.E desc[UR6][R6.64], R15", "@!P0 BRA `(.L_x_0)"),
    ("attention_fwd.sm_90a.cubin", 0x1040, "UISETP.GE.AND UP0, UPT, UR4, UR18, UPT", "WARPGROUP.ARRIVE"),
    ("attention_fwd.sm_90a.cubin", 0x1060, "HGMMA.64x64x16.F32 R24, gdesc[UR8], RZ, !UPT",
     "UIADD3 UR8, UR14, 0x2, URZ"),
    ("mma_f16.sm_80.cubin", 0x20, "ULDC.64 UR4, c[0x0][0x118]", "BSSY B0, `(.L_x_0)"),
])
def test_fences_never_move(cubin, offset, upper, lower):
    v = verdict(cubin, offset, upper, lower)
    assert (v.ok, v.reason) == (False, "fence")


def test_strong_memory_accesses_and_timers_are_fences():
    for text in ("LDG.E.STRONG.GPU R2, desc[UR4][R2.64]", "CS2R R4, SR_CLOCKLO", "S2R R0, SR_CLOCKLO",
                 "ATOMG.E.ADD.STRONG.GPU PT, R5, desc[UR4][R2.64], R7"):
        assert parse_instruction(text, 0).category == "fence", text
    assert parse_instruction("LDG.E.CONSTANT R2, desc[UR6][R2.64]", 0).category == "memory"


# ---------------------------------------------------------------- pinned offsets
def test_instructions_named_by_nvinfo_stay_put():
    # smem_reduce.sm_90: EIATTR_COOP_GROUP_INSTR_OFFSETS lists the SHFL at 0x260
    lst = listing("smem_reduce.sm_90.cubin")
    assert 0x260 // 16 in lst.pinned
    v = verdict("smem_reduce.sm_90.cubin", 0x260, "SHFL.DOWN PT, R0, R5, 0x10, 0x1f", "FADD R0, R5, R0")
    assert (v.ok, v.reason) == (False, "pinned")
    # a legal pair becomes illegal once one of them is pinned
    seq = sequence(("saxpy_loop.sm_90.cubin", 0x10, "S2R R0, SR_CTAID.X"),
                   ("tiled_gemm.sm_90.cubin", 0x20, "S2UR UR5, SR_CgaCtaId"),
                   ("saxpy_loop.sm_90.cubin", 0x60, "ISETP.GE.AND P0, PT, R0, UR8, PT"))
    assert check_seq(seq, 0).ok
    pinned = dataclasses.replace(seq, pinned=frozenset({1}))
    assert check_seq(pinned, 0).reason == "pinned"


# ---------------------------------------------------------------- registers, predicates, uniform registers
def test_read_after_write_register():
    v = verdict("saxpy_loop.sm_90.cubin", 0x40, "S2R R3, SR_TID.X", "IMAD R0, R0, UR4, R3")
    assert (v.ok, v.reason) == (False, "raw")


def test_read_after_write_uniform_register():
    v = verdict("tiled_gemm.sm_90.cubin", 0xF0, "UIADD3 UR4, UR4, 0x800, URZ", "ULEA UR4, UR5, UR4, 0x18")
    assert (v.ok, v.reason) == (False, "raw")


def test_write_after_read_register_and_uniform_predicate():
    v = verdict("gemm_leaky_relu.sm_90a.cubin", 0x1F0, "VIADD R2, R0, 0xffffffe", "IMAD.MOV R0, RZ, RZ, -R10")
    assert (v.ok, v.reason) == (False, "war")
    v = verdict("gemm_leaky_relu.sm_90a.cubin", 0xD0, "USEL UR4, URZ, 0x10, !UP0", "UISETP.GT.AND UP0, UPT, UR9, 0x7f, UPT")
    assert (v.ok, v.reason) == (False, "war") and "UP0" in v.detail


def test_write_after_write_and_predicate_read_after_write():
    # two real writers of R3 placed back to back
    seq = sequence(("saxpy_loop.sm_90.cubin", 0x40, "S2R R3, SR_TID.X"),
                   ("smem_reduce.sm_80.cubin", 0xA0, "MOV R3, 0x4"))
    assert check_seq(seq, 0).reason == "waw"
    # ISETP writes P0, the guarded EXIT-free consumer reads it
    seq = sequence(("saxpy_loop.sm_90.cubin", 0x60, "ISETP.GE.AND P0, PT, R0, UR8, PT"),
                   ("tiled_gemm.sm_90.cubin", 0x3E0, "@!P0 LDGSTS.E [R7], desc[UR8][R14.64]"))
    assert check_seq(seq, 0).reason == "raw" and "P0" in check_seq(seq, 0).detail
    # independent registers: allowed
    ok = verdict("gemm_leaky_relu.sm_90a.cubin", 0x20, "S2R R5, SR_CTAID.X", "ULDC UR14, c[0x0][0x230]")
    assert ok.ok


# ---------------------------------------------------------------- scoreboards
def test_producer_may_not_move_below_its_wait():
    # the first LDG waits on SB3 and the second sets SB3; FFMA waits on SB1 that LDS.128 sets
    v = verdict("saxpy_loop.sm_90.cubin", 0x110, "LDG.E.CONSTANT R2, desc[UR6][R2.64]",
                "LDG.E.CONSTANT R5, desc[UR6][R4.64]")
    assert (v.ok, v.reason) == (False, "scoreboard")
    v = verdict("tiled_gemm.sm_90.cubin", 0x620, "FFMA R27, R23, R8, R28", "LDS.128 R4, [R20+0x30]")
    assert (v.ok, v.reason) == (False, "scoreboard")


def test_setters_of_a_scoreboard_counted_by_depbar_keep_their_order():
    a = ("saxpy_loop.sm_90.cubin", 0x10, "S2R R0, SR_CTAID.X")        # sets SB0
    b = ("saxpy_loop.sm_90.cubin", 0x80, "LDC.64 R8, c[0x0][0x218]")  # sets SB0
    tail = ("saxpy_loop.sm_90.cubin", 0x60, "ISETP.GE.AND P0, PT, R0, UR8, PT")
    depbar = ("gemm_leaky_relu.sm_90a.cubin", 0x1960, "DEPBAR.LE SB0, 0x4")
    counted = sequence(a, b, tail, depbar)
    v = check_seq(counted, 0)
    assert (v.ok, v.reason) == (False, "scoreboard") and "DEPBAR" in v.detail
    assert check_seq(sequence(a, b, tail), 0).ok  # no DEPBAR counts SB0: order among setters is free


def test_consumer_may_not_move_above_the_wait_that_guards_it():
    # S2R R9 (sets SB0) ... LEA waits on SB0; ISETP reads R9 without waiting itself
    lst = listing("smem_reduce.sm_80.cubin")
    assert lst.instructions[0x50 // 16].text == "S2R R9, SR_TID.X"
    v = verdict("smem_reduce.sm_80.cubin", 0x60, "LEA R2, R2, R9, 0x8", "ISETP.GT.AND P0, PT, R9, 0x7f, PT")
    assert (v.ok, v.reason) == (False, "guarded") and "R9" in v.detail
    # a waiter followed by an instruction that touches nothing the wait guards may swap
    ok = verdict("attention_fwd.sm_90a.cubin", 0x9F0, "IMAD R27, R31, R2, RZ", "LEA R20, P3, R39, R6, 0x1")
    assert ok.ok


def test_queue_order_of_producers_without_scoreboard():
    # the first LDS sets no scoreboard: its result is covered by the second one's SB0
    v = verdict("smem_reduce.sm_90.cubin", 0x130, "@!P1 LDS R4, [R5]", "@!P1 LDS R7, [R5+0x200]")
    assert (v.ok, v.reason) == (False, "queue")
    v = verdict("tiled_gemm.sm_90.cubin", 0x4A0, "LDS R24, [R18]", "LDS.128 R8, [R20]")
    assert (v.ok, v.reason) == (False, "queue")
    ok = verdict("attention_fwd.sm_90a.cubin", 0x10, "LDC R4, c[0x0][0x264]", "S2R R9, SR_CTAID.Y")
    assert ok.ok  # both scoreboarded



def test_queue_order_of_operand_reads_behind_a_read_scoreboard():
    # ptxas sets a read scoreboard (SB4) only on the last of four LDSM from R0; the IMAD.HI that
    # overwrites R0 waits on SB4 alone. Moving the last LDSM above the third would leave the third
    # one's read of R0 unguarded: on an H100 that swap changed 16,384 output elements.
    v = verdict("attention_fwd.sm_90a.cubin", 0x2F40, "LDSM.16.M88.4 R28, [R0+0x800]",
                "LDSM.16.M88.4 R4, [R0+0xc00]")
    assert (v.ok, v.reason) == (False, "queue")
    lst = listing("attention_fwd.sm_90a.cubin")
    assert lst.instructions[0x2F50 // 16].control.read_sb == 4
    assert 4 in lst.instructions[0x2F60 // 16].control.waits and "R0" in lst.instructions[0x2F60 // 16].writes


# ---------------------------------------------------------------- stall counts of fixed-latency producers
def test_fixed_latency_consumer_keeps_its_stall_distance():
    # ULDC UR7 (stall 1), S2R (stall 1), IMAD.U32 reads UR7: 2 cycles; swapping the last two
    # would leave 1 < min(2, latency)
    lst = listing("tiled_gemm.sm_90.cubin")
    assert lst.instructions[0x40 // 16].text == "ULDC UR7, c[0x0][0x22c]"
    v = verdict("tiled_gemm.sm_90.cubin", 0x50, "S2R R0, SR_TID.Y", "IMAD.U32 R9, RZ, RZ, UR7")
    assert (v.ok, v.reason) == (False, "latency") and "UR7" in v.detail
    # LOP3.LUT R8 at 0x560 is 8 cycles above its consumer; CS2R (stall 2) in between may go: 6 >= min(8, 6)
    lst = listing("attention_fwd.sm_90a.cubin")
    assert lst.instructions[0x560 // 16].text == "LOP3.LUT R8, R0, 0xff0, RZ, 0xc0, !PT"
    ok = verdict("attention_fwd.sm_90a.cubin", 0x590, "CS2R R64, SRZ", "LOP3.LUT R8, R8, 0x70, R3, 0x78, !PT")
    assert ok.ok


def test_a_guard_predicate_keeps_the_13_cycles_ptxas_always_leaves():
    """ISETP.GE.U32.AND P0 at 0x260 is 13 cycles above the ``@P0 IADD3`` at 0x2a0 (2+2+2+7).
    Moving the IADD3 above the ISETP P2 (stall 7) would leave 6 cycles: the 6-cycle table allowed
    it, but ptxas never leaves less than 13 cycles between a compare and an instruction guarded
    by its predicate (22 of 23 ISETP.GT.U32.AND -> guard pairs of the sm_90 cubins are exactly 13
    apart), so the model now keeps them 13 apart, in every mode."""
    from marssim.calibrate.sip.deps import LegalityOptions

    lst = listing("attention_fwd.sm_90a.cubin")
    assert lst.instructions[0x260 // 16].text == "ISETP.GE.U32.AND P0, PT, R0, R5, PT"
    assert sum(lst.instructions[k].control.stall for k in range(0x260 // 16, 0x2A0 // 16)) == 13
    for options in (LegalityOptions(), LegalityOptions(latency="observed")):
        lg = Legality(lst, options)
        v = lg.check(tuple(range(len(lst))), 0x290 // 16)
        assert (v.ok, v.reason) == (False, "latency") and "P0: ISETP.GE.U32.AND -> IADD3" in v.detail


def test_scoreboard_waiter_keeps_its_distance_to_the_setter():
    # F2I sets SB3 at 0x190; IADD3 at 0x1b0 waits on it 4 cycles later; moving it above MOV
    # would leave 2 cycles
    v = verdict("attention_fwd.sm_90a.cubin", 0x1A0, "MOV R2, RZ", "IADD3 R6, RZ, -R3, RZ")
    assert (v.ok, v.reason) == (False, "latency") and "SB3" in v.detail


def test_latency_rule_is_relative_to_the_original_distance():
    # IMAD.WIDE writes R2/R3, the LDG reads them; an unrelated S2UR sits between
    seq = sequence(("saxpy_loop.sm_90.cubin", 0xF0, "IMAD.WIDE R2, R0, 0x4, R8"),
                   ("tiled_gemm.sm_90.cubin", 0x20, "S2UR UR5, SR_CgaCtaId"),
                   ("saxpy_loop.sm_90.cubin", 0x110, "LDG.E.CONSTANT R2, desc[UR6][R2.64]"))
    # IMAD.WIDE stall 4 + S2UR stall 1 = 5 cycles to the LDG; moving LDG up leaves 4 < min(5, 6)
    v = check_seq(seq, 1)
    assert (v.ok, v.reason) == (False, "latency")


# ---------------------------------------------------------------- operand reuse
def test_reuse_pairs_stay_adjacent():
    v = verdict("smem_reduce.sm_90.cubin", 0xD0, "ISETP.GT.AND P1, PT, R6.reuse, 0x7f, PT",
                "ISETP.GT.AND P0, PT, R6, 0x3f, PT")
    assert (v.ok, v.reason) == (False, "reuse")
    v = verdict("attention_fwd.sm_90a.cubin", 0x150, "LOP3.LUT R13, R29, 0x40, R14, 0xfe, !PT", "IADD3 R14, R14, R31, RZ")
    assert not v.ok  # also a WAR on R14; the reuse rule alone is checked next
    lst = listing("attention_fwd.sm_90a.cubin")
    assert lst.instructions[0x140 // 16].control.reuse  # 0x140 caches R29/R14 for 0x150
    v = verdict("attention_fwd.sm_90a.cubin", 0x3C0, "LOP3.LUT R33, R28, 0x1, RZ, 0xc0, !PT", "S2UR UR4, SR_CgaCtaId")
    assert (v.ok, v.reason) == (False, "reuse") and "previous" in v.detail


# ---------------------------------------------------------------- memory ordering
def test_no_store_past_a_store_that_may_alias():
    v = verdict("gemm_leaky_relu.sm_90a.cubin", 0x2AF0, "@P3 STG.E.128 desc[UR18][R4.64], R36",
                "@P2 STG.E.128 desc[UR18][R8.64], R32")
    assert (v.ok, v.reason) == (False, "memory")


def test_no_load_past_a_shared_store():
    # LDGSTS writes shared memory asynchronously; an LDS may not cross it
    v = verdict("gemm_leaky_relu.sm_90a.cubin", 0xDE0, "@!PT LDS RZ, [RZ]",
                "LDGSTS.E.BYPASS.128 [R13], desc[UR18][R26.64], P4")
    assert (v.ok, v.reason) == (False, "memory")


def test_loads_pass_loads_and_spaces_do_not_alias():
    ok = verdict("gemm_leaky_relu.sm_90a.cubin", 0x2AE0, "LDSM.16.M88.4 R40, [R0+0x600]",
                 "@P3 STG.E.128 desc[UR18][R4.64], R36")
    assert ok.ok  # shared load vs global store
    ok = verdict("mma_f16.sm_80.cubin", 0x2D0, "LDG.E.U16.CONSTANT R11, [R2.64]", "LDG.E.U16.CONSTANT R13, [R2.64+0x40]")
    assert ok.ok  # load vs load


def test_same_base_distinct_offsets_alias_across_threads_but_not_in_local_memory():
    # shared memory: another lane's [R5] may equal this lane's [R5+0x200]
    sts = parse_instruction("STS [R5+0x200], R0", (1 << 105) * 4 | (7 << 110) | (7 << 113), 0)
    lds = parse_instruction("LDS R4, [R5]", (1 << 105) * 4 | (7 << 110) | (7 << 113), 1)
    assert Legality._memory_conflict(sts, lds)
    stl = parse_instruction("STL [R1+0x8], R0", (7 << 110) | (7 << 113), 0)
    ldl = parse_instruction("LDL R4, [R1]", (7 << 110) | (7 << 113), 1)
    ldl_overlap = parse_instruction("LDL R4, [R1+0x8]", (7 << 110) | (7 << 113), 1)
    assert not Legality._memory_conflict(stl, ldl)  # thread-private, disjoint bytes
    assert Legality._memory_conflict(stl, ldl_overlap)


# ---------------------------------------------------------------- whole kernels
@pytest.mark.parametrize("cubin", ["gemm_leaky_relu.sm_90a.cubin", "attention_fwd.sm_90a.cubin",
                                   "tiled_gemm.sm_90.cubin", "tiled_gemm.sm_80.cubin"])
def test_every_legal_swap_respects_the_basic_invariants(cubin):
    """Independent re-check of every swap the model allows in the original order."""
    lst = listing(cubin)
    lg = Legality(lst)
    order = tuple(range(len(lst)))
    block_of = lst.block_of()
    allowed = 0
    for pos in range(len(lst) - 1):
        if not lg.check(order, pos):
            continue
        allowed += 1
        a, b = lst.instructions[pos], lst.instructions[pos + 1]
        assert block_of[pos] == block_of[pos + 1]
        assert a.category != "fence" and b.category != "fence"
        assert not (a.writes & (b.reads | b.writes)) and not (a.reads & b.writes)
        assert not (a.control.sets & b.control.waits) and not (a.control.waits & b.control.sets)
        assert not (a.mem and b.mem and (a.mem.writes or b.mem.writes) and
                    {a.mem.space, b.mem.space} & {"generic"} | ({a.mem.space} & {b.mem.space}))
    assert allowed > 10


def test_sources_of_a_reader_without_read_scoreboard_are_not_overwritten_sooner():
    sts = ("smem_reduce.sm_90.cubin", 0x110, "STS [R5], R0")            # no read scoreboard
    s2ur = ("tiled_gemm.sm_90.cubin", 0x20, "S2UR UR5, SR_CgaCtaId")
    overwrite = ("smem_reduce.sm_90.cubin", 0x30, "HFMA2.MMA R0, -RZ, RZ, 0, 0")
    seq = sequence(sts, s2ur, overwrite)
    v = check_seq(seq, 1)  # the overwrite of R0 would follow the STS by 1 cycle instead of 2
    assert (v.ok, v.reason) == (False, "latency") and "overwrite a source" in v.detail
    spaced = sequence(sts, ("tiled_gemm.sm_90.cubin", 0x2D0, "IMAD R17, R17, 0x10, R6"), s2ur, overwrite,
                      ("saxpy_loop.sm_90.cubin", 0x60, "ISETP.GE.AND P0, PT, R0, UR8, PT"))
    assert check_seq(spaced, 2).ok  # 1 + 7 stall cycles remain between them
