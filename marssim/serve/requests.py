"""The requests a deployment serves: when they arrive and how long their prompts and outputs are.

A :class:`RequestSpec` (immutable, hashable) says how to draw them; :meth:`RequestSpec.draw` turns
it into :class:`Requests` (numpy arrays) with a seed, the same seed always giving the same
requests. Spec strings, as the command line and deployment files take them:

==========================  =====================================================================
arrivals                    meaning
==========================  =====================================================================
``poisson:rate=R``          a Poisson process of ``R`` requests/s (exponential gaps)
``gamma:rate=R,cv=C``       gaps drawn from a gamma distribution of mean ``1/R`` and coefficient
                            of variation ``C`` (``C > 1``: burstier than Poisson, ``C = 1`` is it)
``trace:NAME[,speedup=S]``  a trace's own arrival times (divided by ``S``), its rows in order
``offline``                 every request at time 0 (a batch job: throughput, not latency; the
                            engines' ``throughput`` benchmarks)
``closed:concurrency=N``    a closed loop of ``N`` users (the engines' serving benchmarks at a
``[,duration=T]``           fixed concurrency): each user sends its next request the instant its
                            previous one ends (or is rejected); the first ``N`` at time 0. With
                            ``duration``, users send requests until ``T`` seconds and the run
                            ends when the last one is done (the request count is then a cap, grown
                            as the run needs, :func:`~.simulate.simulate_spec`)
==========================  =====================================================================

A closed loop's arrival times come out of the simulation: :meth:`RequestSpec.draw` gives its
requests arrival 0 (their lengths are those of ``offline`` with the same count and seed) and
the :class:`Requests` carry the concurrency and duration for the simulation to send them.

==========================  =====================================================================
lengths (prompt, output)    meaning
==========================  =====================================================================
``fixed:N`` or ``N``        every request ``N`` tokens
``uniform:LOW-HIGH``        integers uniform on ``[LOW, HIGH]``
``zipf:a=A,low=L,high=H``   bounded Zipf: ``P(k)`` proportional to ``k^-A`` on ``[L, H]``
``trace:NAME``              a trace's rows (drawn at random, prompt and output of the same row
                            together when both name the same trace; in order with its arrivals)
==========================  =====================================================================

``NAME`` is a shipped trace (``azure-conv-2023``, ``azure-code-2023``) or a CSV file
(:mod:`.traces`). Output tokens count every generated token, the first (from the prefill) included.

Shared prefixes (for prefix caching): with ``prefix_tokens`` > 0, a fraction ``prefix_share`` of
the requests begin with one of ``prefix_groups`` shared prompts (a system prompt, a few-shot
preamble) of that many tokens, drawn uniformly, before their own prompt.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np

from marssim.errors import InputError
from marssim.specs import parse_items

from .traces import load_trace

__all__ = ["Arrivals", "Lengths", "RequestSpec", "Requests", "parse_arrivals", "parse_lengths", "parse_prefix",
           "closed_loop"]

ARRIVALS = ("poisson", "gamma", "trace", "offline", "closed")
LENGTHS = ("fixed", "uniform", "zipf", "trace")


@dataclass(frozen=True)
class Arrivals:
    """How requests arrive (see the module docstring); ``rate`` in requests/s."""

    kind: str = "poisson"
    rate: float = 1.0
    cv: float = 1.0
    trace: str = ""
    speedup: float = 1.0
    concurrency: int = 0  # closed loop: users, each with one request in the system
    duration: float = 0.0  # closed loop: seconds during which users send requests (0: until the count)

    def text(self) -> str:
        if self.kind == "closed":
            return f"closed:concurrency={self.concurrency}" + (f",duration={self.duration:g}" if self.duration else "")
        if self.kind == "poisson":
            return f"poisson:rate={self.rate:g}"
        if self.kind == "gamma":
            return f"gamma:rate={self.rate:g},cv={self.cv:g}"
        if self.kind == "trace":
            return f"trace:{self.trace}" + (f",speedup={self.speedup:g}" if self.speedup != 1 else "")
        return self.kind


@dataclass(frozen=True)
class Lengths:
    """A distribution of token counts (see the module docstring)."""

    kind: str = "fixed"
    value: int = 0
    low: int = 0
    high: int = 0
    a: float = 1.0
    trace: str = ""

    def text(self) -> str:
        if self.kind == "fixed":
            return f"fixed:{self.value}"
        if self.kind == "uniform":
            return f"uniform:{self.low}-{self.high}"
        if self.kind == "zipf":
            return f"zipf:a={self.a:g},low={self.low},high={self.high}"
        return f"trace:{self.trace}"


@dataclass(frozen=True, eq=False)
class Requests:
    """Requests in arrival order: arrival times (s), prompt and output tokens (counts)."""

    arrival: np.ndarray
    prompt: np.ndarray
    output: np.ndarray
    source: str = ""
    prefix: np.ndarray | None = None  # shared prompt prefix of each request (-1: none)
    prefix_tokens: np.ndarray | None = None  # its tokens (part of the prompt)
    concurrency: int = 0  # > 0: a closed loop of this many users sends them (arrival is then set by the run)
    duration: float = 0.0  # closed loop: users send requests until this time (s; 0: until all are sent)

    def __post_init__(self) -> None:
        n = len(self.arrival)
        if len(self.prompt) != n or len(self.output) != n:
            raise ValueError("arrival, prompt and output must have one entry per request")
        if n and (np.diff(self.arrival) < 0).any():
            raise ValueError("requests must be in arrival order")
        if n and (min(self.prompt.min(), self.output.min()) < 1):
            raise ValueError("every request needs at least one prompt and one output token")

    def __len__(self) -> int:
        return len(self.arrival)

    @classmethod
    def of(cls, arrival, prompt, output, source: str = "") -> "Requests":
        """Requests from sequences of arrival times (s) and token counts."""
        return cls(np.asarray(arrival, dtype=float), np.asarray(prompt, dtype=np.int64),
                   np.asarray(output, dtype=np.int64), source)


@dataclass(frozen=True)
class RequestSpec:
    """``count`` requests: their arrivals and their prompt and output lengths."""

    arrivals: Arrivals = Arrivals()
    prompt: Lengths = Lengths("fixed", 512)
    output: Lengths = Lengths("fixed", 128)
    count: int = 1000
    prefix_tokens: int = 0
    prefix_groups: int = 1
    prefix_share: float = 1.0

    def with_rate(self, rate: float) -> "RequestSpec":
        """The same requests arriving at ``rate`` requests/s on average (a trace is sped up)."""
        if not rate > 0 or not math.isfinite(rate):
            raise InputError(None, "rate", f"expected a positive number of requests/s, got {rate!r}")
        a = self.arrivals
        if a.kind == "closed":
            raise InputError(None, "rate", "a closed loop's users set the rate (each sends its next request when "
                                           "the previous one ends); give a rate or a concurrency, not both")
        if a.kind == "trace":
            t = load_trace(a.trace)
            n = min(self.count, len(t))
            natural = (n - 1) / float(t.arrival[n - 1]) if n > 1 and t.arrival[n - 1] > 0 else float("inf")
            return replace(self, arrivals=replace(a, speedup=rate / natural))
        if a.kind == "offline":
            return replace(self, arrivals=Arrivals("poisson", rate))
        return replace(self, arrivals=replace(a, rate=float(rate)))

    @property
    def rate(self) -> float:
        """Mean arrival rate in requests/s (inf offline)."""
        a = self.arrivals
        if a.kind in ("poisson", "gamma"):
            return a.rate
        if a.kind == "trace":
            t = load_trace(a.trace)
            n = min(self.count, len(t))
            return (n - 1) / float(t.arrival[n - 1]) * a.speedup if n > 1 and t.arrival[n - 1] > 0 else float("inf")
        return float("inf")

    def text(self) -> str:
        out = (f"{self.count} requests, arrivals {self.arrivals.text()}, prompt {self.prompt.text()}, "
               f"output {self.output.text()}")
        if self.prefix_tokens:
            out += (f", {self.prefix_share:.0%} with one of {self.prefix_groups} shared prefixes of "
                    f"{self.prefix_tokens} tokens")
        return out

    def draw(self, seed: int = 0) -> Requests:
        """The requests of this spec with ``seed`` (numpy's PCG64): arrivals first, then prompt
        lengths, then output lengths, so each part is the same whatever the others are."""
        rng = np.random.default_rng(seed)
        n = self.count
        a = self.arrivals
        if a.kind == "trace":
            t = load_trace(a.trace)
            if n > len(t):
                raise InputError(a.trace, "count", f"the trace has {len(t)} requests; expected at most that many, "
                                                   f"got {n}")
            arrival = t.arrival[:n] / a.speedup
        elif a.kind in ("offline", "closed"):
            arrival = np.zeros(n)
        else:
            if a.kind == "poisson":
                gaps = rng.exponential(1.0 / a.rate, n)
            else:
                shape = 1.0 / (a.cv * a.cv)
                gaps = rng.gamma(shape, 1.0 / (a.rate * shape), n)
            arrival = np.cumsum(gaps)
        rows = None
        if self.prompt.kind == "trace" and self.output.kind == "trace" and self.prompt.trace == self.output.trace:
            rows = self._rows(self.prompt.trace, rng, n)
        prompt = _lengths(self.prompt, rng, n, "prompt_tokens", rows, a)
        output = _lengths(self.output, rng, n, "output_tokens", rows, a)
        loop = {"concurrency": a.concurrency, "duration": a.duration} if a.kind == "closed" else {}
        if not self.prefix_tokens:
            return Requests(arrival.astype(float), prompt, output, self.text(), **loop)
        shared = rng.random(n) < self.prefix_share
        prefix = np.where(shared, rng.integers(0, self.prefix_groups, n), -1).astype(np.int64)
        tokens = np.where(shared, self.prefix_tokens, 0).astype(np.int64)
        return Requests(arrival.astype(float), prompt + tokens, output, self.text(), prefix, tokens, **loop)

    def _rows(self, name: str, rng: np.random.Generator, n: int) -> np.ndarray:
        t = load_trace(name)
        if self.arrivals.kind == "trace" and self.arrivals.trace == name:
            return np.arange(n)
        return rng.integers(0, len(t), n)


def _lengths(spec: Lengths, rng: np.random.Generator, n: int, column: str, rows: np.ndarray | None,
             arrivals: Arrivals) -> np.ndarray:
    if spec.kind == "fixed":
        return np.full(n, spec.value, dtype=np.int64)
    if spec.kind == "uniform":
        return rng.integers(spec.low, spec.high + 1, n).astype(np.int64)
    if spec.kind == "zipf":
        support = np.arange(spec.low, spec.high + 1, dtype=float)
        weights = support ** -spec.a
        cdf = np.cumsum(weights)
        cdf /= cdf[-1]
        pick = np.searchsorted(cdf, rng.random(n), side="right")
        return (spec.low + np.minimum(pick, len(support) - 1)).astype(np.int64)
    t = load_trace(spec.trace)
    if rows is None:
        rows = np.arange(n) if arrivals.kind == "trace" and arrivals.trace == spec.trace and n <= len(t) else \
            rng.integers(0, len(t), n)
    values = t.prompt if column == "prompt_tokens" else t.output
    return values[rows].astype(np.int64)


# ---------------------------------------------------------------------- spec strings
def _items(text: str, where: str) -> tuple[str, list[str], dict[str, str]]:
    kind, _, rest = str(text).strip().partition(":")
    items = parse_items(rest, where, positional=True)
    return kind.strip().lower(), list(items.positional), items.named


def _number(value: str, where: str, key: str, *, integer: bool = False, low: float = 0.0,
            strict: bool = True) -> float:
    try:
        number = float(value)
    except ValueError:
        number = math.nan
    ok = math.isfinite(number) and (number > low if strict else number >= low)
    if integer:
        ok = ok and number == int(number)
    if not ok:
        what = "an integer" if integer else "a number"
        bound = f"> {low:g}" if strict else f">= {low:g}"
        raise InputError(None, f"{where}.{key}", f"expected {what} {bound}, got {value!r}")
    return int(number) if integer else number


def _no_extra(named: dict[str, str], allowed: tuple[str, ...], where: str, kind: str) -> None:
    for key in named:
        if key not in allowed:
            raise InputError(None, f"{where}.{key}", f"unknown for {kind}; expected one of: {', '.join(allowed) or 'none'}")


def parse_arrivals(text: str, where: str = "arrival") -> Arrivals:
    """An :class:`Arrivals` from ``poisson:rate=4``, ``gamma:rate=4,cv=2``, ``trace:NAME``,
    ``offline``, ``closed:concurrency=8[,duration=60]`` (see the module docstring). Raises
    InputError naming the key."""
    kind, positional, named = _items(text, where)
    if kind not in ARRIVALS:
        raise InputError(None, where, f"expected one of {', '.join(ARRIVALS)} (like poisson:rate=4), got {text!r}")
    if kind == "trace":
        if len(positional) != 1:
            raise InputError(None, where, f"expected trace:NAME with a shipped trace or a CSV file, got {text!r}")
        _no_extra(named, ("speedup",), where, kind)
        load_trace(positional[0])
        speedup = _number(named["speedup"], where, "speedup") if "speedup" in named else 1.0
        return Arrivals("trace", trace=positional[0], speedup=speedup)
    if positional:
        raise InputError(None, where, f"expected key=value settings after {kind}:, got {', '.join(positional)}")
    if kind == "offline":
        _no_extra(named, (), where, kind)
        return Arrivals("offline")
    if kind == "closed":
        _no_extra(named, ("concurrency", "duration"), where, kind)
        if "concurrency" not in named:
            raise InputError(None, f"{where}.concurrency", "a closed loop needs concurrency=N (users)")
        return closed_loop(_number(named["concurrency"], where, "concurrency", integer=True, low=1, strict=False),
                           _number(named["duration"], where, "duration") if "duration" in named else 0.0, where)
    _no_extra(named, ("rate", "cv") if kind == "gamma" else ("rate",), where, kind)
    if "rate" not in named:
        raise InputError(None, f"{where}.rate", f"{kind} arrivals need rate=R (requests/s)")
    rate = _number(named["rate"], where, "rate")
    cv = _number(named["cv"], where, "cv") if "cv" in named else 1.0
    return Arrivals(kind, rate=rate, cv=cv)


def closed_loop(concurrency: int, duration: float = 0.0, where: str = "arrival") -> Arrivals:
    """The :class:`Arrivals` of a closed loop of ``concurrency`` users sending requests until
    ``duration`` seconds (0: until the request count is sent). Raises InputError naming the key."""
    if isinstance(concurrency, bool) or not isinstance(concurrency, int) or concurrency < 1:
        raise InputError(None, f"{where}.concurrency", f"expected a positive integer (users), got {concurrency!r}")
    if concurrency > 10_000_000:
        raise InputError(None, f"{where}.concurrency", f"expected at most 10,000,000 users, got {concurrency:,}")
    if isinstance(duration, bool) or not isinstance(duration, (int, float)) or not (duration >= 0) \
            or not math.isfinite(duration):
        raise InputError(None, f"{where}.duration", f"expected a positive time in seconds, got {duration!r}")
    return Arrivals("closed", concurrency=concurrency, duration=float(duration))


def parse_lengths(text: str | int, where: str = "prompt") -> Lengths:
    """A :class:`Lengths` from ``512``, ``fixed:512``, ``uniform:128-2048``,
    ``zipf:a=1.2,low=16,high=4096``, ``trace:NAME``. Raises InputError naming the key."""
    if isinstance(text, int) and not isinstance(text, bool):
        text = str(text)
    text = str(text).strip()
    if text.isdigit():
        text = f"fixed:{text}"
    kind, positional, named = _items(text, where)
    if kind not in LENGTHS:
        raise InputError(None, where, f"expected one of {', '.join(LENGTHS)} (like uniform:128-2048), got {text!r}")
    if kind == "fixed":
        _no_extra(named, ("value",), where, kind)
        raw = positional[0] if len(positional) == 1 and not named else named.get("value", "")
        return Lengths("fixed", value=int(_number(raw, where, "value", integer=True, low=1, strict=False)))
    if kind == "trace":
        if len(positional) != 1 or named:
            raise InputError(None, where, f"expected trace:NAME with a shipped trace or a CSV file, got {text!r}")
        load_trace(positional[0])
        return Lengths("trace", trace=positional[0])
    if kind == "uniform":
        if len(positional) == 1 and "-" in positional[0] and not named:
            low, _, high = positional[0].partition("-")
            named = {"low": low, "high": high}
        elif positional:
            raise InputError(None, where, f"expected uniform:LOW-HIGH or uniform:low=L,high=H, got {text!r}")
        _no_extra(named, ("low", "high"), where, kind)
    else:
        if positional:
            raise InputError(None, where, f"expected zipf:a=A,low=L,high=H, got {text!r}")
        _no_extra(named, ("a", "low", "high"), where, kind)
    for key in ("low", "high"):
        if key not in named:
            raise InputError(None, f"{where}.{key}", f"{kind} lengths need low and high (tokens)")
    low = int(_number(named["low"], where, "low", integer=True, low=1, strict=False))
    high = int(_number(named["high"], where, "high", integer=True, low=1, strict=False))
    if high < low:
        raise InputError(None, f"{where}.high", f"expected at least low ({low}), got {high}")
    if high - low > 10_000_000:
        raise InputError(None, f"{where}.high", f"expected a range of at most 10,000,000 tokens, got {high - low + 1:,}")
    if kind == "uniform":
        return Lengths("uniform", low=low, high=high)
    a = _number(named.get("a", "1"), where, "a")
    return Lengths("zipf", low=low, high=high, a=a)


def parse_prefix(text: str, where: str = "prefix") -> tuple[int, int, float]:
    """``(tokens, groups, share)`` from ``tokens=512,groups=4,share=0.5`` (groups 1 and share 1 by
    default)."""
    _, positional, named = _items(f"prefix:{text}", where)
    if positional:
        raise InputError(None, where, f"expected tokens=T,groups=G,share=S, got {text!r}")
    _no_extra(named, ("tokens", "groups", "share"), where, "a shared prefix")
    if "tokens" not in named:
        raise InputError(None, f"{where}.tokens", "a shared prefix needs tokens=T")
    tokens = int(_number(named["tokens"], where, "tokens", integer=True, low=1, strict=False))
    groups = int(_number(named.get("groups", "1"), where, "groups", integer=True, low=1, strict=False))
    share = _number(named.get("share", "1"), where, "share")
    if share > 1:
        raise InputError(None, f"{where}.share", f"expected a fraction from 0 to 1, got {share:g}")
    return tokens, groups, share
