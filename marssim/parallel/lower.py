"""Lower a transformer graph under a parallel configuration to the TaskGraph both evaluators read.

What a Megatron-LM run does, task by task, on one GPU per class of identical GPUs
(:mod:`.fold`):

* every op of a model chunk runs on its stage's GPUs, split by its tensor-parallel rule
  (:mod:`.roles`) and timed by the cost model on the GPU's design; the collectives that convert
  layouts between ops (all-reduce, reduce-scatter, all-gather over the tensor-parallel group;
  all-to-all over the expert-parallel group) are ring (direct for all-to-all) point-to-point
  steps over the system's routes;
* an activation crossing pipeline stages is a point-to-point transfer to the next stage (its
  gradient back to the previous one), held in the receiver's memory until its last reader ends;
* each GPU runs its units (chunk, micro-batch, forward or backward) in the order of the
  schedule (:mod:`.schedule`), one kernel after another on one stream; communication runs beside
  it and a kernel waits only for the data it reads;
* after its last backward, each chunk reduces its gradients over the data-parallel group in
  buckets of ``bucket`` parameters (later layers first, overlapping the rest of the backward when
  ``overlap_grad_reduce``), reduce-scattered with ``zero`` >= 1 (then the optimizer updates a
  ``1/dp`` shard and the parameters are all-gathered); then the optimizer steps. ZeRO-3 runs as
  DeepSpeed does (:mod:`.zero3`): each module's parameters all-gathered before its use in the
  forward and again in the backward, with a bounded prefetch, the gradients reduce-scattered in
  buckets of ``zero3_bucket`` parameters, nothing gathered after the step;
* weights, gradients and optimizer state are resident (:mod:`.memory`); activations are buffers
  from their producer's start to their last reader's end;
* the settings of :mod:`.config` that change the tasks live in modules of their own: context
  parallelism's attention ring (:mod:`.context`), Transformer Engine's overlapped tensor-parallel
  GEMMs (:mod:`.userbuffers`), the parameter all-gather's and the pipeline sends' overlap and
  the FP8 weight casts (:mod:`.overlap`), expert tensor parallelism and uneven routing
  (:mod:`.experts`); a collective on a tensor kept from another unit starts when the kernel
  before its reader starts.

Here the run is put together: its model (:class:`.runmodel.RunModel`: rules, shards, routes,
parameters; :mod:`.partition`), its unit templates built by :mod:`.builder`, their instances in
schedule order assembled by :mod:`.program` into the TaskGraph.

Units: seconds, bytes. Pure and deterministic.
"""
from __future__ import annotations

import functools
import time
from collections import Counter
from collections.abc import Callable

from marssim.cost.base import CostModel
from marssim.errors import InputError
from marssim.gcpause import gc_paused
from marssim.progress import LoweringProgress
from marssim.system import System
from marssim.taskgraph import TaskGraph, from_program
from marssim.taskprogram import TaskProgram
from marssim.workload import Graph, OpKind
from marssim.workload.llm import require_transformer

from .builder import Templates
from .config import ParallelConfig, check_parallel
from .fold import fold, identity_folding
from .memory import static_bytes
from .partition import prepare_graph
from .patterns import PULLS
from .placement import direct_patterns, place
from .program import Order, task_program
from .roles import strategy_of
from .runmodel import RunModel
from .schedule import stage_units
from .size import SizeEstimate, check_gpus, check_size

Progress = Callable[[LoweringProgress], None]
"""A progress callback (see :func:`lower_parallel`)."""

PROGRESS_EVERY = 0.5  # s of wall time between progress calls

__all__ = ["Progress", "lower_parallel", "lowered_size"]


def lower_parallel(graph: Graph, system: System, cfg: ParallelConfig, cost: CostModel | None = None, *,
                   folding: bool = True, where: str = "--parallel", progress: Progress | None = None,
                   max_bytes: float | None = None, coupled_rings: bool = False) -> TaskGraph:
    """Lower ``graph`` (an LLM workload) under ``cfg`` on ``system`` (see the module docstring).

    ``folding``: simulate one GPU per class of identical GPUs (exact, :mod:`.fold`); False: every
    GPU. ``progress``: called at most every half second of wall time a
    :class:`~marssim.progress.LoweringProgress` (stage ``fold``, ``templates`` or ``assemble``, tasks
    lowered so far, tasks of the TaskGraph).
    ``max_bytes``: the most a simulation of the result may need (default: this machine's memory;
    :mod:`.size`). Raises InputError when the configuration cannot run the workload on the
    system, or spans more GPUs or would need more memory than that bound (saying its size).

    ``coupled_rings``: a ring collective over GPUs of several classes is one transfer per class
    whose steps are coupled to the previous rank's (:class:`~marssim.taskprogram.CoupledSteps`)
    instead of one task per step: far fewer tasks for the estimate, which times those steps
    exactly as it times the tasks; the simulators refuse such a TaskGraph."""
    if cost is None:
        from marssim.cost import default_cost_model

        cost = default_cost_model()
    t = require_transformer(graph, "a parallel configuration", where)
    check_parallel(cfg, t, len(system.accelerators), where)
    check_gpus(cfg.gpus, where)
    graph = prepare_graph(graph, cfg)
    with gc_paused():
        return _lower(graph, system, cfg, cost, folding, Reporter(progress), where, max_bytes, coupled_rings)


class Reporter:
    """Calls a progress callback at most every PROGRESS_EVERY seconds (and at each new stage)."""

    def __init__(self, callback: Progress | None) -> None:
        self.callback = callback
        self.last = 0.0
        self.stage = ""
        self.total = 0

    def __call__(self, stage: str, tasks: int, force: bool = False) -> None:
        if self.callback is None:
            return
        now = time.perf_counter()
        if force or stage != self.stage or now - self.last >= PROGRESS_EVERY:
            self.stage, self.last = stage, now
            self.callback(LoweringProgress(stage, tasks, self.total))


def _lower(graph: Graph, system: System, cfg: ParallelConfig, cost: CostModel, folding: bool, report: Reporter,
           where_key: str = "--parallel", max_bytes: float | None = None, coupled_rings: bool = False) -> TaskGraph:
    wall = time.perf_counter()
    where = place(system, cfg)
    patterns = where.patterns()
    report("fold", 0)
    if folding:
        role = {}
        for g in where.gpus:
            acc = system.accelerator(system.nodes[g])
            role[g] = (where.stage(g), acc.designs, acc.memory.capacity)
        folded = fold(system, where.gpus, role, patterns, pulls=PULLS, direct=direct_patterns(patterns))
    else:
        folded = identity_folding(system, where.gpus, patterns, PULLS, direct_patterns(patterns))
    low = RunModel(graph, system, cfg, cost, folded, where, coupled_rings)
    templates = Templates(low)
    reps = folded.reps
    # every representative's units in schedule order, then its chunks' optimizer units
    order: Order = []
    for rep in reps:
        stage = where.stage(rep)
        units = stage_units(cfg.schedule, stage, cfg.pp, low.micro_batches,
                            cfg.virtual_stages if cfg.schedule == "interleaved" else 1,
                            forward_only=not low.training)
        if cfg.overlap_param_gather and low.training:  # the parameter all-gathers open the iteration
            for chunk in range(len(low.chunks)):
                if low.stage_of_chunk(chunk) == stage and (chunk, "O") in low.unit_ops:
                    order.append((rep, (chunk, "G"), 0))
        for chunk, mb, direction in units:
            if (chunk, direction) in low.unit_ops:
                order.append((rep, (chunk, direction), mb))
        if low.training:
            for chunk in range(len(low.chunks)):
                if low.stage_of_chunk(chunk) == stage and (chunk, "O") in low.unit_ops:
                    order.append((rep, (chunk, "O"), low.micro_batches - 1))
    build_wall = time.perf_counter()
    size = lowered_size(templates, order)
    check_size(size, where_key, max_bytes)
    report.total = size.tasks
    done = 0
    for (rep, key), count in Counter((rep, key) for rep, key, _ in order).items():  # each unit once, in order
        done += len(templates.get(rep, key)) * count
        report("templates", done)
    report("assemble", size.tasks)
    tg = _taskgraph(low, task_program(templates.built, order))
    report("assemble", tg.n_tasks, force=True)
    tg.meta["wall_lower_s"] = time.perf_counter() - wall
    tg.meta["wall_templates_s"] = time.perf_counter() - build_wall
    return tg


def lowered_size(templates: Templates, order: Order) -> SizeEstimate:
    """The size of the TaskGraph of ``order`` (its units, per representative GPU), from the unit
    templates of one representative per pipeline stage (and per class size) before any other
    is built: representatives of one stage whose classes are alike run templates of the same size."""
    low = templates.model
    per_rep: dict[int, list[tuple[int, str]]] = {}
    for rep, key, _ in order:
        per_rep.setdefault(rep, []).append(key)
    sized: dict[tuple, tuple[int, int]] = {}
    tasks = rows = 0
    for rep, keys in per_rep.items():
        kind = (low.place.stage(rep), low.fold.size(rep))
        n = sized.get(kind)
        if n is None:
            uses = Counter(keys)  # each unit's instances (one per micro-batch)
            n = sized[kind] = (sum(len(templates.get(rep, key)) * count for key, count in uses.items()),
                               sum(len(templates.get(rep, key)) for key in uses))
        tasks += n[0]
        rows += n[1]
    return SizeEstimate(len(low.place.gpus), len(low.fold.members), tasks, rows)



def _taskgraph(low: RunModel, program: TaskProgram) -> TaskGraph:
    """The TaskGraph of ``program`` with the lowering's labels; its columns are built from the
    program when first read (:class:`~marssim.taskgraph.ProgramTaskGraph`)."""
    if program.n_tasks >= 2**31 - 1:
        raise InputError("--parallel", "", f"{program.n_tasks:,} tasks: more than a TaskGraph holds (2^31)")
    names = low.system.nodes
    resident, setup = _memory(low)
    return from_program(
        program, node_names=names, op_names=tuple(op.name for op in low.graph.ops), routes=tuple(low.routes),
        resident=resident, setup=setup, meta=_meta(low),
        ops=functools.partial(_op_info, low, dict(low.cost_models)),  # made when first read
        device_design={names[g]: low.system.accelerator(names[g]).designs[0] for g in low.fold.reps},
        batch=low.cfg.batch)



def _memory(low: RunModel) -> tuple[dict[str, float], tuple[tuple[str, str, float], ...]]:
    """Resident bytes of each representative (weights, gradients, optimizer state, KV cache) and
    the weight loads of every GPU from its node's host."""
    names = low.system.nodes
    resident: dict[str, float] = {}
    setup = []
    per_stage = {}
    reps = set(low.fold.reps)
    for stage in range(low.cfg.pp):
        per_stage[stage] = static_bytes(low.graph, low.cfg, stage, low.rules, low.rank_params)
    for g in low.place.gpus:
        stage = low.place.stage(g)
        total = per_stage[stage].total
        if g in reps:
            resident[names[g]] = total
        setup.append((low.system.nearest_host(names[g]), names[g], per_stage[stage].weights))
    return resident, tuple(setup)


def _op_info(low: RunModel, cost_models: dict[str, str]) -> tuple:
    """The typed label of every compute op: its tensor-parallel split as a strategy name, its
    pipeline stage as the set, the cost model that timed it (``cost_models``: by op, as the
    lowering left them)."""
    from marssim.taskgraph import OpInfo

    out = []
    for op in low.graph.ops:
        if op.kind == OpKind.INPUT:
            continue
        rule = low.rules[op.name]
        stage = low.stage_of_chunk(low.chunk_of_layer[op.param("layer")])
        out.append(OpInfo(op.name, op.kind.value, op.model, " ".join(f"{k}={v}" for k, v in op.loops),
                          strategy_of(op, rule), stage, cost_models.get(op.name, "")))
    return tuple(out)




def _meta(low: RunModel) -> dict:
    names = low.system.nodes
    cfg = low.cfg
    model_flops, peak = low.model_flops()
    fold_map = {names[g]: names[low.fold.rep(g)] for g in low.place.gpus}
    return {
        "system": low.system.spec, "workload": low.graph.spec, "batch": cfg.batch, "micro_batches": low.micro_batches,
        "parallel": cfg.text(), "mapping": cfg.text(), "n_stages": cfg.pp,
        "fold": fold_map, "fold_classes": len(low.fold.members),
        "stage_of": {names[g]: low.place.stage(g) for g in low.place.gpus},
        "device_design": {names[g]: low.system.accelerator(names[g]).designs[0] for g in low.place.gpus},
        "op_model": {op.name: op.model for op in low.graph.ops},
        "op_kind": {op.name: op.kind.value for op in low.graph.ops},
        "model_flops": model_flops, "peak_flops": peak, "peak_dtype": low.t.dtype,
        # the low-precision GEMMs' own peak (Transformer Engine's fp8/fp4): MFU against it too
        **({"gemm_dtype": low.t.gemm_dtype, "gemm_peak_flops": low.peak(low.t.gemm_dtype)}
           if low.t.gemm_dtype and low.t.gemm_dtype != low.t.dtype else {}),
    }
