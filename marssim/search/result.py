"""What a search returns: the best plan, its simulated evaluation, the history, and the
candidates it saw -- the same for every search, whatever its genome."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import pandas as pd

from marssim.plan import Plan, plan_key
from marssim.plan.kinds import PlanKind, kind_of

from .evaluate import DeploymentEvaluation, Evaluation, rank_value

__all__ = ["SearchResult", "SearchInterrupted", "Candidate", "deployment_figures"]


@dataclass(frozen=True)
class Candidate:
    """A plan a search met: its screened evaluation (None if it was simulated without one) and
    its simulated evaluation (None if it was only screened)."""

    plan: Plan
    screened: Evaluation | None = None
    simulated: Evaluation | None = None

    @property
    def evaluation(self) -> Evaluation:
        """The simulation where there is one, else the screen."""
        return self.simulated if self.simulated is not None else self.screened  # type: ignore[return-value]


@dataclass
class SearchResult:
    """The outcome of one search.

    ``best`` is valid for the searched graph and system; ``evaluation`` is its *simulated*
    evaluation (never an estimate). ``history`` has one row per generation (or batch):
    ``generation``, ``best_fitness``, ``best_makespan_s`` (a serving search: ``best_gpus``,
    ``best_rate_rps``, ``best_goodput_rps``, ``best_cost_per_mtok``), ``mean_fitness``,
    ``simulations``, ``estimates``, ``wall_s``. ``simulations``/``estimates`` count distinct candidates run (an
    estimate is a screen: a mapping's analytical estimate, a configuration's closed form);
    ``rejected_memory``: candidates the screen found not to fit; ``candidates``: every plan met
    (see :meth:`top`)."""

    algorithm: str
    objective: str
    best: Plan
    evaluation: Evaluation
    history: pd.DataFrame
    simulations: int
    estimates: int
    wall_s: float
    seed: int = 0
    notes: dict = field(default_factory=dict)
    candidates: list[Candidate] = field(default_factory=list)
    rejected_memory: int = 0

    @property
    def fitness(self) -> float:
        return self.evaluation.fitness(self.objective)

    @property
    def makespan(self) -> float:
        return self.evaluation.makespan

    @property
    def interrupted(self) -> bool:
        return bool(self.notes.get("interrupted"))

    def summary(self) -> str:
        tail = f"{self.simulations} simulations, {self.estimates} estimates in {self.wall_s:.1f} s"
        return _SUMMARY[kind_of(self.best).kind](self, tail)

    def top(self, n: int = 10, key=None) -> list[Candidate]:
        """The ``n`` best candidates, simulated ones first (by fitness, then screened), equivalent
        plans once: ``key`` maps a plan to its equivalence class (default: the plan itself)."""
        def rank(c: Candidate) -> tuple:
            f = c.evaluation.fitness(self.objective)
            return (c.simulated is None, rank_value(f) if math.isfinite(f) else math.inf, plan_key(c.plan))

        out: list[Candidate] = []
        seen: set = set()
        for c in sorted(self.candidates, key=rank):
            if not math.isfinite(c.evaluation.fitness(self.objective)):
                continue
            k = key(c.plan) if key is not None else plan_key(c.plan)
            if k in seen:
                continue
            seen.add(k)
            out.append(c)
            if len(out) >= n:
                break
        return out


def _mapping_summary(r: SearchResult, tail: str) -> str:
    e = r.evaluation
    return (f"{r.algorithm}: makespan {e.makespan * 1e3:.4f} ms, throughput {e.throughput:.4g} samples/s, "
            f"{len(r.best.sets)} sets, {r.best.n_stages} stages, {r.best.micro_batches} micro-batches; {tail}"
            + _energy(e))


def _config_summary(r: SearchResult, tail: str) -> str:
    e = r.evaluation
    what = ("time per output token", e.tpot) if e.tpot == e.tpot else ("iteration", e.makespan)
    return (f"{r.algorithm}: best {r.best.text()}: {what[0]} {what[1] * 1e3:.3f} ms, MFU {e.mfu:.1%}; "
            f"{tail} ({r.rejected_memory} rejected by memory)" + _energy(e))


def _energy(e: Evaluation) -> str:
    """``; energy ... mJ``, or nothing without energy figures (a GPU cluster's)."""
    return f"; energy {e.energy * 1e3:.4g} mJ" if e.energy == e.energy and e.energy > 0 else ""


def _deployment_summary(r: SearchResult, tail: str) -> str:
    return (f"{r.algorithm}: best {r.best.text()}: {deployment_figures(r.evaluation)}; {tail} "
            f"({r.rejected_memory} without room for a KV cache)")


_SUMMARY = {PlanKind.MAPPING: _mapping_summary, PlanKind.PARALLEL: _config_summary,
            PlanKind.DEPLOYMENT: _deployment_summary}
"""A kind's search outcome in a line."""
_HEADLINE = {PlanKind.MAPPING: lambda r: f"{r.makespan * 1e3:.4f} ms",
             PlanKind.PARALLEL: lambda r: f"{r.makespan * 1e3:.4f} ms",
             PlanKind.DEPLOYMENT: lambda r: deployment_figures(r.evaluation)}
"""A kind's best figures so far, for an interrupted search."""


def deployment_figures(e: DeploymentEvaluation) -> str:
    """A deployment's simulated figures in a line: GPUs, goodput or rate, latency percentiles,
    throughput, cost, whether it met the constraints."""
    lat = e.latency
    parts = [f"{e.gpus} GPUs"]
    parts.append(f"goodput {e.goodput:.4g} requests/s" if e.goodput == e.goodput else f"at {e.rate:.4g} requests/s")
    parts.append(f"TTFT P99 {lat.get('ttft_p99', math.nan) * 1e3:.1f} ms, "
                 f"TBT P99 {lat.get('tbt_p99', math.nan) * 1e3:.1f} ms")
    parts.append(f"{e.throughput:.4g} output tokens/s")
    if e.cost_per_mtok == e.cost_per_mtok:
        parts.append(f"${e.cost_per_mtok:.4g} per million output tokens")
    if not e.slo_met:
        parts.append(f"misses the constraints ({e.slo_miss or e.error})")
    return ", ".join(parts)


class SearchInterrupted(KeyboardInterrupt):
    """Ctrl-C during a search that had found a plan: ``result`` is the best one so far (its
    evaluation simulated, ``notes["interrupted"]`` True), for the caller to keep before exiting."""

    def __init__(self, result: SearchResult) -> None:
        super().__init__(f"interrupted: best so far {_HEADLINE[kind_of(result.best).kind](result)}")
        self.result = result
