"""How a search's outcome reads: the fitness in a person's units, the best mapping by set, the
convergence plot, and the summary that ``marssim search --out`` writes as ``search.json``."""

from __future__ import annotations

import math
from pathlib import Path

from marssim.workload import Graph

from .result import SearchResult

__all__ = ["fitness_display", "plot_convergence", "describe_mapping", "search_summary"]


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
    return save_figure(fig, png)


def save_figure(fig, png: str | Path) -> list[Path]:
    """Save ``fig`` as ``png`` and beside it as SVG (no date in the SVG, so a rerun writes the
    same bytes), close it, and return both paths."""
    import matplotlib.pyplot as plt

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


def search_summary(result: SearchResult, graph: Graph) -> dict:
    """What ``search.json`` holds: algorithm, objective, seed, fitness, makespan (s), throughput
    (samples/s), energy (J), simulations, estimates, wall time (s), system, workload, mapping key
    and notes (JSON-ready: NaN and infinities become null)."""
    return {
        "algorithm": result.algorithm, "objective": result.objective, "seed": result.seed,
        "fitness": result.fitness, "makespan_s": result.makespan,
        "throughput_samples_per_s": _num(result.evaluation.throughput), "energy_j": _num(result.evaluation.energy),
        "simulations": result.simulations, "estimates": result.estimates, "wall_s": result.wall_s,
        "system": result.best.system, "workload": graph.spec, "mapping_key": result.best.key,
        "notes": {k: str(v) for k, v in result.notes.items()},
    }


def _num(x: float) -> float | None:
    return x if x == x and math.isfinite(x) else None
