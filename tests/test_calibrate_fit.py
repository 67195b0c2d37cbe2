"""``marssim calibrate fit``'s pieces: the held-out split, the report, the ``.fit.json`` beside
the table and its agreement with the fits the cost model makes from the same table. Uses the
SYNTHETIC table of tests/data/calibration (generated from known curve parameters)."""

from __future__ import annotations

import json
import random
import shutil
from pathlib import Path

import pytest

from marssim.calibrate.fitting import (
    GroupReport, HoldoutStats, fit_json_path, fit_report, fit_table, format_report, holdout_split, meets_target,
)
from marssim.cost import DataflowCost, KernelTable, load_table
from marssim.cost.calibrated import shape_key

TABLE = Path(__file__).parent / "data" / "calibration" / "synthetic-h100.csv"


@pytest.fixture(scope="module")
def table() -> KernelTable:
    return load_table(TABLE)


def _shapes(rows):
    return {shape_key(r.kind, r.dtype, r.batch, r.m, r.n, r.k, r.flops, r.bytes) for r in rows}


def test_holdout_is_a_fifth_of_the_shapes_whatever_the_row_order(table):
    rows = list(table.select(kind="conv", dtype="bf16").rows)
    fit_rows, held = holdout_split(rows)
    assert len(_shapes(held)) == round(0.2 * len(_shapes(rows))) == 10
    assert not _shapes(fit_rows) & _shapes(held) and len(fit_rows) + len(held) == len(rows)
    shuffled = rows[:]
    random.Random(3).shuffle(shuffled)
    assert _shapes(holdout_split(shuffled)[1]) == _shapes(held)
    # a duplicate measurement of a held-out shape is held out with it
    twice = rows + [held[0]]
    assert len(holdout_split(twice)[1]) == len(held) + 1


def test_report_errors_are_small_on_the_synthetic_table(table):
    reports = fit_report(table)
    assert [r.key for r in reports] == sorted(table.groups())
    for r in reports:
        assert r.fit is not None and r.holdout is not None
        assert r.holdout.n_held == round(0.2 * r.n_shapes) and r.holdout.n_fit == r.n_rows - r.holdout.n_held
        assert 0 <= r.holdout.median <= r.holdout.p90 <= r.holdout.max < 0.03  # 0.5 % noise
    text = format_report(reports)
    assert text.count("met") == 3  # gemm bf16, gemm fp32, conv bf16 have targets, and meet them
    assert "MISSED" not in text


def test_meets_target_reads_median_and_p90():
    stats = HoldoutStats(40, 10, 0.09, 0.21, 0.5)
    gemm = GroupReport(("d", "gemm", "bf16", "vendor"), 50, 50, None, stats)
    assert meets_target(gemm) is False  # p90 above 20 %
    assert meets_target(GroupReport(gemm.key, 50, 50, None, HoldoutStats(40, 10, 0.09, 0.2, 0.5))) is True
    assert meets_target(GroupReport(("d", "norm", "bf16", "vendor"), 50, 50, None, stats)) is None
    assert meets_target(GroupReport(gemm.key, 3, 3, None, None, "too few")) is None


def test_fit_json_beside_the_table_matches_the_cost_models_fits(tmp_path):
    path = tmp_path / "H100.csv"
    shutil.copy(TABLE, path)
    reports, written = fit_table(path)
    assert written == fit_json_path(path) == tmp_path / "H100.fit.json"
    doc = json.loads(written.read_text())
    assert doc["table"] == "H100.csv" and len(doc["groups"]) == len(reports)
    model = DataflowCost(calibration=path)
    fits = model.fits_for("synthetic-H100")  # what a design with gpu.calibration: synthetic-H100 uses
    for g in doc["groups"]:
        params = fits[(g["kind"], g["dtype"])].params
        p = g["params"]
        if p["rate_flop_per_s"] is None:
            assert params.rate == float("inf") and g["kind"] in ("elementwise", "norm")
        else:
            assert p["rate_flop_per_s"] == params.rate
        assert (p["bandwidth_bytes_per_s"], p["k_half"], p["launch_s"]) == (params.bandwidth, params.k_half,
                                                                            params.launch)
        assert g["holdout"]["median_rel_error"] <= g["holdout"]["p90_rel_error"] <= g["holdout"]["max_rel_error"]
    first = written.read_bytes()
    fit_table(path)
    assert written.read_bytes() == first  # deterministic


def test_groups_too_small_are_reported_not_fitted(tmp_path, table):
    rows = table.select(kind="gemm", dtype="bf16").rows[:3]
    reports = fit_report(KernelTable(rows))
    assert len(reports) == 1 and reports[0].fit is None and "need 4" in reports[0].reason
    five = fit_report(KernelTable(table.select(kind="gemm", dtype="bf16").rows[:5]))[0]
    assert five.holdout is not None and five.holdout.n_held == 1  # round(0.2 x 5)
