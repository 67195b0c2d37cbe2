"""MARS for serving: a two-level genetic search over deployments of an LLM on a GPU cluster.

The question a capacity plan answers -- how many replicas, how parallel, on which GPUs, with
which engine settings, to serve this traffic within these service-level objectives -- as the
two levels of MARS:

* **level 1 (computation-aware)**: the pools and their GPU kinds (on a cluster of several kinds,
  a pool per kind or one kind alone), the replicas of each pool and each replica's tensor and
  pipeline parallelism, and whether prefill and decode run together or on separate pools
  (disaggregated; then the P:D split: how many GPUs each side gets, and their parallelism);
* **level 2 (the engine)**: each pool's scheduler (vLLM-style ``continuous`` batching, Orca's
  ``mixed`` prefill-with-decode, Sarathi-Serve's ``chunked`` prefill), its sequence cap
  ``max_num_seqs``, its token budget ``max_batched_tokens`` (the chunk size of ``chunked``) and
  its KV-cache ``block_size`` (and for a mixture of experts its ``ep``: 1 or ``tp``), chosen for
  every level-1 candidate by coordinate descent over the
  closed-form screen (:mod:`marssim.serve.screen`), a generation's candidates in lockstep.

Every candidate is screened (milliseconds); the ``simulate_top`` best screened deployments not
yet simulated are simulated each generation, side by side on the executor, and the search
returns the best *simulated* one. Objectives (:data:`~marssim.search.evaluate.SERVING_OBJECTIVES`):
``goodput`` (the highest request rate meeting the constraints, maximised), ``gpus`` (fewest GPUs
meeting them at the offered load) and ``cost`` (dollars per million output tokens at the offered
load); the constraints (``TTFT P99 <= 2 s``, ``TBT P99 <= 100 ms``, ...) are constraints, never
terms of a weighted sum: a deployment that misses them is not ranked at all, and when nothing
meets them the search says so (:class:`~marssim.errors.InputError`).

The screen is a closed form, so a deployment it finds slightly over a bound may meet it in
simulation: the screen's figures are checked against the bounds relaxed by ``screen_slack``
(1.25) when choosing what to simulate; what is reported is always the simulation.

The baseline (:func:`serve_grid_search`) is the grid an operator sweeps by hand: every uniform
deployment (one pool, one GPU kind, every tensor and pipeline degree and replica count; with the
goodput objective every GPU of the kind, since more replicas never serve less) with two engine
settings (vLLM's defaults: continuous batching, 256 sequences, a token budget holding the
longest prompt; and chunked prefill with a 2,048-token budget), screened, its best simulated on
the same evaluator. The GA is seeded with the grid's best simulated deployments, so it never
returns a worse one. :func:`serve_exhaustive` simulates every deployment of a small space.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass, field, replace
from enum import IntEnum

import numpy as np

from marssim.cost.base import CostModel
from marssim.errors import InputError
from marssim.progress import GenerationDone
from marssim.serve.case import ServeCase
from marssim.serve.deployment import Deployment, Pool, SchedulerConfig
from marssim.system import System

from .evaluate import SERVING_OBJECTIVES, DeploymentEvaluation, Evaluator, Problem, rank_value
from .result import SearchResult
from .operators import coordinate_descent, next_population
from .skeleton import Budget, two_level

__all__ = ["ServeSearchSettings", "ServeSpace", "serve_problem", "uniform_grid", "level1_deployments",
           "all_deployments", "mars_serve", "serve_grid_search", "serve_exhaustive", "SCHEDULER_KINDS"]

SCHEDULER_KINDS = ("continuous", "mixed", "chunked")
"""Level 2's scheduler kinds: ``mixed`` is ``continuous`` with ``mixed=true`` (Orca)."""
_ROLE_ORDER = {"both": 0, "prefill": 1, "decode": 2}


@dataclass(frozen=True)
class ServeSearchSettings:
    """``objective``: ``goodput``, ``gpus`` or ``cost``. Budget: ``generations`` of
    ``population`` level-1 candidates, stopping after ``patience`` generations that improve
    neither the best simulated nor the best screened deployment; ``simulate_top`` simulated per
    generation; ``max_simulations`` in all (a goodput simulation is several runs, one per rate
    tried); ``time_limit_s`` ends the search at the first generation past that wall time. The
    grid simulates its ``grid_simulate`` best screened deployments, then more in screened order
    until one meets the constraints (at most ``grid_max_simulate``). The space: tensor-parallel
    degrees within a node that split the model, pipeline degrees up to ``max_pp``,
    disaggregation (``disaggregation``), at most ``max_gpus`` GPUs (None: the system's), the
    level-2 values; ``router`` and ``context_bucket`` (:class:`~marssim.serve.Deployment`) are
    those of every candidate. ``simulate_front``: at the end, the GA simulates deployments the
    screen puts on the throughput-interactivity Pareto front (:mod:`marssim.search.pareto`), with
    what its generations left of the budget of simulations (they stop :attr:`front_reserve`
    short of it)."""

    objective: str = "goodput"
    population: int = 12
    generations: int = 20
    patience: int = 5
    simulate_top: int = 2
    grid_simulate: int = 2
    grid_max_simulate: int = 8
    max_simulations: int = 24
    time_limit_s: float | None = None
    seed: int = 0
    seed_with_grid: bool = True
    screen_slack: float = 1.25
    disaggregation: bool = True
    max_pp: int = 4
    max_gpus: int | None = None
    schedulers: tuple[str, ...] = SCHEDULER_KINDS
    max_num_seqs: tuple[int, ...] = (64, 128, 256, 512)
    max_batched_tokens: tuple[int, ...] = (512, 1024, 2048, 4096, 8192, 16384)
    block_sizes: tuple[int, ...] = (16, 32)
    router: str = "least_tokens"
    context_bucket: int = 1
    simulate_front: bool = True
    front_simulations: int = 6

    @property
    def front_reserve(self) -> int:
        """Simulations of the budget the GA's generations leave for the Pareto front: at most
        ``front_simulations``, a quarter of ``max_simulations``; none without ``simulate_front``."""
        return min(self.front_simulations, self.max_simulations // 4) if self.simulate_front else 0


# ----------------------------------------------------------------------------- the space
@dataclass
class ServeSpace:
    """The legal choices on ``system`` for the case's model: the GPU kinds and how many of each,
    their GPUs per node (a tensor-parallel group stays in a node), the tensor-parallel degrees
    of each kind, the pipeline degrees."""

    case: ServeCase
    system: System
    settings: ServeSearchSettings
    kinds: tuple[str, ...] = ()
    available: dict = field(default_factory=dict)
    tps: dict = field(default_factory=dict)
    pps: tuple[int, ...] = ()
    longest_prompt: int = 0

    @classmethod
    def of(cls, case: ServeCase, system: System, settings: ServeSearchSettings) -> "ServeSpace":
        t = case.model
        kind_of = {a: system.accelerator(a).designs[0] for a in system.accelerator_ids}
        kinds = tuple(dict.fromkeys(kind_of.values()))
        available = {k: sum(1 for v in kind_of.values() if v == k) for k in kinds}
        router = getattr(system, "_router", None)
        per_node = {}
        for k in kinds:
            first = next(a for a, v in kind_of.items() if v == k)
            nodes = [n for n in (router.node_gpus if router is not None else []) if first in n]
            per_node[k] = len(nodes[0]) if nodes else available[k]
        tps = {k: tuple(tp for tp in (1, 2, 4, 8, 16, 32, 64) if tp <= per_node[k] and t.heads % tp == 0
                        and all(w % tp == 0 for w in t.split_widths) and (t.kv % tp == 0 or tp % t.kv == 0)) for k in kinds}
        pps = tuple(pp for pp in (1, 2, 4, 8, 16) if pp <= min(settings.max_pp, t.layers))
        longest = int(case.stats().prompts[-1])
        return cls(case, system, settings, kinds, available, tps, pps, longest)

    @property
    def mixed(self) -> bool:
        return len(self.kinds) > 1

    def gpu_field(self, kind: str) -> str:
        """A pool's ``gpu`` setting: the design on a cluster of several kinds, else empty."""
        return kind if self.mixed else ""

    def kind_of(self, pool: Pool) -> str:
        return pool.gpu or self.kinds[0]

    def fits(self, pools: Sequence[Pool]) -> bool:
        used: dict[str, int] = {}
        for p in pools:
            used[self.kind_of(p)] = used.get(self.kind_of(p), 0) + p.gpus
        total = sum(used.values())
        cap = self.settings.max_gpus
        return all(n <= self.available[k] for k, n in used.items()) and (cap is None or total <= cap)

    def free(self, pools: Sequence[Pool], kind: str) -> int:
        """GPUs of ``kind`` the pools leave (and the ``max_gpus`` cap allows)."""
        used = sum(p.gpus for p in pools if self.kind_of(p) == kind)
        left = self.available[kind] - used
        if self.settings.max_gpus is not None:
            left = min(left, self.settings.max_gpus - sum(p.gpus for p in pools))
        return left

    def default_scheduler(self, chunked: bool = False) -> SchedulerConfig:
        """The grid's engine settings: vLLM's defaults (continuous batching, 256 sequences, a
        token budget holding the longest prompt, at least 8,192), or chunked prefill with a
        2,048-token budget."""
        if chunked:
            return SchedulerConfig(kind="chunked", max_batched_tokens=2048)
        budget = 8192
        while budget < self.longest_prompt:
            budget *= 2
        return SchedulerConfig(max_batched_tokens=budget)


def canonical(space: ServeSpace, pools: Sequence[Pool], settings: ServeSearchSettings) -> Deployment | None:
    """The deployment of ``pools``, canonical (pools of one role, kind and parallelism merged;
    larger replicas first, so replicas of a power-of-two size stay inside nodes); None when it
    does not fit the GPUs or lacks a prefill or a decode pool."""
    merged: dict[tuple, Pool] = {}
    for p in pools:
        if p.replicas < 1:
            continue
        p = replace(p, gpu=space.gpu_field(space.kind_of(p)))
        if p.ep not in (1, p.tp):  # expert parallelism is 1 or the pool's tp (a tp changed under it)
            p = replace(p, ep=1)
        key = (p.role, p.gpu, p.tp, p.pp, p.ep)
        if key in merged:
            merged[key] = replace(merged[key], replicas=merged[key].replicas + p.replicas)
        else:
            merged[key] = p
    out = sorted(merged.values(), key=lambda p: (-p.gpus_per_replica, _ROLE_ORDER[p.role], p.gpu, p.tp))
    roles = {p.role for p in out}
    if not out or ("prefill" in roles) != ("decode" in roles) or ("both" in roles and len(roles) > 1):
        return None
    if not space.fits(out):
        return None
    return Deployment(tuple(out), router=settings.router, context_bucket=settings.context_bucket)


def _level1(dep: Deployment) -> tuple:
    """The level-1 genes of a deployment (what the level-2 descent does not change)."""
    return tuple((p.role, p.gpu, p.replicas, p.tp, p.pp) for p in dep.pools)


def level1_deployments(space: ServeSpace) -> Iterator[Deployment]:
    """Every level-1 deployment of the space, each pool with the grid's continuous engine
    settings: one kind or (on a cluster of several) a pool per kind, each with every tensor and
    pipeline degree and replica count; with disaggregation every prefill pool and decode pool
    (each of one kind) that fit together."""
    s = space.settings
    sched = space.default_scheduler()
    shapes = {k: [(tp, pp) for tp in space.tps[k] for pp in space.pps] for k in space.kinds}
    seen: set = set()

    def emit(pools):
        dep = canonical(space, pools, s)
        if dep is not None and dep not in seen:
            seen.add(dep)
            return dep
        return None

    for n in range(1, len(space.kinds) + 1):
        for kinds in itertools.combinations(space.kinds, n):
            options = []
            for k in kinds:
                options.append([Pool(r, tp, pp, "both", k, sched) for tp, pp in shapes[k]
                                for r in range(1, space.available[k] // (tp * pp) + 1)])
            for pools in itertools.product(*options):
                dep = emit(pools)
                if dep is not None:
                    yield dep
    if not s.disaggregation:
        return
    for kp in space.kinds:
        for kd in space.kinds:
            for tp_p, pp_p in shapes[kp]:
                for tp_d, pp_d in shapes[kd]:
                    for rp in range(1, space.available[kp] // (tp_p * pp_p) + 1):
                        left = space.available[kd] - (rp * tp_p * pp_p if kd == kp else 0)
                        for rd in range(1, left // (tp_d * pp_d) + 1):
                            dep = emit([Pool(rp, tp_p, pp_p, "prefill", kp, sched),
                                        Pool(rd, tp_d, pp_d, "decode", kd, sched)])
                            if dep is not None:
                                yield dep


def _scheduler_values(settings: ServeSearchSettings) -> list[SchedulerConfig]:
    out = []
    for kind in settings.schedulers:
        for seqs in settings.max_num_seqs:
            for tokens in settings.max_batched_tokens:
                for block in settings.block_sizes:
                    out.append(SchedulerConfig(kind="chunked" if kind == "chunked" else "continuous",
                                               max_num_seqs=seqs, max_batched_tokens=tokens,
                                               mixed=kind == "mixed", block_size=block))
    return out


def all_deployments(space: ServeSpace) -> Iterator[Deployment]:
    """Every deployment of the space: each level-1 deployment with every level-2 choice per pool."""
    scheds = _scheduler_values(space.settings)
    for dep in level1_deployments(space):
        for choice in itertools.product(scheds, repeat=len(dep.pools)):
            yield dep.with_(pools=tuple(replace(p, scheduler=c) for p, c in zip(dep.pools, choice)))


def uniform_grid(space: ServeSpace) -> list[Deployment]:
    """The baseline grid (module docstring)."""
    out = []
    goodput = space.settings.objective == "goodput"
    for k in space.kinds:
        for tp in space.tps[k]:
            for pp in space.pps:
                most = min(space.available[k], space.settings.max_gpus or space.available[k]) // (tp * pp)
                for r in ([most] if goodput else range(1, most + 1)):
                    if r < 1:
                        continue
                    for chunked in (False, True):
                        dep = canonical(space, [Pool(r, tp, pp, "both", k, space.default_scheduler(chunked))],
                                        space.settings)
                        if dep is not None:
                            out.append(dep)
    return list(dict.fromkeys(out))


# ----------------------------------------------------------------------------- the problem
def serve_problem(case: ServeCase, system: System, cost: CostModel) -> Problem:
    """The evaluator's problem for ``case`` on ``system``, the cost model prepared first (a
    calibration table's fit done here once, before the problem travels to workers)."""
    from marssim.serve.simulate import iteration_model

    seen = set()
    for a in system.accelerator_ids:
        design = system.accelerator(a).designs[0]
        if design not in seen:
            seen.add(design)
            iteration_model(case.model, system, ((a,),), cost).stage_times((1, 1), (0, 0), (), 1, 1, 1)
    return Problem(None, system, cost, serving=case)


# ----------------------------------------------------------------------------- the GA
_GENES = ("kind", "max_batched_tokens", "max_num_seqs", "block_size")


class Move(IntEnum):
    """A level-1 mutation of a deployment (:meth:`_ServeStrategy.mutate1`), drawn uniformly."""

    REPLICAS = 0  # a replica more or fewer in one pool
    TP = 1  # twice or half the pool's tensor parallelism, replicas adjusted to keep its GPUs
    PP = 2  # twice or half the pool's pipeline parallelism, likewise
    SPLIT = 3  # prefill and decode split into two pools, or merged into one
    SHIFT = 4  # a replica moved between the prefill and the decode pool
    GPU_KIND = 5  # the pool moved to another GPU kind
    KIND_POOL = 6  # a pool added on a GPU kind without one, or a pool removed
    RANDOM = 7  # a new random deployment


class _ServeStrategy:
    """The deployment GA as a :class:`~marssim.search.skeleton.Strategy`."""

    algorithm = "mars"

    def __init__(self, space: ServeSpace, ev: Evaluator, settings: ServeSearchSettings) -> None:
        self.space = space
        self.ev = ev
        self.settings = settings
        self.rng = np.random.default_rng(settings.seed)
        self.tried: set[tuple] = set()
        self.scored: list[tuple[Deployment, DeploymentEvaluation]] = []
        self.best_screen: tuple = (2, math.inf)
        self._improved = False
        self.front_note: dict[str, int] = {}
        self.cap = settings.max_simulations - settings.front_reserve  # the generations' simulations

    # --------------------------------------------------------------- evaluation
    def fitness(self, evaluation: DeploymentEvaluation) -> float:
        return evaluation.fitness(self.settings.objective)

    def screen_key(self, e: DeploymentEvaluation) -> tuple:
        """How screened deployments are ranked: those meeting the constraints relaxed by
        ``screen_slack`` first, by the objective; then the rest, closest to the bounds first."""
        s = self.settings
        ok = e.feasible and e.slo_ratio <= s.screen_slack
        if s.objective == "goodput":
            value = 1.0 / e.goodput if e.goodput > 0 else math.inf
        else:
            value = replace(e, slo_ratio=min(e.slo_ratio, 1.0) if ok else e.slo_ratio).fitness(s.objective)
        if ok and math.isfinite(value):
            return (0, rank_value(value))
        return (1, rank_value(e.slo_ratio) if e.feasible else math.inf)

    def screen(self, deps: Sequence[Deployment]) -> list[DeploymentEvaluation]:
        return self.ev.estimate(list(deps))

    def simulate(self, deps: Sequence[Deployment]) -> None:
        """Simulate the deployments not simulated yet that can run, side by side, within the
        budget of simulations."""
        todo = [d for d in dict.fromkeys(deps) if self.ev.known(d) is None
                and (self.ev.screened(d) is None or self.ev.screened(d).feasible)]
        todo = todo[:max(0, min(self.cap, self.settings.max_simulations) - self.ev.simulations)]
        if todo:
            self.ev.simulate(todo, side_by_side=True)

    def bound(self, e: DeploymentEvaluation, simulated: bool = False) -> float:
        """The objective's value a deployment could reach were the constraints no object: its
        GPUs, its cost, or for goodput the inverse of its capacity (the screen's; a simulated
        deployment's goodput)."""
        obj = self.settings.objective
        if obj == "gpus":
            return float(e.gpus)
        if obj == "cost":
            return e.cost_per_mtok if e.cost_per_mtok == e.cost_per_mtok else math.inf
        value = e.goodput if simulated else e.capacity
        return 1.0 / value if value > 0 else math.inf

    def to_simulate(self, n: int) -> list[Deployment]:
        """The ``n`` deployments to simulate next. Only those whose bound (:meth:`bound`) beats
        the best simulated deployment's can improve on it (when none can, any): of those, the
        ones the screen finds within the relaxed constraints first, by the objective, then the
        rest, closest to the bounds first; a level-1 deployment not simulated yet before other
        engine settings of one that was."""
        best = min((self.bound(e, simulated=True) for _, e in self.ev.simulated_plans()
                    if math.isfinite(self.fitness(e))), default=math.inf)
        done = {_level1(d) for d, _ in self.ev.simulated_plans()}
        candidates = self.ranked_screened()
        improving = [d for d in candidates if self.bound(self.ev.screened(d)) < best * (1 - 1e-9)]
        pool = improving or candidates

        def key(d: Deployment) -> tuple:
            e = self.ev.screened(d)
            k = self.screen_key(e)
            if k[0] == 0:
                return (0, k[1], 0.0, d.text())
            return (1, rank_value(e.slo_ratio), self.bound(e), d.text())

        ranked = sorted(pool, key=key)
        out: list[Deployment] = []
        seen: set = set()
        for d in ranked:
            k = _level1(d)
            if k not in done and k not in seen:
                seen.add(k)
                out.append(d)
        out = out[:n]
        out += [d for d in ranked if d not in out][:n - len(out)]
        return out

    def ranked_screened(self, exclude_simulated: bool = True) -> list[Deployment]:
        ranked = []
        for dep, e in self.ev.screened_plans():
            if e.feasible and (not exclude_simulated or self.ev.known(dep) is None):
                ranked.append((self.screen_key(e), dep.text(), dep))
        return [d for _, _, d in sorted(ranked, key=lambda x: x[:2])]

    # --------------------------------------------------------------- the strategy
    def initial(self, seeds: Sequence[Deployment]) -> list[Deployment]:
        """The seeds (without seeds: the grid's best, simulated, unless ``seed_with_grid`` is
        off), then random level-1 deployments."""
        if not seeds and self.settings.seed_with_grid:
            seeds = _grid_best(self, self.settings.grid_simulate)
        population = list(dict.fromkeys(seeds))
        while len(population) < self.settings.population:
            population.append(self.random_level1())
        return population

    def evaluate(self, population: list[Deployment]) -> None:
        before = self.best_screen
        self.scored = self.level2(population)
        self.tried.update(_level1(d) for d in population)
        self.simulate(self.to_simulate(self.settings.simulate_top))
        keys = [self.screen_key(e) for _, e in self.ev.screened_plans()]
        self.best_screen = min(keys, default=(2, math.inf))
        self._improved = self.best_screen < before

    def breed(self, population: list[Deployment]) -> list[Deployment]:
        return self.next_generation(self.scored)

    def improved(self) -> bool:
        return self._improved

    def best_columns(self, evaluation) -> dict[str, float]:
        """History columns of the best deployment so far (NaN before there is one): its GPUs, the
        rate it served and its goodput (requests/s), $ per million output tokens."""
        if evaluation is None:
            return dict.fromkeys(("best_gpus", "best_rate_rps", "best_goodput_rps", "best_cost_per_mtok"), math.nan)
        return {"best_gpus": evaluation.gpus, "best_rate_rps": evaluation.rate, "best_goodput_rps": evaluation.goodput,
                "best_cost_per_mtok": evaluation.cost_per_mtok}

    def stats(self, population: list[Deployment]) -> dict[str, float]:
        values = [self.fitness(e) for _, e in self.scored]
        finite = [v for v in values if math.isfinite(v)]
        screened = self.ev.screened_plans()
        return {"population_best": min(finite, default=math.inf),
                "mean_fitness": float(np.mean(finite)) if finite else math.inf, "screened": len(screened),
                "rejected_memory": sum(1 for _, e in screened if not e.feasible),
                "screened_meeting_slo": sum(1 for _, e in screened if e.feasible and e.slo_ratio <= 1)}

    def finish(self) -> None:
        """One more deployment to simulate, then (``simulate_front``) the deployments the screen
        puts on the throughput-interactivity front (:func:`~marssim.search.pareto.screen_front`)
        not simulated yet, with what is left of the budget (when it holds fewer, spread along the
        front: its ends and evenly between, by the screen's TPOT); how many were simulated and how
        many the budget left out goes into :attr:`front_note`."""
        self.simulate(self.to_simulate(1))
        if not self.settings.simulate_front:
            return
        from .pareto import screen_front

        self.cap = self.settings.max_simulations
        front = screen_front(self.ev.screened_plans(), self.settings.screen_slack)
        todo = [d for d in front if self.ev.known(d) is None and self.ev.screened(d).feasible]
        room = max(0, self.cap - self.ev.simulations)
        if len(todo) > room:  # spread along the front: its two ends and evenly between
            todo.sort(key=lambda d: (self.ev.screened(d).latency.get("tpot_mean", math.inf), d.text()))
            picks = sorted({round(i * (len(todo) - 1) / max(1, room - 1)) for i in range(room)}) if room else []
            todo = [todo[i] for i in picks]
        before = self.ev.simulations
        self.simulate(todo)
        done = self.ev.simulations - before
        unsimulated = sum(1 for d in front if self.ev.known(d) is None)
        self.front_note = {"screen_front": len(front), "simulated_for_front": done, "left_by_budget": unsimulated}

    # --------------------------------------------------------------- level 2
    def gene_values(self, pool: Pool, gene: str) -> list:
        s = self.settings
        if gene == "kind":
            return list(s.schedulers)
        if gene == "ep":  # a mixture of experts: experts split over tp, or whole over the tp GPUs
            t = self.space.case.model
            return [1, pool.tp] if t.is_moe and pool.tp > 1 and t.experts % pool.tp == 0 else [1]
        return list({"max_batched_tokens": s.max_batched_tokens, "max_num_seqs": s.max_num_seqs,
                     "block_size": s.block_sizes}[gene])

    @staticmethod
    def with_gene(dep: Deployment, i: int, gene: str, value) -> Deployment:
        pool = dep.pools[i]
        cfg = pool.scheduler
        if gene == "ep":
            pools = list(dep.pools)
            pools[i] = replace(pool, ep=value)
            return dep.with_(pools=tuple(pools))
        if gene == "kind":
            cfg = replace(cfg, kind="chunked" if value == "chunked" else "continuous", mixed=value == "mixed")
        else:
            cfg = replace(cfg, **{gene: value})
        pools = list(dep.pools)
        pools[i] = replace(pool, scheduler=cfg)
        return dep.with_(pools=tuple(pools))

    def level2(self, population: list[Deployment]) -> list[tuple[Deployment, DeploymentEvaluation]]:
        """The best engine settings of each deployment's pools, by coordinate descent over the
        screen: a gene of a pool at a time, every deployment's trials screened as one batch; a
        deployment whose round changed nothing stops."""
        def coordinates(best: list[Deployment]) -> list[tuple[str, int]]:
            width = max((len(d.pools) for d in best), default=0)
            genes = _GENES + (("ep",) if self.space.case.model.is_moe else ())  # a mixture of experts' layout
            return [(gene, i_pool) for gene in genes for i_pool in range(width)]

        def options(dep: Deployment, coordinate: tuple[str, int]) -> list[tuple[Deployment, Deployment]]:
            gene, i_pool = coordinate
            if i_pool >= len(dep.pools):
                return []
            return [(d, d) for d in dict.fromkeys(self.with_gene(dep, i_pool, gene, v)
                                                  for v in self.gene_values(dep.pools[i_pool], gene))]

        best = coordinate_descent(population, coordinates, options, self.screen,
                                  lambda d, e: (self.screen_key(e), d.text()))
        return list(zip(best, self.screen(best)))

    # --------------------------------------------------------------- level 1
    def _shape(self, kind: str) -> tuple[int, int]:
        sp = self.space
        tp = int(self.rng.choice(sp.tps[kind]))
        pps = sp.pps
        weights = np.array([2.0 ** -i for i in range(len(pps))])
        pp = int(self.rng.choice(pps, p=weights / weights.sum()))
        return tp, pp

    def _replicas(self, most: int) -> int:
        if most < 1:
            return 0
        if self.settings.objective == "goodput":
            return most
        return int(self.rng.integers(1, most + 1))

    def random_scheduler(self) -> SchedulerConfig:
        """Engine settings drawn from level 2's values (level 2 then descends from them)."""
        s = self.settings
        kind = str(self.rng.choice(s.schedulers))
        return SchedulerConfig(kind="chunked" if kind == "chunked" else "continuous", mixed=kind == "mixed",
                               max_num_seqs=int(self.rng.choice(s.max_num_seqs)),
                               max_batched_tokens=int(self.rng.choice(s.max_batched_tokens)),
                               block_size=int(self.rng.choice(s.block_sizes)))

    def random_level1(self) -> Deployment:
        sp, s = self.space, self.settings
        sched = self.random_scheduler()
        for _ in range(200):
            if s.disaggregation and self.rng.random() < 0.4:
                kp, kd = (str(self.rng.choice(sp.kinds)) for _ in range(2))
                tp_p, pp_p = self._shape(kp)
                tp_d, pp_d = self._shape(kd)
                most_p = sp.free([], kp) // (tp_p * pp_p)
                if most_p < 1:
                    continue
                rp = int(self.rng.integers(1, max(1, most_p // 2) + 1))
                pre = Pool(rp, tp_p, pp_p, "prefill", kp, sched)
                rd = self._replicas(sp.free([pre], kd) // (tp_d * pp_d))
                pools = [pre, Pool(rd, tp_d, pp_d, "decode", kd, sched)]
            else:
                kinds = list(sp.kinds) if sp.mixed and self.rng.random() < 0.5 else [str(self.rng.choice(sp.kinds))]
                pools = []
                for k in kinds:
                    tp, pp = self._shape(k)
                    pools.append(Pool(self._replicas(sp.free(pools, k) // (tp * pp)), tp, pp, "both", k, sched))
            dep = canonical(sp, pools, s)
            if dep is not None:
                return dep
        raise InputError(None, "search", f"no deployment of {sp.case.model.name} fits {sp.system.spec}'s GPUs "
                                         f"(tensor-parallel degrees {sp.tps})")

    def mutate1(self, dep: Deployment) -> Deployment:
        """One level-1 move: a replica more or fewer, another tensor or pipeline degree (the
        replicas adjusted to keep the GPUs), prefill and decode split or merged, a replica moved
        between the prefill and the decode pool, another GPU kind, a pool per kind added or
        removed, or a new random deployment."""
        sp, s = self.space, self.settings
        pools = list(dep.pools)
        i = int(self.rng.integers(len(pools)))
        p = pools[i]
        kind = sp.kind_of(p)
        move = Move(int(self.rng.integers(len(Move))))
        if move == Move.REPLICAS:
            step = 1 if self.rng.random() < 0.5 else -1
            pools[i] = replace(p, replicas=p.replicas + step)
        elif move in (Move.TP, Move.PP):
            if move == Move.TP:
                choices = [t for t in sp.tps[kind] if t in (p.tp * 2, p.tp // 2)]
                new = replace(p, tp=int(self.rng.choice(choices))) if choices else p
            else:
                choices = [q for q in sp.pps if q in (p.pp * 2, p.pp // 2)]
                new = replace(p, pp=int(self.rng.choice(choices))) if choices else p
            r = max(1, round(p.gpus / new.gpus_per_replica))
            pools[i] = replace(new, replicas=r)
        elif move == Move.SPLIT and s.disaggregation:
            if dep.disaggregated:
                pre = [q for q in pools if q.role == "prefill"]
                dec = [q for q in pools if q.role == "decode"]
                d = dec[0]
                total = sum(q.gpus for q in pre + dec if sp.kind_of(q) == sp.kind_of(d))
                pools = [replace(d, role="both", replicas=max(1, total // d.gpus_per_replica))]
            elif p.replicas >= 2:
                rp = max(1, p.replicas // 4)
                pools = [replace(p, role="decode", replicas=p.replicas - rp), replace(p, role="prefill", replicas=rp)]
        elif move == Move.SHIFT and dep.disaggregated:
            pre = next(j for j, q in enumerate(pools) if q.role == "prefill")
            dec = next(j for j, q in enumerate(pools) if q.role == "decode")
            a, b = (pre, dec) if self.rng.random() < 0.5 else (dec, pre)
            if pools[a].replicas > 1:
                moved = pools[a].gpus_per_replica
                pools[a] = replace(pools[a], replicas=pools[a].replicas - 1)
                pools[b] = replace(pools[b], replicas=pools[b].replicas + max(1, moved // pools[b].gpus_per_replica))
        elif move == Move.GPU_KIND and sp.mixed:
            other = [k for k in sp.kinds if k != kind]
            k = str(self.rng.choice(other))
            tps = [t for t in sp.tps[k] if t <= p.tp] or [sp.tps[k][0]]
            pools[i] = replace(p, gpu=k, tp=max(tps))
        elif move == Move.KIND_POOL and sp.mixed and not dep.disaggregated:
            present = {sp.kind_of(q) for q in pools}
            missing = [k for k in sp.kinds if k not in present]
            if missing:
                k = str(self.rng.choice(missing))
                tp, pp = self._shape(k)
                pools.append(Pool(self._replicas(sp.free(pools, k) // (tp * pp)), tp, pp, "both", k, p.scheduler))
            elif len(pools) > 1:
                del pools[i]
        elif move == Move.RANDOM:
            return self.random_level1()
        out = self._repair(pools)
        return out if out is not None else dep

    def _repair(self, pools: list[Pool]) -> Deployment | None:
        """The pools as a canonical deployment, replicas trimmed (largest pool first) until they
        fit the GPUs."""
        sp = self.space
        pools = [q for q in pools if q.replicas >= 1]
        for _ in range(4096):
            dep = canonical(sp, pools, self.settings)
            if dep is not None or not pools:
                return dep
            if sp.fits(pools):
                return None
            j = max(range(len(pools)), key=lambda k: (pools[k].gpus, -k))
            if pools[j].replicas <= 1:
                return None
            pools[j] = replace(pools[j], replicas=pools[j].replicas - 1)
        return None

    def crossover1(self, a: Deployment, b: Deployment) -> Deployment:
        """Pool-wise uniform crossover of two deployments of the same pools (roles and kinds);
        else ``a``."""
        if [(p.role, p.gpu) for p in a.pools] != [(p.role, p.gpu) for p in b.pools]:
            return a
        pick = self.rng.random(len(a.pools)) < 0.5
        out = self._repair([pb if k else pa for pa, pb, k in zip(a.pools, b.pools, pick)])
        return out if out is not None else a

    def next_generation(self, scored: list[tuple[Deployment, DeploymentEvaluation]]) -> list[Deployment]:
        s = self.settings

        def key(item):
            dep, e = item
            sim = self.ev.known(dep)
            f = self.fitness(sim) if sim is not None else math.inf
            return (rank_value(f) if math.isfinite(f) else math.inf, self.screen_key(e), dep.text())

        ranked = sorted(scored, key=key)
        return next_population([d for d, _ in ranked], s.population, self.rng, self.crossover1, self.mutate1,
                               _level1, self.tried)


def _grid_best(strategy: _ServeStrategy, n: int) -> list[Deployment]:
    """The grid screened; its best ``n`` by the screen (those it finds meeting the constraints
    first, by the objective; then the closest) simulated, then more in that order until one
    meets the constraints (at most ``grid_max_simulate``); the simulated ones, best first."""
    s = strategy.settings
    grid = uniform_grid(strategy.space)

    def key(item):  # the screen's figures against the constraints as given: no slack for a baseline
        dep, e = item
        f = strategy.fitness(e)
        return (0, rank_value(f), dep.text()) if math.isfinite(f) else (1, rank_value(e.slo_ratio), dep.text())

    order = [d for d, e in sorted(((d, e) for d, e in zip(grid, strategy.screen(grid)) if e.feasible), key=key)]
    budget = min(s.grid_max_simulate, s.max_simulations)
    strategy.simulate(order[:n])
    at = n
    while at < min(len(order), budget):
        if any(math.isfinite(strategy.fitness(e)) for d, e in strategy.ev.simulated_plans()):
            break
        strategy.simulate(order[at:at + 1])
        at += 1
    sims = [(strategy.fitness(e), d.text(), d) for d, e in strategy.ev.simulated_plans()]
    return [d for f, _, d in sorted(sims, key=lambda x: (rank_value(x[0]) if math.isfinite(x[0]) else math.inf,
                                                          x[1]))]


class _GridStrategy(_ServeStrategy):
    """The baseline as a one-generation strategy: the grid screened, its best simulated."""

    algorithm = "uniform-grid"

    def __init__(self, space, ev, settings) -> None:
        super().__init__(space, ev, settings)
        self.cap = settings.max_simulations  # no front to keep simulations for

    def initial(self, seeds: Sequence[Deployment]) -> list[Deployment]:
        return []

    def evaluate(self, population: list[Deployment]) -> None:
        _grid_best(self, self.settings.grid_simulate)

    def stats(self, population: list[Deployment]) -> dict[str, float]:
        screened = self.ev.screened_plans()
        return {"screened": len(screened), "rejected_memory": sum(1 for _, e in screened if not e.feasible)}

    def finish(self) -> None:
        return None


class _ExhaustiveStrategy(_GridStrategy):
    """Every deployment of the space simulated (small spaces)."""

    algorithm = "exhaustive"

    def __init__(self, space, ev, settings, deployments: list[Deployment]) -> None:
        super().__init__(space, ev, settings)
        self.deployments = deployments

    def evaluate(self, population: list[Deployment]) -> None:
        self.ev.simulate(self.deployments)

    def stats(self, population: list[Deployment]) -> dict[str, float]:
        return {"screened": 0, "rejected_memory": 0}


def _check(ev: Evaluator, space: ServeSpace, result: SearchResult | None) -> None:
    """InputError when no deployment fits the memory, could be simulated, or meets the
    constraints (with the closest one and what it missed)."""
    s = space.settings
    if result is not None and math.isfinite(result.fitness):
        return
    case = space.case
    screened = ev.screened_plans()
    simulated = ev.simulated_plans()
    if screened and not any(e.feasible for _, e in screened) and not any(e.feasible for _, e in simulated):
        raise InputError(None, "search", f"no deployment of {case.model.name} leaves room for a KV cache on "
                                         f"{space.system.spec}'s GPUs ({len(screened)} screened)")
    runs = [(e.slo_ratio, d.text(), d, e) for d, e in simulated if e.feasible]
    if not runs:
        errors = [e.error for _, e in simulated if e.error]
        raise InputError(None, "search", "no deployment could be simulated" + (f" ({errors[0]})" if errors else ""))
    ratio, _, dep, e = min(runs, key=lambda x: (x[0], x[1]))
    where = (f"at any rate (tried down to {e.rate:.4g} requests/s)" if case.goodput else
             f"at {case.rate:.4g} requests/s")
    if s.objective == "cost" and ratio <= 1:
        raise InputError(None, "--gpu-price", "a deployment meets the constraints but its GPUs have no price")
    miss = e.slo_miss
    if not math.isfinite(ratio):  # every run stopped early: the one the screen found closest, run to its end
        from marssim.serve.case import evaluate_case

        def closest(item):
            screened = ev.screened(item[2])
            return (screened.slo_ratio if screened is not None else math.inf, item[1])

        _, _, dep, _ = min(runs, key=closest)
        full = evaluate_case(dep, case, ev.problem.system, ev.problem.cost, watch=False)
        miss = "; ".join(case.violations(full.summary, full.rate if case.goodput else None))
    raise InputError(None, "--slo", f"no deployment meets {case.constraints.text()} {where} "
                                    f"({len(simulated)} simulated); the closest, {dep.text()}: {miss}")


def _run(strategy_cls, case: ServeCase, system: System, cost: CostModel, settings: ServeSearchSettings,
         executor: Executor | None, budget: Budget, seeds: Sequence[Deployment] = (),
         progress: Callable[[GenerationDone], None] | None = None, **kwargs) -> SearchResult:
    if settings.objective not in SERVING_OBJECTIVES:
        raise ValueError(f"objective must be one of {', '.join(SERVING_OBJECTIVES)}, got {settings.objective!r}")
    space = ServeSpace.of(case, system, settings)
    ev = Evaluator(serve_problem(case, system, cost), executor)
    strategy = strategy_cls(space, ev, settings, **kwargs)
    notes = {"settings": settings, "requests": case.spec.text(), "seed_of_requests": case.seed,
             "constraints": case.constraints.text(), "rate": case.rate}
    try:
        result = two_level(strategy, ev, budget, settings.objective, seeds=seeds, seed=settings.seed,
                           progress=progress, notes=notes)
    except ValueError:
        result = None
    if result is not None:
        result.notes["runs"] = sum(e.runs for _, e in ev.simulated_plans())
        if strategy.front_note:
            result.notes["pareto"] = strategy.front_note
    _check(ev, space, result)
    return result


def mars_serve(case: ServeCase, system: System, cost: CostModel, settings: ServeSearchSettings | None = None, *,
               executor: Executor | None = None, seeds: Sequence[Deployment] = (),
               progress: Callable[[GenerationDone], None] | None = None) -> SearchResult:
    """The two-level search (module docstring); ``seeds``: deployments to start from (by default
    the grid's best, simulated, so the search never returns a worse one). ``progress`` is called
    with each generation's history row. Raises :class:`~marssim.search.result.SearchInterrupted`
    on Ctrl-C (with the best so far), InputError when nothing meets the constraints."""
    settings = settings or ServeSearchSettings()
    budget = Budget(settings.generations, settings.patience, settings.max_simulations - settings.front_reserve, None,
                    settings.time_limit_s)
    return _run(_ServeStrategy, case, system, cost, settings, executor, budget, seeds, progress)


def serve_grid_search(case: ServeCase, system: System, cost: CostModel, settings: ServeSearchSettings | None = None,
                      *, executor: Executor | None = None) -> SearchResult:
    """The baseline: :func:`uniform_grid` screened, its best simulated (module docstring)."""
    settings = settings or ServeSearchSettings()
    return _run(_GridStrategy, case, system, cost, settings, executor, Budget(generations=1))


def serve_exhaustive(case: ServeCase, system: System, cost: CostModel, settings: ServeSearchSettings | None = None,
                     *, executor: Executor | None = None, limit: int = 2000) -> SearchResult:
    """Every deployment of the space (:func:`all_deployments`) simulated; InputError when the
    space has more than ``limit``."""
    settings = settings or ServeSearchSettings()
    space = ServeSpace.of(case, system, settings)
    deployments = list(itertools.islice(all_deployments(space), limit + 1))
    if len(deployments) > limit:
        raise InputError(None, "--algorithm", f"the space has more than {limit} deployments; exhaustive search "
                                              "simulates every one")
    return _run(_ExhaustiveStrategy, case, system, cost, settings, executor, Budget(generations=1),
                deployments=deployments)
