"""The loop every two-level search shares; what differs between searches is a :class:`Strategy`.

MARS (DAC 2023) searches in two levels: level 1 evolves what runs where (for a per-op mapping:
accelerator sets, their designs and the layer segments; for a parallel configuration: pipeline
stages, their GPUs, layer counts and tensor-parallel degrees), level 2 picks, for each level-1
individual, the best communication choices (per-layer shardings; sequence parallelism,
micro-batch, schedule, recomputation, ZeRO) by the cheap screen and simulates the best. The
genome and the level-2 strategy differ between the two; this module holds what is the same:

* the seeds simulated first (the result is never worse than the best seed);
* per generation: the strategy's level 2 over the population (:meth:`Strategy.evaluate`), one
  history row, the progress callback, and the stopping rules: ``generations``, ``patience``
  generations without improvement, budgets in simulations and in evaluations (simulations and
  screens), a wall-time limit; then the next generation (:meth:`Strategy.breed`). Simulations a
  strategy leaves in flight (:meth:`~.evaluate.Evaluator.simulate_soon`) are waited for only
  where the stopping rule needs them (a generation whose screen did not improve, the last one);
  the rows wait for them, and come out the same as if every simulation had been waited for;
* the best plan: of every simulation the evaluator ran during the search (cached ones
  included), the smallest fitness at :data:`~marssim.search.evaluate.RANK_DIGITS` digits, ties
  to the smaller plan key;
* Ctrl-C: :class:`~marssim.search.result.SearchInterrupted` carrying the best plan so far.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import pandas as pd

from marssim.plan import Plan, plan_key
from marssim.progress import GenerationDone

from .evaluate import Evaluation, Evaluator, rank_value
from .result import Candidate, SearchInterrupted, SearchResult

__all__ = ["Budget", "Strategy", "two_level", "BestTracker", "candidates_of"]


@dataclass(frozen=True)
class Budget:
    """When a search stops: after ``generations``, after ``patience`` generations that improve
    nothing, or at the first generation past ``max_simulations`` simulations,
    ``max_evaluations`` simulations and screens together, or ``time_limit_s`` seconds of wall
    time (the result then depends on the machine's speed; the counts keep it reproducible)."""

    generations: int = 100
    patience: int = 20
    max_simulations: int | None = None
    max_evaluations: int | None = None
    time_limit_s: float | None = None


class Strategy(Protocol):
    """A search's genome and level 2 (see the module docstring)."""

    algorithm: str

    def initial(self, seeds: Sequence[Plan]) -> list[Any]:
        """The first population (individuals of the strategy's own type); the seeds have been
        simulated."""

    def evaluate(self, population: list[Any]) -> None:
        """Level 2 for the population: screen its choices, simulate the best."""

    def breed(self, population: list[Any]) -> list[Any]:
        """The next population."""

    def fitness(self, evaluation: Evaluation) -> float:
        """The value to minimise (the objective, with the search's constraints)."""

    def improved(self) -> bool:
        """Whether the last generation made progress the best simulated plan does not show."""

    def stats(self, population: list[Any]) -> dict[str, float]:
        """History columns of the population (e.g. its mean fitness)."""

    def finish(self) -> None:
        """After the last generation (e.g. simulate the best screened plan not yet simulated)."""


def _best_columns(strategy: Strategy, evaluation: Evaluation | None) -> dict[str, float]:
    """History columns of the best plan so far: the strategy's own (``best_columns``; a serving
    search's GPUs and rates), else its makespan (s)."""
    own = getattr(strategy, "best_columns", None)
    if own is not None:
        return own(evaluation)
    return {"best_makespan_s": evaluation.makespan if evaluation is not None else math.inf}


class BestTracker:
    """The best simulated plan among every evaluation the evaluator returns while attached
    (cached ones included): smallest fitness at 12 digits, ties to the smaller plan key."""

    def __init__(self, ev: Evaluator, fitness: Callable[[Evaluation], float]) -> None:
        self.ev = ev
        self.fitness = fitness
        self.best: tuple[float, str, Plan, Evaluation] | None = None
        self.after_batch: dict[int, tuple | None] = {}  # the best once each batch in flight was settled
        self._simulate = ev.simulate
        self._settle_next = ev.settle_next

        def simulate(plans: Sequence[Plan], **kwargs) -> list[Evaluation]:
            out = self._simulate(plans, **kwargs)
            for p, e in zip(plans, out):
                self.consider(p, e)
            return out

        def settle_next() -> tuple[list[Plan], list[Evaluation]] | None:
            got = self._settle_next()
            if got is not None:
                for p, e in zip(*got):
                    self.consider(p, e)
                self.after_batch[ev.settled_batches] = self.best
            return got

        ev.simulate = simulate  # type: ignore[method-assign]
        ev.settle_next = settle_next  # type: ignore[method-assign]

    def consider(self, plan: Plan, evaluation: Evaluation) -> None:
        f = self.fitness(evaluation)
        key = (rank_value(f), plan_key(plan))
        if self.best is None or key < (rank_value(self.best[0]), self.best[1]):
            self.best = (f, key[1], plan, evaluation)

    def detach(self) -> None:
        self.ev.simulate = self._simulate  # type: ignore[method-assign]
        self.ev.settle_next = self._settle_next  # type: ignore[method-assign]


def candidates_of(ev: Evaluator) -> list[Candidate]:
    """Every plan the evaluator screened or simulated, with both evaluations where it has them."""
    out: dict[str, Candidate] = {}
    for plan, e in ev.screened_plans():
        out[plan_key(plan)] = Candidate(plan, screened=e)
    for plan, e in ev.simulated_plans():
        k = plan_key(plan)
        out[k] = Candidate(plan, screened=out[k].screened if k in out else None, simulated=e)
    return list(out.values())


def two_level(strategy: Strategy, ev: Evaluator, budget: Budget, objective: str, *, seeds: Sequence[Plan] = (),
              seed: int = 0, progress: Callable[[GenerationDone], None] | None = None, notes: dict | None = None
              ) -> SearchResult:
    """Run ``strategy`` on ``ev`` until ``budget`` ends it (see the module docstring). Raises
    :class:`SearchInterrupted` on Ctrl-C once a plan has been simulated, ValueError when
    nothing was simulated at all."""
    t0 = time.perf_counter()
    sims0, est0 = ev.simulations, ev.estimates
    tracker = BestTracker(ev, strategy.fitness)
    rows: list[dict] = []

    def result(interrupted: bool) -> SearchResult:
        assert tracker.best is not None
        _, _, plan, evaluation = tracker.best
        extra = dict(notes or {}, cache_hits=ev.cache_hits,
                     timing={"screen_s": ev.wait_s["screen"], "simulate_s": ev.wait_s["simulate"],
                             "simulations_s": ev.sim_seconds})
        if interrupted:
            extra["interrupted"] = True
        cands = candidates_of(ev)
        rejected = sum(1 for c in cands if c.screened is not None and not c.screened.feasible)
        return SearchResult(strategy.algorithm, objective, plan, evaluation, pd.DataFrame(rows),
                            ev.simulations - sims0, ev.estimates - est0, time.perf_counter() - t0, seed, extra,
                            cands, rejected)

    def out_of_budget() -> bool:
        sims, ests = ev.simulations - sims0, ev.estimates - est0
        if budget.max_simulations is not None and sims >= budget.max_simulations:
            return True
        if budget.max_evaluations is not None and sims + ests >= budget.max_evaluations:
            return True
        return budget.time_limit_s is not None and time.perf_counter() - t0 >= budget.time_limit_s

    # history rows waiting for simulations in flight (Evaluator.simulate_soon): the row, and how
    # many batches were submitted by the end of its generation
    waiting: list[tuple[dict, int]] = []
    best_seen = math.inf

    def finish_rows() -> bool:
        """Settle the simulations in flight, finishing the waiting rows in order (best so far,
        progress callback); whether the last row's best improved on the rows before it."""
        nonlocal best_seen
        improved = False
        while waiting:
            row, batches = waiting.pop(0)
            while ev.settled_batches < batches:
                ev.settle_next()
            best = tracker.after_batch.get(batches, tracker.best)  # as it was when they were in
            row["best_fitness"] = best[0] if best else math.inf
            row.update(_best_columns(strategy, best[3] if best else None))
            rows.append(row)
            if progress is not None:
                rate = (row["simulations"] + row["estimates"]) / max(row["wall_s"], 1e-9)
                progress(GenerationDone(row["generation"], row["best_fitness"], row["simulations"], row["estimates"],
                                        row["wall_s"], rate, dict(row)))
            improved = best is not None and best[0] < best_seen * (1 - 1e-12)
            if improved:
                best_seen = best[0]
        return improved

    try:
        if seeds:
            ev.simulate(list(seeds))
        population = strategy.initial(seeds)
        stale = 0
        evaluated = False  # the population already evaluated (ahead, see below)
        for gen in range(budget.generations):
            if not evaluated:
                strategy.evaluate(population)
            wall = time.perf_counter() - t0
            sims, ests = ev.simulations - sims0, ev.estimates - est0
            waiting.append(({"generation": gen, "best_fitness": math.inf, **_best_columns(strategy, None),
                             **strategy.stats(population), "simulations": sims, "estimates": ests, "wall_s": wall},
                            ev.soon_batches))
            improved = strategy.improved()
            spent = out_of_budget()
            last = spent or gen == budget.generations - 1
            ahead = None
            # a generation whose screen improved is not stale whatever its simulations give: the
            # next one goes on while they run (its row is finished when they are settled)
            if ev.settled_batches == ev.soon_batches or not improved or last:
                if ev.settled_batches < ev.soon_batches and not last:
                    # whether to stop waits for simulations in flight: the next generation is
                    # evaluated meanwhile (on the workers they free), and forgotten if it stops
                    mark = ev.checkpoint()
                    ahead = strategy.breed(population)
                    strategy.evaluate(ahead)
                improved = finish_rows() or improved
            stale = 0 if improved else stale + 1
            if stale >= budget.patience or last:
                if ahead is not None:
                    ev.rollback(mark)
                break
            evaluated = ahead is not None
            population = ahead if evaluated else strategy.breed(population)
        finish_rows()
        strategy.finish()
        ev.settle()
    except KeyboardInterrupt:
        tracker.detach()
        if tracker.best is None:
            raise
        raise SearchInterrupted(result(True)) from None
    tracker.detach()
    if tracker.best is None:
        raise ValueError("the search simulated no plan")
    return result(False)
