"""What a search leaves behind: the best mapping (YAML), the history (CSV), a convergence plot,
and the best mapping's full simulation result and Perfetto trace, written into one directory
atomically (it appears whole or not at all)."""

from __future__ import annotations

import json
import math
from pathlib import Path

from marssim.cost.base import CostModel
from marssim.fsutil import staged_dir
from marssim.system import System
from marssim.workload import Graph

from .result import SearchResult

__all__ = ["fitness_display", "plot_convergence", "write_search_outputs", "describe_mapping"]


def fitness_display(objective: str, fitness: float) -> tuple[str, float]:
    """A fitness (the value minimised) as a person reads it: ``(label with unit, value)``."""
    if objective == "latency":
        return "makespan (ms)", fitness * 1e3
    if objective == "throughput":
        return "throughput (samples/s)", 1.0 / fitness if fitness > 0 and math.isfinite(fitness) else 0.0
    if objective == "energy":
        return "energy (mJ)", fitness * 1e3
    if objective == "edp":
        return "energy-delay product (mJ*ms)", fitness * 1e6
    raise ValueError(f"unknown objective {objective!r}")


def plot_convergence(result: SearchResult, png: str | Path) -> list[Path]:
    """Best fitness so far against simulations run (one marker per generation); PNG and SVG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    hist = result.history
    label, _ = fitness_display(result.objective, 1.0)
    best = [fitness_display(result.objective, f)[1] for f in hist["best_fitness"]]
    fig, ax = plt.subplots(figsize=(6.4, 4.0))
    ax.step(hist["simulations"], best, where="post", marker="o", label=f"{result.algorithm}: best so far")
    if "mean_fitness" in hist:
        mean = [fitness_display(result.objective, f)[1] if math.isfinite(f) else float("nan")
                for f in hist["mean_fitness"]]
        ax.plot(hist["simulations"], mean, ls="--", color="grey", label="population mean")
    ax.set_xlabel("simulations")
    ax.set_ylabel(label)
    ax.set_title(f"{result.algorithm} convergence ({len(hist)} generations, seed {result.seed})")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    png = Path(png)
    paths = [png, png.with_suffix(".svg")]
    for p in paths:
        fig.savefig(p, **({"metadata": {"Date": None}} if p.suffix == ".svg" else {}))
    plt.close(fig)
    return paths


def describe_mapping(result: SearchResult, graph: Graph) -> str:
    """One line per set: devices, design and the layer range it runs."""
    m = result.best
    names = [graph.ops[gi].name for gi in graph.compute_ops]
    lines = []
    for i, s in enumerate(m.sets):
        ops = [k for k, si in enumerate(m.op_set) if si == i]
        if not ops:
            continue
        strategies = sorted({m.op_sharding[k] for k in ops})
        devices = s.devices[0] if len(s.devices) == 1 else f"{s.devices[0]}..{s.devices[-1]} ({len(s.devices)})"
        lines.append(f"  set {i}: {devices:<20} {s.design:<10} {names[ops[0]]} .. {names[ops[-1]]} "
                     f"({len(ops)} ops; {', '.join(strategies)})")
    lines.append(f"  micro-batches: {m.micro_batches}")
    return "\n".join(lines)


def write_search_outputs(result: SearchResult, graph: Graph, system: System, cost: CostModel,
                         out: str | Path) -> list[str]:
    """Write into ``out``: ``best_mapping.yaml``, ``search.json`` (summary), ``history.csv``,
    ``convergence.png``/``.svg``, ``result/`` (the best mapping's full simulation,
    :meth:`Result.save`) and ``trace.json`` (Perfetto; skipped with a note when
    :mod:`marssim.trace` is not installed). Returns one line per file for the user."""
    from marssim.lower import lower
    from marssim.mapping import save_mapping
    from marssim.sim import simulate

    out = Path(out)
    lines: list[str] = []
    sim = simulate(lower(graph, system, result.best, cost), system)
    if sim.makespan != result.evaluation.makespan:  # the search's number is a simulation, never an estimate
        raise RuntimeError(f"the best mapping simulates to {sim.makespan} s, the search reported "
                           f"{result.evaluation.makespan} s")
    with staged_dir(out) as tmp:
        save_mapping(result.best, graph, tmp / "best_mapping.yaml")
        lines.append(f"mapping      {out / 'best_mapping.yaml'} (marssim simulate --mapping ...)")
        summary = {
            "algorithm": result.algorithm, "objective": result.objective, "seed": result.seed,
            "fitness": result.fitness, "makespan_s": result.makespan,
            "throughput_samples_per_s": _num(result.evaluation.throughput), "energy_j": _num(result.evaluation.energy),
            "simulations": result.simulations, "estimates": result.estimates, "wall_s": result.wall_s,
            "system": result.best.system, "workload": graph.spec, "mapping_key": result.best.key,
            "notes": {k: str(v) for k, v in result.notes.items()},
        }
        (tmp / "search.json").write_text(json.dumps(summary, indent=2, sort_keys=True) + "\n")
        result.history.to_csv(tmp / "history.csv", index=False)
        lines.append(f"history      {out / 'history.csv'} ({len(result.history)} rows)")
        for p in plot_convergence(result, tmp / "convergence.png"):
            lines.append(f"figure       {out / p.name}")
        sim.save(tmp / "result")
        lines.append(f"result       {out / 'result'}/ (marssim simulate --out format)")
        try:
            from marssim.trace import write_chrome_trace
        except ImportError:
            lines.append("trace        skipped: marssim.trace is not installed in this version")
        else:
            write_chrome_trace(sim, tmp / "trace.json")
            lines.append(f"trace        {out / 'trace.json'} (open in https://ui.perfetto.dev)")
    return lines


def _num(x: float) -> float | None:
    return x if x == x and math.isfinite(x) else None
