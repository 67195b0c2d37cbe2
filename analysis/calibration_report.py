"""Report on a measured calibration table: the fit's held-out error per kernel kind and dtype,
and ResNet-50 / BERT-base simulated on the 8x H100 topology with it -- do the simulated
per-layer times equal the measured ones for the shapes in the table, and how far is the fitted
curve from them?

    PYTHONPATH=. python analysis/calibration_report.py traces/calibration/H100.csv \
        > analysis/results/calibration_H100.txt

The table's device must be what ``topologies/dgx-h100.yaml`` names in ``gpu.calibration``
(``H100``) -- through the file name or the ``device`` column -- for the simulation to use it;
for another device (an H200 table) pass ``--system`` a topology whose GPU design names it.
``analysis/calibrate_h100.sh`` runs this after measuring and fitting.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
from collections import defaultdict
from pathlib import Path

import numpy as np


def machine() -> str:
    return f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores"


def simulate_layers(table_path: Path, system_name: str, workload: str, lines: list[str]) -> None:
    from marssim.calibrate.coverage import op_shape_key
    from marssim.cost import CalibratedCost, DataflowCost, load_table
    from marssim.cost.calibrated import shape_key
    from marssim.lower import lower
    from marssim.mapping import Mapping
    from marssim.mapping.sharding import split_dim, split_sizes
    from marssim.sim import simulate
    from marssim.system import load_system
    from marssim.taskgraph import COMPUTE
    from marssim.workload import load_workload

    table = load_table(table_path)
    system = load_system(system_name)
    graph = load_workload(workload)
    mapping = Mapping.single_set(graph, system)
    (aset,) = mapping.sets
    design = system.design(aset.devices[0], aset.design)
    device = design.gpu.calibration or ""
    model = DataflowCost(calibration=table_path)
    curve = CalibratedCost(table_path, measured=False)
    tg = lower(graph, system, mapping, model)
    result = simulate(tg, system)
    measured = {}
    for r in table.rows:
        if r.device.lower() == device.lower() or table_path.stem.lower() == device.lower():
            key = shape_key(r.kind, r.dtype, r.batch, r.m, r.n, r.k, r.flops, r.bytes)
            measured.setdefault(key, []).append(r.median_s)
    position = {gi: k for k, gi in enumerate(graph.compute_ops)}
    equal = total = 0
    missing: dict[str, int] = defaultdict(int)
    errors: dict[str, list[float]] = defaultdict(list)
    for t in np.flatnonzero(tg.kind == COMPUTE):
        op = graph.op(tg.op_names[tg.op[t]])
        dim = split_dim(op, mapping.op_sharding[position[graph.index[op.name]]])
        dev = tg.node_names[tg.device[t]]
        shard = op if dim is None else op.with_loops(
            **{dim: split_sizes(op.dim(dim), len(aset.devices))[aset.devices.index(dev)]})
        total += 1
        key = op_shape_key(shard)
        times = measured.get(key)
        if times is None:
            missing[shard.kind.value] += 1
            continue
        equal += int(tg.duration[t] in times)
        errors[key[0]].append(abs(curve.op_time(shard, design) / min(times) - 1))
    lines.append(f"{workload} on {system_name} ({len(aset.devices)} GPUs, data parallel), makespan "
                 f"{result.makespan * 1e6:.1f} us:")
    lines.append(f"  {equal} of {total - sum(missing.values())} compute intervals whose shape the table holds last "
                 f"exactly the measured median; {sum(missing.values())} without a measured shape"
                 + (f" ({', '.join(f'{k} {n}' for k, n in sorted(missing.items()))}: fitted curve or roofline)"
                    if missing else ""))
    for kind, e in sorted(errors.items()):
        lines.append(f"  fitted curve vs measured, {kind:11s}: median {100 * statistics.median(e):.3g} %, max "
                     f"{100 * max(e):.3g} % over {len(e)} intervals")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("table", type=Path)
    parser.add_argument("--system", default="dgx-h100")
    parser.add_argument("--workloads", default="resnet50,resnet50:batch=8,bert-base,bert-base:batch=8",
                        help="workloads to simulate ('' for none: the fit report only)")
    args = parser.parse_args(argv)

    from marssim.calibrate.fitting import fit_report, format_report
    from marssim.calibrate.table import read_comments
    from marssim.cost import load_table

    table = load_table(args.table)
    lines = [f"# calibration report for {args.table} ({len(table)} rows); report computed on {machine()}"]
    lines += read_comments(args.table)
    lines.append("")
    lines.append(format_report(fit_report(table)))
    lines.append("")
    from marssim.calibrate.grid import split_workloads

    for spec in split_workloads(args.workloads) if args.workloads.strip() else ():
        simulate_layers(args.table, args.system, spec, lines)
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
