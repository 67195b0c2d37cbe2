"""GPU-only checks of the measurement harness: CUDA-event timing with L2 flush gives sane
numbers, and a small measurement run writes a valid table that a rerun resumes. Skipped
without torch or a CUDA device (the reason says which)."""

from __future__ import annotations

import pytest

from marssim.calibrate.device import torch_cuda_status

HAVE_CUDA, WHY = torch_cuda_status()
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not HAVE_CUDA, reason=f"needs a CUDA device: {WHY}")]


def test_time_kernel_is_bounded_below_by_the_peak_and_repeats_enough():
    import torch

    from marssim.calibrate.grid import TimingPlan
    from marssim.calibrate.harness import time_kernel

    a = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
    flush = torch.empty(256 << 20, dtype=torch.int8, device="cuda")
    stats = time_kernel(lambda: a @ b, flush, TimingPlan())
    assert stats.samples >= 20 and stats.iqr >= 0
    assert stats.median >= 2 * 4096**3 / 2.5e15  # no GPU does dense bf16 faster than 2.5 PFLOP/s
    assert stats.median < 0.1


def test_flushing_l2_does_not_make_a_small_kernel_faster():
    import torch

    from marssim.calibrate.grid import TimingPlan
    from marssim.calibrate.harness import time_kernel

    x = torch.randn(4 << 20, device="cuda")  # 16 MiB: fits the L2 of an H100 when not flushed
    flush = torch.empty(256 << 20, dtype=torch.int8, device="cuda")
    tiny = torch.empty(1 << 10, dtype=torch.int8, device="cuda")
    cold = time_kernel(lambda: x * 2, flush, TimingPlan())
    warm = time_kernel(lambda: x * 2, tiny, TimingPlan())
    assert cold.median >= 0.9 * warm.median


def test_measure_writes_a_valid_table_and_resumes(tmp_path):
    from marssim.calibrate.grid import build_grid, estimate_seconds
    from marssim.calibrate.harness import MeasureOptions, Task, measure
    from marssim.calibrate.kernels import kernels_for
    from marssim.calibrate.table import parse_note
    from marssim.cost import load_table

    points = build_grid(("bert-base",), ("gemm", "elementwise", "norm"), ("fp16",), sweep=False)
    est = estimate_seconds(points, [1] * len(points))
    tasks = [Task(p, impl, est[i], i) for i, p in enumerate(points) for impl in kernels_for(p)]
    out = tmp_path / "table.csv"
    report = measure(tasks, MeasureOptions(out), progress=False)
    assert report.measured + len(report.skipped) == len(tasks) and report.measured > 0
    table = load_table(out)
    assert len(table) == report.measured
    name = report.device.name
    for r in table.rows:
        assert r.device == report.device.short and r.samples >= 20 and r.median_s > 0
        assert parse_note(r.note)["gpu"] == name
    again = measure(tasks, MeasureOptions(out), progress=False)
    assert again.measured == 0 and again.already == report.measured
