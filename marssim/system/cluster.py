"""GPU clusters described by their structure: nodes (or racks) of GPUs joined inside by a
scale-up fabric, one network adapter per GPU into a rail-optimised fat tree; expanded into
ordinary accelerators, hosts, switches and links, with routes computed from the structure
(microseconds per pair, no graph search).

A system file may hold a ``cluster:`` section instead of (or besides) explicit lists::

    cluster:
      node_groups:                        # one or more kinds of node (a mixed cluster has several)
        - nodes: 16
          gpus_per_node: 8                # the scale-up domain: a DGX node, an NVL72 rack (72)
          design: h100
          memory: {capacity: 80 GiB, bandwidth: 3.35 TB/s}
          scale_up: switch                # switch (NVSwitch, NVLink switch trays) or mesh
          nvlink: {bandwidth: 450 GB/s, latency: 150 ns}      # per GPU, per direction, to the switch;
                                                              # mesh: per direction of each GPU-GPU link
          nvswitch_latency: 170 ns
          nic: {bandwidth: 50 GB/s, latency: 1.285 us}        # per GPU, per direction, to its rail's leaf
          pcie: {bandwidth: 63 GB/s, latency: 500 ns}         # GPU to its host (or host_link: ...)
          gpus_per_host: 8                # default: one host per node; GB200: a Grace per 2 GPUs
          host_dram: {capacity: 2 TiB, bandwidth: 614.4 GB/s} # per host
          nodes_per_leaf: 32                                  # a scalable unit: one leaf switch per rail
          nvls: true                                          # NVSwitch reduces and multicasts (NVLink SHARP)
          cpu_vendor: intel                                   # what NCCL's tuning reads of the host CPU
      fabric: {kind: infiniband, leaf_latency: 130 ns, spine_latency: 130 ns, uplink_latency: 100 ns,
               oversubscription: 1}

Scale-up: ``switch`` joins a node's GPUs through one non-blocking switch (a DGX's NVSwitch
chips, an NVL72 rack's NVLink switch trays: every GPU has a link to every switch chip, so the
chips act as one switch, each GPU's links together as one of ``nvlink`` bandwidth); ``mesh``
joins every pair of a node's GPUs by its own point-to-point link of ``nvlink`` bandwidth (AMD
Infinity Fabric on an MI300X platform: 7 links per GPU, no switch), so routes inside a node are
one link.

Names: GPUs ``gpu0 .. gpuN-1`` numbered node after node (node ``n``'s GPU ``k`` is
``gpu{n*8+k}`` when every node has 8), the NVSwitch of node ``n`` ``nvswitch{n}`` (none under
``mesh``), hosts ``host0 ..`` numbered node after node (node ``n``'s host ``j`` serves its GPUs
``j*gpus_per_host .. (j+1)*gpus_per_host - 1`` over the host link), leaf ``leaf{u}.{k}`` for
scalable unit ``u`` and rail ``k``, and ``spine{k}`` the spine layer of rail ``k`` (one logical
switch: the leaf's uplinks to it are one link whose bandwidth is the leaf's down-links' total
over ``oversubscription``, a non-blocking fat tree at 1, as the equal-cost paths of a real one
share the load). Rail ``k`` joins GPU ``k`` of every node; GPUs of different nodes on different
rails reach each other through the source node's scale-up fabric to the GPU on the
destination's rail, then over that rail (NCCL's and RCCL's PXN path). ``fabric.kind``
(``infiniband`` or ``ethernet``) names the network; it changes no time (the same port speeds
and latencies) and is there for what depends on it, such as in-network reduction.

Routes are shortest in latency (tested against a graph search) and chosen by the structure, so
symmetric positions get symmetric routes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from .model import Accelerator, Host, Link, Memory, Switch, made_unchecked
from .quantities import Bandwidth, Seconds

__all__ = ["MAX_CLUSTER_GPUS", "ClusterSpec", "NodeGroup", "Fabric", "ClusterRouter", "expand_cluster"]

_STRICT = ConfigDict(extra="forbid", frozen=True)


class LinkSpec(BaseModel):
    model_config = _STRICT
    bandwidth: Bandwidth
    latency: Seconds = 0.0


class NodeGroup(BaseModel):
    """Identical nodes: GPUs of one design on a scale-up fabric, one NIC per GPU, hosts."""

    model_config = _STRICT
    nodes: int = Field(gt=0, le=100_000)
    gpus_per_node: int = Field(8, gt=0, le=1024)
    design: str
    memory: Memory
    scale_up: Literal["switch", "mesh"] = "switch"
    nvlink: LinkSpec
    nvswitch_latency: Seconds = 0.0
    nic: LinkSpec
    pcie: LinkSpec | None = None
    host_link: LinkSpec | None = None
    gpus_per_host: int | None = Field(None, gt=0, le=1024)
    host_dram: Memory
    nodes_per_leaf: int = Field(32, gt=0, le=4096)
    nvls: bool = Field(False, description="the NVSwitch reduces and multicasts in the network (NVLink SHARP, "
                                          "third-generation NVSwitch with Hopper GPUs): NCCL's NVLS algorithm")
    cpu_vendor: Literal["amd", "intel"] | None = Field(None, description="the host CPU's vendor, which NCCL's "
                                                                          "tuning reads (LL bandwidth, network overhead)")

    @model_validator(mode="after")
    def _hosts(self) -> "NodeGroup":
        if (self.pcie is None) == (self.host_link is None):
            raise ValueError("give exactly one of 'pcie' or 'host_link' (the link from a GPU to its host)")
        if self.gpus_per_host is not None and self.gpus_per_node % self.gpus_per_host:
            raise ValueError(f"gpus_per_host ({self.gpus_per_host}) must divide gpus_per_node ({self.gpus_per_node})")
        if self.scale_up == "mesh" and self.nvswitch_latency:
            raise ValueError("nvswitch_latency applies to scale_up: switch (a mesh has no switch)")
        return self

    @property
    def to_host(self) -> LinkSpec:
        """The link from a GPU to its host."""
        return self.host_link if self.host_link is not None else self.pcie  # type: ignore[return-value]

    @property
    def per_host(self) -> int:
        """GPUs each host serves."""
        return self.gpus_per_host or self.gpus_per_node


class Fabric(BaseModel):
    """The rail-optimised fat tree joining the nodes' network adapters."""

    model_config = _STRICT
    kind: Literal["infiniband", "ethernet"] = "infiniband"
    leaf_latency: Seconds = 0.0
    spine_latency: Seconds = 0.0
    uplink_latency: Seconds = 0.0
    oversubscription: float = Field(1.0, ge=1.0, le=64.0)


MAX_CLUSTER_GPUS = 262_144
"""The most GPUs a cluster may have: above the largest clusters built (100,000 to 200,000 GPUs
in 2024-2025). Checked from the node groups before any GPU is built (each takes about 0.15 ms
of CPU and a few kB to build)."""


class ClusterSpec(BaseModel):
    model_config = _STRICT
    node_groups: list[NodeGroup] = Field(min_length=1)
    fabric: Fabric = Fabric()

    @model_validator(mode="after")
    def _size(self) -> "ClusterSpec":
        gpus = sum(g.nodes * g.gpus_per_node for g in self.node_groups)
        if gpus > MAX_CLUSTER_GPUS:
            parts = " + ".join(f"{g.nodes:,} nodes x {g.gpus_per_node}" for g in self.node_groups)
            raise ValueError(f"{gpus:,} GPUs ({parts}): more than {MAX_CLUSTER_GPUS:,}, above the largest GPU "
                             "clusters built (100,000-200,000 GPUs); not built")
        return self


@dataclass(frozen=True)
class _Gpu:
    node: int
    rank: int  # local index in its node = its rail
    host: int  # index of its host


class ClusterRouter:
    """Paths of a cluster from its structure (see the module docstring)."""

    def __init__(self, gpus: dict[str, _Gpu], node_gpus: list[list[str]], node_unit: list[int],
                 many_units: bool, mesh_nodes: set[int] | None = None,
                 host_gpus: list[list[str]] | None = None, fabric_kind: str = "infiniband",
                 node_group: list[NodeGroup] | None = None) -> None:
        self.gpus = gpus
        self.node_gpus = node_gpus
        self.node_unit = node_unit
        self.many_units = many_units
        self.mesh_nodes = mesh_nodes or set()
        self.host_gpus = host_gpus if host_gpus is not None else node_gpus
        self.hosts = {f"host{h}": h for h in range(len(self.host_gpus))}
        self.fabric_kind = fabric_kind
        self.node_group = node_group or []

    def node_of(self, gpu: str) -> tuple[int, NodeGroup | None] | None:
        """The node index of ``gpu`` and the node group it belongs to (None: not a GPU here)."""
        g = self.gpus.get(gpu)
        if g is None:
            return None
        return g.node, (self.node_group[g.node] if g.node < len(self.node_group) else None)

    def nearest_host(self, node: str) -> str | None:
        g = self.gpus.get(node)
        if g is not None:
            return f"host{g.host}"
        return node if node in self.hosts else None

    def _rail(self, a: str, b: str) -> list[str]:
        """GPU ``a`` to GPU ``b`` of another node on the same rail."""
        ga, gb = self.gpus[a], self.gpus[b]
        ua, ub = self.node_unit[ga.node], self.node_unit[gb.node]
        if ua == ub:
            return [a, f"leaf{ua}.{ga.rank}", b]
        return [a, f"leaf{ua}.{ga.rank}", f"spine{ga.rank}", f"leaf{ub}.{ga.rank}", b]

    def _local(self, a: str, b: str, node: int) -> list[str]:
        """GPU ``a`` to GPU ``b`` of the same node ``node``: through its switch, or one link."""
        return [a, b] if node in self.mesh_nodes else [a, f"nvswitch{node}", b]

    def _gpu_path(self, a: str, b: str) -> list[str]:
        ga, gb = self.gpus[a], self.gpus[b]
        if ga.node == gb.node:
            return self._local(a, b, ga.node)
        if ga.rank == gb.rank:
            return self._rail(a, b)
        local = self.node_gpus[ga.node]
        if gb.rank < len(local):  # over the scale-up fabric to the GPU on b's rail (PXN)
            hop = local[gb.rank]
            return self._local(a, hop, ga.node)[:-1] + self._rail(hop, b)
        far = self.node_gpus[gb.node][ga.rank]  # b's node has no GPU of that rank: scale-up last
        return self._rail(a, far) + self._local(far, b, gb.node)[1:]

    def path(self, src: str, dst: str) -> list[str] | None:
        """The node path from ``src`` to ``dst`` (GPUs and hosts), or None when either is a switch."""
        if src in self.gpus and dst in self.gpus:
            return self._gpu_path(src, dst)
        if src in self.hosts and dst in self.gpus:
            h = self.hosts[src]
            mine = self.host_gpus[h]
            if dst in mine:
                return [src, dst]
            rank = self.gpus[dst].rank
            entry = next((g for g in mine if self.gpus[g].rank == rank), mine[0])
            return [src] + self._gpu_path(entry, dst)
        if src in self.gpus and dst in self.hosts:
            back = self.path(dst, src)
            return None if back is None else back[::-1]
        if src in self.hosts and dst in self.hosts:
            if src == dst:
                return [src]
            a, b = self.host_gpus[self.hosts[src]][0], self.host_gpus[self.hosts[dst]][0]
            return [src] + self._gpu_path(a, b) + [dst]
        return None


def _link(a: str, b: str, spec: LinkSpec) -> Link:
    """A link of ``spec``'s bandwidth and latency (values the cluster's spec has validated, so the
    model is made without validating them again: tens of thousands of links on the largest
    clusters)."""
    return made_unchecked(Link, a=a, b=b, bandwidth=spec.bandwidth, latency=spec.latency, duplex="full",
                          energy_per_byte=None)


def expand_cluster(spec: ClusterSpec, gpu_offset: int = 0) -> tuple[list[Accelerator], list[Host], list[Switch],
                                                                     list[Link], ClusterRouter]:
    """The accelerators, hosts, switches and links of ``spec``, and its router."""
    accelerators: list[Accelerator] = []
    hosts: list[Host] = []
    switches: list[Switch] = []
    links: list[Link] = []
    gpus: dict[str, _Gpu] = {}
    node_gpus: list[list[str]] = []
    host_gpus: list[list[str]] = []
    node_unit: list[int] = []
    node_group: list[NodeGroup] = []
    mesh_nodes: set[int] = set()
    leaf_members: dict[tuple[int, int], int] = {}  # (unit, rail) -> GPUs on it
    leaf_nic: dict[tuple[int, int], float] = {}
    fabric = spec.fabric
    node = 0
    unit = 0
    index = gpu_offset
    for group in spec.node_groups:
        to_host = group.to_host
        for local_node in range(group.nodes):
            if local_node and local_node % group.nodes_per_leaf == 0:
                unit += 1
            names = []
            nvs = f"nvswitch{node}"
            if group.scale_up == "switch":
                switches.append(made_unchecked(Switch, id=nvs, latency=group.nvswitch_latency, bandwidth=None))
            else:
                mesh_nodes.add(node)
            for k in range(group.gpus_per_node):
                if k % group.per_host == 0:
                    hosts.append(made_unchecked(Host, id=f"host{len(host_gpus)}", dram=group.host_dram))
                    host_gpus.append([])
                host = len(host_gpus) - 1
                name = f"gpu{index}"
                index += 1
                names.append(name)
                host_gpus[host].append(name)
                gpus[name] = _Gpu(node, k, host)
                accelerators.append(made_unchecked(Accelerator, id=name, designs=(group.design,), memory=group.memory))
                if group.scale_up == "switch":
                    links.append(_link(nvs, name, group.nvlink))
                else:
                    for other in names[:-1]:
                        links.append(_link(other, name, group.nvlink))
                links.append(_link(f"host{host}", name, to_host))
                leaf = (unit, k)
                leaf_members[leaf] = leaf_members.get(leaf, 0) + 1
                leaf_nic[leaf] = max(leaf_nic.get(leaf, 0.0), group.nic.bandwidth)
                links.append(_link(f"leaf{unit}.{k}", name, group.nic))
            node_gpus.append(names)
            node_unit.append(unit)
            node_group.append(group)
            node += 1
        unit += 1
    units = sorted({u for u, _ in leaf_members})
    for u, k in sorted(leaf_members):
        switches.append(made_unchecked(Switch, id=f"leaf{u}.{k}", latency=fabric.leaf_latency, bandwidth=None))
    many_units = len(units) > 1
    if many_units:
        rails = sorted({k for _, k in leaf_members})
        for k in rails:
            switches.append(Switch(id=f"spine{k}", latency=fabric.spine_latency))
        for (u, k), members in sorted(leaf_members.items()):
            uplink = members * leaf_nic[(u, k)] / fabric.oversubscription
            links.append(Link(a=f"spine{k}", b=f"leaf{u}.{k}", bandwidth=uplink, latency=fabric.uplink_latency))
    router = ClusterRouter(gpus, node_gpus, node_unit, many_units, mesh_nodes, host_gpus, fabric.kind, node_group)
    return accelerators, hosts, switches, links, router
