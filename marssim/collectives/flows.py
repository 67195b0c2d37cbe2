"""A collective plan as the point-to-point flows it puts on a system: a :class:`~marssim.taskgraph.TaskGraph`
either evaluator runs (``marssim.sim.simulate``, ``marssim.analytical.estimate``).

Each step of the plan is, on every rank, a wait of ``step_latency`` less the route's latency (a
compute task on the rank: NCCL's kernel busy with the step's synchronisation) and then the step's
transfers (:attr:`~marssim.collectives.plan.CollectivePlan.pattern`): ``ring`` -- rank ``i`` sends
``wire_bytes_per_step`` to rank ``i + 1`` (across nodes split over one ring per channel, each
leaving a node on another GPU's rail); ``peers`` -- rank ``i`` sends ``wire_bytes_per_step /
(N - 1)`` to every other rank; ``pair`` -- rank 0 sends to rank 1. A rank's step ``k`` starts when
its own step ``k - 1`` and what it receives in step ``k - 1`` are done (data is forwarded or
reduced step by step). On routes of the plan's line rate and without contention, the simulated
time is the plan's ``time``; where flows share links (a
ring across nodes on a rail-optimised fabric, two collectives at once) it is what the system's
shared links make of them.
"""

from __future__ import annotations

from collections.abc import Sequence

from marssim.errors import InputError
from marssim.taskgraph import TaskGraph, TaskGraphBuilder

from .plan import CollectivePlan

__all__ = ["plan_taskgraph"]


def _rings(plan: CollectivePlan, devices: Sequence[str]) -> list[list[int]]:
    """The rings a ring plan runs (rank indices): one over ``devices`` inside a node; across nodes
    one per channel up to the ranks per node, each visiting a node's ranks rotated by the
    channel, so that each ring leaves a node on another GPU's rail (NCCL's channels leave through
    different NICs)."""
    n = len(devices)
    ppn = n // max(1, plan.nodes)
    if plan.nodes <= 1 or ppn <= 1:
        return [list(range(n))]
    out = []
    for c in range(min(plan.channels, ppn)):
        out.append([node * ppn + (c + k) % ppn for node in range(plan.nodes) for k in range(ppn)])
    return out


def plan_taskgraph(plan: CollectivePlan, system, devices: Sequence[str]) -> TaskGraph:
    """The TaskGraph of ``plan`` over ``devices`` (in ring order) on ``system``."""
    n = len(devices)
    if n != plan.ranks:
        raise InputError(None, "devices", f"the plan is for {plan.ranks} ranks, got {n} devices")
    b = TaskGraphBuilder(system)
    op = f"{plan.kind}.{plan.algorithm}.{plan.protocol}"
    rings = _rings(plan, devices)
    last_send: list[list[int]] = [[] for _ in range(n)]  # per rank: its transfers of the last step
    last_recv: list[list[int]] = [[] for _ in range(n)]  # per rank: the transfers it received
    for _ in range(plan.steps):
        sends: list[list[int]] = [[] for _ in range(n)]
        recvs: list[list[int]] = [[] for _ in range(n)]
        for i in range(n):
            if plan.pattern == "pair" and i != 0:
                continue
            if plan.pattern == "ring":
                targets = [ring[(ring.index(i) + 1) % n] for ring in rings]
            elif plan.pattern == "peers":
                targets = [j for j in range(n) if j != i]
            else:
                targets = [1]
            route = max(system.route(devices[i], devices[j]).latency for j in targets)  # the flow's own latency
            wait = b.compute(devices[i], max(0.0, plan.step_latency - route), preds=last_send[i] + last_recv[i], op=op)
            share = plan.wire_bytes_per_step / len(targets)
            for j in targets:
                t = b.transfer(devices[i], devices[j], share, preds=[wait], op=op, hold=False)
                sends[i].append(t)
                recvs[j].append(t)
        last_send, last_recv = sends, recvs
    return b.build({"collective": plan.kind, "algorithm": plan.algorithm, "protocol": plan.protocol,
                    "model": plan.model})
