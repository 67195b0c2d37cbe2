"""The SIP legality model's options, each on real instruction sequences of the test cubins
(nvdisasm text quoted and checked): the stall-distance table observed in ptxas's output (and
the tightening it brings to the default), clearing reuse flags instead of refusing a move,
moving an LDGSTS into the cp.async group committed just above it; the reasons a move is refused
(every rule, not the first); the Triton kernels' sm_80 code path, on its own and assembled for
sm_90 (what an H100 runs). CPU only: whether the widenings are right on the hardware is checked
by ``tests/test_sip_gpu.py`` on a GPU."""

from __future__ import annotations

import random
from functools import lru_cache
from pathlib import Path

import pytest

from marssim.calibrate.sip.cubin import parse_cubin, read_cubin
from marssim.calibrate.sip.deps import FIXED_LATENCY_CYCLES, RULES, Legality, LegalityOptions, reuse_cleared
from marssim.calibrate.sip.latency import consumer_key, minima, observe
from marssim.calibrate.sip.latency_table import OBSERVED
from marssim.calibrate.sip.perturb import (
    apply_swap, cleared_for, legal_swaps, patch_for, random_move, roundtrip_mismatches, sip_move_reasons, sip_moves,
)
from marssim.calibrate.sip.sass import NvdisasmMissing, disassemble, find_nvdisasm
from marssim.calibrate.sip.schedule_file import apply_schedule, load_schedule, new_schedule, save_schedule
from marssim.cli import main

DATA = Path(__file__).parent / "data" / "sip"


def _have_nvdisasm() -> bool:
    try:
        find_nvdisasm()
        return True
    except NvdisasmMissing:
        return False


pytestmark = pytest.mark.skipif(not _have_nvdisasm(), reason="nvdisasm not installed (pip install nvidia-cuda-nvdisasm)")

OBSERVED_ONLY = LegalityOptions(latency="observed")
CLEAR = LegalityOptions(reuse="clear")
COMMIT = LegalityOptions(commit_group=True)


@lru_cache(maxsize=None)
def listings(name: str) -> tuple:
    return tuple(disassemble(read_cubin(DATA / name)).values())


def listing(name: str):
    return listings(name)[0]


def swap_at(name: str, offset: int, upper: str, lower: str):
    lst = listing(name)
    pos = offset // 16
    assert lst.instructions[pos].text == upper and lst.instructions[pos + 1].text == lower
    return lst, tuple(range(len(lst))), pos


def stall_sum(lst, start: int, end: int) -> int:
    return sum(lst.instructions[k].control.stall for k in range(start // 16, end // 16))


# ----------------------------------------------------------------------------- the observed table
def test_the_committed_table_is_what_the_test_cubins_give():
    """``latency_table.OBSERVED`` is reproducible from the committed cubins (keys seen twice)."""
    lsts = [lst for p in sorted(DATA.glob("*.cubin")) for lst in listings(p.name)]
    observed = observe(lsts)
    assert minima(observed, 2) == OBSERVED
    for key, (least, n, at_least) in OBSERVED.items():
        assert 1 <= at_least <= n and least == min(observed[key]) and 0 < least < 200


def test_observed_pairs_are_real_dependences():
    """Every pair observe() records: the producer names the register as its result, the consumer
    names it among its sources (spot checks on quoted instructions)."""
    lst = listing("gemm_leaky_relu.sm_90a.cubin")
    sts = next(i for i in lst.instructions if i.text == "STS.128 [R2+UR5], R12")
    assert consumer_key(sts, "R12") == ("data", "2") and consumer_key(sts, "R15") == ("data", "2+")
    assert consumer_key(sts, "R2") == ("addr", "lo") and consumer_key(sts, "R16") is None
    ldgsts = next(i for i in lst.instructions if i.text.startswith("LDGSTS.E.BYPASS.128 [R13+0x8000], desc[UR18][R34.64]"))
    assert consumer_key(ldgsts, "R35") == ("addr", "hi") and consumer_key(ldgsts, "UR19") == ("addr", "desc-hi")
    assert consumer_key(ldgsts, "P5") == ("pred", "3")


@pytest.mark.parametrize("name,offset,upper,lower,producer", [
    # ISETP.GE.AND P6 -> SEL ... P6: the table's 6 cycles would refuse 5; ptxas leaves 4 (32 times on sm_90)
    ("gemm_leaky_relu.sm_90a.cubin", 0x1120, "LDGSTS.E.BYPASS.128 [R13+0x9800], desc[UR18][R36.64], P5",
     "SEL R14, RZ, 0x10, P6", "ISETP.GE.AND"),
    # F2FP is not in the table (never shrinks); ptxas stores its later registers 5 cycles after it
    ("attention_fwd.sm_90a.cubin", 0x2D90, "SHF.L.U32 R15, R15, 0x1, RZ", "STS.128 [R3+UR6], R4",
     "F2FP.F16.F32.PACK_AB"),
    # the sm_80 path on sm_90: SEL R4 -> ISETP.NE.U32.AND R4 at 5 cycles
    ("gemm_leaky_relu.sm_80.sm_90.cubin", 0x12F0,
     "LDGSTS.E.BYPASS.LTC128B.128 [R7+0x9000], desc[UR12][R10.64], P1", "ISETP.NE.U32.AND P4, PT, R4, RZ, PT",
     "SEL"),
])
def test_observed_latency_lets_a_consumer_come_as_close_as_ptxas_puts_it(name, offset, upper, lower, producer):
    lst, order, pos = swap_at(name, offset, upper, lower)
    strict = Legality(lst).check(order, pos)
    assert (strict.ok, strict.reason) == (False, "latency") and producer in strict.detail
    assert Legality(lst, OBSERVED_ONLY).check(order, pos).ok


def test_observed_latency_still_refuses_below_what_ptxas_leaves():
    """IMAD.WIDE -> the address of an LDGSTS: ptxas never leaves less than 5 cycles for the low
    register (the one IMAD.WIDE names), so 4 is refused; the high register is never observed
    (only a named result counts), so it keeps the table's 6 and 5 is refused."""
    lst = listing("gemm_leaky_relu.sm_90a.cubin")
    lg = Legality(lst, OBSERVED_ONLY)
    order = tuple(range(len(lst)))
    key = [k for k in OBSERVED if k.family == "sm_90" and k.producer == "IMAD.WIDE" and k.consumer == "memory"
           and k.role == "addr"]
    assert [(k.slot, OBSERVED[k][0]) for k in key] == [("lo", 5)]
    refused = [v for pos in range(len(lst) - 1) for v in [lg.check(order, pos)]
               if not v and "IMAD.WIDE -> LDGSTS" in v.detail]
    assert refused
    for v in refused:
        reg = int(v.detail.split(":")[0][1:])
        cycles = int(v.detail.split(" would be ")[1].split()[0])
        assert cycles < (5 if reg % 2 == 0 else 6)


def test_the_default_keeps_at_least_the_table_and_observed_mode_is_wider_overall():
    for name in ("gemm_leaky_relu.sm_90a.cubin", "attention_fwd.sm_90a.cubin", "gemm_leaky_relu.sm_80.sm_90.cubin"):
        lst = listing(name)
        order = tuple(range(len(lst)))
        strict, wide = Legality(lst), Legality(lst, OBSERVED_ONLY)
        for ins in lst.instructions:
            if ins.category == "fixed" and ins.opcode in FIXED_LATENCY_CYCLES:
                assert strict.latency(ins) >= FIXED_LATENCY_CYCLES[ins.opcode]
        assert len(legal_swaps(wide, order)) > len(legal_swaps(strict, order))


# ----------------------------------------------------------------------------- reuse flags
def test_clearing_reuse_flags_instead_of_refusing_the_move(tmp_path):
    name = "gemm_leaky_relu.sm_90a.cubin"
    lst, order, pos = swap_at(name, 0x2A70, "IMAD.WIDE R4, R6.reuse, 0x2, R4", "LDSM.16.M88.4 R36, [R0]")
    assert Legality(lst).check(order, pos).reason == "reuse"
    lg = Legality(lst, CLEAR)
    assert lg.check(order, pos).ok
    moved = apply_swap(order, pos)
    cleared = reuse_cleared(lst, moved)
    assert pos in cleared  # the IMAD.WIDE now precedes another instruction than the one its R6 was cached for
    for idx in cleared:  # exactly the instructions with reuse flags whose successor changed
        slot = moved.index(idx)
        assert lst.instructions[idx].control.reuse and (slot + 1 == len(moved) or moved[slot + 1] != idx + 1)
    assert reuse_cleared(lst, order) == frozenset()
    cubin = read_cubin(DATA / name)
    data = patch_for(lg, cubin, moved)
    assert roundtrip_mismatches(lst, data, lst.kernel, moved, cleared) == []
    kernel = parse_cubin(data).kernel(lst.kernel)
    word = kernel.word(moved.index(pos))
    assert word == lst.instructions[pos].word & ~(0xF << 122)  # only the reuse bits differ
    assert disassemble(parse_cubin(data))[lst.kernel].instructions[moved.index(pos)].text == "IMAD.WIDE R4, R6, 0x2, R4"


def test_a_schedule_file_remembers_its_options_and_reapplies_the_cleared_flags(tmp_path):
    name = "attention_fwd.sm_90a.cubin"
    cubin = read_cubin(DATA / name)
    lst = listing(name)
    lg = Legality(lst, LegalityOptions.parse("all"))
    rng = random.Random(3)
    order, swaps = tuple(range(len(lst))), []
    for _ in range(150):
        m = random_move(rng, lg, order, "sip")
        order = apply_swap(order, m.pos)
        swaps.append(m.pos)
    assert cleared_for(lg, order)
    path = tmp_path / "s.json"
    save_schedule(new_schedule(cubin, lst.kernel, swaps, order, {}, lg.options), path)
    again = load_schedule(path)
    assert again.legality == LegalityOptions("observed", "clear", True)
    assert apply_schedule(again, cubin) == patch_for(lg, cubin, order)
    assert main(["sip", "verify", str(path), str(DATA / name)]) == 0
    # under the default model the same swaps are not all legal: the file's options are what makes them so
    strict = dict(again.to_json(), legality={})
    (tmp_path / "strict.json").write_text(__import__("json").dumps(strict))
    with pytest.raises(Exception, match="illegal"):
        apply_schedule(load_schedule(tmp_path / "strict.json"), cubin)


# ----------------------------------------------------------------------------- cp.async groups
def test_an_ldgsts_may_join_the_group_committed_above_it_but_not_leave_its_own():
    name = "attention_fwd.sm_90a.cubin"
    lst, order, pos = swap_at(name, 0xC00, "LDGDEPBAR",
                              "LDGSTS.E.BYPASS.128 [R33+0x8000], desc[UR16][R26.64], P1")
    assert Legality(lst).check(order, pos).reason == "fence"
    lg = Legality(lst, COMMIT)
    assert lg.check(order, pos).ok
    # the LDGSTS right above an LDGDEPBAR may not move below it (its group would be waited on too early)
    below = [p for p in range(len(lst) - 1)
             if lst.instructions[p].opcode == "LDGSTS" and lst.instructions[p + 1].opcode == "LDGDEPBAR"]
    assert below and all(lg.check(order, p).reason == "fence" for p in below)


# ----------------------------------------------------------------------------- reasons
def test_reasons_lists_every_rule_and_check_reports_the_first():
    lst = listing("gemm_leaky_relu.sm_90a.cubin")
    lg = Legality(lst)
    order = tuple(range(len(lst)))
    multi = 0
    for pos in range(len(lst) - 1):
        reasons = lg.reasons(order, pos)
        verdict = lg.check(order, pos)
        assert bool(reasons) != verdict.ok
        if reasons:
            assert verdict.reason == reasons[0].reason
            names = [v.reason for v in reasons]
            assert names == sorted(names, key=RULES.index) and len(set(names)) == len(names)
            multi += len(names) > 1
    assert multi > 20
    refused = sip_move_reasons(lg, order)
    n_moves = sum(1 for i in lst.instructions if i.mem) * 2
    assert len(sip_moves(lg, order)) + len(refused) == n_moves - sum(  # the first/last slot has one neighbour
        1 for s in (0, len(order) - 1) if lst.instructions[order[s]].mem)


def test_options_parse_and_refuse_garbage():
    assert LegalityOptions.parse("") == LegalityOptions() and not LegalityOptions().widened
    assert LegalityOptions.parse("reuse=clear,commit_group") == LegalityOptions("table", "clear", True)
    assert LegalityOptions.parse("all").widened == ("latency=observed", "reuse=clear", "commit_group")
    for bad in ("latency=fast", "reuse", "foo", "reuse=drop"):
        with pytest.raises(ValueError):
            LegalityOptions.parse(bad)


def test_inspect_with_widenings_and_rule_counts(capsys):
    assert main(["sip", "inspect", str(DATA / "attention_fwd.sm_90a.cubin"), "--widen", "all"]) == 0
    out = capsys.readouterr().out
    lst = listing("attention_fwd.sm_90a.cubin")
    lg = Legality(lst, LegalityOptions.parse("all"))
    n = len(sip_moves(lg, tuple(range(len(lst)))))
    assert "not verified on a GPU" in out and f"legal SIP moves {n} of" in out
    assert "SIP moves refused by one rule alone:" in out
    assert main(["sip", "inspect", str(DATA / "attention_fwd.sm_90a.cubin"), "--widen", "bogus"]) == 2


# ----------------------------------------------------------------------------- the sm_80 code path
@pytest.mark.parametrize("name,arch", [("gemm_leaky_relu.sm_80.cubin", "sm_80"), ("attention_fwd.sm_80.cubin", "sm_80"),
                                       ("gemm_leaky_relu.sm_80.sm_90.cubin", "sm_90"),
                                       ("attention_fwd.sm_80.sm_90.cubin", "sm_90")])
def test_the_sm80_builds_parse_and_yield_legal_moves_that_patch_exactly(name, arch):
    cubin = read_cubin(DATA / name)
    assert cubin.arch == arch
    lst = listing(name)
    opcodes = {i.opcode for i in lst.instructions}
    # the Ampere code path: mma.sync (HMMA), cp.async (LDGSTS), ldmatrix (LDSM); no warpgroup MMA
    assert {"HMMA", "LDGSTS", "LDSM"} <= opcodes and not opcodes & {"HGMMA", "WARPGROUP"}
    lg = Legality(lst)
    order = tuple(range(len(lst)))
    assert len(sip_moves(lg, order)) > 20
    rng = random.Random(0)
    for _ in range(200):
        order = apply_swap(order, random_move(rng, lg, order, "sip").pos)
    assert sum(1 for slot, idx in enumerate(order) if slot != idx) > 20
    assert roundtrip_mismatches(lst, patch_for(lg, cubin, order), lst.kernel, order) == []


def test_hopper_path_uses_warpgroup_mma_and_the_sm80_path_does_not():
    hopper = {i.opcode for i in listing("gemm_leaky_relu.sm_90a.cubin").instructions}
    ampere_on_hopper = {i.opcode for i in listing("gemm_leaky_relu.sm_80.sm_90.cubin").instructions}
    assert "HGMMA" in hopper and "HMMA" not in hopper
    assert "HMMA" in ampere_on_hopper and "HGMMA" not in ampere_on_hopper


def test_build_and_tune_refuse_bad_targets_without_a_gpu(capsys):
    from marssim.calibrate.sip.kernels import sass_arch_for
    from marssim.errors import InputError

    assert sass_arch_for("sm_80", (9, 0)) == "sm_90" and sass_arch_for("sm_80", (8, 6)) == "sm_86"
    assert sass_arch_for("sm_90a", (9, 0)) == "sm_90a" and sass_arch_for("sm_80", None) == "sm_80"
    with pytest.raises(InputError):
        sass_arch_for("sm_90a", (8, 0))
    with pytest.raises(InputError):
        sass_arch_for("sm_70", (9, 0))
    assert main(["sip", "build", "--kernel", "gemm_leaky_relu", "--target", "sm_80", "--sass", "ninety",
                 "-o", "x.cubin"]) == 2


def test_schedules_tuned_before_the_options_replay_under_their_own_model():
    """The GEMM schedule tuned on the H100 (no ``legality`` key: tuned under the 6-cycle table
    alone) still replays; under today's default one of its swaps brings an LDGSTS 12 cycles after
    the compare that sets its predicate operand, where ptxas always leaves at least 13."""
    from marssim.calibrate.sip.perturb import replay

    root = Path(__file__).resolve().parent.parent / "analysis" / "results" / "sip"
    schedule = load_schedule(root / "gemm_leaky_relu.M512_N512_K2048.schedule.json")
    assert schedule.legality == LegalityOptions(latency="table-only")
    cubin = read_cubin(root / "gemm_leaky_relu.M512_N512_K2048.original.cubin")
    assert apply_schedule(schedule, cubin) == (root / "gemm_leaky_relu.M512_N512_K2048.sip.cubin").read_bytes()
    lst = next(iter(disassemble(cubin).values()))
    with pytest.raises(ValueError, match=r"swap 5 .*ISETP.NE.U32.AND -> LDGSTS.E.BYPASS.128 would be 12 cycles"):
        replay(Legality(lst), schedule.swaps)
