"""Evaluate candidate plans -- per-op mappings, parallel configurations or serving deployments --
in parallel on any ``concurrent.futures.Executor``, with caching.

Two evaluations per plan, both through :func:`marssim.plan.run` (or
:func:`marssim.plan.run_deployment`) or its closed form:

* ``simulate``: event by event (headline numbers only; a configuration's report figures too; a
  deployment's request stream served, at the offered load or at its goodput);
* ``estimate``, the *screen*: a mapping's contention-free analytical estimate, a
  configuration's closed form (:func:`marssim.parallel.analytic.screen`, which also checks its
  memory), a deployment's closed form (:mod:`marssim.serve.screen`).

A :class:`Problem` (graph, system, cost model; for deployments the serving case: model, requests,
seed, constraints, prices) is pickled once; the first batch's tasks send its bytes (unpickled
once per worker process and kept) with their plans, later tasks its key alone (a worker without
it asks for the bytes again). Results come back
in order, so a search is deterministic whatever the executor and the number of workers. Any
executor works: ``ProcessPoolExecutor``, ``ThreadPoolExecutor``, or a Dask cluster's
``Client.get_executor()``.
"""

from __future__ import annotations

import itertools
import math
import pickle
import time
from typing import Any
from collections.abc import Sequence
from concurrent.futures import Executor
from dataclasses import dataclass, field

from marssim.cost.base import CostModel
from marssim.errors import CapacityError, InputError
from marssim.lower import LoweringCache
from marssim.mapping import Mapping
from marssim.parallel import ParallelConfig
from marssim.plan import Plan, graph_for, plan_key
from marssim.plan.evaluation import DeploymentEvaluation, Evaluation, MappingEvaluation, ParallelEvaluation
from marssim.plan.kinds import KINDS, PlanKind, find_kind, kind_of
from marssim.serve.case import CaseRun, ServeCase
from marssim.serve.deployment import Deployment
from marssim.system import System
from marssim.workercache import Missing, pickled, worker_copy
from marssim.workload import Graph
from marssim.workload.llm import require_transformer

__all__ = ["OBJECTIVES", "SERVING_OBJECTIVES", "RANK_DIGITS", "rank_value", "Problem", "Evaluation",
           "MappingEvaluation", "ParallelEvaluation", "DeploymentEvaluation", "Evaluator",
           "evaluate_mapping",
           "estimate_mapping", "estimate_evaluation", "simulate_plan", "screen_plan", "deployment_evaluation"]

OBJECTIVES = KINDS[PlanKind.MAPPING].objectives
"""A per-op mapping's objectives (:data:`marssim.plan.evaluation.PLAN_OBJECTIVES`)."""

SERVING_OBJECTIVES = KINDS[PlanKind.DEPLOYMENT].objectives
"""A serving deployment's objectives (:data:`marssim.plan.evaluation.SERVING_OBJECTIVES`)."""


@dataclass(frozen=True)
class Problem:
    """What every evaluation needs: the workload, the system and the cost model (for a parallel
    configuration, ``graph`` is the workload at any batch: each configuration is evaluated on one
    micro-batch of it; for a deployment, ``graph`` is None and ``serving`` the case)."""

    graph: Graph | None
    system: System
    cost: CostModel
    memory_policy: str = "error"
    serving: ServeCase | None = None


RANK_DIGITS = 12
"""Significant digits of a fitness that ranking looks at. Equivalent mappings (a model on
accelerators 0-1 or on 1-2 of a symmetric ring) have fitnesses that differ only by rounding,
and rounding differs between machines; compared at 12 digits they tie, and the tie goes to the
smaller plan key, so a seed's search is the same on every machine."""


def rank_value(fitness: float) -> float:
    """``fitness`` rounded to :data:`RANK_DIGITS` significant digits (inf and nan unchanged)."""
    if not math.isfinite(fitness) or fitness == 0.0:
        return fitness
    return round(fitness, RANK_DIGITS - 1 - math.floor(math.log10(abs(fitness))))


# ---------------------------------------------------------------------- one plan, here
def evaluate_mapping(problem: Problem, mapping: Mapping, cache: LoweringCache | None = None) -> MappingEvaluation:
    """Lower and simulate one mapping (headline numbers only: no interval log, no set-up run);
    the numbers equal those of a full :func:`marssim.sim.simulate` of the same mapping.
    ``cache``: a :class:`~marssim.lower.LoweringCache` for the problem's graph, system and cost."""
    from marssim.plan import run

    t0 = time.perf_counter()
    try:
        done = run(mapping, problem.graph, problem.system, problem.cost, memory_policy=problem.memory_policy,
                   detail=False, cache=cache, validate=False)
    except CapacityError as err:
        return MappingEvaluation(math.inf, feasible=False, error=str(err), wall_s=time.perf_counter() - t0)
    s = done.summary
    return MappingEvaluation(s.makespan, s.throughput, energy=s.energy, wall_s=time.perf_counter() - t0)


def estimate_mapping(problem: Problem, mapping: Mapping, cache: LoweringCache | None = None) -> float:
    """Contention-free analytical makespan (s) of one mapping (see :mod:`marssim.analytical`)."""
    return estimate_evaluation(problem, mapping, cache).makespan


def estimate_evaluation(problem: Problem, mapping: Mapping,
                        cache: LoweringCache | None = None) -> MappingEvaluation:
    """The contention-free analytical estimate (see :mod:`marssim.analytical`) of one mapping,
    as a :class:`MappingEvaluation`: estimated makespan and throughput, and the compute energy (the
    same as simulated: it does not depend on the schedule). Memory capacity is not checked."""
    from marssim.plan import run

    t0 = time.perf_counter()
    done = run(mapping, problem.graph, problem.system, problem.cost, how="estimate", detail=False, cache=cache,
               validate=False)
    s = done.summary
    return MappingEvaluation(s.makespan, s.throughput, energy=s.energy, wall_s=time.perf_counter() - t0)


def _serving(graph: Graph) -> bool:
    """Whether an LLM workload serves (its latency is the time per output token)."""
    return require_transformer(graph, "a parallel configuration").mode == "serve"


def _config_throughput(graph: Graph, cfg: ParallelConfig, seconds: float) -> float:
    """Sequences per second of a training step, output tokens per second of serving."""
    t = require_transformer(graph, "a parallel configuration")
    if not seconds > 0:
        return float("nan")
    if t.mode == "serve":
        return t.batch * t.generate * cfg.dp / seconds
    return cfg.batch / seconds


def simulate_plan(problem: Problem, plan: Plan, cache: LoweringCache | None = None,
                  graphs: dict | None = None, max_bytes: float | None = None) -> Evaluation:
    """The simulated :class:`Evaluation` of ``plan`` (``graphs``: workloads by micro-batch,
    shared by the configurations of a search; ``max_bytes``: the most its lowering and
    simulation may need, default this machine's memory; beyond it the plan is infeasible)."""
    return _SIMULATE[kind_of(plan).kind](problem, plan, cache, graphs, max_bytes)


def _simulate_config(problem: Problem, plan: ParallelConfig, cache: LoweringCache | None, graphs: dict | None,
                     max_bytes: float | None) -> ParallelEvaluation:
    from marssim.plan import run

    t0 = time.perf_counter()
    graph = graph_for(problem.graph, plan, graphs)
    serving = _serving(graph)
    try:
        done = run(plan, graph, problem.system, problem.cost, memory_policy=problem.memory_policy, detail=False,
                   max_bytes=max_bytes)
    except (CapacityError, InputError) as err:
        return ParallelEvaluation(math.inf, feasible=False, error=str(err), wall_s=time.perf_counter() - t0,
                                  serving=serving)
    rep = done.report
    nan = float("nan")
    return ParallelEvaluation(rep.iteration_s, _config_throughput(graph, plan, rep.iteration_s),
                              energy=done.summary.energy, wall_s=time.perf_counter() - t0, mfu=rep.mfu,
                              exposed=dict(rep.exposed_s), serving=serving,
                              ttft=rep.ttft_s if rep.ttft_s is not None else nan,
                              tpot=rep.tpot_s if rep.tpot_s is not None else nan,
                              memory_peak=max(rep.memory_peak.values(), default=nan))


def screen_plan(problem: Problem, plan: Plan, cache: LoweringCache | None = None,
                graphs: dict | None = None) -> Evaluation:
    """The screened :class:`Evaluation` of ``plan``: a mapping's analytical estimate, a
    configuration's closed form (infeasible when its memory does not fit), a deployment's closed
    form."""
    return _SCREEN[kind_of(plan).kind](problem, plan, cache, graphs)


def _screen_config(problem: Problem, plan: ParallelConfig, cache: LoweringCache | None,
                   graphs: dict | None) -> ParallelEvaluation:
    from marssim.parallel.analytic import screen, serving_times

    t0 = time.perf_counter()
    graph = graph_for(problem.graph, plan, graphs)
    serving = _serving(graph)
    try:
        sc = screen(graph, problem.system, plan, problem.cost, time_infeasible=False)
        ttft = tpot = float("nan")
        if serving:
            ttft, tpot = serving_times(graph, problem.system, plan, problem.cost)
    except InputError as err:
        return ParallelEvaluation(math.inf, feasible=False, error=str(err), wall_s=time.perf_counter() - t0,
                                  serving=serving)
    peak = sc.memory.peak(sc.memory.worst_stage)
    error = "" if sc.fits else f"needs {peak / 2**30:.2f} GiB per GPU, capacity {sc.memory.capacity / 2**30:.2f} GiB"
    return ParallelEvaluation(sc.iteration_s, _config_throughput(graph, plan, sc.iteration_s), feasible=sc.fits,
                              error=error, wall_s=time.perf_counter() - t0, mfu=sc.mfu, serving=serving, ttft=ttft,
                              tpot=tpot, memory_peak=peak)


_SIMULATE = {
    PlanKind.MAPPING: lambda problem, plan, cache, graphs, max_bytes: evaluate_mapping(problem, plan, cache),
    PlanKind.PARALLEL: _simulate_config,
    PlanKind.DEPLOYMENT: lambda problem, plan, cache, graphs, max_bytes: deployment_evaluation(problem, plan,
                                                                                               "simulate"),
}
"""Each kind's simulation, as an :class:`Evaluation`."""
_SCREEN = {
    PlanKind.MAPPING: lambda problem, plan, cache, graphs: estimate_evaluation(problem, plan, cache),
    PlanKind.PARALLEL: _screen_config,
    PlanKind.DEPLOYMENT: lambda problem, plan, cache, graphs: deployment_evaluation(problem, plan, "estimate"),
}
"""Each kind's screen, as an :class:`Evaluation`."""


_LATENCY = ("ttft", "tbt", "tpot", "e2e", "queue")


def deployment_evaluation(problem: Problem, deployment: Deployment, how: str) -> DeploymentEvaluation:
    """A deployment simulated (``how="simulate"``) or screened (``"estimate"``) on the problem's
    serving case (:func:`marssim.plan.run_deployment`), as a :class:`DeploymentEvaluation`: ``makespan``
    the run's span (first arrival to last token, s), ``throughput`` output tokens/s, ``rate``
    the requests/s the figures are at, ``goodput`` (requests/s), GPUs, dollars per million
    output tokens, the constraints' ratio and what it missed, the latency statistics
    (``latency["ttft_p99"]``, s; none for a run stopped once it could no longer meet them). A
    deployment that cannot run is infeasible."""
    from marssim.plan import run_deployment

    t0 = time.perf_counter()
    case = problem.serving
    if case is None:
        raise ValueError("a deployment needs a problem with a serving case")
    try:
        done: CaseRun = run_deployment(deployment, case, problem.system, problem.cost, how=how)
    except (CapacityError, InputError) as err:
        return DeploymentEvaluation(math.inf, feasible=False, error=str(err), wall_s=time.perf_counter() - t0,
                                    gpus=deployment.gpus, slo_ratio=math.inf)
    s = done.summary
    latency = {f"{m}_{k}": float(v) for m in _LATENCY for k, v in s.get(f"{m}_s", {}).items()}
    if not done.feasible or done.ratio <= 1:
        miss = ""
    elif "missed" in s:
        miss = f"stopped: {s['missed']}"
    else:
        miss = "; ".join(case.violations(s, done.rate if case.goodput else None))
    return DeploymentEvaluation(float(s.get("duration_s", math.nan)), float(s.get("output_tokens_per_s", math.nan)),
                                feasible=done.feasible, error=done.error, wall_s=time.perf_counter() - t0,
                                rate=done.rate, goodput=done.goodput, gpus=done.gpus,
                                cost_per_mtok=done.cost_per_mtok, slo_ratio=done.ratio, slo_miss=miss,
                                capacity=done.capacity_rps, runs=done.runs, latency=latency,
                                user_tokens_per_s=float(s.get("user_tokens_per_s", {}).get("mean", math.nan)))


# ---------------------------------------------------------------------- worker side
_PROBLEMS: dict[str, tuple[Problem, LoweringCache, dict]] = {}


def _problem(key: str, blob: bytes | None) -> tuple[Problem, LoweringCache, dict]:
    """The problem of ``key`` in this process (unpickled from ``blob`` on first use), the
    lowering cache every mapping of it shares and the graphs its configurations share."""
    return worker_copy(_PROBLEMS, key, blob, build=lambda b: _with_cache(pickle.loads(b)), keep=5)


def _with_cache(problem: Problem) -> tuple[Problem, LoweringCache | None, dict]:
    cache = LoweringCache(problem.graph, problem.system, problem.cost) if problem.graph is not None else None
    return problem, cache, {}


def _simulate_chunk(args: tuple[str, bytes, list[Plan], int]) -> list[Evaluation]:
    """Simulations of ``plans`` in a process that runs beside ``share - 1`` others: each may
    take ``1/share`` of this machine's memory (or of ``MARSSIM_MAX_BYTES``)."""
    from marssim.parallel.size import machine_memory

    key, blob, plans, share = args
    got = _problem(key, blob)
    if isinstance(got, Missing):
        return got
    problem, cache, graphs = got
    limit = machine_memory() / share
    return [simulate_plan(problem, p, cache, graphs, max_bytes=limit) for p in plans]


def _estimate_chunk(args: tuple[str, bytes, list[Plan], int]) -> list[Evaluation]:
    key, blob, plans, _ = args
    got = _problem(key, blob)
    if isinstance(got, Missing):
        return got
    problem, cache, graphs = got
    return [screen_plan(problem, p, cache, graphs) for p in plans]


def _affinity(plan: Plan) -> tuple:
    """What a worker builds once and reuses for ``plan`` (:attr:`~marssim.plan.kinds.KindSpec.affinity`:
    for a parallel configuration, the model graph prepared for its micro-batch, recomputation and
    context parallelism, then the rules of its tensor, sequence and expert parallelism; () for
    other plans)."""
    return kind_of(plan).affinity(plan)


def _chunks(items: list, parts: int) -> list[list[int]]:
    """The indexes of ``items`` in at most ``parts`` chunks: parallel configurations sorted by
    :func:`_affinity` and cut into runs of equal length (a worker then prepares the graphs and
    rules of a few micro-batch sizes, not of all); other plans dealt round-robin (neighbouring
    candidates, often alike in cost, land in different chunks, which balances the workers)."""
    parts = max(1, min(parts, len(items)))
    if all((spec := find_kind(p)) is not None and spec.affinity(p) for p in items):
        order = sorted(range(len(items)), key=lambda i: _affinity(items[i]))
        bounds = [len(items) * k // parts for k in range(parts + 1)]
        return [order[bounds[k]:bounds[k + 1]] for k in range(parts)]
    return [list(range(i, len(items), parts)) for i in range(parts)]


def _unchunk(chunks: list[list[int]], outs: list[list], n: int) -> list:
    """The inverse of :func:`_chunks`: every chunk's results (``outs``) at their items'
    indexes, ``n`` in all."""
    out: list = [None] * n
    for idx, results in zip(chunks, outs):
        for i, r in zip(idx, results):
            out[i] = r
    return out


@dataclass
class Evaluator:
    """Cached, optionally parallel evaluation of plans for one problem.

    ``executor``: any ``concurrent.futures.Executor`` (None: evaluate in this process). A batch
    is dealt into ``chunks_per_worker`` chunks per worker (``workers``: how many the executor
    runs at once; read from the executor when not given, see
    :func:`~marssim.search.parallel.executor_parallelism`; parallel configurations grouped by the
    graph and rules they share, :func:`_chunks`), so per-task overheads do not dominate small
    simulations; a batch of long simulations (the best
    configurations of a generation) is dealt one per task, side by side. Results come back in the
    order given, whatever the executor. Counters: ``simulations`` and ``estimates`` run (cache
    misses), ``cache_hits``, ``sim_seconds`` (the simulations' own wall time, summed where they
    ran), ``wait_s`` (wall seconds this process waited for simulations and for screens)."""

    problem: Problem
    executor: Executor | None = None
    workers: int | None = None
    chunks_per_worker: int = 3
    simulations: int = 0
    estimates: int = 0
    cache_hits: int = 0
    sim_seconds: float = 0.0
    wait_s: dict[str, float] = field(default_factory=lambda: {"simulate": 0.0, "screen": 0.0})
    _sim: dict[str, Evaluation] = field(default_factory=dict, repr=False)
    _est: dict[str, Evaluation] = field(default_factory=dict, repr=False)
    _plans: dict[str, Plan] = field(default_factory=dict, repr=False)
    _shipped: bool = field(default=False, repr=False)  # a batch has gone out with the problem's bytes
    # batches of simulations submitted and not yet settled, oldest first: (plans asked, futures by key)
    _in_flight: list[tuple[list[Plan], dict[str, Any]]] = field(default_factory=list, repr=False)
    soon_batches: int = 0  # batches of simulate_soon submitted
    settled_batches: int = 0  # of them, settled

    def __post_init__(self) -> None:
        self._key, self._blob = pickled(self.problem)
        _PROBLEMS[self._key] = _with_cache(self.problem)

    @property
    def parallelism(self) -> int:
        """Workers the executor runs at once (1 without an executor)."""
        if self.executor is None:
            return 1
        if not self.workers:
            from .parallel import executor_parallelism

            self.workers = executor_parallelism(self.executor)
        return self.workers

    def _run(self, fn, plans: Sequence[Plan], cache: dict, per_worker: int) -> tuple[list, int]:
        todo: dict[str, Plan] = {}
        keys = [plan_key(p) for p in plans]
        for k, p in zip(keys, plans):
            if k in cache:
                self.cache_hits += 1
            elif k not in todo:
                todo[k] = p
        if todo:
            pending = list(todo.values())
            if self.executor is None:
                outs = fn((self._key, self._blob, pending, self.parallelism))
            else:
                chunks = _chunks(pending, per_worker * self.parallelism)
                outs = _unchunk(chunks, self._map(fn, [[pending[i] for i in c] for c in chunks]), len(pending))
            for k, out in zip(todo, outs):
                cache[k] = out
                self._plans.setdefault(k, todo[k])
        return [cache[k] for k in keys], len(todo)

    def _map(self, fn, parts: list[list[Plan]]) -> list:
        """``fn`` of every part on the executor, in order. After the first batch the tasks carry
        the problem's key alone; a worker without the problem (new, or one that dropped it)
        answers :class:`~marssim.workercache.Missing` and gets its part again with the bytes."""
        blob = None if self._shipped else self._blob
        outs = list(self.executor.map(fn, [(self._key, blob, c, self.parallelism) for c in parts]))
        self._shipped = True
        again = [i for i, out in enumerate(outs) if isinstance(out, Missing)]
        if again:
            redone = self.executor.map(fn, [(self._key, self._blob, parts[i], self.parallelism) for i in again])
            for i, out in zip(again, redone):
                outs[i] = out
        return outs

    def simulate(self, plans: Sequence[Plan], *, side_by_side: bool = False) -> list[Evaluation]:
        """Simulated evaluations, in the order given. ``side_by_side``: one plan per task (long
        simulations, spread over the workers as evenly as they come). Simulations in flight
        (:meth:`simulate_soon`) are settled first."""
        if self._in_flight:
            self.settle()
        before = len(self._sim)
        t0 = time.perf_counter()
        out, n = self._run(_simulate_chunk, plans, self._sim, 1 if side_by_side else self.chunks_per_worker)
        self.wait_s["simulate"] += time.perf_counter() - t0
        self.simulations += n
        if n:
            self.sim_seconds += sum(e.wall_s for e in itertools.islice(self._sim.values(), before, None))
        return out

    def estimate(self, plans: Sequence[Plan]) -> list[Evaluation]:
        """Screened evaluations (see :func:`screen_plan`), in the order given."""
        t0 = time.perf_counter()
        out, n = self._run(_estimate_chunk, plans, self._est, self.chunks_per_worker)
        self.wait_s["screen"] += time.perf_counter() - t0
        self.estimates += n
        return out

    def simulate_soon(self, plans: Sequence[Plan]) -> None:
        """Simulations of ``plans`` submitted side by side without waiting for them (simulated
        at once without an executor): they count in ``simulations`` now, and join the cache, in
        the order submitted, when :meth:`settle_next` or :meth:`settle` takes them (a search
        screens its next generation meanwhile, on the workers the shorter ones free)."""
        if self.executor is None:
            self.simulate(plans, side_by_side=True)
            self.soon_batches += 1
            self.settled_batches += 1
            return
        futures: dict[str, Any] = {}
        for p in plans:
            k = plan_key(p)
            if k in self._sim or self.in_flight(p):
                self.cache_hits += 1  # as simulate() counts it, the batches before settled
                continue
            if k in futures:
                continue
            blob = None if self._shipped else self._blob
            futures[k] = (p, self.executor.submit(_simulate_chunk, (self._key, blob, [p], self.parallelism)))
            self._shipped = True
        self.simulations += len(futures)
        self._in_flight.append((list(plans), futures))
        self.soon_batches += 1

    def in_flight(self, plan: Plan) -> bool:
        """Whether ``plan``'s simulation was submitted and not yet settled."""
        k = plan_key(plan)
        return any(k in futures for _, futures in self._in_flight)

    def simulated_or_in_flight(self, plan: Plan) -> bool:
        """Whether ``plan`` was simulated, or its simulation is in flight (without waiting)."""
        return plan_key(plan) in self._sim or self.in_flight(plan)

    def settle_next(self) -> tuple[list[Plan], list[Evaluation]] | None:
        """The oldest batch of :meth:`simulate_soon` waited for and cached: its plans and their
        evaluations, in the order asked (None when nothing is in flight)."""
        if not self._in_flight:
            return None
        plans, futures = self._in_flight[0]
        t0 = time.perf_counter()
        for k, (p, future) in futures.items():
            out = future.result()
            if isinstance(out, Missing):  # a worker without the problem: again, with its bytes
                out = self.executor.submit(_simulate_chunk, (self._key, self._blob, [p], self.parallelism)).result()
            self._sim[k] = out[0]
            self._plans.setdefault(k, p)
            self.sim_seconds += out[0].wall_s
        self.wait_s["simulate"] += time.perf_counter() - t0
        self._in_flight.pop(0)  # taken once every result is in (an interrupted wait leaves it in flight)
        self.settled_batches += 1
        return plans, [self._sim[plan_key(p)] for p in plans]

    def settle(self) -> None:
        """Every batch in flight waited for and cached, oldest first."""
        while self.settle_next() is not None:
            pass

    def checkpoint(self) -> tuple:
        """What :meth:`rollback` returns to: the screens cached, the counters and the batches in
        flight now."""
        return (len(self._est), self.simulations, self.estimates, self.cache_hits, len(self._in_flight),
                self.soon_batches, self.settled_batches)

    def rollback(self, mark: tuple) -> None:
        """Forget what was evaluated since ``mark`` (:meth:`checkpoint`): screens cached since,
        and the batches submitted since, which must not have been settled (their simulations
        still running are left to finish unread). Simulations settled since that were in flight
        at ``mark`` are kept."""
        n_est, sims, ests, hits, n_flight, soon, settled = mark
        settled_since = self.settled_batches - settled
        submitted_since = self.soon_batches - soon
        if settled_since > n_flight:
            raise ValueError("a batch submitted after the checkpoint was settled")
        for _, futures in self._in_flight[len(self._in_flight) - submitted_since:]:
            for _, future in futures.values():
                future.cancel()
        del self._in_flight[len(self._in_flight) - submitted_since:]
        while len(self._est) > n_est:
            self._est.popitem()
        self.simulations, self.estimates, self.cache_hits, self.soon_batches = sims, ests, hits, soon

    def known(self, plan: Plan) -> Evaluation | None:
        """The cached simulated evaluation of ``plan``, if any (waiting for it when in flight)."""
        if self.in_flight(plan):
            self.settle()
        return self._sim.get(plan_key(plan))

    def screened(self, plan: Plan) -> Evaluation | None:
        """The cached screened evaluation of ``plan``, if any."""
        return self._est.get(plan_key(plan))

    def simulated_plans(self) -> list[tuple[Plan, Evaluation]]:
        """Every plan simulated so far with its evaluation, in the order they were simulated
        (those in flight waited for)."""
        if self._in_flight:
            self.settle()
        return [(self._plans[k], e) for k, e in self._sim.items()]

    def screened_plans(self) -> list[tuple[Plan, Evaluation]]:
        """Every plan screened so far with its evaluation, in the order they were screened."""
        return [(self._plans[k], e) for k, e in self._est.items()]
