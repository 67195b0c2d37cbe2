"""What the two-level strategies share of a generation: level 2 as coordinate descent over the
screen, and the next population by elitism and tournaments. A strategy gives its own genome, its
coordinates and its ranking; the loops, their order and the constants are here once.

* :func:`coordinate_descent`: for every individual, one coordinate (gene) at a time, every value
  the coordinate can take; the trials of every individual for that coordinate screened as one
  batch (one call of ``screen``), each individual keeping its best trial; at most ``rounds``
  rounds, an individual whose round changed nothing dropping out;
* :func:`next_population`: the best quarter of the ranked individuals kept (:data:`ELITE_SHARE`),
  the rest children of two tournaments of two, crossed over and mutated with probability
  :data:`MUTATION_PROBABILITY`, a child whose level 1 was already tried mutated again (at most
  :data:`RETRIES` times): its screen would only be looked up.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from typing import Any, TypeVar

__all__ = ["coordinate_descent", "next_population", "ELITE_SHARE", "MUTATION_PROBABILITY", "RETRIES",
           "DESCENT_ROUNDS"]

G = TypeVar("G")
ELITE_SHARE = 4
"""One individual in this many of a population (at least one) is kept as it is."""
MUTATION_PROBABILITY = 0.8
"""The chance a child is mutated after its crossover."""
RETRIES = 8
"""The most times a child whose level 1 was already tried is mutated again."""
DESCENT_ROUNDS = 2
"""Rounds of coordinate descent in level 2."""


def coordinate_descent(start: Sequence[G], coordinates: Callable[[list[G]], Sequence[Any]],
                       options: Callable[[G, Any], Sequence[tuple[G, Any]]],
                       screen: Callable[[list[Any]], Sequence[Any]],
                       rank: Callable[[Any, Any], tuple], rounds: int = DESCENT_ROUNDS) -> list[G]:
    """The best individual reached from each of ``start`` (see the module docstring).

    ``coordinates(best)``: the coordinates of a round, given the individuals at its start;
    ``options(g, c)``: ``(individual, plan)`` for each value coordinate ``c`` can take in ``g``
    (none: ``g`` skips the coordinate); ``screen(plans)``: their evaluations, in order;
    ``rank(plan, evaluation)``: the sort key, smallest best (ties: the first option)."""
    best = list(start)
    active = [True] * len(best)
    for _ in range(rounds):
        changed = [False] * len(best)
        for coordinate in coordinates(best):
            trials: list[tuple[int, Sequence[tuple[G, Any]]]] = []
            batch: list[Any] = []
            for i, g in enumerate(best):
                if not active[i]:
                    continue
                choices = options(g, coordinate)
                if choices:
                    trials.append((i, choices))
                    batch.extend(plan for _, plan in choices)
            evals = iter(screen(batch))
            for i, choices in trials:
                ranked = sorted(((g, rank(plan, next(evals))) for g, plan in choices), key=lambda x: x[1])
                if ranked[0][0] != best[i]:
                    best[i], changed[i] = ranked[0][0], True
        active = [a and c for a, c in zip(active, changed)]
        if not any(active):
            break
    return best


def next_population(ranked: Sequence[G], size: int, rng, crossover: Callable[[G, G], G],
                    mutate: Callable[[G], G], level1: Callable[[G], Hashable], tried: set) -> list[G]:
    """The next population of ``size`` from individuals ranked best first (see the module
    docstring); ``rng``: a numpy Generator; ``tried``: the level-1 genes tried so far (updated)."""
    out = list(dict.fromkeys(ranked[:max(1, size // ELITE_SHARE)]))
    while len(out) < size:
        i, j = rng.integers(len(ranked), size=2)
        a = ranked[min(i, j)]  # tournament of two: the better one
        k, m = rng.integers(len(ranked), size=2)
        b = ranked[min(k, m)]
        child = crossover(a, b)
        if rng.random() < MUTATION_PROBABILITY:
            child = mutate(child)
        for _ in range(RETRIES):
            if level1(child) not in tried:
                break
            child = mutate(child)
        tried.add(level1(child))
        out.append(child)
    return out
