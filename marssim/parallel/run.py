"""Run a parallel configuration end to end: check its memory, lower, simulate (or estimate),
report; and show a folded result's GPUs as the GPUs a user asks for."""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from marssim.errors import CapacityError, InputError
from marssim.system import System
from marssim.workload import Graph

from .config import ParallelConfig
from .lower import prepare_graph
from .memory import memory_estimate
from .report import ParallelReport, parallel_report

__all__ = ["check_memory", "report_of", "unfold_result"]


def check_memory(graph: Graph, system: System, cfg: ParallelConfig) -> None:
    """Raise CapacityError naming the GPU, its peak, the capacity and the largest term when the
    closed-form memory of ``cfg`` exceeds a GPU's memory (see :mod:`.memory`)."""
    from .placement import place

    prepared = prepare_graph(graph, cfg)
    capacity = min(a.memory.capacity for a in system.accelerators)
    est = memory_estimate(prepared, cfg, capacity)
    if est.fits:
        return
    stage = est.worst_stage
    where = place(system, cfg)
    gpu = next(system.nodes[g] for g in where.gpus if where.stage(g) == stage)
    terms = est.terms(stage)
    largest = max(terms, key=terms.get)
    raise CapacityError(gpu, 0.0, est.peak(stage), capacity,
                        f"stage {stage} of {cfg.pp}, before simulating: largest term {largest} "
                        f"{terms[largest] / 2**30:.2f} GiB; "
                        + ", ".join(f"{k} {v / 2**30:.2f} GiB" for k, v in terms.items() if v)
                        + "; --memory-policy ignore simulates anyway")


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


def unfold_result(result, gpus: list[str]):
    """``result`` with the intervals of ``gpus`` (GPUs a folded run stood for by their class's
    representative) added as copies of their representative's compute intervals."""
    import pandas as pd

    fold = result.meta.get("fold", {})
    if not fold:
        return result
    unknown = [g for g in gpus if g not in fold]
    if unknown:
        raise InputError("--trace-gpus", "", f"not GPUs of the run: {', '.join(unknown[:5])}")
    iv = result.intervals
    extra = []
    for gpu in gpus:
        rep = fold[gpu]
        if rep == gpu:
            continue
        rows = iv[(iv["kind"] == "compute") & (iv["resource"] == rep)].copy()
        rows["resource"] = gpu
        extra.append(rows)
    if not extra:
        return result
    merged = pd.concat([iv] + extra, ignore_index=True).sort_values(["start", "kind", "task"], kind="stable")
    return replace(result, intervals=merged.reset_index(drop=True))
