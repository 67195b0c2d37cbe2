"""``marssim cost WORKLOAD --system SYSTEM``: per-layer time on each design of a system.

Shows which design suits which layer -- the premise of computation-aware accelerator
selection -- using the default cost model (dataflow-aware analytical models; GPU designs
calibrated from ``traces/calibration/`` where a table for their device exists). For GPU designs
whose table holds some of the layers' shapes, a second table puts the measured time beside the
modelled one (the fitted curve, or the analytical roofline where a kind has no fit) with their
relative difference; the per-layer times of the first table are the measured ones there.
"""

from __future__ import annotations

import argparse
import csv
import math
import statistics

from ._common import add_cost_args, cost_model, positive_int

VERB = "cost"
ORDER = 30


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        VERB, help="per-layer time of a workload on one accelerator of each design of a system",
        description="Time every GEMM-like layer (conv, gemm, matmul; every op with --all) of WORKLOAD on one "
                    "accelerator of each design of SYSTEM with the default cost model, mark the fastest design "
                    "per layer (*), and total the whole workload per design. Times in microseconds.")
    p.add_argument("workload", metavar="WORKLOAD", help="zoo spec like resnet50:batch=8 or an .onnx file")
    p.add_argument("--system", required=True, metavar="SYSTEM", help="system YAML or shipped name (marssim systems)")
    p.add_argument("--batch", type=positive_int, help="override the workload's batch")
    p.add_argument("--all", dest="all_ops", action="store_true", help="list every compute op, not only GEMM-like ones")
    p.add_argument("--energy", action="store_true",
                   help="also print each layer's energy per design (uJ: compute + SRAM + DRAM) and its "
                        "DRAM traffic, where designs have energy figures")
    p.add_argument("--csv", metavar="FILE", help="write the table (seconds, joules and their parts, DRAM bytes, model "
                                                 "per design) as CSV")
    add_cost_args(p)
    p.set_defaults(func=run)


def _shape(op) -> str:
    g, m, n, k = op.gemm_view()
    if op.is_gemm_like:
        return f"{m}x{n}x{k}" + (f" x{g}" if g > 1 else "")
    return "x".join(str(v) for v in op.out_shape)


TIMED_BY = ("measured = the median of a measured kernel of the shape; interpolated = between measured fused "
            "attention kernels of the shape's slice (heads, key/value heads, cache type) in log space, or a linear "
            "layer's GEMM between the measured GEMMs of a grid (tokens, width, depth) in log space; extrapolated = "
            "a context attention kernel past the longest measured prompt, as its s^2 products, or a decode kernel "
            "past the longest measured cache of its line; derived = a fused "
            "attention backward: its measured or interpolated forward twin times FlashAttention-3's published "
            "backward/forward time ratio; rescaled = a causal prompt attention kernel (forward or backward) as the "
            "design's attention kernel set times it (gpu.attention_kernels: a training stack's published rates); "
            "fitted = the efficiency curve fitted to the measurements, with its local correction; gpu-roofline = the "
            "analytical curve (no calibration data for the kind)")
"""What each :attr:`~marssim.cost.base.OpCost.model` of a GPU design means, for the reports."""


def _us(seconds: float) -> str:
    return f"{seconds * 1e6:.4g}"


def format_costs(result, workload: str, system_name: str, *, energy: bool = False) -> str:
    """The text table of a :class:`~marssim.cost.report.DesignCosts`."""
    from marssim.tables import format_table

    names = list(result.design_names)
    gpus = [j for j, d in enumerate(result.designs) if d.dataflow == "gpu"]
    by = ["timed by"] if gpus else []
    headers = ["layer", "kind", "MxNxK", "GFLOP", *[f"{n} us" for n in names], *by, "best"]
    rows = []
    for layer in result.layers:
        times = layer.times
        best = layer.fastest
        cells = [_us(t) + ("*" if j == best else "") for j, t in enumerate(times)]
        how = ["/".join(layer.costs[j].model for j in gpus)] if gpus else []
        rows.append([layer.op.name, layer.op.kind.value, _shape(layer.op), f"{layer.op.flops / 1e9:.4g}", *cells,
                     *how, names[best]])
    blank = [""] * len(by)
    totals = result.total_time()
    best_total = int(totals.argmin()) if len(totals) else 0
    rows.append(["total", "", "", f"{sum(layer.op.flops for layer in result.layers) / 1e9:.4g}",
                 *[_us(t) + ("*" if j == best_total else "") for j, t in enumerate(totals)], *blank,
                 names[best_total]])
    rows.append(["fastest on", "", "", "", *[str(w) for w in result.wins()], *blank, ""])
    if energy:
        e = result.total_energy()
        rows.append(["energy uJ", "", "", "", *[_uj(v) for v in e], *blank, ""])
    lines = [f"{workload} on {system_name}: time per layer (us) on one accelerator of each design, "
             f"* marks the fastest; total = the listed layers one after another", ""]
    lines += format_table(headers, rows, indent="")
    if gpus:
        lines.append("")
        lines.append(f"timed by ({', '.join(names[j] for j in gpus)}): {TIMED_BY}")
    if energy:
        lines += ["", *format_energy(result)]
    lines.append("")
    lines.append("designs: " + "; ".join(f"{n} on {h} ({d.dataflow})"
                                          for n, h, d in zip(names, result.hosts, result.designs)))
    return "\n".join(lines)


def _uj(joules: float) -> str:
    return "-" if math.isnan(joules) else f"{joules * 1e6:.4g}"


def format_energy(result) -> list[str]:
    """Per layer and design: energy (uJ) as compute + SRAM + DRAM, and DRAM traffic (MB); the
    totals per design and their parts."""
    from marssim.system.describe import format_table

    names = list(result.design_names)
    headers = ["layer", *[f"{n} uJ" for n in names], *[f"{n} DRAM MB" for n in names]]
    rows = []
    for layer in result.layers:
        rows.append([layer.op.name, *[_uj(c.energy) for c in layer.costs],
                     *[f"{c.dram_bytes / 1e6:.4g}" for c in layer.costs]])
    parts = {"compute": "energy_compute", "SRAM": "energy_sram", "DRAM": "energy_dram"}
    for label, attr in parts.items():
        totals = [sum(getattr(layer.costs[j], attr) for layer in result.layers) for j in range(len(names))]
        rows.append([f"total {label} uJ", *[_uj(v) for v in totals], *[""] * len(names)])
    dram = [sum(layer.costs[j].dram_bytes for layer in result.layers) for j in range(len(names))]
    rows.append(["total uJ", *[_uj(v) for v in result.total_energy()], *[f"{v / 1e6:.4g}" for v in dram]])
    lines = ["energy per layer (uJ) = compute (MACs, static power) + SRAM (buffer reads and writes) + DRAM "
             "(reads and writes); DRAM traffic in MB"]
    sources = sorted({d.energy.source for d in result.designs if d.energy is not None and d.energy.source})
    lines += [f"energy figures: {src}" for src in sources]
    lines.append("")
    return lines + format_table(headers, rows, indent="")


def _calibration_notes(model, result, dtypes) -> list[str]:
    """One line per GPU-class design: which kernel kinds are fitted to measurements, which analytical."""
    from marssim.cost.features import KERNEL_KIND_OF, KERNEL_KINDS

    pairs = sorted({(KERNEL_KINDS[KERNEL_KIND_OF[layer.op.kind]], layer.op.math_dtype) for layer in result.layers})
    several = len({dt for _, dt in pairs}) > 1  # name the dtype too (an FP8 run's gemm fp8 and gemm bf16)
    kinds = [f"{k} {dt}" if several else k for k, dt in pairs]
    notes = []
    for name, d in zip(result.design_names, result.designs):
        cov = model.coverage(d, dtypes=dtypes)
        if not cov:
            continue
        status = {}
        for label, (k, dt) in zip(kinds, pairs):  # the coverage of this kind in this dtype
            status[label] = next((part for part in cov[k].split("; ") if part.startswith(dt + ":")), cov[k])
        fitted = [k for k in kinds if ": fitted" in status[k] or "fitted" in status[k].split(":")[-1]]
        measured_only = [k for k in kinds if k not in fitted and "measured shapes" in status[k]]
        fallback = [k for k in kinds if k not in fitted and k not in measured_only]
        label = d.gpu.calibration or "none"
        source = f"table {label!r}" + (f" (stack {d.gpu.stack!r})" if d.gpu.stack else "")
        if fitted or measured_only:
            parts = []
            if fitted:
                parts.append(f"measured shapes and fitted curves from {source} for {', '.join(fitted)}")
            if measured_only:
                parts.append(f"measured shapes from {source}, too few rows to fit, for "
                             f"{', '.join(measured_only)}")
            if fallback:
                parts.append(f"analytical GPU roofline (no calibration data) for {', '.join(fallback)}")
            grid = next((part for part in cov.get("attention", "").split("; ")
                         if part.startswith("fused attention interpolated")), "")
            if grid and any(layer.op.param("fused") for layer in result.layers):
                parts.append(grid)
            notes.append(f"{name}: " + "; ".join(parts))
        else:
            notes.append(f"{name}: analytical GPU roofline (no calibration table for {label!r} in "
                         f"traces/calibration/)")
    return notes


def measured_vs_modelled(model, result) -> dict[str, list[tuple[int, float, float]]]:
    """Per GPU design with measured layers: ``[(layer index, measured s, modelled s)]`` for the
    layers whose kernel shape its table holds (modelled: the curve alone, measured shapes
    ignored). Empty for models without measured tables."""
    out: dict[str, list[tuple[int, float, float]]] = {}
    if not hasattr(model, "measured_time"):
        return out
    for name, d in zip(result.design_names, result.designs):
        if d.dataflow != "gpu" or not d.gpu.calibration:
            continue
        pairs = []
        for i, layer in enumerate(result.layers):
            t = model.measured_time(layer.op, d)
            if t is not None:
                pairs.append((i, t, model.curve_cost(layer.op, d).time))
        if pairs:
            out[name] = pairs
    return out


def format_measured(result, comparison: dict[str, list[tuple[int, float, float]]]) -> str:
    """The measured-vs-modelled table of each GPU design (see :func:`measured_vs_modelled`)."""
    from marssim.tables import format_table

    lines = []
    for name, pairs in comparison.items():
        d = result.designs[result.design_names.index(name)]
        rows = []
        diffs = []
        for i, measured, modelled in pairs:
            op = result.layers[i].op
            diff = modelled / measured - 1.0
            diffs.append(abs(diff))
            rows.append([op.name, op.kind.value, _shape(op), _us(measured), _us(modelled), f"{100 * diff:+.1f}"])
        lines.append("")
        lines.append(f"{name}: measured vs modelled per layer (us) for the {len(pairs)} of {len(result.layers)} "
                     f"layers whose shape the table {d.gpu.calibration!r} holds; the table above uses the measured "
                     f"time{_unless_rescaled(d)}; modelled = the fitted curve (analytical roofline for kinds without a "
                     f"fit)")
        lines.append("")
        lines += format_table(["layer", "kind", "MxNxK", "measured us", "model us", "diff %"], rows, indent="")
        lines.append(f"|model / measured - 1|: median {100 * statistics.median(diffs):.2g} %, "
                     f"max {100 * max(diffs):.2g} %")
    return "\n".join(lines)


def write_csv(result, path: str, comparison: dict[str, list[tuple[int, float, float]]] | None = None) -> None:
    from marssim.fsutil import atomic_file

    comparison = comparison or {}
    by_design = {name: {i: (meas, mod) for i, meas, mod in pairs} for name, pairs in comparison.items()}
    with atomic_file(path, newline="") as fh:
        w = csv.writer(fh)
        header = ["op", "kind", "workload_model", "batch", "m", "n", "k", "flops"]
        for name in result.design_names:
            header += [f"{name}_s", f"{name}_j", f"{name}_model", f"{name}_j_compute", f"{name}_j_sram",
                       f"{name}_j_dram", f"{name}_dram_bytes"]
            if name in by_design:
                header += [f"{name}_measured_s", f"{name}_modelled_s"]
        header.append("fastest")
        w.writerow(header)
        for li, layer in enumerate(result.layers):
            op = layer.op
            g, m, n, k = op.gemm_view()
            row = [op.name, op.kind.value, op.model, g, m, n, k, op.flops]
            for name, c in zip(result.design_names, layer.costs):
                row += [repr(c.time), repr(c.energy), c.model, repr(c.energy_compute), repr(c.energy_sram),
                        repr(c.energy_dram), repr(c.dram_bytes)]
                if name in by_design:
                    pair = by_design[name].get(li)
                    row += [repr(pair[0]), repr(pair[1])] if pair else ["", ""]
            row.append(result.design_names[layer.fastest])
            w.writerow(row)


def run(args: argparse.Namespace) -> int:
    from marssim.cost.report import design_costs
    from marssim.errors import InputError
    from marssim.system import load_system
    from marssim.workload import load_workload

    from ._common import check_output_file

    check_output_file(args.csv, "--csv", (".csv",))
    system = load_system(args.system)
    graph = load_workload(args.workload, batch=args.batch)
    model = cost_model(args)
    result = design_costs(graph, system, model, all_ops=args.all_ops)
    if not result.designs:
        raise InputError(args.system, "designs", "no accelerator of this system takes any of its designs")
    print(format_costs(result, graph.spec, system.name, energy=args.energy))
    dtypes = tuple(sorted({op.math_dtype for op in graph.ops}))  # the types kernels compute in (an FP8 GEMM: fp8)
    for note in _calibration_notes(model, result, dtypes):
        print(note)
    comparison = measured_vs_modelled(model, result)
    if comparison:
        print(format_measured(result, comparison))
    if args.csv:
        write_csv(result, args.csv, comparison)
        print(f"\ntable     {args.csv}")
    return 0


def _unless_rescaled(design) -> str:
    """What the comparison's note adds for a design whose prompt attention a kernel set times."""
    kernels = design.gpu.attention_kernels if design.gpu is not None else None
    return f" (fused prompt attention: kernel set {kernels!r}, 'rescaled')" if kernels else ""
