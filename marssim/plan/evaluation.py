"""What evaluating a plan gives, one typed record per kind of plan: every record has the
figures all kinds share (:class:`Evaluation`: the span, the throughput, whether it can run and
why not, the wall time it took), and each kind its own -- a per-op mapping's energy
(:class:`MappingEvaluation`), a parallel configuration's report figures
(:class:`ParallelEvaluation`), a serving deployment's rate, goodput, GPUs, cost and latency
statistics under its case's constraints (:class:`DeploymentEvaluation`). A record's
:attr:`~Evaluation.kind` says which kind of plan it evaluates (its
:class:`~marssim.plan.kinds.KindSpec` names the record type); :meth:`~Evaluation.fitness` is
the value a search minimises for one of that kind's objectives. SI units throughout.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import ClassVar

from .model import PlanKind

__all__ = ["Evaluation", "MappingEvaluation", "ParallelEvaluation", "DeploymentEvaluation", "RECORDS",
           "PLAN_OBJECTIVES", "SERVING_OBJECTIVES"]

PLAN_OBJECTIVES = ("latency", "throughput", "energy", "edp")
"""``latency``: makespan of the batch (an LLM's iteration; serving: time per output token);
``throughput``: steady-state samples/s (LLM training: sequences/s, serving: output tokens/s),
maximised; ``energy``: joules; ``edp``: energy-delay product (J*s). All are minimised as fitness."""

SERVING_OBJECTIVES = ("goodput", "gpus", "cost")
"""A serving deployment's objectives, each under the case's constraints (a deployment that
misses them has infinite fitness): ``goodput``: the highest request rate meeting them,
maximised (fitness: its inverse, s per request); ``gpus``: the GPUs serving the offered load,
ties going to the lower mean end-to-end latency (fitness ``GPUs + E2E / (E2E + 1 s)``, the
fraction below 1, so the order is lexicographic); ``cost``: dollars per million output tokens
at the offered load."""


@dataclass(frozen=True)
class Evaluation:
    """What every kind's evaluation has, simulated or screened: ``makespan`` (s: a mapping's
    batch, a configuration's iteration, a deployment's run from first arrival to last token),
    ``throughput`` (samples/s, sequences/s or output tokens/s), ``feasible`` False when a memory
    overflows or the plan cannot run (``error`` says why; such plans have infinite fitness),
    ``wall_s`` the seconds the evaluation took. Not made itself: each kind has its record."""

    makespan: float
    throughput: float = float("nan")
    feasible: bool = True
    error: str = ""
    wall_s: float = 0.0

    kind: ClassVar[PlanKind]
    objectives: ClassVar[tuple[str, ...]]
    """The objectives :meth:`fitness` knows for this kind of record."""

    def fitness(self, objective: str = "latency") -> float:
        """The value to minimise for ``objective`` (infinite for an infeasible plan); ValueError
        for an objective this kind of plan has not."""
        if not self.feasible:
            return math.inf
        if objective not in self.objectives:
            raise ValueError(f"unknown objective {objective!r} for a {self.kind.value} evaluation; expected one of "
                             f"{', '.join(self.objectives)}")
        return self._fitness(objective)

    def _fitness(self, objective: str) -> float:
        if objective == "latency":
            value = self._latency()
            return value if value == value else math.inf
        return 1.0 / self.throughput if self.throughput > 0 else math.inf  # throughput

    def _latency(self) -> float:
        return self.makespan


def _energy_fitness(energy: float, makespan: float, objective: str) -> float:
    """``energy`` (J) or the energy-delay product (J*s); infinite without an energy figure."""
    if energy != energy:
        return math.inf
    return energy if objective == "energy" else energy * makespan


@dataclass(frozen=True, kw_only=True)
class MappingEvaluation(Evaluation):
    """A per-op mapping's evaluation: the common figures and ``energy`` (J; NaN without an
    energy model)."""

    energy: float = float("nan")

    kind: ClassVar[PlanKind] = PlanKind.MAPPING
    objectives: ClassVar[tuple[str, ...]] = PLAN_OBJECTIVES

    def _fitness(self, objective: str) -> float:
        if objective in ("energy", "edp"):
            return _energy_fitness(self.energy, self.makespan, objective)
        return super()._fitness(objective)


@dataclass(frozen=True, kw_only=True)
class ParallelEvaluation(Evaluation):
    """A parallel configuration's evaluation: the common figures (``makespan`` one iteration),
    ``energy`` (J; NaN without an energy model), the report's MFU, exposed communication and
    bubble per group (s), ``serving`` (the workload serves: its latency is the time per output
    token), time to first token and per output token (s, serving; NaN when training), the
    memory peak of its worst GPU (bytes)."""

    energy: float = float("nan")
    mfu: float = float("nan")
    exposed: dict = field(default_factory=dict, compare=False)
    serving: bool = False
    ttft: float = float("nan")
    tpot: float = float("nan")
    memory_peak: float = float("nan")

    kind: ClassVar[PlanKind] = PlanKind.PARALLEL
    objectives: ClassVar[tuple[str, ...]] = PLAN_OBJECTIVES

    @property
    def time_s(self) -> float:
        """The time the ``latency`` objective ranks by (s): per output token when serving, else the
        iteration."""
        return self.tpot if self.serving and self.tpot == self.tpot else self.makespan

    def _latency(self) -> float:
        return self.time_s

    def _fitness(self, objective: str) -> float:
        if objective in ("energy", "edp"):
            return _energy_fitness(self.energy, self.makespan, objective)
        return super()._fitness(objective)


@dataclass(frozen=True, kw_only=True)
class DeploymentEvaluation(Evaluation):
    """A serving deployment's evaluation on its case: the common figures (``makespan`` the run's
    span, ``throughput`` output tokens/s), ``rate`` the requests/s its figures are at,
    ``goodput`` (requests/s; NaN unless the case asks for it), ``gpus``, ``cost_per_mtok``
    (dollars per million output tokens), ``slo_ratio`` (the constraints' worst ratio; at most
    1 meets them) and ``slo_miss`` (what it missed), ``capacity`` (the screen's requests/s),
    ``runs`` (simulations run), ``latency`` statistics (``latency["ttft_p99"]``, s; none for a
    run stopped once it could no longer meet them)."""

    rate: float = float("nan")
    goodput: float = float("nan")
    gpus: int = 0
    cost_per_mtok: float = float("nan")
    slo_ratio: float = float("nan")
    slo_miss: str = ""
    capacity: float = float("nan")
    runs: int = 0
    latency: dict = field(default_factory=dict, compare=False)
    user_tokens_per_s: float = float("nan")
    """The mean rate a user sees, tokens/s: per request, its tokens after the first over their
    decoding time (1 / TPOT); NaN for a screen or a run stopped early."""

    kind: ClassVar[PlanKind] = PlanKind.DEPLOYMENT
    objectives: ClassVar[tuple[str, ...]] = SERVING_OBJECTIVES + ("latency", "throughput")

    @property
    def slo_met(self) -> bool:
        """The figures meet the case's constraints."""
        return self.slo_ratio <= 1.0

    def _fitness(self, objective: str) -> float:
        if objective not in SERVING_OBJECTIVES:
            return super()._fitness(objective)
        if not self.slo_ratio <= 1.0:
            return math.inf
        if objective == "goodput":
            return 1.0 / self.goodput if self.goodput > 0 else math.inf
        if objective == "gpus":
            e2e = self.latency.get("e2e_mean", math.inf)
            return self.gpus + (e2e / (e2e + 1.0) if e2e == e2e and e2e < math.inf else 0.999999)
        return self.cost_per_mtok if self.cost_per_mtok == self.cost_per_mtok else math.inf  # cost


RECORDS: dict[PlanKind, type[Evaluation]] = {r.kind: r for r in (MappingEvaluation, ParallelEvaluation,
                                                                   DeploymentEvaluation)}
"""Each kind's record type."""
