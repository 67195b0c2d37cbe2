"""Report on a measured calibration table: the fit's held-out error per kernel kind and dtype,
the error on the batch sweep's x2 and x32 variants of each layer predicted from the other rows
(a proxy for the shard shapes a simulation asks for that the table lacks), and ResNet-50 / BERT-base simulated on the 8x H100 topology with it -- do the simulated
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
    from marssim.calibrate.coverage import measured_key
    from marssim.cost import CalibratedCost, DataflowCost, load_table
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
    curve = CalibratedCost(table_path, measured=False, correction=False)
    tg = lower(graph, system, mapping, model)
    result = simulate(tg, system)
    measured = {}
    for r in table.rows:
        if (r.device.lower() == device.lower() or table_path.stem.lower() == device.lower()) and r.phase == "fwd":
            measured.setdefault(r.shape, []).append(r.median_s)
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
        key = measured_key(shard, measured)
        times = measured.get(key) if key is not None else None
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


def batch_variant_errors(table, factor: int, lines: list[str]) -> None:
    """Proxy for the shapes the simulator asks for but the table lacks (a layer's shard at a
    batch or split between or beyond the measured ones): per group, hold out every row whose
    note ends in ``x{factor} N`` / ``x{factor} B`` (the batch sweep's variant of a layer at
    ``factor`` times its batch) together with any row of the same shape, fit curve and
    correction on the rest, and predict the held-out rows. ``factor`` 2 interpolates (x1 and
    x4 of the same layer are fitting rows), 32 extrapolates (x16 is the largest left)."""
    from marssim.calibrate.fitting import TARGETS
    from marssim.cost.calibrated import KEY_GEOMETRY, fit_group, geometry_array, predict
    from marssim.system.describe import format_table

    suffixes = (f" x{factor} N", f" x{factor} B")
    rows_out = []
    for key, rows in sorted(table.groups().items()):
        # held out by GEMM shape: a variant's rows and any row of the same GEMM shape (geometry aside)
        held_keys = {r.shape[:KEY_GEOMETRY] for r in rows if r.note.endswith(suffixes)}
        held = [r for r in rows if r.shape[:KEY_GEOMETRY] in held_keys]
        train = [r for r in rows if r.shape[:KEY_GEOMETRY] not in held_keys]
        if not held or len(train) < 4:
            continue
        args = dict(batch=[r.batch for r in held], m=[r.m for r in held], n=[r.n for r in held],
                    k=[r.k for r in held], flops=[r.flops for r in held], nbytes=[r.bytes for r in held],
                    geometry=geometry_array(held))
        t = np.array([r.median_s for r in held])
        # convolutions with their geometry: also the correction by the GEMM view alone, for comparison
        for label, by_geometry in ((key[1], True), (f"{key[1]} (GEMM view)", False)):
            if not by_geometry and geometry_array(rows) is None:
                continue
            f = fit_group(train, geometry=by_geometry)
            cells = []
            for corrected in (False, True):
                e = np.abs(predict(f, key[1], corrected=corrected, **args) / t - 1)
                cells += [f"{100 * np.median(e):.3g} %", f"{100 * np.percentile(e, 90):.3g} %"]
            cells.append(f"{100 * e.max():.3g} %")
            target = TARGETS.get(key[1])
            met = "" if target is None else ("met" if np.median(e) <= target[0] and np.percentile(e, 90) <= target[1]
                                             else "MISSED")
            rows_out.append([key[0], label, key[2], key[3], str(len(train)), str(len(held)), *cells, met])
    lines.append(f"batch-sweep x{factor} variants predicted from the other rows of their group "
                 f"({'interpolation: x1 and x4 of each layer remain' if factor == 2 else 'extrapolation: x16 is the largest left'}):")
    lines.extend(format_table(["device", "kind", "dtype", "tuning", "fit rows", "held", "curve median", "curve p90",
                               "median", "p90", "max", "target"], rows_out, indent="  "))
    lines.append("")


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
    for factor in (2, 32):
        batch_variant_errors(table, factor, lines)
    from marssim.calibrate.grid import split_workloads

    for spec in split_workloads(args.workloads) if args.workloads.strip() else ():
        simulate_layers(args.table, args.system, spec, lines)
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
