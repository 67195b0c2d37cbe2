"""Baselines the MARS search is compared with. Each is a real algorithm, evaluated by simulation.

* :func:`data_parallel` — every layer sharded over the batch on all accelerators in one set,
  one design for all (the best of the designs all accelerators allow).
* :func:`h2h` — H2H (Zhang et al., DAC 2022): greedy computation- and communication-aware
  assignment of layers to single accelerators (list scheduling on the earliest finish time,
  transfers by alpha-beta over routes), then transfer removal (a layer joins its producer's
  accelerator when the scheduled makespan does not grow), then neighbour moves (a layer moves
  to a neighbouring layer's accelerator when the *simulated* makespan drops). On adaptive
  systems each accelerator first takes a fixed design: designs are dealt out in proportion to
  the time of the layers each design runs fastest (H2H itself assumes fixed designs). The
  mapping lists the accelerators that run a layer, each as a one-device set (a point of the
  GA's space, so it can seed the GA). The batch may be split into micro-batches (the count with the best simulation is kept), so
  layers on different accelerators overlap as pipeline stages do in the GA's mappings.
* :func:`random_search` — uniformly sampled mappings, best of a given simulation budget.
* :func:`exhaustive` — every mapping of the space the GA searches (:func:`count_space` counts
  them in closed form), for spaces small enough to enumerate.
"""

from __future__ import annotations

import itertools
import math
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import Executor

import numpy as np
import pandas as pd

from marssim.cost.base import CostModel
from marssim.mapping import AcceleratorSet, Mapping, split_sizes
from marssim.mapping.systemref import canonical_system_ref
from marssim.mapping.sharding import BATCH_DIM
from marssim.system import System
from marssim.workload import Graph, Op, OpKind

from .evaluate import Evaluator, MappingEvaluation, Problem, rank_value
from .ga import design_table
from .result import SearchResult
from .space import Genome, MappingSpace

__all__ = ["data_parallel", "h2h", "random_search", "exhaustive", "count_space", "set_partitions",
           "set_collections"]


def _default_cost(cost: CostModel | None) -> CostModel:
    if cost is None:
        from marssim.cost import default_cost_model

        return default_cost_model()
    return cost


def _evaluator(graph, system, cost, executor, evaluator) -> Evaluator:
    return evaluator or Evaluator(Problem(graph, system, _default_cost(cost)), executor)


def _result(name: str, objective: str, candidates: Sequence[tuple[Mapping, MappingEvaluation]], ev: Evaluator,
            sims0: int, est0: int, t0: float, seed: int = 0, notes: dict | None = None) -> SearchResult:
    best_m, best_e = min(candidates, key=lambda me: (rank_value(me[1].fitness(objective)), me[0].key))
    history = pd.DataFrame([{"generation": 0, "best_fitness": best_e.fitness(objective),
                             "best_makespan_s": best_e.makespan, "simulations": ev.simulations - sims0,
                             "estimates": ev.estimates - est0, "wall_s": time.perf_counter() - t0}])
    return SearchResult(name, objective, best_m, best_e, history, ev.simulations - sims0, ev.estimates - est0,
                        time.perf_counter() - t0, seed, notes=notes or {})


def data_parallel(graph: Graph, system: System, cost: CostModel | None = None, *, objective: str = "latency",
                  executor: Executor | None = None, evaluator: Evaluator | None = None,
                  micro_batches: int = 1) -> SearchResult:
    """Every layer split over the batch on one set of accelerators with one design: for each
    design, the set of all accelerators that allow it (every accelerator, on homogeneous and
    adaptive systems); the best of those mappings by simulation. On a system of fixed, different
    designs (``herald-soc``) each candidate set is the accelerators of one design."""
    t0 = time.perf_counter()
    ev = _evaluator(graph, system, cost, executor, evaluator)
    sims0, est0 = ev.simulations, ev.estimates
    mappings = []
    for design in system.designs:
        devices = tuple(a.id for a in system.accelerators if design in a.designs)
        if devices:
            mappings.append(Mapping.single_set(graph, system, devices=devices, design=design, sharding="dp",
                                               micro_batches=micro_batches))
    return _result("data_parallel", objective, list(zip(mappings, ev.simulate(mappings))), ev, sims0, est0, t0)


# ------------------------------------------------------------------------------------ H2H
def _h2h_designs(graph: Graph, system: System, cost: CostModel) -> dict[str, str]:
    """A fixed design per accelerator: fixed ones keep theirs; adaptive ones are dealt designs in
    proportion to the time of the layers each design runs fastest."""
    names, table = design_table(graph, system, cost)
    adaptive = [a for a in system.accelerators if not a.fixed]
    out = {a.id: a.designs[0] for a in system.accelerators if a.fixed}
    if not adaptive:
        return out
    allowed = [n for n in names if all(n in a.designs for a in adaptive)] or list(adaptive[0].designs)
    cols = [names.index(n) for n in allowed]
    sub = table[:, cols]
    wins = np.zeros(len(allowed))
    for row in sub:
        wins[int(np.argmin(row))] += float(np.min(row))
    share = wins / wins.sum() * len(adaptive) if wins.sum() > 0 else np.ones(len(allowed))
    counts = np.floor(share).astype(int)
    for i in np.argsort(-(share - counts), kind="stable")[: len(adaptive) - counts.sum()]:
        counts[i] += 1
    deal = [allowed[i] for i in range(len(allowed)) for _ in range(counts[i])]
    # interleave designs along the accelerator order so that every design has neighbours of others
    order = sorted(range(len(deal)), key=lambda k: (deal[:k + 1].count(deal[k]) / max(1, counts[allowed.index(deal[k])]), k))
    for acc, k in zip(adaptive, order):
        out[acc.id] = deal[k]
    return out


class _ListSchedule:
    """Earliest-finish-time list scheduling of layers on single accelerators, at micro-batch
    granularity: the batch is split into ``micro_batches`` parts that flow through the layers
    one after another (so layers on different accelerators overlap, as in a pipeline);
    transfers are timed alpha-beta over the system's routes (latency + bytes / bottleneck)."""

    def __init__(self, graph: Graph, system: System, cost: CostModel, designs: dict[str, str],
                 micro_batches: int = 1) -> None:
        self.graph = graph
        self.system = system
        self.accs = system.accelerator_ids
        self.micro_batches = m = micro_batches
        layer_of = {}
        for li, layer in enumerate(graph.layers):
            for gi in layer:
                layer_of[gi] = li
        # ops of each micro-batch (the batch dimension split as the lowering splits it)
        sized: dict[tuple[int, int], Op] = {}
        for gi in graph.compute_ops + tuple(i for i, op in enumerate(graph.ops) if op.kind == OpKind.INPUT):
            op = graph.ops[gi]
            dim = BATCH_DIM[op.kind]
            for mb, size in enumerate(split_sizes(op.dim(dim), m)):
                sized[(gi, mb)] = op if size == op.dim(dim) else op.with_loops(**{dim: size})
        # (producer layer or -1 for a graph input, bytes per micro-batch)
        self.preds: list[list[tuple[int, list[float]]]] = []
        for layer in graph.layers:
            inside = set(layer)
            edges: dict[int, list[float]] = {}
            for gi in layer:
                for p in graph.preds[gi]:
                    if p in inside:
                        continue
                    src = layer_of.get(p, -1)
                    acc = edges.setdefault(src, [0.0] * m)
                    for mb in range(m):
                        acc[mb] += sized[(p, mb)].output_bytes
            self.preds.append(sorted(edges.items()))
        # seconds of each layer's micro-batch on each accelerator: time[layer, acc, mb]
        self.time = np.zeros((len(graph.layers), len(self.accs), m))
        memo: dict[tuple, float] = {}
        for j, acc in enumerate(self.accs):
            design = system.design(acc, designs[acc])
            dkey = (designs[acc], system.accelerator(acc).memory.bandwidth)
            for i, layer in enumerate(graph.layers):
                for mb in range(m):
                    total = 0.0
                    for g in layer:
                        key = (g, mb, dkey)
                        t = memo.get(key)
                        if t is None:
                            t = memo[key] = cost.op_time(sized[(g, mb)], design)
                        total += t
                    self.time[i, j, mb] = total
        self.host = system.nearest_host(self.accs[0])
        n = len(self.accs)
        self.lat = np.zeros((n + 1, n + 1))
        self.bw = np.full((n + 1, n + 1), np.inf)
        nodes = list(self.accs) + [self.host]
        for a in range(n + 1):
            for b in range(n + 1):
                if a != b:
                    self.lat[a, b] = system.route(nodes[a], nodes[b]).latency
                    self.bw[a, b] = system.bottleneck_bandwidth(nodes[a], nodes[b])

    def comm(self, src: int, dst: int, nbytes: float) -> float:
        return 0.0 if src == dst else self.lat[src, dst] + nbytes / self.bw[src, dst]

    def _place(self, li: int, a: int, where: Sequence[int], finish: np.ndarray, start_at: float) -> list[float]:
        """Finish times of layer ``li``'s micro-batches on accelerator ``a`` free at ``start_at``."""
        n = len(self.accs)
        t = start_at
        ends = []
        for mb in range(self.micro_batches):
            ready = 0.0
            for p, nbytes in self.preds[li]:
                src, t_p = (n, 0.0) if p < 0 else (where[p], finish[p, mb])
                ready = max(ready, t_p + self.comm(src, a, nbytes[mb]))
            t = max(t, ready) + self.time[li, a, mb]
            ends.append(t)
        return ends

    def greedy(self) -> list[int]:
        """Each layer (graph order) on the accelerator where its last micro-batch ends first."""
        n = len(self.accs)
        avail = np.zeros(n)
        finish = np.zeros((len(self.graph.layers), self.micro_batches))
        where: list[int] = []
        for li in range(len(self.graph.layers)):
            best = None
            for a in range(n):
                ends = self._place(li, a, where, finish, avail[a])
                if best is None or ends[-1] < best[0] - 1e-15:
                    best = (ends[-1], a, ends)
            assert best is not None
            where.append(best[1])
            finish[li] = best[2]
            avail[best[1]] = best[0]
        return where

    def makespan(self, where: Sequence[int]) -> float:
        n = len(self.accs)
        avail = np.zeros(n)
        finish = np.zeros((len(where), self.micro_batches))
        for li, a in enumerate(where):
            finish[li] = self._place(li, a, where, finish, avail[a])
            avail[a] = finish[li, -1]
        return float(finish.max(initial=0.0))

    def remove_transfers(self, where: list[int]) -> list[int]:
        """H2H's second pass: a layer joins the accelerator of its latest producer when the
        scheduled makespan does not grow (the transfer between them disappears)."""
        current = self.makespan(where)
        for li in range(1, len(where)):
            producers = [p for p, _ in self.preds[li] if p >= 0]
            if not producers:
                continue
            target = where[max(producers)]
            if target != where[li]:
                trial = list(where)
                trial[li] = target
                t = self.makespan(trial)
                if t <= current:
                    where, current = trial, t
        return where


def _h2h_mapping(graph: Graph, system: System, designs: dict[str, str], where: Sequence[int],
                 micro_batches: int = 1) -> Mapping:
    accs = system.accelerator_ids
    used = sorted(set(where))
    index = {a: k for k, a in enumerate(used)}
    sets = tuple(AcceleratorSet((accs[a],), designs[accs[a]]) for a in used)
    op_set = [0] * len(graph.compute_ops)
    position = {gi: k for k, gi in enumerate(graph.compute_ops)}
    for li, layer in enumerate(graph.layers):
        for gi in layer:
            op_set[position[gi]] = index[where[li]]
    return Mapping(sets=sets, op_set=tuple(op_set), op_sharding=("none",) * len(op_set),
                   micro_batches=micro_batches, system=canonical_system_ref(system), workload=graph.spec)


def h2h(graph: Graph, system: System, cost: CostModel | None = None, *, objective: str = "latency",
        executor: Executor | None = None, evaluator: Evaluator | None = None, max_moves: int = 200,
        micro_batch_choices: tuple[int, ...] = (1, 2, 4, 8)) -> SearchResult:
    """H2H's passes; every layer runs whole on one accelerator. For each micro-batch count of
    ``micro_batch_choices`` (up to the batch), the greedy assignment and the transfer-removal
    pass run on the list schedule; the counts' mappings are simulated and the best goes through
    the neighbour-move pass, whose simulations ``max_moves`` bounds. (H2H schedules one batch;
    splitting it lets layers on different accelerators overlap, the pipelining the GA may use.)"""
    t0 = time.perf_counter()
    cost = _default_cost(cost)
    ev = _evaluator(graph, system, cost, executor, evaluator)
    sims0, est0 = ev.simulations, ev.estimates
    designs = _h2h_designs(graph, system, cost)
    starts = []
    for m in sorted({c for c in micro_batch_choices if 1 <= c <= graph.batch} or {1}):
        sched = _ListSchedule(graph, system, cost, designs, m)
        where = sched.remove_transfers(sched.greedy())
        starts.append((m, where, _h2h_mapping(graph, system, designs, where, m)))
    evals = ev.simulate([mapping for _, _, mapping in starts])
    candidates = [(mapping, e) for (_, _, mapping), e in zip(starts, evals)]
    k = min(range(len(starts)), key=lambda i: (rank_value(evals[i].fitness(objective)), starts[i][2].key))
    micro, where, best_m = starts[k]
    best_e = evals[k]
    # pass 3: move a layer to a neighbouring layer's accelerator while the simulation improves
    moves = 0
    improved = True
    while improved and moves < max_moves:
        improved = False
        for li in range(len(where)):
            targets = sorted({where[j] for j in (li - 1, li + 1) if 0 <= j < len(where)} - {where[li]})
            trials = []
            for tgt in targets:
                trial = list(where)
                trial[li] = tgt
                trials.append((trial, _h2h_mapping(graph, system, designs, trial, micro)))
            if not trials or moves >= max_moves:
                continue
            moves += len(trials)
            for (trial, m), e in zip(trials, ev.simulate([m for _, m in trials])):
                candidates.append((m, e))
                if e.fitness(objective) < best_e.fitness(objective) * (1 - 1e-12):
                    where, best_e = trial, e
                    improved = True
    return _result("h2h", objective, candidates, ev, sims0, est0, t0,
                   notes={"designs": designs, "micro_batches": micro})


# ------------------------------------------------------------------------------------ random, exhaustive
def random_search(graph: Graph, system: System, cost: CostModel | None = None, *, budget: int = 100,
                  seed: int = 0, objective: str = "latency", executor: Executor | None = None,
                  evaluator: Evaluator | None = None, space: MappingSpace | None = None) -> SearchResult:
    """The best of ``budget`` uniformly sampled mappings (distinct mappings, simulated)."""
    t0 = time.perf_counter()
    ev = _evaluator(graph, system, cost, executor, evaluator)
    sims0, est0 = ev.simulations, ev.estimates
    space = space or MappingSpace(graph, system)
    rng = np.random.default_rng(seed)
    seen: dict[str, Mapping] = {}
    attempts = 0
    while len(seen) < budget and attempts < budget * 20:
        m = space.decode(space.random(rng))
        seen.setdefault(m.key, m)
        attempts += 1
    mappings = list(seen.values())
    return _result("random", objective, list(zip(mappings, ev.simulate(mappings))), ev, sims0, est0, t0, seed)


def set_partitions(space: MappingSpace) -> Iterator[tuple[tuple[str, ...], ...]]:
    """Every distinct partition of the accelerators a genome's cuts of ``space`` decode to:
    consecutive runs of the accelerator order from the first one, each run sharing a design, at
    most ``max_sets`` runs; fewer than ``max_sets`` runs reach the last accelerator."""
    accs = space.accelerators
    n = len(accs)

    def grow(start: int, prefix: tuple) -> Iterator[tuple]:
        for end in range(start, n):
            if end > start and not space.allowed_designs(tuple(accs[start:end + 1])):
                break
            run = prefix + (tuple(accs[start:end + 1]),)
            if end == n - 1 or len(run) == space.max_sets:
                yield run
            else:
                yield from grow(end + 1, run)

    yield from grow(0, ())


def _gap_sets(space: MappingSpace, start: int, end: int) -> int:
    """Sets the idle accelerators ``start..end-1`` form in a partition (0 when there are none):
    :meth:`MappingSpace.sets_of` splits a run where its devices share no design."""
    count = 0
    i = start
    while i < end:
        j = i + 1
        while j < end and space.allowed_designs(tuple(space.accelerators[i:j + 1])):
            j += 1
        count += 1
        i = j
    return count


def _runs_from(space: MappingSpace, start: int, used: int) -> Iterator[tuple[int, int, int]]:
    """The next set a mapping may use after accelerator ``start - 1``: ``(first, last, sets)``,
    a run of accelerators sharing a design, and the number of partition sets up to and
    including it (``used`` before it, the idle accelerators in between, itself), at most
    ``max_sets``."""
    accs = space.accelerators
    for first in range(start, len(accs)):
        before = used + _gap_sets(space, start, first)
        if before + 1 > space.max_sets:
            break
        for last in range(first, len(accs)):
            if last > first and not space.allowed_designs(tuple(accs[first:last + 1])):
                break
            yield first, last, before + 1


def set_collections(space: MappingSpace) -> Iterator[tuple[tuple[str, ...], ...]]:
    """Every tuple of accelerator sets a decoded mapping of ``space`` can have: one or more
    disjoint runs of consecutive accelerators, in accelerator order, each sharing a design,
    that a partition of at most ``max_sets`` sets holds (the accelerators in no run are idle)."""
    accs = space.accelerators

    def grow(start: int, used: int, prefix: tuple) -> Iterator[tuple]:
        if prefix:
            yield prefix
        for first, last, sets in _runs_from(space, start, used):
            yield from grow(last + 1, sets, prefix + (tuple(accs[first:last + 1]),))

    yield from grow(0, 0, ())


def count_space(space: MappingSpace, limit: int | None = None) -> int:
    """Number of points of the space: the mappings :func:`exhaustive` enumerates (distinct,
    except where a layer's non-GEMM ops fall back to the same strategy). ``limit`` is accepted
    for callers that only need to know whether the count exceeds it (the count is exact either
    way).

    Closed form: a mapping uses a tuple ``C`` of :func:`set_collections`, ``M`` sets of several
    devices and ``O`` of one; it takes any allowed design per set and any assignment of layers to
    sets that uses every set, a layer contributing its strategy count ``w_l`` on a multi-device
    set and 1 on one device. By inclusion-exclusion over the sets left unused, the assignments
    weigh ``sum_{a<=M, b<=O} (-1)^(M-a+O-b) C(M,a) C(O,b) prod_l (a*w_l + b)``, which depends on
    ``(M, O)`` only; the collections are summed by ``(M, O)`` (weighted by their designs) with a
    recursion over the accelerator order."""
    from functools import lru_cache

    accs = space.accelerators
    binding = space.max_sets < len(accs)

    @lru_cache(maxsize=None)
    def tails(start: int, used: int) -> dict[tuple[int, int], int]:
        out: dict[tuple[int, int], int] = {(0, 0): 1}
        for first, last, sets in _runs_from(space, start, used):
            d = len(space.allowed_designs(tuple(accs[first:last + 1])))
            multi = int(last > first)
            for (m, o), w in tails(last + 1, sets if binding else 0).items():
                key = (m + multi, o + 1 - multi)
                out[key] = out.get(key, 0) + d * w
        return out

    weights = tails(0, 0)
    width = [len(opts) for opts in space.layer_strategies]
    top_m = max((m for m, _ in weights), default=0)
    top_o = max((o for _, o in weights), default=0)
    prod = [[math.prod(a * w + b for w in width) for b in range(top_o + 1)] for a in range(top_m + 1)]
    total = 0
    for (m, o), w in weights.items():
        if m + o == 0 or m + o > space.n_layers:
            continue
        onto = sum((-1) ** (m - a + o - b) * math.comb(m, a) * math.comb(o, b) * prod[a][b]
                   for a in range(m + 1) for b in range(o + 1))
        total += w * onto
    return total * len(space.micro_batch_choices)


def _enumerate(space: MappingSpace) -> Iterator[Genome]:
    """Every point of the space as a canonical genome (see :func:`count_space`)."""
    n = space.n_layers
    for sets in set_collections(space):
        k = len(sets)
        if k > n:
            continue
        for labels in itertools.product(range(k), repeat=n):
            if len(set(labels)) < k:
                continue
            options = [space.layer_strategies[li] if len(sets[labels[li]]) > 1 else ("none",) for li in range(n)]
            for designs in itertools.product(*(space.allowed_designs(s) for s in sets)):
                base = space.genome_of(sets, designs, labels, space.micro_batch_choices[0], ("none",) * n)
                for micro in space.micro_batch_choices:
                    for shard in itertools.product(*options):
                        yield Genome(base.cuts, base.designs, base.boundaries, micro, tuple(shard), base.assignment)


def exhaustive(graph: Graph, system: System, cost: CostModel | None = None, *, objective: str = "latency",
               executor: Executor | None = None, evaluator: Evaluator | None = None,
               space: MappingSpace | None = None, limit: int = 20_000) -> SearchResult:
    """Simulate every mapping of the space; raises ValueError when it has more than ``limit``."""
    t0 = time.perf_counter()
    space = space or MappingSpace(graph, system)
    size = count_space(space, limit)
    if size > limit:
        raise ValueError(f"the mapping space has more than {limit} points; use mars or random")
    ev = _evaluator(graph, system, cost, executor, evaluator)
    sims0, est0 = ev.simulations, ev.estimates
    seen: dict[str, Mapping] = {}
    for genome in _enumerate(space):
        m = space.decode(genome)
        seen.setdefault(m.key, m)
    mappings = list(seen.values())
    return _result("exhaustive", objective, list(zip(mappings, ev.simulate(mappings))), ev, sims0, est0, t0,
                   notes={"space_size": size, "distinct_mappings": len(mappings)})
