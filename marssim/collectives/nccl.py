"""NCCL's own tuning model, as pure functions: which algorithm and protocol NCCL runs a collective
with, and the time it predicts.

Read from NCCL's ``src/graph/tuning.cc`` (``ncclTopoTuneModel``, ``ncclTopoGetAlgoTime``),
``src/graph/search.cc`` (the channel search), ``src/enqueue.cc`` (``topoGetAlgoInfo``) and
``src/graph/topo.h`` of ``github.com/NVIDIA/nccl`` at commit ``5067397c`` (NCCL 2.30.7,
Apache-2.0); the constants below are NCCL's, cited by name. Algorithms: ``ring``, ``tree``
(all-reduce only; a chain inside a node, a binary tree across nodes) and ``nvls`` (NVLink SHARP:
the NVSwitch reduces and multicasts; Hopper and Blackwell NVSwitch systems, inside one node -- across nodes it
needs CollNet, which is not modelled, nor are CollNet and PAT themselves). Protocols: ``LL``
(8-byte lines of 4 data bytes and a 4-byte flag: half the bandwidth, the lowest latency),
``LL128`` (128-byte lines of 120 data bytes) and ``Simple`` (bulk copies with a fence per
step).

For every enabled (algorithm, protocol) NCCL computes a bus bandwidth and a latency at init
(:func:`bandwidths`, :func:`latencies`) and, per call, the time ``latency + bytes / algorithm
bandwidth`` (:func:`algo_time`), and runs the fastest (:func:`choose`). The bus bandwidth starts
from the channel search's result -- channels times the bandwidth of each -- which
:func:`channel_graphs` reproduces for NVSwitch nodes with one NIC per GPU (DGX A100 and H100):

* inside a node, the search takes the first speed of its list (``speedArrayIntra``: 40, 30, 20 ...
  GB/s; Hopper ``sm90SpeedArrayIntra``: 60, 50, 40 ...; Blackwell ``sm100SpeedArrayIntra``: 90, 80,
  70 ...) at which as many channels as the GPU's
  NVLink bandwidth allows (``nvlinks x SM80_NVLINK_BW`` 20 GB/s, ``SM90_NVLINK_BW`` 20.6 GB/s or
  ``SM100_NVLINK_BW`` 40.1 GB/s)
  carry the most bandwidth, then doubles the channels at half the speed
  (``ncclTopoDupChannels``: from 25 GB/s; from Hopper on, from 50 GB/s or with at most 4 channels):
  DGX A100 ring and tree 12 channels x 20 GB/s, DGX H100 12 x 30 GB/s;
* NVLS uses one channel per GPU of the node (``minChannels = maxChannels`` inside a node) at the
  fastest speed the NVLinks carry for all of them, and raises its ``bwInter`` to the top speed in
  the second pass: DGX H100 8 channels of ``bwIntra`` 40, ``bwInter`` 60 GB/s;
* across nodes each channel leaves through a NIC at the fastest inter-node speed it carries
  (``speedArrayInter``; NIC bandwidth ``speed / 8000`` GB/s: 25 for 200 Gb/s HDR, 50 for 400 Gb/s
  NDR), one channel per NIC the communicator's GPUs of a node hold, doubled as above.

This is a model of NCCL's *model*: NCCL uses it to choose, and its times are known to be
optimistic where pipelines do not fill; :mod:`marssim.collectives.plan` builds the plans the
simulator runs on it and the achieved bandwidths measured (:mod:`marssim.collectives.measured`).

Units at the edge are SI (bytes, s, bytes/s); internally NCCL's own: GB/s and microseconds.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

__all__ = ["ALGORITHMS", "PROTOCOLS", "KINDS", "NCCL_COMMIT", "NCCL_VERSION", "NcclFabric", "ChannelGraph",
           "channel_graphs", "bandwidths", "latencies", "algo_time", "choose", "Choice", "nsteps",
           "PROTOCOL_EFFICIENCY", "nvlink_bandwidth", "p2p_time"]

NCCL_COMMIT = "5067397c2676d5aed50042fc39e5c8ee96eb0027"
NCCL_VERSION = "2.30.7"
ALGORITHMS = ("tree", "ring", "nvls")
PROTOCOLS = ("LL", "LL128", "Simple")
KINDS = ("all_reduce", "all_gather", "reduce_scatter")

PROTOCOL_EFFICIENCY = {"LL": 0.5, "LL128": 120.0 / 128.0, "Simple": 1.0}
"""Payload bytes per byte on the wire: LL lines carry 4 data bytes per 8 (device.h), LL128 lines
``NCCL_LL128_DATAELEMS / NCCL_LL128_LINEELEMS`` = 15 of 16 eight-byte words; Simple copies."""

# tuning.cc, ncclTunerConstantsDefaults (us): baseLatencies[algorithm][protocol]
_BASE_LAT = {"tree": (6.8, 14.0, 8.4), "ring": (6.6, 14.0, 8.4), "nvls": (0.0, 0.0, 0.0)}
# hwLatencies[NVLINK | PCI | NET][algorithm][protocol]
_HW_LAT = {
    "nvlink": {"tree": (0.6, 1.25, 4.0), "ring": (0.6, 1.9, 3.4), "nvls": (0.0, 0.0, 25.0)},
    "pci": {"tree": (1.0, 1.9, 4.0), "ring": (1.0, 2.5, 5.7), "nvls": (0.0, 0.0, 0.0)},
    "net": {"tree": (5.0, 8.5, 14.0), "ring": (2.7, 4.0, 14.0), "nvls": (0.0, 0.0, 18.0)},
}
# llMaxBws[index1][nodes index]: single node by GPU generation; multi-node by CPU (0 Intel, 1 AMD)
_LL_MAX_BW = {"volta": (39.0, 39.0, 20.4), "ampere": (87.7, 22.5, 19.0), "hopper": (141.0, 45.0, 35.0),
              "blackwell": (2 * 141.0, 2 * 45.0, 2 * 35.0)}
_LL_MAX_BW_CPU = {"intel": (39.0, 39.0, 20.4), "amd": (87.7, 22.5, 19.0)}
_PER_CH_RING_LL128 = {"ampere": (20.0, 20.0, 20.0), "hopper": (36.7, 36.7, 36.7), "blackwell": (40.0, 40.0, 40.0)}
_PER_CH_TREE_LL128 = {"ampere": (20.0, 20.0, 20.0), "hopper": (36.7, 36.7, 29.0), "blackwell": (55.6, 31.67, 20.0)}
_PER_CH_TREE = {"ampere": (24.0, 23.6, 17.8), "hopper": (38.7, 41.4, 36.0), "blackwell": (70.0, 42.8, 24.0)}
_NVLS_EFFICIENCY = {"ampere": 0.0, "hopper": 0.85, "blackwell": 0.74}  # tuning.cc nvlsEfficiency
# tuning.cc treeCorrectionFactor[protocol][log2(bytes / 64)]
_TREE_CORRECTION = (
    (1.0, 1.0, 1.0, 1.0, .9, .8, .7, .7, .7, .7, .6, .5, .4, .4, .5, .6, .7, .8, .9, 1.0, 1.0, 1.0, 1.0, 1.0),
    (1.0, 1.0, 1.0, 1.0, 1.0, .9, .8, .8, .8, .7, .6, .6, .6, .6, .6, .6, .8, .9, .9, .9, .9, 1.0, 1.0, 1.0),
    (.9, .9, .9, .9, .9, .9, .9, .8, .7, .6, .6, .5, .5, .5, .5, .6, .7, .8, .7, .7, .8, .9, .9, .9),
)
# topo.h: NVLink bandwidth per link, GB/s
_NVLINK_BW = {"volta": 20.0, "ampere": 20.0, "hopper": 20.6, "blackwell": 40.1}
# search.cc speed arrays, GB/s
_SPEEDS_INTRA = {"ampere": (40.0, 30.0, 20.0, 18.0, 15.0, 12.0, 10.0, 9.0, 7.0, 6.0, 5.0, 4.0, 3.0),
                 "hopper": (60.0, 50.0, 40.0, 30.0, 24.0, 20.0, 15.0, 12.0, 11.0, 6.0, 3.0),
                 "blackwell": (90.0, 80.0, 70.0, 60.0, 50.0, 45.0, 40.0, 30.0, 24.0, 20.0, 19.0, 18.0)}
_SPEEDS_INTER = {"ampere": (48.0, 30.0, 28.0, 24.0, 20.0, 18.0, 15.0, 12.0, 10.0, 9.0, 7.0, 6.0, 5.0, 4.0, 3.0, 2.4,
                            1.2, 0.24, 0.12),
                 "hopper": (48.0, 45.0, 42.0, 40.0, 30.0, 24.0, 22.0, 20.0, 17.5, 15.0, 12.0, 6.0, 3.0, 2.4, 1.2, 0.24,
                            0.12),
                 "blackwell": (96.0, 86.0, 80.0, 48.0, 45.1, 42.0, 40.0, 30.0, 24.0, 22.0, 20.0, 17.5, 15.0, 12.0, 6.0,
                               3.0, 2.4, 1.2, 0.24, 0.12)}
_MAX_RING_CHANNELS = 32  # init.cc: ringGraph->maxChannels = MAXCHANNELS / 2
_NVLS_MAX_ARITY = 32  # device.h NCCL_MAX_NVLS_ARITY
_NTHREADS = {"LL": 512, "LL128": 640, "Simple": 512}  # NCCL_LL_MAX_NTHREADS, NCCL_LL128_MAX_NTHREADS, SIMPLE
_THREAD_THRESHOLD = {"LL": 8, "LL128": 8, "Simple": 64}  # comm.h NCCL_*_THREAD_THRESHOLD


def arch_of(compute_capability: float) -> str:
    """NCCL's generation index of a compute capability (``minCompCap >= 100``: Blackwell, ``>= 90``:
    Hopper ...)."""
    cc = int(round(10 * compute_capability))
    return "blackwell" if cc >= 100 else "hopper" if cc >= 90 else "ampere" if cc >= 80 else "volta"


def nvlink_bandwidth(compute_capability: float) -> float:
    """NCCL's bandwidth of one NVLink (GB/s; ``ncclTopoNVLinkBw``): 20 on Ampere, 20.6 on Hopper,
    40.1 on Blackwell."""
    return _NVLINK_BW[arch_of(compute_capability)]


@dataclass(frozen=True)
class NcclFabric:
    """What NCCL's topology detection sees of a communicator, in SI units.

    ``compute_capability`` (8.0, 9.0, 10.0), ``nvlinks`` per GPU (NVLink to an NVSwitch; 0: none),
    ``nvls`` (the NVSwitch reduces and multicasts), ``nic_bandwidth`` (bytes/s per direction of one
    NIC), ``ranks`` and ``nodes`` of the communicator (ranks spread evenly), ``nics_per_node``
    (NICs the communicator's GPUs of one node own: one per GPU on a rail-optimised DGX),
    ``cpu_vendor`` (``intel`` or ``amd``)."""

    compute_capability: float
    nvlinks: int
    nvls: bool
    nic_bandwidth: float
    ranks: int
    nodes: int = 1
    nics_per_node: int = 1
    cpu_vendor: str = "intel"

    @property
    def arch(self) -> str:
        return arch_of(self.compute_capability)

    @property
    def ppn(self) -> float:
        """Ranks per node."""
        return self.ranks / self.nodes


@dataclass(frozen=True)
class ChannelGraph:
    """A channel search's result: ``channels`` of ``bw_intra`` and ``bw_inter`` GB/s each."""

    channels: int
    bw_intra: float
    bw_inter: float


def _dup(channels: int, bw: float, arch: str, limit: int) -> tuple[int, float]:
    """``ncclTopoDupChannels``: twice the channels at half the speed (within ``limit``)."""
    if bw < 25.0 or (arch in ("hopper", "blackwell") and bw < 50.0 and channels > 4):  # ccMin > 80
        return channels, bw
    dup = min(2 * channels, limit)
    return dup, bw / math.ceil(dup / channels)


def _search(channels_at, speeds: tuple[float, ...]) -> tuple[int, float]:
    """The channel search (search.cc, pass 1): from the fastest speed at which a channel fits
    (``channels_at(speed)`` channels fit), the speed with the most ``channels x speed``, trying
    lower speeds while each is more than 0.49 of the first that fitted."""
    best = (0, 0.0)
    first = None
    for s in speeds:
        if first is not None and s / first <= 0.49:
            break
        n = channels_at(s)
        if n <= 0:
            continue
        if first is None:
            first = s
        if n * s > best[0] * best[1] + 1e-9:
            best = (n, s)
    return best


def channel_graphs(f: NcclFabric) -> dict[str, ChannelGraph]:
    """The ring, tree and NVLS channel graphs NCCL's search finds on ``f`` (see the module
    docstring); NVLS only on a single NVLS node with at least two channels."""
    arch = f.arch
    out: dict[str, ChannelGraph] = {}
    intra_total = f.nvlinks * _NVLINK_BW[arch]
    if f.nodes == 1:  # every channel through the GPU's NVLinks to the NVSwitch
        n, bw = _search(lambda s: min(_MAX_RING_CHANNELS, int(intra_total // s + 1e-9)), _SPEEDS_INTRA[arch])
        n, bw = _dup(n, bw, arch, _MAX_RING_CHANNELS)
        out["ring"] = out["tree"] = ChannelGraph(n, bw, bw)
        if f.nvls and arch in ("hopper", "blackwell"):
            heads = min(_NVLS_MAX_ARITY, f.ranks)
            speed = next((s for s in _SPEEDS_INTRA[arch] if heads * s <= intra_total + 1e-9), 0.0)
            if heads >= 2 and speed > 0:
                out["nvls"] = ChannelGraph(heads, speed, _SPEEDS_INTRA[arch][0])
        return out
    nic = f.nic_bandwidth / 1e9  # every channel through one NIC of the node
    n, bw = _search(lambda s: min(_MAX_RING_CHANNELS, f.nics_per_node * int(nic // s + 1e-9)), _SPEEDS_INTER[arch])
    n, bw = _dup(n, bw, arch, _MAX_RING_CHANNELS)
    out["ring"] = out["tree"] = ChannelGraph(n, bw, bw)
    return out


def nsteps(kind: str, ranks: int) -> int:
    """NCCL's steps of a ring collective: ``2 (N - 1)`` all-reduce, ``N - 1`` all-gather and
    reduce-scatter."""
    if kind == "all_reduce":
        return 2 * (ranks - 1)
    if kind in ("all_gather", "reduce_scatter"):
        return ranks - 1
    raise ValueError(f"unknown collective {kind!r}; expected one of {', '.join(KINDS)}")


def _index2(nodes: int) -> int:
    return 0 if nodes <= 1 else 1 if nodes == 2 else 2


def bandwidths(kind: str, f: NcclFabric, graphs: dict[str, ChannelGraph] | None = None) -> dict[tuple[str, str], float]:
    """NCCL's algorithm bandwidth (GB/s) of each enabled (algorithm, protocol) for ``kind`` on
    ``f`` (``ncclTopoTuneModel``: the bus bandwidth with its refinements, converted to the
    algorithm's bandwidth). Disabled combinations are left out."""
    graphs = graphs if graphs is not None else channel_graphs(f)
    arch, nodes, ranks = f.arch, f.nodes, f.ranks
    i2 = _index2(nodes)
    ll_max = (_LL_MAX_BW[arch] if nodes == 1 else _LL_MAX_BW_CPU[f.cpu_vendor])[i2]
    steps = nsteps(kind, ranks)
    out: dict[tuple[str, str], float] = {}
    for a in ALGORITHMS:
        g = graphs.get(a)
        if g is None or g.channels == 0:
            continue
        if kind != "all_reduce" and a == "tree":
            continue
        if a == "nvls" and nodes > 1:  # NVLS across nodes needs CollNet: not modelled
            continue
        for p in PROTOCOLS:
            if a == "nvls" and p != "Simple":
                continue
            bw = g.bw_intra if nodes <= 2 else g.bw_inter
            if a == "nvls":
                intra = g.bw_intra * _NVLS_EFFICIENCY[arch] * (g.channels - 1) / g.channels
                intra *= 2.0 if kind == "all_reduce" else (f.ppn - 1) / f.ppn
                bw = min(intra, g.bw_inter)
            bus = g.channels * bw
            if a == "ring" and p == "LL":
                bus = min(ll_max, bus * 0.5)
            if a == "ring" and p == "LL128":
                bus = min(bus * 0.92, g.channels * _PER_CH_RING_LL128[arch][i2])
            if a == "tree" and kind == "all_reduce":
                bus = min(bus * 0.92, g.channels * _PER_CH_TREE[arch][i2])
            if a == "tree" and p == "LL":
                bus = min(bus / 3.8, ll_max)
            if a == "tree" and p == "LL128":
                bus = min(bus * (7.0 / 9.0 if nodes == 1 else 120.0 / 128.0), g.channels * _PER_CH_TREE_LL128[arch][i2])
            if a == "ring" or (a == "nvls" and kind == "all_reduce"):  # bus to algorithm bandwidth
                bus *= ranks / steps
            elif kind == "all_reduce":
                bus *= 0.5
            out[(a, p)] = bus
    return out


def _net_overhead(f: NcclFabric) -> float:
    return 2.0 if f.cpu_vendor == "amd" else 1.0


def latencies(kind: str, f: NcclFabric, graphs: dict[str, ChannelGraph] | None = None) -> dict[tuple[str, str], float]:
    """NCCL's latency (us) of each (algorithm, protocol) for ``kind`` on ``f``
    (``ncclTopoTuneModel``), with no extra inter-node graph latency (``latencyInter`` 0)."""
    graphs = graphs if graphs is not None else channel_graphs(f)
    nodes, ranks = f.nodes, f.ranks
    intra_hw = "nvlink" if f.nvlinks > 0 else "pci"
    steps = nsteps(kind, ranks)
    out: dict[tuple[str, str], float] = {}
    for a in ALGORITHMS:
        if a not in graphs:
            continue
        for pi, p in enumerate(PROTOCOLS):
            base = _BASE_LAT[a][pi]
            intra = _HW_LAT[intra_hw][a][pi]
            inter = _HW_LAT["net"]["tree" if f.ppn == 1 else a][pi]
            if a == "ring":
                hw = _HW_LAT[intra_hw if nodes == 1 else "net"][a][pi]
                net = 0.0
                if nodes > 1:
                    net = _net_overhead(f) * (3 if p == "Simple" else 1)
                intra_lat = max(intra, net)
                inter_steps = 0 if nodes == 1 else (2 * (nodes - 1) if kind == "all_reduce" else nodes - 1)
                inter_lat = inter if nodes > 1 else hw
                out[(a, p)] = base + (steps - inter_steps) * intra_lat + inter_steps * inter_lat
            elif a == "tree":
                out[(a, p)] = base + 2 * ((ranks // nodes - 1) * intra + int(math.log2(nodes)) * inter)
            else:  # nvls
                out[(a, p)] = intra + (inter if nodes > 1 else 0.0)
    return out


def algo_time(kind: str, a: str, p: str, nbytes: float, f: NcclFabric, bw: float, lat: float) -> float:
    """``ncclTopoGetAlgoTime`` in microseconds: the latency plus ``nbytes / bw`` with NCCL's
    corrections (trees at medium sizes; the ring's latency plateau across nodes)."""
    log_size = int(math.log2(max(1, int(nbytes) >> 6))) if nbytes >= 64 else -1
    if a == "tree" and kind == "all_reduce" and 0 <= log_size < 23:
        bw *= _TREE_CORRECTION[PROTOCOLS.index(p)][log_size]
    if a == "ring" and p == "Simple" and f.nodes > 1 and kind == "all_reduce":
        channels = channel_graphs(f)["ring"].channels
        if nbytes / (channels * f.ranks) >= 64:
            lat *= 1.9 if f.compute_capability < 8.0 else 1.4
    return lat + nbytes / (1000.0 * bw)


@dataclass(frozen=True)
class Choice:
    """What NCCL runs: ``algorithm``, ``protocol``, its bus ``channels`` and per-channel
    bandwidth, the algorithm bandwidth (bytes/s), latency (s) and predicted ``time`` (s)."""

    algorithm: str
    protocol: str
    channels: int
    algo_bandwidth: float
    latency: float
    time: float


def choose(kind: str, nbytes: float, f: NcclFabric) -> Choice:
    """The (algorithm, protocol) NCCL picks for ``kind`` of ``nbytes`` (the larger of the send and
    receive buffers, as nccl-tests report sizes) on ``f``: the least ``algo_time``
    (``topoGetAlgoInfo``); ties to the earlier algorithm and protocol as NCCL iterates."""
    if f.ranks < 2:
        return Choice("ring", "Simple", 1, math.inf, 0.0, 0.0)
    graphs = channel_graphs(f)
    bws = bandwidths(kind, f, graphs)
    lats = latencies(kind, f, graphs)
    best = None
    for a in ALGORITHMS:
        for p in PROTOCOLS:
            bw = bws.get((a, p))
            if not bw:
                continue
            t = algo_time(kind, a, p, nbytes, f, bw, lats[(a, p)])
            if best is None or t < best[0]:
                best = (t, a, p, bw)
    assert best is not None
    t, a, p, bw = best
    return Choice(a, p, graphs[a].channels, bw * 1e9, lats[(a, p)] * 1e-6, t * 1e-6)


def p2p_time(nbytes: float, f: NcclFabric) -> tuple[str, float, float]:
    """A send/receive between two ranks: ``(protocol, bandwidth bytes/s, latency s)``. NCCL runs
    peer-to-peer transfers outside the tuning model (``enqueue.cc``: LL up to
    ``NCCL_P2P_LL_THRESHOLD`` 16 KiB per channel, else Simple), over NVLink inside a node (the
    GPU's NVLink bandwidth) and one NIC across nodes; the latency taken is the ring's one-step
    latency of that protocol on that transport (``hwLatencies``) plus the ring's base latency."""
    protocol = "LL" if nbytes <= 16384 else "Simple"
    pi = PROTOCOLS.index(protocol)
    if f.nodes == 1:
        bw = f.nvlinks * _NVLINK_BW[f.arch] * 1e9
        hw = _HW_LAT["nvlink" if f.nvlinks else "pci"]["ring"][pi]
    else:
        bw = f.nic_bandwidth
        hw = _HW_LAT["net"]["ring"][pi]
    bw *= PROTOCOL_EFFICIENCY[protocol]
    return protocol, bw, (_BASE_LAT["ring"][pi] + hw) * 1e-6
