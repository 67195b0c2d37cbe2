"""What a parallel run reports: iteration time, achieved TFLOP/s and MFU per GPU, the pipeline
bubble, communication exposed per kind, memory peak per GPU, and for serving the time to first
token and per output token.

Where a GPU's compute stream is idle, the idle time is charged to what the GPU was waiting for,
walking back the chain of latest-ending predecessors from the kernel that ends the gap: time
spent in a transfer of the tensor-parallel, data-parallel, pipeline or expert-parallel group is
that group's *exposed* communication; time spent waiting for another GPU's compute (a previous
stage's forward, a next stage's backward) and the idle time before a GPU's first and after its
last kernel are the *bubble*. Per GPU: busy + exposed communication + bubble = iteration time
(tested). Model FLOPs (for MFU) are forward and backward without recomputation
(Narayanan et al. 2021, appendix; Chowdhery et al. 2022): the workload's
:attr:`~marssim.workload.llm.Footprint.model_flops` per micro-batch, times micro-batches and
data-parallel replicas.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from marssim.system import System
from marssim.taskgraph import COMPUTE, TaskGraph

__all__ = ["ParallelReport", "parallel_report", "report_of", "CATEGORIES"]

CATEGORIES = ("tp", "sp", "pp", "dp", "ep", "emb", "bubble")


@dataclass(frozen=True)
class ParallelReport:
    """Per-run figures; times in seconds, rates in FLOP/s, bytes. Averages are over every GPU
    (each representative GPU weighted by the GPUs it stands for)."""

    iteration_s: float
    gpus: int
    model_flops: float
    peak_flops: float  # per GPU, the model's data type
    busy_s: float
    exposed_s: dict[str, float]
    memory_peak: dict[str, float]  # per representative GPU, bytes
    memory_capacity: float
    ttft_s: float | None = None
    tpot_s: float | None = None
    per_gpu: dict[str, dict[str, float]] = field(default_factory=dict)

    @property
    def tflops_per_gpu(self) -> float:
        """Achieved model FLOP/s per GPU, in TFLOP/s."""
        return self.model_flops / self.gpus / self.iteration_s / 1e12 if self.iteration_s > 0 else 0.0

    @property
    def mfu(self) -> float:
        """Model FLOPs utilisation: achieved model FLOP/s over the peak."""
        return self.tflops_per_gpu * 1e12 / self.peak_flops if self.peak_flops else 0.0

    @property
    def bubble_share(self) -> float:
        return self.exposed_s.get("bubble", 0.0) / self.iteration_s if self.iteration_s > 0 else 0.0

    def lines(self) -> list[str]:
        """Readable lines for the CLI."""
        out = [f"iteration          {self.iteration_s * 1e3:.3f} ms on {self.gpus} GPUs",
               f"model FLOP/s       {self.tflops_per_gpu:.1f} TFLOP/s per GPU, MFU {self.mfu:.1%} "
               f"(model FLOPs {self.model_flops:.4g} per iteration, peak {self.peak_flops / 1e12:.1f} TFLOP/s)",
               f"compute busy       {self.busy_s * 1e3:.3f} ms per GPU ({self.busy_s / self.iteration_s:.1%})"
               if self.iteration_s else "compute busy       -",
               f"pipeline bubble    {self.exposed_s.get('bubble', 0.0) * 1e3:.3f} ms ({self.bubble_share:.1%})"]
        exposed = ", ".join(f"{k.upper()} {v * 1e3:.3f} ms" for k, v in self.exposed_s.items() if k != "bubble" and v > 0)
        out.append(f"exposed comm.      {exposed or 'none'}")
        if self.memory_peak:
            worst = max(self.memory_peak, key=self.memory_peak.get)
            out.append(f"memory peak        {self.memory_peak[worst] / 2**30:.2f} GiB on {worst} "
                       f"(capacity {self.memory_capacity / 2**30:.0f} GiB)")
        if self.ttft_s is not None:
            out.append(f"time to first token   {self.ttft_s * 1e3:.3f} ms")
        if self.tpot_s is not None:
            out.append(f"time per output token {self.tpot_s * 1e3:.3f} ms")
        return out

    def to_dict(self) -> dict:
        return {"iteration_s": self.iteration_s, "gpus": self.gpus, "model_flops": self.model_flops,
                "tflops_per_gpu": self.tflops_per_gpu, "mfu": self.mfu, "busy_s": self.busy_s,
                "bubble_share": self.bubble_share, "exposed_s": dict(self.exposed_s),
                "memory_peak_bytes": dict(self.memory_peak), "memory_capacity_bytes": self.memory_capacity,
                "ttft_s": self.ttft_s, "tpot_s": self.tpot_s, "per_gpu": self.per_gpu}


def _category(tg: TaskGraph, t: int, device: int) -> str:
    if tg.kind[t] == COMPUTE:
        return "bubble"
    c = tg.collective[t]
    group = tg.collectives[c].group if c >= 0 else ""
    return group or "pp"


def _attribute(tg: TaskGraph, start: np.ndarray, end: np.ndarray, device: int, makespan: float) -> dict[str, float]:
    """Seconds device ``device``'s compute stream is idle, by what it waits for."""
    out = dict.fromkeys(CATEGORIES, 0.0)
    comp = np.flatnonzero((tg.kind == COMPUTE) & (tg.device == device))
    if not len(comp):
        out["bubble"] = makespan
        return out
    comp = comp[np.lexsort((comp, start[comp]))]
    pp, pi = tg.pred_ptr, tg.pred_idx
    gaps_end = start[comp]
    gaps_start = np.concatenate([[0.0], end[comp[:-1]]])
    for k in np.flatnonzero(gaps_end - gaps_start > 1e-15):
        t = int(comp[k])
        lo = float(gaps_start[k])
        cursor = float(gaps_end[k])
        prev = int(comp[k - 1]) if k else -1
        node = t
        guard = 0
        while cursor > lo + 1e-15 and guard < 10_000:
            guard += 1
            preds = [int(p) for p in pi[pp[node]:pp[node + 1]] if int(p) != prev]
            if not preds:
                out["bubble"] += cursor - lo
                break
            p = max(preds, key=lambda q: (end[q], -q))
            if end[p] < cursor - 1e-15:  # the last predecessor ended before: nothing to wait for in between
                out["bubble"] += cursor - max(lo, float(end[p]))
                cursor = max(lo, float(end[p]))
                if cursor <= lo + 1e-15:
                    break
            if tg.kind[p] == COMPUTE:  # another GPU's kernel: from here back, the wait is the pipeline's
                out["bubble"] += cursor - lo
                break
            seg_start = max(lo, float(start[p]))
            out[_category(tg, p, device)] += cursor - seg_start
            cursor = seg_start
            node = p
            prev = -1
    out["bubble"] += max(0.0, makespan - float(end[comp[-1]]))
    return out


def parallel_report(tg: TaskGraph, system, start: np.ndarray, end: np.ndarray, memory_peak: dict[str, float]
                    ) -> ParallelReport:
    """The :class:`ParallelReport` of a schedule (``start``/``end`` per task, seconds, from a
    simulation or an estimate) of a TaskGraph lowered from a parallel configuration."""
    meta = tg.meta
    makespan = float(np.nanmax(end)) if len(end) else 0.0
    fold = meta.get("fold", {})
    weight: dict[str, int] = {}
    for gpu, rep in fold.items():
        weight[rep] = weight.get(rep, 0) + 1
    gpus = len(fold) or 1
    busy_total = 0.0
    exposed = dict.fromkeys(CATEGORIES, 0.0)
    per_gpu: dict[str, dict[str, float]] = {}
    names = tg.node_names
    index = {n: i for i, n in enumerate(names)}
    durations = end - start
    for rep, w in sorted(weight.items()):
        d = index[rep]
        mask = (tg.kind == COMPUTE) & (tg.device == d)
        busy = float(durations[mask].sum())
        waits = _attribute(tg, start, end, d, makespan)
        per_gpu[rep] = {"busy_s": busy, **{f"{k}_s": v for k, v in waits.items()}, "gpus": w}
        busy_total += busy * w
        for k, v in waits.items():
            exposed[k] += v * w
    exposed = {k: v / gpus for k, v in exposed.items()}
    ttft = tpot = None
    ops = tg.op_names
    sample_ends = {}
    comp = tg.kind == COMPUTE
    for name in ("prefill.sample",):
        if name in ops:
            i = ops.index(name)
            sample_ends[0] = float(end[comp & (tg.op == i)].max())
    steps = sorted(int(n.split(".")[1]) for n in ops if n.startswith("decode.") and n.endswith(".sample"))
    for step in steps:
        i = ops.index(f"decode.{step}.sample")
        sample_ends[step] = float(end[comp & (tg.op == i)].max())
    if 0 in sample_ends:
        ttft = sample_ends[0]
        if steps:
            tpot = (sample_ends[steps[-1]] - sample_ends[0]) / len(steps)
    capacity = min((a.memory.capacity for a in system.accelerators), default=0.0)
    return ParallelReport(iteration_s=makespan, gpus=gpus, model_flops=float(meta.get("model_flops", 0.0)),
                          peak_flops=float(meta.get("peak_flops", 0.0)), busy_s=busy_total / gpus,
                          exposed_s=exposed, memory_peak=dict(memory_peak), memory_capacity=float(capacity),
                          ttft_s=ttft, tpot_s=tpot, per_gpu=per_gpu)


def report_of(taskgraph, system: System, schedule) -> ParallelReport:
    """The :class:`ParallelReport` of a simulation Result or an analytical Estimate."""
    n = taskgraph.n_tasks
    if hasattr(schedule, "intervals"):
        iv = schedule.intervals
        iv = iv[iv["task"] >= 0]
        start = np.full(n, np.nan)
        end = np.full(n, np.nan)
        start[iv["task"].to_numpy()] = iv["start"].to_numpy()
        end[iv["task"].to_numpy()] = iv["end"].to_numpy()
        peaks = schedule.memories["peak_bytes"].to_dict()
    else:
        start, end = schedule.start, schedule.end
        peaks = {}
    reps = set(taskgraph.meta.get("fold", {}).values())
    peaks = {k: float(v) for k, v in peaks.items() if k in reps}
    return parallel_report(taskgraph, system, start, end, peaks)
