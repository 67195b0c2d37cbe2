"""The local residual correction of the calibrated GPU model (marssim.cost.residual): on a
table generated here from a known curve times a smooth multiplicative distortion the curve
cannot represent, the corrected model predicts held-out shapes far better than the curve;
far from every measured shape it is the curve; a held-out row never influences its own
prediction; the cost model's scalar and vectorised paths agree bit for bit."""

from __future__ import annotations

import math

import numpy as np
import pytest

from marssim.calibrate.fitting import fit_report, holdout_split
from marssim.cost import CalibratedCost, CurveParams, KernelTable, fit_group, predict
from marssim.cost.calibrated import KernelTiming
from marssim.cost.gpu import gemm_curve
from marssim.cost.residual import fit_correction, gemm_features
from marssim.system import Design
from marssim.workload import GraphBuilder

TRUE = CurveParams(rate=7.0e14, bandwidth=2.8e12, k_half=48.0, launch=4.0e-6, sms=132)


def _distortion(m: int, n: int, k: int) -> float:
    """A smooth, shape-dependent slowdown (1x..2.2x) no choice of the curve's four parameters
    can absorb: a bump in ln n times a ramp in ln k."""
    return math.exp(0.8 * math.exp(-0.5 * ((math.log(n) - math.log(1024)) / 0.7) ** 2)
                    * (0.5 + 0.5 * math.tanh(math.log(k / 1024))))


def _table(noise: float = 0.005, seed: int = 7) -> KernelTable:
    rng = np.random.default_rng(seed)
    rows = []
    for m in (256, 512, 1024, 2048, 4096, 8192):
        for n in (256, 512, 768, 1024, 1536, 2048, 3072, 4096):
            for k in (256, 512, 1024, 2048, 4096):
                nbytes = 2.0 * (m * k + k * n + m * n)
                flops = 2.0 * m * n * k
                t = gemm_curve(1, m, n, k, flops, nbytes, *TRUE.as_row(), max, min)[0]
                t *= _distortion(m, n, k) * math.exp(noise * rng.standard_normal())
                rows.append(KernelTiming("gemm", "bf16", 1, m, n, k, flops, nbytes, "synth", 132, "1", "12.4",
                                         "vendor", t, 0.0, 10, "2025-01-01"))
    return KernelTable(tuple(rows))


@pytest.fixture(scope="module")
def table() -> KernelTable:
    return _table()


def _arrays(rows):
    return dict(batch=[r.batch for r in rows], m=[r.m for r in rows], n=[r.n for r in rows], k=[r.k for r in rows],
                flops=[r.flops for r in rows], nbytes=[r.bytes for r in rows])


def test_corrected_model_beats_the_curve_on_held_out_shapes(table):
    (report,) = fit_report(table)
    curve, model = report.curve_holdout, report.holdout
    # the pure curve cannot follow the distortion (up to 2.2x) ...
    assert curve.median > 0.08 and curve.p90 > 0.2
    # ... the correction from measured neighbours can, up to interpolation between grid points
    assert model.median < 0.4 * curve.median and model.p90 < 0.5 * curve.p90
    assert model.median < 0.05 and model.p90 < 0.12
    assert report.fit.correction is not None and report.fit.correction.loo_error < report.fit.correction.curve_error


def test_no_correction_on_a_table_the_curve_explains():
    """Noise alone (0.5 %) is not worth correcting: leave-one-out keeps the curve."""
    rows = tuple(KernelTiming(r.kind, r.dtype, r.batch, r.m, r.n, r.k, r.flops, r.bytes, r.device, r.sms, r.driver,
                              r.cuda, r.tuning, r.median_s / _distortion(r.m, r.n, r.k), 0.0, 10, r.date)
                 for r in _table().rows)
    assert fit_group(rows).correction is None


def test_far_from_every_measured_shape_the_prediction_is_the_curve(table):
    f = fit_group(table.rows)
    corr = f.correction
    assert corr is not None
    far = dict(batch=[1, 64], m=[16, 1 << 20], n=[64, 65536], k=[16, 65536])
    far["nbytes"] = [2.0 * (m * k + k * n + m * n) for m, n, k in zip(far["m"], far["n"], far["k"])]
    x = gemm_features(far["batch"], far["m"], far["n"], far["k"], corr.m_scale, corr.align_scale)
    nearest = np.min(np.linalg.norm(corr.points[None, :, :] - x[:, None, :], axis=2), axis=1)
    assert np.all(nearest >= corr.radius)  # no measured shape within range ...
    assert np.array_equal(predict(f, "gemm", **far), predict(f, "gemm", corrected=False, **far))  # ... exactly


def test_near_a_measured_shape_the_correction_follows_it(table):
    f = fit_group(table.rows)
    m, n, k = 1024, 1100, 2048  # between measured n = 1024 and 1536, where the distortion peaks
    nbytes = 2.0 * (m * k + k * n + m * n)
    curve = float(predict(f, "gemm", m=m, n=n, k=k, nbytes=nbytes, corrected=False))
    model = float(predict(f, "gemm", m=m, n=n, k=k, nbytes=nbytes))
    truth = gemm_curve(1, m, n, k, 2.0 * m * n * k, nbytes, *TRUE.as_row(), max, min)[0] * _distortion(m, n, k)
    assert abs(model / truth - 1) < 0.5 * abs(curve / truth - 1)


def test_a_held_out_row_never_influences_its_own_prediction(table):
    rows = list(table.rows)
    fit_rows, held = holdout_split(rows)
    base = predict(fit_group(fit_rows), "gemm", **_arrays(held))
    changed = [KernelTiming(**{**{f: getattr(r, f) for f in r.__dataclass_fields__}, "median_s": r.median_s * 5})
               if r in held else r for r in rows]
    fit_rows2, held2 = holdout_split(changed)
    assert [r.m for r in held2] == [r.m for r in held]
    assert np.array_equal(predict(fit_group(fit_rows2), "gemm", **_arrays(held2)), base)
    # the report's held-out errors move only by the measured times of the held-out rows
    (a,), (b,) = fit_report(KernelTable(tuple(rows))), fit_report(KernelTable(tuple(changed)))
    assert a.holdout.n_held == b.holdout.n_held and b.holdout.median > a.holdout.median


def test_fit_and_prediction_are_deterministic_and_order_independent(table):
    rows = list(table.rows)
    a = fit_group(rows)
    b = fit_group(rows[::-1])
    probe = dict(batch=[1, 2, 1], m=[300, 1000, 5000], n=[1000, 700, 2500], k=[900, 3000, 300],
                 nbytes=[1e6, 2e6, 3e6])
    assert np.array_equal(predict(a, "gemm", **probe), predict(fit_group(rows), "gemm", **probe))
    assert np.allclose(predict(a, "gemm", **probe), predict(b, "gemm", **probe), rtol=1e-6)


def test_fit_correction_needs_a_few_shapes():
    assert fit_correction(True, [1] * 3, [64, 128, 256], [64] * 3, [64] * 3, [0.0] * 3, [1.0] * 3,
                          [0.5, -0.5, 0.5]) is None


def _h100(calibration: str) -> Design:
    return Design(name="h100", dataflow="gpu", clock=1.83e9, sram=50 * 2**20, sram_bandwidth=9.4e12,
                  dram_bandwidth=3.35e12,
                  gpu={"sms": 132, "peak_flops": {"bf16": 989.4e12, "fp32": 66.9e12}, "calibration": calibration})


def test_cost_model_uses_the_correction_scalar_equals_vectorised(table):
    design = _h100("synth")
    model = CalibratedCost(table)
    curve = CalibratedCost(table, correction=False)
    ops = []
    # past the table's grid (more tokens, wider, deeper) near its edge, far from it, on it, and inside it
    for m, n, k in ((10000, 1100, 2048), (3000, 5000, 700), (512, 1200, 5000), (8, 64, 16), (1024, 1024, 2048),
                    (1024, 1100, 2048)):
        b = GraphBuilder("g", batch=1, dtype="bf16")
        x = b.input("x", c=k, h=m)
        b.linear("fc", x, n)
        ops.append(b.build().op("fc"))
    scalar = np.array([model.op_time(op, design) for op in ops])
    vector = CalibratedCost(table).op_times(ops, [design] * len(ops))
    assert np.array_equal(scalar, vector)
    f = model.fits_for("synth")[("gemm", "bf16")]
    for op, t in zip(ops, scalar):
        c = model.op_cost(op, design)
        if c.model in ("measured", "interpolated"):  # on the grid its median, inside it between medians
            continue
        m, k = op.dim("B") * op.dim("M"), op.dim("K")
        expected = float(predict(f, "gemm", m=m, n=op.dim("N"), k=k, nbytes=op.bytes_moved))
        assert t == expected and c.model == "fitted"
    assert [model.op_cost(op, design).model for op in ops][3:] == ["fitted", "measured", "interpolated"]
    # the tiny GEMM is far from every measured shape: curve time, exactly
    assert model.op_time(ops[3], design) == curve.op_time(ops[3], design)
    assert model.op_time(ops[0], design) != curve.op_time(ops[0], design)


def test_exact_search_finds_the_kd_trees_neighbours(table, monkeypatch):
    """A group small enough for the exact neighbour search gives the corrections the KD-tree
    gives (the same neighbours; distances equal to rounding), shapes beyond every neighbour's
    radius included; one shape alone gives the bits it gives in a batch."""
    import marssim.cost.residual as residual

    fit = fit_group(list(table.rows))
    corr = fit.correction
    assert corr is not None and len(corr.points) <= residual.EXACT_SEARCH_POINTS
    rng = np.random.default_rng(3)
    m, n, k = (np.exp(rng.uniform(np.log(256), np.log(4096), size=300)).astype(np.int64) for _ in range(3))
    m[:20] *= 5000  # far from every measured shape: no neighbour within the radius
    x = corr.features(np.ones(300, dtype=np.int64), m, n, k)
    exact = corr.log_factors(x)
    assert np.count_nonzero(exact == 0.0) >= 20 and np.count_nonzero(exact) > 100
    monkeypatch.setattr(residual, "EXACT_SEARCH_POINTS", 0)
    tree = corr.log_factors(x)
    assert np.allclose(exact, tree, rtol=1e-12, atol=1e-15)
    monkeypatch.undo()
    monkeypatch.setattr(residual, "EXACT_SEARCH_PAIRS", 7 * len(corr.points))  # blocks of 7 shapes
    assert np.array_equal(corr.log_factors(x), exact)
    assert all(corr.log_factors(x[i:i + 1])[0] == exact[i] for i in range(0, 300, 37))
