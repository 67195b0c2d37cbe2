"""Evaluate candidate mappings, in parallel on any ``concurrent.futures.Executor``, with caching.

A :class:`Problem` (graph, system, cost model) is pickled once; each task sends only the bytes
of the problem (unpickled once per worker process and kept) and one mapping. Results come back
in order, so a search is deterministic whatever the executor and the number of workers. Any
executor works: ``ProcessPoolExecutor``, ``ThreadPoolExecutor``, or a Dask cluster's
``Client.get_executor()``.
"""

from __future__ import annotations

import hashlib
import math
import pickle
import time
from collections.abc import Sequence
from concurrent.futures import Executor
from dataclasses import dataclass, field

from marssim.cost.base import CostModel
from marssim.errors import CapacityError
from marssim.mapping import Mapping
from marssim.system import System
from marssim.workload import Graph

__all__ = ["OBJECTIVES", "Problem", "Evaluation", "Evaluator", "evaluate_mapping", "estimate_mapping"]

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


def evaluate_mapping(problem: Problem, mapping: Mapping) -> Evaluation:
    """Lower and simulate one mapping (no timelines, no set-up run)."""
    from marssim.lower import lower
    from marssim.sim import simulate

    t0 = time.perf_counter()
    try:
        tg = lower(problem.graph, problem.system, mapping, problem.cost, validate=False)
        r = simulate(tg, problem.system, memory_policy=problem.memory_policy, record=False, setup=False)
    except CapacityError as err:
        return Evaluation(math.inf, feasible=False, error=str(err), wall_s=time.perf_counter() - t0)
    return Evaluation(r.makespan, r.throughput, r.energy, wall_s=time.perf_counter() - t0)


def estimate_mapping(problem: Problem, mapping: Mapping) -> float:
    """Contention-free analytical makespan (s) of one mapping (see :mod:`marssim.analytical`)."""
    from marssim.analytical import estimate
    from marssim.lower import lower

    tg = lower(problem.graph, problem.system, mapping, problem.cost, validate=False)
    return float(estimate(tg, problem.system).makespan)


# ---------------------------------------------------------------------- worker side
_PROBLEMS: dict[str, Problem] = {}


def _problem(key: str, blob: bytes) -> Problem:
    problem = _PROBLEMS.get(key)
    if problem is None:
        if len(_PROBLEMS) > 4:
            _PROBLEMS.clear()
        problem = _PROBLEMS[key] = pickle.loads(blob)
    return problem


def _simulate_task(args: tuple[str, bytes, Mapping]) -> Evaluation:
    key, blob, mapping = args
    return evaluate_mapping(_problem(key, blob), mapping)


def _estimate_task(args: tuple[str, bytes, Mapping]) -> float:
    key, blob, mapping = args
    return estimate_mapping(_problem(key, blob), mapping)


@dataclass
class Evaluator:
    """Cached, optionally parallel evaluation of mappings for one problem.

    ``executor``: any ``concurrent.futures.Executor`` (None: evaluate in this process).
    Counters: ``simulations`` and ``estimates`` run (cache misses), ``cache_hits``."""

    problem: Problem
    executor: Executor | None = None
    simulations: int = 0
    estimates: int = 0
    cache_hits: int = 0
    sim_seconds: float = 0.0
    _sim: dict[str, Evaluation] = field(default_factory=dict, repr=False)
    _est: dict[str, float] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        self._blob = pickle.dumps(self.problem, protocol=pickle.HIGHEST_PROTOCOL)
        self._key = hashlib.sha1(self._blob).hexdigest()
        _PROBLEMS[self._key] = self.problem

    def _run(self, fn, mappings: Sequence[Mapping], cache: dict) -> list:
        todo: dict[str, Mapping] = {}
        for m in mappings:
            if m.key in cache:
                self.cache_hits += 1
            elif m.key not in todo:
                todo[m.key] = m
        if todo:
            items = [(self._key, self._blob, m) for m in todo.values()]
            if self.executor is None or len(items) == 1:
                outs = [fn(item) for item in items]
            else:
                outs = list(self.executor.map(fn, items))
            for k, out in zip(todo, outs):
                cache[k] = out
        return [cache[m.key] for m in mappings], len(todo)

    def simulate(self, mappings: Sequence[Mapping]) -> list[Evaluation]:
        """Simulated evaluations, in the order given."""
        out, n = self._run(_simulate_task, mappings, self._sim)
        self.simulations += n
        return out

    def estimate(self, mappings: Sequence[Mapping]) -> list[float]:
        """Analytical makespans (s), in the order given."""
        out, n = self._run(_estimate_task, mappings, self._est)
        self.estimates += n
        return out

    def known(self, mapping: Mapping) -> Evaluation | None:
        """The cached simulated evaluation of ``mapping``, if any."""
        return self._sim.get(mapping.key)
