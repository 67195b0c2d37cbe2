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
from dataclasses import dataclass

import simpy
from simpy.events import PENDING

__all__ = ["FairShareNetwork", "Flow", "max_min_rates", "progressive_filling"]

_EPS = 1e-12
_INF = float("inf")


@dataclass(slots=True, eq=False)
class Flow:
    """One flow serialising on the network: ``left`` bytes still to send at time ``t0`` (s), sent
    at ``rate`` (bytes/s) since; its registered route key, its ``latency`` (s) after the last byte,
    the time it ``finish``-es serialising at this rate (inf while it has none); ``version`` counts
    its rate changes (a heap entry of an older version is stale), ``seq`` orders it among flows."""

    left: float
    t0: float
    rate: float
    route: object
    latency: float
    finish: float
    version: int
    seq: int


def max_min_rates(flow_resources: Sequence[Sequence[int]], capacity: Sequence[float]) -> list[float]:
    """Max-min fair rates (bytes/s) of flows over shared resources, by progressive filling.

    ``flow_resources[i]`` lists the resources flow ``i`` crosses; ``capacity[r]`` is resource
    ``r``'s bandwidth; a flow that crosses no resource is unbounded (``inf``). See
    :func:`progressive_filling`."""
    return progressive_filling([(res, 1) for res in flow_resources], capacity)


def progressive_filling(groups: Sequence[tuple[Sequence[int], int]], capacity: Sequence[float],
                        weights: Sequence[Sequence[float] | None] | None = None) -> list[float]:
    """Max-min fair rates (bytes/s) of flow *groups* ``(resources, multiplicity)``: flows with
    identical routes always get identical rates, so each group is filled once, counting
    ``multiplicity`` flows. ``weights[g]`` (optional): per resource of group ``g``, the flows each
    of its flows stands for there (a folded flow, see :mod:`marssim.parallel.fold`), so that it
    puts ``multiplicity x weight`` flows on that resource.

    Repeatedly, the resource offering the smallest equal share to its unfixed flows fixes them at
    that share (ties: lowest resource index). Shares only grow as flows are fixed, so a heap with
    lazily refreshed entries finds the next bottleneck. A group that crosses no resource is
    unbounded (``inf``). The compiled twin is ``marssim.sim._fast_kernels``' ``_rates``."""
    weighted = weights is not None and any(w for w in weights)
    users: dict[int, list[tuple[int, float]]] = {}
    count: dict[int, float] = {}
    for g, (res, mult) in enumerate(groups):
        w = weights[g] if weighted else None
        for i, r in enumerate(res):
            n = mult * w[i] if w else mult
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
        if c <= 1e-12:  # every flow here is fixed (counts of unweighted flows are exact integers)
            continue
        current = left[r] / c
        if current != share:  # stale entry: the share grew since it was pushed
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
            w = weights[g] if weighted else None
            for i, q in enumerate(res):
                n = mult * w[i] if w else mult
                left[q] -= share * n
                count[q] -= n
    if todo:  # groups that cross no resource are unbounded
        rates = [_INF if x < 0 else x for x in rates]
    return rates


class FairShareNetwork:
    """Flows over shared resources; calls ``on_delivered(token)`` when a flow has arrived.

    ``capacity``: bytes/s per resource. Each flow names its route by a hashable ``route`` key
    (flows with the same key cross the same resources); ``routes[i]`` pre-registers the resources
    of the integer key ``i`` for :meth:`add_flow` (``weights[i]``, optional: the flows each of
    its flows stands for on each resource, see :mod:`marssim.parallel.fold`). With ``record``,
    every change of a resource's total rate is appended to ``timeline`` as ``(time, resource,
    rate, flows)``.

    Max-min fair rates decompose over the connected components of the graph of active routes
    and the resources they share: when flows start or end, only the components they touch are
    recomputed (memoised by the multiset of their routes), and only the flows whose rate changes
    are touched. A flow's state is its bytes left at the time of its last rate change; its
    finish time sits in a heap, tagged with the flow's start sequence number and rate version (a
    token may start a new flow later, e.g. the next step of a transfer: an entry of its earlier
    flow is stale). So an event costs in proportion to the component it changes,
    not to every flow in the network.

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
        self._flows: dict[int, Flow] = {}  # token -> its flow
        self._routes: dict[object, tuple[int, ...]] = {i: tuple(r) for i, r in enumerate(routes)}
        self._weights: dict[object, tuple[float, ...]] = {i: tuple(w) for i, w in enumerate(weights) if w}
        self._mult: dict[object, int] = {}  # route key -> active flows on it
        self._route_flows: dict[object, dict[int, None]] = {}  # route key -> its active flows, in start order
        self._res_routes: dict[int, dict[object, None]] = {}  # resource -> active route keys
        self._busy_since: dict[int, float] = {}
        self._odd_routes = 0  # registered route keys that are not ints (then sorted by _route_order)
        self._cache: dict[frozenset, dict] = {}
        self._heap: list[tuple[float, int, int, int]] = []  # (finish, sequence, token, version)
        self._seq = 0
        self._dirty: dict[int, None] = {}  # resources whose routes changed since the last recompute
        self._bound: dict[object, dict[int, tuple[float, float]]] = {}
        self._changed: dict[int, None] = {}  # the resources the last recompute started from
        self._wakeup = env.event()
        self._timer: simpy.Event | None = None
        self._timer_at = float("inf")
        self._prev_rate: dict[int, tuple[float, float]] = {}
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
        ``latency`` seconds (float) after it has been serialised. Its rate is 0 until the
        network process recomputes the rates at this same instant."""
        now = self.env._now
        self._seq += 1
        self._flows[token] = Flow(nbytes, now, 0.0, route, latency, _INF, 0, self._seq)
        mult = self._mult
        m = mult.get(route, 0)
        mult[route] = m + 1
        if m:
            self._route_flows[route][token] = None
        else:
            self._route_flows[route] = {token: None}
            res_routes = self._res_routes
            for r in self._routes[route]:
                rr = res_routes.get(r)
                if rr is None:
                    res_routes[r] = {route: None}
                    self._busy_since[r] = now
                else:
                    rr[route] = None
        dirty = self._dirty
        for r in self._routes[route]:
            dirty[r] = None
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

    def _finished(self, limit: float) -> list[int]:
        """Tokens of the flows whose finish time is at or before ``limit`` (s), in start order."""
        heap, flows = self._heap, self._flows
        out = []
        while heap and heap[0][0] <= limit:
            _, seq, token, version = heapq.heappop(heap)
            f = flows.get(token)
            if f is not None and f.version == version and f.seq == seq:
                out.append((seq, token))
        out.sort()
        return [token for _, token in out]

    def _remove(self, token: int, now: float) -> Flow:
        """Take a finished flow out of the network; returns its state."""
        f = self._flows.pop(token)
        key = f.route
        left = self._mult[key] - 1
        dirty = self._dirty
        for r in self._routes[key]:
            dirty[r] = None
        if left:
            self._mult[key] = left
            del self._route_flows[key][token]
        else:
            del self._mult[key]
            del self._route_flows[key]
            res_routes, busy, since = self._res_routes, self.busy, self._busy_since
            for r in self._routes[key]:
                rr = res_routes.get(r)
                if rr is None:
                    continue
                rr.pop(key, None)
                if not rr:
                    del res_routes[r]
                    busy[r] += now - since.pop(r)
        return f

    def _bounds(self, key: object) -> dict[int, tuple[float, float]]:
        """Per resource ``r`` of a route: ``(flows each of its flows puts on r, the most bytes/s
        the flow can get from the route's other resources)``."""
        b = self._bound.get(key)
        if b is None:
            res = self._routes[key]
            w = self._weights.get(key) or (1.0,) * len(res)
            caps = [self.capacity[r] / w[i] for i, r in enumerate(res)]
            b = self._bound[key] = {r: (w[i], min((c for j, c in enumerate(caps) if j != i), default=_INF))
                                    for i, r in enumerate(res)}
        return b

    def _binding(self, r: int) -> bool:
        """Whether resource ``r`` could limit a flow: the flows on it, each at the most its other
        resources allow, would need more than its capacity. A resource that cannot bind does not
        couple the rates of the flows that cross it (they are max-min fair without it)."""
        load = 0.0
        mult = self._mult
        for key in self._res_routes.get(r, ()):
            w, bound = self._bounds(key)[r]
            load += mult[key] * w * bound
            if load > self.capacity[r]:
                return True
        return False

    def _component(self) -> list:
        """The active routes whose rates the changes since the last recompute may alter: the
        routes on the changed resources and those connected to them through resources that can
        bind (see :meth:`_binding`)."""
        res_routes, routes = self._res_routes, self._routes
        found: dict[object, None] = {}
        stack = []
        dirty = self._dirty
        self._dirty = {}
        self._changed = dirty
        for r in dirty:
            for key in res_routes.get(r, ()):
                if key not in found:
                    found[key] = None
                    stack.append(key)
        seen: set[int] = set(dirty)
        binding = self._binding
        while stack:
            key = stack.pop()
            for q in routes[key]:
                if q in seen:
                    continue
                seen.add(q)
                if not binding(q):
                    continue
                for other in res_routes[q]:
                    if other not in found:
                        found[other] = None
                        stack.append(other)
        return list(found)

    def _rates(self, keys: list) -> dict:
        """Rate (bytes/s) of each route of one set of components, memoised by the multiset of
        their routes."""
        self.recomputes += 1
        mult = self._mult
        items = [(k, mult[k]) for k in keys]
        memo_key = frozenset(items)
        entry = self._cache.get(memo_key)
        if entry is not None:
            self.cache_hits += 1
            return entry
        order = sorted(items, key=_route_order) if self._odd_routes else sorted(items)
        routes, weights = self._routes, self._weights
        rates = progressive_filling([(routes[k], m) for k, m in order], self.capacity,
                                    [weights.get(k) for k, _ in order] if weights else None)
        entry = {k: rate for (k, _), rate in zip(order, rates)}
        if len(self._cache) >= self._CACHE_LIMIT:
            self._cache.clear()
        self._cache[memo_key] = entry
        return entry

    def _recompute(self, now: float) -> None:
        """New rates for the components that changed; flows whose rate changes get their bytes
        left counted up to ``now`` (s) and a new finish time."""
        keys = self._component()
        if not keys:
            if self.record:
                self._record(now, keys, {})
            return
        by_route = self._rates(keys)
        flows, route_flows, heap = self._flows, self._route_flows, self._heap
        push = heapq.heappush
        for key in keys:
            rate = by_route[key]
            for token in route_flows[key]:
                f = flows[token]
                old = f.rate
                if old == rate and f.finish != _INF:
                    continue
                if old:
                    f.left -= old * (now - f.t0)
                f.t0 = now
                f.rate = rate
                f.version += 1
                if rate > 0:
                    finish = f.finish = now + f.left / rate
                    push(heap, (finish, f.seq, token, f.version))
                else:
                    f.finish = _INF
        if self.record:
            self._record(now, keys, by_route)

    def _record(self, now: float, keys: list, by_route: dict) -> None:
        """Append the resources of the recomputed components whose total rate or flow count
        changed to ``timeline``."""
        totals: dict[int, list] = {}
        touched = set(self._changed)
        for k in keys:
            touched.update(self._routes[k])
        flows, route_flows = self._flows, self._route_flows
        for r in touched:  # every active route on the resource, in or out of the recomputed components
            for k in self._res_routes.get(r, ()):
                m = self._mult[k]
                rate = by_route[k] if k in by_route else flows[next(iter(route_flows[k]))].rate
                w = self._weights.get(k)
                n = m * w[self._routes[k].index(r)] if w else m
                t = totals.setdefault(r, [0.0, 0])
                t[0] += rate * n
                t[1] += n
        prev = self._prev_rate
        for r in sorted(touched):
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
        heap = self._heap
        flows = self._flows
        while True:
            yield self._wakeup
            self._wakeup = event()
            now = env._now
            done = self._finished(now + abs(now) * _EPS + 1e-18)
            if done:
                delivered_cb = self._delivered_cb
                for token in done:
                    f = self._remove(token, now)
                    latency = f.latency
                    if latency <= 0:
                        self.on_delivered(token)  # may start new flows
                    else:
                        timeout(latency, token).callbacks.append(delivered_cb)
            if self._dirty:
                self._recompute(now)
            while heap:
                top = heap[0]
                f = flows.get(top[2])
                if f is not None and f.version == top[3] and f.seq == top[1]:
                    break
                heapq.heappop(heap)
            nxt = heap[0][0] if heap else _INF
            if nxt < _INF and nxt != self._timer_at:
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
