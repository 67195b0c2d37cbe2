"""What ``marssim search`` and ``compare`` share whatever they search (per-op mappings, parallel
configurations, serving deployments): the executor the flags ask for, the progress bar counting
toward the budget that ends a search, and the files every search writes."""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
from pathlib import Path

from marssim.errors import InputError

__all__ = ["open_executor", "progress_plan", "progress_bar", "write_search_files"]


@contextlib.contextmanager
def open_executor(args: argparse.Namespace, workers: int | None = None):
    """The executor the flags ask for (``workers``: local processes instead of ``--workers``);
    an unreachable or missing Dask is one InputError line."""
    from marssim.search.parallel import open_executor as _open

    try:
        opened = _open(args.workers if workers is None else workers, args.dask,
                       dask_timeout=args.dask_timeout or 10.0)
        executor = opened.__enter__()
    except (ImportError, ConnectionError) as exc:
        raise InputError(None, "--dask", str(exc)) from None
    with contextlib.ExitStack() as stack:
        stack.push(opened)
        yield executor


# ---------------------------------------------------------------------------- progress
def progress_plan(cfg) -> tuple[int, str]:
    """What the progress bar counts toward: the budget that will end the search, ``(total,
    unit)``: its simulations when a simulation budget is set, else its evaluations (simulations
    and screens) when an evaluation budget is set, else its generations. (Patience may still end
    it sooner; the bar then stops short.) ``cfg``: a GAConfig or LLMSearchSettings."""
    if getattr(cfg, "max_simulations", None) is not None:
        return cfg.max_simulations, "simulations"
    if getattr(cfg, "max_evaluations", None) is not None:
        return cfg.max_evaluations, "evaluations"
    return cfg.generations, "generations"


def progress_bar(args: argparse.Namespace, cfg, objective: str):
    """A tqdm bar on stderr counting toward the budget that ends the search (see
    :func:`progress_plan`), with the generation, the best so far and evaluations/s; and its
    update callback (one call per generation)."""
    from tqdm import tqdm

    from marssim.progress import GenerationDone
    from marssim.search.report import fitness_display

    total, unit = progress_plan(cfg)
    bar = tqdm(total=total, desc=unit, unit="", file=sys.stderr, disable=args.quiet or not sys.stderr.isatty(),
               leave=False, bar_format="{desc}: {n}/{total} |{bar}| {elapsed}<{remaining}{postfix}")

    def update(event: GenerationDone) -> None:
        label, value = fitness_display(objective, event.best_fitness)
        done = {"simulations": event.simulations, "evaluations": event.simulations + event.estimates,
                "generations": event.generation + 1}[unit]
        bar.n = min(done, total)
        bar.set_postfix_str(f"generation {event.generation + 1}/{cfg.generations}, best {value:.4g} "
                            f"{label.split('(')[-1].rstrip(')')}, {event.evaluations_per_s:.1f} eval/s", refresh=False)
        bar.refresh()

    return bar, update


def write_search_files(result, graph, system, baselines: tuple, tmp: Path, out_dir: Path) -> list[str]:
    """What every search writes into its staged output folder ``tmp`` (shown as ``out_dir``):
    ``search.json`` (summary with the ``baselines``'), ``history.csv``, ``top10.csv`` and the
    convergence figure. ``graph``: the workload, None for serving deployments. One line per file."""
    import pandas as pd

    from marssim.search.report import plot_convergence, search_summary, top_rows

    (tmp / "search.json").write_text(json.dumps(
        {**search_summary(result, graph, system),
         "baselines": [search_summary(b, graph, system) for b in baselines]}, indent=2, sort_keys=True) + "\n")
    result.history.to_csv(tmp / "history.csv", index=False)
    lines = [f"history      {out_dir / 'history.csv'} ({len(result.history)} rows)"]
    pd.DataFrame(top_rows(result, 10)).to_csv(tmp / "top10.csv", index=False)
    lines.append(f"top 10       {out_dir / 'top10.csv'}")
    figures = plot_convergence([result, *baselines], tmp / "convergence.png")
    lines += [f"figure       {out_dir / p.name}" for p in figures]
    return lines
