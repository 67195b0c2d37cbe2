"""How a collective runs: NCCL's choice, its steps and the bytes each step puts on the wire, timed
from measurements where they exist. The one function the lowerings call is :func:`plan_collective`.

    plan = plan_collective("all_reduce", 64 * 2**20, ["gpu0", "gpu1", "gpu2", "gpu3"],
                           system_info(system, ["gpu0", "gpu1", "gpu2", "gpu3"]))
    plan.algorithm, plan.protocol       # "ring", "Simple": what NCCL picks (marssim.collectives.nccl)
    plan.steps                          # 6: 2 (N - 1) ring steps, each rank sends to the next
    plan.wire_bytes_per_step            # bytes each rank's link carries per step
    plan.step_latency                   # s before each step's transfer
    plan.time                           # s: steps x (step_latency + wire_bytes_per_step / line_bandwidth)

A plan's ``time`` comes, in this order, from

1. ``measured``: the stack's measured curve of the same collective, group size and ranks per node
   on the same system (:mod:`marssim.collectives.measured`), interpolated between measured sizes;
2. ``fitted``: NCCL's model (:mod:`marssim.collectives.nccl`) with what the stack's measurements
   on that GPU and transport say about it (:class:`~marssim.collectives.measured.Achieved`: a
   fixed overhead per call, a factor on NCCL's latency and a fraction of NCCL's bandwidth, fitted
   to the measured curves (:func:`achieved_for`); whether the stack runs NVLS: :func:`stack_runs_nvls`);
3. ``nccl-model``: NCCL's own model, where nothing of the stack was measured.

The steps and bytes follow the algorithm: ring collectives take ``2 (N - 1)`` (all-reduce) or
``N - 1`` steps of ``bytes / N`` each rank sends to its ring neighbour; NVLS (in-switch reduction
and multicast) two steps in which each rank sends its ``bytes (N - 1) / N`` spread over its peers
(the switch's reduction is what halves the traffic against a ring); trees (all-reduce across
nodes) ``2 x (the chain inside a node + log2 of the nodes)`` steps, pipelined: each rank sends the
buffer once over them (half up and half down each of NCCL's two trees); send/receive one step. The wire bytes of a step are its payload over the protocol's efficiency
(LL 1/2, LL128 120/128, Simple 1) and over the transport's: the share of the link's line rate
(``line_bandwidth``, the system file's NVLink or NIC bandwidth) the plan's time leaves for the
payload -- so flows of ``wire_bytes_per_step`` at line rate, ``step_latency`` apart, take the
plan's time (:func:`marssim.collectives.flows.plan_taskgraph` simulates them).

``nbytes`` follows nccl-tests: the all-reduce buffer, the all-gather output, the reduce-scatter
input, the bytes sent by a send/receive. Units: bytes, s, bytes/s.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from functools import lru_cache

from marssim.errors import InputError

from .measured import Achieved, CollectiveRow, configurations, fit_achieved, interpolate, load_collective_tables
from .nccl import PROTOCOL_EFFICIENCY, NcclFabric, choose, p2p_time

__all__ = ["KINDS", "MEASURED_SYSTEMS", "CollectivePlan", "SystemInfo", "plan_collective", "system_info", "nccl_plan",
           "achieved_for", "stack_runs_nvls", "transport_of", "with_stack"]

KINDS = ("all_reduce", "all_gather", "reduce_scatter", "send_recv")
MEASURED_SYSTEMS = {("A100", False): ("dgx-a100", "hgx-a100"), ("H100", True): ("dgx-h100", "hgx-h100"),
                    ("H200", True): ("hgx-h200",), ("B200", True): ("hgx-b200",), ("GB200", True): ("gb200-nvl72",),
                    ("B300", True): ("hgx-b300",), ("GB300", True): ("gb300-nvl72",)}
"""The measured machines (:mod:`marssim.collectives.measured`) whose single-node curves stand for a
node of a ``cluster:`` section, by (GPU, NVLS): eight GPUs on an NVSwitch, one node (GB200, GB300:
GPUs of one NVLink domain, of a rack). Groups across nodes are never timed by measured curves of a network
the source does not describe (``+net`` systems); they take the NCCL model."""

GPU_COMPUTE_CAPABILITY = {"A100": 8.0, "H100": 9.0, "H200": 9.0, "B200": 10.0, "B300": 10.3, "GB200": 10.0,
                          "GB300": 10.3}
"""The compute capability of each GPU of the measured tables (``gpu`` column): the generation whose
NCCL constants model its curves."""


@dataclass(frozen=True)
class SystemInfo:
    """What the collective model needs of a group on a system: the NCCL view of it (``fabric``),
    the line rate a rank's step runs at (``line_bandwidth``, bytes/s: its NVLink inside a node;
    across nodes the NIC with one GPU per node, else the node's rails shared by its GPUs' rings,
    ``min(NVLink, GPUs per node x NIC)``) and its latency (``route_latency``, s: one rank to the next), the
    software ``stack`` and the measured ``systems`` (:mod:`marssim.collectives.measured`) whose
    curves time it, the measured rows to use (``rows``; empty: NCCL's model), and whether the
    NVSwitch has NVLS (``hardware_nvls``; ``fabric.nvls``: whether the stack runs it,
    :func:`stack_runs_nvls`)."""

    fabric: NcclFabric
    line_bandwidth: float
    route_latency: float = 0.0
    stack: str | None = None
    systems: tuple[str, ...] = ()
    rows: tuple[CollectiveRow, ...] = field(default=(), compare=False, repr=False)
    hardware_nvls: bool = False
    gpu: str = ""

    @property
    def gpu_name(self) -> str:
        """The GPU as the measured tables name it (``gpu``; from the compute capability when not
        given: ``A100`` below 9.0, ``H100`` below 10.0, ``B200`` from 10.0)."""
        if self.gpu:
            return self.gpu
        cc = self.fabric.compute_capability
        return "B200" if cc >= 10.0 else "H100" if cc >= 9.0 else "A100"


@dataclass(frozen=True)
class CollectivePlan:
    """A collective as NCCL runs it (see the module docstring). ``pattern``: how the steps'
    transfers go -- ``ring`` (each rank to the next), ``peers`` (each rank to every other, the
    step's bytes split evenly), ``pair`` (rank 0 to rank 1). ``model``: ``measured``, ``fitted``
    or ``nccl-model``; ``nccl_time``: NCCL's own prediction on the hardware as described (NVLS
    where the NVSwitch has it), for comparison."""

    kind: str
    nbytes: float
    ranks: int
    nodes: int
    algorithm: str
    protocol: str
    channels: int
    pattern: str
    steps: int
    payload_per_step: float
    wire_bytes_per_step: float
    step_latency: float
    line_bandwidth: float
    time: float
    model: str
    nccl_time: float

    @property
    def bus_bandwidth(self) -> float:
        """Payload bytes per second each rank sends while a step's transfer runs (bytes/s)."""
        busy = self.time - self.steps * self.step_latency
        return self.steps * self.payload_per_step / busy if busy > 0 else math.inf


def transport_of(fabric: NcclFabric) -> str:
    """``nvlink`` inside one node, ``net`` across nodes."""
    return "nvlink" if fabric.nodes == 1 else "net"


def ring_steps(kind: str, ranks: int) -> int:
    """Steps of collective ``kind`` run as a ring over ``ranks`` ranks, each sending ``1/ranks`` of
    the buffer to its neighbour: an all-reduce 2(n-1) (a reduce-scatter, then an all-gather), an
    all-gather or a reduce-scatter n-1."""
    return 2 * (ranks - 1) if kind == "all_reduce" else ranks - 1


def _structure(kind: str, nbytes: float, f: NcclFabric, algorithm: str) -> tuple[str, int, float]:
    """``(pattern, steps, payload bytes per step and rank)`` of ``algorithm`` (module docstring)."""
    n = f.ranks
    if kind == "send_recv":
        return "pair", 1, nbytes
    if algorithm == "ring":
        return "ring", ring_steps(kind, n), nbytes / n
    if algorithm == "nvls":
        return "peers", 2 if kind == "all_reduce" else 1, nbytes * (n - 1) / n
    depth = max(1, (int(round(f.ppn)) - 1) + int(math.ceil(math.log2(max(1, f.nodes)))))  # tree, pipelined
    return "ring", 2 * depth, nbytes / (2 * depth)


def nccl_plan(kind: str, nbytes: float, info: SystemInfo) -> tuple[str, str, int, float, float]:
    """``(algorithm, protocol, channels, latency s, algorithm bandwidth bytes/s)`` NCCL's model
    gives ``kind`` of ``nbytes`` (send/receive: NCCL's peer-to-peer path, ``direct``)."""
    if kind == "send_recv":
        protocol, bw, lat = p2p_time(nbytes, info.fabric)
        return "direct", protocol, 1, lat, bw
    c = choose(kind, nbytes, info.fabric)
    return c.algorithm, c.protocol, c.channels, c.latency, c.algo_bandwidth


def _family(info: SystemInfo, p2p: bool) -> tuple[CollectiveRow, ...]:
    """The measured rows of ``info``'s stack, GPU generation, measured systems and transport, of
    the peer-to-peer family or the collectives."""
    transport = transport_of(info.fabric)
    gpu = info.gpu_name
    return tuple(r for r in info.rows if r.stack == info.stack and r.gpu == gpu and r.system in info.systems
                 and (r.collective == "send_recv") == p2p and ("nvlink" if r.nodes == 1 else "net") == transport)


def achieved_for(info: SystemInfo, kind: str) -> Achieved | None:
    """The achieved efficiency of the measurements of ``info``'s stack on its GPU generation,
    transport and measured systems, for the family of ``kind`` (collectives, or peer-to-peer),
    fitted to every such curve (:func:`~marssim.collectives.measured.fit_achieved`) with NCCL's
    choices on ``info.fabric``; None without such measurements."""
    if info.stack is None or not info.rows:
        return None
    f = info.fabric
    return _fit(_family(info, kind == "send_recv"), f.nvlinks, f.nvls, f.nic_bandwidth, f.cpu_vendor)


def stack_runs_nvls(info: SystemInfo) -> bool:
    """Whether ``info``'s stack runs NVLS where the NVSwitch has it. The measurements do not say
    whether the stack's NCCL used it (an NCCL before 2.17, or ``NCCL_NVLS_ENABLE=0``, does not),
    so both settings are tried on the stack's collective curves: each curve predicted by the
    achieved efficiency fitted to the others (in-sample with one curve), and the setting with the
    smaller median error is kept; the hardware's without measurements."""
    f = info.fabric
    if not f.nvls or info.stack is None:
        return f.nvls
    rows = _family(info, False)
    if not rows:
        return f.nvls
    scores = []
    for nvls in (True, False):
        errors = _heldout_errors(rows, f.nvlinks, nvls, f.nic_bandwidth, f.cpu_vendor)
        if errors:
            scores.append((sorted(errors)[len(errors) // 2], not nvls))
    return f.nvls if not scores else not min(scores)[1]


def _heldout_errors(rows: tuple[CollectiveRow, ...], nvlinks: int, nvls: bool, nic: float, cpu: str) -> list[float]:
    """``|model / measured - 1|`` of every row of at least 1 MiB, each curve predicted by the fit to
    the other curves (all of them when there is one curve)."""
    configs = sorted({r.config for r in rows})
    out = []
    for key in configs:
        train = tuple(r for r in rows if r.config != key) or rows
        ach = _fit(train, nvlinks, nvls, nic, cpu)
        if ach is None:
            continue
        for r in rows:
            if r.config == key and r.bytes >= 2 ** 20:
                lat, bw = _nccl_model(r, nvlinks, nvls, nic, cpu)
                out.append(abs(ach.time(lat, r.bytes, bw) / r.time_s - 1))
    return out


def _nccl_model(r: CollectiveRow, nvlinks: int, nvls: bool, nic: float, cpu: str) -> tuple[float, float]:
    cc = GPU_COMPUTE_CAPABILITY.get(r.gpu, 8.0)
    f = NcclFabric(cc, nvlinks, nvls, nic, r.ranks, r.nodes, r.ranks_per_node, cpu)
    _, _, _, lat, bw = nccl_plan(r.collective, r.bytes, SystemInfo(f, 1.0))
    return lat, bw


FIT_VERSION = 2
"""The version of the achieved-efficiency fit (:func:`marssim.collectives.measured.fit_achieved`
and NCCL's model it fits against): raise it with any change to what they compute, so that no
stale entry of the cache folder is read."""


@lru_cache(maxsize=64)
def _fit(rows: tuple[CollectiveRow, ...], nvlinks: int, nvls: bool, nic: float, cpu: str) -> Achieved | None:
    """The fit of ``rows`` on a fabric, computed once per rows and fabric and kept in the user's
    cache folder (:mod:`marssim.cachedir`): a least-squares fit that every process would
    otherwise repeat, with scipy's optimiser imported for it."""
    if not rows:
        return None
    import numpy
    import scipy

    from marssim.cachedir import entry_key, read_entry, write_entry

    key = entry_key("collectives-achieved", FIT_VERSION, numpy.__version__, scipy.__version__, rows, nvlinks, nvls,
                    nic, cpu)
    got = read_entry("fits", key)
    if isinstance(got, Achieved) or got == "none":
        return None if got == "none" else got
    fitted = fit_achieved(rows, lambda r: _nccl_model(r, nvlinks, nvls, nic, cpu))
    write_entry("fits", key, "none" if fitted is None else fitted)
    return fitted


def _measured_time(kind: str, nbytes: float, info: SystemInfo) -> float | None:
    if info.stack is None or not info.rows or not info.systems:
        return None
    f = info.fabric
    curves = _curves(info.rows)
    for name in info.systems:
        curve = curves.get((name, info.gpu_name, info.stack, kind, f.ranks, int(round(f.ppn))))
        t = None if curve is None else interpolate(curve, nbytes)
        if t is not None:
            return t
    return None


@lru_cache(maxsize=16)
def _curves(rows: tuple[CollectiveRow, ...]) -> dict:
    return configurations(rows)


def plan_collective(kind: str, nbytes: float, group: Sequence[str] | int, info: SystemInfo) -> CollectivePlan:
    """The plan of collective ``kind`` (all_reduce, all_gather, reduce_scatter, send_recv) of
    ``nbytes`` (nccl-tests' size) over ``group`` -- its device ids, or its size -- on the system
    ``info`` describes (:func:`system_info`): NCCL's algorithm and protocol, the steps, the wire
    bytes per step and the step latency, timed as the module docstring says. Pure; InputError on
    an unknown kind, a group of fewer than two ranks or one that ``info`` does not describe."""
    if kind not in KINDS:
        raise InputError(None, "kind", f"expected one of {', '.join(KINDS)}, got {kind!r}")
    ranks = group if isinstance(group, int) else len(group)
    if ranks < 2:
        raise InputError(None, "group", f"expected at least two ranks, got {ranks}")
    if ranks != info.fabric.ranks:
        raise InputError(None, "group", f"{ranks} ranks, but the system info describes {info.fabric.ranks}")
    if kind == "send_recv" and ranks != 2:
        raise InputError(None, "group", f"send_recv is between two ranks, got {ranks}")
    if not (nbytes > 0 and math.isfinite(nbytes)):
        raise InputError(None, "nbytes", f"expected a size in bytes > 0, got {nbytes!r}")
    hardware = replace(info, fabric=replace(info.fabric, nvls=info.hardware_nvls)) \
        if info.hardware_nvls != info.fabric.nvls else info
    nccl_time = nccl_plan(kind, nbytes, hardware)
    nccl_time = nccl_time[3] + nbytes / nccl_time[4]
    fitted = achieved_for(info, kind)
    f = info.fabric
    algorithm, protocol, channels, latency, bandwidth = nccl_plan(kind, nbytes, info)
    pattern, steps, payload = _structure(kind, nbytes, f, algorithm)
    time, model = latency + nbytes / bandwidth, "nccl-model"
    overhead = 0.0
    measured = _measured_time(kind, nbytes, info)
    if measured is not None:
        time, model = measured, "measured"
    elif fitted is not None:
        ach = fitted
        overhead = ach.overhead + (ach.latency_scale - 1.0) * latency
        time, model = ach.time(latency, nbytes, bandwidth), "fitted"
    # the latency NCCL's model and the measured overhead give, spread over the steps (never more than the time)
    step_latency = min(latency + overhead, 0.5 * time) / steps
    busy = time - steps * step_latency
    wire = info.line_bandwidth * busy / steps  # at line rate a step's flow takes its share of the busy time
    efficiency = PROTOCOL_EFFICIENCY[protocol]
    wire = max(wire, payload / efficiency)  # never fewer bytes than the protocol puts on the wire
    return CollectivePlan(kind, float(nbytes), ranks, f.nodes, algorithm, protocol, channels, pattern, steps,
                          payload, wire, step_latency, info.line_bandwidth, steps * (step_latency
                                                                                     + wire / info.line_bandwidth),
                          model, nccl_time)


def system_info(system, devices: Sequence[str], *, stack: str | None = None,
                rows: Sequence[CollectiveRow] | None = None, nvls: bool | None = None) -> SystemInfo:
    """The :class:`SystemInfo` of the group ``devices`` of a ``cluster:`` system (its GPUs' design
    gives the compute capability and NVLinks, the node group the NVLink and NIC bandwidths, NVLS
    and the host CPU). ``stack``: the software stack whose measurements time the plans (default:
    the GPUs' design's ``gpu.collective_stack``, else its ``gpu.stack``); ``rows``: the measured
    collectives (default: the shipped tables,
    :func:`~marssim.collectives.measured.load_collective_tables`); ``nvls``: override whether NCCL
    runs NVLS (a stack may not). InputError for devices outside a cluster section or
    of mixed GPU kinds. ``nvls`` None: the NVSwitch's NVLS if the stack runs it
    (:func:`stack_runs_nvls`). The GPU is named as the measured tables name it by the design's
    ``gpu.calibration`` (A100, H100, H200, B200, GB200), else by its compute capability."""
    if len(devices) < 1:
        raise InputError(None, "devices", "expected at least one device")
    nodes: dict[int, int] = {}
    group = design = None
    for d in devices:
        got = system.cluster_node(d)
        if got is None:
            raise InputError(system.spec, d, "expected a GPU of the system's cluster: section")
        node, g = got
        nodes[node] = nodes.get(node, 0) + 1
        dname = system.accelerator(d).designs[0]
        if design is not None and dname != design.name:
            raise InputError(system.spec, d, f"a group of one GPU kind; {d} is {dname!r}, others {design.name!r}")
        design, group = system.designs[dname], g
    if len(set(nodes.values())) != 1:
        raise InputError(system.spec, "devices", f"expected as many ranks on every node, got {sorted(nodes.values())}")
    gpu = design.gpu
    if gpu is None or gpu.compute_capability is None or gpu.nvlinks is None:
        raise InputError(system.spec, f"designs.{design.name}.gpu",
                         "the collective model needs compute_capability and nvlinks of the GPU design")
    ppn = next(iter(nodes.values()))
    n_nodes = len(nodes)
    f = NcclFabric(float(gpu.compute_capability), int(gpu.nvlinks), bool(group.nvls if nvls is None else nvls),
                   float(group.nic.bandwidth), len(devices), n_nodes, ppn, group.cpu_vendor or "intel")
    if n_nodes == 1:
        line = float(group.nvlink.bandwidth)
    elif ppn == 1:
        line = float(group.nic.bandwidth)
    else:  # NCCL's rings leave a node through as many rails as the group has GPUs there
        line = min(float(group.nvlink.bandwidth), ppn * float(group.nic.bandwidth))
    lat = system.route(devices[0], devices[1 % len(devices)]).latency if len(devices) > 1 else 0.0
    measured = tuple(rows) if rows is not None else tuple(load_collective_tables())
    if stack is None and gpu.collective_stack and rows is None:
        known = sorted({r.stack for r in measured})
        if gpu.collective_stack not in known:
            raise InputError(system.spec, f"designs.{design.name}.gpu.collective_stack",
                             f"a stack of the measured collectives (traces/collectives/): one of {', '.join(known)}; "
                             f"got {gpu.collective_stack!r}")
    name = gpu.calibration if gpu.calibration in GPU_COMPUTE_CAPABILITY else ""
    info = SystemInfo(f, line, lat, (gpu.collective_stack or gpu.stack) if stack is None else stack, (), measured,
                      bool(group.nvls), name)
    if n_nodes == 1:
        info = replace(info, systems=MEASURED_SYSTEMS.get((info.gpu_name, bool(group.nvls)), ()))
    if nvls is None and f.nvls:
        info = replace(info, fabric=replace(f, nvls=stack_runs_nvls(info)))
    return info


def with_stack(info: SystemInfo, stack: str | None) -> SystemInfo:
    """``info`` timed by another stack's measurements."""
    return replace(info, stack=stack)
