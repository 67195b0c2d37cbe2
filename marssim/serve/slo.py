"""What a capacity plan must meet and what it costs: service-level constraints on a run's latency
percentiles, and the price of its GPUs.

One grammar, ``--slo`` of ``marssim serve``, ``search`` and ``compare`` and the ``slo`` section of a
deployment file alike (:func:`parse_slo`, :func:`slo_from_mapping`): comma-separated bounds, each
``METRIC_STAT=TIME`` (a bound on a statistic of the run) or ``METRIC=TIME`` (a bound on every
request, ``ttft``, ``tpot`` or ``e2e``: what the goodput counts, :class:`~.metrics.SLO`).

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

__all__ = ["Bound", "Constraints", "METRICS", "REQUEST_METRICS", "STATS", "parse_slo", "slo_from_mapping",
           "parse_constraints", "parse_prices", "dollars_per_hour", "cost_per_million_tokens"]

METRICS = {"ttft": "ttft_s", "tbt": "tbt_s", "tpot": "tpot_s", "e2e": "e2e_s", "queue": "queue_s"}
"""Constraint metrics and the summary entries that hold them."""
STATS = ("p50", "p90", "p99", "mean", "max")
REQUEST_METRICS = ("ttft", "tpot", "e2e")
"""The metrics a bound on every request (``METRIC=TIME``, no statistic) may name."""
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
    """Bounds a run must meet (see the module docstring): ``bounds`` on statistics of the run;
    ``per_request``: bounds every request should meet (seconds; what the goodput counts)."""

    bounds: tuple[Bound, ...] = ()
    per_request: SLO = SLO()

    def __bool__(self) -> bool:
        return bool(self.bounds) or self.per_request != SLO()

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
        given on each, on every request or on any statistic; TBT and queueing have no per-request
        bound)."""
        limits: dict[str, float] = {k: v for k in REQUEST_METRICS
                                    if (v := getattr(self.per_request, k)) is not None}
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

    def overridden_by(self, other: "Constraints") -> "Constraints":
        """These bounds with ``other``'s in place of any on the same key (a flag over a file)."""
        bounds = {b.key: b for b in self.bounds}
        bounds.update({b.key: b for b in other.bounds})
        every = {}
        for k in REQUEST_METRICS:
            mine, theirs = getattr(self.per_request, k), getattr(other.per_request, k)
            if theirs is not None or mine is not None:
                every[k] = theirs if theirs is not None else mine
        return Constraints(tuple(bounds.values()), SLO(**every))

    def text(self) -> str:
        every = self.per_request.text()
        return ", ".join([b.text() for b in self.bounds] + ([f"every request {every}"] if every != "none" else [])) \
            or "none"

    def spec(self) -> str:
        """The constraints as ``--slo`` takes them."""
        every = [(k, getattr(self.per_request, k)) for k in REQUEST_METRICS]
        return ",".join([f"{b.key}={b.limit!r}s" for b in self.bounds] + [f"{k}={v!r}s" for k, v in every
                                                                              if v is not None])


_GRAMMAR = (f"expected bounds METRIC_STAT=TIME with METRIC one of {', '.join(METRICS)} and STAT one of "
            f"{', '.join(STATS)} (like ttft_p99=2s,tbt_p99=100ms), or METRIC=TIME bounding every request with "
            f"METRIC one of {', '.join(REQUEST_METRICS)} (like ttft=2s)")


def _bound(key: str, raw: object, file: str | None, where: str, unknown_at: str) -> Bound:
    """One bound of the grammar: ``key`` (``ttft_p99``, or ``ttft`` for every request, then
    ``stat`` is empty) at most ``raw`` (a time with its unit). Errors name ``where.key``, an
    unknown key ``unknown_at``."""
    from marssim import units

    metric, _, stat = key.rpartition("_")
    if key in REQUEST_METRICS:
        metric, stat = key, ""
    elif metric not in METRICS or stat not in STATS:
        hint = f" (a bound on a statistic: {key}_p99=...)" if key in METRICS else ""
        raise InputError(file, unknown_at, f"{_GRAMMAR}; got {key!r}{hint}")
    try:
        limit = units.parse(raw, "time", require_unit=True, bounded=True)
    except units.UnitError as err:
        raise InputError(file, f"{where}.{key}", str(err)) from None
    return Bound(metric, stat, limit)


def _constraints(bounds: list[Bound]) -> Constraints:
    per_request = {b.metric: b.limit for b in bounds if not b.stat}
    return Constraints(tuple(b for b in bounds if b.stat), SLO(**per_request))


def parse_slo(text: str, where: str = "--slo") -> Constraints:
    """:class:`Constraints` from ``ttft_p99=2s,tbt_p99=100ms`` and ``ttft=2s,tpot=100ms`` (see the
    module docstring; both kinds may be mixed); InputError naming the bad part."""
    from marssim.specs import parse_items

    items = parse_items(text, where, expected=_GRAMMAR.removeprefix("expected "))
    if not items.named:
        raise InputError(None, where, "expected at least one bound, like ttft_p99=2s,tbt_p99=100ms or ttft=2s")
    return _constraints([_bound(k, v, None, where, where) for k, v in items.named.items()])


def slo_from_mapping(section, file: str | None, where: str = "slo") -> Constraints:
    """:class:`Constraints` from a file's mapping (``{ttft: 2 s, tbt_p99: 100 ms}``), the grammar of
    :func:`parse_slo`; InputError with the file and key path."""
    if not isinstance(section, dict):
        raise InputError(file, where, "expected a mapping like {ttft: 2 s, tpot: 100 ms, tbt_p99: 50 ms}")
    return _constraints([_bound(str(k), v, file, where, f"{where}.{k}") for k, v in section.items()])


def parse_constraints(text: str, where: str = "--slo") -> Constraints:
    """The constraints of a serving search: :func:`parse_slo`'s bounds on statistics of a run
    (``ttft_p99=2s,tbt_p99=100ms``), at least one; a bound on every request (``ttft=2s``) is
    refused (a search ranks runs by their statistics)."""
    c = parse_slo(text, where)
    given = [k for k in REQUEST_METRICS if getattr(c.per_request, k) is not None]
    if given:
        raise InputError(None, where, f"a search bounds statistics of a run, METRIC_STAT=TIME like "
                                      f"{given[0]}_p99=2s,tbt_p99=100ms; got {given[0]}= (a bound on a statistic: "
                                      f"{given[0]}_p99=...)")
    return c


def parse_prices(texts: list[str] | str, kinds: set[str], where: str = "--gpu-price") -> dict[str, float]:
    """Dollars per GPU-hour by GPU design from ``h100=2.5,a100=1.2`` (one or several strings);
    InputError for a design the system has not, a bad number, or a design priced twice."""
    from marssim.specs import parse_items

    joined = ",".join([texts] if isinstance(texts, str) else texts)
    out: dict[str, float] = {}
    for kind, value in parse_items(joined, where, expected="DESIGN=DOLLARS_PER_GPU_HOUR like h100=2.5").named.items():
        if kind not in kinds:
            raise InputError(None, f"{where}.{kind}", f"not a GPU design of the system; expected one of "
                                                      f"{', '.join(sorted(kinds))}")
        try:
            price = float(value)
        except ValueError:
            price = math.nan
        if not 0 < price < 1e4:
            raise InputError(None, f"{where}.{kind}", f"expected dollars per GPU-hour above 0 and below 10,000, "
                                                      f"got {value!r}")
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
