"""``marssim search`` and ``marssim compare`` for an LLM workload on a GPU cluster: the search
over parallel configurations (:mod:`marssim.search.llm`) instead of the per-op mapping GA."""

from __future__ import annotations

import argparse
import os
import sys
from dataclasses import replace

from marssim.errors import InputError

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
    from marssim.search.llm_outputs import format_top, write_llm_outputs

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
    import math

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
