"""What an LLM search shows its user: the summary as a JSON-ready dict, the top configurations
as text and the convergence figure (the files themselves are written by ``marssim search``)."""

from __future__ import annotations

import math
from pathlib import Path

from marssim.system import System
from marssim.workload import Graph

from .llm import LLMSearchResult
from .report import save_figure

__all__ = ["plot_llm_convergence", "llm_search_summary", "format_top"]


def llm_search_summary(result: LLMSearchResult, graph: Graph, system: System) -> dict:
    """The search in one JSON-ready dict: case, best configuration and its figures (seconds,
    bytes), counts, wall time and its shares."""
    b = result.best
    return {"algorithm": result.algorithm, "objective": result.objective, "seed": result.seed,
            "workload": graph.spec, "system": system.spec, "best": b.config.to_dict(),
            "best_text": b.config.text(), "iteration_s": b.simulated_s, "mfu": b.mfu,
            "ttft_s": None if math.isnan(b.ttft_s) else b.ttft_s,
            "tpot_s": None if math.isnan(b.tpot_s) else b.tpot_s,
            "memory_peak_bytes": b.sim_memory_peak, "exposed_s": b.exposed,
            "screened": result.screened, "rejected_memory": result.rejected_memory,
            "simulations": result.simulations, "wall_s": result.wall_s, "timing_s": result.timing}


def format_top(result: LLMSearchResult, n: int = 10) -> str:
    """The ``n`` best configurations as aligned text (ms, GiB); exposed communication only for
    the groups that have some."""
    table = result.top(n)
    if table.empty:
        return "(no configuration evaluated)"
    heads = {"simulated_ms": "sim ms", "screened_ms": "screen ms", "mfu": "MFU", "memory_peak_GiB": "mem GiB",
             "bubble_ms": "bubble ms"}
    for c in table.columns:
        if c.startswith("exposed_") and (table[c].fillna(0) > 0).any():
            heads[c] = c[len("exposed_"):-len("_ms")] + " ms"
    if table["tpot_ms"].notna().any():
        heads.update(ttft_ms="TTFT ms", tpot_ms="TPOT ms")
    width = max(len("config"), *(len(c) for c in table["config"]))
    lines = [f"{'config':<{width}}" + "".join(f"{h:>11}" for h in heads.values())]
    for row in table.to_dict("records"):
        cells = []
        for c in heads:
            v = row[c]
            cells.append(f"{'-':>11}" if v != v else (f"{v:>11.1%}" if c == "mfu" else f"{v:>11.3f}"))
        lines.append(f"{row['config']:<{width}}" + "".join(cells))
    lines.append("(exposed communication per group and pipeline bubble in ms; '-': screened only, not simulated)")
    return "\n".join(lines)


def plot_llm_convergence(results: list[LLMSearchResult], png: str | Path) -> list[Path]:
    """Best simulated value so far against simulations run, one line per search (the baseline
    grid as a horizontal line); PNG and SVG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4.0))
    objective = results[0].objective
    serving = not math.isnan(results[0].best.tpot_s)
    label = {("latency", False): "iteration time (ms)", ("latency", True): "time per output token (ms)",
             ("throughput", False): "iteration time (ms)", ("throughput", True): "output tokens/s"}[
        (objective, serving)]
    for res in results:
        hist = res.history
        values = [(-v if objective == "throughput" and serving else v * 1e3) for v in hist["best_fitness"]]
        if len(hist) == 1:
            ax.axhline(values[0], ls="--", color="grey", label=f"{res.algorithm} (best simulated)")
        else:
            ax.step(hist["simulations"], values, where="post", marker="o", label=f"{res.algorithm}: best so far")
    ax.set_xlabel("simulations")
    ax.set_ylabel(label)
    ax.set_title(f"LLM parallel-configuration search (seed {results[0].seed})")
    ax.grid(alpha=0.3)
    ax.legend()
    return save_figure(fig, png)
