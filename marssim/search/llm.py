"""MARS for LLM runs: a two-level genetic search over parallel configurations of a GPU cluster.

MARS's idea -- computation-aware selection of accelerators, communication-aware sharding --
carried to the question Megatron-LM users settle by hand:

* **level 1 (computation-aware)**: the number of pipeline stages and data-parallel replicas,
  which GPUs each stage runs on (on a cluster of several GPU kinds, which kind), how many layers
  each stage takes (uneven: a faster kind takes more; the first guesses give each stage layers in
  proportion to its GPUs' peak), the tensor-parallel degree of each stage, and on a uniform
  configuration the placement order of tensor, pipeline and data-parallel ranks;
* **level 2 (communication-aware)**: sequence parallelism, context parallelism (how many of a
  level-1 candidate's data-parallel GPUs split each sequence instead of taking sequences of their
  own), tensor-parallel communication overlap, micro-batch size, schedule and virtual stages,
  pipeline communication overlap, recomputation, ZeRO stage and the parameter all-gather's
  overlap, expert parallelism and expert tensor parallelism; for every level-1 candidate the best level-2 choice is found by
  coordinate descent over the screen, all candidates of a generation in lockstep (one batch of
  screens per coordinate).

Every candidate is first *screened* in closed form (:mod:`marssim.parallel.analytic`, a few ms;
memory-infeasible ones rejected there and counted) and the ``simulate_top`` best screened
candidates of each generation are *simulated*, side by side on the executor, while the next
generation is screened on the workers the shorter ones free (nothing the search decides reads a
simulation before the stopping rule of its generation needs it; see
:meth:`~marssim.search.evaluate.Evaluator.simulate_soon`); the search returns the best simulated
configuration. It is seeded with the best configurations of the baseline,
the exhaustive grid of uniform Megatron-legal configurations ranked by the same screen
(:func:`megatron_grid`), so it never returns a worse one. The loop, the evaluator, the result
and Ctrl-C are those of every search (:mod:`marssim.search.skeleton`); this module is the
genome and the level-2 strategy.

Serving (``mode=serve`` workloads): the objective is the time per output token, or with
``ttft_bound`` the output tokens per second of the configurations whose time to first token
meets the bound (a constraint, not a weighted sum).

Evaluations run on any ``concurrent.futures.Executor`` (a process pool, a Dask cluster's
executor); results come back in order, so a seed gives the same search on any executor.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass, field, replace

import numpy as np

from marssim.cost.base import CostModel
from marssim.errors import InputError
from marssim.parallel import ParallelConfig, parallel_problems
from marssim.plan import plan_key
from marssim.progress import GenerationDone
from marssim.system import System
from marssim.workload import Graph
from marssim.workload.llm import TransformerConfig, require_transformer, transformer_of

from .evaluate import Evaluator, ParallelEvaluation, Problem, rank_value
from .result import SearchResult
from .operators import coordinate_descent, next_population
from .skeleton import Budget, two_level

__all__ = ["LLMSearchSettings", "LLMSpace", "megatron_grid", "mars_llm", "grid_search", "screen_configs",
           "simulate_configs", "llm_search_available"]


def llm_search_available(graph: Graph, system: System) -> bool:
    """True when ``graph`` is an LLM and every accelerator of ``system`` is a GPU-class design:
    the search over parallel configurations applies."""
    if transformer_of(graph) is None:
        return False
    return all(system.designs[a.designs[0]].dataflow == "gpu" for a in system.accelerators)


@dataclass(frozen=True)
class LLMSearchSettings:
    """``objective``: ``latency`` (training: iteration time; serving: time per output token) or
    ``throughput`` (training: sequences/s, the same ranking; serving: output tokens/s under
    ``ttft_bound`` seconds). ``global_batch``: sequences per training iteration (default: the
    workload's batch). Budget: ``generations`` of ``population`` level-1 candidates, stopping
    after ``patience`` generations that improve neither the best simulated nor the best screened
    value; the ``simulate_top`` best screened candidates simulated per generation, side by side,
    ``grid_simulate`` of the grid; ``max_simulations`` in all; ``time_limit_s`` ends the search
    at the first generation past that wall time (the result then depends on the machine's
    speed)."""

    objective: str = "latency"
    ttft_bound: float | None = None
    global_batch: int = 0
    population: int = 12
    generations: int = 30
    patience: int = 6
    simulate_top: int = 2
    grid_simulate: int = 2
    max_simulations: int = 12
    micro_batches: tuple[int, ...] = (1, 2, 4, 8)
    recompute: tuple[str, ...] = ("none", "selective", "full")
    zero: tuple[int, ...] = (0, 1)
    schedules: tuple[str, ...] = ("1f1b", "interleaved", "gpipe")
    sp: tuple[bool, ...] = (False, True)
    cp: tuple[int, ...] = (1, 2, 4, 8)
    tp_comm_overlap: tuple[bool, ...] = (False, True)
    overlap_param_gather: tuple[bool, ...] = (False, True)
    overlap_p2p_comm: tuple[bool, ...] = (False, True)
    expert_parallel: bool = True
    max_pp: int = 64
    time_limit_s: float | None = None
    seed: int = 0
    seed_with_grid: bool = True


def llm_fitness(evaluation: ParallelEvaluation, settings: LLMSearchSettings) -> float:
    """The value a configuration is ranked by (smaller is better): the objective, with the
    serving search's time-to-first-token bound as a constraint."""
    if (settings.objective == "throughput" and settings.ttft_bound is not None and evaluation.serving
            and not evaluation.ttft <= settings.ttft_bound):
        return math.inf
    return evaluation.fitness(settings.objective)


# ----------------------------------------------------------------------------- the space
@dataclass
class LLMSpace:
    """The legal choices for ``graph`` on ``system``: GPUs, GPUs per node, tensor-parallel
    degrees, layer count, GPU kinds (consecutive blocks of one design) and their peaks."""

    graph: Graph
    system: System
    settings: LLMSearchSettings
    gpus: int = 0
    per_node: int = 8
    tp_choices: tuple[int, ...] = ()
    layers: int = 0
    kind_of_gpu: tuple[str, ...] = ()
    peak_of_kind: dict = field(default_factory=dict)
    global_batch: int = 1

    @classmethod
    def of(cls, graph: Graph, system: System, settings: LLMSearchSettings) -> "LLMSpace":
        t = require_transformer(graph, "the search over parallel configurations")
        gpus = len(system.accelerators)
        router = getattr(system, "_router", None)
        per_node = len(router.node_gpus[0]) if router is not None and router.node_gpus else min(8, gpus)
        tps = tuple(tp for tp in (1, 2, 4, 8, 16, 32, 64) if tp <= per_node and t.heads % tp == 0
                    and all(w % tp == 0 for w in t.split_widths) and (t.kv % tp == 0 or tp % t.kv == 0))
        kinds = tuple(a.designs[0] for a in system.accelerators)
        peaks = {}
        for k in set(kinds):
            table = system.designs[k].gpu.peak_flops
            peaks[k] = float(table.get(t.dtype) or table.get("bf16") or max(table.values()))
        gb = settings.global_batch or t.batch
        return cls(graph, system, settings, gpus, per_node, tps, t.layers, kinds, peaks, gb)

    @property
    def transformer(self) -> TransformerConfig:
        """The configuration of the LLM searched."""
        return require_transformer(self.graph, "the search over parallel configurations")

    @property
    def training(self) -> bool:
        return self.transformer.training

    @property
    def heterogeneous(self) -> bool:
        return len(set(self.kind_of_gpu)) > 1

    def dps(self) -> list[int]:
        """Data-parallel x context-parallel GPUs per model-parallel rank: divisors of the GPUs
        that, for some context-parallel degree, leave a replica count dividing the global batch."""
        return [d for d in range(1, self.gpus + 1) if self.gpus % d == 0 and
                (not self.training or any(self.global_batch % (d // c) == 0 for c in self.cps(d)))]

    def cps(self, dp: int) -> tuple[int, ...]:
        """Context-parallel degrees open to ``dp`` data-parallel GPUs per model-parallel rank: the
        settings' degrees that divide ``dp`` and the sequence into ``2 cp`` chunks, for a training
        workload with a fused attention core (1 otherwise)."""
        t = self.transformer
        if not self.training or t.attention == "unfused":
            return (1,)
        return tuple(c for c in self.settings.cp if c == 1 or (dp % c == 0 and t.seq % (2 * c) == 0))

    def etps(self, tp: int) -> tuple[int, ...]:
        """Expert tensor parallelism for stages of at least ``tp``: 0 (the tensor-parallel degree)
        and its smaller divisors, for a mixture-of-experts model (a dense model: 0)."""
        if not self.transformer.experts or not self.settings.expert_parallel:
            return (0,)
        return (0,) + tuple(e for e in range(1, tp) if tp % e == 0)

    def eps(self, dp: int, tp: int = 1) -> tuple[int, ...]:
        """Expert-parallel degrees for ``dp`` replicas of ``tp`` tensor-parallel ranks: divisors of
        both ``tp x dp`` and the experts (a dense model: 1). Those not dividing ``dp`` need an
        expert tensor parallelism below ``tp`` (the expert groups take tensor-parallel ranks
        first, :mod:`marssim.parallel.experts`); a level-2 search reaches them through ``etp``,
        and the configuration's check refuses the combinations that do not fit."""
        experts = self.transformer.experts
        if not experts or not self.settings.expert_parallel:
            return (1,)
        ranks = tp * dp
        return tuple(e for e in range(1, ranks + 1) if ranks % e == 0 and experts % e == 0)

    def block_speed(self, start: int, size: int) -> float:
        return sum(self.peak_of_kind[k] for k in self.kind_of_gpu[start:start + size])


def _balanced(total: int, parts: int) -> tuple[int, ...]:
    return tuple(total // parts + (1 if i < total % parts else 0) for i in range(parts))


def _proportional(total: int, weights: Sequence[float]) -> tuple[int, ...]:
    """``total`` split in proportion to ``weights``, each part at least 1 (largest remainders)."""
    n = len(weights)
    if total < n:
        return _balanced(total, n)
    raw = [max(1e-12, w) / sum(weights) * (total - n) for w in weights]
    base = [1 + int(math.floor(r)) for r in raw]
    rest = total - sum(base)
    order = sorted(range(n), key=lambda i: (-(raw[i] - math.floor(raw[i])), i))
    for i in order[:rest]:
        base[i] += 1
    return tuple(base)


@dataclass(frozen=True)
class _Genome:
    pp: int
    dp: int  # data-parallel x context-parallel GPUs per model-parallel rank (level 1); cp divides it
    tps: tuple[int, ...]  # per stage
    layers: tuple[int, ...]
    perm: tuple[int, ...]  # stage -> position of its block along the GPUs
    order: str
    sp: bool
    micro: int
    schedule: str
    virtual: int
    recompute: str
    zero: int
    ep: int = 1
    cp: int = 1
    tp_comm_overlap: bool = False
    overlap_param_gather: bool = False
    overlap_p2p_comm: bool = False
    etp: int = 0

    def starts(self) -> tuple[int, ...]:
        """The first GPU of each stage: the stages' blocks (``tps[s] * dp`` GPUs) laid along the
        GPUs in the order ``perm`` gives."""
        pos = {p: s for s, p in enumerate(self.perm)}
        at, out = 0, [0] * self.pp
        for p in range(self.pp):
            s = pos[p]
            out[s] = at
            at += self.tps[s] * self.dp
        return tuple(out)

    def config(self, space: LLMSpace) -> ParallelConfig:
        """The configuration the genome stands for, canonical: on a cluster of one GPU kind, the
        stages of one tensor-parallel degree take their blocks of GPUs in order (a permutation of
        identical blocks places the same work on identical GPUs)."""
        uniform_tp = len(set(self.tps)) == 1
        identity = self.perm == tuple(range(self.pp)) or (uniform_tp and not space.heterogeneous)
        starts = self.starts() if not identity or not uniform_tp else ()
        balanced = self.layers == _balanced(space.layers, self.pp)
        gb = space.global_batch if space.training else 0
        return ParallelConfig(
            tp=self.tps[0], pp=self.pp, dp=self.dp // self.cp, cp=self.cp, sp=self.sp, schedule=self.schedule,
            tp_comm_overlap=self.tp_comm_overlap, overlap_param_gather=self.overlap_param_gather,
            overlap_p2p_comm=self.overlap_p2p_comm, etp=self.etp,
            virtual_stages=self.virtual if self.schedule == "interleaved" else 1,
            micro_batch=self.micro, global_batch=gb, recompute=self.recompute, zero=self.zero, ep=self.ep,
            layers_per_stage=() if balanced else self.layers,
            stage_tp=() if uniform_tp else self.tps, stage_start=starts,
            order=self.order if identity and uniform_tp else "tp-pp-dp")


def _level1(g: _Genome) -> tuple:
    """The level-1 genes of ``g`` (what a generation's coordinate descent does not change)."""
    return (g.pp, g.dp, g.tps, g.layers, g.perm, g.order)


def _legal(space: LLMSpace, cfg: ParallelConfig) -> bool:
    t = space.transformer
    return not parallel_problems(cfg, replace(t, batch=cfg.micro_batch), space.gpus)


# ----------------------------------------------------------------------------- evaluation
def screen_configs(graph: Graph, system: System, cost: CostModel, configs: Sequence[ParallelConfig],
                   executor: Executor | None = None) -> list[ParallelEvaluation]:
    """Screen ``configs`` (closed form), in order, on ``executor``."""
    return Evaluator(Problem(graph, system, cost), executor).estimate(list(configs))


def simulate_configs(graph: Graph, system: System, cost: CostModel, configs: Sequence[ParallelConfig],
                     executor: Executor | None = None) -> list[ParallelEvaluation]:
    """Simulate ``configs``, in order, on ``executor`` (one configuration per task)."""
    return Evaluator(Problem(graph, system, cost), executor).simulate(list(configs), side_by_side=True)


# ----------------------------------------------------------------------------- the baseline grid
def megatron_grid(space: LLMSpace) -> list[ParallelConfig]:
    """Every uniform Megatron-legal configuration: ``tp * pp * dp * cp`` = the GPUs, ``tp`` within
    a node, every context-parallel degree, micro-batch, schedule (interleaved with 2 virtual
    stages where legal), sequence parallelism, recomputation, ZeRO and (mixture-of-experts models)
    expert-parallel choice of the settings; the overlap settings on wherever they apply
    (``tp_comm_overlap`` with sequence parallelism, ``overlap_param_gather`` with ZeRO,
    ``overlap_p2p_comm`` with the interleaved schedule); balanced layers, default
    placement. On a cluster of several GPU kinds these are the "uniform layers on every kind"
    configurations."""
    s = space.settings
    out = []
    for tp in space.tp_choices:
        for dp in space.dps():
            if space.gpus % (tp * dp):
                continue
            pp = space.gpus // (tp * dp)
            if pp > min(space.layers, s.max_pp):
                continue
            for cp, micro in itertools.product(space.cps(dp), s.micro_batches if space.training
                                               else (space.graph.batch,)):
                if space.training and (space.global_batch % (micro * (dp // cp))):
                    continue
                for schedule in (s.schedules if space.training else ("1f1b",)):
                    if schedule != "1f1b" and pp == 1:
                        continue
                    for sp in s.sp:
                        if sp and tp == 1:
                            continue
                        for recompute in (s.recompute if space.training else ("none",)):
                            for zero in (s.zero if space.training and dp > 1 else (0,)):
                                for ep in space.eps(dp):
                                    # the overlaps on wherever they apply, as NeMo's performance recipes run
                                    g = _Genome(pp, dp, (tp,) * pp, _balanced(space.layers, pp), tuple(range(pp)),
                                                "tp-pp-dp", sp, micro, schedule, 2, recompute, zero, ep, cp,
                                                sp and True in s.tp_comm_overlap,
                                                zero in (1, 2) and True in s.overlap_param_gather,
                                                schedule == "interleaved" and True in s.overlap_p2p_comm)
                                    cfg = g.config(space)
                                    if _legal(space, cfg):
                                        out.append(cfg)
    return sorted(set(out), key=lambda c: c.text())


# ----------------------------------------------------------------------------- the GA
_GENES = ("sp", "cp", "tp_comm_overlap", "micro", "schedule", "overlap_p2p_comm", "recompute", "zero",
          "overlap_param_gather", "ep", "etp")


class _LLMStrategy:
    """The parallel-configuration GA as a :class:`~marssim.search.skeleton.Strategy`."""

    algorithm = "mars"

    def __init__(self, space: LLMSpace, ev: Evaluator, settings: LLMSearchSettings) -> None:
        self.space = space
        self.ev = ev
        self.settings = settings
        self.rng = np.random.default_rng(settings.seed)
        self.tried: set[tuple] = set()
        self.scored: list[tuple[_Genome, ParallelEvaluation]] = []
        self.best_screen = math.inf
        self._improved = False

    # --------------------------------------------------------------- evaluation
    def fitness(self, evaluation: ParallelEvaluation) -> float:
        return llm_fitness(evaluation, self.settings)

    def screen(self, configs: Sequence[ParallelConfig]) -> list[ParallelEvaluation]:
        return self.ev.estimate(list(configs))

    def simulate(self, configs: Sequence[ParallelConfig]) -> None:
        """Simulate the configurations not simulated yet that fit, side by side, within the
        budget of simulations, without waiting for them (:meth:`Evaluator.simulate_soon`: the
        search screens on while they run; nothing it decides reads them before the history row
        of their generation, which waits for them)."""
        todo = [c for c in dict.fromkeys(configs) if not self.ev.simulated_or_in_flight(c)
                and (self.ev.screened(c) is None or self.ev.screened(c).feasible)]
        todo = todo[:max(0, self.settings.max_simulations - self.ev.simulations)]
        if todo:
            self.ev.simulate_soon(todo)

    def best_screened(self, n: int, exclude_simulated: bool = True) -> list[ParallelConfig]:
        ranked = []
        for cfg, e in self.ev.screened_plans():
            f = self.fitness(e)
            if math.isfinite(f) and (not exclude_simulated or not self.ev.simulated_or_in_flight(cfg)):
                ranked.append((rank_value(f), cfg.text(), cfg))
        return [c for _, _, c in sorted(ranked, key=lambda x: x[:2])[:n]]

    # --------------------------------------------------------------- the strategy
    def initial(self, seeds: Sequence[ParallelConfig]) -> list[_Genome]:
        """The seeds' genomes (without seeds: the best configurations of :func:`megatron_grid`,
        screened and simulated, unless ``seed_with_grid`` is off), then random level-1 genomes."""
        if not seeds and self.settings.seed_with_grid:
            self.screen(megatron_grid(self.space))
            seeds = self.best_screened(self.settings.grid_simulate, exclude_simulated=False)
            self.simulate(seeds)
            seeds = [c for c in seeds if self.ev.simulated_or_in_flight(c)]
        population = [self.genome_of(cfg) for cfg in seeds]
        while len(population) < self.settings.population:
            population.append(self.random_level1())
        return population

    def evaluate(self, population: list[_Genome]) -> None:
        before = self.best_screen
        self.scored = self.level2(population)
        self.tried.update(_level1(g) for g in population)
        self.simulate(self.best_screened(self.settings.simulate_top))
        finite = [self.fitness(e) for _, e in self.ev.screened_plans()]
        self.best_screen = min((f for f in finite if math.isfinite(f)), default=math.inf)
        self._improved = self.best_screen < before

    def breed(self, population: list[_Genome]) -> list[_Genome]:
        return self.next_generation(self.scored)

    def improved(self) -> bool:
        return self._improved

    def stats(self, population: list[_Genome]) -> dict[str, float]:
        values = [self.fitness(e) for _, e in self.scored]
        finite = [v for v in values if math.isfinite(v)]
        screened = self.ev.screened_plans()
        return {"population_best": min(finite, default=math.inf),
                "mean_fitness": float(np.mean(finite)) if finite else math.inf, "screened": len(screened),
                "rejected_memory": sum(1 for _, e in screened if not e.feasible)}

    def finish(self) -> None:
        self.simulate(self.best_screened(1))

    # --------------------------------------------------------------- genomes
    def genome_of(self, cfg: ParallelConfig) -> _Genome:
        pp = cfg.pp
        tps = tuple(cfg.tp_of(s) for s in range(pp))
        layers = cfg.layers_per_stage or _balanced(self.space.layers, pp)
        if cfg.stage_start:
            order = sorted(range(pp), key=lambda s: cfg.stage_start[s])
            perm = tuple(order.index(s) for s in range(pp))
        else:
            perm = tuple(range(pp))
        return _Genome(pp, cfg.dp_cp, tps, tuple(layers), perm, cfg.order, cfg.sp, cfg.micro_batch, cfg.schedule,
                       max(2, cfg.virtual_stages), cfg.recompute, cfg.zero, cfg.ep, cfg.cp, cfg.tp_comm_overlap,
                       cfg.overlap_param_gather, cfg.overlap_p2p_comm, cfg.etp)

    def random_level1(self) -> _Genome:
        sp = self.space
        for _ in range(200):
            dp = int(self.rng.choice(sp.dps()))
            per_replica = sp.gpus // dp
            pps = [p for p in range(1, min(sp.layers, self.settings.max_pp, per_replica) + 1)
                   if per_replica % p == 0 and per_replica // p in sp.tp_choices]
            if not pps:
                continue
            pp = int(self.rng.choice(pps))
            tp = per_replica // pp
            g = _Genome(pp, dp, (tp,) * pp, _balanced(sp.layers, pp), tuple(range(pp)), "tp-pp-dp", False,
                        self.settings.micro_batches[0] if sp.training else sp.graph.batch, "1f1b", 2, "none", 0)
            if sp.heterogeneous and pp > 1:
                g = self.computation_aware(g)
            return g
        raise InputError(None, "search", f"no parallel configuration of {sp.gpus} GPUs fits the model's heads "
                                         f"and layers")

    def computation_aware(self, g: _Genome) -> _Genome:
        """Layers in proportion to each stage's GPUs' peak FLOP/s (level 1's first guess)."""
        starts = g.starts()
        speeds = [self.space.block_speed(starts[s], g.tps[s] * g.dp) for s in range(g.pp)]
        return replace(g, layers=_proportional(self.space.layers, speeds))

    def mutate1(self, g: _Genome) -> _Genome:
        """One level-1 move: a layer to a neighbouring stage, two stages' GPU blocks swapped, a
        stage's tensor parallelism traded with another's, another pipeline/data split, a stage
        split in two (or two merged), another placement order."""
        sp = self.space
        move = int(self.rng.integers(6))
        if move == 0 and g.pp > 1:
            layers = list(g.layers)
            i = int(self.rng.integers(g.pp - 1))
            a, b = (i, i + 1) if self.rng.random() < 0.5 else (i + 1, i)
            if layers[a] > 1:
                layers[a] -= 1
                layers[b] += 1
            return replace(g, layers=tuple(layers))
        if move == 1 and g.pp > 1:
            perm = list(g.perm)
            i, j = self.rng.choice(g.pp, 2, replace=False)
            perm[i], perm[j] = perm[j], perm[i]
            return replace(g, perm=tuple(perm))
        if move == 2 and g.pp > 1 and len(sp.tp_choices) > 1:
            tps = list(g.tps)
            i, j = self.rng.choice(g.pp, 2, replace=False)
            if tps[i] > min(sp.tp_choices) and tps[j] * 2 in sp.tp_choices and tps[i] // 2 in sp.tp_choices:
                # halve one stage and double another only when the GPU totals still agree
                if tps[i] // 2 + tps[j] * 2 == tps[i] + tps[j]:
                    tps[i], tps[j] = tps[i] // 2, tps[j] * 2
            return replace(g, tps=tuple(tps))
        if move == 4:
            return self.split_or_merge(g)
        if move == 3:
            return replace(self.random_level1(), **{k: getattr(g, k) for k in (
                "sp", "micro", "schedule", "virtual", "recompute", "zero", "tp_comm_overlap", "overlap_param_gather",
                "overlap_p2p_comm", "etp")})
        orders = ("tp-pp-dp", "tp-dp-pp")
        return replace(g, order=orders[(orders.index(g.order) + 1) % 2] if g.order in orders else orders[0])

    def split_or_merge(self, g: _Genome) -> _Genome:
        """A stage split into two of half its tensor parallelism on the two halves of its GPUs
        (its layers shared between them), or two stages of one tensor-parallel degree on
        neighbouring GPU blocks merged into one of twice the degree: stage counts that do not
        divide the GPUs evenly (on a cluster of two kinds: one stage per A100 node, two per
        H100 node)."""
        sp, tps, layers, perm = self.space, list(g.tps), list(g.layers), list(g.perm)
        if self.rng.random() < 0.5:
            splits = [i for i in range(g.pp) if tps[i] // 2 in sp.tp_choices and tps[i] > 1 and layers[i] > 1]
            if not splits or g.pp >= min(self.settings.max_pp, sp.layers):
                return g
            i = int(self.rng.choice(splits))
            at = perm[i]
            perm = [p + 1 if p > at else p for p in perm]
            perm.insert(i + 1, at + 1)
            tps[i:i + 1] = [tps[i] // 2] * 2
            layers[i:i + 1] = [layers[i] - layers[i] // 2, layers[i] // 2]
        else:
            merges = [i for i in range(g.pp - 1) if tps[i] == tps[i + 1] and tps[i] * 2 in sp.tp_choices
                      and abs(perm[i] - perm[i + 1]) == 1]
            if not merges:
                return g
            i = int(self.rng.choice(merges))
            at, gone = min(perm[i], perm[i + 1]), max(perm[i], perm[i + 1])
            perm[i] = at
            del perm[i + 1]
            perm = [p - 1 if p > gone else p for p in perm]
            tps[i:i + 2] = [tps[i] * 2]
            layers[i:i + 2] = [layers[i] + layers[i + 1]]
        return replace(g, pp=len(tps), tps=tuple(tps), layers=tuple(layers), perm=tuple(perm),
                       virtual=g.virtual, schedule=g.schedule if len(tps) > 1 else "1f1b")

    def crossover1(self, a: _Genome, b: _Genome) -> _Genome:
        """Uniform crossover of two level-1 genomes of the same shape (pp, dp); else ``a``."""
        if (a.pp, a.dp) != (b.pp, b.dp):
            return a
        pick = self.rng.random(3) < 0.5
        return replace(a, layers=b.layers if pick[0] else a.layers, perm=b.perm if pick[1] else a.perm,
                       tps=b.tps if pick[2] and sum(b.tps) == sum(a.tps) else a.tps)

    def level2(self, genomes: list[_Genome]) -> list[tuple[_Genome, ParallelEvaluation]]:
        """The best level-2 choice for each genome's level 1, by coordinate descent over the
        screen: every genome's trials of a coordinate screened as one batch; a genome whose
        round changed nothing stops."""
        sp = self.space

        def options(g: _Genome, gene: str) -> list[tuple[_Genome, ParallelConfig]]:
            legal = [(t, t.config(sp)) for t in (replace(g, **{gene: v}) for v in self.gene_values(g)[gene])]
            return [(t, c) for t, c in legal if _legal(sp, c)]

        best = coordinate_descent(genomes, lambda _: _GENES, options, self.screen,
                                  lambda c, e: (rank_value(self.fitness(e)), c.text()))
        out: list[tuple[_Genome, ParallelEvaluation]] = []
        configs = [g.config(sp) for g in best]
        legal = [c for c in configs if _legal(sp, c)]
        evals = dict(zip(map(plan_key, legal), self.screen(legal)))
        for g, c in zip(best, configs):
            out.append((g, evals.get(plan_key(c), ParallelEvaluation(math.inf, feasible=False, error="not legal"))))
        return out

    def gene_values(self, g: _Genome) -> dict[str, tuple]:
        """The level-2 choices open to ``g`` (its level 1 fixes which apply)."""
        s, sp = self.settings, self.space
        return {"sp": s.sp if max(g.tps) > 1 else (False,),
                "micro": s.micro_batches if sp.training else (sp.graph.batch,),
                "schedule": s.schedules if sp.training and g.pp > 1 else ("1f1b",),
                "recompute": s.recompute if sp.training else ("none",),
                "zero": s.zero if sp.training and g.dp > 1 else (0,),
                "ep": sp.eps(g.dp, min(g.tps)),
                "cp": sp.cps(g.dp),
                "tp_comm_overlap": s.tp_comm_overlap if max(g.tps) > 1 else (False,),
                "overlap_p2p_comm": s.overlap_p2p_comm if sp.training and g.pp > 1 else (False,),
                "overlap_param_gather": s.overlap_param_gather if sp.training and g.dp > 1 else (False,),
                "etp": sp.etps(min(g.tps))}

    def next_generation(self, scored: list[tuple[_Genome, ParallelEvaluation]]) -> list[_Genome]:
        ranked = sorted(scored, key=lambda x: (rank_value(self.fitness(x[1])), x[0].config(self.space).text()))
        return next_population([g for g, _ in ranked], self.settings.population, self.rng, self.crossover1,
                               self.mutate1, _level1, self.tried)


def _check(ev: Evaluator, settings: LLMSearchSettings, result: SearchResult | None) -> None:
    """InputError when nothing fits the memory, could be simulated, or meets the
    time-to-first-token bound."""
    screened = ev.screened_plans()
    if result is None or not math.isfinite(llm_fitness(result.evaluation, settings)):
        if screened and not any(e.feasible for _, e in screened):
            raise InputError(None, "search", "no configuration fits the GPUs' memory (every candidate was rejected: "
                                             f"{len(screened)} by the memory model)")
        if settings.ttft_bound is not None:
            fastest = min((e.ttft for _, e in screened if e.feasible and e.ttft == e.ttft), default=math.nan)
            raise InputError(None, "--ttft-bound", f"no configuration meets the time-to-first-token bound of "
                                                   f"{settings.ttft_bound * 1e3:.3f} ms (the fastest screened: "
                                                   f"{fastest * 1e3:.3f} ms)")
        errors = [e.error for _, e in ev.simulated_plans() if e.error]
        raise InputError(None, "search", "no configuration could be simulated" + (f" ({errors[0]})" if errors else ""))


def mars_llm(graph: Graph, system: System, cost: CostModel, settings: LLMSearchSettings | None = None, *,
             executor: Executor | None = None, seeds: Sequence[ParallelConfig] = (),
             progress: Callable[[GenerationDone], None] | None = None) -> SearchResult:
    """The two-level search (module docstring); ``seeds``: configurations to start from (by
    default the best ones of :func:`megatron_grid`, simulated, so the search never returns a
    worse configuration). ``progress`` is called with each generation's :class:`~marssim.progress.GenerationDone`. Raises
    :class:`~marssim.search.result.SearchInterrupted` on Ctrl-C (the best so far with it)."""
    settings = settings or LLMSearchSettings()
    space = LLMSpace.of(graph, system, settings)
    ev = Evaluator(Problem(graph, system, cost), executor)
    strategy = _LLMStrategy(space, ev, settings)
    budget = Budget(settings.generations, settings.patience, settings.max_simulations, None, settings.time_limit_s)
    try:
        result = two_level(strategy, ev, budget, settings.objective, seeds=seeds, seed=settings.seed,
                           progress=progress, notes={"settings": settings})
    except ValueError:
        result = None
    _check(ev, settings, result)
    return result


class _GridStrategy(_LLMStrategy):
    """The baseline as a one-generation strategy: the grid screened, its best simulated."""

    algorithm = "megatron-grid"

    def initial(self, seeds: Sequence[ParallelConfig]) -> list[_Genome]:
        return []

    def evaluate(self, population: list[_Genome]) -> None:
        self.screen(megatron_grid(self.space))
        self.simulate(self.best_screened(self.settings.grid_simulate, exclude_simulated=False))

    def stats(self, population: list[_Genome]) -> dict[str, float]:
        screened = self.ev.screened_plans()
        return {"screened": len(screened), "rejected_memory": sum(1 for _, e in screened if not e.feasible)}

    def finish(self) -> None:
        return None


def grid_search(graph: Graph, system: System, cost: CostModel, settings: LLMSearchSettings | None = None, *,
                executor: Executor | None = None) -> SearchResult:
    """The baseline: :func:`megatron_grid` screened, its best ``grid_simulate`` simulated."""
    settings = settings or LLMSearchSettings()
    space = LLMSpace.of(graph, system, settings)
    ev = Evaluator(Problem(graph, system, cost), executor)
    strategy = _GridStrategy(space, ev, settings)
    try:
        result = two_level(strategy, ev, Budget(generations=1), settings.objective, seed=settings.seed,
                           notes={"settings": settings})
    except ValueError:
        result = None
    _check(ev, settings, result)
    return result
