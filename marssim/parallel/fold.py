"""Simulating one GPU for each class of identical GPUs, exactly.

In a data-, tensor- and pipeline-parallel run, the tensor-parallel ranks of a group and the
data-parallel replicas do the same work at the same times: on a symmetric cluster their
schedules are identical. :func:`fold` finds classes of GPUs that are interchangeable for a given
set of communication *patterns* (each a map from a GPU to the peer it sends to, e.g. "the next
tensor-parallel rank") and lets the lowering emit tasks for one representative per class:

* a class starts as the GPUs with the same role (pipeline stage, design, memory) and is split
  until it is *equitable*: every member's peers under every pattern (and the GPUs whose peer it
  is) fall in the same classes, and every member's route to its peer crosses the same number of
  resources of each resource class with the same latency, where two resources are in one class
  when the members of every (class, pattern) put the same number of flows on each and their
  capacities are equal;
* a representative's flow then stands for one flow per member of its class: on each resource of
  class ``R`` it crosses ``h`` times, it puts ``h * |class| / |R|`` flows (a route *weight*), the
  load every resource of ``R`` carries from that class. Max-min fair rates of the folded network
  are the rates of the full one: the full allocation assigns equal rates to the flows of a class
  (the progressive-filling steps treat the resources of a class alike), so it satisfies the
  bottleneck condition of the folded network and vice versa, and that allocation is unique.

Two facts of the network let classes survive a partly filled scalable unit (its GPUs reach the
spine over smaller uplinks, and some data-parallel or pipeline neighbours sit across the spine):

* the links no flow's rate can depend on (:attr:`marssim.system.System.dominated_links`: a
  non-blocking fat tree's leaf uplinks and downlinks) are left out of every route, folded or not,
  so a route across the spine and one inside a leaf cross the same kinds of resources;
* the transfers of a communication pattern (one NCCL communicator's ring or pipeline neighbours)
  take, each, the largest route latency among the pattern's hops (:func:`latency_floors`): a ring
  proceeds at the pace of its slowest hop in any case (the cycle time of ``start(k+1) =
  max(end_i(k), end_{i-1}(k))`` is the largest step time), so a hop inside a leaf waits like one
  across the spine; a collective's step takes its plan's per-step latency where that is larger,
  as before.

With ``fold=False`` every GPU is its own class (the full simulation, on the same routes), which the
tests compare with the folded one.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

from marssim.system import Route, System

from .memo import OwnerMemo

__all__ = ["Folding", "fold", "identity_folding", "latency_floors", "binding_route"]

BINDING = OwnerMemo(default_size=1 << 16)
"""Per system (while it lives), :func:`binding_route`'s routes by (source, destination)."""

Peer = Callable[[int], int | None]
"""A pattern: the GPU (node index) a GPU sends to, or None."""


@dataclass
class Folding:
    """Classes of interchangeable GPUs (node indices) and the folded routes between them."""

    class_of: dict[int, int]  # GPU node index -> class id
    members: list[list[int]]  # per class, its GPUs (node indices, ascending)
    system: System
    resource_class: list[int] = field(default_factory=list)  # resource index -> class id
    resource_members: list[list[int]] = field(default_factory=list)
    floors: dict[tuple[str, int, int], float] = field(default_factory=dict)  # see latency_floors
    _routes: dict[tuple, Route] = field(default_factory=dict)

    @property
    def reps(self) -> list[int]:
        """The representative (first GPU) of every class."""
        return [m[0] for m in self.members]

    def rep(self, gpu: int) -> int:
        """The representative of ``gpu``'s class."""
        return self.members[self.class_of[gpu]][0]

    def size(self, gpu: int) -> int:
        return len(self.members[self.class_of[gpu]])

    def latency(self, src: int, dst: int, pattern: str | None = None) -> float:
        """Seconds a transfer ``src`` -> ``dst`` of communication pattern ``pattern`` waits before
        its bytes flow: the pattern's largest route latency (:func:`latency_floors`), the route's
        own for a direct transfer or one of no pattern."""
        hit = self.floors.get((pattern, src, dst))
        if hit is not None:
            return hit
        names = self.system.nodes
        return self.system.route(names[src], names[dst]).latency

    @property
    def folded(self) -> bool:
        return any(len(m) > 1 for m in self.members)

    def route(self, src: int, dst: int, per: int | None = None, pattern: str | None = None) -> Route:
        """The route of the flow ``src`` -> ``dst`` standing for one flow per member of the class
        of ``per`` (default ``src``: a send of every member; ``dst`` for a transfer every member
        of the receiver's class pulls): the concrete route with each resource replaced by its
        class's representative and weighted by the flows it stands for, and the latency its
        pattern's transfers wait (:meth:`latency`)."""
        per = src if per is None else per
        key = (src, dst, per, pattern)
        hit = self._routes.get(key)
        if hit is not None:
            return hit
        names = self.system.nodes
        concrete = binding_route(self.system, names[src], names[dst])
        latency = self.latency(src, dst, pattern)
        if not self.folded:
            route = concrete if latency == concrete.latency else replace(concrete, latency=latency)
            self._routes[key] = route
            return route
        n_flows = self.size(per)
        hops = Counter(self.resource_class[r] for r in concrete.resources)
        resources, weights = [], []
        for cls, count in sorted(hops.items(), key=lambda kv: self.resource_members[kv[0]][0]):
            resources.append(self.resource_members[cls][0])
            weights.append(count * n_flows / len(self.resource_members[cls]))
        route = Route(concrete.nodes, tuple(resources), latency, tuple(weights))
        self._routes[key] = route
        return route


def binding_route(system: System, src: str, dst: str) -> Route:
    """``system.route(src, dst)`` without the links no rate can depend on
    (:attr:`~marssim.system.System.dominated_links`)."""
    def make() -> Route:
        dominated = system.dominated_links
        route = system.route(src, dst)
        if dominated and not dominated.isdisjoint(route.resources):
            return Route(route.nodes, tuple(r for r in route.resources if r not in dominated), route.latency,
                         route.weights)
        return route

    return BINDING.get_or_make(system, ("binding", src, dst), make)


def _pattern_sends(gpus: Sequence[int], patterns: dict[str, Peer], pulls: Sequence[str]):
    """``(pattern, the GPU the flow is counted for, src, dst)`` of every pattern's flow."""
    for pname, peer in sorted(patterns.items()):
        pull = pname in pulls
        for g in gpus:
            p = peer(g)
            if p is None or p == g:
                continue
            yield (pname, g) + ((p, g) if pull else (g, p))


def latency_floors(system: System, sends, direct: Sequence[str] = (),
                   routes: dict[tuple[int, int], Route] | None = None) -> dict[tuple[str, int, int], float]:
    """(pattern, src, dst) -> the latency (s) a transfer of that pattern waits: the largest route
    latency among the pattern's hops (``sends``: :func:`_pattern_sends`' tuples). Every member of
    a pattern then waits alike, wherever the scalable units cut its rings. The patterns named in
    ``direct`` (an all-to-all's partners, each pair on its own) are left out: their transfers
    wait their own route's latency. ``routes``: each hop's route (:func:`binding_route`, whose
    latency is the route's) where the caller has them."""
    names = system.nodes
    worst: dict[str, float] = {}
    hops: list[tuple[str, int, int]] = []
    for pname, _, src, dst in sends:
        if pname in direct:
            continue
        lat = (routes[(src, dst)] if routes is not None else system.route(names[src], names[dst])).latency
        if lat > worst.get(pname, -1.0):
            worst[pname] = lat
        hops.append((pname, src, dst))
    return {hop: worst[hop[0]] for hop in hops}


def identity_folding(system: System, gpus: Sequence[int], patterns: dict[str, Peer] | None = None,
                     pulls: Sequence[str] = (), direct: Sequence[str] = ()) -> Folding:
    """Every GPU its own class (no folding); with ``patterns``, its transfers wait as the folded
    lowering's do (:func:`latency_floors`), so the two simulate the same network."""
    gpus = sorted(gpus)
    floors = latency_floors(system, list(_pattern_sends(gpus, patterns, pulls)), direct) if patterns else {}
    return Folding({g: i for i, g in enumerate(gpus)}, [[g] for g in gpus], system, floors=floors)


def fold(system: System, gpus: Sequence[int], role: dict[int, object], patterns: dict[str, Peer],
         max_rounds: int = 64, pulls: Sequence[str] = (), direct: Sequence[str] = ()) -> Folding:
    """The coarsest equitable classes of ``gpus`` that refine ``role`` (see the module
    docstring). ``patterns``: name -> peer map (node index -> node index or None): GPU ``g``
    sends one flow to ``peer(g)``, or, for the names in ``pulls``, receives one flow from it."""
    gpus = sorted(gpus)
    names = system.nodes
    routes: dict[tuple[int, int], Route] = {}
    sends = list(_pattern_sends(gpus, patterns, pulls))  # (pattern, the GPU the flow is counted for, src, dst)
    inverse: dict[str, dict[int, list[int]]] = {name: {} for name in patterns}
    for pname, g, src, dst in sends:
        inverse[pname].setdefault(dst if pname not in pulls else src, []).append(g)
        if (src, dst) not in routes:
            routes[(src, dst)] = binding_route(system, names[src], names[dst])
    floors = latency_floors(system, sends, direct, routes)
    capacity = system.resource_capacity
    first = {}
    cls = {}
    for g in gpus:
        key = repr(role[g])
        cls[g] = first.setdefault(key, len(first))
    res_class: list[int] = []
    send_res = [routes[(src, dst)].resources for _, _, src, dst in sends]
    for _ in range(max_rounds):
        # resource classes: the flows each (GPU class, pattern) puts on them, and their capacity
        load: dict[int, dict] = {}
        for (pname, g, _, _), resources in zip(sends, send_res):
            tag = (cls[g], pname)
            for r in resources:
                c = load.get(r)
                if c is None:
                    c = load[r] = {}
                c[tag] = c.get(tag, 0) + 1
        signature_of_res: dict[tuple, int] = {}
        res_class = []
        for r in range(len(capacity)):
            sig = (float(capacity[r]), tuple(sorted(load.get(r, {}).items())))
            res_class.append(signature_of_res.setdefault(sig, len(signature_of_res)))
        # GPU signatures: class, peers' classes both ways, route shapes
        sig_of: dict[int, list] = {g: [cls[g]] for g in gpus}
        for pname, peer in sorted(patterns.items()):
            inv = inverse[pname]
            pull = pname in pulls
            for g in gpus:
                p = peer(g)
                if p is None or p == g:
                    sig_of[g].append((pname, None))
                else:
                    route = routes[(p, g) if pull else (g, p)]
                    # the multiset of its resources' classes (as a sorted tuple)
                    shape = tuple(sorted([res_class[r] for r in route.resources]))
                    hop = (pname, p, g) if pull else (pname, g, p)
                    sig_of[g].append((pname, cls[p], shape, floors.get(hop, route.latency)))
                q = inv.get(g, ())
                sig_of[g].append((pname, "from", tuple(sorted([cls[x] for x in q]))))
        new: dict[int, int] = {}
        index: dict[tuple, int] = {}
        for g in gpus:
            new[g] = index.setdefault(tuple(map(repr, sig_of[g])), len(index))
        if len(index) == len(set(cls.values())):
            cls = new
            break
        cls = new
    members: dict[int, list[int]] = {}
    for g in gpus:
        members.setdefault(cls[g], []).append(g)
    ordered = sorted(members.values(), key=lambda m: m[0])
    class_of = {g: i for i, m in enumerate(ordered) for g in m}
    res_members: dict[int, list[int]] = {}
    for r, c in enumerate(res_class):
        res_members.setdefault(c, []).append(r)
    return Folding(class_of, ordered, system, res_class, [res_members[c] for c in range(len(res_members))],
                   floors=floors)
