"""Evaluate a plan: check it, lower it, simulate or estimate it, report it -- the one path that
``marssim simulate``, ``estimate``, ``search``, ``compare`` and ``validate`` all take.

* a per-op :class:`~marssim.mapping.Mapping`: :func:`marssim.lower.lower`, then the simulation
  or the contention-free estimate of the TaskGraph;
* a serving :class:`~marssim.serve.Deployment`: :func:`run_deployment` serves the stream of a
  :class:`~marssim.serve.case.ServeCase` (simulated, at the offered load or at the highest rate
  meeting its constraints; or screened in closed form);
* a :class:`~marssim.parallel.ParallelConfig`: the closed-form memory check
  (:func:`marssim.parallel.memory.check_memory`; one memory model, the one the search screens
  with), :func:`marssim.parallel.lower_parallel` (one GPU per class of identical GPUs unless
  ``fold=False``), the simulation or the estimate, and the
  :class:`~marssim.parallel.ParallelReport` of the schedule (iteration, MFU and HFU, bubble,
  exposed communication per group, per stage).

Units: seconds, bytes.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import Executor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from marssim.cost.base import CostModel
from marssim.errors import InputError
from marssim.mapping import validate_mapping
from marssim.parallel import ParallelConfig, ParallelReport, lower_parallel
from marssim.parallel.memory import check_memory
from marssim.parallel.report import report_of
from marssim.results import Result
from marssim.results.summary import Summary
from marssim.system import System, expand_ids
from marssim.taskgraph import TaskGraph
from marssim.workload import Graph
from marssim.workload.llm import require_transformer

from .model import Plan

if TYPE_CHECKING:
    from marssim.serve.case import CaseRun, ServeCase
    from marssim.serve.deployment import Deployment
    from marssim.serve.metrics import SLO
    from marssim.serve.requests import RequestSpec
    from marssim.serve.simulate import ServeResult
    from marssim.workload.llm.config import TransformerConfig

__all__ = ["HOW", "Run", "run", "run_deployment", "serve_stream", "serve_rates", "lower_plan", "trace_gpus"]

HOW = ("simulate", "estimate")
"""How a plan is evaluated: event by event with contention, or the contention-free estimate."""


@dataclass
class Run:
    """One plan evaluated. ``result`` is None when only the summary was asked for (a search's
    candidates); ``report`` is the parallel report of a configuration (None for a mapping);
    ``lower_bound`` and ``bounds`` come with an estimate. ``wall_s``: seconds spent lowering and
    evaluating."""

    plan: Plan
    graph: Graph
    system: System
    how: str
    taskgraph: TaskGraph
    summary: Summary
    result: Result | None = None
    report: ParallelReport | None = None
    estimate: object | None = None  # the analytical Estimate (start, end, ready, bounds) of an estimate
    lower_bound: float | None = None
    bounds: dict[str, float] = field(default_factory=dict)
    wall_s: dict[str, float] = field(default_factory=dict)

    @property
    def makespan(self) -> float:
        """Seconds: the makespan of a mapping, the iteration of a configuration."""
        return self.summary.makespan


def lower_plan(plan: Plan, graph: Graph, system: System, cost: CostModel, *, fold: bool = True, cache=None,
               validate: bool = True, progress: Callable | None = None, max_bytes: float | None = None,
               how: str = "simulate") -> TaskGraph:
    """The TaskGraph of ``plan`` (each plan kind by its own lowering). ``graph``: for a
    configuration, one micro-batch of it (:func:`marssim.plan.graph_for`). ``max_bytes``: the
    most a configuration's lowering and simulation may need (default: this machine's memory).
    ``how``: what will evaluate it; a configuration lowered for the compiled estimate holds each
    ring over several classes as one task per class with coupled steps (``coupled_rings``, the
    same estimate from far fewer tasks; the simulators refuse that TaskGraph)."""
    if isinstance(plan, ParallelConfig):
        kwargs = {"progress": progress} if progress is not None else {}
        if how == "estimate":
            from marssim.analytical import have_numba

            kwargs["coupled_rings"] = have_numba()
        return lower_parallel(graph, system, plan, cost, folding=fold, max_bytes=max_bytes, **kwargs)
    from marssim.lower import lower

    if validate:
        validate_mapping(plan, graph, system)
    return lower(graph, system, plan, cost, validate=False, cache=cache)


def run(plan: Plan, graph: Graph, system: System, cost: CostModel | None = None, *, how: str = "simulate",
        memory_policy: str = "error", streams: int = 1, fold: bool = True, detail: bool = True,
        record: bool | None = None, level: str = "block", cache=None, validate: bool = True,
        taskgraph: TaskGraph | None = None, progress: Callable | None = None, max_bytes: float | None = None) -> Run:
    """Evaluate ``plan`` (see the module docstring).

    ``how``: ``simulate`` or ``estimate``; ``memory_policy``: ``error`` (a configuration that does
    not fit is refused before lowering, a mapping's overflow stops the simulation), ``spill`` or
    ``ignore``; ``detail``: False keeps only the summary (and a configuration's report), as a
    search needs; ``record``: keep a simulation's memory and link timelines and simulate the
    weight loads (default: ``detail``); ``level``: the layer groups of an estimate's report;
    ``taskgraph``: the plan already lowered (by an earlier run), not lowered again; ``max_bytes``:
    the most a configuration's lowering and simulation may need (default: this machine's memory;
    a search running several side by side gives each its share). Raises
    InputError for a plan the workload or the system cannot take, CapacityError for one that
    does not fit."""
    if how not in HOW:
        raise ValueError(f"how must be one of {', '.join(HOW)}, got {how!r}")
    if cost is None:
        from marssim.cost import default_cost_model

        cost = default_cost_model()
    parallel = isinstance(plan, ParallelConfig)
    if parallel and memory_policy == "error" and taskgraph is None:
        check_memory(graph, system, plan)
    record = detail if record is None else record
    wall = time.perf_counter()
    tg = taskgraph if taskgraph is not None else \
        lower_plan(plan, graph, system, cost, fold=fold, cache=cache, validate=validate, progress=progress,
                   max_bytes=max_bytes, how=how)
    lowered = time.perf_counter()
    out = Run(plan, graph, system, how, tg, Summary(0.0, float("nan"), float("nan")))
    kwargs = {"progress": progress} if progress is not None else {}
    if how == "estimate":
        from marssim.analytical import estimate
        from marssim.results.summary import summarise

        est = estimate(tg, system, **kwargs)
        out.summary = summarise(tg, system, est.end)
        out.estimate, out.lower_bound, out.bounds = est, est.lower_bound, dict(est.bounds)
        if detail:
            out.result = est.result(level=level)
        schedule = est
    elif parallel and not detail:  # the report reads every task's start and end, nothing more
        from marssim.sim import simulate_schedule

        policy = "ignore" if memory_policy == "error" else memory_policy
        schedule = simulate_schedule(tg, system, memory_policy=policy, streams=streams, **kwargs)
        out.summary = schedule.summary
    elif detail or parallel:
        from marssim.sim import simulate

        policy = "ignore" if parallel and memory_policy == "error" else memory_policy
        result = simulate(tg, system, memory_policy=policy, streams=streams, record=record, setup=record, **kwargs)
        out.summary = Summary(result.makespan, result.throughput, result.energy)
        out.result = result if detail else None
        schedule = result
    else:
        from marssim.sim import simulate_summary

        out.summary = simulate_summary(tg, system, memory_policy=memory_policy, streams=streams, **kwargs)
        schedule = None
    if parallel:
        out.report = _report(plan, graph, system, tg, schedule)
        if out.result is not None:
            out.result.meta["parallel_report"] = out.report.to_dict()
    out.wall_s = {"lower_s": lowered - wall, "evaluate_s": time.perf_counter() - lowered}
    return out


def run_deployment(deployment: Deployment, case: ServeCase, system: System, cost: CostModel, *,
                   how: str = "simulate") -> CaseRun:
    """Serve ``case``'s requests with ``deployment`` on ``system`` (:mod:`marssim.serve.case`):
    ``how="simulate"`` by simulation, ``"estimate"`` by the closed-form screen. Returns a
    :class:`~marssim.serve.case.CaseRun`; raises InputError for a deployment the system or the
    model cannot take."""
    from marssim.serve.case import evaluate_case, screen_case

    if how not in HOW:
        raise ValueError(f"how must be one of {', '.join(HOW)}, got {how!r}")
    return (evaluate_case if how == "simulate" else screen_case)(deployment, case, system, cost)


def serve_stream(deployment: Deployment, model: TransformerConfig, system: System, cost: CostModel,
                 spec: RequestSpec, *, seed: int = 0, slo: SLO | None = None, trace: bool = False) -> ServeResult:
    """Serve the requests ``spec`` (a :class:`~marssim.serve.requests.RequestSpec`) draws with
    ``seed`` with ``deployment`` (a :class:`~marssim.serve.deployment.Deployment`) of ``model`` on
    ``system``, event by event (:func:`marssim.serve.simulate.simulate_spec`); ``slo``: the
    per-request bounds the goodput counts (:class:`~marssim.serve.metrics.SLO`; None: none);
    ``trace``: keep what a Perfetto trace needs. Returns the
    :class:`~marssim.serve.simulate.ServeResult` (seconds, requests/s, tokens/s); InputError for a
    deployment the system or the model cannot take."""
    from marssim.serve.metrics import SLO
    from marssim.serve.simulate import simulate_spec

    return simulate_spec(deployment, model, system, cost, spec, seed=seed, slo=slo if slo is not None else SLO(),
                         trace=trace)


def serve_rates(deployment: Deployment, model: TransformerConfig, system: System, cost: CostModel,
                spec: RequestSpec, rates: list[float], *, seed: int = 0, slo: SLO | None = None,
                executor: Executor | None = None) -> list[dict]:
    """:func:`serve_stream` at each of ``rates`` (requests/s) on ``executor`` (any
    ``concurrent.futures.Executor``; None: here), after checking that the deployment fits the
    system: one row per rate (:func:`marssim.serve.sweep.rate_sweep`)."""
    from marssim.serve.metrics import SLO
    from marssim.serve.simulate import place_replicas
    from marssim.serve.sweep import rate_sweep

    place_replicas(system, deployment)  # the deployment fits the system before any worker starts
    return rate_sweep(deployment, model, system, cost, spec, rates, seed=seed, slo=slo if slo is not None else SLO(),
                      executor=executor)


def _report(cfg: ParallelConfig, graph: Graph, system: System, tg: TaskGraph, schedule) -> ParallelReport:
    """The parallel report of a schedule, with the closed-form memory per stage and term and the
    tokens and sequences of one iteration."""
    from marssim.parallel import chunk_layers, memory_estimate, prepare_graph
    t = require_transformer(graph, "a parallel report")
    capacity = min(a.memory.capacity for a in system.accelerators)
    memory = memory_estimate(prepare_graph(graph, cfg), cfg, capacity)
    if t.mode == "serve":
        samples = t.batch * cfg.dp
        tokens = samples * t.generate
    else:
        samples = cfg.batch if t.training else t.batch * cfg.dp
        tokens = samples * (t.seq if t.mode != "decode" else 1)
    return report_of(tg, system, schedule, memory=memory, chunks=chunk_layers(t.layers, cfg), tokens=tokens,
                     samples=samples)


def trace_gpus(text: str, system: System) -> list[str]:
    """The GPUs ``--trace-gpus`` names (``gpu[0-15],gpu512``), checked against the run's GPUs
    before any work is wasted: InputError naming the unknown ones."""
    try:
        gpus = expand_ids([g.strip() for g in text.split(",") if g.strip()])
    except ValueError as err:
        raise InputError(None, "--trace-gpus", str(err)) from None
    known = set(system.accelerator_ids)
    unknown = [g for g in gpus if g not in known]
    if unknown:
        raise InputError(None, "--trace-gpus", f"not GPUs of {system.spec}: {', '.join(unknown[:5])}"
                                               + (f" and {len(unknown) - 5} more" if len(unknown) > 5 else ""))
    return gpus
