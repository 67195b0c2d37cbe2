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

from collections.abc import Callable, Sequence

import simpy

__all__ = ["FairShareNetwork", "max_min_rates"]

_EPS = 1e-12


def max_min_rates(flow_resources: Sequence[Sequence[int]], capacity: Sequence[float]) -> list[float]:
    """Max-min fair rates (bytes/s) of flows over shared resources, by progressive filling.

    ``flow_resources[i]`` lists the resources flow ``i`` crosses; ``capacity[r]`` is resource
    ``r``'s bandwidth. Each round, the resource offering the smallest equal share to its
    unfixed flows fixes them at that share (ties: lowest resource index)."""
    n = len(flow_resources)
    rates = [0.0] * n
    users: dict[int, list[int]] = {}
    for i, res in enumerate(flow_resources):
        for r in res:
            users.setdefault(r, []).append(i)
    left = {r: float(capacity[r]) for r in users}
    count = {r: len(u) for r, u in users.items()}
    fixed = [False] * n
    todo = n
    while todo:
        best_r = -1
        best_share = float("inf")
        for r, c in count.items():
            if c:
                share = left[r] / c
                if share < best_share or (share == best_share and r < best_r):
                    best_share, best_r = share, r
        if best_r < 0:  # flows with no resources: unbounded
            for i in range(n):
                if not fixed[i]:
                    rates[i] = float("inf")
            break
        share = max(best_share, 0.0)
        for i in users[best_r]:
            if fixed[i]:
                continue
            fixed[i] = True
            rates[i] = share
            todo -= 1
            for r in flow_resources[i]:
                left[r] -= share
                count[r] -= 1
    return rates


class FairShareNetwork:
    """Flows over shared resources; calls ``on_delivered(token)`` when a flow has arrived.

    ``capacity``: bytes/s per resource. With ``record``, every change of a resource's total rate
    is appended to ``timeline`` as ``(time, resource, rate, flows)``."""

    def __init__(self, env: simpy.Environment, capacity: Sequence[float],
                 on_delivered: Callable[[int], None], *, record: bool = False) -> None:
        self.env = env
        self.capacity = [float(c) for c in capacity]
        self.on_delivered = on_delivered
        self.record = record
        self.timeline: list[tuple[float, int, float, int]] = []
        self.busy = [0.0] * len(self.capacity)  # seconds each resource carried at least one flow
        self._flows: dict[int, list] = {}  # token -> [remaining bytes, resources, latency, rate, finish time]
        self._last = 0.0
        self._wakeup = env.event()
        self._timer: simpy.Event | None = None
        self._timer_at = float("inf")
        self._dirty = False
        self._prev_rate: dict[int, tuple[float, int]] = {}
        self.recomputes = 0
        env.process(self._run())

    @property
    def active(self) -> int:
        """Number of flows still serialising."""
        return len(self._flows)

    def start(self, token: int, nbytes: float, resources: Sequence[int], latency: float) -> None:
        """Begin a flow of ``nbytes`` bytes over ``resources``; delivered after serialising + ``latency``."""
        if nbytes <= 0 or not resources:
            self._deliver(token, latency)
            return
        self._advance()
        self._flows[token] = [float(nbytes), tuple(resources), float(latency), 0.0, float("inf")]
        self._dirty = True
        if not self._wakeup.triggered:
            self._wakeup.succeed()

    # ------------------------------------------------------------------ internals
    def _deliver(self, token: int, latency: float) -> None:
        if latency <= 0:
            self.on_delivered(token)
        else:
            ev = self.env.timeout(latency, token)
            ev.callbacks.append(self._delivered_cb)

    def _delivered_cb(self, event: simpy.Event) -> None:
        self.on_delivered(event.value)

    def _advance(self) -> None:
        """Move every flow forward to now at its current rate."""
        now = self.env.now
        dt = now - self._last
        if dt > 0 and self._flows:
            used = set()
            for f in self._flows.values():
                f[0] -= f[3] * dt
                used.update(f[1])
            busy = self.busy
            for r in used:
                busy[r] += dt
        self._last = now

    def _recompute(self) -> None:
        self.recomputes += 1
        flows = list(self._flows.values())
        rates = max_min_rates([f[1] for f in flows], self.capacity)
        now = self.env.now
        for f, rate in zip(flows, rates):
            f[3] = rate
            f[4] = now + f[0] / rate if rate > 0 else float("inf")
        if self.record:
            totals: dict[int, list] = {}
            for f in flows:
                for r in f[1]:
                    t = totals.setdefault(r, [0.0, 0])
                    t[0] += f[3]
                    t[1] += 1
            prev = self._prev_rate
            for r in set(prev) | set(totals):
                cur = tuple(totals.get(r, (0.0, 0)))
                if prev.get(r, (0.0, 0)) != cur:
                    self.timeline.append((now, r, cur[0], cur[1]))
                    if cur[1]:
                        prev[r] = cur  # type: ignore[assignment]
                    else:
                        prev.pop(r, None)

    def _run(self):
        env = self.env
        while True:
            yield self._wakeup
            self._wakeup = env.event()
            self._advance()
            now = env.now
            limit = now + abs(now) * _EPS + 1e-18
            done = [tok for tok, f in self._flows.items() if f[4] <= limit]
            for tok in done:
                f = self._flows.pop(tok)
                self._deliver(tok, f[2])  # may start new flows (sets _dirty)
            if done or self._dirty:
                self._dirty = False
                self._recompute()
                nxt = min((f[4] for f in self._flows.values()), default=float("inf"))
                if nxt < float("inf") and nxt != self._timer_at:
                    self._timer_at = nxt
                    self._timer = env.timeout(max(0.0, nxt - now))
                    self._timer.callbacks.append(self._timer_cb)

    def _timer_cb(self, event: simpy.Event) -> None:
        if event is self._timer:
            self._timer_at = float("inf")
            if not self._wakeup.triggered:
                self._wakeup.succeed()
