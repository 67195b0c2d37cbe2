"""Kernel registry (launch plans and numpy references), output comparison, timing summaries
and calibration rows: everything of the GPU path that runs without a GPU."""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np
import pytest

from marssim.calibrate.sip.calibration import CalibrationRow, gemm_class_shape, merge_rows, read_rows
from marssim.calibrate.sip.cubin import read_cubin
from marssim.calibrate.sip.gpu import outputs_match, summarize
from marssim.calibrate.sip.kernels import KERNELS, get_kernel, parse_shape
from marssim.errors import InputError
from marssim.cost.calibrated import OPTIONAL_COLUMNS

DATA = Path(__file__).parent / "data" / "sip"


def test_plans_match_the_compiled_parameter_layout():
    """The launch plan's runtime arguments have the sizes the cubin's KPARAM_INFO declares."""
    sizes = {"*fp16": 8, "i32": 4, "fp32": 4}
    for name, cubin in (("gemm_leaky_relu", "gemm_leaky_relu.sm_90a.cubin"), ("attention_fwd", "attention_fwd.sm_90a.cubin")):
        spec = KERNELS[name]
        plan = spec.plan(spec.default_shape if name == "gemm_leaky_relu" else {"Z": 1, "H": 2, "N_CTX": 128,
                                                                               "HEAD_DIM": 64}, np.random.default_rng(0))
        declared = [s for _, _, s in read_cubin(DATA / cubin).kernel().param_sizes()]
        assert [sizes[t] for t in plan.arg_types] == declared[:len(plan.args)]
        assert declared[len(plan.args):] == [8, 8]  # Triton's hidden scratch pointers
        assert plan.block[0] == 32 * spec.num_warps


def test_gemm_plan_and_reference():
    spec = get_kernel("gemm_leaky_relu")
    plan = spec.plan({"M": 64, "N": 128, "K": 64}, np.random.default_rng(1))
    assert plan.grid == (1 * 2, 1, 1) and plan.flops == 2 * 64 * 128 * 64
    a, b = plan.args[0], plan.args[1]
    out = spec.reference(plan)["c_ptr"]
    # an element computed by hand with the definition of LeakyReLU
    i, j = 5, 77
    acc = float(np.dot(a[i].astype(np.float64), b[:, j].astype(np.float64)))
    want = acc if acc >= 0 else 0.01 * acc
    assert out.dtype == np.float16 and abs(float(out[i, j]) - want) <= 1e-3 * max(1.0, abs(want))
    assert (get_kernel("gemm").reference(plan)["c_ptr"] < 0).any()  # no activation there


def test_attention_reference_against_a_direct_loop():
    spec = get_kernel("attention_fwd")
    shape = {"Z": 1, "H": 2, "N_CTX": 128, "HEAD_DIM": 16}
    plan = spec.plan(shape, np.random.default_rng(2))
    q, k, v = (plan.args[i].astype(np.float64) for i in range(3))
    out = spec.reference(plan)["o_ptr"]
    z, h, m = 0, 1, 17
    scores = [float(q[z, h, m] @ k[z, h, n]) / np.sqrt(16) for n in range(128)]
    w = np.exp(np.array(scores) - max(scores))
    want = (w / w.sum()) @ v[z, h]
    assert np.allclose(out[z, h, m].astype(np.float64), want, atol=2e-3)
    assert plan.grid == (1, 2, 1) and plan.block == (256, 1, 1)


def test_parse_shape():
    spec = get_kernel("gemm_leaky_relu")
    assert parse_shape(spec, None) == {"M": 512, "N": 512, "K": 2048}
    assert parse_shape(spec, "K=4096") == {"M": 512, "N": 512, "K": 4096}
    for bad in ("M=0", "M=abc", "M", "X=64"):
        with pytest.raises(InputError):
            parse_shape(spec, bad)


def test_outputs_match_is_bitwise_by_default():
    a = {"o": np.array([1.0, np.nan, -0.0], dtype=np.float16)}
    assert outputs_match(a, {"o": a["o"].copy()}) == (True, 0)
    b = {"o": np.array([1.0, np.nan, 0.0], dtype=np.float16)}  # -0.0 vs 0.0 differ in bits
    assert outputs_match(a, b) == (False, 1)
    assert outputs_match(a, b, rtol=1e-3) == (True, 0)
    c = {"o": np.array([1.001, np.nan, 0.0], dtype=np.float16)}
    assert outputs_match(a, c, rtol=1e-6)[1] == 1


def test_summarize_timings():
    s = summarize([1.0, 2.0, 3.0, 4.0, 100.0])
    assert (s.median, s.minimum, s.maximum, s.samples) == (3.0, 1.0, 100.0, 5)
    assert s.iqr == pytest.approx(4.0 - 2.0) and s.spread == pytest.approx(2.0 / 3.0)


#: the calibrated cost model's required columns (marssim.cost.calibrated.REQUIRED_COLUMNS, written
#: out here so that this test fails if the writer drifts from that format)
COST_TABLE_COLUMNS = ("kind", "dtype", "batch", "m", "n", "k", "flops", "bytes", "device", "sms", "driver", "cuda",
                      "tuning", "median_s", "spread_s", "samples", "date")


def test_gemm_class_shapes():
    g = gemm_class_shape("gemm_leaky_relu", {"M": 512, "N": 512, "K": 2048})
    assert (g["kind"], g["batch"], g["m"], g["n"], g["k"]) == ("gemm", 1, 512, 512, 2048)
    assert g["flops"] == 2 * 512 * 512 * 2048 and g["bytes"] == 2 * (512 * 2048 * 2 + 512 * 512)
    a = gemm_class_shape("attention_fwd", {"Z": 4, "H": 48, "N_CTX": 4096, "HEAD_DIM": 64})
    plan_flops = 4.0 * 4 * 48 * 4096 * 4096 * 64  # QK^T and PV
    assert a["flops"] == plan_flops == 2 * a["batch"] * a["m"] * a["n"] * a["k"]


def test_calibration_rows_merge_and_replace(tmp_path):
    path = tmp_path / "traces" / "calibration" / "sip.csv"
    common = dict(dtype="fp16", device="NVIDIA H100 80GB HBM3", sms=132, driver="550.54.15", cuda="12.4",
                  spread_s=2e-7, samples=200, date="2026-01-01", kernel="gemm_leaky_relu",
                  **gemm_class_shape("gemm_leaky_relu", {"M": 512, "N": 512, "K": 2048}))
    merge_rows(path, [CalibrationRow(tuning="none", median_s=2.7e-5, **common),
                      CalibrationRow(tuning="sip", median_s=2.5e-5, note="schedule a.json", **common)])
    merge_rows(path, [CalibrationRow(tuning="sip", median_s=2.4e-5, note="schedule b.json", **common)])
    rows = read_rows(path)
    assert [(r.tuning, r.median_s, r.note) for r in rows] == [("none", 2.7e-5, ""), ("sip", 2.4e-5, "schedule b.json")]
    lines = path.read_text().splitlines()
    assert lines[0].startswith("#")
    header = next(csv.reader([lines[1]]))
    assert set(COST_TABLE_COLUMNS) <= set(header) and set(header) - set(COST_TABLE_COLUMNS) <= set(OPTIONAL_COLUMNS)
    data = next(csv.DictReader(lines[1:]))
    assert float(data["flops"]) == 2 * int(data["batch"]) * int(data["m"]) * int(data["n"]) * int(data["k"])


def test_launch_parameters_follow_the_cubin_layout():
    """GpuSession._params on the CPU (no driver call): one value per KPARAM entry, device
    pointers for arrays, scalars by value, null for Triton's hidden scratch pointers."""
    import ctypes

    from marssim.calibrate.sip.gpu import GpuSession, LoadedKernel

    spec = KERNELS["attention_fwd"]
    plan = spec.plan({"Z": 1, "H": 2, "N_CTX": 128, "HEAD_DIM": 64}, np.random.default_rng(0))
    session = GpuSession.__new__(GpuSession)  # no CUDA context: only the parameter packing is used
    session.buffers = {n: (0x1000 * (i + 1), v) for i, (n, v) in enumerate(zip(plan.arg_names, plan.args))
                       if isinstance(v, np.ndarray)}
    sizes = tuple(s for _, _, s in read_cubin(DATA / "attention_fwd.sm_90a.cubin").kernel().param_sizes())
    holders = session._params(LoadedKernel(None, None, "attention_fwd_kernel", sizes, 65536), plan)
    assert [ctypes.sizeof(h) for h in holders] == list(sizes)
    assert [h.value for h in holders[:4]] == [0x1000, 0x2000, 0x3000, 0x4000]
    assert holders[4].value == pytest.approx(1 / 8)  # sm_scale = 1/sqrt(64), fp32
    assert holders[plan.arg_names.index("N_CTX")].value == 128
    assert [h.value for h in holders[len(plan.args):]] == [0, 0]
