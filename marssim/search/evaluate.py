"""Evaluate candidate mappings, in parallel on any ``concurrent.futures.Executor``, with caching.

A :class:`Problem` (graph, system, cost model) is pickled once; each task sends only the bytes
of the problem (unpickled once per worker process and kept) and one mapping. Results come back
in order, so a search is deterministic whatever the executor and the number of workers. Any
executor works: ``ProcessPoolExecutor``, ``ThreadPoolExecutor``, or a Dask cluster's
``Client.get_executor()``.
"""

from __future__ import annotations

import itertools
import math
import pickle
import time
from collections.abc import Sequence
from concurrent.futures import Executor
from dataclasses import dataclass, field

from marssim.cost.base import CostModel
from marssim.errors import CapacityError
from marssim.lower import LoweringCache
from marssim.mapping import Mapping
from marssim.system import System
from marssim.workercache import pickled, worker_copy
from marssim.workload import Graph

__all__ = ["OBJECTIVES", "RANK_DIGITS", "rank_value", "Problem", "Evaluation", "Evaluator", "evaluate_mapping",
           "estimate_mapping", "estimate_evaluation"]

OBJECTIVES = ("latency", "throughput", "energy", "edp")
"""``latency``: makespan of the batch; ``throughput``: steady-state samples/s (maximised);
``energy``: joules; ``edp``: energy-delay product (J*s). All are minimised as fitness."""


@dataclass(frozen=True)
class Problem:
    """What every evaluation needs: the workload, the system and the cost model."""

    graph: Graph
    system: System
    cost: CostModel
    memory_policy: str = "error"


RANK_DIGITS = 12
"""Significant digits of a fitness that ranking looks at. Equivalent mappings (a model on
accelerators 0-1 or on 1-2 of a symmetric ring) have fitnesses that differ only by rounding,
and rounding differs between machines; compared at 12 digits they tie, and the tie goes to the
smaller mapping key, so a seed's search is the same on every machine."""


def rank_value(fitness: float) -> float:
    """``fitness`` rounded to :data:`RANK_DIGITS` significant digits (inf and nan unchanged)."""
    if not math.isfinite(fitness) or fitness == 0.0:
        return fitness
    return round(fitness, RANK_DIGITS - 1 - math.floor(math.log10(abs(fitness))))


@dataclass(frozen=True)
class Evaluation:
    """The simulated outcome of one mapping (SI units). ``feasible`` is False when a memory
    overflows (``error`` names the device); such mappings have infinite fitness."""

    makespan: float
    throughput: float = float("nan")
    energy: float = float("nan")
    feasible: bool = True
    error: str = ""
    wall_s: float = 0.0

    def fitness(self, objective: str = "latency") -> float:
        """The value to minimise for ``objective``."""
        if not self.feasible:
            return math.inf
        if objective == "latency":
            return self.makespan
        if objective == "throughput":
            return 1.0 / self.throughput if self.throughput > 0 else math.inf
        if objective == "energy":
            return self.energy if self.energy == self.energy else math.inf
        if objective == "edp":
            return self.energy * self.makespan if self.energy == self.energy else math.inf
        raise ValueError(f"unknown objective {objective!r}; expected one of {', '.join(OBJECTIVES)}")


def evaluate_mapping(problem: Problem, mapping: Mapping, cache: LoweringCache | None = None) -> Evaluation:
    """Lower and simulate one mapping (headline numbers only: no interval log, no set-up run);
    the numbers equal those of a full :func:`marssim.sim.simulate` of the same mapping.
    ``cache``: a :class:`~marssim.lower.LoweringCache` for the problem's graph, system and cost."""
    from marssim.lower import lower
    from marssim.sim import simulate_summary

    t0 = time.perf_counter()
    try:
        tg = lower(problem.graph, problem.system, mapping, problem.cost, validate=False, cache=cache)
        r = simulate_summary(tg, problem.system, memory_policy=problem.memory_policy)
    except CapacityError as err:
        return Evaluation(math.inf, feasible=False, error=str(err), wall_s=time.perf_counter() - t0)
    return Evaluation(r.makespan, r.throughput, r.energy, wall_s=time.perf_counter() - t0)


def estimate_mapping(problem: Problem, mapping: Mapping, cache: LoweringCache | None = None) -> float:
    """Contention-free analytical makespan (s) of one mapping (see :mod:`marssim.analytical`)."""
    return estimate_evaluation(problem, mapping, cache).makespan


def estimate_evaluation(problem: Problem, mapping: Mapping, cache: LoweringCache | None = None) -> Evaluation:
    """The contention-free analytical estimate (see :mod:`marssim.analytical`) of one mapping,
    as an :class:`Evaluation`: estimated makespan and throughput, and the compute energy (the
    same as simulated: it does not depend on the schedule). Memory capacity is not checked."""
    from marssim.analytical import estimate
    from marssim.lower import lower
    from marssim.results.summary import summarise

    t0 = time.perf_counter()
    tg = lower(problem.graph, problem.system, mapping, problem.cost, validate=False, cache=cache)
    est = estimate(tg, problem.system)
    r = summarise(tg, problem.system, est.end)
    return Evaluation(float(est.makespan), r.throughput, r.energy, wall_s=time.perf_counter() - t0)


# ---------------------------------------------------------------------- worker side
_PROBLEMS: dict[str, tuple[Problem, LoweringCache]] = {}


def _problem(key: str, blob: bytes | None) -> tuple[Problem, LoweringCache]:
    """The problem of ``key`` in this process (unpickled from ``blob`` on first use) and the
    lowering cache every evaluation of it shares."""
    return worker_copy(_PROBLEMS, key, blob, build=lambda b: _with_cache(pickle.loads(b)), keep=5)


def _with_cache(problem: Problem) -> tuple[Problem, LoweringCache]:
    from marssim.lower import LoweringCache

    return problem, LoweringCache(problem.graph, problem.system, problem.cost)


def _simulate_chunk(args: tuple[str, bytes, list[Mapping]]) -> list[Evaluation]:
    key, blob, mappings = args
    problem, cache = _problem(key, blob)
    return [evaluate_mapping(problem, m, cache) for m in mappings]


def _estimate_chunk(args: tuple[str, bytes, list[Mapping]]) -> list[Evaluation]:
    key, blob, mappings = args
    problem, cache = _problem(key, blob)
    return [estimate_evaluation(problem, m, cache) for m in mappings]


def _chunks(items: list, parts: int) -> list[list]:
    """``items`` dealt round-robin into at most ``parts`` chunks (neighbouring candidates, often
    alike in cost, land in different chunks, which balances the workers)."""
    parts = max(1, min(parts, len(items)))
    return [items[i::parts] for i in range(parts)]


def _unchunk(chunks: list[list]) -> list:
    """The inverse of :func:`_chunks`: the items in their original order."""
    out = []
    for i in range(max((len(c) for c in chunks), default=0)):
        out.extend(c[i] for c in chunks if i < len(c))
    return out


@dataclass
class Evaluator:
    """Cached, optionally parallel evaluation of mappings for one problem.

    ``executor``: any ``concurrent.futures.Executor`` (None: evaluate in this process). A batch
    is dealt into three chunks per worker (``workers``: how many the executor runs at once;
    read from the executor when not given, see
    :func:`~marssim.search.parallel.executor_parallelism`), each carrying the pickled problem,
    so per-task overheads do not dominate small simulations. Results come back in the order
    given, whatever the executor. Counters: ``simulations`` and ``estimates`` run (cache misses), ``cache_hits``."""

    problem: Problem
    executor: Executor | None = None
    workers: int | None = None
    simulations: int = 0
    estimates: int = 0
    cache_hits: int = 0
    sim_seconds: float = 0.0
    _sim: dict[str, Evaluation] = field(default_factory=dict, repr=False)
    _est: dict[str, float] = field(default_factory=dict, repr=False)

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

    def _run(self, fn, mappings: Sequence[Mapping], cache: dict) -> tuple[list, int]:
        todo: dict[str, Mapping] = {}
        for m in mappings:
            if m.key in cache:
                self.cache_hits += 1
            elif m.key not in todo:
                todo[m.key] = m
        if todo:
            pending = list(todo.values())
            if self.executor is None or len(pending) == 1:
                outs = fn((self._key, self._blob, pending))
            else:
                parts = _chunks(pending, 3 * self.parallelism)
                outs = _unchunk(list(self.executor.map(fn, [(self._key, self._blob, c) for c in parts])))
            for k, out in zip(todo, outs):
                cache[k] = out
        return [cache[m.key] for m in mappings], len(todo)

    def simulate(self, mappings: Sequence[Mapping]) -> list[Evaluation]:
        """Simulated evaluations, in the order given."""
        before = len(self._sim)
        out, n = self._run(_simulate_chunk, mappings, self._sim)
        self.simulations += n
        if n:
            self.sim_seconds += sum(e.wall_s for e in itertools.islice(self._sim.values(), before, None))
        return out

    def estimate(self, mappings: Sequence[Mapping]) -> list[Evaluation]:
        """Analytical estimates (see :func:`estimate_evaluation`), in the order given."""
        out, n = self._run(_estimate_chunk, mappings, self._est)
        self.estimates += n
        return out

    def known(self, mapping: Mapping) -> Evaluation | None:
        """The cached simulated evaluation of ``mapping``, if any."""
        return self._sim.get(mapping.key)
