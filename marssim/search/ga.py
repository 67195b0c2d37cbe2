"""MARS: a two-level genetic algorithm over the mapping space (DAC 2023).

Level 1 (outer) evolves the accelerator sets, their designs, the layer segments, the set that
runs each segment (any set: models of a multi-model workload go to the sets that suit them,
a pipeline may come back to a set) and the micro-batches (:class:`~marssim.search.space.Genome`
without its shardings). Level 2 (inner) evolves, for each outer individual, the sharding of
every layer. Both levels use tournament selection, crossover (outer: uniform on the cuts and
designs, two-point on the set of each layer; inner: two-point) and mutation, drawn from one
seeded ``numpy`` generator. DEAP's operators were the first choice, but they draw from the
process-wide ``random`` module, which a Dask client in the same process also draws from while
it schedules: the search was not reproducible under ``--dask``. The operators are a few lines
each; the loop around them is written here because the two levels nest and every generation's
candidates are evaluated as one batch on an executor.

* **Computation-aware accelerator selection**: a table of each layer's time on each design
  (cost model, one device) gives every set the design that is fastest for the layers it gets,
  and assigns segments (or single layers) to sets H2H-like: each to the set where it ends
  first, counting the work already there and the transfer from its model's previous segment.
  Both seed individuals and are mutation operators.
* **Communication-aware sharding**: the inner level scores candidates by the contention-free
  analytical estimate of the lowered TaskGraph (cheap), then simulates the best few; the
  fitness of every individual, and of everything returned, is simulated. An individual whose
  sets are all single devices has no sharding to choose and is simulated directly.
* Elitism, one-operator neighbours of the elites (a local search), random immigrants, children
  that decode to a mapping met before mutated again, a seed and full determinism, fitness
  cached by mapping hash, early stop after ``patience`` generations without improvement, and
  budgets in simulations and in evaluations (simulations and estimates).
"""

from __future__ import annotations

import contextlib
import itertools
import math
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass, replace
from functools import cached_property

import numpy as np

from marssim.cost.base import CostModel
from marssim.mapping import Mapping
from marssim.progress import GenerationDone
from marssim.system import System
from marssim.workload import Graph

from .evaluate import OBJECTIVES, Evaluator, MappingEvaluation, Problem, rank_value
from .result import SearchResult
from .skeleton import Budget, two_level
from .space import Genome, MappingSpace, runs_of

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
    """Parameters of the two-level GA. Probabilities are per individual unless named per gene.

    population, generations: outer (level-1) individuals and the most generations.
    inner_population, inner_generations: sharding vectors per outer individual and their
    generations (each generation is one batch of evaluations). elites: outer individuals carried
    over (their inner search continues). immigrants: random individuals that join each
    generation in place of bred ones (diversity against early convergence). tournament: tournament size at both levels. patience:
    generations without improvement before stopping. simulate_top: per outer individual, how
    many of the best inner candidates (by the analytical estimate) are simulated. max_sets,
    micro_batch_choices, strategies: the mapping space (see
    :class:`~marssim.search.space.MappingSpace`). max_simulations, max_evaluations,
    time_limit_s: stop at the first generation past any of them (``max_evaluations`` counts
    simulations and analytical estimates run). screen: rank inner candidates by the analytical
    estimate of the objective (when :mod:`marssim.analytical` is missing, or with
    ``screen=False``, they are simulated).

    The stopping defaults are sized by what a generation costs. Where the accelerators differ
    (``herald-soc``: every set is one device, there is no sharding to search) a generation is
    about ten simulations of a few milliseconds each, and the level-1 search needs tens of
    generations: ``generations=100`` and ``patience=20`` (the earlier 10 and 4 stopped it after
    about 30 simulations, no better than its seed). Where sets of many devices shard each layer
    (``mars-adaptive-16``), a generation is about 270 estimates and 20 simulations of the whole
    model: ``max_evaluations=3000`` stops a default ResNet-50 (batch 8) search there after about
    ten generations, within 3 minutes on 2 cores (``analysis/bench_search.py``), before the
    generation limit. Both stop rules count evaluations, never time, so results stay
    reproducible."""

    population: int = 12
    generations: int = 100
    inner_population: int = 8
    inner_generations: int = 3
    crossover: float = 0.9
    gene_mutation: float = 0.05  # per gene (cut, layer strategy)
    operator_mutation: float = 0.3  # each level-1 mutation operator, per individual
    elites: int = 2
    local_moves: int = 2
    immigrants: int = 2
    tournament: int = 3
    patience: int = 20
    simulate_top: int = 2
    max_sets: int | None = None
    micro_batch_choices: tuple[int, ...] = (1, 2, 4, 8)
    strategies: tuple[str, ...] | None = None
    max_simulations: int | None = None
    max_evaluations: int | None = 3000
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
        self.evaluation: MappingEvaluation | None = None
        self.mapping: Mapping | None = None

    def rank_key(self) -> tuple[float, str]:
        assert self.fitness is not None and self.mapping is not None
        return rank_value(self.fitness), self.mapping.key


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
    """The per-op mapping GA as a :class:`~marssim.search.skeleton.Strategy`: its genome
    (:class:`~marssim.search.space.Genome`), its level 1 (computation-aware designs and segment
    assignment, crossover, mutation, elitism, local moves, immigrants) and its level 2 (an inner
    GA over each individual's shardings, screened by the analytical estimate)."""

    algorithm = "mars"

    def __init__(self, space: MappingSpace, ev: Evaluator, cfg: GAConfig, rng: np.random.Generator,
                 objective: str, table: tuple[tuple[str, ...], np.ndarray]) -> None:
        self.space = space
        self.ev = ev
        self.cfg = cfg
        self.rng = rng
        self.objective = objective
        self.design_names, self.design_times = table
        self.inner_pops: dict[tuple, list[tuple[str, ...]]] = {}
        self.refine: list[_Individual] = []  # elites whose inner search continues next generation
        self._hops: dict[tuple[str, str], tuple[float, float]] = {}
        self.explored: set[tuple] = set()  # canonical outer genomes evaluated so far
        self.t0 = time.perf_counter()
        self.sims0 = ev.simulations
        self.est0 = ev.estimates

    # ------------------------------------------------------------------ the strategy
    def initial(self, seeds: Sequence[Mapping]) -> list[_Individual]:
        return self.initial_population(seeds)

    def evaluate(self, population: list[_Individual]) -> None:
        self.inner(population, refine=self.refine)

    def breed(self, population: list[_Individual]) -> list[_Individual]:
        return self.next_generation(population)

    def fitness(self, evaluation: MappingEvaluation) -> float:
        return evaluation.fitness(self.objective)

    def improved(self) -> bool:
        return False

    def stats(self, population: list[_Individual]) -> dict[str, float]:
        finite = [ind.fitness for ind in population if ind.fitness is not None and math.isfinite(ind.fitness)]
        return {"population_best": min(finite, default=math.inf),
                "mean_fitness": float(np.mean(finite)) if finite else math.inf}

    def finish(self) -> None:
        return None

    # ------------------------------------------------------------------ budget
    def out_of_budget(self) -> bool:
        cfg = self.cfg
        if cfg.max_simulations is not None and self.ev.simulations - self.sims0 >= cfg.max_simulations:
            return True
        if cfg.max_evaluations is not None and (self.ev.simulations - self.sims0 + self.ev.estimates - self.est0
                                                >= cfg.max_evaluations):
            return True
        return cfg.time_limit_s is not None and time.perf_counter() - self.t0 >= cfg.time_limit_s

    # ------------------------------------------------------------------ level-1 helpers
    def computation_aware(self, genome: Genome) -> Genome:
        """Give every set the allowed design that is fastest for the layers it gets (sets that
        get none keep theirs)."""
        sets, labels = self.space.layer_sets(genome)
        designs = [self.space.set_design(genome, sets, i) for i in range(len(sets))]
        for i, devices in enumerate(sets):
            layers = np.flatnonzero(labels == i)
            if len(layers):
                allowed = self.space.allowed_designs(devices)
                cols = [self.design_col[d] for d in allowed]
                totals = self.design_times[np.ix_(layers, cols)].sum(axis=0)
                designs[i] = allowed[int(np.argmin(totals))]
        return replace(genome, designs=tuple(designs))

    @cached_property
    def design_col(self) -> dict[str, int]:
        return {name: j for j, name in enumerate(self.design_names)}

    @cached_property
    def layer_cum(self) -> np.ndarray:
        """Cumulative seconds of the layers on each design: ``[layer + 1, design]`` (first row 0)."""
        times = np.where(np.isfinite(self.design_times), self.design_times, 1e30)
        return np.vstack([np.zeros((1, times.shape[1])), np.cumsum(times, axis=0)])

    def segment_times(self, genome: Genome) -> tuple[list[tuple[str, ...]], tuple[int, ...], tuple[int, ...], np.ndarray]:
        """``(sets, boundaries, assignment, times)``: the genome's partition and repaired
        segments, and ``times[segment, set]``, the seconds a segment's layers take on the set
        with the allowed design fastest for them, shared evenly by its devices (an ideal
        sharding)."""
        space = self.space
        sets = space.decoded_sets(genome.cuts)
        bounds, assign = space.segments(genome, len(sets))
        edges = (0, *bounds, space.n_layers)
        seg = self.layer_cum[list(edges[1:])] - self.layer_cum[list(edges[:-1])]  # [segment, design]
        times = np.empty((len(assign), len(sets)))
        for i, devices in enumerate(sets):
            cols = [self.design_col[d] for d in space.allowed_designs(devices)]
            times[:, i] = seg[:, cols].min(axis=1) / len(devices)
        return sets, bounds, assign, times

    @cached_property
    def _layer_model(self) -> list[str]:
        graph = self.space.graph
        return [graph.ops[layer[0]].model for layer in self.space.layers]

    @cached_property
    def _layer_out_bytes(self) -> np.ndarray:
        """Bytes each layer's last op outputs (what the next segment of its model receives)."""
        graph = self.space.graph
        return np.array([float(graph.ops[layer[-1]].output_bytes) for layer in self.space.layers])

    def _hop(self, a: tuple[str, ...], b: tuple[str, ...], nbytes: float) -> float:
        """Alpha-beta seconds to move ``nbytes`` from set ``a`` to set ``b`` (first devices)."""
        if a == b:
            return 0.0
        key = (a[0], b[0])
        hop = self._hops.get(key)
        if hop is None:
            system = self.space.system
            hop = self._hops[key] = (system.route(a[0], b[0]).latency, system.bottleneck_bandwidth(a[0], b[0]))
        return hop[0] + nbytes / hop[1]

    def assign_greedy(self, genome: Genome, *, keep: float = 0.0) -> Genome:
        """Computation- and communication-aware segment assignment, H2H-like at segment
        granularity: the segments, in layer order, each to the set where it ends first, after
        the previous segment of its model (plus the transfer of that segment's output, alpha-beta
        over the route) and after the work already placed on the set, with the
        :meth:`segment_times`; then every set takes the design fastest for its layers. With
        ``keep`` > 0 a segment stays on its set unless another ends it more than ``keep`` (a
        fraction of the time) sooner."""
        sets, bounds, assign, times = self.segment_times(genome)
        edges = (0, *bounds, self.space.n_layers)
        avail = np.zeros(len(sets))
        ready: dict[str, tuple[float, int]] = {}
        out = list(assign)
        for j in range(len(assign)):
            model = self._layer_model[edges[j]]
            t_prev, s_prev = ready.get(model, (0.0, -1))
            nbytes = self._layer_out_bytes[edges[j] - 1] if s_prev >= 0 else 0.0
            ends = np.array([max(avail[s], t_prev + (self._hop(sets[s_prev], sets[s], nbytes) if s_prev >= 0 else 0.0))
                             + times[j, s] for s in range(len(sets))])
            best = int(np.argmin(ends))
            if keep > 0 and out[j] < len(sets) and ends[out[j]] <= ends[best] * (1 + keep):
                best = out[j]
            out[j] = best
            avail[best] = ends[best]
            ready[model] = (float(ends[best]), best)
        return self.computation_aware(replace(genome, boundaries=bounds, assignment=tuple(out)))

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
        """The seeds (where they encode); structured individuals (``k`` = 1, 2, 4, ... equal
        sets as a pipeline, with computation-aware designs and heuristic shardings, one and the
        most micro-batches; and the same with the segments assigned computation-aware, on the
        partition into single accelerators too, with one segment per model for multi-model
        workloads), up to half the population; the rest drawn at random, a third of them with
        computation-aware designs and a third with computation-aware assignments too."""
        space, cfg = self.space, self.cfg
        genomes: list[Genome] = []
        for m in seeds:
            with contextlib.suppress(ValueError, KeyError):
                genomes.append(space.encode(m))
        structured: list[Genome] = []
        n_acc = len(space.accelerators)
        k = 1
        while k <= space.max_sets:
            for mb in (1, max(space.micro_batch_choices)) if k > 1 else (1,):
                g = self.computation_aware(space.uniform(k, micro_batches=mb))
                structured.append(replace(g, shardings=self.heuristic_shardings(g)))
            k *= 2
            if k > n_acc:
                break
        assigned = []
        singles = replace(space.uniform(1), cuts=(True,) * (n_acc - 1))
        shapes = [space.uniform(min(space.max_sets, max(2, n_acc // 2))), space.uniform(space.max_sets)]
        if space.max_sets >= n_acc:
            shapes.append(singles)
        for g in shapes:
            k_sets = len(space.decoded_sets(g.cuts))
            cut_points = [space.balanced_boundaries([1.0] * (2 * k_sets)), tuple(range(1, space.n_layers))]
            if space.model_starts:
                cut_points.insert(0, space.model_starts)
            for bounds in cut_points:
                for mb in dict.fromkeys((1, max(space.micro_batch_choices))):
                    h = self.assign_greedy(replace(g, boundaries=tuple(bounds), assignment=(0,) * (len(bounds) + 1),
                                                   micro_batches=mb))
                    assigned.append(replace(h, shardings=self.heuristic_shardings(h)))
        for a, b in itertools.zip_longest(structured, assigned):  # interleaved, so both kinds get in
            genomes.extend(x for x in (a, b) if x is not None)
        genomes = genomes[: max(len(seeds), cfg.population // 2)]
        while len(genomes) < cfg.population:
            genomes.append(self.random_genome())
        unique: dict[tuple, Genome] = {}
        for g in genomes:
            unique.setdefault(space.canonical(g).level1(), g)
        genomes = list(unique.values())
        attempts = 0
        while len(genomes) < cfg.population and attempts < 50 * cfg.population:  # small spaces run out
            attempts += 1
            g = self.random_genome()
            key = space.canonical(g).level1()
            if key not in unique:
                unique[key] = g
                genomes.append(g)
        return [_Individual(g) for g in genomes[: cfg.population]]

    def random_genome(self) -> Genome:
        """A random genome; a third of them with computation-aware designs, a third with
        computation-aware assignments (and designs)."""
        g = self.space.random(self.rng)
        draw = self.rng.random()
        if draw < 1 / 3:
            return self.computation_aware(g)
        if draw < 2 / 3:
            return self.assign_greedy(g)
        return g

    def mate(self, a: Genome, b: Genome) -> tuple[Genome, Genome]:
        """Uniform crossover of the cuts and of the designs (by set position); with
        probability one half, two-point crossover of the set of each layer (the children's
        segments are the runs of the result), else each child keeps its first parent's segments;
        the micro-batches swapped with probability one half; each child keeps its first
        parent's shardings."""
        rng, space = self.rng, self.space
        cuts_a, cuts_b = list(a.cuts), list(b.cuts)
        cx_uniform(rng, cuts_a, cuts_b)
        d_len = max(len(a.designs), len(b.designs))
        da = list(a.designs) + list(b.designs[len(a.designs):])
        db = list(b.designs) + list(a.designs[len(b.designs):])
        cx_uniform(rng, da, db)
        ca = replace(a, cuts=tuple(cuts_a), designs=tuple(da[:d_len]))
        cb = replace(b, cuts=tuple(cuts_b), designs=tuple(db[:d_len]))
        if rng.random() < 0.5 and space.n_layers > 1:
            la = list(space.layer_sets(a)[1])
            lb = list(space.layer_sets(b)[1])
            cx_two_point(rng, la, lb)
            ba, aa = runs_of(la)
            bb, ab = runs_of(lb)
            ca = replace(ca, boundaries=ba, assignment=aa)
            cb = replace(cb, boundaries=bb, assignment=ab)
        if rng.random() < 0.5:
            ca, cb = replace(ca, micro_batches=b.micro_batches), replace(cb, micro_batches=a.micro_batches)
        return ca, cb

    def mutate(self, g: Genome) -> Genome:
        """Flip each cut with probability ``gene_mutation``, then apply each operator of
        :meth:`operators` with probability ``operator_mutation`` (half that for the
        computation-aware assignment)."""
        p = self.cfg.operator_mutation
        g = replace(g, cuts=tuple(flip_bits(self.rng, g.cuts, self.cfg.gene_mutation)))
        for op, rate in self.operators():
            if self.rng.random() < p * rate:
                g = op(g)
        return g

    def neighbour(self, g: Genome) -> Genome:
        """One operator of :meth:`operators`, drawn at random, applied to ``g`` (drawn again, up
        to eight times, until the outer genome is one not evaluated before)."""
        ops = self.operators()
        key = self.space.canonical(g).level1()
        out = g
        for _ in range(8):
            op, _ = ops[int(self.rng.integers(len(ops)))]
            out = op(g)
            new = self.space.canonical(out).level1()
            if new != key and new not in self.explored:
                break
        return out

    def operators(self) -> list[tuple[Callable[[Genome], Genome], float]]:
        """The level-1 mutation operators and their relative rates: flip a cut (split a set or
        merge two), move a set boundary by one accelerator, shift a segment boundary by up to
        three layers, change the segments (one of: a segment to another set, to the set where it
        runs fastest, two segments swap sets, a segment split in two with the second part on
        another set, two neighbouring segments merged), two sets trade their segments and
        designs (half the rate), re-draw a set's design, re-select the designs
        computation-aware, re-assign the segments (or every layer) computation-aware (half the
        rate), re-draw the micro-batches."""
        return [(self._flip_cut, 1.0), (self._move_cut, 1.0), (self._shift_boundary, 1.0),
                (self._change_segments, 1.0), (self._trade_sets, 0.5), (self._redraw_design, 1.0),
                (self.computation_aware, 1.0), (self._reassign, 0.5), (self._redraw_micro, 1.0)]

    def _flip_cut(self, g: Genome) -> Genome:
        if not g.cuts:
            return g
        cuts = list(g.cuts)
        i = int(self.rng.integers(len(cuts)))
        cuts[i] = not cuts[i]
        return replace(g, cuts=tuple(cuts))

    def _move_cut(self, g: Genome) -> Genome:
        """A set boundary moves by one accelerator; half the time the two sets it separates
        also trade their segments and designs (the work stays with the set that grew, or goes
        with the one that shrank)."""
        cuts = list(g.cuts)
        movable = [(i, j) for i, c in enumerate(cuts) if c for j in (i - 1, i + 1) if 0 <= j < len(cuts) and not cuts[j]]
        if not movable:
            return g
        i, j = movable[int(self.rng.integers(len(movable)))]
        cuts[i], cuts[j] = False, True
        out = replace(g, cuts=tuple(cuts))
        if self.rng.random() < 0.5:
            left = sum(cuts[:min(i, j)])  # index of the set left of the moved boundary
            sets = self.space.decoded_sets(out.cuts)
            if left + 1 < len(sets) and len(sets) == len(self.space.decoded_sets(g.cuts)):
                out = self._trade(out, sets, left, left + 1)
        return out

    def _shift_boundary(self, g: Genome) -> Genome:
        """A segment boundary moves by up to three layers, keeping the order."""
        space = self.space
        bounds, assign = (list(x) for x in space.segments(g, len(space.decoded_sets(g.cuts))))
        if not bounds:
            return g
        i = int(self.rng.integers(len(bounds)))
        low = bounds[i - 1] + 1 if i > 0 else 1
        high = bounds[i + 1] - 1 if i + 1 < len(bounds) else space.n_layers - 1
        bounds[i] = min(max(bounds[i] + int(self.rng.choice([-3, -2, -1, 1, 2, 3])), low), high)
        return replace(g, boundaries=tuple(bounds), assignment=tuple(assign))

    def _change_segments(self, g: Genome) -> Genome:
        sets = self.space.decoded_sets(g.cuts)
        bounds, assign = (list(x) for x in self.space.segments(g, len(sets)))
        bounds, assign = self._mutate_segments(g, sets, bounds, assign)
        return replace(g, boundaries=tuple(bounds), assignment=tuple(assign))

    def _trade_sets(self, g: Genome) -> Genome:
        """Two sets, one of them used, exchange all their segments and their designs."""
        sets = self.space.decoded_sets(g.cuts)
        if len(sets) < 2:
            return g
        bounds, assign = self.space.segments(g, len(sets))
        a = int(self.rng.choice(sorted(set(assign))))
        b = int(self.rng.choice([s for s in range(len(sets)) if s != a]))
        return self._trade(g, sets, a, b)

    def _trade(self, g: Genome, sets: list, a: int, b: int) -> Genome:
        bounds, assign = self.space.segments(g, len(sets))
        swap = {a: b, b: a}
        designs = [self.space.set_design(g, sets, i) for i in range(len(sets))]
        designs[a], designs[b] = designs[b], designs[a]
        return replace(g, designs=tuple(designs), boundaries=bounds, assignment=tuple(swap.get(x, x) for x in assign))

    def _redraw_design(self, g: Genome) -> Genome:
        sets = self.space.decoded_sets(g.cuts)
        designs = list(g.designs) + [""] * max(0, len(sets) - len(g.designs))
        i = int(self.rng.integers(len(sets)))
        designs[i] = str(self.rng.choice(self.space.allowed_designs(sets[i])))
        return replace(g, designs=tuple(designs))

    def _reassign(self, g: Genome) -> Genome:
        """Computation-aware assignment of the segments, or (half the time) of every layer."""
        if self.rng.random() < 0.5:
            labels = self.space.layer_sets(g)[1]
            g = replace(g, boundaries=tuple(range(1, self.space.n_layers)), assignment=tuple(int(x) for x in labels))
        return self.assign_greedy(g, keep=float(self.rng.uniform(0.0, 0.3)))

    def _redraw_micro(self, g: Genome) -> Genome:
        return replace(g, micro_batches=int(self.rng.choice(self.space.micro_batch_choices)))

    def _mutate_segments(self, g: Genome, sets: list, bounds: list[int], assign: list[int]
                         ) -> tuple[list[int], list[int]]:
        """One change of the segment-to-set assignment (see :meth:`mutate`)."""
        rng, k = self.rng, len(sets)
        n_seg = len(assign)
        edges = [0, *bounds, self.space.n_layers]
        ops = ["split"] if any(edges[j + 1] - edges[j] > 1 for j in range(n_seg)) else []
        if k > 1:
            ops += ["move", "fastest"] + (["swap"] if len(set(assign)) > 1 else [])
        if n_seg > 1:
            ops.append("merge")
        if not ops:
            return bounds, assign
        op = ops[int(rng.integers(len(ops)))]
        if op == "move":
            j = int(rng.integers(n_seg))
            assign[j] = int(rng.choice([s for s in range(k) if s != assign[j]]))
        elif op == "fastest":
            j = int(rng.integers(n_seg))
            times = self.segment_times(replace(g, boundaries=tuple(bounds), assignment=tuple(assign)))[3]
            assign[j] = int(np.argmin(times[j]))
        elif op == "swap":
            i, j = (int(x) for x in rng.choice(n_seg, size=2, replace=False))
            while assign[i] == assign[j]:
                i, j = (int(x) for x in rng.choice(n_seg, size=2, replace=False))
            assign[i], assign[j] = assign[j], assign[i]
        elif op == "split":
            j = int(rng.choice([j for j in range(n_seg) if edges[j + 1] - edges[j] > 1]))
            cut = int(rng.integers(edges[j] + 1, edges[j + 1]))
            others = [s for s in range(k) if s != assign[j]] or [assign[j]]
            bounds.insert(j, cut)
            assign.insert(j + 1, int(rng.choice(others)))
        else:  # merge segment j + 1 into segment j (or j into j + 1)
            j = int(rng.integers(n_seg - 1))
            keep = assign[j] if rng.random() < 0.5 else assign[j + 1]
            del bounds[j]
            del assign[j + 1]
            assign[j] = keep
        return bounds, assign

    def next_generation(self, pop: list[_Individual]) -> list[_Individual]:
        """Elites carried over with their fitness; the rest bred by tournament selection,
        crossover and mutation (a child whose outer genome, in canonical form, was met before is
        mutated again, up to eight times, to explore something new)."""
        cfg, rng = self.cfg, self.rng
        ranked = sorted(range(len(pop)), key=lambda i: pop[i].rank_key())
        elites = [pop[i] for i in ranked[: min(cfg.elites, len(pop))]]
        keys = [ind.rank_key() for ind in pop]
        immigrants = min(cfg.immigrants, max(0, len(pop) - len(elites) - 2))
        local = min(cfg.local_moves, max(0, len(pop) - len(elites) - immigrants - 2))
        chosen = tournament(rng, keys, len(pop) - len(elites) - immigrants - local, cfg.tournament)
        children = [pop[i].genome for i in chosen]
        for i in range(1, len(children), 2):
            if rng.random() < cfg.crossover:
                children[i - 1], children[i] = self.mate(children[i - 1], children[i])
        children = [self.mutate(g) for g in children]
        children += [self.neighbour(elites[i % len(elites)].genome) for i in range(local)]
        children += [self.random_genome() for _ in range(immigrants)]
        new = [_copy(ind) for ind in elites]
        self.refine = list(new)
        seen = {self.space.canonical(ind.genome).level1() for ind in new}
        for g in children:
            for _ in range(8):  # a genome met before explores nothing new: perturb it
                key = self.space.canonical(g).level1()
                if key not in seen and key not in self.explored:
                    break
                g = self.mutate(g)
            seen.add(key)
            new.append(_Individual(g))
        return new

    # ------------------------------------------------------------------ level 2
    def inner(self, individuals: list[_Individual], refine: Sequence[_Individual] = ()) -> None:
        """Optimise the shardings of every unevaluated individual and of those in ``refine``
        (in lockstep: one batch of candidates per inner generation), then simulate the best of
        each and set its fitness. An outer genome's inner population is kept, so a genome met
        again (an elite refined each generation, or a child equal to an earlier individual)
        continues its inner search where it stopped; a refined individual keeps its mapping
        unless the refinement finds a better one. An individual whose shardings do not matter
        (see :meth:`level2_choice`) is simulated as it is, without an inner search."""
        cfg, rng, space = self.cfg, self.rng, self.space
        todo = [ind for ind in individuals if ind.fitness is None]
        todo += [ind for ind in refine if ind.fitness is not None and all(ind is not t for t in todo)
                 and self.level2_choice(ind.genome)]
        if not todo:
            return
        searched = [ind for ind in todo if self.level2_choice(ind.genome)]
        pops: list[list[tuple[str, ...]]] = []
        for ind in searched:
            stored = self.inner_pops.get(ind.genome.level1(), [])
            start = list(dict.fromkeys([ind.genome.shardings, *stored, self.heuristic_shardings(ind.genome),
                                        *self.uniform_shardings]))
            while len(start) < cfg.inner_population:
                start.append(self._mutate_shardings(start[int(rng.integers(len(start)))], strong=True))
            pops.append(start[: cfg.inner_population])
        use_estimate = cfg.screen and analytical_available()
        ranked: list[list[tuple[float, tuple[str, ...], Mapping]]] = []
        for gen in range(cfg.inner_generations + 1 if searched else 0):
            batch = [space.decode(replace(ind.genome, shardings=s)) for ind, pop in zip(searched, pops) for s in pop]
            if use_estimate:
                scores = [e.fitness(self.objective) for e in self.ev.estimate(batch)]
            else:
                scores = [e.fitness(self.objective) for e in self.ev.simulate(batch)]
            k = 0
            ranked = []
            for pop in pops:
                ranked.append(sorted(((scores[k + j], pop[j], batch[k + j]) for j in range(len(pop))),
                                     key=lambda x: (rank_value(x[0]), x[2].key)))
                k += len(pop)
            if gen == cfg.inner_generations or (not use_estimate and self.out_of_budget()):
                break
            pops = [self._next_inner(rank) for rank in ranked]
        ranked_of = {id(ind): rank for ind, rank in zip(searched, ranked)}
        stored = [[s for _, s, _ in ranked_of[id(ind)]] if id(ind) in ranked_of else [ind.genome.shardings]
                  for ind in todo]
        for ind, pop in zip(todo, stored):
            self.inner_pops[ind.genome.level1()] = pop
        while len(self.inner_pops) > 4096:  # forget the oldest genomes
            del self.inner_pops[next(iter(self.inner_pops))]
        finals: list[list[Mapping]] = []
        for ind in todo:
            if id(ind) not in ranked_of:  # no sharding to choose: simulate its one mapping
                finals.append([space.decode(ind.genome)])
                continue
            picked: dict[str, Mapping] = {}
            for _, _, m in ranked_of[id(ind)]:
                picked.setdefault(m.key, m)
                if len(picked) >= (cfg.simulate_top if use_estimate else 1):
                    break
            finals.append(list(picked.values()))
        evaluations = self.ev.simulate([m for ms in finals for m in ms])
        k = 0
        for ind, ms in zip(todo, finals):
            best: tuple[float, str, Mapping, MappingEvaluation] | None = None
            if ind.fitness is not None:
                assert ind.mapping is not None and ind.evaluation is not None
                best = (rank_value(ind.fitness), ind.mapping.key, ind.mapping, ind.evaluation)
            for m in ms:
                e = evaluations[k]
                k += 1
                cand = (rank_value(e.fitness(self.objective)), m.key, m, e)
                if best is None or cand[:2] < best[:2]:
                    best = cand
            assert best is not None
            _, _, ind.mapping, ind.evaluation = best
            ind.fitness = ind.evaluation.fitness(self.objective)
            ind.genome = space.encode(best[2])
        for ind, pop in zip(todo, stored):  # found again under the genome of its decoded mapping
            self.inner_pops.setdefault(ind.genome.level1(), pop)
            self.explored.add(ind.genome.level1())

    def level2_choice(self, genome: Genome) -> bool:
        """Whether the genome's shardings matter: some layer with more than one strategy runs
        on a set of several devices (on one device every layer runs ``none``)."""
        sets, labels = self.space.layer_sets(genome)
        widths = self.space.layer_strategies
        return any(len(sets[s]) > 1 and len(widths[li]) > 1 for li, s in enumerate(labels.tolist()))

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
         seeds: Sequence[Mapping] = (), progress: Callable[[GenerationDone], None] | None = None,
         evaluator: Evaluator | None = None, collective_algorithm: str = "auto",
         space: MappingSpace | None = None) -> SearchResult:
    """Search the mapping space with the MARS two-level GA; returns the best simulated mapping.

    ``seeds`` (e.g. baseline results) are simulated first and enter the population where they
    fit the encoding; the result is never worse than the best seed. ``executor`` evaluates
    candidates in parallel (any ``concurrent.futures.Executor``); results do not depend on it.
    ``space`` replaces the space built from ``config``. ``progress`` receives a
    :class:`~marssim.progress.GenerationDone` per generation (its history row, and simulations and
    estimates per second of wall time so far)."""
    if objective not in OBJECTIVES:
        raise ValueError(f"unknown objective {objective!r}; expected one of {', '.join(OBJECTIVES)}")
    if cost is None:
        from marssim.cost import default_cost_model

        cost = default_cost_model()
    cfg = config or GAConfig()
    if space is None:
        space = MappingSpace(graph, system, max_sets=cfg.max_sets, micro_batch_choices=cfg.micro_batch_choices,
                             strategies=cfg.strategies, collective_algorithm=collective_algorithm)
    ev = evaluator or Evaluator(Problem(graph, system, cost), executor)
    state = _MARS(space, ev, cfg, np.random.default_rng(seed), objective, design_table(graph, system, cost))
    budget = Budget(cfg.generations, cfg.patience, cfg.max_simulations, cfg.max_evaluations, cfg.time_limit_s)
    return two_level(state, ev, budget, objective, seeds=seeds, seed=seed, progress=progress,
                     notes={"config": cfg, "screened": cfg.screen and analytical_available()})


def _copy(ind: _Individual) -> _Individual:
    new = _Individual(ind.genome)
    new.fitness, new.evaluation, new.mapping = ind.fitness, ind.evaluation, ind.mapping
    return new
