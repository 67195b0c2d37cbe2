"""Moves, patching and the nvdisasm round trip of patched cubins; annealing with a synthetic
timer; schedule files."""

from __future__ import annotations

import json
import random
from functools import lru_cache
from pathlib import Path

import pytest

from marssim.calibrate.sip.anneal import AnnealConfig, anneal, anneal_seeds, steps_for
from marssim.calibrate.sip.cubin import parse_cubin, read_cubin
from marssim.calibrate.sip.deps import Legality
from marssim.calibrate.sip.perturb import apply_swap, legal_swaps, patch, random_move, replay, roundtrip_mismatches, \
    sip_moves
from marssim.calibrate.sip.sass import Listing, NvdisasmMissing, disassemble, find_nvdisasm
from marssim.calibrate.sip.schedule_file import apply_schedule, load_schedule, new_schedule, save_schedule
from marssim.errors import InputError

DATA = Path(__file__).parent / "data" / "sip"


def _have_nvdisasm() -> bool:
    try:
        find_nvdisasm()
        return True
    except NvdisasmMissing:
        return False


pytestmark = pytest.mark.skipif(not _have_nvdisasm(), reason="nvdisasm not installed (pip install nvidia-cuda-nvdisasm)")


@lru_cache(maxsize=None)
def kernel(name: str) -> tuple:
    cubin = read_cubin(DATA / name)
    lst = next(iter(disassemble(cubin).values()))
    return cubin, lst


def random_walk(lg: Legality, steps: int, seed: int, kind: str = "sip") -> tuple[tuple[int, ...], list[int]]:
    rng = random.Random(seed)
    order = tuple(range(len(lg.insns)))
    swaps = []
    for _ in range(steps):
        move = random_move(rng, lg, order, kind)
        if move is None:
            break
        order = apply_swap(order, move.pos)
        swaps.append(move.pos)
    return order, swaps


# ---------------------------------------------------------------- moves
def test_sip_moves_only_move_memory_instructions_and_are_legal():
    _, lst = kernel("gemm_leaky_relu.sm_90a.cubin")
    lg = Legality(lst)
    order = tuple(range(len(lst)))
    moves = sip_moves(lg, order)
    assert moves
    for m in moves:
        assert lst.instructions[order[m.moved]].mem is not None
        assert m.pos in (m.moved, m.moved - 1)
        assert lg.check(order, m.pos)
    assert set(m.pos for m in moves) <= set(legal_swaps(lg, order))


def test_random_move_is_deterministic_under_a_seed():
    _, lst = kernel("attention_fwd.sm_90a.cubin")
    lg = Legality(lst)
    a = random_walk(lg, 40, seed=7)
    b = random_walk(lg, 40, seed=7)
    c = random_walk(lg, 40, seed=8)
    assert a == b and a != c


@pytest.mark.parametrize("name,kind", [("gemm_leaky_relu.sm_90a.cubin", "sip"), ("attention_fwd.sm_90a.cubin", "sip"),
                                       ("tiled_gemm.sm_90.cubin", "swap"), ("mma_f16.sm_80.cubin", "swap")])
def test_patched_cubin_reads_back_as_the_same_instructions_in_the_new_order(name, kind):
    cubin, lst = kernel(name)
    lg = Legality(lst)
    order, swaps = random_walk(lg, 60, seed=3, kind=kind)
    assert order != tuple(range(len(lst)))
    assert replay(lg, swaps) == order  # every swap was legal where it was made
    data = patch(cubin, lst.kernel, order)
    k = cubin.kernel(lst.kernel)
    # outside the kernel's .text nothing changed
    assert data[:k.file_offset] == cubin.data[:k.file_offset]
    assert data[k.file_offset + k.size:] == cubin.data[k.file_offset + k.size:]
    assert roundtrip_mismatches(lst, data, lst.kernel, order) == []
    # control-flow instructions and block boundaries kept their slots
    for slot, idx in enumerate(order):
        ins = lst.instructions[idx]
        if ins.category == "fence":
            assert slot == idx
    new = parse_cubin(data)
    assert new.kernel(lst.kernel).exit_offsets() == k.exit_offsets()


def test_roundtrip_detects_a_wrong_order():
    cubin, lst = kernel("tiled_gemm.sm_90.cubin")
    order = tuple(range(len(lst)))
    data = patch(cubin, lst.kernel, apply_swap(order, 1))
    assert roundtrip_mismatches(lst, data, lst.kernel, order)  # claims the original order: mismatch


def test_replay_rejects_an_illegal_swap():
    _, lst = kernel("saxpy_loop.sm_90.cubin")
    lg = Legality(lst)
    with pytest.raises(ValueError, match="illegal: raw"):
        replay(lg, [0x40 // 16])  # S2R R3 / IMAD reading R3


# ---------------------------------------------------------------- annealing with a fake timer
def synthetic_timer(lst: Listing):
    """A cost that depends on the order: each memory instruction costs less the earlier it sits
    in its block (latency hiding), plus a per-order hash term of +-0.05% as measurement noise."""
    base = 1e-5
    mem = [i.index for i in lst.instructions if i.mem is not None]

    def measure(order):
        pos = {idx: slot for slot, idx in enumerate(order)}
        t = base + 1e-9 * sum(pos[i] for i in mem)
        noise = (hash(tuple(order)) % 1000 - 500) / 1e6 * 1e-3
        return t * (1 + noise)
    return measure


def test_annealing_finds_an_improvement_and_returns_only_legal_checked_schedules():
    _, lst = kernel("gemm_leaky_relu.sm_90a.cubin")
    lg = Legality(lst)
    measure = synthetic_timer(lst)
    rejected = set()

    def check(order):
        # reject every candidate whose first moved slot is odd: the loop must not return those
        bad = next((s for s, i in enumerate(order) if s != i), 0) % 2 == 1
        if bad:
            rejected.add(order)
        return not bad

    cfg = AnnealConfig(max_steps=150)
    run = anneal(lg, measure, check, cfg, seed=1)
    assert run.best_time < run.initial_time
    assert run.best_order not in rejected and check(run.best_order)
    assert run.check_failures > 0
    assert replay(lg, run.best_swaps) == run.best_order  # reachable by legal swaps
    again = anneal(lg, measure, check, cfg, seed=1)
    assert (again.best_order, again.best_time, again.accepted) == (run.best_order, run.best_time, run.accepted)


def test_annealing_over_seeds_picks_the_fastest():
    _, lst = kernel("attention_fwd.sm_90a.cubin")
    lg = Legality(lst)
    res = anneal_seeds(lg, synthetic_timer(lst), lambda o: True, seeds=[0, 1, 2], config=AnnealConfig(max_steps=60))
    assert len(res.runs) == 3
    assert res.best.best_time == min(r.best_time for r in res.runs)


def test_temperature_schedule_matches_the_paper():
    assert steps_for(AnnealConfig()) == 693  # 0.4 * 0.997^n <= 0.05
    assert steps_for(AnnealConfig(max_steps=10)) == 10
    with pytest.raises(ValueError):
        AnnealConfig(t0=0.01, t_min=0.05)


def test_worse_candidates_are_accepted_with_the_boltzmann_probability():
    """Every move away from the original order is exactly 10% slower: from the original, a run of
    one step accepts with probability exp(-0.1 / T0). Over 300 seeds the count is binomial."""
    import math

    _, lst = kernel("gemm_leaky_relu.sm_90a.cubin")
    lg = Legality(lst)
    original = tuple(range(len(lst)))

    def measure(order):
        return 1.0 if tuple(order) == original else 1.1

    for t0, n in ((0.4, 300), (0.1, 300)):
        cfg = AnnealConfig(t0=t0, t_min=t0 / 2, max_steps=1)
        accepted = sum(anneal(lg, measure, lambda o: True, cfg, seed=s).accepted for s in range(n))
        p = math.exp(-0.1 / t0)
        sd = math.sqrt(n * p * (1 - p))
        assert abs(accepted - n * p) < 4 * sd, (t0, accepted, n * p)


# ---------------------------------------------------------------- schedule files
def test_schedule_file_round_trip_and_apply(tmp_path):
    cubin, lst = kernel("gemm_leaky_relu.sm_90a.cubin")
    lg = Legality(lst)
    order, swaps = random_walk(lg, 30, seed=11)
    sched = new_schedule(cubin, lst.kernel, swaps, order, {"seed": 11, "steps": 30})
    path = tmp_path / "s.json"
    save_schedule(sched, path)
    loaded = load_schedule(path)
    assert loaded == sched and loaded.moved() > 0
    out = tmp_path / "patched.cubin"
    data = apply_schedule(loaded, cubin, out, str(path))
    assert out.read_bytes() == data == patch(cubin, lst.kernel, order)


def test_schedule_file_refuses_another_cubin_and_bad_content(tmp_path):
    cubin, lst = kernel("gemm_leaky_relu.sm_90a.cubin")
    other, _ = kernel("attention_fwd.sm_90a.cubin")
    lg = Legality(lst)
    order, swaps = random_walk(lg, 5, seed=2)
    sched = new_schedule(cubin, lst.kernel, swaps, order, {})
    with pytest.raises(InputError, match="sha256"):
        apply_schedule(sched, other)
    path = tmp_path / "bad.json"
    doc = sched.to_json()
    doc["swaps"] = [0]  # LDC R1 (no scoreboard) / LDC.64 R18: the queue rule forbids it
    doc["order"] = list(apply_swap(tuple(range(len(lst))), 0))
    path.write_text(json.dumps(doc))
    bad = load_schedule(path)
    assert lg.check(tuple(range(len(lst))), 0).reason == "queue"
    with pytest.raises(InputError, match="illegal"):
        apply_schedule(bad, cubin, schedule_path=str(path))
    doc["order"] = [0] * len(lst)
    path.write_text(json.dumps(doc))
    with pytest.raises(InputError, match="order"):
        load_schedule(path)
    path.write_text("{")
    with pytest.raises(InputError, match="expected JSON"):
        load_schedule(path)
