"""Links, switches and memory ports as one fluid network with max-min fair sharing.

A transfer is a *flow* over the resources of its route (directional link channels, switch
backplanes, the memories at both ends). While serialising, each flow gets its max-min fair share
of every resource it crosses (progressive filling: the most constrained resource fixes the rate
of its flows, the rest is shared among the others, and so on). Rates are recomputed when flows
start or finish, at most once per simulated timestamp. When a flow has sent all its bytes it is
delivered after its route latency. Units: bytes, bytes/s, seconds.

The network is a SimPy process: it sleeps until the next flow finishes serialising or until a
new flow arrives, whichever is first.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Sequence

import simpy
from simpy.events import PENDING

__all__ = ["FairShareNetwork", "max_min_rates"]

_EPS = 1e-12
_INF = float("inf")


def max_min_rates(flow_resources: Sequence[Sequence[int]], capacity: Sequence[float]) -> list[float]:
    """Max-min fair rates (bytes/s) of flows over shared resources, by progressive filling.

    ``flow_resources[i]`` lists the resources flow ``i`` crosses; ``capacity[r]`` is resource
    ``r``'s bandwidth. Repeatedly, the resource offering the smallest equal share to its unfixed
    flows fixes them at that share (ties: lowest resource index). Shares only grow as flows are
    fixed, so a heap with lazily refreshed entries finds the next bottleneck."""
    n = len(flow_resources)
    users: dict[int, list[int]] = {}
    for i, res in enumerate(flow_resources):
        for r in res:
            u = users.get(r)
            if u is None:
                users[r] = [i]
            else:
                u.append(i)
    left: dict[int, float] = {}
    count: dict[int, int] = {}
    heap = []
    for r, u in users.items():
        c = len(u)
        cap = float(capacity[r])
        left[r] = cap
        count[r] = c
        heap.append((cap / c, r))
    heapq.heapify(heap)
    rates = [-1.0] * n
    todo = n
    while todo and heap:
        share, r = heapq.heappop(heap)
        c = count[r]
        if c == 0:
            continue
        current = left[r] / c
        if current != share:  # stale entry: the share grew since it was pushed
            heapq.heappush(heap, (current, r))
            continue
        if share < 0.0:
            share = 0.0
        for i in users[r]:
            if rates[i] >= 0.0:
                continue
            rates[i] = share
            todo -= 1
            for q in flow_resources[i]:
                left[q] -= share
                count[q] -= 1
    if todo:  # flows that cross no resource are unbounded
        rates = [float("inf") if x < 0 else x for x in rates]
    return rates


def _grouped_rates(groups: Sequence[tuple[Sequence[int], int]], capacity: Sequence[float],
                   weights: Sequence[Sequence[float] | None] | None = None) -> list[float]:
    """Max-min rates for flow *groups*: ``(resources, multiplicity)``; flows with identical routes
    always get identical rates, so each group is filled once, counting ``multiplicity`` flows.
    ``weights[g]`` (optional): per resource of group ``g``, the flows each of its flows stands
    for there (a folded flow, see :mod:`marssim.parallel.fold`)."""
    if weights is not None and any(w for w in weights):
        return _weighted_rates(groups, capacity, weights)
    users: dict[int, list[int]] = {}
    count: dict[int, int] = {}
    for g, (res, mult) in enumerate(groups):
        for r in res:
            u = users.get(r)
            if u is None:
                users[r] = [g]
                count[r] = mult
            else:
                u.append(g)
                count[r] += mult
    left = {r: float(capacity[r]) for r in users}
    heap = [(left[r] / count[r], r) for r in users]
    heapq.heapify(heap)
    rates = [-1.0] * len(groups)
    todo = len(groups)
    while todo and heap:
        share, r = heapq.heappop(heap)
        c = count[r]
        if c == 0:
            continue
        current = left[r] / c
        if current != share:
            heapq.heappush(heap, (current, r))
            continue
        if share < 0.0:
            share = 0.0
        for g in users[r]:
            if rates[g] >= 0.0:
                continue
            rates[g] = share
            todo -= 1
            res, mult = groups[g]
            used = share * mult
            for q in res:
                left[q] -= used
                count[q] -= mult
    return rates


def _weighted_rates(groups, capacity, weights) -> list[float]:
    """:func:`_grouped_rates` with per-resource weights: group ``g`` puts ``mult * w`` flows on a
    resource it crosses with weight ``w``; progressive filling over those counts."""
    users: dict[int, list[tuple[int, float]]] = {}
    count: dict[int, float] = {}
    for g, (res, mult) in enumerate(groups):
        w = weights[g]
        for i, r in enumerate(res):
            n = mult * (w[i] if w else 1.0)
            u = users.get(r)
            if u is None:
                users[r] = [(g, n)]
                count[r] = n
            else:
                u.append((g, n))
                count[r] += n
    left = {r: float(capacity[r]) for r in users}
    heap = [(left[r] / count[r], r) for r in users]
    heapq.heapify(heap)
    rates = [-1.0] * len(groups)
    todo = len(groups)
    while todo and heap:
        share, r = heapq.heappop(heap)
        c = count[r]
        if c <= 1e-12:
            continue
        current = left[r] / c
        if current != share:
            heapq.heappush(heap, (current, r))
            continue
        if share < 0.0:
            share = 0.0
        for g, _ in users[r]:
            if rates[g] >= 0.0:
                continue
            rates[g] = share
            todo -= 1
            res, mult = groups[g]
            w = weights[g]
            for i, q in enumerate(res):
                n = mult * (w[i] if w else 1.0)
                left[q] -= share * n
                count[q] -= n
    return rates


class FairShareNetwork:
    """Flows over shared resources; calls ``on_delivered(token)`` when a flow has arrived.

    ``capacity``: bytes/s per resource. Each flow names its route by a hashable ``route`` key
    (flows with the same key cross the same resources); ``routes[i]`` pre-registers the resources
    of the integer key ``i`` for :meth:`add_flow`. Rates depend only on the multiset of active
    routes, so they are memoised by it. With ``record``, every change of a resource's total rate
    is appended to ``timeline`` as ``(time, resource, rate, flows)``.

    ``on_delivered_event`` (settable after construction), if not None, is called instead of
    ``on_delivered`` for flows delivered after a latency, with the SimPy timeout whose ``value``
    is the token (one call less per flow for callers that can take the event)."""

    _CACHE_LIMIT = 200_000

    def __init__(self, env: simpy.Environment, capacity: Sequence[float],
                 on_delivered: Callable[[int], None], *, record: bool = False,
                 routes: Sequence[Sequence[int]] = (),
                 on_delivered_event: Callable[[simpy.Event], None] | None = None,
                 weights: Sequence[Sequence[float]] = ()) -> None:
        self.env = env
        self.capacity = [float(c) for c in capacity]
        self.on_delivered = on_delivered
        self.record = record
        self.timeline: list[tuple[float, int, float, int]] = []
        self.busy = [0.0] * len(self.capacity)  # seconds each resource carried at least one flow
        self._flows: dict[int, list] = {}  # token -> [remaining bytes, route key, latency, rate, finish time]
        self._routes: dict[object, tuple[int, ...]] = {i: tuple(r) for i, r in enumerate(routes)}
        self._weights: dict[object, tuple[float, ...]] = {i: tuple(w) for i, w in enumerate(weights) if w}
        self._mult: dict[object, int] = {}  # route key -> active flows on it
        self._odd_routes = 0  # registered route keys that are not ints (then sorted by _route_order)
        self._cache: dict[frozenset, tuple[dict, tuple[int, ...]]] = {}
        self._used: tuple[int, ...] = ()
        self._last = 0.0  # time (s) up to which the flows' remaining bytes are counted
        self._wakeup = env.event()
        self._timer: simpy.Event | None = None
        self._timer_at = float("inf")
        self._dirty = False
        self._prev_rate: dict[int, tuple[float, int]] = {}
        self._delivered_cb: Callable[[simpy.Event], None] = self._token_delivered
        self.on_delivered_event = on_delivered_event
        self.recomputes = 0
        self.cache_hits = 0
        self._process = self._run()
        env.process(self._process)

    @property
    def on_delivered_event(self) -> Callable[[simpy.Event], None] | None:
        """Callback taking the delivery timeout itself (None: ``on_delivered(token)`` is used)."""
        return None if self._delivered_cb == self._token_delivered else self._delivered_cb

    @on_delivered_event.setter
    def on_delivered_event(self, callback: Callable[[simpy.Event], None] | None) -> None:
        self._delivered_cb = self._token_delivered if callback is None else callback

    def close(self) -> None:
        """Stop the network process and drop the delivery callbacks (the run is over): this
        breaks the reference cycles through them, so that the network and its caller are freed
        by reference counting instead of waiting for the cyclic garbage collector."""
        self._process.close()
        self.on_delivered = _undeliverable
        self._delivered_cb = _undeliverable

    @property
    def active(self) -> int:
        """Number of flows still serialising."""
        return len(self._flows)

    def start(self, token: int, nbytes: float, resources: Sequence[int], latency: float,
              route: object = None) -> None:
        """Begin a flow of ``nbytes`` bytes over ``resources``; delivered after serialising +
        ``latency`` seconds. ``route`` (default: the resources tuple) keys the rate memo."""
        if nbytes <= 0 or not resources:
            self._deliver(token, latency)
            return
        key = tuple(resources) if route is None else route
        if key not in self._routes:
            self._routes[key] = tuple(resources)
            if type(key) is not int:
                self._odd_routes += 1
        self.add_flow(token, float(nbytes), key, float(latency))

    def add_flow(self, token: int, nbytes: float, route: object, latency: float) -> None:
        """Begin a flow of ``nbytes`` > 0 bytes (float) on the registered ``route``, delivered
        ``latency`` seconds (float) after it has been serialised.

        Flows already running are advanced lazily, when the network process wakes at this same
        instant: the new flow's rate is 0 until then, so advancing it changes nothing."""
        self._flows[token] = [nbytes, route, latency, 0.0, _INF]
        mult = self._mult
        mult[route] = mult.get(route, 0) + 1
        self._dirty = True
        wakeup = self._wakeup
        if wakeup._value is PENDING:
            wakeup.succeed()

    # ------------------------------------------------------------------ internals
    def _deliver(self, token: int, latency: float) -> None:
        if latency <= 0:
            self.on_delivered(token)
        else:
            self.env.timeout(latency, token).callbacks.append(self._delivered_cb)

    def _token_delivered(self, event: simpy.Event) -> None:
        self.on_delivered(event._value)

    def _advance(self, now: float, limit: float) -> list[int]:
        """Move every flow forward to ``now`` (s) at its current rate; return the tokens of the
        flows whose finish time is at or before ``limit`` (s), in start order."""
        flows = self._flows
        dt = now - self._last
        self._last = now
        if dt > 0 and flows:
            done = []
            for token, f in flows.items():
                f[0] -= f[3] * dt
                if f[4] <= limit:
                    done.append(token)
            busy = self.busy
            for r in self._used:
                busy[r] += dt
            return done
        return [token for token, f in flows.items() if f[4] <= limit]

    def _deliver_done(self, done: list[int]) -> None:
        """Remove the flows ``done`` (tokens, in start order), which have sent their bytes, and
        deliver each after its latency."""
        flows, mult = self._flows, self._mult
        timeout = self.env.timeout
        delivered_cb = self._delivered_cb
        for token in done:
            f = flows.pop(token)
            key = f[1]
            left = mult[key] - 1
            if left:
                mult[key] = left
            else:
                del mult[key]
            latency = f[2]
            if latency <= 0:
                self.on_delivered(token)  # may start new flows (sets _dirty)
            else:
                timeout(latency, token).callbacks.append(delivered_cb)

    def _rates(self) -> tuple[dict, tuple[int, ...]]:
        """Rate (bytes/s) of each active route and the resources in use, memoised by the
        multiset of active routes (a frozenset of ``(route, flows)``: no sorting on a hit)."""
        self.recomputes += 1
        mult = self._mult
        key = frozenset(mult.items())
        entry = self._cache.get(key)
        if entry is not None:
            self.cache_hits += 1
            return entry
        order = sorted(mult.items(), key=_route_order) if self._odd_routes else sorted(mult.items())
        routes = self._routes
        weights = self._weights
        rates = _grouped_rates([(routes[k], m) for k, m in order], self.capacity,
                               [weights.get(k) for k, _ in order] if weights else None)
        used: set[int] = set()
        for k in mult:
            used.update(routes[k])
        entry = ({k: rate for (k, _), rate in zip(order, rates)}, tuple(used))
        if len(self._cache) >= self._CACHE_LIMIT:
            self._cache.clear()
        self._cache[key] = entry
        return entry

    def _recompute(self, now: float) -> float:
        """Give every flow its max-min rate from ``now`` (s); return the earliest finish time."""
        by_route, self._used = self._rates()
        nxt = _INF
        for f in self._flows.values():
            rate = by_route[f[1]]
            f[3] = rate
            if rate > 0:
                finish = f[4] = now + f[0] / rate
                if finish < nxt:
                    nxt = finish
            else:
                f[4] = _INF
        if self.record:
            self._record(now, by_route)
        return nxt

    def _record(self, now: float, by_route: dict) -> None:
        """Append the resources whose total rate or flow count changed to ``timeline``."""
        mult: dict[object, int] = {}
        for f in self._flows.values():  # routes in the order of their first active flow
            k = f[1]
            mult[k] = mult.get(k, 0) + 1
        totals: dict[int, list] = {}
        for k, m in mult.items():
            rate = by_route[k]
            w = self._weights.get(k)
            for i, r in enumerate(self._routes[k]):
                n = m * w[i] if w else m
                t = totals.setdefault(r, [0.0, 0])
                t[0] += rate * n
                t[1] += n
        prev = self._prev_rate
        for r in sorted(set(prev) | set(totals)):
            cur = tuple(totals.get(r, (0.0, 0)))
            if prev.get(r, (0.0, 0)) != cur:
                self.timeline.append((now, r, cur[0], cur[1]))
                if cur[1]:
                    prev[r] = cur  # type: ignore[assignment]
                else:
                    prev.pop(r, None)

    def _run(self):
        env = self.env
        timeout = env.timeout
        event = env.event
        inf = float("inf")
        while True:
            yield self._wakeup
            self._wakeup = event()
            now = env._now
            done = self._advance(now, now + abs(now) * _EPS + 1e-18)
            if done:
                self._deliver_done(done)
            elif not self._dirty:
                continue
            self._dirty = False
            nxt = self._recompute(now)
            if nxt < inf and nxt != self._timer_at:
                self._timer_at = nxt
                self._timer = timeout(max(0.0, nxt - now))
                self._timer.callbacks.append(self._timer_cb)

    def _timer_cb(self, event: simpy.Event) -> None:
        if event is self._timer:
            self._timer_at = float("inf")
            if not self._wakeup.triggered:
                self._wakeup.succeed()


def _undeliverable(_: object) -> None:
    raise RuntimeError("the network is closed")


def _route_order(item: tuple) -> tuple:
    key = item[0]
    return (0, key, ()) if isinstance(key, int) else (1, 0, key)
