"""GPU clusters described by their structure: nodes of GPUs on an NVSwitch, one network adapter
per GPU into a rail-optimised fat tree; expanded into ordinary accelerators, hosts, switches and
links, with routes computed from the structure (microseconds per pair, no graph search).

A system file may hold a ``cluster:`` section instead of (or besides) explicit lists::

    cluster:
      node_groups:                        # one or more kinds of node (a mixed cluster has several)
        - nodes: 16
          gpus_per_node: 8
          design: h100
          memory: {capacity: 80 GiB, bandwidth: 3.35 TB/s}
          nvlink: {bandwidth: 450 GB/s, latency: 150 ns}      # per GPU, per direction, to the NVSwitch
          nvswitch_latency: 170 ns
          nic: {bandwidth: 50 GB/s, latency: 1.285 us}        # per GPU, per direction, to its rail's leaf
          pcie: {bandwidth: 63 GB/s, latency: 500 ns}         # GPU to its node's host
          host_dram: {capacity: 2 TiB, bandwidth: 614.4 GB/s}
          nodes_per_leaf: 32                                  # a scalable unit: one leaf switch per rail
          nvls: true                                          # NVSwitch reduces and multicasts (NVLink SHARP)
          cpu_vendor: intel                                   # what NCCL's tuning reads of the host CPU
      fabric: {leaf_latency: 130 ns, spine_latency: 130 ns, uplink_latency: 100 ns, oversubscription: 1}

Names: GPUs ``gpu0 .. gpuN-1`` numbered node after node (node ``n``'s GPU ``k`` is
``gpu{n*8+k}`` when every node has 8), the NVSwitch of node ``n`` ``nvswitch{n}``, its host
``host{n}``, leaf ``leaf{u}.{k}`` for scalable unit ``u`` and rail ``k``, and ``spine{k}`` the
spine layer of rail ``k`` (one logical switch: the leaf's uplinks to it are one link whose
bandwidth is the leaf's down-links' total over ``oversubscription``, a non-blocking fat tree at
1, as the equal-cost paths of a real one share the load). Rail ``k`` joins GPU ``k`` of every
node; GPUs of different nodes on different rails reach each other through the source node's
NVSwitch to the GPU on the destination's rail, then over that rail (NCCL's PXN path).

Routes are shortest in latency (tested against a graph search) and chosen by the structure, so
symmetric positions get symmetric routes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from .model import Accelerator, Host, Link, Memory, Switch
from .quantities import Bandwidth, Seconds

__all__ = ["ClusterSpec", "NodeGroup", "Fabric", "ClusterRouter", "expand_cluster"]

_STRICT = ConfigDict(extra="forbid", frozen=True)


class LinkSpec(BaseModel):
    model_config = _STRICT
    bandwidth: Bandwidth
    latency: Seconds = 0.0


class NodeGroup(BaseModel):
    """Identical nodes: GPUs of one design on an NVSwitch, one NIC per GPU, one host."""

    model_config = _STRICT
    nodes: int = Field(gt=0, le=100_000)
    gpus_per_node: int = Field(8, gt=0, le=64)
    design: str
    memory: Memory
    nvlink: LinkSpec
    nvswitch_latency: Seconds = 0.0
    nic: LinkSpec
    pcie: LinkSpec
    host_dram: Memory
    nodes_per_leaf: int = Field(32, gt=0, le=4096)
    nvls: bool = Field(False, description="the NVSwitch reduces and multicasts in the network (NVLink SHARP, "
                                          "third-generation NVSwitch with Hopper GPUs): NCCL's NVLS algorithm")
    cpu_vendor: Literal["amd", "intel"] | None = Field(None, description="the host CPU's vendor, which NCCL's "
                                                                          "tuning reads (LL bandwidth, network overhead)")


class Fabric(BaseModel):
    """The rail-optimised fat tree joining the nodes' network adapters."""

    model_config = _STRICT
    leaf_latency: Seconds = 0.0
    spine_latency: Seconds = 0.0
    uplink_latency: Seconds = 0.0
    oversubscription: float = Field(1.0, ge=1.0, le=64.0)


class ClusterSpec(BaseModel):
    model_config = _STRICT
    node_groups: list[NodeGroup] = Field(min_length=1)
    fabric: Fabric = Fabric()


@dataclass(frozen=True)
class _Gpu:
    node: int
    rank: int  # local index in its node = its rail


class ClusterRouter:
    """Paths of a cluster from its structure (see the module docstring)."""

    def __init__(self, gpus: dict[str, _Gpu], node_gpus: list[list[str]], node_unit: list[int],
                 many_units: bool, node_group: list[NodeGroup] | None = None) -> None:
        self.gpus = gpus
        self.node_gpus = node_gpus
        self.node_unit = node_unit
        self.many_units = many_units
        self.node_group = node_group or []
        self.hosts = {f"host{n}": n for n in range(len(node_gpus))}

    def node_of(self, gpu: str) -> tuple[int, NodeGroup | None] | None:
        """The node index of ``gpu`` and the node group it belongs to (None: not a GPU here)."""
        g = self.gpus.get(gpu)
        if g is None:
            return None
        return g.node, (self.node_group[g.node] if g.node < len(self.node_group) else None)

    def nearest_host(self, node: str) -> str | None:
        g = self.gpus.get(node)
        if g is not None:
            return f"host{g.node}"
        return node if node in self.hosts else None

    def _rail(self, a: str, b: str) -> list[str]:
        """GPU ``a`` to GPU ``b`` of another node on the same rail."""
        ga, gb = self.gpus[a], self.gpus[b]
        ua, ub = self.node_unit[ga.node], self.node_unit[gb.node]
        if ua == ub:
            return [a, f"leaf{ua}.{ga.rank}", b]
        return [a, f"leaf{ua}.{ga.rank}", f"spine{ga.rank}", f"leaf{ub}.{ga.rank}", b]

    def _gpu_path(self, a: str, b: str) -> list[str]:
        ga, gb = self.gpus[a], self.gpus[b]
        if ga.node == gb.node:
            return [a, f"nvswitch{ga.node}", b]
        if ga.rank == gb.rank:
            return self._rail(a, b)
        local = self.node_gpus[ga.node]
        if gb.rank < len(local):  # through the NVSwitch to the GPU on b's rail (PXN)
            hop = local[gb.rank]
            return [a, f"nvswitch{ga.node}"] + self._rail(hop, b)
        far = self.node_gpus[gb.node][ga.rank]  # b's node has no GPU of that rank: NVLink last
        return self._rail(a, far) + [f"nvswitch{gb.node}", b]

    def path(self, src: str, dst: str) -> list[str] | None:
        """The node path from ``src`` to ``dst`` (GPUs and hosts), or None when either is a switch."""
        if src in self.gpus and dst in self.gpus:
            return self._gpu_path(src, dst)
        if src in self.hosts and dst in self.gpus:
            n = self.hosts[src]
            if self.gpus[dst].node == n:
                return [src, dst]
            local = self.node_gpus[n]
            entry = local[self.gpus[dst].rank] if self.gpus[dst].rank < len(local) else local[0]
            return [src] + self._gpu_path(entry, dst)
        if src in self.gpus and dst in self.hosts:
            back = self.path(dst, src)
            return None if back is None else back[::-1]
        if src in self.hosts and dst in self.hosts:
            if src == dst:
                return [src]
            a, b = self.node_gpus[self.hosts[src]][0], self.node_gpus[self.hosts[dst]][0]
            return [src] + self._gpu_path(a, b) + [dst]
        return None


def expand_cluster(spec: ClusterSpec, gpu_offset: int = 0) -> tuple[list[Accelerator], list[Host], list[Switch],
                                                                     list[Link], ClusterRouter]:
    """The accelerators, hosts, switches and links of ``spec``, and its router."""
    accelerators: list[Accelerator] = []
    hosts: list[Host] = []
    switches: list[Switch] = []
    links: list[Link] = []
    gpus: dict[str, _Gpu] = {}
    node_gpus: list[list[str]] = []
    node_unit: list[int] = []
    node_group: list[NodeGroup] = []
    leaf_members: dict[tuple[int, int], int] = {}  # (unit, rail) -> GPUs on it
    leaf_nic: dict[tuple[int, int], float] = {}
    fabric = spec.fabric
    node = 0
    unit = 0
    index = gpu_offset
    for group in spec.node_groups:
        for local_node in range(group.nodes):
            if local_node and local_node % group.nodes_per_leaf == 0:
                unit += 1
            names = []
            nvs = f"nvswitch{node}"
            host = f"host{node}"
            switches.append(Switch(id=nvs, latency=group.nvswitch_latency))
            hosts.append(Host(id=host, dram=group.host_dram))
            for k in range(group.gpus_per_node):
                name = f"gpu{index}"
                index += 1
                names.append(name)
                gpus[name] = _Gpu(node, k)
                accelerators.append(Accelerator(id=name, designs=(group.design,), memory=group.memory))
                links.append(Link(a=nvs, b=name, bandwidth=group.nvlink.bandwidth, latency=group.nvlink.latency))
                links.append(Link(a=host, b=name, bandwidth=group.pcie.bandwidth, latency=group.pcie.latency))
                leaf = (unit, k)
                leaf_members[leaf] = leaf_members.get(leaf, 0) + 1
                leaf_nic[leaf] = max(leaf_nic.get(leaf, 0.0), group.nic.bandwidth)
                links.append(Link(a=f"leaf{unit}.{k}", b=name, bandwidth=group.nic.bandwidth, latency=group.nic.latency))
            node_gpus.append(names)
            node_unit.append(unit)
            node_group.append(group)
            node += 1
        unit += 1
    units = sorted({u for u, _ in leaf_members})
    for u, k in sorted(leaf_members):
        switches.append(Switch(id=f"leaf{u}.{k}", latency=fabric.leaf_latency))
    many_units = len(units) > 1
    if many_units:
        rails = sorted({k for _, k in leaf_members})
        for k in rails:
            switches.append(Switch(id=f"spine{k}", latency=fabric.spine_latency))
        for (u, k), members in sorted(leaf_members.items()):
            uplink = members * leaf_nic[(u, k)] / fabric.oversubscription
            links.append(Link(a=f"spine{k}", b=f"leaf{u}.{k}", bandwidth=uplink, latency=fabric.uplink_latency))
    router = ClusterRouter(gpus, node_gpus, node_unit, many_units, node_group)
    return accelerators, hosts, switches, links, router
