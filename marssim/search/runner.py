"""Run a search algorithm by name, and compare them all on one case (what the CLI verbs call).

``mars`` is seeded with the ``data_parallel`` and ``h2h`` baselines by default, so it never
returns a mapping worse than either: both are cheap next to the GA (data_parallel simulates
one mapping per design; H2H's list scheduling costs no simulation and its refinement at most
``max_moves`` = 200 plus one per micro-batch count, against the GA's default budget of 3,000
evaluations), and H2H's mappings (every layer on one accelerator) are points of the GA's space,
so the GA starts from them and improves on them, which matters most on systems of different
fixed accelerators. ``random`` gets the simulation budget it is given (in
:func:`compare`: as many simulations as ``mars`` ran evaluations, simulated or estimated, so
random search is never given less to spend than the GA); ``exhaustive`` runs only on spaces of
at most ``exhaustive_limit`` points.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Executor
from dataclasses import dataclass, replace

import pandas as pd

from marssim.cost.base import CostModel
from marssim.plan.kinds import KINDS, PlanKind
from marssim.progress import GenerationDone, SearchDone, SearchStarted
from marssim.system import System
from marssim.workload import Graph

from .baselines import count_space, data_parallel, exhaustive, h2h, random_search
from .evaluate import Evaluator, Problem
from .ga import GAConfig, mars
from .result import SearchResult
from .space import MappingSpace

__all__ = ["ALGORITHMS", "RANDOM_BUDGET", "SEED_BASELINES", "SearchSettings", "run_algorithm", "compare"]

ALGORITHMS = KINDS[PlanKind.MAPPING].algorithms
"""The searches of a per-op mapping (:mod:`marssim.plan.kinds`)."""
RANDOM_BUDGET = 200
"""Simulations of ``random`` when no budget is given."""
SEED_BASELINES = ("data_parallel", "h2h")
"""The baselines that seed the GA by default."""


@dataclass(frozen=True)
class SearchSettings:
    """What a user sets for a search. ``budget``: most simulations (mars, random; None: the GA's
    own stopping rules, or :data:`RANDOM_BUDGET` for random); ``config``: GA parameters (a
    ``budget`` replaces its ``max_simulations`` and lifts its ``max_evaluations``, so the
    budget given is the one that applies); ``seed_with``: baselines whose
    mappings seed the GA (by default both baselines; see the module's docstring);
    ``exhaustive_limit``: largest space exhaustive enumerates."""

    objective: str = "latency"
    budget: int | None = None
    config: GAConfig = GAConfig()
    seed: int = 0
    seed_with: tuple[str, ...] = SEED_BASELINES
    exhaustive_limit: int = 20_000

    def ga_config(self) -> GAConfig:
        if self.budget is None:
            return self.config
        return replace(self.config, max_simulations=self.budget, max_evaluations=None)


def _space(graph: Graph, system: System, cfg: GAConfig) -> MappingSpace:
    return MappingSpace(graph, system, max_sets=cfg.max_sets, micro_batch_choices=cfg.micro_batch_choices,
                        strategies=cfg.strategies)


def run_algorithm(name: str, graph: Graph, system: System, cost: CostModel, settings: SearchSettings, *,
                  executor: Executor | None = None, progress: Callable[[GenerationDone], None] | None = None,
                  baselines: dict[str, SearchResult] | None = None) -> SearchResult:
    """Run algorithm ``name`` (one of :data:`ALGORITHMS`) with its own evaluation cache.
    ``baselines``: results of baselines already run on this case, used as the GA's seeds
    instead of running them again. Raises ValueError for an unknown name or an exhaustive
    search of a too large space."""
    if name not in ALGORITHMS:
        raise ValueError(f"unknown algorithm {name!r}; expected one of {', '.join(ALGORITHMS)}")
    objective = settings.objective
    ev = Evaluator(Problem(graph, system, cost), executor)
    if name == "data_parallel":
        return data_parallel(graph, system, cost, objective=objective, evaluator=ev)
    if name == "h2h":
        return h2h(graph, system, cost, objective=objective, evaluator=ev)
    cfg = settings.ga_config()
    space = _space(graph, system, cfg)
    if name == "random":
        return random_search(graph, system, cost, budget=settings.budget or RANDOM_BUDGET, seed=settings.seed,
                             objective=objective, evaluator=ev, space=space)
    if name == "exhaustive":
        return exhaustive(graph, system, cost, objective=objective, evaluator=ev, space=space,
                          limit=settings.exhaustive_limit)
    seeds = []
    seed_simulations = 0
    for base in settings.seed_with:
        if base not in ("data_parallel", "h2h"):
            raise ValueError(f"cannot seed the GA with {base!r}; expected data_parallel or h2h")
        done = (baselines or {}).get(base)
        if done is None or done.objective != objective:
            done = run_algorithm(base, graph, system, cost, settings, executor=executor)
            seed_simulations += done.simulations
        seeds.append(done.best)
    result = mars(graph, system, cost, config=cfg, seed=settings.seed, objective=objective, seeds=seeds,
                  evaluator=ev, space=space, progress=progress)
    result.notes["seeded_with"] = tuple(settings.seed_with)
    result.notes["seed_simulations"] = seed_simulations
    return result


def compare(graph: Graph, system: System, cost: CostModel, settings: SearchSettings, *,
            executor: Executor | None = None,
            progress: Callable[[SearchStarted | SearchDone], None] | None = None
            ) -> tuple[pd.DataFrame, dict[str, SearchResult]]:
    """Run data_parallel, h2h, mars (seeded with the baselines' results, not run again),
    random (simulating as many mappings as mars evaluated, counting its estimates) and, when the
    space has at most ``exhaustive_limit`` points, exhaustive, each with its own cache.

    Returns ``(table, results)``: one row per algorithm with ``makespan_ms``, ``fitness``,
    ``vs_data_parallel_pct`` (negative: lower latency than data_parallel), ``simulations``,
    ``estimates``, ``wall_s``; ``progress`` is called with a :class:`~marssim.progress.SearchStarted` before each
    and a :class:`~marssim.progress.SearchDone` after."""
    results: dict[str, SearchResult] = {}
    order = ["data_parallel", "h2h", "mars", "random"]
    if count_space(_space(graph, system, settings.ga_config()), settings.exhaustive_limit) <= settings.exhaustive_limit:
        order.append("exhaustive")
    for name in order:
        if progress:
            progress(SearchStarted(name))
        run_settings = settings
        if name == "random":
            run_settings = replace(settings, budget=max(1, results["mars"].simulations + results["mars"].estimates))
        results[name] = run_algorithm(name, graph, system, cost, run_settings, executor=executor, baselines=results)
        if progress:
            progress(SearchDone(name, results[name]))
    base = results["data_parallel"].fitness
    rows = []
    for name, r in results.items():
        rows.append({"algorithm": name, "makespan_ms": r.makespan * 1e3, "fitness": r.fitness,
                     "vs_data_parallel_pct": (r.fitness / base - 1.0) * 100.0 if base > 0 else float("nan"),
                     "simulations": r.simulations, "estimates": r.estimates, "wall_s": r.wall_s})
    return pd.DataFrame(rows), results
