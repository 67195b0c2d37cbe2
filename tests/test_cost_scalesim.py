"""The systolic memory model against SCALE-Sim 3.0.0 (the committed tables of tests/data/scalesim).

``reference.csv`` is SCALE-Sim as released; ``reference_repaired.csv`` the same grid with its
read buffers repaired (seek instead of going round the operand, keep the end of the half just
left, charge a slide for what it advances; see that directory's README). marssim runs the same
layers on designs of the same buffers and per-buffer DRAM channels under ``convention:
scalesim``. Targets: total cycles median error <= 10% and p90 <= 25%, DRAM bytes median <= 10%,
the order of os/ws/is by cycles as SCALE-Sim's in >= 90% of (layer, SRAM, bandwidth) cases.
"""

from __future__ import annotations

import numpy as np
import pytest

from marssim.cost import fold_cycles
from scalesim_support import DATA, load_reference, marssim_columns, order_agreement, relative_errors, untouched

LAYERS = 9
GRID = LAYERS * 3 * 3 * 3


@pytest.fixture(scope="module")
def stock():
    return load_reference(DATA / "reference.csv")


@pytest.fixture(scope="module")
def repaired():
    return load_reference(DATA / "reference_repaired.csv")


@pytest.fixture(scope="module")
def ours_stock(stock):
    return marssim_columns(stock)


@pytest.fixture(scope="module")
def ours_repaired(repaired):
    return marssim_columns(repaired)


def test_the_grid_is_complete(stock, repaired):
    """Every layer, dataflow, SRAM size and bandwidth once in each table, with the same layers."""
    for table in (stock, repaired):
        keys = table[["layer", "dataflow", "sram_kb", "bandwidth"]].drop_duplicates()
        assert len(table) == len(keys) == GRID
        assert table["layer"].nunique() == LAYERS
        assert set(table["dataflow"]) == {"os", "ws", "is"}
        assert table["sram_kb"].nunique() == 3 and table["bandwidth"].nunique() == 3


def test_scalesim_compute_cycles_are_the_fold_formula(stock):
    """SCALE-Sim's Total Cycles less its Stall Cycles is marssim's stall-free fold count, on
    every run (an exact, independent check of the fold formulas)."""
    for _, r in stock.iterrows():
        cycles = fold_cycles(r["dataflow"], 32, 32, int(r["m"]), int(r["n"]), int(r["k"]))
        assert r["total_cycles"] - r["stall_cycles"] == cycles, (r["layer"], r["dataflow"])


def _check_errors(ref, ours, what):
    cyc, dram = relative_errors(ref, ours)
    assert np.median(cyc) <= 0.10, f"{what}: cycles median error {np.median(cyc):.3f}"
    assert np.quantile(cyc, 0.9) <= 0.25, f"{what}: cycles p90 error {np.quantile(cyc, 0.9):.3f}"
    assert np.median(dram) <= 0.10, f"{what}: DRAM bytes median error {np.median(dram):.3f}"


def _check_order(ref, ours, what):
    agree, total = order_agreement(ref, ours)
    assert total > 0 and agree >= 0.9 * total, f"{what}: dataflow order agrees in {agree} of {total}"


def _check_targets(ref, ours, what):
    _check_errors(ref, ours, what)
    _check_order(ref, ours, what)


def test_error_targets_against_repaired_scalesim(repaired, ours_repaired):
    """Every run of the grid, against SCALE-Sim with its read buffers repaired: cycles and DRAM
    bytes."""
    _check_errors(repaired, ours_repaired, "repaired")


@pytest.mark.xfail(strict=True, reason="not met yet: the order of os/ws/is agrees in 63 of 81 cases (78%), "
                   "mostly near-ties (docs/memory-model.md, section 5)")
def test_order_target_against_repaired_scalesim(repaired, ours_repaired):
    """Every (layer, SRAM, bandwidth) case of the grid: the order of the three dataflows by
    cycles, against SCALE-Sim with its read buffers repaired (target: >= 90% of cases)."""
    _check_order(repaired, ours_repaired, "repaired")


def test_targets_against_scalesim_where_the_repairs_change_nothing(stock, repaired, ours_stock):
    """Against SCALE-Sim as released, on the runs whose cycles and DRAM bytes the repairs leave
    as they are."""
    mask = untouched(stock, repaired)
    assert mask.sum() >= 30  # enough runs to state a median and a p90 on
    _check_targets(stock[mask], ours_stock[mask], "as released")


def test_scalesim_wrap_around_only_adds_traffic(stock, repaired):
    """Where the repairs act, SCALE-Sim as released moves at least as many DRAM bytes as the
    repaired buffers (its wrap-arounds and whole-half slides only fetch more)."""
    both = stock.merge(repaired, on=["layer", "dataflow", "sram_kb", "bandwidth"], suffixes=("", "_rep"))
    rerun = both[both["rerun"] == 1]
    assert len(rerun) > 0
    assert (rerun["dram_bytes"] >= rerun["dram_bytes_rep"]).all()
