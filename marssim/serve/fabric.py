"""The network of a serving simulation: every transfer between GPUs (activations between
pipeline stages, KV caches from prefill to decode replicas, sampled tokens back to the first
stage, KV blocks swapped to and from host memory) is a flow of the simulator's max-min fair
network (:class:`marssim.sim.network.FairShareNetwork`) over the system's routes, so transfers
that share a link, a switch backplane or a memory port share its bandwidth.

A flow alone takes its route's latency plus its bytes over the route's tightest bandwidth, the
time :func:`marssim.parallel.analytic.serving_times` gives a pipeline transfer. Units: bytes, s.
"""

from __future__ import annotations

from array import array

import simpy

from marssim.sim.network import FairShareNetwork
from marssim.system import System

__all__ = ["Fabric", "TRANSFER_KINDS"]

TRANSFER_KINDS = ("pipeline", "token", "kv", "swap_out", "swap_in", "tp")
"""What a transfer carries (the ``kind`` column of the transfer log)."""


class Fabric:
    """Transfers over ``system``'s routes in the SimPy environment ``env``; the transfers of the
    kinds in ``log`` keep their kind, request, source, destination, bytes, start and end (True:
    every kind)."""

    def __init__(self, env: simpy.Environment, system: System, *, log: bool | tuple[str, ...] = ("kv", "swap_out",
                                                                                                 "swap_in")) -> None:
        self.env = env
        self.system = system
        self._events: dict[int, simpy.Event] = {}
        self._next = 0
        self._route_key: dict[tuple[str, str], int] = {}
        self._routes: list[tuple[tuple[int, ...], float]] = []
        self.net = FairShareNetwork(env, system.resource_capacity, self._delivered)
        self._logged = set(range(len(TRANSFER_KINDS))) if log is True else \
            {TRANSFER_KINDS.index(k) for k in (log or ())}
        self.rows: dict[str, array] = {k: array("d") for k in ("kind", "request", "src", "dst", "bytes", "start",
                                                              "end")}
        self._open: dict[int, tuple] = {}
        self.bytes_moved = 0.0

    def _route(self, src: str, dst: str) -> int:
        key = self._route_key.get((src, dst))
        if key is None:
            route = self.system.route(src, dst)
            key = self._route_key[(src, dst)] = len(self._routes)
            self._routes.append((route.resources, route.latency))
        return key

    def transfer(self, src: str, dst: str, nbytes: float, kind: str = "pipeline", request: int = -1) -> simpy.Event:
        """An event that succeeds when ``nbytes`` from ``src`` have arrived at ``dst``."""
        token = self._next
        self._next += 1
        event = self.env.event()
        self._events[token] = event
        key = self._route(src, dst)
        resources, latency = self._routes[key]
        self.bytes_moved += nbytes
        k = TRANSFER_KINDS.index(kind)
        if k in self._logged:
            self._open[token] = (k, request, self.system.node_index[src], self.system.node_index[dst], nbytes,
                                 self.env.now)
        self.net.start(token, nbytes, resources, latency, route=key)
        return event

    def transfers(self, flows: list[tuple[str, str, float]], kind: str, request: int = -1) -> simpy.Event:
        """An event that succeeds when every ``(src, dst, bytes)`` flow has arrived."""
        events = [self.transfer(s, d, b, kind, request) for s, d, b in flows]
        if len(events) == 1:
            return events[0]
        return simpy.AllOf(self.env, events)

    def _delivered(self, token: int) -> None:
        event = self._events.pop(token)
        opened = self._open.pop(token, None)
        if opened is not None:
            k, r, s, d, b, t0 = opened
            rows = self.rows
            for name, value in (("kind", k), ("request", r), ("src", s), ("dst", d), ("bytes", b), ("start", t0),
                                ("end", self.env.now)):
                rows[name].append(value)
        event.succeed()

    def close(self) -> None:
        self.net.close()
