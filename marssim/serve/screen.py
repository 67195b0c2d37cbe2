"""A deployment's latency percentiles, capacity and goodput in closed form: the screen a search
ranks thousands of deployments by before it simulates the promising ones.

Every time below is an iteration of the simulation's own :class:`~.itermodel.IterationModel`
(the cost model's kernels, the tensor-parallel collectives on their routes; a pipeline's
transfers at their route's latency and bandwidth); what is closed form is how iterations add up
under load. Per *virtual engine* (a replica runs ``pp`` of them, each seeing ``1/pp`` of the
replica's requests and KV blocks; a replica's share of the load is in proportion to its capacity,
as the token-balancing router makes it):

* the stream: mean prompt ``p``, mean decode steps per request ``o1`` (output tokens less the
  first), the token-weighted mean context of a decode step ``c`` (``p + o/2`` per request), and
  the quantiles of prompt and output lengths;
* an iteration of ``B`` decoding sequences at context ``c`` takes ``D(B)`` (interpolated between
  batch sizes 1, 2, 3, 4, 6, 8, 12, ...); one of a prompt of ``q`` tokens alone ``P(q)``; a
  chunked iteration of ``B`` decodes and ``K - B`` prompt tokens (``K``: the token budget)
  ``F(B)``; a mixed one (Orca) of ``B`` decodes and a whole prompt ``M(B, q)``; on a pipeline an
  engine's period is the larger of an iteration's latency (stages and transfers) and ``pp`` times
  its slowest stage (the other engines share the stages);
* ``continuous``: prompts are prefilled in iterations of their own, a fraction ``rho = lambda
  E[P(q)]`` of the time; decodes fill the rest, so a token's mean gap is ``g = D(B) / (1 - rho)``
  and Little's law gives the batch: ``B = lambda o1 g`` (solved for the smallest ``B``; no
  solution below the sequence cap and the KV-cache capacity ``blocks / c``: the load is beyond
  the engine's capacity; with ``capacity=guaranteed_no_evict`` the cap is ``blocks / (p + o)``,
  each running request holding its whole prompt and output). ``mixed``: the same with ``M(B, q) - D(B)`` per prompt. ``chunked``: an
  iteration carrying ``x`` prompt tokens takes ``D(B) + (F(B) - D(B)) x / (K - B)``, so prompt
  tokens take ``rho = lambda p (F - D) / (K - B)`` of the time, ``g = D(B) / (1 - rho)``, and a
  fraction ``lambda g ceil(q / (K - B))`` of iterations carry some;
* quantile ``x`` of time between tokens: a gap holds prompt work with probability ``f`` (``1 -
  exp(-lambda g)``, the chance a prompt arrived during the previous gap; chunked: the fraction
  above); above ``1 - x`` the gap holds the prompt at quantile ``1 - (1 - x) / f`` (continuous:
  its prefill iterations until the engine decodes again, a busy period of mean ``P(q) / (1 -
  rho)``; chunked: its chunk; mixed: ``M(B, q)``), else it is ``D(B)``; on a pipeline, another
  virtual engine's prompt work holds the shared stages for ``1/pp`` of its time, in ``1 - (1 -
  f)^pp`` of the gaps;
* quantile ``x`` of time to first token: the iteration in flight (prompt work when every engine of
  the pool has some: Erlang's C of their load), the wait for the prompt tokens ahead (the pool's
  engines as an M/M/c queue, as a load-balancing router makes them: ``P(W > t) = C exp(-c (1 -
  rho) t / S)``, ``S`` a prompt's share of a full token budget's iteration), and the prompt's own
  prefill at quantile ``x`` (chunked: ``ceil(q / (K - B))`` iterations); the three added, an
  upper bound of the quantile of their sum;
* a disaggregated deployment: the prefill pool's engines only prefill, the decode pool's only
  decode, and a request's first decode gap also holds its KV cache's move (its bytes over the
  slowest GPU link of the :func:`~.disagg.kv_plan`);
* E2E at ``x``: TTFT at ``x`` plus ``o_x - 1`` mean gaps; TPOT at ``x``: the mean gap plus the
  gap's excess at ``x`` spread over the median request's decode steps;
* requests the engines would reject (a prompt above a continuous batcher's budget, a request
  above a replica's KV cache) are counted as the simulation counts them.

The deployment's figure is the worst of its engines' (a router spreads requests over them all);
above the deployment's capacity (the sum of its engines' capacities, of the prefill or the
decode pool whichever is smaller) every latency is infinite. :func:`screen_goodput` is the
highest rate at which the screened figures meet a set of constraints. Units: seconds,
requests/s, tokens.
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass, field

import numpy as np

from marssim.cost.base import CostModel
from marssim.errors import InputError
from marssim.system import System
from marssim.workload.llm.config import TransformerConfig

from .deployment import Deployment, Pool, check_deployment
from .hosttime import HostTime, host_time, shape_sequences
from .itermodel import IterationModel
from .memory import replica_memory
from .poolcheck import check_pool
from .requests import Requests
from .slo import Constraints

__all__ = ["StreamStats", "ServeScreen", "DeploymentScreen", "screen_deployment", "screen_goodput", "erlang_c"]

_DECILES = tuple((i + 0.5) / 10 for i in range(10))
_STATS = ("p50", "p90", "p99", "mean", "max")
_METRICS = ("ttft_s", "tbt_s", "tpot_s", "e2e_s", "queue_s")


def _grid(limit: float) -> list[int]:
    """Batch sizes the decode and chunk times are computed at: 1, 2, 3, 4, 6, 8, 12, ... up to
    the first at or above ``limit``."""
    out = [1, 2, 3]
    while out[-1] < limit:
        a, b = out[-2], out[-1]
        out.append(b + (b - a) if b == 2 * a else 2 * a)
    return out


@dataclass(frozen=True, eq=False)
class StreamStats:
    """What the screen reads of a request stream: its offered rate (requests/s) and its lengths."""

    count: int
    rate: float
    prompts: np.ndarray  # sorted
    outputs: np.ndarray  # sorted
    prompt_mean: float
    decode_mean: float  # decode steps per request: output tokens less the first
    decode_context: float  # tokens of context of a decode step, weighted by steps
    longest: np.ndarray = field(repr=False, default=None)  # prompt + output, sorted

    @classmethod
    def of(cls, requests: Requests) -> "StreamStats":
        p = requests.prompt.astype(float)
        o = requests.output.astype(float)
        n = len(requests)
        span = float(requests.arrival[-1] - requests.arrival[0]) if n > 1 else 0.0
        rate = (n - 1) / span if span > 0 else math.inf
        steps = o - 1
        ctx = float((steps * (p + o / 2)).sum() / steps.sum()) if steps.sum() > 0 else float(p.mean())
        return cls(n, rate, np.sort(requests.prompt), np.sort(requests.output), float(p.mean()), float(steps.mean()),
                   ctx, np.sort(requests.prompt + requests.output))

    def prompt_at(self, q: float) -> int:
        """The prompt length at quantile ``q`` (tokens, rounded up)."""
        return int(math.ceil(float(np.quantile(self.prompts, min(max(q, 0.0), 1.0)))))

    def output_at(self, q: float) -> int:
        return int(math.ceil(float(np.quantile(self.outputs, min(max(q, 0.0), 1.0)))))

    def prompts_above(self, tokens: int) -> int:
        return int(len(self.prompts) - np.searchsorted(self.prompts, tokens, side="right"))

    def longer_than(self, tokens: int) -> int:
        """Requests whose prompt and output together exceed ``tokens``."""
        return int(len(self.longest) - np.searchsorted(self.longest, tokens, side="right"))


def erlang_c(servers: int, load: float) -> float:
    """The probability that a request waits at ``servers`` servers of ``load`` each (Erlang's C
    formula; Erlang B by its recursion, stable for any number of servers)."""
    if load >= 1:
        return 1.0
    if load <= 0:
        return 0.0
    a = servers * load
    b = 1.0
    for k in range(1, servers + 1):
        b = a * b / (k + a * b)
    return b / (1 - load * (1 - b))


def _wait(load: float, service: float, q: float, servers: int = 1) -> float:
    """Quantile ``q`` of the wait at ``servers`` servers of ``load`` each and mean service
    ``service`` (M/M/c: ``P(W > t) = C exp(-servers (1 - load) t / service)``, ``C`` Erlang's)."""
    if service <= 0 or load <= 0:
        return 0.0
    c = erlang_c(servers, load)
    if c <= 1 - q:
        return 0.0
    return service / (servers * (1 - load)) * math.log(c / (1 - q))


class _Times:
    """An iteration model's latencies and periods for the shapes the screen asks, memoised."""

    def __init__(self, im: IterationModel, system: System, host: HostTime | None = None) -> None:
        self.im = im
        self.host = host
        self.pp = im.pp
        self.memo: dict[tuple, tuple[float, float]] = {}
        cap = system.resource_capacity
        self.hops = []
        for s in range(im.pp):
            a, b = im.stages[s][0], im.stages[(s + 1) % im.pp][0]
            route = system.route(a, b)
            self.hops.append((route.latency, min((float(cap[r]) for r in route.resources), default=math.inf)))

    def shape(self, shape: tuple, tokens: int, rows: int) -> tuple[float, float]:
        """``(latency, period)`` of an iteration of ``shape`` (see :meth:`IterationModel.stage_times`)."""
        key = (shape, tokens, rows)
        hit = self.memo.get(key)
        if hit is None:
            times = self.im.stage_times(*shape)
            if self.host is not None:  # the engine's host time on the first stage
                seqs, decode_only = shape_sequences(shape)
                times = (self.host.step(times[0], seqs, decode_only),) + tuple(times[1:])
            lat = float(sum(times))
            if self.pp > 1:
                for s in range(self.pp - 1):
                    latency, bw = self.hops[s]
                    lat += latency + self.im.activation_bytes(tokens) / bw
                latency, bw = self.hops[-1]
                lat += latency + self.im.token_bytes(rows) / bw
            hit = self.memo[key] = (lat, max(lat, self.pp * float(max(times))))
        return hit

    def prefill(self, q: int) -> tuple[float, float]:
        return self.shape(((1, q), (1, q), ((1, q, q),), 0, 0, 1), q, 1)

    def decode(self, b: int, ctx: int) -> tuple[float, float]:
        return self.shape(((b, 1), (0, 0), (), b, b * ctx, b), b, b)

    def mixed(self, b: int, chunk: int, ctx: int, prompt: float, dctx: int) -> tuple[float, float]:
        """``b`` decodes at context ``dctx`` and ``chunk`` prompt tokens (of prompts of ``prompt``
        tokens on average: several whole ones when the chunk holds them, else a piece of one at
        context ``ctx``)."""
        if chunk >= 2 * prompt and prompt >= 1:
            n = max(1, int(chunk // prompt))
            q = max(1, int(round(chunk / n)))
            groups, kv = ((n, q, q),), (n, q)
            rows = b + n
        else:
            groups, kv = ((1, chunk, max(chunk, ctx)),), (1, chunk)
            rows = b + 1
        tokens = (1, b + chunk) if b else (kv if kv[0] > 1 else (1, chunk))
        return self.shape((tokens, kv, groups, b, b * dctx, rows), b + chunk, rows)


_TIMES: dict[int, tuple[IterationModel, _Times]] = {}


def _times(im: IterationModel, system: System, sched=None) -> _Times:
    """The memoised times of ``im`` with the host time of the engine of ``sched`` (a
    :class:`~.deployment.SchedulerConfig`; None: no host)."""
    engine = ("none", True, None) if sched is None else (sched.engine, sched.cuda_graphs, sched.overlap)
    key = (id(im), engine)
    hit = _TIMES.get(key)
    if hit is None or hit[0] is not im:
        if len(_TIMES) >= 64:
            _TIMES.clear()
        hit = _TIMES[key] = (im, _Times(im, system, host_time(*engine[:2], im, engine[2])))
    return hit[1]


@dataclass
class _State:
    """An engine at a load (seconds; loads as fractions of time)."""

    lam: float  # requests/s
    batch: float  # B: sequences decoding
    decode: float  # D(B): a decode iteration
    gap: float  # mean time between two tokens of a sequence
    busy: float  # fraction of time in prefill (continuous) or chunk (chunked) iterations
    bulk: float  # load of the batched prefill server (a full token budget per iteration)
    bulk_service: float  # its mean service per request
    chunk: float = 0.0  # F(B), chunked
    period: float = 0.0  # mean iteration
    share: float = 0.0  # fraction of iterations (so of gaps) that carry a chunk, chunked


class _Engine:
    """One class of alike replicas of a pool (same iteration model and scheduler): a virtual
    engine in closed form (module docstring)."""

    def __init__(self, times: _Times, pool: Pool, blocks: int, stats: StreamStats, count: int) -> None:
        self.t = times
        self.pool = pool
        self.cfg = pool.scheduler
        self.role = pool.role
        self.count = count  # replicas of the class
        self.stats = stats
        pp = times.pp
        self.engines = count * pp
        per = blocks // pp
        self.blocks = per
        wm = int(self.cfg.watermark * per)
        self.kv_tokens = max(0, per - wm) * self.cfg.block_size
        self.ctx = max(1, int(round(stats.decode_context)))
        # a running request holds its context's blocks; under guaranteed_no_evict its whole prompt and output
        held = stats.prompt_mean + stats.decode_mean + 1.0 if self.cfg.capacity == "guaranteed_no_evict" \
            and self.cfg.kind != "static" else stats.decode_context
        b_max = min(float(self.cfg.max_num_seqs), self.kv_tokens / max(held, 1.0))
        if self.cfg.kind == "chunked":
            b_max = min(b_max, self.cfg.max_batched_tokens - 1.0)
        self.b_max = b_max
        self.grid = _grid(max(b_max, 1.0))
        self._deciles = [stats.prompt_at(q) for q in _DECILES]
        self.prefill_mean = float(np.mean([times.prefill(q)[1] for q in self._deciles])) \
            if self.role != "decode" else 0.0
        budget = self.cfg.max_batched_tokens
        p = stats.prompt_mean
        # a full prefill batch (whole prompts up to the budget): seconds per prompt token
        full = self.t.mixed(0, budget, budget, p, self.ctx)[1] if budget >= p else self.t.prefill(budget)[1]
        self.bulk_per_token = full / budget
        self._cap: float | None = None

    # ------------------------------------------------------------------ times
    def _interp(self, b: float, fn) -> float:
        b = max(1.0, b)
        grid = self.grid
        i = bisect.bisect_left(grid, b)
        if i < len(grid) and grid[i] == b:
            return fn(grid[i])
        lo = grid[max(i - 1, 0)]
        hi = grid[min(i, len(grid) - 1)]
        if hi == lo:
            return fn(lo)
        a, c = fn(lo), fn(hi)
        return a + (c - a) * (b - lo) / (hi - lo)

    def D(self, b: float) -> float:
        return self._interp(b, lambda k: self.t.decode(k, self.ctx)[1])

    def F(self, b: float) -> float:
        """A chunked iteration: ``b`` decodes and the rest of the budget in prompt tokens."""
        budget = self.cfg.max_batched_tokens
        p = self.stats.prompt_mean

        def at(k: int) -> float:
            chunk = max(1, budget - k)
            return self.t.mixed(k, chunk, int(round((p + chunk) / 2)), p, self.ctx)[1]

        if self.role == "prefill":
            return self.t.mixed(0, budget, int(round((p + budget) / 2)), p, self.ctx)[1]
        return self._interp(b, at)

    def M(self, b: float, q: int) -> float:
        """A mixed iteration: ``b`` decodes and a whole prompt of ``q`` tokens."""
        return self._interp(b, lambda k: self.t.mixed(k, q, q, q, self.ctx)[1])

    def prefill_batch(self, first: int, extra: float) -> float:
        """A prefill iteration of a prompt of ``first`` tokens and ``extra`` more prompt tokens
        (prompts of the mean length), within the token budget."""
        tokens = int(min(self.cfg.max_batched_tokens, first + max(extra, 0.0)))
        if tokens <= first:
            return self.t.prefill(first)[1]
        return self.t.mixed(0, tokens, tokens, self.stats.prompt_mean, self.ctx)[1]

    # ------------------------------------------------------------------ load
    def _solve(self, batch_of) -> float | None:
        """The smallest batch ``B`` with ``batch_of(B) = B`` (below 1 at light load; None: none
        below the sequence and KV-cache caps, the engine is past its capacity)."""
        one = batch_of(1.0)
        if one <= 1.0:
            return max(one, 0.0)
        if self.b_max < 1:
            return None
        lo, hi = 1.0, None
        for g in self.grid[1:] + [self.b_max]:
            g = min(float(g), self.b_max)
            if batch_of(g) <= g:
                hi = g
                break
            lo = g
            if g >= self.b_max:
                break
        if hi is None:
            return None
        for _ in range(60):
            mid = 0.5 * (lo + hi)
            if batch_of(mid) > mid:
                lo = mid
            else:
                hi = mid
            if hi - lo <= 1e-6 * hi:
                break
        return hi

    def state(self, lam: float) -> _State | None:
        """The engine at ``lam`` requests/s (None: beyond its capacity)."""
        s = self.stats
        o1 = s.decode_mean
        p = s.prompt_mean
        kind = self.cfg.kind
        budget = self.cfg.max_batched_tokens
        if self.role == "prefill":
            if kind == "chunked":
                f = self.F(0)
                busy = lam * p * f / budget
                service = p * f / budget
            else:
                f = self.prefill_mean
                busy = lam * f
                service = p * self.bulk_per_token
            if busy >= 1:
                return None
            return _State(lam, 0.0, 0.0, f, busy, lam * service, service, f, f, min(1.0, busy))
        if kind == "chunked":
            arrive = lam * p if self.role != "decode" else 0.0  # prompt tokens/s

            def busy_of(b: float) -> float:
                """Fraction of the time spent on prompt tokens (an iteration of ``c`` of them
                takes ``D + (F - D) c / room``)."""
                room = budget - max(b, 1.0)
                return arrive * (self.F(b) - self.D(b)) / room if room >= 1 else math.inf

            def batch_of(b: float) -> float:
                busy = busy_of(b)
                return math.inf if busy >= 1 else lam * o1 * self.D(b) / (1 - busy)

            b = self._solve(batch_of)
            if b is None:
                return None
            busy = busy_of(b)
            if busy >= 1:
                return None
            d, f = self.D(b), self.F(b)
            room = budget - max(b, 1.0)
            period = d / (1 - busy)
            chunks = float(np.mean([math.ceil(q / room) for q in self._deciles])) if arrive else 0.0
            share = min(1.0, lam * period * chunks)
            return _State(lam, b, d, period, busy, busy, p * (f - d) / room, f, period, share)
        mixed = self.cfg.mixed and self.role != "decode"

        def prefill_time(b: float) -> float:
            """Seconds of prefill work per request (in iterations of their own, or added to a
            mixed iteration)."""
            if self.role == "decode":
                return 0.0
            if mixed:
                d = self.D(b)
                return float(np.mean([max(self.M(b, q) - d, 0.0) for q in self._deciles]))
            return self.prefill_mean

        def batch_of(b: float) -> float:
            busy = lam * prefill_time(b)
            return math.inf if busy >= 1 else lam * o1 * self.D(b) / (1 - busy)

        b = self._solve(batch_of)
        if b is None:
            return None
        busy = lam * prefill_time(b)
        if busy >= 1:
            return None
        d = self.D(b)
        service = p * self.bulk_per_token if self.role != "decode" else 0.0
        gap = d / (1 - busy)
        return _State(lam, b, d, gap, busy, lam * service, service, 0.0, gap, 0.0)

    def chunk_time(self, st: _State, tokens: float) -> float:
        """A chunked iteration carrying ``tokens`` prompt tokens (at most the room left)."""
        room = self.cfg.max_batched_tokens - (max(st.batch, 1.0) if self.role != "prefill" else 0.0)
        return st.decode + (st.chunk - st.decode) * min(tokens, room) / room

    def capacity(self) -> float:
        """Requests/s one engine sustains (the highest load with a state)."""
        if self._cap is None:
            lo, hi = 1e-9, 1.0
            if self.state(lo) is None:
                self._cap = 0.0
                return 0.0
            while self.state(hi) is not None and hi < 1e9:
                lo, hi = hi, hi * 4
            for _ in range(60):
                mid = 0.5 * (lo + hi)
                if self.state(mid) is not None:
                    lo = mid
                else:
                    hi = mid
                if hi - lo <= 1e-4 * hi:
                    break
            self._cap = lo
        return self._cap

    # ------------------------------------------------------------------ figures
    def first_token(self, st: _State, x: float | None) -> tuple[float, float]:
        """``(TTFT, queueing delay)`` at quantile ``x`` (None: the mean): the iteration in flight,
        the wait for the prompt tokens ahead, the request's own prefill."""
        s = self.stats
        t = self.t
        chunked = self.cfg.kind == "chunked"
        room = self.cfg.max_batched_tokens - (max(st.batch, 1.0) if self.role != "prefill" else 0.0)
        c = self.engines

        def own(q: int) -> float:
            if chunked:
                return math.ceil(q / room) * self.chunk_time(st, q)
            return self.M(st.batch, q) if self.cfg.mixed else t.prefill(q)[0]

        if x is None:
            wait = st.period / 2 + erlang_c(c, st.bulk) * st.bulk_service / (c * (1 - st.bulk))
            mine = float(np.mean([own(q) for q in self._deciles]))
            return wait + mine, wait
        tail = 1 - x
        # the router sends a request to an engine busy with prompts only when all are
        busy = erlang_c(c, st.busy)
        inflight = st.decode
        if busy > tail:
            q = s.prompt_at(1 - tail / busy)
            if chunked:
                inflight = self.chunk_time(st, q)
            else:
                inflight = self.M(st.batch, q) if self.cfg.mixed else t.prefill(q)[1]
        wait = inflight + _wait(st.bulk, st.bulk_service, x, c)
        return wait + own(s.prompt_at(x)), wait

    def between_tokens(self, st: _State, x: float | None, kv: "_KVMove | None") -> float:
        """Time between two tokens at quantile ``x`` (None: the mean gap): a decode iteration, or
        one that also carries prompt tokens (chunked, mixed) or follows prefill iterations
        (continuous), as often as prompts arrive; in a disaggregated deployment a request's first
        gap also holds its KV cache's move."""
        s = self.stats
        if x is None:
            extra = kv.mean() / max(s.decode_mean, 1.0) if kv is not None else 0.0
            return st.gap + extra
        tail = 1 - x
        gap = st.decode
        if self.role != "decode":
            arrivals = st.lam * st.gap  # prompts arriving during a gap
            if self.cfg.kind == "chunked":
                f = st.share
                extra = max(arrivals / f - 1, 0.0) * s.prompt_mean if f > 0 else 0.0
            else:
                f = 1 - math.exp(-arrivals)
                extra = (arrivals / f - 1) * s.prompt_mean if f > 0 else 0.0

            def with_prompt(q: int) -> float:
                if self.cfg.kind == "chunked":
                    return self.chunk_time(st, q + extra)
                if self.cfg.mixed:
                    return self.M(st.batch, q)
                # the prefill iterations until the engine decodes again: a busy period started
                # by that prompt (mean: its time over 1 - load, M/G/1)
                return st.decode + self.prefill_batch(q, extra) / (1 - st.busy)

            pp = self.t.pp
            others = 1 - (1 - min(f, 1.0)) ** pp  # some engine of the replica has prompt work
            if f > tail:
                gap = with_prompt(s.prompt_at(1 - tail / f))
            elif pp > 1 and others > tail:
                # another virtual engine's prompt work holds the shared stages for its share
                gap = st.decode + (with_prompt(s.prompt_at(1 - tail / others)) - st.decode) / pp
        if kv is not None:
            h = 1 / max(s.decode_mean, 1.0)  # first decode gaps among all gaps
            if h > tail:
                gap = max(gap, st.decode + kv.seconds(s.prompt_at(1 - tail / h)))
        return gap


class _KVMove:
    """Seconds to move a prompt's KV cache from a prefill replica to a decode replica: the flows
    of :func:`~.disagg.kv_plan`, each GPU's bytes over its slowest route, the busiest GPU's time."""

    def __init__(self, model: TransformerConfig, system: System, src, dst, stats: StreamStats) -> None:
        from .disagg import kv_plan

        cap = system.resource_capacity
        out: dict[str, float] = {}
        inn: dict[str, float] = {}
        latency = 0.0
        for a, b, per in kv_plan(model, src, dst):
            route = system.route(a, b)
            bw = min((float(cap[r]) for r in route.resources), default=math.inf)
            latency = max(latency, route.latency)
            out[a] = out.get(a, 0.0) + per / bw
            inn[b] = inn.get(b, 0.0) + per / bw
        self.latency = latency
        self.per_token = max(list(out.values()) + list(inn.values()), default=0.0)
        self.stats = stats

    def seconds(self, tokens: int) -> float:
        return self.latency + tokens * self.per_token

    def mean(self) -> float:
        return self.seconds(int(round(self.stats.prompt_mean)))


@dataclass(frozen=True)
class ServeScreen:
    """A deployment screened at a load: ``summary`` has the entries of a simulation's summary the
    constraints read (``ttft_s``, ``tbt_s``, ``tpot_s``, ``e2e_s``, ``queue_s`` with ``p50``,
    ``p90``, ``p99``, ``mean``, ``max``; ``rejected``, ``completed``, ``throughput_rps``,
    ``output_tokens_per_s``, ``gpus``); ``capacity_rps``: the highest rate it sustains;
    ``feasible`` False (with ``error``) when it cannot run at all (no room for a KV cache)."""

    rate: float
    summary: dict
    capacity_rps: float
    gpus: int
    gpus_by_design: dict
    feasible: bool = True
    error: str = ""


class DeploymentScreen:
    """The closed form of one deployment for one stream, at any rate (:meth:`at`)."""

    def __init__(self, deployment: Deployment, model: TransformerConfig, system: System, cost: CostModel,
                 stats: StreamStats) -> None:
        from .simulate import iteration_model, place_replicas

        check_deployment(deployment)
        for i, pool in enumerate(deployment.pools):
            if pool.scheduler.speculative:
                raise InputError("deployment", f"pools[{i}].spec_method", "the screen does not model speculative "
                                                                          "decoding; simulate the deployment")
        self.deployment = deployment
        self.stats = stats
        self.model = model
        self.error = ""
        self.gpus_by_design: dict[str, int] = {}
        classes: dict[tuple, list] = {}
        first: dict[int, tuple] = {}
        for p, stages in place_replicas(system, deployment):
            pool = deployment.pools[p]
            check_pool(pool, model, "deployment", f"pools[{p}].")
            design = system.accelerator(stages[0][0]).designs[0]
            self.gpus_by_design[design] = self.gpus_by_design.get(design, 0) + pool.gpus_per_replica
            im = iteration_model(model, system, stages, cost, deployment.context_bucket, pool.ep,
                                 pool.scheduler.fused_elementwise)
            first.setdefault(p, stages)
            key = (p, id(im))
            if key not in classes:
                capacity = system.accelerator(stages[0][0]).memory.capacity
                classes[key] = [im, pool, capacity, 0]
            classes[key][3] += 1
        self.engines: list[_Engine] = []
        self.rejected = 0
        for (p, _), (im, pool, capacity, count) in classes.items():
            mem = replica_memory(im, pool.scheduler, capacity, where=f"pools[{p}]")
            eng = _Engine(_times(im, system, pool.scheduler), pool, mem.blocks, stats, count)
            self.engines.append(eng)
        self.kv = None
        if deployment.disaggregated:
            src = next(first[p] for p, pool in enumerate(deployment.pools) if pool.role == "prefill")
            dst = next(first[p] for p, pool in enumerate(deployment.pools) if pool.role == "decode")
            self.kv = _KVMove(model, system, src, dst, stats)
        self.rejected = self._rejected()
        front = [e for e in self.engines if e.role != "decode"]
        back = [e for e in self.engines if e.role == "decode"]
        self.front_capacity = sum(e.capacity() * e.engines for e in front)
        self.capacity = self.front_capacity
        if back:
            self.capacity = min(self.capacity, sum(e.capacity() * e.engines for e in back))

    def _rejected(self) -> int:
        """Requests an engine of the deployment would reject at arrival (as the simulation's
        admission check)."""
        s = self.stats
        worst = 0
        decoders = [e for e in self.engines if e.role == "decode"]
        for e in self.engines:
            if e.role == "decode":
                continue
            cfg = e.cfg
            bs = cfg.block_size
            wm = int(cfg.watermark * e.blocks)
            n = 0
            if e.role == "prefill":
                fit = (e.blocks - wm) * bs
                n = s.prompts_above(fit)
                for d in decoders:
                    n = max(n, s.longer_than((d.blocks - int(d.cfg.watermark * d.blocks)) * d.cfg.block_size))
            else:
                fit = (e.blocks - (0 if cfg.kind == "static" else wm)) * bs
                n = s.longer_than(fit)
            if cfg.kind == "continuous":
                n = max(n, s.prompts_above(cfg.max_batched_tokens))
            if self.model.positions == "learned":
                n = max(n, s.longer_than(self.model.max_positions))
            worst = max(worst, n)
        return worst

    def at(self, rate: float) -> dict:
        """The screened summary at ``rate`` requests/s (infinite latencies beyond the capacity)."""
        s = self.stats
        inf = {k: math.inf for k in _STATS}
        summary = {"requests": s.count, "completed": s.count - self.rejected, "rejected": self.rejected,
                   "gpus": sum(self.gpus_by_design.values())}
        if not rate < self.capacity:
            summary.update({m: dict(inf) for m in _METRICS})
            summary["throughput_rps"] = self.capacity
            summary["output_tokens_per_s"] = self.capacity * (s.decode_mean + 1)
            return summary
        summary["throughput_rps"] = rate
        summary["output_tokens_per_s"] = rate * (s.decode_mean + 1)
        front = [e for e in self.engines if e.role != "decode"]
        back = [e for e in self.engines if e.role == "decode"] or front
        states = {}
        for group in (front, back):
            total = sum(e.capacity() * e.engines for e in group)
            for e in group:
                share = e.capacity() * e.engines / total if total > 0 else 0.0
                st = e.state(rate * share / e.engines)
                if st is None:  # below the capacity, a share beyond its engine's: numerical edge
                    summary.update({m: dict(inf) for m in _METRICS})
                    return summary
                states[id(e)] = st
        quantiles = {"p50": 0.5, "p90": 0.9, "p99": 0.99, "mean": None, "max": 1 - 1 / max(s.count, 2)}
        out = {m: {} for m in _METRICS}
        o_med = max(1.0, s.output_at(0.5) - 1.0)
        for stat, x in quantiles.items():
            ttft = max(e.first_token(states[id(e)], x)[0] for e in front)
            queue = max(e.first_token(states[id(e)], x)[1] for e in front)
            tbt = max(e.between_tokens(states[id(e)], x, self.kv) for e in back)
            mean_gap = max(e.between_tokens(states[id(e)], None, self.kv) for e in back)
            steps = s.decode_mean if x is None else max(s.output_at(x) - 1, 0)
            kv = (self.kv.mean() if x is None else self.kv.seconds(s.prompt_at(x))) if self.kv else 0.0
            out["ttft_s"][stat] = ttft
            out["queue_s"][stat] = queue
            out["tbt_s"][stat] = tbt
            out["tpot_s"][stat] = mean_gap if x is None else mean_gap + max(tbt - mean_gap, 0.0) / o_med
            out["e2e_s"][stat] = ttft + kv + steps * mean_gap
        summary.update(out)
        return summary


def screen_deployment(deployment: Deployment, model: TransformerConfig, system: System, cost: CostModel,
                      stats: StreamStats, rate: float) -> ServeScreen:
    """The :class:`ServeScreen` of ``deployment`` serving a stream like ``stats`` at ``rate``
    requests/s (module docstring). A deployment the system cannot hold (too many GPUs, a bad
    parallelism) raises InputError; one whose weights and workspace leave no KV cache is
    screened infeasible."""
    gpus = deployment.gpus
    try:
        scr = DeploymentScreen(deployment, model, system, cost, stats)
    except InputError as err:
        if "no room for a KV cache" not in str(err):
            raise
        return ServeScreen(rate, {}, 0.0, gpus, {}, feasible=False, error=str(err))
    return ServeScreen(rate, scr.at(rate), scr.capacity, gpus, dict(scr.gpus_by_design))


def screen_goodput(screen: DeploymentScreen, constraints: Constraints, tolerance: float = 1e-3) -> float:
    """The highest rate (requests/s) at which ``screen``'s figures meet ``constraints`` (0 when
    none does, or the deployment rejects requests), to a relative ``tolerance``."""
    cap = screen.capacity
    if not cap > 0 or screen.rejected:
        return 0.0
    hi = cap
    lo = cap * 1e-4
    if not constraints.met(screen.at(lo)):
        return 0.0
    if constraints.met(screen.at(hi * (1 - 1e-9))):
        return hi * (1 - 1e-9)
    while hi / lo > 1 + tolerance:
        mid = math.sqrt(lo * hi)
        if constraints.met(screen.at(mid)):
            lo = mid
        else:
            hi = mid
    return lo
