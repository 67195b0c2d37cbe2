"""The MARS experiment (Shen et al., DAC 2023) on marssim's models.

For each zoo workload (ResNet-50, VGG-16, MobileNetV2, BERT-base, GPT-2, ViT-B/16) and each
multi-model mix, on the adaptive 16-accelerator system (``topologies/mars-adaptive-16.yaml``),
with the default cost model: the latency (simulated makespan) of

* ``data_parallel``: every layer split over the batch on all 16 accelerators, one design;
* ``h2h``: H2H (DAC 2022), every layer whole on one accelerator, greedy + two refinement passes;
* ``random``: as many uniformly drawn mappings, simulated, as the GA evaluated (its simulations
  plus its analytical estimates: random search gets at least the GA's evaluation budget);
* ``mars``: the two-level GA with its default configuration, seeded with ``data_parallel`` and
  ``h2h`` (the runs above, not repeated).

The paper reports 32.2% lower latency than its baseline on average over typical DNNs, and 59.4%
lower than the prior state of the art (H2H) on heterogeneous multi-model workloads. Here the
reduction is ``1 - mars / baseline``, averaged over the single models against data_parallel
and over the mixes against h2h.

Run: ``PYTHONPATH=. python analysis/reproduce_mars.py [--batch 8] [--workers 2]``; writes
``analysis/results/reproduce_mars[-TAG].txt`` (the table, with the machine), ``.csv`` and a bar
chart ``.png``/``.svg``. Every number is a simulation; same seed, same numbers.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time
from pathlib import Path

import pandas as pd

from marssim.cost import default_cost_model
from marssim.search import SearchSettings, run_algorithm
from marssim.search.parallel import open_executor
from marssim.search.runner import SEED_BASELINES
from marssim.system import load_system
from marssim.workload import load_workload, zoo_entries

ROOT = Path(__file__).resolve().parents[1]
SYSTEM = ROOT / "topologies" / "mars-adaptive-16.yaml"
SINGLE = ("resnet50", "vgg16", "mobilenetv2", "bert-base", "gpt2", "vit-b16")
MIXES = ("mix-vision", "mix-nlp-vision", "mix-transformers")
PAPER = {"vs_data_parallel": 32.2, "vs_h2h_multi_model": 59.4}


def machine() -> str:
    return f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}"


def run_case(name: str, batch: int, settings: SearchSettings, executor, log) -> dict:
    graph = load_workload(f"{name}:batch={batch}")
    system = load_system(SYSTEM)
    cost = default_cost_model()
    row: dict = {"workload": graph.spec, "kind": "multi-model" if zoo_entries()[name].multi_model else "single",
                 "gmacs": graph.macs / 1e9}
    results = {}
    for algorithm in ("data_parallel", "h2h", "mars", "random"):
        run_settings = settings
        if algorithm == "random":
            from dataclasses import replace

            run_settings = replace(settings, budget=max(1, results["mars"].simulations + results["mars"].estimates))
        t0 = time.perf_counter()
        r = run_algorithm(algorithm, graph, system, cost, run_settings, executor=executor, baselines=results)
        results[algorithm] = r
        row[f"{algorithm}_ms"] = r.makespan * 1e3
        row[f"{algorithm}_simulations"] = r.simulations
        row[f"{algorithm}_wall_s"] = time.perf_counter() - t0
        log(f"  {algorithm:<14}{r.makespan * 1e3:>11.4f} ms {r.simulations:>6} sims {r.estimates:>6} est "
            f"{row[f'{algorithm}_wall_s']:>7.1f} s")
    mars = results["mars"]
    row["mars_estimates"] = mars.estimates
    row["mars_generations"] = len(mars.history)
    best = mars.best
    row["mars_mapping"] = (f"{len(best.sets)} sets ({'/'.join(str(len(s.devices)) for s in best.sets)} acc; "
                           f"{'/'.join(s.design for s in best.sets)}), {best.micro_batches} micro-batches, "
                           f"strategies {'/'.join(sorted(set(best.op_sharding)))}")
    for base in ("data_parallel", "h2h", "random"):
        row[f"reduction_vs_{base}_pct"] = (1.0 - mars.makespan / results[base].makespan) * 100.0
    return row


def table_text(frame: pd.DataFrame, args, wall: float) -> str:
    lines = [f"machine: {machine()}; workers: {args.workers}; seed {args.seed}",
             f"system: {SYSTEM.relative_to(ROOT)}; cost model: marssim.cost.default_cost_model; "
             f"batch {args.batch}; GA: default configuration, seeded with {' and '.join(SEED_BASELINES)}",
             f"total wall time {wall / 60:.1f} min", "",
             f"{'workload':<30}{'data_par ms':>12}{'h2h ms':>11}{'random ms':>11}{'mars ms':>10}"
             f"{'vs dp':>8}{'vs h2h':>8}{'vs rand':>8}{'GA sims':>8}{'GA est':>8}{'GA s':>7}{'rand s':>7}"]
    for r in frame.itertuples():
        lines.append(f"{r.workload:<30}{r.data_parallel_ms:>12.3f}{r.h2h_ms:>11.3f}{r.random_ms:>11.3f}"
                     f"{r.mars_ms:>10.3f}{-r.reduction_vs_data_parallel_pct:>+7.1f}%"
                     f"{-r.reduction_vs_h2h_pct:>+7.1f}%{-r.reduction_vs_random_pct:>+7.1f}%"
                     f"{r.mars_simulations:>8d}{r.mars_estimates:>8d}{r.mars_wall_s:>7.0f}{r.random_wall_s:>7.0f}")
    lines.append("")
    lines.append("best GA mappings:")
    for r in frame.itertuples():
        lines.append(f"  {r.workload:<30}{r.mars_mapping}")
    single = frame[frame["kind"] == "single"]
    multi = frame[frame["kind"] == "multi-model"]
    lines.append("")
    lines.append("latency reduction of mars (1 - mars / baseline), averaged:")
    if len(single):
        lines.append(f"  vs data_parallel over {len(single)} single models: "
                     f"{single['reduction_vs_data_parallel_pct'].mean():.1f}% "
                     f"(range {single['reduction_vs_data_parallel_pct'].min():.1f}% .. "
                     f"{single['reduction_vs_data_parallel_pct'].max():.1f}%; paper: {PAPER['vs_data_parallel']}%)")
        lines.append(f"  vs random (as many simulations as the GA's evaluations) over single models: "
                     f"{single['reduction_vs_random_pct'].mean():.1f}%")
    if len(multi):
        lines.append(f"  vs h2h over {len(multi)} multi-model mixes: {multi['reduction_vs_h2h_pct'].mean():.1f}% "
                     f"(range {multi['reduction_vs_h2h_pct'].min():.1f}% .. {multi['reduction_vs_h2h_pct'].max():.1f}%; "
                     f"paper: {PAPER['vs_h2h_multi_model']}%)")
        lines.append(f"  vs data_parallel over the mixes: {multi['reduction_vs_data_parallel_pct'].mean():.1f}%")
    return "\n".join(lines)


def bar_chart(frame: pd.DataFrame, stem: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker
    import numpy as np

    algorithms = [("data_parallel", "#9e9e9e"), ("h2h", "#e69f00"), ("random", "#56b4e9"), ("mars", "#009e73")]
    x = np.arange(len(frame))
    width = 0.2
    fig, ax = plt.subplots(figsize=(max(7.0, 1.1 * len(frame) + 2), 4.2))
    for i, (name, color) in enumerate(algorithms):
        values = frame[f"{name}_ms"] / frame["data_parallel_ms"]
        ax.bar(x + (i - 1.5) * width, values, width, label=name, color=color)
    ax.axhline(1.0, color="black", lw=0.6)
    ax.set_yscale("log")
    ax.set_yticks([0.25, 0.5, 1, 2, 4])
    ax.yaxis.set_major_formatter(matplotlib.ticker.FormatStrFormatter("%g"))
    ax.yaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
    ax.set_ylim(min(0.2, float(frame["mars_ms"].div(frame["data_parallel_ms"]).min()) * 0.8),
                max(4.5, float(frame[["h2h_ms", "random_ms"]].max(axis=1).div(frame["data_parallel_ms"]).max()) * 1.2))
    ax.set_ylabel("latency / data_parallel latency (log scale)")
    ax.set_xticks(x)
    ax.set_xticklabels([w.split(":")[0] for w in frame["workload"]], rotation=20, ha="right")
    ax.set_title(title)
    ax.legend(ncols=4, fontsize=8, loc="upper left")
    ax.grid(axis="y", alpha=0.3, which="both")
    fig.tight_layout()
    fig.savefig(stem.with_suffix(".png"), dpi=120)
    fig.savefig(stem.with_suffix(".svg"), metadata={"Date": None})
    plt.close(fig)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--workloads", default=",".join(SINGLE + MIXES), help="comma-separated zoo names")
    p.add_argument("--tag", default="", help="suffix of the output files")
    p.add_argument("--out", default=str(ROOT / "analysis" / "results"))
    p.add_argument("--replot", action="store_true", help="only redraw the chart from the CSV of an earlier run")
    args = p.parse_args(argv)
    stem = Path(args.out) / ("reproduce_mars" + (f"-{args.tag}" if args.tag else ""))
    stem.parent.mkdir(parents=True, exist_ok=True)
    title = f"MARS GA vs baselines on mars-adaptive-16, batch {args.batch} (simulated latency)"
    if args.replot:
        bar_chart(pd.read_csv(stem.with_suffix(".csv")), stem, title)
        return
    settings = SearchSettings(seed=args.seed)
    rows = []
    t0 = time.perf_counter()

    def log(text: str) -> None:
        print(text, file=sys.stderr, flush=True)

    with open_executor(args.workers) as executor:
        for name in args.workloads.split(","):
            log(f"{name}:batch={args.batch}")
            rows.append(run_case(name.strip(), args.batch, settings, executor, log))
            frame = pd.DataFrame(rows)
            frame.to_csv(stem.with_suffix(".csv"), index=False)  # partial results survive an interruption
    frame = pd.DataFrame(rows)
    text = table_text(frame, args, time.perf_counter() - t0)
    stem.with_suffix(".txt").write_text(text + "\n")
    bar_chart(frame, stem, title)
    print(text)


if __name__ == "__main__":
    main()
