"""GPU roofline with efficiency curves: closed forms of wave quantisation, padding and K
saturation; roofline bound; monotonicity in SMs (peak scaled with them) and bandwidth."""

from __future__ import annotations

import numpy as np
import pytest

from marssim.cost import DEFAULT_EFFICIENCY, GpuRooflineCost
from marssim.system import Design
from marssim.workload import GraphBuilder

PEAK = 1000e12
BW = 3e12


def _gpu(sms=100, peak=PEAK, bw=BW, **gpu_kw) -> Design:
    gpu = {"sms": sms, "peak_flops": {"bf16": peak, "fp32": peak / 16}, "launch_overhead": 2e-6}
    gpu.update(gpu_kw)
    return Design(name="g", dataflow="gpu", clock=1.8e9, sram=50 * 2**20, sram_bandwidth=10e12,
                  dram_bandwidth=bw, gpu=gpu)


def _bmm(batch, m, n, k, dtype="bf16"):
    """``batch`` independent m x k @ k x n products (a matmul op: attention-like)."""
    b = GraphBuilder("a", batch=1, dtype=dtype)
    x = b.input("q", c=batch * k, h=m)
    y = b.input("k", c=batch * k, h=n)
    b.matmul("mm", x, y, heads=batch)
    return b.build().op("mm")


def _gemm(m, n, k, dtype="bf16"):
    b = GraphBuilder("g", batch=1, dtype=dtype)
    x = b.input("x", c=k, h=m)
    b.linear("fc", x, n, bias=False)
    return b.build().op("fc")


def test_wave_quantisation_doubles_time_past_a_full_wave():
    """Tiles = SMs is one wave, SMs + 1 tiles two: compute time exactly doubles (same tile work)."""
    d, model = _gpu(sms=100), GpuRooflineCost()
    one = model.op_cost(_bmm(100, 128, 128, 4096), d)
    two = model.op_cost(_bmm(101, 128, 128, 4096), d)
    assert two.compute_time == pytest.approx(2 * one.compute_time, rel=1e-12)
    # and it equals flops / (peak * peak_eff * K/(K+k_half)) for the full wave
    eff = DEFAULT_EFFICIENCY["attention"]
    expected = 2 * 100 * 128 * 128 * 4096 / (PEAK * eff.peak_eff * 4096 / (4096 + eff.k_half))
    assert one.compute_time == pytest.approx(expected, rel=1e-12)


def test_tile_padding_inside_one_wave_costs_nothing_more():
    """Within one wave, M = 129 (two 128-row tiles, the second nearly empty) takes as long as
    M = 256: each tile occupies an SM for the same time."""
    d, model = _gpu(sms=100), GpuRooflineCost()
    a = model.op_cost(_gemm(129, 128, 1024), d).compute_time
    b = model.op_cost(_gemm(256, 128, 1024), d).compute_time
    assert a == pytest.approx(b, rel=1e-12)
    # small matrices shrink the tile to the MMA grain (16 x 8): M = 16 pads nothing
    c = model.op_cost(_gemm(16, 128, 1024), d).compute_time
    e = model.op_cost(_gemm(9, 128, 1024), d).compute_time
    assert c == pytest.approx(e, rel=1e-12)


def test_k_saturation_closed_form():
    """Compute time is proportional to K + k_half at fixed M, N (K multiple of the K tile)."""
    d, model = _gpu(), GpuRooflineCost()
    kh = DEFAULT_EFFICIENCY["gemm"].k_half
    t64 = model.op_cost(_gemm(4096, 4096, 64), d).compute_time
    t512 = model.op_cost(_gemm(4096, 4096, 512), d).compute_time
    assert t512 / t64 == pytest.approx((512 + kh) / (64 + kh), rel=1e-12)


def test_streaming_kernel_is_traffic_over_bandwidth_plus_launch():
    b = GraphBuilder("e", batch=4)
    x = b.input("x", c=256, h=64, w=64)
    b.eltwise("relu", x, fn="relu")
    op = b.build().op("relu")
    cost = GpuRooflineCost().op_cost(op, _gpu())
    mem = op.bytes_moved / (BW * DEFAULT_EFFICIENCY["elementwise"].mem_eff)
    assert cost.time == pytest.approx(mem + 2e-6, rel=1e-12)
    assert cost.model == "gpu-roofline"


def test_dtype_peak_fallback():
    """fp16 falls back to the bf16 peak, so it times like bf16; fp32 uses its own (lower) peak."""
    d, model = _gpu(), GpuRooflineCost()
    assert model.op_time(_gemm(2048, 2048, 2048, "fp16"), d) == model.op_time(_gemm(2048, 2048, 2048, "bf16"), d)
    assert model.op_time(_gemm(2048, 2048, 2048, "fp32"), d) > model.op_time(_gemm(2048, 2048, 2048, "bf16"), d)


def _random_gemms(count, seed):
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(count):
        m, n, k = (int(v) for v in rng.integers(1, 5000, size=3))
        out.append(_gemm(m, n, k) if rng.random() < 0.5 else _bmm(int(rng.integers(1, 64)), m // 8 + 1, n // 8 + 1,
                                                                      k // 16 + 1))
    return out


def test_roofline_bound_and_monotonicity():
    model = GpuRooflineCost()
    for op in _random_gemms(150, seed=1):
        for sms in (16, 66, 132):
            d = _gpu(sms=sms, peak=PEAK * sms / 132)
            cost = model.op_cost(op, d)
            assert cost.time >= op.flops / d.gpu.peak_flops["bf16"] + 2e-6 * (1 - 1e-12)
            assert cost.time >= op.bytes_moved / BW
            assert 0 < cost.utilisation <= 1
            # twice the SMs and twice the peak: never slower
            assert model.op_time(op, _gpu(sms=2 * sms, peak=2 * PEAK * sms / 132)) <= cost.time
            assert model.op_time(op, _gpu(sms=sms, peak=PEAK * sms / 132, bw=2 * BW)) <= cost.time
