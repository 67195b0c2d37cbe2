"""``marssim search`` and ``marssim compare`` for an LLM workload on a GPU cluster: the search
over parallel configurations (:mod:`marssim.search.llm`) instead of the per-op mapping GA."""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from marssim.errors import InputError

if TYPE_CHECKING:
    from marssim.cost.base import CostModel
    from marssim.search.llm import LLMSearchResult
    from marssim.system import System
    from marssim.workload import Graph

LLM_ALGORITHMS = ("mars", "megatron_grid")
"""What ``--algorithm`` may name for an LLM on a GPU cluster."""


def add_llm_args(p: argparse.ArgumentParser) -> None:
    """Flags that apply to an LLM workload on a GPU cluster only."""
    from .search import positive_float
    from ._common import positive_int

    p.add_argument("--global-batch", dest="global_batch", type=positive_int, metavar="N",
                   help="LLM training: sequences per iteration (default: the workload's batch)")
    p.add_argument("--ttft-bound", dest="ttft_bound", type=positive_float, metavar="SECONDS",
                   help="LLM serving with --objective throughput: only configurations whose time to first token "
                        "is at most this count (a constraint, not a weighted sum)")


def llm_settings(args: argparse.Namespace, graph):
    """:class:`LLMSearchSettings` from the flags; InputError for flags that do not apply."""
    from marssim.search.llm import LLMSearchSettings

    t = graph.meta["transformer"]
    if args.objective not in ("latency", "throughput"):
        raise InputError(None, "--objective", f"an LLM search minimises latency (training: iteration time; serving: "
                                              f"time per output token) or maximises throughput; got {args.objective}")
    if args.ttft_bound is not None and (t.mode != "serve" or args.objective != "throughput"):
        raise InputError(None, "--ttft-bound", "applies to a serving workload (mode=serve) with --objective "
                                               "throughput")
    if args.global_batch is not None and not t.training:
        raise InputError(None, "--global-batch", "applies to a training workload (mode=train)")
    s = LLMSearchSettings(objective=args.objective, ttft_bound=args.ttft_bound, global_batch=args.global_batch or 0,
                          seed=args.seed)
    changes = {k: v for k, v in (("generations", args.generations), ("population", args.population),
                                 ("max_simulations", args.budget), ("time_limit_s", args.time_limit)) if v}
    if not getattr(args, "seed_baseline", True):
        changes["seed_with_grid"] = False
    return replace(s, **changes)


def _parts(args: argparse.Namespace) -> int:
    return 1 if args.workers == 1 else (args.workers or os.cpu_count() or 1) * (4 if args.dask else 1)


def _progress(args: argparse.Namespace):
    if args.quiet or not sys.stderr.isatty():
        return None

    def show(row: dict) -> None:
        print(f"generation {row['generation'] + 1}: best {row['best_fitness'] * 1e3:.4g} ms, {row['simulations']} "
              f"simulated, {row['screened']} screened, {row['wall_s']:.1f} s", file=sys.stderr)

    return show


def run_search(args: argparse.Namespace, graph, system, cost) -> int:
    """``marssim search`` for an LLM on a GPU cluster."""
    from marssim.search.llm import grid_search, mars_llm
    from marssim.search.llm_outputs import format_top

    from .search import open_executor

    if args.algorithm not in LLM_ALGORITHMS:
        raise InputError(None, "--algorithm", f"an LLM workload on a GPU cluster is searched by "
                                              f"{' or '.join(LLM_ALGORITHMS)}, not {args.algorithm}")
    settings = llm_settings(args, graph)
    with open_executor(args) as executor:
        if args.algorithm == "mars":
            result = mars_llm(graph, system, cost, settings, executor=executor, parts=_parts(args),
                              progress=_progress(args))
        else:
            result = grid_search(graph, system, cost, settings, executor=executor, parts=_parts(args))
    print(f"{graph.spec} on {system.spec} ({len(system.accelerators)} GPUs), objective {settings.objective}")
    print(result.summary())
    print()
    print(format_top(result))
    if args.out:
        print()
        print("\n".join(write_llm_outputs(result, graph, system, cost, args.out)))
    return 0


def run_compare(args: argparse.Namespace, graph, system, cost) -> int:
    """``marssim compare`` for an LLM on a GPU cluster: the Megatron grid (uniform layers on
    every GPU kind) and the MARS search on the same evaluator, one table."""
    from marssim.fsutil import atomic_file
    from marssim.search.llm import grid_search, mars_llm

    from .search import open_executor

    settings = llm_settings(args, graph)
    with open_executor(args) as executor:
        grid = grid_search(graph, system, cost, settings, executor=executor, parts=_parts(args))
        mars = mars_llm(graph, system, cost, settings, executor=executor, parts=_parts(args),
                        progress=_progress(args))
    table = compare_table([grid, mars])
    print(f"{system.spec} / {graph.spec} / objective {settings.objective} / seed {settings.seed}")
    print(format_compare(table))
    if args.csv:
        with atomic_file(args.csv) as handle:
            table.to_csv(handle, index=False)
        print(f"\ntable        {args.csv}")
    return 0


def compare_table(results):
    """One row per search: best configuration, its simulated time (ms), MFU, the change against
    the first row (%), screened, rejected by memory, simulated, wall time (s)."""

    import pandas as pd

    rows = []
    base = None
    for r in results:
        b = r.best
        value = b.tpot_s if not math.isnan(b.tpot_s) else b.simulated_s
        base = value if base is None else base
        rows.append({"algorithm": r.algorithm, "best": b.config.text(), "time_ms": value * 1e3, "mfu": b.mfu,
                     "vs_grid_pct": (value / base - 1) * 100, "screened": r.screened,
                     "rejected_memory": r.rejected_memory, "simulations": r.simulations, "wall_s": r.wall_s})
    return pd.DataFrame(rows)


def format_compare(table) -> str:
    lines = [f"{'algorithm':<15}{'time ms':>11}{'vs grid':>9}{'MFU':>7}{'screened':>10}{'rejected':>10}"
             f"{'simulated':>11}{'wall s':>8}  best configuration"]
    for r in table.itertuples():
        lines.append(f"{r.algorithm:<15}{r.time_ms:>11.3f}{r.vs_grid_pct:>+8.1f}%{r.mfu:>7.1%}{r.screened:>10d}"
                     f"{r.rejected_memory:>10d}{r.simulations:>11d}{r.wall_s:>8.1f}  {r.best}")
    return "\n".join(lines)


def write_llm_outputs(result: LLMSearchResult, graph: Graph, system: System, cost: CostModel, out: str | Path,
                      baselines: tuple[LLMSearchResult, ...] = ()) -> list[str]:
    """Write into ``out`` atomically (whole or not at all): ``best_mapping.yaml`` (re-run with
    ``marssim simulate --mapping``), ``top10.csv``, ``history.csv``, ``search.json``,
    ``convergence.png``/``.svg``, ``result/`` (the best configuration's simulation) and
    ``trace.json`` (Perfetto, one row per class of identical GPUs). The best configuration is
    simulated again and must give the reported time. Returns one line per file."""
    import yaml

    from marssim.fsutil import staged_dir
    from marssim.parallel import lower_parallel
    from marssim.parallel.report import report_of
    from marssim.sim import simulate
    from marssim.search.llm import graph_for
    from marssim.search.llm_outputs import llm_search_summary, plot_llm_convergence

    from .search import write_result_and_trace

    cfg = result.best.config
    graph = graph_for(graph, cfg)
    tg = lower_parallel(graph, system, cfg, cost)
    sim = simulate(tg, system)
    report = report_of(tg, system, sim)
    if not math.isclose(report.iteration_s, result.best.simulated_s, rel_tol=1e-12):
        raise RuntimeError(f"the best configuration simulates to {report.iteration_s} s, the search reported "
                           f"{result.best.simulated_s} s")
    sim.meta["parallel_report"] = report.to_dict()
    out_dir = Path(out)
    lines = []
    from marssim.plan import plan_to_dict

    data = plan_to_dict(cfg, graph, system)
    header = (f"# {result.algorithm} search, objective {result.objective}, seed {result.seed}: "
              f"{result.best.config.text()}\n# simulated {result.best.simulated_s * 1e3:.3f} ms per iteration, "
              f"MFU {result.best.mfu:.1%}\n")
    with staged_dir(out_dir) as tmp:
        (tmp / "best_mapping.yaml").write_text(header + yaml.safe_dump(data, sort_keys=False))
        lines.append(f"mapping      {out_dir / 'best_mapping.yaml'} (marssim simulate --mapping ...)")
        result.top(10).to_csv(tmp / "top10.csv", index=False)
        lines.append(f"top 10       {out_dir / 'top10.csv'}")
        result.history.to_csv(tmp / "history.csv", index=False)
        lines.append(f"history      {out_dir / 'history.csv'} ({len(result.history)} rows)")
        summary = llm_search_summary(result, graph, system)
        summary["baselines"] = [llm_search_summary(b, graph, system) for b in baselines]
        (tmp / "search.json").write_text(json.dumps(summary, indent=2, sort_keys=True, default=float) + "\n")
        for p in plot_llm_convergence([result, *baselines], tmp / "convergence.png"):
            lines.append(f"figure       {out_dir / p.name}")
        lines += write_result_and_trace(sim, tmp, out_dir)
    return lines
