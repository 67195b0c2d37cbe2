"""The collective model against measured collectives: NCCL's own model, the plans
:func:`marssim.collectives.plan_collective` gives (timed from measurements held out of what is
predicted), and the simulation of those plans as point-to-point flows on the shipped clusters.

    PYTHONPATH=. python analysis/collectives_check.py > analysis/results/collectives_check.txt

Data: ``traces/collectives/`` (Vidur's torch.distributed profiles, stack ``vidur-2024``; XLA's H100
table, stack ``xla-2025``; AIConfigurator's NCCL and engine all-reduce curves on A100, H100, H200,
B200, B300, GB200 and GB300, stacks ``nccl-2.27.3``, ``nccl-2.29.2``, ``trtllm-1.3.0rc20``, ``vllm-0.24.0``,
``sglang-0.5.14``), sizes from 1 MiB to 1 GiB. Per measured curve (system, stack,
collective, ranks, ranks per node), the errors ``|predicted / measured - 1|`` of:

* ``nccl``: NCCL's own model (:mod:`marssim.collectives.nccl`), as NCCL computes it to choose, on
  the hardware as described (NVLS where the NVSwitch has it);
* ``fitted``: the plan's time from NCCL's model with the achieved efficiency (overhead per call,
  fraction of NCCL's bandwidth) fitted to the *other* curves of the same stack, GPU, transport and
  family -- the curve itself held out; a curve alone in its family is fitted on its other sizes
  (every second size held out). Whether the stack runs NVLS is decided on all its curves
  (:func:`marssim.collectives.plan.stack_runs_nvls`: a property of the stack, which the sources do
  not record);
* ``interpolated``: the plan's time from the curve itself, each size predicted from the sizes
  around it with that size held out (what a plan inside a measured curve is charged);
* ``simulated``: the ``fitted`` plan's flows (:func:`marssim.collectives.flows.plan_taskgraph`)
  simulated on the shipped cluster (``marssim.sim.simulate``): equal to ``fitted`` where no two
  flows share a link, so the difference is contention on the system's links;
* ``lowered``: the ``fitted`` plan as the lowerings run it -- ring steps whose bytes take the
  plan's time per step on the system's routes (:func:`marssim.collectives.group.plan_schedule`,
  the per-op lowering's form; the parallel lowering's steps take the same time alone on their
  links, ``tests/test_megatron_iteration.py``) -- expanded (``marssim.lower.expand_collective``)
  and simulated.

Curves of machines the shipped systems do not describe (Azure's PCIe boxes with NVLink pairs; the
two-node rows over a network the source does not describe) are listed apart, and only the NCCL
model is applied to them, on the cluster with that GPU.
"""

from __future__ import annotations

import os
import platform
import sys
import time

import numpy as np


def _stats(errors) -> tuple[float, float]:
    e = np.abs(np.asarray(errors, dtype=float))
    return float(np.median(e)), float(np.percentile(e, 90))


def _pct(x: float) -> str:
    return f"{100 * x:.1f} %"


def _lowered(plan, system, devices) -> float:
    """Seconds the simulation gives ``plan`` as the lowerings run it (see the module docstring)."""
    from marssim.collectives.group import plan_schedule
    from marssim.lower import expand_collective
    from marssim.sim import simulate
    from marssim.taskgraph import TaskGraphBuilder

    b = TaskGraphBuilder(system)
    steps = plan_schedule(plan, system, devices)
    expand_collective(b, plan.kind, plan.algorithm, tuple(devices), steps, [()] * len(devices), plan.nbytes)
    return simulate(b.build(), system, record=False, setup=False).makespan


PUBLISHED = {"published": "Vidur's and XLA's tables (stacks vidur-2024, xla-2025)",
             "aiconfigurator": "AIConfigurator's (NCCL 2.27.3 and 2.29.2, the engines' own all-reduces)"}


def _group(stack: str) -> str:
    return "published" if stack in ("vidur-2024", "xla-2025") else "aiconfigurator"


def main() -> int:
    from marssim.collectives.flows import plan_taskgraph
    from marssim.collectives.measured import configurations, load_collective_tables
    from marssim.collectives.plan import plan_collective, system_info
    from marssim.collectives.validate import HI, LO, SHIPPED, group_devices, heldout_check
    from marssim.sim import simulate
    from marssim.system import load_system
    from marssim.system.describe import format_table

    t0, c0 = time.perf_counter(), time.process_time()
    rows = load_collective_tables()
    cache: dict[str, object] = {}

    def system(spec: str):
        return cache.get(spec) or cache.setdefault(spec, load_system(spec))

    lines = [f"collectives_check: the collective model against measured collectives, {LO >> 20} MiB to "
             f"{HI >> 30} GiB ({platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
             f"Python {platform.python_version()})", ""]
    table, fits = [], []
    methods = ("nccl", "fitted", "interpolated", "simulated", "lowered")
    pooled: dict[str, dict[str, list[float]]] = {group: {name: [] for name in methods} for group in PUBLISHED}
    by_stack: dict[tuple[str, str], list[float]] = {}
    for check in heldout_check(rows, system):
        sys_name, gpu, stack, coll, ranks, ppn = check.key
        sysobj = system(SHIPPED[sys_name])
        devices = group_devices(ranks, ppn)
        errors = dict(check.errors)
        errors["simulated"] = [simulate(plan_taskgraph(plan, sysobj, devices), sysobj, record=False,
                                        setup=False).makespan / r.time_s - 1 for plan, r in zip(check.plans, check.rows)]
        errors["lowered"] = [_lowered(plan, sysobj, devices) / r.time_s - 1 for plan, r in zip(check.plans, check.rows)]
        cells = [sys_name, stack, coll, str(ranks), str(len(check.rows)),
                 ", ".join(sorted({f"{p.algorithm}/{p.protocol}" for p in check.plans}))]
        for name in ("nccl", "fitted", "interpolated", "simulated", "lowered"):
            if errors[name]:
                m, p = _stats(errors[name])
                cells += [_pct(m), _pct(p)]
                pooled[_group(stack)][name] += [abs(e) for e in errors[name]]
            else:
                cells += ["-", "-"]
        by_stack.setdefault((gpu, stack), []).extend(abs(e) for e in errors["fitted"])
        table.append(cells)
        a = check.achieved
        fits.append([sys_name, stack, "p2p" if coll == "send_recv" else "collectives", f"{coll} {ranks}",
                     "-" if a is None else f"{1e6 * a.overhead:.1f} us",
                     "-" if a is None else f"{a.bandwidth_fraction:.2f}",
                     "-" if coll == "send_recv" else ("yes" if check.nvls else "no"), "-" if a is None else str(a.points)])
    lines.append("1. Curves of the shipped systems' nodes (one node): median and p90 of |predicted / measured - 1|")
    lines.append("")
    lines.extend(format_table(["system", "stack", "collective", "ranks", "sizes", "plan's algorithm/protocol",
                               "nccl median", "p90", "fitted median", "p90", "interp. median", "p90",
                               "simulated median", "p90", "lowered median", "p90"], table, indent="  "))
    lines.append("")
    for group, what in PUBLISHED.items():
        lines.append(f"  pooled over every size of the curves of {what}:")
        for name in methods:
            m, p = _stats(pooled[group][name])
            targeted = group == "published" and name in ("fitted", "simulated", "lowered")
            target = "  (target: median <= 10 %)" if targeted else ""
            lines.append(f"    {name:13s} {len(pooled[group][name]):4d} sizes  median {_pct(m):>7s}  "
                         f"p90 {_pct(p):>7s}{target}")
    for (gpu, stack), es in sorted(by_stack.items()):
        m, p = _stats(es)
        lines.append(f"    fitted, {gpu} {stack}: {len(es)} sizes, median {_pct(m)}, p90 {_pct(p)}")
    lines.append("")
    lines.append("2. The achieved efficiency each held-out curve was predicted with (fitted on the other curves of its "
                 "stack, GPU and family; alone in its family: on its other sizes), and whether the stack runs NVLS "
                 "(decided on all its curves)")
    lines.append("")
    lines.extend(format_table(["system", "stack", "family", "held out", "overhead per call", "x NCCL's bw", "NVLS",
                               "points"], fits, indent="  "))
    lines.append("")
    apart = []
    for key, curve in sorted(configurations(rows).items()):
        sys_name, gpu, stack, coll, ranks, ppn = key
        if sys_name in SHIPPED and ranks == ppn:
            continue
        pts = [r for r in curve if LO <= r.bytes <= HI]
        spec = f"{'dgx-h100-cluster' if gpu == 'H100' else 'dgx-a100-cluster'}:nodes={max(1, ranks // ppn)}"
        info = system_info(system(spec), group_devices(ranks, ppn), stack=None, rows=())
        err = [plan_collective(coll, r.bytes, ranks, info).nccl_time / r.time_s - 1 for r in pts]
        m, p = _stats(err)
        why = "network not described by the source" if sys_name.endswith("+net") else "machine not a shipped system"
        apart.append([sys_name, stack, coll, str(ranks), str(ppn), str(len(pts)), _pct(m), _pct(p),
                      f"{100 * float(np.median(err)):+.0f} %", why])
    lines.append("3. Curves of machines or networks the shipped systems do not describe: NCCL's model on the cluster of "
                 "that GPU (signed: predicted / measured - 1)")
    lines.append("")
    lines.extend(format_table(["system", "stack", "collective", "ranks", "per node", "sizes", "nccl median", "p90",
                               "signed median", "why apart"], apart, indent="  "))
    lines.append("")
    lines.append("4. Plans across nodes on the shipped clusters (NCCL's model: no measurement of their networks), "
                 "simulated as flows: NCCL's channels leave each node on different rails")
    lines.append("")
    multi = []
    for spec, ranks, ppn in (("dgx-a100-cluster:nodes=2", 16, 8), ("dgx-a100-cluster:nodes=2", 2, 1),
                             ("dgx-h100-cluster:nodes=2", 16, 8), ("dgx-h100-cluster:nodes=4", 32, 8),
                             ("dgx-b200-cluster:nodes=2", 16, 8)):
        sysobj = system(spec)
        devices = group_devices(ranks, ppn)
        info = system_info(sysobj, devices)
        for nbytes in (2 ** 20, 2 ** 24, 2 ** 28, 2 ** 30):
            plan = plan_collective("all_reduce", nbytes, devices, info)
            sim = simulate(plan_taskgraph(plan, sysobj, devices), sysobj, record=False, setup=False).makespan
            low = _lowered(plan, sysobj, devices)
            multi.append([spec, f"{ranks} ({ppn}/node)", f"{nbytes >> 20} MiB", f"{plan.algorithm}/{plan.protocol}",
                          plan.model, f"{1e6 * plan.time:.1f}", f"{1e6 * sim:.1f}", f"{100 * (sim / plan.time - 1):+.1f} %",
                          f"{100 * (low / plan.time - 1):+.1f} %"])
    lines.extend(format_table(["system", "ranks", "all-reduce", "algorithm/protocol", "model", "plan us", "simulated us",
                               "simulated / plan - 1", "lowered / plan - 1"], multi, indent="  "))
    lines.append("")
    lines.append("5. The tensor-parallel all-reduce of a GPT-3 175B layer (2,048 tokens x 12,288 x 2 bytes = 48 MiB) on "
                 "4 GPUs of one node, as the shipped clusters plan it:")
    for spec in ("dgx-a100-cluster:nodes=1", "dgx-h100-cluster:nodes=1", "dgx-h200-cluster:nodes=1",
                 "dgx-b200-cluster:nodes=1", "dgx-b300-cluster:nodes=1", "gb200-nvl72:racks=1", "gb300-nvl72:racks=1"):
        devices = group_devices(4, 4)
        info = system_info(system(spec), devices)
        plan = plan_collective("all_reduce", 2048 * 12288 * 2, devices, info)
        lines.append(f"  {spec} (stack {info.stack}): {plan.algorithm}/{plan.protocol}, {plan.model}, "
                     f"{1e3 * plan.time:.3f} ms (NCCL's own model {1e3 * plan.nccl_time:.3f} ms; at the NVLink line "
                     f"rate {1e3 * 2 * 3 / 4 * 2048 * 12288 * 2 / info.line_bandwidth:.3f} ms)")
    lines.append("")
    lines.append(f"wall {time.perf_counter() - t0:.1f} s, CPU {time.process_time() - c0:.1f} s")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
