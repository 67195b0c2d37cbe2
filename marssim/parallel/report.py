"""What a parallel run reports: iteration time, achieved TFLOP/s and MFU per GPU, the pipeline
bubble, communication exposed per kind, memory peak per GPU, and for serving the time to first
token and per output token.

Where a GPU's compute stream is idle, the idle time is charged to what the GPU was waiting for,
walking back the chain of latest-ending predecessors from the kernel that ends the gap: time
spent in a transfer of the tensor-parallel, context-parallel, data-parallel, pipeline or
expert-parallel group is that group's *exposed* communication (``emb``: the tied word embedding's
gradient between the first and last stage; ``mp``: the optimizer step's all-reduces over the
model-parallel group); time spent waiting for another GPU's compute (a previous stage's forward,
a next stage's backward) and the idle time before a GPU's first and after its last kernel are the
*bubble*. Per GPU: busy + exposed communication + bubble = iteration time (tested). Model FLOPs
(for MFU) are forward and backward without recomputation (Narayanan et al. 2021, appendix;
Chowdhery et al. 2022): the workload's
:attr:`~marssim.workload.llm.Footprint.model_flops` per micro-batch, times micro-batches and
data-parallel replicas; hardware FLOPs (for HFU) are every FLOP the GPUs ran, recomputation
included.

Memory is the closed form of :mod:`.memory` (the model the pre-check and the search's screen use
too), per stage and term; per pipeline stage the report also gives its layers, busy time, bubble,
exposed communication and communication volume per group.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from marssim.system import System
from marssim.taskgraph import COMPUTE, TaskGraph

from . import gapwalk
from .gapwalk import walk_gaps

__all__ = ["ParallelReport", "parallel_report", "report_of", "CATEGORIES"]

CATEGORIES = ("tp", "cp", "sp", "pp", "dp", "ep", "emb", "mp", "bubble")

GROUP_NAMES = {"tp": "tensor-parallel", "cp": "context-parallel", "sp": "sequence-parallel",
               "pp": "pipeline sends and receives", "dp": "data-parallel gradients and parameters",
               "ep": "expert-parallel all-to-all",
               "emb": "the tied word embedding's gradient all-reduce between the first and last stage",
               "mp": "the optimizer step's all-reduces over the model-parallel group (gradient norm, overflow flag)"}
"""What each communication column of a report stands for (its legend)."""


@dataclass(frozen=True)
class StageFigures:
    """One pipeline stage, per GPU (averaged over its GPUs): seconds busy computing, in the
    bubble and in exposed communication per group; bytes moved per group; memory by term (bytes,
    the closed form)."""

    stage: int
    layers: tuple[int, int]  # first and last transformer layer (-1: the embedding; L: the head)
    gpus: int
    busy_s: float
    bubble_s: float
    exposed_s: dict[str, float]
    volume: dict[str, float]
    memory: dict[str, float]
    chunks: tuple[tuple[int, int], ...] = ()  # first and last layer of each model chunk (interleaved: several)

    @property
    def memory_peak(self) -> float:
        return sum(self.memory.values())

    def layer_text(self, head: int) -> str:
        """The stage's layers as the per-stage table names them: ``emb-11``, ``12-head``; an
        interleaved stage's chunks each as a range, ``0-2/24-26/48-50/72-74``."""
        ranges = self.chunks if len(self.chunks) > 1 else (self.layers,)
        return "/".join(f"{_layer_name(lo, head)}-{_layer_name(hi, head)}" if lo != hi else _layer_name(lo, head)
                        for lo, hi in ranges)


@dataclass(frozen=True)
class ParallelReport:
    """Per-run figures; times in seconds, rates in FLOP/s, bytes. Averages are over every GPU
    (each representative GPU weighted by the GPUs it stands for). ``memory_peak``: bytes per
    representative GPU (the closed form of its stage); ``hardware_flops``: every FLOP run per
    iteration, recomputation included; ``tokens``/``samples``: per iteration (serving: output
    tokens of the batch)."""

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
    hardware_flops: float = 0.0
    tokens: float = 0.0
    samples: float = 0.0
    stages: tuple[StageFigures, ...] = ()
    peak_dtype: str = ""  # the type whose peak ``peak_flops`` is
    gemm_dtype: str = ""  # fp8 or fp4 GEMMs (Transformer Engine's recipe); "": the model's type
    gemm_peak_flops: float = 0.0  # per GPU, the peak of ``gemm_dtype``
    kernels: tuple[str, ...] = ()  # per GPU design of the run: what times its kernels (cost.model.kernel_sources)

    @property
    def mfu_gemm_peak(self) -> float:
        """Model FLOPs utilisation against the peak of the low-precision GEMMs' type (0 when the
        run has none)."""
        return self.tflops_per_gpu * 1e12 / self.gemm_peak_flops if self.gemm_peak_flops else 0.0

    @property
    def tflops_per_gpu(self) -> float:
        """Achieved model FLOP/s per GPU, in TFLOP/s."""
        return self.model_flops / self.gpus / self.iteration_s / 1e12 if self.iteration_s > 0 else 0.0

    @property
    def mfu(self) -> float:
        """Model FLOPs utilisation: achieved model FLOP/s over the peak."""
        return self.tflops_per_gpu * 1e12 / self.peak_flops if self.peak_flops else 0.0

    @property
    def hfu(self) -> float:
        """Hardware FLOPs utilisation: every FLOP run (recomputation included) over the peak."""
        if not self.peak_flops or not self.iteration_s > 0:
            return 0.0
        return self.hardware_flops / self.gpus / self.iteration_s / self.peak_flops

    @property
    def bubble_share(self) -> float:
        return self.exposed_s.get("bubble", 0.0) / self.iteration_s if self.iteration_s > 0 else 0.0

    def lines(self) -> list[str]:
        """Readable lines for the CLI: the run, then one line per pipeline stage."""
        it = self.iteration_s
        out = [f"iteration          {it * 1e3:.3f} ms on {self.gpus} GPUs"]
        if self.tokens and it > 0:
            what = "output tokens" if self.tpot_s is not None else "tokens"
            out.append(f"throughput         {self.tokens / it:,.0f} {what}/s, {self.samples / it:,.2f} sequences/s")
        peak = f"{self.peak_dtype} dense peak" if self.peak_dtype else "peak"
        out.append(f"model FLOP/s       {self.tflops_per_gpu:.1f} TFLOP/s per GPU, MFU {self.mfu:.1%}, HFU "
                   f"{self.hfu:.1%} (model FLOPs {self.model_flops:.4g} per iteration, hardware "
                   f"{self.hardware_flops:.4g}; {peak} {self.peak_flops / 1e12:.1f} TFLOP/s)")
        if self.gemm_peak_flops:
            out.append(f"                   MFU {self.mfu_gemm_peak:.1%} against the {self.gemm_dtype} dense peak "
                       f"{self.gemm_peak_flops / 1e12:.1f} TFLOP/s of the {self.gemm_dtype} GEMMs")
        out.append(f"compute busy       {self.busy_s * 1e3:.3f} ms per GPU ({self.busy_s / it:.1%})" if it
                   else "compute busy       -")
        out.append(f"pipeline bubble    {self.exposed_s.get('bubble', 0.0) * 1e3:.3f} ms ({self.bubble_share:.1%})")
        exposed = ", ".join(f"{k.upper()} {v * 1e3:.3f} ms" for k, v in self.exposed_s.items() if k != "bubble" and v > 0)
        out.append(f"exposed comm.      {exposed or 'none'}")
        if not self.stages:
            out += _legend([k for k, v in self.exposed_s.items() if k != "bubble" and v > 0])
        if self.memory_peak:
            worst = max(self.memory_peak, key=self.memory_peak.get)
            out.append(f"memory peak        {self.memory_peak[worst] / 2**30:.2f} GiB on {worst} "
                       f"(capacity {self.memory_capacity / 2**30:.0f} GiB; closed form)")
        for i, text in enumerate(self.kernels):
            out.append(f"{'kernels' if i == 0 else '':<19}{text}")
        if self.ttft_s is not None:
            out.append(f"time to first token   {self.ttft_s * 1e3:.3f} ms")
        if self.tpot_s is not None:
            out.append(f"time per output token {self.tpot_s * 1e3:.3f} ms")
        if self.stages:
            out.append("")
            out.extend(self.stage_lines())
        return out

    def stage_lines(self) -> list[str]:
        """Two per-stage tables within 120 columns: where a GPU's time went (layers, busy,
        bubble and exposed communication per group, ms), and what it moved and holds
        (communication volume sent per group, MiB; memory by term, GiB, closed form)."""
        groups = [g for g in CATEGORIES if g != "bubble" and any(s.exposed_s.get(g, 0) > 0 or s.volume.get(g, 0) > 0
                                                                   for s in self.stages)]
        terms = [t for t in MEMORY_TERMS if any(s.memory.get(t, 0) > 0 for s in self.stages)]
        short = {"weights": "weights", "gradients": "grads", "optimizer state": "optim", "activations": "activ",
                 "KV cache": "KV", "communication buffers": "buffers"}
        texts = [st.layer_text(self.layers) for st in self.stages]
        width = max([10, *(len(t) + 2 for t in texts)])  # an interleaved stage's chunks widen the column
        head = f"{'stage':>5}{'layers':>{width}}{'GPUs':>6}{'busy':>10}{'bubble':>10}"
        head += "".join(f"{g.upper():>9}" for g in groups)
        out = ["per pipeline stage, per GPU: time in ms (busy computing, pipeline bubble, exposed communication)",
               head]
        for st, layers in zip(self.stages, texts):
            out.append(f"{st.stage:>5}{layers:>{width}}{st.gpus:>6}{st.busy_s * 1e3:>10.2f}{st.bubble_s * 1e3:>10.2f}"
                       + "".join(f"{st.exposed_s.get(g, 0.0) * 1e3:>9.2f}" for g in groups))
        out += ["", "per pipeline stage, per GPU: communication sent in MiB, memory in GiB by term (closed form)"]
        out.append(f"{'stage':>5}" + "".join(f"{g.upper() + ' MiB':>11}" for g in groups)
                   + "".join(f"{short[t]:>9}" for t in terms) + f"{'total':>8}")
        for st in self.stages:
            out.append(f"{st.stage:>5}" + "".join(f"{st.volume.get(g, 0.0) / 2**20:>11.1f}" for g in groups)
                       + "".join(f"{st.memory.get(t, 0.0) / 2**30:>9.2f}" for t in terms)
                       + f"{st.memory_peak / 2**30:>8.2f}")
        if any(len(st.chunks) > 1 for st in self.stages):
            out.append("layers: the model chunks of each stage (interleaved schedule), first-last layer of each")
        out += _legend(groups)
        return out

    @property
    def layers(self) -> int:
        """Transformer layers of the model (the head's layer index)."""
        return max((s.layers[1] for s in self.stages), default=0)

    def to_dict(self) -> dict:
        return {"iteration_s": self.iteration_s, "gpus": self.gpus, "model_flops": self.model_flops,
                "hardware_flops": self.hardware_flops, "tflops_per_gpu": self.tflops_per_gpu, "mfu": self.mfu,
                "hfu": self.hfu, "peak_dtype": self.peak_dtype, "gemm_dtype": self.gemm_dtype,
                "gemm_peak_flops": self.gemm_peak_flops, "mfu_gemm_peak": self.mfu_gemm_peak, "busy_s": self.busy_s, "tokens": self.tokens, "samples": self.samples,
                "bubble_share": self.bubble_share, "exposed_s": dict(self.exposed_s),
                "memory_peak_bytes": dict(self.memory_peak), "memory_capacity_bytes": self.memory_capacity,
                "ttft_s": self.ttft_s, "tpot_s": self.tpot_s, "per_gpu": self.per_gpu,
                "stages": [{"stage": s.stage, "layers": list(s.layers), "chunks": [list(c) for c in s.chunks],
                            "gpus": s.gpus, "busy_s": s.busy_s,
                            "bubble_s": s.bubble_s, "exposed_s": dict(s.exposed_s), "volume_bytes": dict(s.volume),
                            "memory_bytes": dict(s.memory)} for s in self.stages]}


MEMORY_TERMS = ("weights", "gradients", "optimizer state", "activations", "KV cache", "communication buffers")
"""The memory terms of a GPU, in the order reports and figures stack them."""


def _legend(groups) -> list[str]:
    """One line defining the communication columns shown (``groups``), within 120 columns."""
    from marssim.tables import wrap_last_cell

    if not groups:
        return []
    text = "; ".join(f"{g.upper()}: {GROUP_NAMES[g]}" for g in groups if g in GROUP_NAMES)
    return wrap_last_cell("groups: ", text, 120, breaks=";")


def _layer_name(layer: int, head: int) -> str:
    """A layer index as the per-stage table names it: the embedding, a block, the head."""
    return "emb" if layer < 0 else "head" if layer == head else str(layer)


_CHUNK_EDGES = 1 << 20
"""Predecessor edges :func:`latest_predecessors` reduces at once."""


def latest_predecessors(tg: TaskGraph, end: np.ndarray, tasks: np.ndarray | None = None,
                        excluded: np.ndarray | None = None) -> np.ndarray:
    """Per task (of ``tasks``, default all), its predecessor that ended last (the lowest index
    among equal ends; ``excluded[i]``: a predecessor of ``tasks[i]`` left out), -1 where it has
    none: what a task waited for last, by vectorised segment reductions over the TaskGraph's
    predecessor lists (a lowering's TaskGraph: compiled, over its program, without building them)."""
    program = getattr(tg, "program", None)
    if program is not None and gapwalk.compiled():
        return gapwalk.latest_in_program(program, end, tasks, excluded)
    pp, pi = tg.pred_ptr, tg.pred_idx
    n = len(pp) - 1
    if tasks is None:  # every task, in pieces of consecutive tasks: a few arrays of a piece's edges at a time
        cuts = np.unique(np.concatenate([[0], np.searchsorted(pp, np.arange(_CHUNK_EDGES, len(pi), _CHUNK_EDGES)),
                                         [n]]))
        return np.concatenate([np.full(0, -1, dtype=np.int64)] +
                              [_latest_of(pp[a:b + 1], pi[pp[a]:pp[b]], end, n) for a, b in zip(cuts[:-1], cuts[1:])])
    lo = pp[tasks]
    counts = pp[np.asarray(tasks) + 1] - lo
    out = np.full(len(counts), -1, dtype=np.int64)
    has = np.flatnonzero(counts > 0)
    if not len(has):
        return out
    c = counts[has]  # the predecessor lists of these tasks, one after another
    first = np.cumsum(c) - c
    preds = pi[np.repeat(lo[has] - first, c) + np.arange(int(c.sum()))].astype(np.int64)
    pend = end[preds]
    if excluded is not None:
        pend = np.where(preds == np.repeat(np.asarray(excluded)[has], c), -np.inf, pend)
    out[has] = _segment_latest(preds, pend, first, c, n)
    if excluded is not None:  # a task whose only predecessors are left out has none
        out[has[np.isneginf(np.maximum.reduceat(pend, first))]] = -1
    return out


def _latest_of(ptr: np.ndarray, preds: np.ndarray, end: np.ndarray, n: int) -> np.ndarray:
    """:func:`latest_predecessors` of consecutive tasks whose predecessor lists are ``preds``,
    delimited by ``ptr`` (offsets from ``ptr[0]``)."""
    counts = np.diff(ptr)
    out = np.full(len(counts), -1, dtype=np.int64)
    has = np.flatnonzero(counts > 0)
    if len(has):
        preds = preds.astype(np.int64)
        out[has] = _segment_latest(preds, end[preds], ptr[has] - ptr[0], counts[has], n)
    return out


def _segment_latest(preds: np.ndarray, pend: np.ndarray, starts: np.ndarray, counts: np.ndarray, n: int) -> np.ndarray:
    """Per segment (``starts``, ``counts``: non-empty, consecutive), the ``preds`` entry of the
    largest ``pend``, the lowest among equal ones."""
    best = np.maximum.reduceat(pend, starts)
    hit = pend == np.repeat(best, counts)
    return np.minimum.reduceat(np.where(hit, preds, n), starts)


def compute_by_device(tg: TaskGraph) -> dict[int, np.ndarray]:
    """Each device's compute tasks, ascending (node index -> task indices), from one stable sort
    of the compute tasks by device rather than a pass over every task per device."""
    comp = np.flatnonzero(tg.kind == COMPUTE)
    if not len(comp):
        return {}
    device = tg.device[comp]
    order = np.argsort(device, kind="stable")
    comp, device = comp[order], device[order]
    cuts = np.flatnonzero(np.diff(device)) + 1
    return {int(device[a]): comp[a:b] for a, b in zip(np.concatenate([[0], cuts]), np.concatenate([cuts, [len(comp)]]))}


@dataclass(frozen=True)
class _WalkColumns:
    """What the walk of :func:`_attribute` reads per task: whether it is a kernel, its collective
    (-1: none), and per collective (then one for none) the index of its group in CATEGORIES."""

    is_compute: np.ndarray
    collective: np.ndarray
    code: np.ndarray


def _group_labels(tg: TaskGraph) -> list[str]:
    """Each collective's group, then ``pp`` for a transfer of none (collective index -1)."""
    return [c.group or "pp" for c in tg.collectives] + ["pp"]


def _walk_columns(tg: TaskGraph, labels: list[str] | None = None) -> _WalkColumns:
    labels = _group_labels(tg) if labels is None else labels
    index = {g: CATEGORIES.index(g) for g in set(labels)}
    return _WalkColumns(tg.kind == COMPUTE, tg.collective, np.fromiter(map(index.__getitem__, labels), np.int64,
                                                                       len(labels)))


def _attribute(tg: TaskGraph, start: np.ndarray, end: np.ndarray, device: int, makespan: float,
               latest: np.ndarray | None = None, comp: np.ndarray | None = None,
               walk: _WalkColumns | None = None) -> dict[str, float]:
    """Seconds device ``device``'s compute stream is idle, by what it waits for: from each gap's
    end back along the predecessors that ended last (``latest``: :func:`latest_predecessors`;
    ``comp``: the device's compute tasks, ascending, as :func:`compute_by_device` gives them;
    ``walk``: the task graph's :func:`_walk_columns`, read once for every device)."""
    out = dict.fromkeys(CATEGORIES, 0.0)
    if comp is None:
        comp = np.flatnonzero((tg.kind == COMPUTE) & (tg.device == device))
    if not len(comp):
        out["bubble"] = makespan
        return out
    if latest is None:
        latest = latest_predecessors(tg, end)
    comp = comp[np.lexsort((comp, start[comp]))]
    if walk is None:
        walk = _walk_columns(tg)
    gaps_end = start[comp]
    gaps_start = np.concatenate([[0.0], end[comp[:-1]]])
    gaps = np.flatnonzero(gaps_end - gaps_start > 1e-15)
    # each gap's own task: what it waited for last, the previous kernel of its stream aside
    firsts = latest_predecessors(tg, end, comp[gaps], np.where(gaps > 0, comp[np.maximum(gaps - 1, 0)], -1))
    sums = np.zeros(len(CATEGORIES))
    walk_gaps(gaps_start[gaps], gaps_end[gaps], firsts, start, end, walk.is_compute, walk.collective, walk.code,
              latest, sums, CATEGORIES.index("bubble"))
    out = dict(zip(CATEGORIES, sums.tolist()))
    out["bubble"] += max(0.0, makespan - float(end[comp[-1]]))
    return out


def _attribute_in_program(program, start: np.ndarray, end: np.ndarray, makespan: float, comp: np.ndarray,
                          is_compute_row: np.ndarray, code_row: np.ndarray) -> dict[str, float]:
    """:func:`_attribute` of a lowering's TaskGraph over its program (compiled): the same gaps,
    the same walk (:func:`.gapwalk.walk_gaps_in_program`), without per-task arrays."""
    out = dict.fromkeys(CATEGORIES, 0.0)
    if not len(comp):
        out["bubble"] = makespan
        return out
    comp = comp[np.lexsort((comp, start[comp]))]
    gaps_end = start[comp]
    gaps_start = np.concatenate([[0.0], end[comp[:-1]]])
    gaps = np.flatnonzero(gaps_end - gaps_start > 1e-15)
    # each gap's own task: what it waited for last, the previous kernel of its stream aside
    firsts = gapwalk.latest_in_program(program, end, comp[gaps], np.where(gaps > 0, comp[np.maximum(gaps - 1, 0)], -1))
    sums = np.zeros(len(CATEGORIES))
    gapwalk.walk_gaps_in_program(program, gaps_start[gaps], gaps_end[gaps], firsts, start, end, is_compute_row,
                                 code_row, sums, CATEGORIES.index("bubble"))
    out = dict(zip(CATEGORIES, sums.tolist()))
    out["bubble"] += max(0.0, makespan - float(end[comp[-1]]))
    return out


def parallel_report(tg: TaskGraph, system, start: np.ndarray, end: np.ndarray, memory_peak: dict[str, float], *,
                    memory=None, chunks: list[list[int]] = (), tokens: float = 0.0, samples: float = 0.0
                    ) -> ParallelReport:
    """The :class:`ParallelReport` of a schedule (``start``/``end`` per task, seconds, from a
    simulation or an estimate) of a TaskGraph lowered from a parallel configuration.
    ``memory``: the configuration's closed form (:class:`~.memory.MemoryEstimate`), which gives
    the memory per stage and term and the peak of each GPU (else ``memory_peak``, bytes per
    representative GPU); ``chunks``: the layers of each model chunk (:func:`.lower.chunk_layers`);
    ``tokens``, ``samples``: per iteration."""
    meta = tg.meta
    makespan = float(np.nanmax(end)) if len(end) else 0.0
    fold = meta.get("fold", {})
    stage_of = meta.get("stage_of", {})
    weight: dict[str, int] = {}
    for gpu, rep in fold.items():
        weight[rep] = weight.get(rep, 0) + 1
    gpus = len(fold) or 1
    busy_total = 0.0
    exposed = dict.fromkeys(CATEGORIES, 0.0)
    per_gpu: dict[str, dict[str, float]] = {}
    names = tg.node_names
    index = {n: i for i, n in enumerate(names)}
    reps = {index[rep] for rep in weight}
    program = getattr(tg, "program", None)
    if program is not None and "kind" not in tg.__dict__:  # the columns unbuilt: read the program
        kernels, is_compute_row, code_row, volume = _program_tasks(program, reps)
        if gapwalk.compiled():  # each task's kind, category and latest predecessor where the walk reads them

            def attribute(d: int, mine: np.ndarray) -> dict[str, float]:
                return _attribute_in_program(program, start, end, makespan, mine, is_compute_row, code_row)
        else:
            walk = _WalkColumns(program.take_rows(is_compute_row), program.take_rows(code_row),
                                np.arange(len(CATEGORIES), dtype=np.int64))
    else:
        labels = _group_labels(tg)
        volume = _volumes(tg, reps, labels)
        by_device = compute_by_device(tg)
        walk = _walk_columns(tg, labels)
        flops = tg.flops
        none = np.zeros(0, dtype=np.int64)

        def kernels(d: int) -> tuple[np.ndarray, np.ndarray]:
            mine = by_device.get(d, none)
            return mine, flops[mine]
    if program is None or "kind" in tg.__dict__ or not gapwalk.compiled():
        latest = latest_predecessors(tg, end)

        def attribute(d: int, mine: np.ndarray) -> dict[str, float]:
            return _attribute(tg, start, end, d, makespan, latest, mine, walk)
    hardware = 0.0
    for rep, w in sorted(weight.items()):
        d = index[rep]
        mine, mine_flops = kernels(d)  # ascending: the sums below add in task order, as a mask would
        busy = float((end[mine] - start[mine]).sum())  # the durations of its kernels alone, in task order
        hardware += float(mine_flops.sum()) * w
        waits = attribute(d, mine)
        per_gpu[rep] = {"busy_s": busy, **{f"{k}_s": v for k, v in waits.items()}, "gpus": w,
                        **{f"{k}_bytes": v for k, v in volume.get(d, {}).items()}}
        busy_total += busy * w
        for k, v in waits.items():
            exposed[k] += v * w
    exposed = {k: v / gpus for k, v in exposed.items()}
    ttft = tpot = None
    ops = tg.op_names
    sample_ends = {}
    for name in ("prefill.sample",):
        if name in ops:
            i = ops.index(name)
            sample_ends[0] = float(end[(tg.kind == COMPUTE) & (tg.op == i)].max())
    steps = sorted(int(n.split(".")[1]) for n in ops if n.startswith("decode.") and n.endswith(".sample"))
    comp = tg.kind == COMPUTE if steps else None
    for step in steps:
        i = ops.index(f"decode.{step}.sample")
        sample_ends[step] = float(end[comp & (tg.op == i)].max())
    if 0 in sample_ends:
        ttft = sample_ends[0]
        if steps:
            tpot = (sample_ends[steps[-1]] - sample_ends[0]) / len(steps)
    capacity = min((a.memory.capacity for a in system.accelerators), default=0.0)
    stages: list[StageFigures] = []
    if memory is not None:
        memory_peak = {rep: memory.peak(stage_of[rep]) for rep in weight if rep in stage_of}
        pp = len(memory.static)
        for s in range(pp):
            reps = [r for r in weight if stage_of.get(r) == s]
            n = sum(weight[r] for r in reps) or 1
            layers = [layer for c, ls in enumerate(chunks) if c % pp == s for layer in ls]
            spans = tuple((min(ls), max(ls)) for c, ls in enumerate(chunks) if c % pp == s and len(ls))

            def mean(key: str) -> float:
                return sum(per_gpu[r].get(key, 0.0) * weight[r] for r in reps) / n

            stages.append(StageFigures(
                s, (min(layers), max(layers)) if layers else (0, 0), n, mean("busy_s"), mean("bubble_s"),
                {g: mean(f"{g}_s") for g in CATEGORIES if g != "bubble"},
                {g: mean(f"{g}_bytes") for g in CATEGORIES if g != "bubble"}, memory.terms(s), spans))
    return ParallelReport(iteration_s=makespan, gpus=gpus, model_flops=float(meta.get("model_flops", 0.0)),
                          peak_flops=float(meta.get("peak_flops", 0.0)), busy_s=busy_total / gpus,
                          exposed_s=exposed, memory_peak=dict(memory_peak), memory_capacity=float(capacity),
                          ttft_s=ttft, tpot_s=tpot, per_gpu=per_gpu, hardware_flops=hardware, tokens=tokens,
                          samples=samples, stages=tuple(stages), peak_dtype=str(meta.get("peak_dtype", "")),
                          gemm_dtype=str(meta.get("gemm_dtype", "")),
                          gemm_peak_flops=float(meta.get("gemm_peak_flops", 0.0)), kernels=_kernels(system, fold))


def _kernels(system, fold: dict) -> tuple[str, ...]:
    """:func:`marssim.cost.model.kernel_sources` of each GPU design the run's GPUs (``fold``'s
    keys, else every accelerator) use, in order of first use."""
    from marssim.cost.model import kernel_sources

    seen: dict[str, str] = {}
    for acc in (fold or system.accelerator_ids):
        try:
            name = system.accelerator(acc).designs[0]
        except (KeyError, IndexError, AttributeError):
            continue
        if name not in seen:
            seen[name] = kernel_sources(system.designs[name])
    return tuple(t for t in seen.values() if t)


def _program_tasks(program, reps: set[int]) -> tuple[Callable[[int], tuple[np.ndarray, np.ndarray]], np.ndarray,
                                                     np.ndarray, dict[int, dict[str, float]]]:
    """What :func:`parallel_report` reads of the tasks, from a lowering's
    :class:`~marssim.taskprogram.TaskProgram` rather than the TaskGraph's columns (the same
    arrays and sums): a function giving a device's kernels (ascending, as
    :func:`compute_by_device` gives them, built one device at a time) and their FLOPs; per
    template row whether it is a kernel and its category (:func:`_row_categories`: what the
    walk reads of a task, in place of its kind and collective); and :func:`_volumes`."""
    rows = program.rows
    is_compute = rows["kind"] == COMPUTE
    # the instances of each template, ascending: a device's kernels are in those of the
    # templates with kernels on it
    by_tpl = np.argsort(program.inst_tpl, kind="stable")
    tpl_ptr = np.zeros(len(program.sizes) + 1, dtype=np.int64)
    np.cumsum(np.bincount(program.inst_tpl, minlength=len(program.sizes)), out=tpl_ptr[1:])
    tpl_of_row = np.repeat(np.arange(len(program.sizes), dtype=np.int64), program.sizes)

    def kernels(d: int) -> tuple[np.ndarray, np.ndarray]:
        mask = is_compute & (rows["device"] == d)
        tpls = np.unique(tpl_of_row[mask])
        insts = np.sort(np.concatenate([by_tpl[tpl_ptr[j]:tpl_ptr[j + 1]] for j in tpls.tolist()] +
                                       [np.zeros(0, dtype=np.int64)]))
        tasks, task_rows = program.tasks_of_rows(mask, insts)
        return tasks, rows["flops"][task_rows]

    code = _row_categories(program)
    return kernels, is_compute, code, _program_volumes(program, reps, is_compute, code)


def _row_categories(program) -> np.ndarray:
    """Per template row, the index in CATEGORIES of its collective's group (``pp``: none), int32."""
    pp = CATEGORIES.index("pp")
    table = [[CATEGORIES.index(c.group or "pp") for c in colls] + [pp] for colls in program.tpl_colls]
    n_colls = np.array([len(t) - 1 for t in table], dtype=np.int64)
    offset = np.zeros(len(table) + 1, dtype=np.int64)
    np.cumsum(n_colls + 1, out=offset[1:])
    flat = np.fromiter((c for t in table for c in t), np.int32, int(offset[-1]))
    tpl = np.repeat(np.arange(len(table), dtype=np.int64), program.sizes)
    local = program.rows["collective"].astype(np.int64)
    return flat[offset[:-1][tpl] + np.where(local >= 0, local, n_colls[tpl])]


def _program_volumes(program, reps: set[int], is_compute: np.ndarray, code: np.ndarray) -> dict[int, dict[str, float]]:
    """:func:`_volumes` from a TaskProgram: a transfer's owner and group are its row's, so the
    sums run over rows (task after task, :meth:`~marssim.taskprogram.TaskProgram.row_sums`) and the order of first use
    is that of each pair's earliest task."""
    rows = program.rows
    moving = np.flatnonzero(~is_compute)
    if not len(moving):
        return {}
    src = rows["src"][moving]
    owner = np.where(np.isin(src, list(reps)), src, rows["dst"][moving]).astype(np.int64)
    pairs, pair_of = np.unique(owner * len(CATEGORIES) + code[moving], return_inverse=True)
    bins = np.full(len(is_compute), -1, dtype=np.int64)
    bins[moving] = pair_of
    sums = program.row_sums(bins, rows["nbytes"], len(pairs))
    # each row's earliest task: in the first instance of its template (none: never run)
    templates, first_inst = np.unique(program.inst_tpl, return_index=True)
    tpl_first = np.full(len(program.sizes), -1, dtype=np.int64)
    tpl_first[templates] = first_inst
    tpl = np.repeat(np.arange(len(program.sizes), dtype=np.int64), program.sizes)[moving]
    runs = tpl_first[tpl] >= 0
    first_task = program.inst_base[tpl_first[tpl][runs]] + moving[runs] - program.tpl_start[tpl[runs]]
    never = np.iinfo(np.int64).max
    earliest = np.full(len(pairs), never, dtype=np.int64)
    np.minimum.at(earliest, pair_of[runs], first_task)
    used = np.flatnonzero(earliest < never)
    out: dict[int, dict[str, float]] = {}
    for key in used[np.argsort(earliest[used])].tolist():  # distinct: a task has one row, a row one pair
        row = out.setdefault(int(pairs[key] // len(CATEGORIES)), {})
        row[CATEGORIES[int(pairs[key] % len(CATEGORIES))]] = float(sums[key])
    return out


def _volumes(tg: TaskGraph, reps: set[int], labels: list[str] | None = None) -> dict[int, dict[str, float]]:
    """Bytes each representative GPU (node index in ``reps``) moves per group in one iteration:
    the transfers of its own units (a ring step it sends, an activation it pulls; a transfer of
    several steps carries them all)."""
    out: dict[int, dict[str, float]] = {}
    transfer = np.flatnonzero(tg.kind != COMPUTE)
    if not len(transfer):
        return out
    # each transfer's group as a code (a transfer of no collective, index -1, is the pipeline's)
    labels = _group_labels(tg) if labels is None else labels
    names = sorted(set(labels))
    code_of = {name: i for i, name in enumerate(names)}
    group_code = np.fromiter(map(code_of.__getitem__, labels), np.int64, len(labels))[tg.collective[transfer]]
    src = tg.src[transfer]
    owner = np.where(np.isin(src, list(reps)), src, tg.dst[transfer])
    owners, owner_code = np.unique(owner, return_inverse=True)
    pair = owner_code * len(names) + group_code
    # sums per (owner, group) in the transfers' order (bincount adds in input order: the floats of
    # a loop over them)
    sums = np.bincount(pair, weights=tg.nbytes[transfer], minlength=len(owners) * len(names))
    used, first = np.unique(pair, return_index=True)
    for key in used[np.argsort(first, kind="stable")].tolist():  # each owner's groups in order of first use
        row = out.setdefault(int(owners[key // len(names)]), {})
        row[names[key % len(names)]] = float(sums[key])
    return out


def report_of(taskgraph, system: System, schedule, *, memory=None, chunks: list[list[int]] = (),
              tokens: float = 0.0, samples: float = 0.0) -> ParallelReport:
    """The :class:`ParallelReport` of a simulation Result or an analytical Estimate (see
    :func:`parallel_report` for ``memory``, ``chunks``, ``tokens`` and ``samples``)."""
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
    return parallel_report(taskgraph, system, start, end, peaks, memory=memory, chunks=chunks, tokens=tokens,
                           samples=samples)
