"""MARS for LLM runs: a two-level genetic search over parallel configurations of a GPU cluster.

MARS's idea -- computation-aware selection of accelerators, communication-aware sharding --
carried to the question Megatron-LM users settle by hand:

* **level 1 (computation-aware)**: the number of pipeline stages and data-parallel replicas,
  which GPUs each stage runs on (on a cluster of several GPU kinds, which kind), how many layers
  each stage takes (uneven: a faster kind takes more; the first guesses give each stage layers in
  proportion to its GPUs' peak), the tensor-parallel degree of each stage, and on a uniform
  configuration the placement order of tensor, pipeline and data-parallel ranks;
* **level 2 (communication-aware)**: sequence parallelism, micro-batch size, schedule and
  virtual stages, recomputation, ZeRO stage; for every level-1 candidate the best level-2 choice
  is found by coordinate descent.

Every candidate is first *screened* in closed form (:mod:`marssim.parallel.analytic`, a few ms;
memory-infeasible ones rejected there and counted) and the best screened candidates of each
generation are *simulated*; the search returns the best simulated configuration. It is seeded
with the best configurations of the baseline, the exhaustive grid of uniform Megatron-legal
configurations ranked by the same screen (:func:`megatron_grid`), so it never returns a worse one.

Serving (``mode=serve`` workloads): the objective is the time per output token, or with
``ttft_bound`` the output tokens per second of the configurations whose time to first token
meets the bound (a constraint, not a weighted sum).

Evaluations run on any ``concurrent.futures.Executor`` (a process pool, a Dask cluster's
executor); results come back in order, so a seed gives the same search on any executor.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass, field, replace

import numpy as np
import pandas as pd

from marssim.cost.base import CostModel
from marssim.errors import InputError
from marssim.parallel import ParallelConfig, parallel_problems
from marssim.system import System
from marssim.workercache import pickled, worker_copy
from marssim.workload import Graph

__all__ = ["graph_for", "LLMSearchSettings", "LLMSearchResult", "Candidate", "LLMSpace", "megatron_grid", "mars_llm",
           "screen_configs", "simulate_configs", "llm_search_available"]


def llm_search_available(graph: Graph, system: System) -> bool:
    """True when ``graph`` is an LLM and every accelerator of ``system`` is a GPU-class design:
    the search over parallel configurations applies."""
    if graph.meta.get("transformer") is None:
        return False
    return all(system.designs[a.designs[0]].dataflow == "gpu" for a in system.accelerators)


@dataclass(frozen=True)
class LLMSearchSettings:
    """``objective``: ``latency`` (training: iteration time; serving: time per output token) or
    ``throughput`` (training: sequences/s, the same ranking; serving: output tokens/s under
    ``ttft_bound`` seconds). ``global_batch``: sequences per training iteration (default: the
    workload's batch). Budget: ``generations`` of ``population`` level-1 candidates, stopping
    after ``patience`` generations that improve neither the best simulated nor the best screened
    value; ``simulate_top`` best screened candidates simulated
    per generation, ``grid_simulate`` of the grid; ``max_simulations`` in all; ``time_limit_s``
    ends the search at the first generation past that wall time (the result then depends on the
    machine's speed)."""

    objective: str = "latency"
    ttft_bound: float | None = None
    global_batch: int = 0
    population: int = 12
    generations: int = 30
    patience: int = 6
    simulate_top: int = 1
    grid_simulate: int = 2
    max_simulations: int = 12
    micro_batches: tuple[int, ...] = (1, 2, 4, 8)
    recompute: tuple[str, ...] = ("none", "selective", "full")
    zero: tuple[int, ...] = (0, 1)
    schedules: tuple[str, ...] = ("1f1b", "interleaved", "gpipe")
    sp: tuple[bool, ...] = (False, True)
    expert_parallel: bool = True
    max_pp: int = 64
    time_limit_s: float | None = None
    seed: int = 0
    seed_with_grid: bool = True


@dataclass(frozen=True)
class Candidate:
    """One evaluated configuration: its screen (closed form) and, when simulated, the
    simulation's report figures. Seconds, bytes, FLOP/s."""

    config: ParallelConfig
    screened_s: float = math.inf
    fits: bool = True
    memory_peak: float = 0.0
    simulated_s: float = math.nan
    mfu: float = math.nan
    exposed: dict = field(default_factory=dict)
    ttft_s: float = math.nan
    tpot_s: float = math.nan
    sim_memory_peak: float = math.nan
    throughput: float = math.nan  # serving: output tokens/s when the time-to-first-token bound holds
    error: str = ""
    lower_s: float = 0.0  # wall seconds its lowering took (simulated candidates)
    sim_s: float = 0.0  # wall seconds its simulation took

    @property
    def simulated(self) -> bool:
        return self.simulated_s == self.simulated_s


@dataclass
class LLMSearchResult:
    """The outcome: the best simulated configuration, the candidates seen (screened, some
    simulated), the history per generation, and the counts."""

    algorithm: str
    objective: str
    best: Candidate
    candidates: list[Candidate]
    history: pd.DataFrame
    screened: int
    rejected_memory: int
    simulations: int
    wall_s: float
    seed: int = 0
    timing: dict = field(default_factory=dict)

    def top(self, n: int = 10) -> pd.DataFrame:
        """The ``n`` best simulated configurations (then the best screened), one row each."""
        rows = []
        ranked = sorted(self.candidates, key=lambda c: (not c.simulated, _key(c, self.objective), c.config.text()))
        for c in ranked[:n]:
            rows.append({"config": c.config.text(), "simulated_ms": c.simulated_s * 1e3,
                         "screened_ms": c.screened_s * 1e3, "mfu": c.mfu,
                         "memory_peak_GiB": (c.sim_memory_peak if c.simulated else c.memory_peak) / 2**30,
                         **{f"exposed_{k}_ms": v * 1e3 for k, v in sorted(c.exposed.items()) if k != "bubble"},
                         "bubble_ms": c.exposed.get("bubble", math.nan) * 1e3,
                         "ttft_ms": c.ttft_s * 1e3, "tpot_ms": c.tpot_s * 1e3})
        return pd.DataFrame(rows)

    def summary(self) -> str:
        b = self.best
        what = {"latency": "iteration" if math.isnan(b.tpot_s) else "time per output token"}.get(self.objective,
                                                                                              "throughput objective")
        value = b.tpot_s if not math.isnan(b.tpot_s) and self.objective == "latency" else b.simulated_s
        return (f"{self.algorithm}: best {b.config.text()}: {what} {value * 1e3:.3f} ms, MFU {b.mfu:.1%}; "
                f"{self.screened} screened ({self.rejected_memory} rejected by memory), {self.simulations} simulated "
                f"in {self.wall_s:.1f} s")


def _key(c: Candidate, objective: str) -> float:
    """The value a candidate is ranked by (smaller is better): simulated when it was, else
    screened. Serving: time per output token, or minus tokens/s when the bound holds."""
    value = c.simulated_s if c.simulated else c.screened_s
    if not c.fits or not math.isfinite(value):
        return math.inf
    if not math.isnan(c.tpot_s) or not math.isnan(c.ttft_s):  # serving
        if objective == "throughput":
            return -c.throughput if not math.isnan(c.throughput) else math.inf
        return c.tpot_s
    return value


def _throughput(c: Candidate, tokens: int, bound: float | None) -> float:
    if bound is not None and not (c.ttft_s <= bound):
        return math.nan
    total = c.simulated_s if c.simulated else c.screened_s
    return tokens * c.config.dp / total if total > 0 else math.nan


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
        t = graph.meta["transformer"]
        gpus = len(system.accelerators)
        router = getattr(system, "_router", None)
        per_node = len(router.node_gpus[0]) if router is not None and router.node_gpus else min(8, gpus)
        tps = tuple(tp for tp in (1, 2, 4, 8, 16, 32, 64) if tp <= per_node and t.heads % tp == 0
                    and t.ffn_size % tp == 0 and (t.kv % tp == 0 or tp % t.kv == 0))
        kinds = tuple(a.designs[0] for a in system.accelerators)
        peaks = {}
        for k in set(kinds):
            table = system.designs[k].gpu.peak_flops
            peaks[k] = float(table.get(t.dtype) or table.get("bf16") or max(table.values()))
        gb = settings.global_batch or t.batch
        return cls(graph, system, settings, gpus, per_node, tps, t.layers, kinds, peaks, gb)

    @property
    def training(self) -> bool:
        return self.graph.meta["transformer"].training

    @property
    def heterogeneous(self) -> bool:
        return len(set(self.kind_of_gpu)) > 1

    def dps(self) -> list[int]:
        return [d for d in range(1, self.gpus + 1) if self.gpus % d == 0 and (not self.training or self.global_batch % d == 0)]

    def eps(self, dp: int) -> tuple[int, ...]:
        """Expert-parallel degrees for ``dp`` replicas: divisors of both ``dp`` and the experts
        (a dense model: 1)."""
        experts = self.graph.meta["transformer"].experts
        if not experts or not self.settings.expert_parallel:
            return (1,)
        return tuple(e for e in range(1, dp + 1) if dp % e == 0 and experts % e == 0)

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
    dp: int
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
        uniform_tp = len(set(self.tps)) == 1
        identity = self.perm == tuple(range(self.pp))
        starts = self.starts() if not identity or not uniform_tp else ()
        balanced = self.layers == _balanced(space.layers, self.pp)
        gb = space.global_batch if space.training else 0
        return ParallelConfig(
            tp=self.tps[0], pp=self.pp, dp=self.dp, sp=self.sp, schedule=self.schedule,
            virtual_stages=self.virtual if self.schedule == "interleaved" else 1,
            micro_batch=self.micro, global_batch=gb, recompute=self.recompute, zero=self.zero, ep=self.ep,
            layers_per_stage=() if balanced else self.layers,
            stage_tp=() if uniform_tp else self.tps, stage_start=starts,
            order=self.order if identity and uniform_tp else "tp-pp-dp")


def _level1(g: _Genome) -> tuple:
    """The level-1 genes of ``g`` (what a generation's coordinate descent does not change)."""
    return (g.pp, g.dp, g.tps, g.layers, g.perm, g.order)


def _legal(space: LLMSpace, cfg: ParallelConfig) -> bool:
    t = space.graph.meta["transformer"]
    return not parallel_problems(cfg, replace(t, batch=cfg.micro_batch), space.gpus)


# ----------------------------------------------------------------------------- evaluation
@dataclass
class _Problem:
    graph: Graph
    system: System
    cost: CostModel
    graphs: dict = field(default_factory=dict)

    def graph_for(self, cfg: ParallelConfig) -> Graph:
        return graph_for(self.graph, cfg, self.graphs)


def graph_for(graph: Graph, cfg: ParallelConfig, cache: dict | None = None) -> Graph:
    """The workload built at ``cfg``'s micro-batch (a parallel lowering times one micro-batch:
    a training workload's graph is rebuilt per micro-batch size; serving keeps its batch)."""
    t = graph.meta["transformer"]
    if not t.training or cfg.micro_batch == graph.batch:
        return graph
    cache = {} if cache is None else cache
    hit = cache.get(cfg.micro_batch)
    if hit is None:
        from marssim.workload import load_workload

        hit = cache[cfg.micro_batch] = load_workload(graph.spec, batch=cfg.micro_batch)
    return hit


_WORKER: dict[str, _Problem] = {}


def _screen_chunk(args: tuple[str, bytes, list[ParallelConfig]]) -> list[Candidate]:
    from marssim.parallel.analytic import screen

    key, blob, configs = args
    p = worker_copy(_WORKER, key, blob)
    out = []
    for cfg in configs:
        try:
            sc = screen(p.graph_for(cfg), p.system, cfg, p.cost, time_infeasible=False)
        except InputError as err:
            out.append(Candidate(cfg, error=str(err)))
            continue
        worst = sc.memory.worst_stage
        out.append(Candidate(cfg, screened_s=sc.iteration_s, fits=sc.fits, memory_peak=sc.memory.peak(worst),
                             **_screen_serving(p, cfg, sc)))
    return out


def _screen_serving(p: _Problem, cfg: ParallelConfig, sc) -> dict:
    """Serving: the closed form's time to first token and per output token (prefill ops and
    decode ops timed apart; the pipeline runs one request batch through every stage)."""
    t = p.graph.meta["transformer"]
    if t.mode != "serve":
        return {}
    from marssim.parallel.analytic import serving_times

    ttft, tpot = serving_times(p.graph_for(cfg), p.system, cfg, p.cost)
    return {"ttft_s": ttft, "tpot_s": tpot}


def _simulate_chunk(args: tuple[str, bytes, list[ParallelConfig]]) -> list[Candidate]:
    from marssim.errors import CapacityError
    from marssim.parallel import lower_parallel
    from marssim.parallel.report import report_of
    from marssim.sim import simulate

    key, blob, configs = args
    p = worker_copy(_WORKER, key, blob)
    out = []
    for cfg in configs:
        try:
            start = time.perf_counter()
            tg = lower_parallel(p.graph_for(cfg), p.system, cfg, p.cost)
            lowered = time.perf_counter()
            result = simulate(tg, p.system, record=False, setup=False)
            rep = report_of(tg, p.system, result)
            done = time.perf_counter()
        except (CapacityError, InputError) as err:
            out.append(Candidate(cfg, fits=False, error=str(err)))
            continue
        peak = max(rep.memory_peak.values()) if rep.memory_peak else math.nan
        out.append(Candidate(cfg, simulated_s=rep.iteration_s, mfu=rep.mfu, exposed=dict(rep.exposed_s),
                             ttft_s=rep.ttft_s if rep.ttft_s is not None else math.nan,
                             tpot_s=rep.tpot_s if rep.tpot_s is not None else math.nan, sim_memory_peak=peak,
                             lower_s=lowered - start, sim_s=done - lowered))
    return out


def _map(fn, problem: tuple[str, bytes], items: list, executor: Executor | None, parts: int) -> list:
    """``fn`` over ``items`` in chunks, in order, on ``executor`` (or here); ``problem``: the
    key and bytes of the pickled :class:`_Problem` (:func:`marssim.workercache.pickled`)."""
    if not items:
        return []
    if executor is None or parts <= 1 or len(items) == 1:
        return fn((*problem, items))
    n = min(parts, len(items))
    chunks = [items[i::n] for i in range(n)]
    results = list(executor.map(fn, [(*problem, c) for c in chunks]))
    out = [None] * len(items)
    for i, res in enumerate(results):
        out[i::n] = res
    return out


def screen_configs(graph: Graph, system: System, cost: CostModel, configs: Sequence[ParallelConfig],
                   executor: Executor | None = None, parts: int = 1) -> list[Candidate]:
    """Screen ``configs`` (closed form), in order, on ``executor``."""
    return _map(_screen_chunk, pickled(_Problem(graph, system, cost)), list(configs), executor, parts)


def simulate_configs(graph: Graph, system: System, cost: CostModel, configs: Sequence[ParallelConfig],
                     executor: Executor | None = None, parts: int = 1) -> list[Candidate]:
    """Simulate ``configs``, in order, on ``executor``."""
    return _map(_simulate_chunk, pickled(_Problem(graph, system, cost)), list(configs), executor, parts)


# ----------------------------------------------------------------------------- the baseline grid
def megatron_grid(space: LLMSpace) -> list[ParallelConfig]:
    """Every uniform Megatron-legal configuration: ``tp * pp * dp`` = the GPUs, ``tp`` within a
    node, every micro-batch, schedule (interleaved with 2 virtual stages where legal), sequence
    parallelism, recomputation, ZeRO and (mixture-of-experts models) expert-parallel choice of the
    settings; balanced layers, default
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
            for micro in (s.micro_batches if space.training else (space.graph.batch,)):
                if space.training and (space.global_batch % (micro * dp)):
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
                                    g = _Genome(pp, dp, (tp,) * pp, _balanced(space.layers, pp), tuple(range(pp)),
                                                "tp-pp-dp", sp, micro, schedule, 2, recompute, zero, ep)
                                    cfg = g.config(space)
                                    if _legal(space, cfg):
                                        out.append(cfg)
    return sorted(set(out), key=lambda c: c.text())


# ----------------------------------------------------------------------------- the GA
class _Search:
    def __init__(self, graph: Graph, system: System, cost: CostModel, settings: LLMSearchSettings,
                 executor: Executor | None, parts: int, progress: Callable[[dict], None] | None = None) -> None:
        self.progress = progress
        self.started = time.perf_counter()
        self.space = LLMSpace.of(graph, system, settings)
        self.graph, self.system, self.cost = graph, system, cost
        self.settings = settings
        self.rng = np.random.default_rng(settings.seed)
        self.executor, self.parts = executor, parts
        self.problem = pickled(_Problem(graph, system, cost))
        self.seen: dict[ParallelConfig, Candidate] = {}
        self.rejected = 0
        self.tried: set[tuple] = set()
        self.timing = {"screen_s": 0.0, "simulate_s": 0.0}
        t = graph.meta["transformer"]
        self.tokens = t.batch * t.generate if t.mode == "serve" else 0

    # --------------------------------------------------------------- evaluation
    def _score(self, c: Candidate) -> Candidate:
        if self.tokens:
            return replace(c, throughput=_throughput(c, self.tokens, self.settings.ttft_bound))
        return c

    def screen(self, configs: Sequence[ParallelConfig]) -> list[Candidate]:
        todo = [c for c in dict.fromkeys(configs) if c not in self.seen]
        start = time.perf_counter()
        for cand in _map(_screen_chunk, self.problem, todo, self.executor, self.parts):
            self.seen[cand.config] = self._score(cand)
            if not cand.fits:
                self.rejected += 1
        self.timing["screen_s"] += time.perf_counter() - start
        return [self.seen[c] for c in configs]

    def simulate(self, configs: Sequence[ParallelConfig]) -> None:
        todo = [c for c in dict.fromkeys(configs) if not self.seen[c].simulated and self.seen[c].fits]
        room = self.settings.max_simulations - self.simulations
        todo = todo[:max(0, room)]
        start = time.perf_counter()
        for cand in _map(_simulate_chunk, self.problem, todo, self.executor, self.parts):
            old = self.seen[cand.config]
            self.seen[cand.config] = self._score(replace(cand, screened_s=old.screened_s, memory_peak=old.memory_peak,
                                                         fits=cand.fits and old.fits))
        self.timing["simulate_s"] += time.perf_counter() - start

    def timings(self) -> dict:
        """Wall seconds spent screening and simulating (as the search waited for them), and the
        seconds the simulated candidates' lowering and simulation took where they ran."""
        sims = [c for c in self.seen.values() if c.simulated]
        return {**self.timing, "lower_s": sum(c.lower_s for c in sims), "sim_s": sum(c.sim_s for c in sims)}

    def check_best(self, best: Candidate | None) -> None:
        """InputError when nothing fits the memory or meets the time-to-first-token bound."""
        fitting = any(c.fits and not c.error for c in self.seen.values())
        if best is None and not fitting:
            raise InputError(None, "search", "no configuration fits the GPUs' memory (every candidate was "
                                             f"rejected: {self.rejected} by the memory model)")
        if (best is None or not math.isfinite(_key(best, self.settings.objective))) and self.settings.ttft_bound is None:
            errors = [c.error for c in self.seen.values() if c.error]
            raise InputError(None, "search", "no configuration could be simulated" + (f" ({errors[0]})" if errors else ""))
        if best is None or not math.isfinite(_key(best, self.settings.objective)):
            fastest = min((c.ttft_s for c in self.seen.values() if c.fits and c.ttft_s == c.ttft_s), default=math.nan)
            raise InputError(None, "--ttft-bound", f"no configuration meets the time-to-first-token bound of "
                                                   f"{self.settings.ttft_bound * 1e3:.3f} ms (the fastest screened: "
                                                   f"{fastest * 1e3:.3f} ms)")

    @property
    def simulations(self) -> int:
        return sum(1 for c in self.seen.values() if c.simulated)

    def best_simulated(self) -> Candidate | None:
        sims = [c for c in self.seen.values() if c.simulated and c.fits]
        return min(sims, key=lambda c: (_key(c, self.settings.objective), c.config.text())) if sims else None

    def best_screened(self, n: int, exclude_simulated: bool = True) -> list[ParallelConfig]:
        cands = [c for c in self.seen.values() if c.fits and math.isfinite(_key(c, self.settings.objective))
                 and (not exclude_simulated or not c.simulated)]
        ranked = sorted(cands, key=lambda c: (_key(c, self.settings.objective), c.config.text()))
        return [c.config for c in ranked[:n]]

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
        return _Genome(pp, cfg.dp, tps, tuple(layers), perm, cfg.order, cfg.sp, cfg.micro_batch, cfg.schedule,
                       max(2, cfg.virtual_stages), cfg.recompute, cfg.zero, cfg.ep)

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
            return replace(self.random_level1(), **{k: getattr(g, k) for k in ("sp", "micro", "schedule", "virtual",
                                                                                 "recompute", "zero")})
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

    def level2(self, g: _Genome) -> tuple[_Genome, Candidate]:
        """The best level-2 choice for ``g``'s level 1, by coordinate descent over the screen."""
        s, sp = self.settings, self.space
        genes = {"sp": s.sp if max(g.tps) > 1 else (False,),
                 "micro": s.micro_batches if sp.training else (sp.graph.batch,),
                 "schedule": s.schedules if sp.training and g.pp > 1 else ("1f1b",),
                 "recompute": s.recompute if sp.training else ("none",),
                 "zero": s.zero if sp.training and g.dp > 1 else (0,),
                 "ep": sp.eps(g.dp)}
        best = g
        for _ in range(2):
            changed = False
            for gene, values in genes.items():
                trials = [replace(best, **{gene: v}) for v in values]
                configs = [t.config(sp) for t in trials]
                legal = [(t, c) for t, c in zip(trials, configs) if _legal(sp, c)]
                if not legal:
                    continue
                cands = self.screen([c for _, c in legal])
                ranked = sorted(zip(legal, cands), key=lambda x: (_key(x[1], s.objective), x[0][1].text()))
                top = ranked[0][0][0]
                if top != best:
                    best, changed = top, True
            if not changed:
                break
        cfg = best.config(sp)
        if not _legal(sp, cfg):
            return best, Candidate(cfg)
        return best, self.screen([cfg])[0]

    # --------------------------------------------------------------- the loop
    def run(self, seeds: Sequence[ParallelConfig]) -> LLMSearchResult:
        s = self.settings
        wall = self.started
        population: list[_Genome] = []
        for cfg in seeds:
            population.append(self.genome_of(cfg))
        while len(population) < s.population:
            population.append(self.random_level1())
        history = []
        best_key = (math.inf, "")
        best_screen = math.inf
        stale = 0
        for gen in range(s.generations):
            scored = [self.level2(g) for g in population]
            self.tried.update(_level1(g) for g in population)
            self.simulate(self.best_screened(s.simulate_top))
            best = self.best_simulated()
            key = (_key(best, s.objective), best.config.text()) if best else (math.inf, "")
            screened = [c for _, c in scored if math.isfinite(_key(c, s.objective))]
            history.append({"generation": gen, "best_fitness": key[0], "simulations": self.simulations,
                            "screened": len(self.seen), "rejected_memory": self.rejected,
                            "mean_screened": float(np.mean([_key(c, s.objective) for c in screened])) if screened
                            else math.inf, "wall_s": time.perf_counter() - wall})
            if self.progress is not None:
                self.progress(history[-1])
            top = min((_key(c, s.objective) for c in self.seen.values() if c.fits), default=math.inf)
            if key < best_key or top < best_screen:
                best_key, stale = min(key, best_key), 0
                best_screen = min(top, best_screen)
            else:
                stale += 1
            if stale >= s.patience or self.simulations >= s.max_simulations:
                break
            if s.time_limit_s is not None and time.perf_counter() - wall > s.time_limit_s:
                break
            population = self.next_generation(scored)
        self.simulate(self.best_screened(1))
        best = self.best_simulated()
        self.check_best(best)
        return LLMSearchResult("mars", s.objective, best, list(self.seen.values()), pd.DataFrame(history),
                               len(self.seen), self.rejected, self.simulations, time.perf_counter() - wall, s.seed,
                               self.timings())

    def next_generation(self, scored: list[tuple[_Genome, Candidate]]) -> list[_Genome]:
        s = self.settings
        ranked = sorted(scored, key=lambda x: (_key(x[1], s.objective), x[1].config.text()))
        elite = [g for g, _ in ranked[:max(1, s.population // 4)]]
        out = list(dict.fromkeys(elite))
        while len(out) < s.population:
            i, j = self.rng.integers(len(ranked), size=2)
            a = ranked[min(i, j)][0]  # tournament of two: the better one
            k, m = self.rng.integers(len(ranked), size=2)
            b = ranked[min(k, m)][0]
            child = self.crossover1(a, b)
            if self.rng.random() < 0.8:
                child = self.mutate1(child)
            for _ in range(8):  # a level 1 already tried is mutated again (the screen of it is known)
                if _level1(child) not in self.tried:
                    break
                child = self.mutate1(child)
            self.tried.add(_level1(child))
            out.append(child)
        return out


def mars_llm(graph: Graph, system: System, cost: CostModel, settings: LLMSearchSettings | None = None, *,
             executor: Executor | None = None, parts: int = 1, seeds: Sequence[ParallelConfig] = (),
             progress: Callable[[dict], None] | None = None) -> LLMSearchResult:
    """The two-level search (module docstring); ``seeds``: configurations to start from (by
    default the best ones of :func:`megatron_grid`, simulated, so the search never returns a
    worse configuration). ``progress`` is called with each generation's history row."""
    settings = settings or LLMSearchSettings()
    search = _Search(graph, system, cost, settings, executor, parts, progress)
    if settings.seed_with_grid and not seeds:
        grid = megatron_grid(search.space)
        search.screen(grid)
        seeds = search.best_screened(settings.grid_simulate, exclude_simulated=False)
        search.simulate(seeds)
    return search.run(seeds)


def grid_search(graph: Graph, system: System, cost: CostModel, settings: LLMSearchSettings | None = None, *,
                executor: Executor | None = None, parts: int = 1) -> LLMSearchResult:
    """The baseline: :func:`megatron_grid` screened, its best ``grid_simulate`` simulated."""
    settings = settings or LLMSearchSettings()
    wall = time.perf_counter()
    search = _Search(graph, system, cost, settings, executor, parts)
    grid = megatron_grid(search.space)
    search.screen(grid)
    search.simulate(search.best_screened(settings.grid_simulate, exclude_simulated=False))
    best = search.best_simulated()
    search.check_best(best)
    history = pd.DataFrame([{"generation": 0, "best_fitness": _key(best, settings.objective),
                             "simulations": search.simulations, "screened": len(search.seen),
                             "rejected_memory": search.rejected, "wall_s": time.perf_counter() - wall}])
    return LLMSearchResult("megatron-grid", settings.objective, best, list(search.seen.values()), history,
                           len(search.seen), search.rejected, search.simulations, time.perf_counter() - wall,
                           settings.seed, search.timings())
