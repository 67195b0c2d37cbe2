"""The harness's measurement loop run on the CPU, with CUDA events replaced by a clock that
charges each launch a known time: repetitions and their summary, resuming, skipping kernels
that fail, fused-attention rows kept apart, and stopping before the time limit. Needs a CPU
torch (skipped without); the real CUDA path is in test_calibrate_gpu.py."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch", reason="the harness builds its kernels with torch (marssim[gpu])")

from marssim.calibrate import harness  # noqa: E402
from marssim.calibrate.grid import FUSED_ATTENTION, TimingPlan, build_grid  # noqa: E402
from marssim.calibrate.harness import DeviceInfo, MeasureOptions, Task, measure, time_kernel  # noqa: E402
from marssim.calibrate.kernels import KernelImpl, kernels_for  # noqa: E402
from marssim.calibrate.table import parse_note, read_comments  # noqa: E402
from marssim.cost import load_table  # noqa: E402

INFO = DeviceInfo("NVIDIA H100 80GB HBM3", "H100", 132, 50 << 20, 80 << 30, "9.0", "550.54.15", "12.4", "2.5.1",
                  "90100", "12.4.5.8", "3.1.0", "1980", "1980", "2619", "700.00")


class FakeClock:
    """Stand-in for the CUDA stream: each recorded event reads a clock that advances by
    ``per_launch`` seconds whenever a kernel runs (``tick`` is called from the kernel)."""

    def __init__(self, per_launch: float) -> None:
        self.now = 0.0
        self.per_launch = per_launch
        self.launches = 0

    def tick(self) -> None:
        self.now += self.per_launch
        self.launches += 1


@pytest.fixture
def fake_cuda(monkeypatch):
    clock = FakeClock(2e-5)

    class Event:
        def __init__(self, enable_timing: bool = False) -> None:
            self.t = None

        def record(self) -> None:
            self.t = clock.now

        def synchronize(self) -> None:
            pass

        def elapsed_time(self, end: "Event") -> float:
            return (end.t - self.t) * 1e3  # milliseconds, as CUDA events report

    monkeypatch.setattr(torch.cuda, "Event", Event)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: None)
    monkeypatch.setattr(torch.cuda, "_sleep", lambda cycles: None)
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda *a: None)
    monkeypatch.setattr(harness, "device_info", lambda index=0: INFO)
    monkeypatch.setattr(harness, "_sm_clock", lambda index: "1755")
    return clock


def _ticking(clock, tasks):
    """The same tasks with kernels that advance the fake clock on every launch."""
    out = []
    for t in tasks:
        impl = t.impl

        def builder(point, device, seed, impl=impl):
            built = impl.build(point, device, seed)
            fn = built.fn

            def run():
                clock.tick()
                return fn()

            built.fn = run
            return built

        out.append(Task(t.point, KernelImpl(impl.name, impl.measure_kind, impl.tuning, impl.dtypes, builder,
                                            backend=impl.backend), 0.01, t.seed))
    return out


def _tasks(kinds=("gemm", "elementwise"), workloads=("bert-base",)):
    points = build_grid(workloads, kinds, ("fp32",), sweep=False)
    return [Task(p, impl, 0.01, i) for i, p in enumerate(points) for impl in kernels_for(p, triton=False)]


def test_time_kernel_reports_the_median_of_at_least_20_repetitions(fake_cuda, monkeypatch):
    flush = torch.empty(1 << 10, dtype=torch.int8)
    plan = TimingPlan(warmup=2, min_reps=20, max_reps=50, target_s=1e-3)

    def kernel():
        fake_cuda.tick()

    holds = []
    monkeypatch.setattr(harness, "_hold_gpu", lambda s: holds.append((s, fake_cuda.launches)))
    stats = time_kernel(kernel, flush, plan)
    # 1 ms target / 20 us per launch = 50 repetitions; every one lasts exactly 20 us
    assert stats.samples == 50 and stats.median == pytest.approx(2e-5) and stats.iqr == pytest.approx(0, abs=1e-12)
    assert fake_cuda.launches == 2 + 3 + 50  # warm-up, the probe for the repetition count, the repetitions
    # the GPU is held once, after the warm-up and the probe, before the first repetition
    assert len(holds) == 1 and holds[0][1] == 2 + 3
    assert holds[0][0] >= 2 * 50 * harness.HOST_OVERHEAD_S


def test_the_hold_covers_the_host_enqueueing_every_repetition():
    # 100 repetitions of a kernel whose launch takes the host 200 us: 100 * (200 + 30) us * 2
    assert harness.hold_seconds(100, 200e-6) == pytest.approx(0.046)
    assert harness.hold_seconds(20, 0.0) == pytest.approx(1.2e-3)
    assert harness.hold_seconds(1, 0.0) == 1e-3 and harness.hold_seconds(100, 1.0) == harness.MAX_HOLD_S


def test_measure_writes_rows_resumes_and_keeps_fused_apart(fake_cuda, tmp_path):
    tasks = _ticking(fake_cuda, _tasks(("gemm", "elementwise", FUSED_ATTENTION)))
    out, fused = tmp_path / "H100.csv", tmp_path / "fused.csv"
    options = MeasureOptions(out, fused, TimingPlan(warmup=1, target_s=1e-4), device="cpu")
    report = measure(tasks, options, progress=False)
    assert report.measured == len(tasks) and not report.skipped and report.left == 0
    table, fused_table = load_table(out), load_table(fused)
    assert len(fused_table) == sum(t.point.fused for t in tasks) and len(table) + len(fused_table) == len(tasks)
    for r in table.rows + fused_table.rows:
        assert r.device == "H100" and r.samples == 20 and r.median_s == pytest.approx(2e-5)
        note = parse_note(r.note)
        assert note["sm_clock_mhz"] == "1755" and note["gpu"] == INFO.name and note["origin"].startswith("bert-base:")
    assert read_comments(out)[0].startswith("# Measured by `marssim calibrate measure` on ")
    again = measure(tasks, options, progress=False)
    assert (again.measured, again.already) == (0, len(tasks))
    without_fused = measure(tasks, MeasureOptions(out, None, device="cpu"), progress=False)
    assert len(without_fused.skipped) == sum(t.point.fused for t in tasks)


def test_a_failing_kernel_is_skipped_not_fatal(fake_cuda, tmp_path):
    tasks = _ticking(fake_cuda, _tasks(("elementwise",)))

    def broken(point, device, seed):
        raise RuntimeError("CUDNN_STATUS_NOT_SUPPORTED\nmore detail")

    bad = Task(tasks[0].point, KernelImpl("torch.broken", "elementwise", "vendor", ("fp32",), broken), 0.01, 0)
    report = measure([bad, *tasks[1:]], MeasureOptions(tmp_path / "t.csv", device="cpu",
                                                       plan=TimingPlan(warmup=1, target_s=1e-4)), progress=False)
    assert report.skipped == [(f"torch.broken {bad.point.describe()}", "RuntimeError: CUDNN_STATUS_NOT_SUPPORTED")]
    assert report.measured == len(tasks) - 1


def test_measure_stops_before_the_time_limit(fake_cuda, tmp_path):
    tasks = _ticking(fake_cuda, _tasks(("elementwise",)))
    slow = [Task(t.point, t.impl, 100.0 if i >= 3 else 0.001, t.seed) for i, t in enumerate(tasks)]
    report = measure(slow, MeasureOptions(tmp_path / "t.csv", max_seconds=60.0, device="cpu",
                                          plan=TimingPlan(warmup=1, target_s=1e-4)), progress=False)
    assert report.measured == 3 and report.left == len(tasks) - 3
    assert len(load_table(tmp_path / "t.csv")) == 3


def test_llm_rows_carry_phase_and_backend_and_resume_per_backend(fake_cuda, tmp_path):
    """Fused attention of one shape measured with two backends: two rows (the backend column
    tells them apart), both skipped by a rerun; gradient GEMMs are rows of their phase."""
    from marssim.calibrate.llm import LlmGridOptions, llm_grid

    options = LlmGridOptions(models=("llama:hidden=128,heads=4,kv_heads=2,ffn=256,vocab=301",), tp=(1,),
                             micro_batches=(1,), seq=32, prefill=False, decode_contexts=(), backends=("flash", "math"))
    points = [p for p in llm_grid(options, ("gemm", "sdpa")) if p.phase != "fwd" or p.kind == "attention"]
    tasks = _ticking(fake_cuda, [Task(p, impl, 0.01, i) for i, p in enumerate(points)
                                 for impl in kernels_for(p, triton=False)])
    out = tmp_path / "H100.csv"
    options_ = MeasureOptions(out, None, TimingPlan(warmup=1, target_s=1e-4), device="cpu")
    report = measure(tasks, options_, progress=False)
    assert report.measured == len(tasks) and not report.skipped
    rows = load_table(out).rows
    assert {(r.kind, r.phase, r.backend) for r in rows} == {("gemm", "dgrad", ""), ("gemm", "wgrad", ""),
                                                          ("attention", "fwd", "flash"), ("attention", "fwd", "math"),
                                                          ("attention", "bwd", "flash"), ("attention", "bwd", "math")}
    fused = [r for r in rows if r.kind == "attention"]
    assert len({(r.batch, r.m, r.n, r.k, r.phase) for r in fused}) == len(fused) // 2  # each shape twice
    again = measure(tasks, options_, progress=False)
    assert (again.measured, again.already) == (0, len(tasks))
