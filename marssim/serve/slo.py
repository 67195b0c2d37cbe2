"""What a capacity plan must meet and what it costs: service-level constraints on a run's latency
percentiles, and the price of its GPUs.

Constraints are bounds on statistics of a run (:func:`.metrics.summarise`), written
``METRIC_STAT=TIME``: ``ttft_p99=2s,tbt_p99=100ms``. ``METRIC`` is ``ttft`` (time to first token),
``tbt`` (time between two tokens, over every gap), ``tpot`` (a request's time per output token),
``e2e`` (end-to-end latency) or ``queue`` (queueing delay); ``STAT`` is ``p50``, ``p90``, ``p99``,
``mean`` or ``max``. A run meets them when every bound holds *and* it served every request (a
deployment that rejects requests -- a prompt longer than a continuous batcher's token budget, a
request larger than a replica's KV cache -- does not serve the stream, and the percentiles of
the requests it kept would flatter it). :meth:`Constraints.ratio` is the largest ``value /
bound`` (at most 1: met; infinite when requests were rejected or nothing finished), the one
number a search reads: a constraint, never a term of a weighted sum.

Prices are dollars per GPU-hour per GPU design (``h100=2.5,a100=1.2``); a deployment's cost per
million output tokens is its GPUs' dollars per hour over the output tokens it generates in an
hour at the load it was run at. Units: seconds, requests/s, tokens/s, dollars.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from marssim.errors import InputError

from .metrics import SLO

__all__ = ["Bound", "Constraints", "METRICS", "STATS", "parse_constraints", "parse_prices", "dollars_per_hour",
           "cost_per_million_tokens"]

METRICS = {"ttft": "ttft_s", "tbt": "tbt_s", "tpot": "tpot_s", "e2e": "e2e_s", "queue": "queue_s"}
"""Constraint metrics and the summary entries that hold them."""
STATS = ("p50", "p90", "p99", "mean", "max")
_NAMES = {"ttft": "TTFT", "tbt": "TBT", "tpot": "TPOT", "e2e": "E2E", "queue": "queueing"}


@dataclass(frozen=True)
class Bound:
    """``stat`` of ``metric`` at most ``limit`` seconds."""

    metric: str
    stat: str
    limit: float

    @property
    def key(self) -> str:
        return f"{self.metric}_{self.stat}"

    def value(self, summary: dict) -> float:
        """The bounded statistic of a run's summary (s; NaN when it has none)."""
        return float(summary.get(METRICS[self.metric], {}).get(self.stat, math.nan))

    def text(self) -> str:
        stat = self.stat.upper() if self.stat.startswith("p") else self.stat
        return f"{_NAMES[self.metric]} {stat} <= {_time(self.limit)}"


def _time(seconds: float) -> str:
    return f"{seconds:.4g} s" if seconds >= 1 else f"{seconds * 1e3:.4g} ms"


@dataclass(frozen=True)
class Constraints:
    """Bounds a run must meet (see the module docstring)."""

    bounds: tuple[Bound, ...] = ()

    def __bool__(self) -> bool:
        return bool(self.bounds)

    def ratio(self, summary: dict) -> float:
        """The largest ``value / bound`` of the run (<= 1: every bound met; inf when it rejected a
        request, finished none, or a bounded statistic is missing; 0 without bounds)."""
        if summary.get("rejected", 0) or not summary.get("completed", 0):
            return math.inf
        worst = 0.0
        for b in self.bounds:
            v = b.value(summary)
            if not v == v:
                return math.inf
            worst = max(worst, v / b.limit)
        return worst

    def met(self, summary: dict) -> bool:
        return self.ratio(summary) <= 1.0

    def violations(self, summary: dict) -> list[str]:
        """One phrase per bound the run misses (and for rejected requests)."""
        out = []
        if summary.get("rejected", 0):
            out.append(f"{summary['rejected']} requests rejected")
        for b in self.bounds:
            v = b.value(summary)
            if not v <= b.limit:
                out.append(f"{b.text()}: {_time(v) if v == v else 'none'}")
        return out

    def request_slo(self) -> SLO:
        """The per-request bounds a run's goodput counts (TTFT, TPOT, E2E: the tightest bound
        given on each, whatever its statistic; TBT and queueing have no per-request bound)."""
        limits: dict[str, float] = {}
        for b in self.bounds:
            if b.metric in ("ttft", "tpot", "e2e"):
                limits[b.metric] = min(limits.get(b.metric, math.inf), b.limit)
        return SLO(**limits)

    def watch_terms(self) -> tuple[tuple[str, float, float], ...]:
        """The bounds a run can be stopped on once missed (:class:`~.metrics.WatchedRecorder`):
        ``(metric, quantile, limit)`` of each percentile or maximum bound (means are known only
        at the end)."""
        q = {"p50": 0.5, "p90": 0.9, "p99": 0.99, "max": 1.0}
        return tuple((b.metric, q[b.stat], b.limit) for b in self.bounds if b.stat in q)

    def text(self) -> str:
        return ", ".join(b.text() for b in self.bounds) or "none"

    def spec(self) -> str:
        """The constraints as ``--slo`` takes them."""
        return ",".join(f"{b.key}={b.limit!r}s" for b in self.bounds)


def parse_constraints(text: str, where: str = "--slo") -> Constraints:
    """:class:`Constraints` from ``ttft_p99=2s,tbt_p99=100ms``; InputError naming the bad part."""
    from marssim import units

    bounds: dict[str, Bound] = {}
    for part in str(text).split(","):
        if not part.strip():
            continue
        key, eq, value = part.partition("=")
        key = key.strip()
        metric, _, stat = key.rpartition("_")
        if not eq or metric not in METRICS or stat not in STATS:
            hint = f" (a bound on a statistic: {key}_p99=...)" if key in METRICS else ""
            raise InputError(None, where, f"expected bounds METRIC_STAT=TIME with METRIC one of "
                                          f"{', '.join(METRICS)} and STAT one of {', '.join(STATS)}, like "
                                          f"ttft_p99=2s,tbt_p99=100ms; got {part.strip()!r}{hint}")
        if key in bounds:
            raise InputError(None, f"{where}.{key}", "given twice")
        try:
            limit = units.parse(value.strip(), "time", require_unit=True, bounded=True)
        except units.UnitError as err:
            raise InputError(None, f"{where}.{key}", str(err)) from None
        bounds[key] = Bound(metric, stat, limit)
    if not bounds:
        raise InputError(None, where, "expected at least one bound, like ttft_p99=2s,tbt_p99=100ms")
    return Constraints(tuple(bounds.values()))


def parse_prices(texts: list[str] | str, kinds: set[str], where: str = "--gpu-price") -> dict[str, float]:
    """Dollars per GPU-hour by GPU design from ``h100=2.5,a100=1.2`` (one or several strings);
    InputError for a design the system has not, a bad number, or a design priced twice."""
    out: dict[str, float] = {}
    for text in [texts] if isinstance(texts, str) else texts:
        for part in str(text).split(","):
            if not part.strip():
                continue
            kind, eq, value = part.partition("=")
            kind = kind.strip()
            if not eq:
                raise InputError(None, where, f"expected DESIGN=DOLLARS_PER_GPU_HOUR like h100=2.5, "
                                              f"got {part.strip()!r}")
            if kind not in kinds:
                raise InputError(None, f"{where}.{kind}", f"not a GPU design of the system; expected one of "
                                                          f"{', '.join(sorted(kinds))}")
            if kind in out:
                raise InputError(None, f"{where}.{kind}", "given twice")
            try:
                price = float(value)
            except ValueError:
                price = math.nan
            if not 0 < price < 1e4:
                raise InputError(None, f"{where}.{kind}", f"expected dollars per GPU-hour above 0 and below 10,000, "
                                                          f"got {value.strip()!r}")
            out[kind] = price
    return out


def dollars_per_hour(gpus_by_design: dict[str, int], prices: dict[str, float]) -> float:
    """Dollars per hour of these GPUs (NaN when a design has no price)."""
    total = 0.0
    for kind, n in gpus_by_design.items():
        if n and kind not in prices:
            return math.nan
        total += n * prices.get(kind, 0.0)
    return total


def cost_per_million_tokens(dollars_hour: float, tokens_per_s: float) -> float:
    """Dollars per million tokens of a deployment costing ``dollars_hour`` that generates
    ``tokens_per_s`` (NaN without a price, inf without tokens)."""
    if not dollars_hour == dollars_hour:
        return math.nan
    if not tokens_per_s > 0:
        return math.inf
    return dollars_hour / (tokens_per_s * 3600.0) * 1e6
