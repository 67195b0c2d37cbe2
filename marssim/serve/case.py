"""A capacity-planning case: the model, the request stream, the seed, the service-level
constraints and the GPU prices a deployment is judged by, and the one function that judges it
-- by simulation or by the closed-form screen.

Two questions, as an operator asks them:

* *at the offered load* (``goodput=False``): the stream as given (its rate, its lengths) is
  simulated once; the run meets the constraints or not, and costs its GPUs' dollars per hour
  for the output tokens it generates;
* *goodput* (``goodput=True``): the highest arrival rate at which the deployment meets the
  constraints (DistServe's goodput), found by simulating the same stream at other rates
  (:meth:`~.requests.RequestSpec.with_rate`: the same lengths, the arrivals stretched or
  compressed): from the screen's goodput, up by factors 1.25, 1.25^2, ... (at most 4 steps)
  or down by 1.25 and 1.25^2 until the constraints flip, then halving the bracket geometrically
  until its ends are within ``tolerance``; the figures reported are those of the highest rate
  that met them. A deployment that misses them at half the screen's goodput has goodput 0 for
  the search (it is far from the best, and runs at low rates are the longest: every decode
  iteration holds few sequences). Trial rates are rounded to 4 significant digits, so the rate
  is one a person can type back.

Units: seconds, requests/s, tokens/s, dollars.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

from marssim.cost.base import CostModel
from marssim.system import System
from marssim.workload.llm.config import TransformerConfig

from .deployment import Deployment
from .requests import Requests, RequestSpec
from .slo import Constraints, cost_per_million_tokens, dollars_per_hour

__all__ = ["ServeCase", "CaseRun", "evaluate_case", "screen_case", "simulate_case", "highest_rate",
           "gpus_by_design"]


@dataclass(frozen=True)
class ServeCase:
    """What a deployment is evaluated on (see the module docstring). ``prices``: dollars per
    GPU-hour by GPU design, as pairs; ``tolerance``: relative width of the goodput bracket."""

    model: TransformerConfig
    spec: RequestSpec
    seed: int = 0
    constraints: Constraints = Constraints()
    prices: tuple[tuple[str, float], ...] = ()
    goodput: bool = False
    tolerance: float = 0.02
    settle: float = 4.0

    def ratio(self, summary: dict, rate: float | None = None) -> float:
        """The constraints' ratio of a run (:meth:`Constraints.ratio`), and, as one more bound, its
        steadiness: ``settle x mean E2E / arrival span`` (at most 1: the requests arrive over at
        least ``settle`` times their mean end-to-end latency, so most of them meet the queues and
        batches of a steady state rather than a system filling up from empty)."""
        ratio = self.constraints.ratio(summary)
        if not math.isfinite(ratio) or not self.settle:
            return ratio
        return max(ratio, self.unsteadiness(summary, rate))

    def unsteadiness(self, summary: dict, rate: float | None = None) -> float:
        """``settle x mean E2E / arrival span`` of a run (see :meth:`ratio`)."""
        arrival = self.requests(rate).arrival
        span = float(arrival[-1] - arrival[0]) if len(arrival) > 1 else 0.0
        e2e = summary.get("e2e_s", {}).get("mean", math.nan)
        if not e2e == e2e:
            return math.inf
        return self.settle * e2e / span if span > 0 else math.inf

    def violations(self, summary: dict, rate: float | None = None) -> list[str]:
        """What a run missed: the constraints' violations and, if so, its steadiness."""
        out = self.constraints.violations(summary)
        if self.settle and self.constraints.ratio(summary) < math.inf and self.unsteadiness(summary, rate) > 1:
            arrival = self.requests(rate).arrival
            out.append(f"its {len(arrival)} requests arrive over {arrival[-1] - arrival[0]:.4g} s, less than "
                       f"{self.settle:g} x their mean E2E ({summary['e2e_s']['mean']:.4g} s): not a steady state "
                       f"(give more requests)")
        return out

    @property
    def rate(self) -> float:
        """The offered rate (requests/s)."""
        return self.spec.rate

    def requests(self, rate: float | None = None) -> Requests:
        """The stream (at ``rate`` requests/s instead of its own, if given), drawn with the seed."""
        key = (self.spec, self.seed, rate)
        hit = _REQUESTS.get(key)
        if hit is None:
            if len(_REQUESTS) >= 16:
                _REQUESTS.clear()
            spec = self.spec if rate is None else self.spec.with_rate(rate)
            hit = _REQUESTS[key] = spec.draw(self.seed)
        return hit

    def stats(self):
        """:class:`~.screen.StreamStats` of the stream at its own rate."""
        from .screen import StreamStats

        key = (self.spec, self.seed)
        hit = _STATS.get(key)
        if hit is None:
            if len(_STATS) >= 16:
                _STATS.clear()
            hit = _STATS[key] = StreamStats.of(self.requests())
        return hit


_REQUESTS: dict = {}
_STATS: dict = {}


@dataclass(frozen=True)
class CaseRun:
    """A deployment judged on a case: the ``summary`` (a simulation's, or the screen's entries of
    it) at ``rate`` requests/s; ``ratio``: the constraints' largest value / bound (<= 1: met);
    ``goodput``: the highest rate meeting them (NaN unless the case asks for it); GPUs, their
    dollars per hour and the dollars per million output tokens at ``rate``; ``runs``:
    simulations spent; ``capacity_rps``: the screen's capacity (NaN for a simulation);
    ``feasible`` False when the deployment cannot run at all (``error`` says why); ``ceiling``:
    the lowest rate tried above the goodput that missed the constraints (inf when none did)."""

    rate: float
    summary: dict
    ratio: float
    goodput: float
    gpus: int
    gpus_by_design: dict = field(default_factory=dict)
    dollars_per_hour: float = math.nan
    cost_per_mtok: float = math.nan
    runs: int = 0
    capacity_rps: float = math.nan
    feasible: bool = True
    error: str = ""
    ceiling: float = math.inf


def gpus_by_design(deployment: Deployment, system: System) -> dict[str, int]:
    """GPUs of each design the deployment's replicas are placed on."""
    from .simulate import place_replicas

    out: dict[str, int] = {}
    for _, stages in place_replicas(system, deployment):
        design = system.accelerator(stages[0][0]).designs[0]
        out[design] = out.get(design, 0) + sum(len(s) for s in stages)
    return out


def _round(rate: float) -> float:
    """``rate`` to 4 significant digits."""
    if not rate > 0 or not math.isfinite(rate):
        return rate
    return float(f"{rate:.4g}")


def highest_rate(meets: Callable[[float], bool], start: float, tolerance: float = 0.02,
                 expansions: int = 4, down: int = 2) -> float:
    """The highest rate at which ``meets`` holds, bracketed from ``start`` (see the module
    docstring: at most ``expansions`` steps of 1.25, 1.25^2, 1.25^4, ... up, a factor of 28 with
    4, and ``down`` steps down, a factor of 1.95 with 2); 0 when it still fails going down.
    ``meets`` is called in a fixed order for a given start, so the search is deterministic."""
    start = _round(start)
    step = 1.25
    if meets(start):
        lo, hi = start, math.inf
        for _ in range(expansions):
            trial = _round(lo * step)
            if trial <= lo:
                break
            if meets(trial):
                lo = trial
                step *= step
            else:
                hi = trial
                break
        if hi == math.inf:
            return lo
    else:
        lo, hi = 0.0, start
        for _ in range(down):
            trial = _round(hi / step)
            if meets(trial):
                lo = trial
                break
            hi = trial
            step *= step
        if lo == 0.0:
            return 0.0
    while hi / lo > 1 + tolerance:
        mid = _round(math.sqrt(lo * hi))
        if mid <= lo or mid >= hi:
            break
        if meets(mid):
            lo = mid
        else:
            hi = mid
    return lo


def simulate_case(deployment: Deployment, case: ServeCase, system: System, cost: CostModel,
                  rate: float | None = None, *, trace: bool = False, watch: bool = False):
    """The :class:`~.simulate.ServeResult` of ``deployment`` serving the case's stream (at
    ``rate`` instead of its own rate, if given), its goodput counted against the constraints'
    per-request bounds. ``watch``: stop as soon as a percentile bound can no longer be met
    (raises :class:`~.metrics.ConstraintsMissed`); a run that meets them is the same run."""
    from .simulate import simulate_serving

    return simulate_serving(deployment, case.model, system, cost, case.requests(rate), seed=case.seed,
                            slo=case.constraints.request_slo(), trace=trace,
                            stop_when_missed=case.constraints.watch_terms() if watch else ())


def _priced(case: ServeCase, by_design: dict[str, int], tokens_per_s: float) -> tuple[float, float]:
    per_hour = dollars_per_hour(by_design, dict(case.prices)) if case.prices else math.nan
    return per_hour, cost_per_million_tokens(per_hour, tokens_per_s)


def evaluate_case(deployment: Deployment, case: ServeCase, system: System, cost: CostModel, *,
                  watch: bool = True) -> CaseRun:
    """``deployment`` simulated on ``case`` (module docstring). ``watch``: a run stops as soon as
    it can no longer meet a percentile bound (:class:`~.metrics.WatchedRecorder`; an overloaded
    deployment's queues would take long to drain for nothing): such a run's ``summary`` holds only
    ``missed`` (which bound) and its ratio is infinite. When a goodput search finds no rate, the
    lowest rate tried is simulated to its end for its figures."""
    from .metrics import ConstraintsMissed

    by_design = gpus_by_design(deployment, system)
    gpus = sum(by_design.values())

    def run(rate: float | None, watched: bool) -> dict:
        try:
            return simulate_case(deployment, case, system, cost, rate, watch=watched).summary
        except ConstraintsMissed as missed:
            return {"missed": missed.what, "requests": len(case.requests(rate)), "completed": 0}

    def priced(summary: dict) -> tuple[float, float]:
        return _priced(case, by_design, summary.get("output_tokens_per_s", math.nan))

    if not case.goodput:
        summary = run(None, watch)
        return CaseRun(case.rate, summary, case.ratio(summary), math.nan, gpus, by_design, *priced(summary), 1)
    runs: dict[float, dict] = {}

    def meets(rate: float) -> bool:
        if rate not in runs:
            runs[rate] = run(rate, watch)
        return case.ratio(runs[rate], rate) <= 1

    screened = screen_case(deployment, case, system, cost)
    start = screened.goodput if screened.goodput > 0 else case.rate
    best = highest_rate(meets, start, case.tolerance)
    count = len(runs)
    if best > 0:
        rate, summary = best, runs[best]
    else:  # nothing met: the figures of the lowest rate tried, run to its end
        rate = min(runs)
        summary = runs[rate] if "missed" not in runs[rate] else run(rate, False)
        count += "missed" in runs[rate]
    ceiling = min((r for r, s in runs.items() if r > best and case.ratio(s, r) > 1), default=math.inf)
    return CaseRun(rate, summary, case.ratio(summary, rate), best, gpus, by_design, *priced(summary), count,
                   ceiling=ceiling)


def screen_case(deployment: Deployment, case: ServeCase, system: System, cost: CostModel) -> CaseRun:
    """``deployment`` screened on ``case`` in closed form (:mod:`.screen`): at the offered
    load, or at the screen's own goodput."""
    from marssim.errors import InputError

    from .screen import DeploymentScreen, screen_goodput

    stats = case.stats()
    try:
        scr = DeploymentScreen(deployment, case.model, system, cost, stats)
    except InputError as err:
        if "no room for a KV cache" not in str(err):
            raise
        return CaseRun(case.rate, {}, math.inf, 0.0 if case.goodput else math.nan, deployment.gpus, {},
                       feasible=False, error=str(err).split(": ", 1)[-1])
    by_design = dict(scr.gpus_by_design)
    if case.goodput:
        best = screen_goodput(scr, case.constraints, case.tolerance / 4)
        rate = best if best > 0 else min(case.rate, scr.capacity * 0.5) if scr.capacity > 0 else case.rate
    else:
        best, rate = math.nan, case.rate
    summary = scr.at(rate)
    per_hour, per_mtok = _priced(case, by_design, summary["output_tokens_per_s"])
    return CaseRun(rate, summary, case.constraints.ratio(summary), best, sum(by_design.values()), by_design,
                   per_hour, per_mtok, 0, scr.capacity)
