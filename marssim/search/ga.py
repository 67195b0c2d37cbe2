"""MARS: a two-level genetic algorithm over the mapping space (DAC 2023).

Level 1 (outer) evolves the accelerator sets, their designs, the layer segments and the
micro-batches (:class:`~marssim.search.space.Genome` without its shardings). Level 2 (inner)
evolves, for each outer individual, the sharding of every layer. Both levels use tournament
selection, uniform (outer) or two-point (inner) crossover and per-gene mutation, drawn from one
seeded ``numpy`` generator. DEAP's operators were the first choice, but they draw from the
process-wide ``random`` module, which a Dask client in the same process also draws from while
it schedules: the search was not reproducible under ``--dask``. The operators are a few lines
each; the loop around them is written here because the two levels nest and every generation's
candidates are evaluated as one batch on an executor.

* **Computation-aware accelerator selection**: a table of each layer's time on each design
  (cost model, one device) seeds individuals whose sets take the design that is fastest for
  the layers they get, and a mutation re-selects a set's design that way.
* **Communication-aware sharding**: the inner level scores candidates by the contention-free
  analytical estimate of the lowered TaskGraph (cheap), then simulates the best few; the
  fitness of every individual, and of everything returned, is simulated.
* Elitism, a seed and full determinism, fitness cached by mapping hash, early stop after
  ``patience`` generations without improvement, and an optional simulation budget.
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass, replace
from functools import cached_property

import numpy as np
import pandas as pd

from marssim.cost.base import CostModel
from marssim.mapping import Mapping
from marssim.system import System
from marssim.workload import Graph

from .evaluate import OBJECTIVES, Evaluation, Evaluator, Problem
from .result import SearchResult
from .space import Genome, MappingSpace

__all__ = ["GAConfig", "mars", "design_table", "analytical_available"]


def analytical_available() -> bool:
    """True when :mod:`marssim.analytical` (the screening estimate) can be imported."""
    import importlib.util

    try:
        return importlib.util.find_spec("marssim.analytical") is not None
    except (ImportError, ValueError):
        return False


@dataclass(frozen=True)
class GAConfig:
    """Parameters of the two-level GA. The defaults are sized so that a ResNet-50 (batch 8) on
    the 16 accelerators of ``mars-adaptive-16`` finishes within 3 minutes on 2 cores
    (``analysis/bench_search.py``). Probabilities are per individual unless named per gene.

    population, generations: outer (level-1) individuals and generations. inner_population,
    inner_generations: sharding vectors per outer individual and their generations (each
    generation is one batch of evaluations). elites: outer individuals carried over (their inner
    search continues). tournament: tournament size at both levels. patience: generations without
    improvement before stopping. simulate_top: per outer individual, how many of the best inner
    candidates (by the analytical estimate) are simulated. max_sets, micro_batch_choices,
    strategies: the mapping space (see :class:`~marssim.search.space.MappingSpace`).
    max_simulations, time_limit_s: stop at the first generation past either. screen: rank inner
    candidates by the analytical estimate of the objective (when :mod:`marssim.analytical` is
    missing, or with ``screen=False``, they are simulated)."""

    population: int = 12
    generations: int = 10
    inner_population: int = 8
    inner_generations: int = 3
    crossover: float = 0.9
    gene_mutation: float = 0.05  # per gene (cut, layer strategy)
    operator_mutation: float = 0.3  # each level-1 mutation operator, per individual
    elites: int = 2
    tournament: int = 3
    patience: int = 4
    simulate_top: int = 2
    max_sets: int | None = None
    micro_batch_choices: tuple[int, ...] = (1, 2, 4, 8)
    strategies: tuple[str, ...] | None = None
    max_simulations: int | None = None
    time_limit_s: float | None = None
    screen: bool = True


UNIFORM_PREFERENCES = (("dp",), ("spatial", "seq", "dp"), ("oc", "dp"), ("head", "seq", "dp"))
"""Starting points of every inner population: data parallel everywhere; rows of images and
tokens of sequences; output channels; attention heads (else tokens)."""


class _Individual:
    """An outer-level individual: its genome, and once evaluated its fitness (to minimise),
    simulated evaluation and the mapping that achieved it."""

    __slots__ = ("genome", "fitness", "evaluation", "mapping")

    def __init__(self, genome: Genome) -> None:
        self.genome = genome
        self.fitness: float | None = None
        self.evaluation: Evaluation | None = None
        self.mapping: Mapping | None = None

    def rank_key(self) -> tuple[float, str]:
        assert self.fitness is not None and self.mapping is not None
        return self.fitness, self.mapping.key


# ---------------------------------------------------------------------- variation operators
def tournament(rng: np.random.Generator, keys: Sequence, k: int, size: int) -> list[int]:
    """``k`` winners (indices) of tournaments among ``size`` individuals drawn with replacement;
    the smallest key wins."""
    n = len(keys)
    return [int(min(rng.integers(n, size=size), key=lambda i: (keys[i], i))) for _ in range(k)]


def cx_uniform(rng: np.random.Generator, a: list, b: list, p: float = 0.5) -> None:
    """Swap each position of ``a`` and ``b`` (up to the shorter length) with probability ``p``."""
    for i in range(min(len(a), len(b))):
        if rng.random() < p:
            a[i], b[i] = b[i], a[i]


def cx_two_point(rng: np.random.Generator, a: list, b: list) -> None:
    """Swap the segment between two random cut points of ``a`` and ``b`` (equal lengths)."""
    size = min(len(a), len(b))
    if size < 2:
        return
    i, j = sorted(int(x) for x in rng.choice(size + 1, size=2, replace=False))
    a[i:j], b[i:j] = b[i:j], a[i:j]


def flip_bits(rng: np.random.Generator, bits: Sequence[bool], p: float) -> list[bool]:
    """Each bit flipped with probability ``p``."""
    return [not x if rng.random() < p else bool(x) for x in bits]


def design_table(graph: Graph, system: System, cost: CostModel) -> tuple[tuple[str, ...], np.ndarray]:
    """Seconds each layer takes on one device of each design: ``(design names, array [layer, design])``."""
    names = tuple(system.designs)
    table = np.full((len(graph.layers), len(names)), np.inf)
    for j, name in enumerate(names):
        host = next((a.id for a in system.accelerators if name in a.designs), None)
        if host is None:
            continue
        design = system.design(host, name)
        for i, layer in enumerate(graph.layers):
            table[i, j] = sum(cost.op_time(graph.ops[k], design) for k in layer)
    return names, table


class _MARS:
    def __init__(self, space: MappingSpace, ev: Evaluator, cfg: GAConfig, rng: np.random.Generator,
                 objective: str, table: tuple[tuple[str, ...], np.ndarray]) -> None:
        self.space = space
        self.ev = ev
        self.cfg = cfg
        self.rng = rng
        self.objective = objective
        self.design_names, self.design_times = table
        self.best: tuple[float, Mapping, Evaluation] | None = None
        self.inner_pops: dict[tuple, list[tuple[str, ...]]] = {}
        self.refine: list[_Individual] = []  # elites whose inner search continues next generation
        self.t0 = time.perf_counter()
        self.sims0 = ev.simulations

    # ------------------------------------------------------------------ budget
    def out_of_budget(self) -> bool:
        cfg = self.cfg
        if cfg.max_simulations is not None and self.ev.simulations - self.sims0 >= cfg.max_simulations:
            return True
        return cfg.time_limit_s is not None and time.perf_counter() - self.t0 >= cfg.time_limit_s

    def consider(self, mapping: Mapping, evaluation: Evaluation) -> None:
        f = evaluation.fitness(self.objective)
        if self.best is None or f < self.best[0] or (f == self.best[0] and mapping.key < self.best[1].key):
            self.best = (f, mapping, evaluation)

    # ------------------------------------------------------------------ level-1 helpers
    def computation_aware(self, genome: Genome) -> Genome:
        """Give every set the allowed design that is fastest for the layers it gets."""
        mapping = self.space.decode(genome)
        designs = []
        for i, aset in enumerate(mapping.sets):
            layers = [li for li, layer in enumerate(self.space.layers)
                      if mapping.op_set[self.space._position[layer[0]]] == i]
            allowed = self.space.allowed_designs(aset.devices)
            cols = [self.design_names.index(d) for d in allowed]
            totals = self.design_times[np.ix_(layers, cols)].sum(axis=0) if layers else np.zeros(len(cols))
            designs.append(allowed[int(np.argmin(totals))])
        return replace(genome, designs=tuple(designs))

    @cached_property
    def uniform_shardings(self) -> list[tuple[str, ...]]:
        """One sharding vector per preference list of :data:`UNIFORM_PREFERENCES` (each layer
        takes the first strategy of the list it allows), duplicates dropped."""
        out = []
        for prefs in UNIFORM_PREFERENCES:
            out.append(tuple(next((p for p in prefs if p in opts), "dp" if "dp" in opts else opts[0])
                             for opts in self.space.layer_strategies))
        return list(dict.fromkeys(out))

    def heuristic_shardings(self, genome: Genome) -> tuple[str, ...]:
        """Per layer, the first strategy whose split dimension covers the set's devices:
        batch, then output channels, then rows/tokens, then heads; else the largest split."""
        mapping = self.space.decode(genome)
        graph = self.space.graph
        out = []
        from marssim.mapping import split_dim

        for li, layer in enumerate(self.space.layers):
            op = graph.ops[layer[0]]
            n = len(mapping.sets[mapping.op_set[self.space._position[layer[0]]]].devices)
            best, best_size = "none", 1
            for strategy in ("dp", "oc", "spatial", "seq", "head"):
                if strategy not in self.space.layer_strategies[li]:
                    continue
                size = op.dim(split_dim(op, strategy))
                if size >= n:
                    best = strategy
                    break
                if size > best_size:
                    best, best_size = strategy, size
            out.append(best)
        return tuple(out)

    def initial_population(self, seeds: Sequence[Mapping]) -> list[_Individual]:
        space, cfg, rng = self.space, self.cfg, self.rng
        genomes: list[Genome] = []
        for m in seeds:
            with contextlib.suppress(ValueError, KeyError):
                genomes.append(space.encode(m))
        n_acc = len(space.accelerators)
        k = 1
        while k <= space.max_sets and len(genomes) < cfg.population // 2:
            for mb in (1, max(space.micro_batch_choices)) if k > 1 else (1,):
                g = space.uniform(k, micro_batches=mb)
                g = self.computation_aware(g)
                genomes.append(replace(g, shardings=self.heuristic_shardings(g)))
            k *= 2
            if k > n_acc:
                break
        while len(genomes) < cfg.population:
            g = space.random(rng)
            if rng.random() < 0.5:
                g = self.computation_aware(g)
            genomes.append(g)
        unique: dict[tuple, Genome] = {}
        for g in genomes:
            unique.setdefault(g.level1(), g)
        genomes = list(unique.values())
        attempts = 0
        while len(genomes) < cfg.population and attempts < 50 * cfg.population:  # small spaces run out
            attempts += 1
            g = space.random(rng)
            if g.level1() not in unique:
                unique[g.level1()] = g
                genomes.append(g)
        return [_Individual(g) for g in genomes[: cfg.population]]

    def mate(self, a: Genome, b: Genome) -> tuple[Genome, Genome]:
        """Uniform crossover of the cuts and of the designs (by set position); each child keeps
        its first parent's boundaries, micro-batches and shardings."""
        rng = self.rng
        cuts_a, cuts_b = list(a.cuts), list(b.cuts)
        cx_uniform(rng, cuts_a, cuts_b)
        d_len = max(len(a.designs), len(b.designs))
        da = list(a.designs) + list(b.designs[len(a.designs):])
        db = list(b.designs) + list(a.designs[len(b.designs):])
        cx_uniform(rng, da, db)
        return (replace(a, cuts=tuple(cuts_a), designs=tuple(da[:d_len])),
                replace(b, cuts=tuple(cuts_b), designs=tuple(db[:d_len])))

    def mutate(self, g: Genome) -> Genome:
        """Flip cuts (per gene, plus one forced flip with probability ``operator_mutation``),
        move a set boundary by one accelerator, shift a segment boundary, re-draw a set's
        design, re-select designs computation-aware, re-draw the micro-batches: each operator
        applied with probability ``operator_mutation``."""
        space, rng, p = self.space, self.rng, self.cfg.operator_mutation
        cuts = flip_bits(rng, g.cuts, self.cfg.gene_mutation)
        if cuts and rng.random() < p:  # split a set or merge two
            i = int(rng.integers(len(cuts)))
            cuts[i] = not cuts[i]
        if rng.random() < p:  # move a set boundary by one accelerator
            movable = [(i, j) for i, c in enumerate(cuts) if c for j in (i - 1, i + 1)
                       if 0 <= j < len(cuts) and not cuts[j]]
            if movable:
                i, j = movable[int(rng.integers(len(movable)))]
                cuts[i], cuts[j] = False, True
        g = replace(g, cuts=tuple(cuts))
        if rng.random() < p and g.boundaries:
            b = list(g.boundaries)
            i = int(rng.integers(len(b)))
            b[i] += int(rng.choice([-3, -2, -1, 1, 2, 3]))
            g = replace(g, boundaries=tuple(b))
        if rng.random() < p:
            sets = space.decoded_sets(g.cuts)
            designs = list(g.designs) + [""] * max(0, len(sets) - len(g.designs))
            i = int(rng.integers(len(sets)))
            designs[i] = str(rng.choice(space.allowed_designs(sets[i])))
            g = replace(g, designs=tuple(designs))
        if rng.random() < p:
            g = self.computation_aware(g)
        if rng.random() < p:
            g = replace(g, micro_batches=int(rng.choice(space.micro_batch_choices)))
        return g

    def next_generation(self, pop: list[_Individual]) -> list[_Individual]:
        """Elites carried over with their fitness; the rest bred by tournament selection,
        crossover and mutation (a child whose outer genome was met before is mutated again, up
        to four times, to explore something new)."""
        cfg, rng = self.cfg, self.rng
        ranked = sorted(range(len(pop)), key=lambda i: pop[i].rank_key())
        elites = [pop[i] for i in ranked[: min(cfg.elites, len(pop))]]
        keys = [ind.rank_key() for ind in pop]
        chosen = tournament(rng, keys, len(pop) - len(elites), cfg.tournament)
        children = [pop[i].genome for i in chosen]
        for i in range(1, len(children), 2):
            if rng.random() < cfg.crossover:
                children[i - 1], children[i] = self.mate(children[i - 1], children[i])
        children = [self.mutate(g) for g in children]
        new = [_copy(ind) for ind in elites]
        self.refine = list(new)
        seen = {ind.genome.level1() for ind in new}
        for g in children:
            for _ in range(4):  # a genome met before explores nothing new: perturb it
                if g.level1() not in seen and g.level1() not in self.inner_pops:
                    break
                g = self.mutate(g)
            seen.add(g.level1())
            new.append(_Individual(g))
        return new

    # ------------------------------------------------------------------ level 2
    def inner(self, individuals: list[_Individual], refine: Sequence[_Individual] = ()) -> None:
        """Optimise the shardings of every unevaluated individual and of those in ``refine``
        (in lockstep: one batch of candidates per inner generation), then simulate the best of
        each and set its fitness. An outer genome's inner population is kept, so a genome met
        again (an elite refined each generation, or a child equal to an earlier individual)
        continues its inner search where it stopped; a refined individual keeps its mapping
        unless the refinement finds a better one."""
        cfg, rng, space = self.cfg, self.rng, self.space
        todo = [ind for ind in individuals if ind.fitness is None]
        todo += [ind for ind in refine if ind.fitness is not None and all(ind is not t for t in todo)]
        if not todo:
            return
        pops: list[list[tuple[str, ...]]] = []
        for ind in todo:
            stored = self.inner_pops.get(ind.genome.level1(), [])
            start = list(dict.fromkeys([ind.genome.shardings, *stored, self.heuristic_shardings(ind.genome),
                                        *self.uniform_shardings]))
            while len(start) < cfg.inner_population:
                start.append(self._mutate_shardings(start[int(rng.integers(len(start)))], strong=True))
            pops.append(start[: cfg.inner_population])
        use_estimate = cfg.screen and analytical_available()
        ranked: list[list[tuple[float, tuple[str, ...], Mapping]]] = []
        for gen in range(cfg.inner_generations + 1):
            batch = [space.decode(replace(ind.genome, shardings=s)) for ind, pop in zip(todo, pops) for s in pop]
            if use_estimate:
                scores = [e.fitness(self.objective) for e in self.ev.estimate(batch)]
            else:
                evaluations = self.ev.simulate(batch)
                for m, e in zip(batch, evaluations):
                    self.consider(m, e)
                scores = [e.fitness(self.objective) for e in evaluations]
            k = 0
            ranked = []
            for pop in pops:
                ranked.append(sorted(((scores[k + j], pop[j], batch[k + j]) for j in range(len(pop))),
                                     key=lambda x: (x[0], x[2].key)))
                k += len(pop)
            if gen == cfg.inner_generations or (not use_estimate and self.out_of_budget()):
                break
            pops = [self._next_inner(rank) for rank in ranked]
        stored = [[s for _, s, _ in rank] for rank in ranked]
        for ind, pop in zip(todo, stored):
            self.inner_pops[ind.genome.level1()] = pop
        while len(self.inner_pops) > 4096:  # forget the oldest genomes
            del self.inner_pops[next(iter(self.inner_pops))]
        finals: list[list[Mapping]] = []
        for rank in ranked:
            picked: dict[str, Mapping] = {}
            for _, _, m in rank:
                picked.setdefault(m.key, m)
                if len(picked) >= (cfg.simulate_top if use_estimate else 1):
                    break
            finals.append(list(picked.values()))
        evaluations = self.ev.simulate([m for ms in finals for m in ms])
        k = 0
        for ind, ms in zip(todo, finals):
            best: tuple[float, str, Mapping, Evaluation] | None = None
            if ind.fitness is not None:
                assert ind.mapping is not None and ind.evaluation is not None
                best = (ind.fitness, ind.mapping.key, ind.mapping, ind.evaluation)
            for m in ms:
                e = evaluations[k]
                k += 1
                self.consider(m, e)
                cand = (e.fitness(self.objective), m.key, m, e)
                if best is None or cand[:2] < best[:2]:
                    best = cand
            assert best is not None
            ind.fitness, _, ind.mapping, ind.evaluation = best
            ind.genome = space.encode(best[2])
        for ind, pop in zip(todo, stored):  # found again under the genome of its decoded mapping
            self.inner_pops.setdefault(ind.genome.level1(), pop)

    def _next_inner(self, rank: list[tuple[float, tuple[str, ...], Mapping]]) -> list[tuple[str, ...]]:
        """The next inner population: the best two kept, the rest bred by tournament on rank,
        two-point crossover and mutation."""
        cfg, rng = self.cfg, self.rng
        n = len(rank)
        out = [s for _, s, _ in rank[: max(1, cfg.elites // 2 + 1)]]
        order = list(range(n))  # rank order: index i is the i-th best
        while len(out) < n:
            i, j = tournament(rng, order, 2, cfg.tournament)
            a, b = list(rank[i][1]), list(rank[j][1])
            if rng.random() < cfg.crossover:
                cx_two_point(rng, a, b)
            out.append(self._mutate_shardings(tuple(a)))
        return out[:n]

    def _mutate_shardings(self, shard: tuple[str, ...], strong: bool = False) -> tuple[str, ...]:
        """Per layer, a new strategy with probability max(gene_mutation, 1/layers) (x4 when
        ``strong``); with probability 0.3 a run of consecutive layers switches to one strategy."""
        rng, space = self.rng, self.space
        out = list(shard)
        rate = max(self.cfg.gene_mutation, 1.0 / max(1, len(out))) * (4 if strong else 1)
        for li in range(len(out)):
            if rng.random() < rate:
                out[li] = str(rng.choice(space.layer_strategies[li]))
        if rng.random() < 0.3 and len(out) > 1:
            a = int(rng.integers(len(out)))
            b = min(len(out), a + int(rng.integers(1, max(2, len(out) // 4))))
            pick = str(rng.choice(("dp", "oc", "ic", "spatial", "seq", "head", "none")))
            for li in range(a, b):
                if pick in space.layer_strategies[li]:
                    out[li] = pick
        return tuple(out)


def mars(graph: Graph, system: System, cost: CostModel | None = None, *, config: GAConfig | None = None,
         seed: int = 0, executor: Executor | None = None, objective: str = "latency",
         seeds: Sequence[Mapping] = (), progress: Callable[[dict], None] | None = None,
         evaluator: Evaluator | None = None, collective_algorithm: str = "auto",
         space: MappingSpace | None = None) -> SearchResult:
    """Search the mapping space with the MARS two-level GA; returns the best simulated mapping.

    ``seeds`` (e.g. baseline results) are simulated first and enter the population where they
    fit the encoding; the result is never worse than the best seed. ``executor`` evaluates
    candidates in parallel (any ``concurrent.futures.Executor``); results do not depend on it.
    ``space`` replaces the space built from ``config``. ``progress`` receives a dict per
    generation (the history row plus ``evaluations_per_s``: simulations and estimates per
    second of wall time so far)."""
    if objective not in OBJECTIVES:
        raise ValueError(f"unknown objective {objective!r}; expected one of {', '.join(OBJECTIVES)}")
    if cost is None:
        from marssim.cost import default_cost_model

        cost = default_cost_model()
    cfg = config or GAConfig()
    t0 = time.perf_counter()
    if space is None:
        space = MappingSpace(graph, system, max_sets=cfg.max_sets, micro_batch_choices=cfg.micro_batch_choices,
                             strategies=cfg.strategies, collective_algorithm=collective_algorithm)
    ev = evaluator or Evaluator(Problem(graph, system, cost), executor)
    sims0, est0 = ev.simulations, ev.estimates
    rng = np.random.default_rng(seed)
    state = _MARS(space, ev, cfg, rng, objective, design_table(graph, system, cost))
    rows = []
    if seeds:
        for m, e in zip(seeds, ev.simulate(list(seeds))):
            state.consider(m, e)
    pop = state.initial_population(seeds)
    stale = 0
    best_seen = math.inf
    for gen in range(cfg.generations):
        state.inner(pop, refine=state.refine)
        fits = [ind.fitness for ind in pop]
        finite = [f for f in fits if f is not None and math.isfinite(f)]
        assert state.best is not None
        wall = time.perf_counter() - t0
        rows.append({"generation": gen, "best_fitness": state.best[0], "best_makespan_s": state.best[2].makespan,
                     "population_best": min(finite, default=math.inf),
                     "mean_fitness": float(np.mean(finite)) if finite else math.inf,
                     "simulations": ev.simulations - sims0, "estimates": ev.estimates - est0, "wall_s": wall})
        if progress is not None:
            progress({**rows[-1], "evaluations_per_s": (ev.simulations - sims0 + ev.estimates - est0) / max(wall, 1e-9)})
        if state.best[0] < best_seen * (1 - 1e-12):
            best_seen = state.best[0]
            stale = 0
        else:
            stale += 1
        if stale >= cfg.patience or state.out_of_budget() or gen == cfg.generations - 1:
            break
        pop = state.next_generation(pop)
    assert state.best is not None
    _, best_mapping, best_eval = state.best
    return SearchResult("mars", objective, best_mapping, best_eval, pd.DataFrame(rows),
                        ev.simulations - sims0, ev.estimates - est0, time.perf_counter() - t0, seed,
                        notes={"config": cfg, "cache_hits": ev.cache_hits,
                               "screened": cfg.screen and analytical_available()})


def _copy(ind: _Individual) -> _Individual:
    new = _Individual(ind.genome)
    new.fitness, new.evaluation, new.mapping = ind.fitness, ind.evaluation, ind.mapping
    return new
