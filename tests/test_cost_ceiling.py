"""A fitted GPU curve must not extrapolate past what the GPU can do: its rate is bounded by the
design's dense peak, and a curve-timed GEMM-class kernel never runs faster than the best
throughput measured for its kind and dtype (large LLM GEMMs lie far outside the measured
shapes of the shipped H100 table)."""

from __future__ import annotations

import numpy as np
import pytest

from marssim.cost import default_cost_model
from marssim.cost.calibrated import GEMM_KINDS, fit, load_table
from marssim.cost.calibrated import calibration_dir
from marssim.cost.gpu import design_peaks
from marssim.system import load_system
from marssim.workload import OpKind, load_workload


@pytest.fixture(scope="module")
def h100():
    system = load_system("dgx-h100")
    return system.designs[system.accelerators[0].designs[0]]


def test_fitted_gemm_rates_are_within_the_dense_peak(h100) -> None:
    table = load_table(calibration_dir() / "H100.csv")
    peaks = design_peaks(h100)
    fits = fit(table, peaks=peaks)
    gemm = [f for f in fits.values() if f.kind in GEMM_KINDS]
    assert gemm
    for f in gemm:
        rows = [r for r in table.rows if (r.device, r.kind, r.dtype, r.tuning) == f.key]
        assert f.best_rate == pytest.approx(max(r.flops / r.median_s for r in rows))
        # the datasheet's peak bounds the rate, unless measured rows beat it: cuDNN runs fp32
        # convolutions as TF32 (72.8 TFLOP/s measured against the 66.9 of fp32)
        assert f.params.rate <= max(peaks[f.dtype], f.best_rate) * (1 + 1e-9), f.key
        if f.dtype in ("bf16", "fp16"):
            assert f.best_rate < peaks[f.dtype]


def test_large_llm_gemms_are_charged_no_faster_than_the_best_measured(h100) -> None:
    cost = default_cost_model()
    graph = load_workload("gpt3-175b:mode=train,seq=2048,batch=2,layers=1")
    table = load_table(calibration_dir() / "H100.csv")
    best = max(r.flops / r.median_s for r in table.rows if r.kind == "gemm" and r.dtype == "bf16"
               and r.tuning == "vendor")
    gemms = [op for op in graph.ops if op.kind == OpKind.GEMM]
    times = np.array([cost.op_time(op, h100) for op in gemms])
    flops = np.array([op.flops for op in gemms])
    assert np.all(flops / times <= best * (1 + 1e-9))
    # the vectorised path charges the same
    assert np.array_equal(cost.op_times(gemms, [h100] * len(gemms)), times)
    # and the biggest ones run at that ceiling: far past every measured shape
    assert (flops / times).max() == pytest.approx(best, rel=1e-9)
