"""The collective model against the measured curves it was not fitted to.

:func:`heldout_check` takes measured rows and, per curve of a machine a shipped cluster's node
stands for (:data:`~marssim.collectives.plan.MEASURED_SYSTEMS`), predicts every size from 1 MiB
to 1 GiB three ways and returns the errors ``predicted / measured - 1``:

* ``nccl``: NCCL's own model on the hardware as described;
* ``fitted``: the plan (:func:`~marssim.collectives.plan.plan_collective`) with the curve held out
  of the measured rows: NCCL's model with the achieved efficiency fitted to the other curves of
  the same stack, GPU, transport and family (a curve alone in its family: fitted on every second
  size of it, the others predicted). Whether the stack runs NVLS is decided on all its curves
  (:func:`~marssim.collectives.plan.stack_runs_nvls`): a property of the stack;
* ``interpolated``: each size from its own curve with that size held out (what the plan is
  charged inside a measured curve).

``analysis/collectives_check.py`` prints them (and simulates the plans); the tests check the
median target on the shipped tables.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

from .measured import CollectiveRow, configurations, interpolate
from .plan import CollectivePlan, MEASURED_SYSTEMS, achieved_for, plan_collective, system_info

__all__ = ["LO", "HI", "SHIPPED", "CurveCheck", "heldout_check", "group_devices"]

LO, HI = 2 ** 20, 2 ** 30
_CLUSTERS = {"A100": "dgx-a100-cluster:nodes=1", "H100": "dgx-h100-cluster:nodes=1",
             "H200": "dgx-h200-cluster:nodes=1", "B200": "dgx-b200-cluster:nodes=1", "GB200": "gb200-nvl72:racks=1",
             "B300": "dgx-b300-cluster:nodes=1", "GB300": "gb300-nvl72:racks=1"}
SHIPPED = {name: _CLUSTERS[gpu] for (gpu, _), names in MEASURED_SYSTEMS.items() for name in names}
"""The shipped cluster whose node each measured machine stands for."""


@dataclass
class CurveCheck:
    """One measured curve: its key (system, gpu, stack, collective, ranks, ranks per node), the
    rows checked, the plans made for them (held out), and the errors per method."""

    key: tuple
    rows: list[CollectiveRow]
    plans: list[CollectivePlan] = field(default_factory=list)
    errors: dict[str, list[float]] = field(default_factory=dict)
    achieved: object = None
    nvls: bool = False


def group_devices(ranks: int, ranks_per_node: int, gpus_per_node: int = 8) -> list[str]:
    """Device ids of a group of ``ranks`` with ``ranks_per_node`` on each node of a cluster."""
    nodes = ranks // ranks_per_node
    return [f"gpu{node * gpus_per_node + k}" for node in range(nodes) for k in range(ranks_per_node)]


def heldout_check(rows: Sequence[CollectiveRow], load_system: Callable[[str], object]) -> list[CurveCheck]:
    """The checks of every single-node curve of a machine in :data:`SHIPPED` (see the module
    docstring), in curve order; ``load_system(spec)`` gives the shipped cluster."""
    rows = tuple(rows)
    out = []
    systems: dict[str, object] = {}
    for key, curve in sorted(configurations(rows).items()):
        system, gpu, stack, coll, ranks, ppn = key
        if system not in SHIPPED or ranks != ppn:
            continue
        pts = [r for r in curve if LO <= r.bytes <= HI]
        if not pts:
            continue
        spec = SHIPPED[system]
        sysobj = systems.get(spec) or systems.setdefault(spec, load_system(spec))
        info = replace(system_info(sysobj, group_devices(ranks, ppn), stack=stack, rows=rows), systems=(system,))
        p2p = coll == "send_recv"
        family = [r for r in rows if (r.system, r.gpu, r.stack) == (system, gpu, stack)
                  and (r.collective == "send_recv") == p2p and r.nodes == 1 and r.config != key]
        kept = tuple(r for r in rows if r.config != key)
        if not family:  # alone in its family: fit on every second size, predict the others
            held = {r.bytes for i, r in enumerate(curve) if i % 2 == 1}
            kept += tuple(r for r in curve if r.bytes not in held)
            pts = [r for r in pts if r.bytes in held]
        held_info = replace(info, rows=kept)
        check = CurveCheck(key, pts, achieved=achieved_for(held_info, coll), nvls=info.fabric.nvls)
        errors: dict[str, list[float]] = {"nccl": [], "fitted": [], "interpolated": []}
        for r in pts:
            plan = plan_collective(coll, r.bytes, ranks, held_info)
            check.plans.append(plan)
            errors["nccl"].append(plan.nccl_time / r.time_s - 1)
            errors["fitted"].append(plan.time / r.time_s - 1)
            i = curve.index(r)
            if 0 < i < len(curve) - 1:
                t = interpolate(curve[:i] + curve[i + 1:], r.bytes)
                if t is not None:
                    errors["interpolated"].append(t / r.time_s - 1)
        check.errors = errors
        out.append(check)
    return out
