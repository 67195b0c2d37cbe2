"""A collective of a lowering: the plan of a group of a system's GPUs, and one step of it on the
route a rank's transfer takes. What both lowerings (``marssim.lower`` for per-op mappings,
``marssim.parallel.lower`` for parallel configurations) and the closed-form screen call.

    plan = group_plan(system, ["gpu0", "gpu1", "gpu2", "gpu3"], "all_reduce", 48 * 2**20)
    hop = hop_step(plan, bottleneck=300e9, route_latency=0.47e-6)
    hop.latency, hop.factor, hop.time   # s, x, s

:func:`group_plan` is :func:`~marssim.collectives.plan.plan_collective` on the group (NCCL's
algorithm and protocol, its steps, timed from the stack's measured collectives, the model fitted
to them, or NCCL's own model), memoised per system and group shape (GPU design, ranks, nodes,
ranks per node); ``None`` where the group is not one the collective model describes (GPUs outside
a ``cluster:`` section, several GPU kinds, uneven ranks per node): the lowering then keeps its
own schedule at the links' line rate.

A lowering expresses a plan as ``plan.steps`` steps in which each rank sends
``plan.payload_per_step`` bytes to its ring neighbour. :func:`hop_step` says how one such step
runs on a route of bottleneck ``bottleneck`` (bytes/s, what the route's most loaded resource gives
one flow) and latency ``route_latency`` so that, alone on its links, it takes the plan's time per
step ``plan.time / plan.steps``:

* ``latency``: the plan's per-step latency (NCCL's latency and the measured overhead per call,
  spread over the steps), never less than the route's own;
* ``factor``: the flows' worth each byte of the step puts on every resource of the route, so that
  ``payload_per_step x factor / bottleneck`` is the rest of the step. Above 1 where NCCL does not
  reach the link's line rate (protocol overhead, the measured efficiency); below 1 where the
  lowering's one ring crosses a link that NCCL's channels spread over several (a ring leaving a
  node of several GPUs of the group through one GPU's adapter, where NCCL's rings leave through
  each GPU's own);
* ``time``: ``latency + payload_per_step x factor / bottleneck``.

Alone on its links a step takes exactly the plan's time (tested). Where other flows share them,
the fair-share network slows it as it slows any flow of that weight: an approximation of NCCL,
whose kernels leave what they do not use of a link to others; the latency is not shared.

In a switched node (NVSwitch) a rank's port carries the same bytes whether a step sends them to
one peer or spreads them over all (NVLS, the tree's fan-out), so every plan is expressed as a ring
of its steps (exact there; on a mesh of point-to-point links, MI300X's, a ring uses one link per
step where RCCL's rings use several, ``docs/parallelism.md``).
"""

from __future__ import annotations

import weakref
from collections.abc import Sequence
from dataclasses import dataclass


from .plan import CollectivePlan, SystemInfo, plan_collective, ring_steps, system_info

__all__ = ["Hop", "RingTime", "group_plan", "group_info", "hop_step", "ring_time", "route_bottleneck",
           "plan_schedule"]

_INFOS: "weakref.WeakKeyDictionary[object, dict]" = weakref.WeakKeyDictionary()


@dataclass(frozen=True)
class Hop:
    """One step of a plan on one route (see the module docstring): ``latency`` s, ``factor``
    flows' worth per byte, ``time`` s alone on its links."""

    latency: float
    factor: float
    time: float


def _shape(system, devices: Sequence[str]) -> tuple | None:
    """(design, ranks, nodes, ranks per node) of a group of a cluster's GPUs; None outside one."""
    nodes: dict[int, int] = {}
    design = None
    for d in devices:
        got = system.cluster_node(d)
        if got is None:
            return None
        nodes[got[0]] = nodes.get(got[0], 0) + 1
        name = system.accelerator(d).designs[0]
        if design is not None and name != design:
            return None
        design = name
    if len(set(nodes.values())) != 1:
        return None
    return design, len(devices), len(nodes), next(iter(nodes.values()))


def group_info(system, devices: Sequence[str]) -> SystemInfo | None:
    """:func:`~marssim.collectives.plan.system_info` of the group ``devices``, memoised per system
    and group shape; None where the collective model does not describe the group (see the module
    docstring)."""
    cache = _INFOS.get(system)
    if cache is None:
        cache = _INFOS[system] = {}
    group = ("group", tuple(devices))
    shape = cache[group] if group in cache else cache.setdefault(group, _shape(system, devices))
    if shape is None or shape[1] < 2:
        return None
    key = shape
    if key not in cache:
        gpu = system.designs[shape[0]].gpu
        described = gpu is not None and gpu.compute_capability is not None and gpu.nvlinks is not None
        # a design NCCL's model cannot describe keeps the line rate; any other bad input (an unknown
        # collective stack) is the user's to fix
        cache[key] = system_info(system, list(devices)) if described else None
    return cache[key]


def group_plan(system, devices: Sequence[str], kind: str, nbytes: float) -> CollectivePlan | None:
    """The plan of collective ``kind`` (``all_reduce``, ``all_gather``, ``reduce_scatter``,
    ``send_recv``) of ``nbytes`` (nccl-tests' size: the all-reduce buffer, the all-gather output,
    the reduce-scatter input, the bytes sent) over ``devices``; None where the model does not
    describe the group. Memoised per system, group shape, kind and size."""
    info = group_info(system, devices)
    if info is None or nbytes <= 0:
        return None
    cache = _INFOS[system]
    key = ("plan", kind, float(nbytes), info)
    hit = cache.get(key)
    if hit is None:
        hit = cache[key] = plan_collective(kind, float(nbytes), len(devices), info)
    return hit


def route_bottleneck(capacity, resources: Sequence[int], weights: Sequence[float] = ()) -> float:
    """Bytes/s one flow gets alone on a route: the smallest capacity over weight of its
    resources (``capacity``: bytes/s per resource index; weights: one each when empty)."""
    if not resources:
        return float("inf")
    if weights:
        return min(float(capacity[r]) / w for r, w in zip(resources, weights))
    return min(float(capacity[r]) for r in resources)


def hop_step(plan: CollectivePlan, bottleneck: float, route_latency: float) -> Hop:
    """One step of ``plan`` on a route of ``bottleneck`` bytes/s and ``route_latency`` s (see the
    module docstring)."""
    step = plan.time / plan.steps
    latency = max(plan.step_latency, route_latency)
    busy = step - latency
    if busy <= 0.0 or bottleneck == float("inf") or plan.payload_per_step <= 0:
        return Hop(latency, 1.0, latency + (plan.payload_per_step / bottleneck if bottleneck else 0.0))
    factor = busy * bottleneck / plan.payload_per_step
    return Hop(latency, factor, latency + plan.payload_per_step * factor / bottleneck)


@dataclass(frozen=True)
class RingTime:
    """A collective run over a ring of hops, alone on its links: ``seconds`` in all; ``nbytes``,
    the bytes each rank sends its neighbour over the steps, weighted as the steps' flows weigh on
    the links (:attr:`Hop.factor`), so that at the slowest hop's bandwidth they take ``seconds``
    less ``latency``; ``latency``, the seconds of the steps' latencies."""

    seconds: float
    nbytes: float
    latency: float


def ring_time(kind: str, size: float, ranks: int, hops, plan: CollectivePlan | None = None) -> RingTime:
    """Collective ``kind`` of ``size`` bytes (nccl-tests' size) over ``ranks`` ranks whose ring
    has the hops ``hops`` (``(latency s, bottleneck bytes/s)`` each): ``plan``'s steps (NCCL's,
    :func:`group_plan`) each at the pace of the slowest hop (:func:`hop_step`); without a plan,
    ring steps (:func:`~marssim.collectives.plan.ring_steps`) of ``size / ranks`` bytes at the
    slowest hop's latency and line rate. What the lowerings, the closed-form screen and the
    serving iteration model all charge for one collective."""
    if plan is None:
        steps = ring_steps(kind, ranks)
        chunk = size / ranks
        lat, bw = max(hops, key=lambda h: h[0] + (chunk / h[1] if chunk > 0 else 0.0))
        return RingTime(steps * (lat + (chunk / bw if chunk > 0 else 0.0)), steps * chunk, steps * lat)
    hop = max((hop_step(plan, bw, lat) for lat, bw in hops), key=lambda h: h.time)
    return RingTime(plan.steps * hop.time, plan.steps * plan.payload_per_step * hop.factor, plan.steps * hop.latency)


def plan_schedule(plan: CollectivePlan, system, devices: Sequence[str]) -> list[list[tuple[int, int, float]]]:
    """``plan`` as a schedule of ring steps over ``devices`` (ring order) for a lowering whose
    transfers take the system's own routes (:mod:`marssim.collectives.schedules`' format: per
    step, flows ``(src rank, dst rank, bytes)``): ``plan.steps`` steps in which rank ``i`` sends
    to rank ``i + 1`` (a send/receive: rank 0 to rank 1) the bytes that, at its route's rate after its route's latency, take the
    step's time (:func:`hop_step`; the step's latency beyond the route's is carried as bytes at the
    route's rate: exact alone on the links, shared as bytes where other flows share them)."""
    n = len(devices)
    cap = system.resource_capacity
    step = []
    for i in range(1 if plan.pattern == "pair" else n):  # a send/receive: rank 0 to rank 1
        route = system.route(devices[i], devices[(i + 1) % n])
        bw = route_bottleneck(cap, route.resources)
        hop = hop_step(plan, bw, route.latency)
        step.append((i, (i + 1) % n, max(0.0, hop.time - route.latency) * bw if bw != float("inf") else 0.0))
    return [list(step) for _ in range(plan.steps)]
