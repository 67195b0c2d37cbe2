"""Time kernels on a CUDA device and write them as calibration-table rows.

Per kernel (:func:`time_kernel`): ``warmup`` untimed runs; a rough per-run time from a few
more decides the repetitions (``TimingPlan.reps``: at least 20); then each repetition writes a
buffer larger than the L2 cache (twice its size, at least 256 MiB) so the kernel starts with
a cold L2, and a pair of CUDA events brackets the kernel alone. Before the repetitions are
enqueued the GPU is kept busy by a spinning kernel long enough for the host to enqueue them all
(:func:`hold_seconds`), so that host-side launch work never shows in a kernel's time. The row records the median of
the repetitions and their inter-quartile range. Inputs are random (never zeros) with a seed
per point; the output's shape is checked against the op's and its values must be finite.

Every row records the shape as the grid gives it (for a convolution also its geometry, the
``conv_*`` columns, which the grid knows from the layer), the device's short name (the table's
file name, what ``gpu.calibration`` matches), its SM count, the NVIDIA driver, the CUDA runtime and, in ``note``, the full GPU
name, the SM clock read after timing (``torch.cuda.clock_rate`` where NVML is available, else
``nvidia-smi`` at the start), the memory clock, the power limit, the torch, cuBLAS, cuDNN and
Triton versions, and where the shape came from. The file also gets one comment line per run.

Progress: a tqdm bar per kernel with an ETA from the grid's time estimates scaled by the
actual pace. ``max_seconds`` stops before a kernel that would not finish in time; rows measured
so far are merged into the table every ``flush_every_s`` and at the end, so a run cut short
keeps its rows, and a rerun skips kernels already in the table (``resume``).
"""

from __future__ import annotations

import datetime as _dt
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .grid import GridPoint, TimingPlan
from .kernels import KernelImpl
from .stats import TimingStats, summarize
from .table import CalibrationRow, format_note, merge_rows, read_rows, short_device_name
from .tensors import tf32_allowed

__all__ = ["DeviceInfo", "device_info", "time_kernel", "MeasureOptions", "MeasureReport", "measure", "Task"]


@dataclass(frozen=True)
class DeviceInfo:
    """The GPU and software a table was measured with (clocks in MHz, power in W, as text)."""

    name: str
    short: str
    sms: int
    l2_bytes: int
    memory_bytes: int
    capability: str
    driver: str
    cuda: str
    torch: str
    cudnn: str
    cublas: str
    triton: str
    sm_clock_mhz: str
    max_sm_clock_mhz: str
    mem_clock_mhz: str
    power_limit_w: str

    def note_fields(self) -> dict[str, str]:
        return {"gpu": self.name.replace(";", ","), "cc": self.capability, "sm_clock_mhz": self.sm_clock_mhz,
                "max_sm_clock_mhz": self.max_sm_clock_mhz, "mem_clock_mhz": self.mem_clock_mhz,
                "power_limit_w": self.power_limit_w, "torch": self.torch, "cublas": self.cublas,
                "cudnn": self.cudnn, "triton": self.triton}

    def comment(self, date: str, plan: TimingPlan, flush_bytes: int) -> str:
        """The table's provenance line for one run."""
        return (f"# Measured by `marssim calibrate measure` on {date}: {self.name} ({self.sms} SMs, "
                f"cc {self.capability}, SM clock {self.sm_clock_mhz or '?'} of max {self.max_sm_clock_mhz or '?'} "
                f"MHz, memory clock {self.mem_clock_mhz or '?'} MHz, power limit {self.power_limit_w or '?'} W), "
                f"driver {self.driver or '?'}, CUDA {self.cuda}, torch {self.torch}, cuBLAS {self.cublas or '?'}, "
                f"cuDNN {self.cudnn or '?'}, Triton {self.triton or '-'}; {plan.warmup} warm-up runs, "
                f">= {plan.min_reps} timed repetitions each after writing {flush_bytes >> 20} MiB to flush L2; "
                f"median and IQR of CUDA-event times")


def device_info(index: int = 0) -> DeviceInfo:
    """What :class:`DeviceInfo` holds, for CUDA device ``index`` (needs torch and a GPU)."""
    import torch

    from .device import library_versions, nvidia_smi

    props = torch.cuda.get_device_properties(index)
    smi = nvidia_smi(["driver_version", "clocks.sm", "clocks.max.sm", "clocks.mem", "power.limit"], index)
    libs = library_versions()
    l2 = int(getattr(props, "L2_cache_size", 0) or 0)
    return DeviceInfo(props.name, short_device_name(props.name), int(props.multi_processor_count), l2,
                      int(props.total_memory), f"{props.major}.{props.minor}", smi["driver_version"], libs["cuda"],
                      libs["torch"], libs["cudnn"], libs["cublas"], libs["triton"], smi["clocks.sm"],
                      smi["clocks.max.sm"], smi["clocks.mem"], smi["power.limit"])


def _sm_clock(index: int) -> str:
    """The SM clock now (MHz) via NVML, "" when NVML is not available."""
    try:
        import torch

        return str(int(torch.cuda.clock_rate(index)))
    except Exception:  # noqa: BLE001 - pynvml missing or unsupported
        return ""


#: host seconds to enqueue one repetition's L2 flush and two event records, on top of the kernel's
#: own launch (a generous bound: these take a few microseconds each)
HOST_OVERHEAD_S = 30e-6
#: longest hold before the repetitions, seconds
MAX_HOLD_S = 1.0


def hold_seconds(reps: int, host_per_call_s: float) -> float:
    """Seconds the GPU is kept busy before ``reps`` repetitions are enqueued: twice the host time
    to enqueue them (``host_per_call_s`` per kernel launch plus :data:`HOST_OVERHEAD_S`), at least
    1 ms, at most :data:`MAX_HOLD_S`."""
    return min(MAX_HOLD_S, max(1e-3, 2.0 * reps * (host_per_call_s + HOST_OVERHEAD_S)))


def _hold_gpu(seconds: float) -> None:
    """Enqueue a kernel that spins for about ``seconds`` (counted at 2 GHz, an upper bound on the
    SM clocks of the GPUs calibrated), so that the host enqueues the repetitions behind it and
    no start event waits for the host to launch its kernel: otherwise a launch that takes the
    host longer than the L2 flush before it (cuDNN convolutions, small kernels) is timed too.
    Spinning also brings the SM clock up from idle before the first repetition."""
    import torch

    sleep = getattr(torch.cuda, "_sleep", None)
    if sleep is not None:
        sleep(int(seconds * 2e9))


def time_kernel(fn: Callable[[], Any], flush: Any, plan: TimingPlan = TimingPlan()) -> TimingStats:
    """Seconds per run of ``fn`` on the current CUDA stream (see the module docstring):
    ``flush`` is a device buffer larger than L2, written before each timed repetition."""
    import torch

    for _ in range(plan.warmup):
        fn()
    torch.cuda.synchronize()
    probe_start, probe_end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    host_start = time.perf_counter()
    probe_start.record()
    for _ in range(3):
        fn()
    probe_end.record()
    host_per_call = (time.perf_counter() - host_start) / 3
    probe_end.synchronize()
    reps = plan.reps(probe_start.elapsed_time(probe_end) * 1e-3 / 3)
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    _hold_gpu(hold_seconds(reps, host_per_call))
    for i in range(reps):
        flush.zero_()
        starts[i].record()
        fn()
        ends[i].record()
    torch.cuda.synchronize()
    return summarize([s.elapsed_time(e) * 1e-3 for s, e in zip(starts, ends)])


@dataclass(frozen=True)
class Task:
    """One kernel of one grid point, with the harness seconds the grid estimates for it."""

    point: GridPoint
    impl: KernelImpl
    estimate_s: float
    seed: int


@dataclass(frozen=True)
class MeasureOptions:
    """Where rows go and how hard to try: ``out`` (the table), ``fused_out`` (fused-attention
    rows: not per-op calibration, kept apart), ``plan``, ``max_seconds`` (stop before a kernel
    that would end later), ``resume`` (skip kernels whose row is already in the table),
    ``flush_every_s`` (merge rows into the table this often), ``device`` (the torch device the
    tensors live on: ``cuda`` unless a test runs the loop on the CPU with stand-in events)."""

    out: Path
    fused_out: Path | None = None
    plan: TimingPlan = TimingPlan()
    max_seconds: float = 540.0
    resume: bool = True
    flush_every_s: float = 15.0
    device_index: int = 0
    device: str = "cuda"


@dataclass
class MeasureReport:
    """What a run did: rows written per file, kernels skipped (with why), kernels left for a
    later run, seconds spent, the device."""

    device: DeviceInfo | None = None
    written: dict[str, int] = field(default_factory=dict)
    measured: int = 0
    already: int = 0
    skipped: list[tuple[str, str]] = field(default_factory=list)
    left: int = 0
    seconds: float = 0.0


def _row(task: Task, info: DeviceInfo, stats: TimingStats, kernel: str, note: dict[str, str], sm_clock: str,
         date: str, backend: str = "") -> CalibrationRow:
    p = task.point
    fields_ = info.note_fields()
    if sm_clock:
        fields_["sm_clock_mhz"] = sm_clock
    fields_.update(note)
    fields_["origin"] = p.origin.replace(";", ",")
    return CalibrationRow(kind=p.kind, dtype=p.dtype, batch=p.batch, m=p.m, n=p.n, k=p.k, flops=float(p.flops),
                          bytes=float(p.bytes), device=info.short, sms=info.sms, driver=info.driver or "unknown",
                          cuda=info.cuda or "unknown", tuning=task.impl.tuning, median_s=stats.median,
                          spread_s=stats.iqr, samples=stats.samples, date=date, kernel=kernel,
                          note=format_note(fields_), phase=p.phase, backend=backend, conv=p.conv)


def _done_keys(path: Path | None, device: str) -> set[tuple]:
    """Shapes (with convolution geometry, phase, tuning and backend) the table already holds for
    ``device``. Kernel families of one measure kind differ in their tuning or backend (checked
    by the tests), so the two name the family."""
    if path is None or not path.exists():
        return set()
    return {(r.kind, r.dtype, r.batch, r.m, r.n, r.k, round(r.flops), round(r.bytes),
             r.conv.match_key if r.conv is not None else (), r.phase, r.tuning, r.backend)
            for r in read_rows(path) if r.device == device}


def _task_key(task: Task) -> tuple:
    p = task.point
    return (p.kind, p.dtype, p.batch, p.m, p.n, p.k, p.flops, p.bytes, p.conv.match_key if p.conv is not None else (),
            p.phase, task.impl.tuning, task.impl.backend)


def measure(tasks: Sequence[Task], options: MeasureOptions, *, progress: bool = True) -> MeasureReport:
    """Time every task on CUDA device ``options.device_index`` and merge the rows into
    ``options.out`` (fused attention into ``options.fused_out``). Needs torch and a GPU."""
    import torch
    from tqdm import tqdm

    started = time.monotonic()
    if options.device == "cuda":
        torch.cuda.set_device(options.device_index)
    info = device_info(options.device_index)
    report = MeasureReport(device=info)
    date = _dt.datetime.now(_dt.timezone.utc).date().isoformat()
    flush_bytes = max(options.plan.flush_bytes, 2 * info.l2_bytes)
    comment = info.comment(date, options.plan, flush_bytes)
    torch.backends.cudnn.benchmark = False  # cuDNN's heuristic choice, the same on every run
    flush = torch.empty(flush_bytes, dtype=torch.int8, device=options.device)

    outputs = {False: options.out, True: options.fused_out}
    done = {fused: _done_keys(path, info.short) if options.resume else set() for fused, path in outputs.items()}
    pending: dict[bool, list[CalibrationRow]] = {False: [], True: []}

    def write() -> None:
        for fused, rows in pending.items():
            path = outputs[fused]
            if rows and path is not None:
                merge_rows(path, rows, comment)
                report.written[str(path)] = report.written.get(str(path), 0) + len(rows)
                rows.clear()

    todo = []
    for t in tasks:
        if t.point.fused and options.fused_out is None:
            report.skipped.append((f"{t.impl.name} {t.point.describe()}", "no --fused-out table given"))
        elif _task_key(t) in done[t.point.fused]:
            report.already += 1
        else:
            todo.append(t)
    total_est = sum(t.estimate_s for t in todo)
    bar = tqdm(total=max(total_est, 1e-9), unit="s", file=sys.stderr, disable=not progress, dynamic_ncols=True,
               bar_format="{desc}: {percentage:3.0f}%|{bar}| [{elapsed}<{remaining}]")
    last_flush = loop_start = time.monotonic()
    sm_clock_start = info.sm_clock_mhz
    try:
        for i, task in enumerate(todo):
            now = time.monotonic()
            elapsed = now - started
            pace = (now - loop_start) / bar.n if bar.n > 0 else 1.0  # actual seconds per estimated second
            if elapsed + task.estimate_s * max(pace, 1.0) * 1.5 > options.max_seconds:
                report.left = len(todo) - i
                break
            bar.set_description_str(f"{i + 1}/{len(todo)} {task.impl.name} {task.point.describe()}"[:100])
            p = task.point
            torch.backends.cuda.matmul.allow_tf32 = tf32_allowed(p.dtype)
            torch.backends.cudnn.allow_tf32 = tf32_allowed(p.dtype)
            try:
                built = task.impl.build(p, options.device, task.seed)
                out = built.fn()
                if tuple(out.shape) != tuple(built.expected):
                    raise ValueError(f"output shape {tuple(out.shape)}, the op says {tuple(built.expected)}")
                stats = time_kernel(built.fn, flush, options.plan)
                out = built.fn()
                if out.is_floating_point() and not bool(torch.isfinite(out).all()):
                    raise ValueError("non-finite output values")
                clock = _sm_clock(options.device_index) or sm_clock_start
                pending[p.fused].append(_row(task, info, stats, built.kernel, built.note, clock, date,
                                             built.backend or task.impl.backend))
                report.measured += 1
            except torch.cuda.OutOfMemoryError:
                built = out = None
                torch.cuda.empty_cache()
                report.skipped.append((f"{task.impl.name} {p.describe()}", "out of GPU memory"))
            except Exception as err:  # noqa: BLE001 - a library refusing one shape must not end the run
                first = (str(err).splitlines() or [""])[0][:200]
                report.skipped.append((f"{task.impl.name} {p.describe()}", f"{type(err).__name__}: {first}"))
            built = out = None  # release the point's tensors
            bar.update(task.estimate_s)
            if i % 64 == 63:
                torch.cuda.empty_cache()
            if time.monotonic() - last_flush > options.flush_every_s:
                write()
                last_flush = time.monotonic()
    finally:
        bar.close()
        write()
        report.seconds = time.monotonic() - started
    return report
