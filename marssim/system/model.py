"""The system: accelerators, hosts, switches and links, the resources they form, and routes.

Nodes are accelerators, hosts and switches. Every physical link becomes one bandwidth resource
per direction (full duplex) or one shared resource (half duplex); a switch with a finite
backplane is one more resource; each accelerator memory and host DRAM is a resource whose
bandwidth limits the transfers that start or end there. A route is the ordered list of resources
a transfer holds plus its total latency (links and switches). Units: bytes, bytes/s, seconds.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from .design import Design
from .quantities import Bandwidth, Bytes, EnergyPerByte, Seconds

if TYPE_CHECKING:
    import networkx as nx

__all__ = ["Memory", "Accelerator", "Host", "Switch", "Link", "System", "Route", "ResourceKind", "made_unchecked"]

_STRICT = ConfigDict(extra="forbid", frozen=True)

_MODEL_SLOTS = ("__dict__", "__pydantic_fields_set__", "__pydantic_extra__", "__pydantic_private__")
_UNCHECKED: dict[type, frozenset[str] | None] = {}


def made_unchecked(cls: type[BaseModel], **values):
    """An instance of the frozen model ``cls`` holding ``values`` -- every field given, each
    already valid -- as pydantic's ``model_construct`` makes it (no validation), at a quarter of
    its cost: the largest clusters expand into tens of thousands of links and accelerators. A
    model this shortcut cannot stand for (private attributes, extra fields, a pydantic whose
    instances keep other state) is made by ``model_construct``."""
    fields = _UNCHECKED.get(cls, False)
    if fields is False:
        plain = (tuple(BaseModel.__slots__) == _MODEL_SLOTS and not cls.__private_attributes__
                 and cls.model_config.get("extra") != "allow" and cls.model_config.get("frozen") is True)
        fields = _UNCHECKED[cls] = frozenset(cls.model_fields) if plain else None
    if fields is None or len(values) != len(fields) or not fields.issuperset(values):
        return cls.model_construct(**values)
    m = object.__new__(cls)
    object.__setattr__(m, "__dict__", values)
    object.__setattr__(m, "__pydantic_fields_set__", set(values))
    object.__setattr__(m, "__pydantic_extra__", None)
    object.__setattr__(m, "__pydantic_private__", None)
    return m


class Memory(BaseModel):
    """A memory: capacity in bytes, bandwidth in bytes/s."""

    model_config = _STRICT
    capacity: Bytes
    bandwidth: Bandwidth


class Accelerator(BaseModel):
    """An accelerator: the designs it may be configured with (one = fixed) and its local memory."""

    model_config = _STRICT
    id: str
    designs: tuple[str, ...] = Field(min_length=1)
    memory: Memory

    @property
    def fixed(self) -> bool:
        """True when the accelerator can take only one design."""
        return len(self.designs) == 1


class Host(BaseModel):
    """A host CPU with DRAM; workload inputs start and outputs end here."""

    model_config = _STRICT
    id: str
    dram: Memory


class Switch(BaseModel):
    """A switch: per-traversal latency (s) and optional backplane bandwidth (bytes/s)."""

    model_config = _STRICT
    id: str
    latency: Seconds = 0.0
    bandwidth: Bandwidth | None = None


class Link(BaseModel):
    """A physical channel between two nodes: bandwidth per direction (bytes/s), latency (s) and,
    when known, the energy of carrying one byte across it (J/byte; None: unknown)."""

    model_config = _STRICT
    a: str
    b: str
    bandwidth: Bandwidth
    latency: Seconds = 0.0
    duplex: Literal["full", "half"] = "full"
    energy_per_byte: EnergyPerByte | None = None


ResourceKind = Literal["link", "switch", "memory"]


@dataclass(frozen=True, slots=True)
class Route:
    """The path of a transfer: node ids, the resources it holds, and its latency in seconds.

    ``weights`` (empty: one each) says how many flows a transfer on this route stands for on
    each of its resources: a transfer that represents a class of identical transfers of
    symmetric devices (see :mod:`marssim.parallel.fold`) loads each resource of its route by
    that many flows' worth."""

    nodes: tuple[str, ...]
    resources: tuple[int, ...]
    latency: float
    weights: tuple[float, ...] = ()


class System:
    """An immutable multi-accelerator system. Build with :func:`marssim.system.load_system`."""

    def __init__(
        self,
        name: str,
        designs: dict[str, Design],
        accelerators: tuple[Accelerator, ...],
        hosts: tuple[Host, ...],
        switches: tuple[Switch, ...],
        links: tuple[Link, ...],
        *,
        path: str | None = None,
        description: str = "",
        router: object | None = None,
        spec: str = "",
    ) -> None:
        self.name = name
        self.path = path
        self.description = description
        self.spec = spec or name
        """How the system was named: ``dgx-h100-cluster:nodes=128`` for a parameterised one."""
        self._router = router
        self.designs = dict(designs)
        self.accelerators = tuple(accelerators)
        self.hosts = tuple(hosts)
        self.switches = tuple(switches)
        self.links = tuple(links)
        self.nodes: tuple[str, ...] = (
            tuple(a.id for a in self.accelerators) + tuple(h.id for h in self.hosts) + tuple(s.id for s in self.switches)
        )
        self.node_index: dict[str, int] = {n: i for i, n in enumerate(self.nodes)}
        self._acc = {a.id: a for a in self.accelerators}
        self._host = {h.id: h for h in self.hosts}
        self._switch = {s.id: s for s in self.switches}
        self._build_resources()
        self._routes: dict[tuple[str, str], Route] = {}

    # ----------------------------------------------------------------------------- structure
    def _build_resources(self) -> None:
        names: list[str] = []
        kinds: list[str] = []
        caps: list[float] = []
        energies: dict[int, float] = {}
        self._link_res: dict[tuple[str, str], int] = {}
        for link in self.links:
            if link.duplex == "full":
                for s, d in ((link.a, link.b), (link.b, link.a)):
                    self._link_res[(s, d)] = len(names)
                    if link.energy_per_byte is not None:
                        energies[len(names)] = link.energy_per_byte
                    names.append(f"{s}->{d}")
                    kinds.append("link")
                    caps.append(link.bandwidth)
            else:
                idx = len(names)
                self._link_res[(link.a, link.b)] = idx
                self._link_res[(link.b, link.a)] = idx
                if link.energy_per_byte is not None:
                    energies[idx] = link.energy_per_byte
                names.append(f"{link.a}<->{link.b}")
                kinds.append("link")
                caps.append(link.bandwidth)
        self._switch_res: dict[str, int] = {}
        for sw in self.switches:
            if sw.bandwidth is not None:
                self._switch_res[sw.id] = len(names)
                names.append(f"{sw.id}:backplane")
                kinds.append("switch")
                caps.append(sw.bandwidth)
        self._memory_res: dict[str, int] = {}
        for acc in self.accelerators:
            self._memory_res[acc.id] = len(names)
            names.append(f"{acc.id}:mem")
            kinds.append("memory")
            caps.append(acc.memory.bandwidth)
        for host in self.hosts:
            self._memory_res[host.id] = len(names)
            names.append(f"{host.id}:dram")
            kinds.append("memory")
            caps.append(host.dram.bandwidth)
        self._links_by_pair: dict[tuple[str, str], Link] = {}
        for link in self.links:
            self._links_by_pair[(link.a, link.b)] = self._links_by_pair[(link.b, link.a)] = link
        self.resource_names: tuple[str, ...] = tuple(names)
        self.resource_kinds: tuple[str, ...] = tuple(kinds)
        self.resource_capacity: np.ndarray = np.asarray(caps, dtype=float)
        self.resource_capacity.setflags(write=False)
        # J per byte carried by each resource: the links' figures, 0 where none is given
        self.resource_energy_per_byte: np.ndarray = np.zeros(len(names))
        for idx, joules in energies.items():
            self.resource_energy_per_byte[idx] = joules
        self.resource_energy_per_byte.setflags(write=False)
        self.has_link_energy: bool = bool(energies)

    @cached_property
    def dominated_links(self) -> frozenset[int]:
        """Resource indices of the switch-to-switch link directions that can never limit a flow's
        max-min fair rate: a direction ``u -> v`` whose traffic all enters switch ``u`` over
        full-duplex links from endpoints (GPUs, hosts) of total capacity no more than its own, or
        all leaves switch ``v`` over such links to endpoints (a non-blocking fat tree's uplinks and
        downlinks). Every flow on it crosses one of those links, so its load never exceeds their
        summed capacity: leaving it out of the rate computation changes no rate (the max-min fair
        allocation without it satisfies its constraint, and that allocation is unique). Links with
        an energy per byte are kept (their traffic is reported). The endpoint links themselves are
        never left out."""
        switches = set(self._switch)
        full: dict[tuple[str, str], float] = {}
        for link in self.links:
            if link.duplex == "full":
                full[(link.a, link.b)] = full[(link.b, link.a)] = float(link.bandwidth)
        neighbours: dict[str, list[str]] = {}
        for link in self.links:
            neighbours.setdefault(link.a, []).append(link.b)
            neighbours.setdefault(link.b, []).append(link.a)
        energy = self.resource_energy_per_byte

        def fed_by_endpoints(switch: str, other: str, inbound: bool) -> float | None:
            total = []
            for w in neighbours.get(switch, ()):
                if w == other:
                    continue
                pair = (w, switch) if inbound else (switch, w)
                if w in switches or pair not in full:
                    return None
                total.append(full[pair])
            return math.fsum(total)

        out = set()
        for link in self.links:
            if link.duplex != "full" or link.a not in switches or link.b not in switches:
                continue
            for u, v in ((link.a, link.b), (link.b, link.a)):
                idx = self._link_res[(u, v)]
                if energy[idx] > 0:
                    continue
                cap = float(link.bandwidth) * (1 + 1e-12)  # summed capacities in floating point
                for fed in (fed_by_endpoints(u, v, True), fed_by_endpoints(v, u, False)):
                    if fed is not None and fed <= cap:
                        out.add(idx)
                        break
        return frozenset(out)

    @cached_property
    def graph(self) -> nx.Graph:
        """Undirected link graph over node ids; edge attribute ``link`` is the :class:`Link`."""
        import networkx as nx

        g = nx.Graph()
        g.add_nodes_from(self.nodes)
        for link in self.links:
            g.add_edge(link.a, link.b, link=link)
        return g

    def accelerator(self, acc_id: str) -> Accelerator:
        """The accelerator with this id (KeyError if none)."""
        return self._acc[acc_id]

    def host(self, host_id: str) -> Host:
        return self._host[host_id]

    def is_accelerator(self, node: str) -> bool:
        return node in self._acc

    def is_host(self, node: str) -> bool:
        return node in self._host

    @property
    def accelerator_ids(self) -> tuple[str, ...]:
        return tuple(a.id for a in self.accelerators)

    def memory_capacity(self, node: str) -> float:
        """Capacity in bytes of the memory of an accelerator or host (inf for switches)."""
        if node in self._acc:
            return self._acc[node].memory.capacity
        if node in self._host:
            return self._host[node].dram.capacity
        return float("inf")

    def memory_resource(self, node: str) -> int | None:
        """Index of the bandwidth resource of a node's memory, or None for switches."""
        return self._memory_res.get(node)

    def design(self, acc_id: str, design_name: str) -> Design:
        """The design ``design_name`` as configured on ``acc_id``: its off-chip bandwidth bounded
        by the accelerator's memory bandwidth. Raises KeyError if the accelerator does not allow it."""
        acc = self._acc[acc_id]
        if design_name not in acc.designs:
            raise KeyError(f"{acc_id} cannot take design {design_name!r} (allowed: {', '.join(acc.designs)})")
        return self.designs[design_name].with_dram_bandwidth(acc.memory.bandwidth)

    def cluster_node(self, device: str) -> tuple[int, object] | None:
        """For a GPU of a ``cluster:`` section: its node index and node group
        (:class:`marssim.system.cluster.NodeGroup`, its NVLink, NIC and NCCL facts); None for
        other devices and systems without one."""
        node_of = getattr(self._router, "node_of", None)
        return None if node_of is None else node_of(device)

    @property
    def fabric_kind(self) -> str | None:
        """The network joining a cluster's nodes (``infiniband`` or ``ethernet``, from its
        ``cluster.fabric.kind``); None for a system without a ``cluster:`` section."""
        return getattr(self._router, "fabric_kind", None)

    def nearest_host(self, node: str) -> str:
        """The host with the lowest-latency route to ``node`` (ties: first declared; a cluster's
        GPU: its node's host)."""
        if self._router is not None:
            host = self._router.nearest_host(node)
            if host is not None:
                return host
        return min(self.hosts, key=lambda h: (self.route(h.id, node).latency, len(self.route(h.id, node).nodes))).id

    # ----------------------------------------------------------------------------- routing
    def route(self, src: str, dst: str) -> Route:
        """Lowest-latency path from ``src`` to ``dst`` (fewest hops on ties; deterministic)."""
        key = (src, dst)
        cached = self._routes.get(key)
        if cached is not None:
            return cached
        if src == dst:
            route = Route((src,), (), 0.0)
        else:
            nodes = self._router.path(src, dst) if self._router is not None else None
            if nodes is None:
                nodes = self._shortest_path(src, dst)
            res: list[int] = []
            latency = 0.0
            mem = self._memory_res.get(src)
            if mem is not None:
                res.append(mem)
            for u, v in zip(nodes[:-1], nodes[1:]):
                link: Link = self._links_by_pair[(u, v)]
                res.append(self._link_res[(u, v)])
                latency += link.latency
            for mid in nodes[1:-1]:
                sw = self._switch.get(mid)
                if sw is not None:
                    latency += sw.latency
                    if mid in self._switch_res:
                        res.append(self._switch_res[mid])
            mem = self._memory_res.get(dst)
            if mem is not None:
                res.append(mem)
            route = Route(tuple(nodes), tuple(res), latency)
        self._routes[key] = route
        return route

    def _shortest_path(self, src: str, dst: str) -> list[str]:
        # Weight: latency, with a tiny per-hop term so equal-latency paths prefer fewer hops.
        # Switch latency is charged on entering a switch.
        def weight(u: str, v: str, data: dict) -> float:
            sw = self._switch.get(v)
            return data["link"].latency + (sw.latency if sw is not None else 0.0) + 1e-15

        import networkx as nx

        return nx.shortest_path(self.graph, src, dst, weight=weight)

    def bottleneck_bandwidth(self, src: str, dst: str) -> float:
        """Smallest capacity (bytes/s) along the route from ``src`` to ``dst``."""
        route = self.route(src, dst)
        if not route.resources:
            return float("inf")
        return float(self.resource_capacity[list(route.resources)].min())

    def __repr__(self) -> str:
        return (
            f"System({self.name!r}: {len(self.accelerators)} accelerators, {len(self.hosts)} hosts, "
            f"{len(self.switches)} switches, {len(self.links)} links, {len(self.designs)} designs)"
        )
