"""Simulated annealing over legal schedules, as in the SIP paper.

Start at temperature ``t0``; each step proposes one legal move (SIP's memory-instruction move
or a general adjacent swap), measures the candidate (``measure(order) -> seconds``) and accepts
it if it is faster, or, if slower by a relative ``delta``, with probability ``exp(-delta / T)``.
A candidate that would be accepted must also pass ``check(order) -> bool`` (its outputs match
the original kernel's); one that fails is rejected and counted. The temperature is multiplied by
``1 - cooling`` per step and the run stops once it is at most ``t_min`` (0.4 -> 0.05 at 0.003
per step is 693 steps) or when no legal move is left. Several seeds run independently and the
fastest checked schedule over all of them wins.

``measure`` and ``check`` are injected: the GPU timer and output comparison in
:mod:`.tune`, a synthetic cost in tests. Everything is deterministic for a given seed and
deterministic callables.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from .deps import Legality
from .perturb import MOVE_KINDS, apply_swap, random_move

__all__ = ["AnnealConfig", "AnnealRun", "AnnealResult", "anneal", "anneal_seeds", "steps_for"]


@dataclass(frozen=True, slots=True)
class AnnealConfig:
    """Annealing parameters: initial temperature, multiplicative cooling per step, stop
    temperature, move kind (``sip`` or ``swap``) and an optional cap on steps."""

    t0: float = 0.4
    cooling: float = 0.003
    t_min: float = 0.05
    move: str = "sip"
    max_steps: int | None = None

    def __post_init__(self) -> None:
        if not (self.t0 > 0 and 0 < self.cooling < 1 and 0 < self.t_min < self.t0):
            raise ValueError("expected t0 > t_min > 0 and 0 < cooling < 1")
        if self.move not in MOVE_KINDS:
            raise ValueError(f"move must be one of {MOVE_KINDS}")


def steps_for(config: AnnealConfig) -> int:
    """Number of steps until the temperature reaches ``t_min`` (capped by ``max_steps``)."""
    n = math.ceil(math.log(config.t_min / config.t0) / math.log(1.0 - config.cooling))
    return n if config.max_steps is None else min(n, config.max_steps)


@dataclass(frozen=True)
class AnnealRun:
    """One seed's outcome: the best checked schedule, its time, the swaps that reach it from the
    original order, and counters (steps, accepted, rejected by the checker, no legal move)."""

    seed: int
    best_order: tuple[int, ...]
    best_time: float
    best_swaps: tuple[int, ...]
    initial_time: float
    steps: int
    accepted: int
    check_failures: int
    history: tuple[float, ...] = field(repr=False, default=())


@dataclass(frozen=True)
class AnnealResult:
    """All seeds' runs and the overall best."""

    runs: tuple[AnnealRun, ...]

    @property
    def best(self) -> AnnealRun:
        return min(self.runs, key=lambda r: (r.best_time, r.seed))


def anneal(legality: Legality, measure: Callable[[tuple[int, ...]], float],
           check: Callable[[tuple[int, ...]], bool], config: AnnealConfig = AnnealConfig(), seed: int = 0,
           initial: Sequence[int] | None = None,
           progress: Callable[[int, int, float, float, float], None] | None = None) -> AnnealRun:
    """One annealing run from ``initial`` (default: the original order).

    ``progress(step, total, temperature, current_time, best_time)`` is called after every step.
    Only legal moves are proposed and only checked schedules become current or best, so the
    returned schedule is legal (reachable by ``best_swaps``, each legal when applied) and passed
    ``check`` (or is the initial schedule)."""
    rng = random.Random(seed)
    order = tuple(range(len(legality.insns))) if initial is None else tuple(initial)
    total = steps_for(config)
    current_time = measure(order)
    initial_time = current_time
    best_order, best_time = order, current_time
    path: list[int] = []
    best_path: tuple[int, ...] = ()
    temperature = config.t0
    accepted = failures = steps = 0
    history = [current_time]
    for step in range(total):
        move = random_move(rng, legality, order, config.move)
        if move is None:
            break
        steps += 1
        candidate = apply_swap(order, move.pos)
        t = measure(candidate)
        delta = (t - current_time) / current_time
        take = delta < 0 or rng.random() < math.exp(-delta / temperature)
        if take:
            if check(candidate):
                order, current_time = candidate, t
                path.append(move.pos)
                accepted += 1
                if t < best_time:
                    best_order, best_time, best_path = order, t, tuple(path)
            else:
                failures += 1
        history.append(current_time)
        temperature *= 1.0 - config.cooling
        if progress is not None:
            progress(step + 1, total, temperature, current_time, best_time)
    return AnnealRun(seed, best_order, best_time, best_path, initial_time, steps, accepted, failures, tuple(history))


def anneal_seeds(legality: Legality, measure: Callable[[tuple[int, ...]], float],
                 check: Callable[[tuple[int, ...]], bool], seeds: Sequence[int],
                 config: AnnealConfig = AnnealConfig(),
                 progress: Callable[[int, int, int, float, float, float], None] | None = None) -> AnnealResult:
    """:func:`anneal` once per seed, each from the original order; ``progress`` gets the seed
    first."""
    runs = []
    for seed in seeds:
        cb = None if progress is None else (lambda *a, _s=seed: progress(_s, *a))
        runs.append(anneal(legality, measure, check, config, seed, progress=cb))
    return AnnealResult(tuple(runs))
