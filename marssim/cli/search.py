"""``marssim search``: find a mapping with the MARS two-level GA (or a baseline)."""

from __future__ import annotations

import argparse
import contextlib
import sys
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from marssim.errors import InputError

from ._common import add_cost_args, check_output_dir, cost_model, positive_int
from .llm_search import LLM_ALGORITHMS, add_llm_args

if TYPE_CHECKING:
    from marssim.results import Result

VERB = "search"
ORDER = 50


def positive_float(text: str) -> float:
    """argparse type: a number > 0."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}") from None
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}")
    return value


def add_search_args(p: argparse.ArgumentParser) -> None:
    """The flags ``search`` and ``compare`` share: case, objective, budget, parallelism, seed."""
    from marssim.search import OBJECTIVES

    p.add_argument("--system", required=True, metavar="SYSTEM", help="system YAML or shipped name")
    p.add_argument("--workload", required=True, metavar="SPEC", help="zoo spec like resnet50:batch=8 or an .onnx file")
    p.add_argument("--batch", type=positive_int, help="override the workload's batch")
    p.add_argument("--objective", choices=OBJECTIVES, default="latency",
                   help="what to minimise: latency (makespan, default), throughput (maximised, for pipelined "
                        "runs), energy or edp (energy-delay product; need designs with energy figures)")
    p.add_argument("--budget", type=positive_int, metavar="N",
                   help="most simulations (mars stops at the first generation past it, its analytical "
                        "estimates not counted, instead of after its default 3000 evaluations; random runs "
                        "exactly N)")
    p.add_argument("--generations", type=positive_int,
                   help="most GA generations (default 100; the GA also stops after 20 without improvement "
                        "or 3000 evaluations, simulations and analytical estimates together)")
    p.add_argument("--population", type=positive_int, help="GA population (default 12)")
    p.add_argument("--time-limit", dest="time_limit", type=positive_float, metavar="SECONDS",
                   help="stop the GA at the first generation past this wall time (the result then "
                        "depends on the machine's speed; --budget keeps it reproducible)")
    p.add_argument("--workers", type=positive_int, metavar="N",
                   help="evaluate candidates on N processes (default: the CPU count; 1: serially)")
    p.add_argument("--dask", metavar="ADDRESS",
                   help="evaluate candidates on a Dask cluster (scheduler address; needs marssim[dask])")
    p.add_argument("--dask-timeout", dest="dask_timeout", type=positive_float, default=10.0, metavar="SECONDS",
                   help="seconds to wait for the Dask scheduler to answer (default 10)")
    p.add_argument("--seed", type=int, default=0, help="random seed (same seed, same result; default 0)")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    add_llm_args(p)
    add_cost_args(p)


def register(sub: argparse._SubParsersAction) -> None:
    from marssim.search import ALGORITHMS

    p = sub.add_parser(
        VERB, help="search for the best mapping (MARS two-level GA, or a baseline)",
        description="Search the mappings of a workload onto a system: accelerator sets, the design of each "
                    "set, the layer segment each set runs, micro-batches (level 1) and each layer's sharding "
                    "(level 2). For an LLM workload on a GPU cluster: its parallel configuration (level 1: "
                    "pipeline stages, their GPUs and layer counts, tensor parallelism per stage, rank order; "
                    "level 2: sequence/expert parallelism, micro-batch, schedule, recomputation, ZeRO), every "
                    "candidate screened in closed form and the best simulated. Every reported number is a "
                    "simulation. With --out, writes best_mapping.yaml (loadable by `marssim simulate --mapping`), "
                    "history.csv, convergence.png/.svg, the best mapping's result/ and a Perfetto trace.json "
                    "(LLM: also top10.csv).")
    add_search_args(p)
    p.add_argument("--algorithm", choices=tuple(dict.fromkeys(ALGORITHMS + LLM_ALGORITHMS)), default="mars",
                   help="mars (default), data_parallel, h2h, random or exhaustive (small spaces only); for an LLM "
                        "workload on a GPU cluster: mars (the search over parallel configurations) or megatron_grid "
                        "(every uniform Megatron-legal configuration, screened, the best simulated)")
    p.add_argument("--no-seed", dest="seed_baseline", action="store_false",
                   help="do not seed the GA with the data_parallel and h2h mappings (seeded by default: "
                        "the GA then never returns a worse mapping than either)")
    p.add_argument("--out", metavar="DIR", help="write the outputs into DIR")
    p.set_defaults(func=run)


def load_case(args: argparse.Namespace):
    """(graph, system, cost model, SearchSettings) from the shared flags; InputError on bad ones."""
    from marssim.search import GAConfig, SearchSettings
    from marssim.search.runner import SEED_BASELINES
    from marssim.system import load_system
    from marssim.workload import load_workload

    if args.dask and args.workers:
        raise InputError(None, "--workers", "give --workers (local processes) or --dask (a cluster), not both")
    system = load_system(args.system)
    graph = load_workload(args.workload, batch=args.batch)
    if args.objective in ("energy", "edp"):
        missing = [name for name, d in system.designs.items() if d.energy is None]
        if len(missing) == len(system.designs):
            raise InputError(args.system, "designs", f"--objective {args.objective} needs energy figures "
                                                      f"(designs.NAME.energy); none of {', '.join(missing)} has them")
    cfg = GAConfig()
    changes = {}
    if args.generations:
        changes["generations"] = args.generations
    if args.population:
        changes["population"] = args.population
    if args.time_limit:
        changes["time_limit_s"] = args.time_limit
    cfg = replace(cfg, **changes)
    settings = SearchSettings(objective=args.objective, budget=args.budget, config=cfg, seed=args.seed,
                              seed_with=SEED_BASELINES if getattr(args, "seed_baseline", True) else ())
    return graph, system, cost_model(args), settings


def is_llm_case(graph, system, args: argparse.Namespace) -> bool:
    """True when the search over parallel configurations applies (an LLM workload on a GPU
    cluster); InputError for the LLM-only flags on any other case."""
    from marssim.search.llm import llm_search_available

    if llm_search_available(graph, system):
        return True
    for flag, dest in (("--global-batch", "global_batch"), ("--ttft-bound", "ttft_bound")):
        if getattr(args, dest, None) is not None:
            raise InputError(None, flag, "applies to an LLM workload (gpt:, llama:, moe: or a preset) on a GPU cluster")
    if getattr(args, "algorithm", "mars") == "megatron_grid":
        raise InputError(None, "--algorithm", "megatron_grid applies to an LLM workload on a GPU cluster")
    return False


@contextlib.contextmanager
def open_executor(args: argparse.Namespace):
    """The executor the flags ask for; an unreachable or missing Dask is one InputError line."""
    from marssim.search.parallel import open_executor as _open

    try:
        opened = _open(args.workers, args.dask, dask_timeout=args.dask_timeout)
        executor = opened.__enter__()
    except (ImportError, ConnectionError) as exc:
        raise InputError(None, "--dask", str(exc)) from None
    with contextlib.ExitStack() as stack:
        stack.push(opened)
        yield executor


def progress_plan(cfg) -> tuple[int, str]:
    """What the progress bar counts toward: the budget that will end the GA, ``(total, unit)``:
    its simulations when a simulation budget is set, else its evaluations (simulations and
    analytical estimates) when an evaluation budget is set, else its generations. (Patience may
    still end it sooner; the bar then stops short.)"""
    if cfg.max_simulations is not None:
        return cfg.max_simulations, "simulations"
    if cfg.max_evaluations is not None:
        return cfg.max_evaluations, "evaluations"
    return cfg.generations, "generations"


def _progress_bar(args: argparse.Namespace, cfg, objective: str):
    """A tqdm bar on stderr counting toward the budget that ends the search (see
    :func:`progress_plan`), with the generation, the best so far and evaluations/s; and its
    update callback (one call per generation)."""
    from tqdm import tqdm

    from marssim.search.report import fitness_display

    total, unit = progress_plan(cfg)
    bar = tqdm(total=total, desc=unit, unit="", file=sys.stderr, disable=args.quiet or not sys.stderr.isatty(),
               leave=False, bar_format="{desc}: {n}/{total} |{bar}| {elapsed}<{remaining}{postfix}")

    def update(row: dict) -> None:
        label, value = fitness_display(objective, row["best_fitness"])
        done = {"simulations": row["simulations"], "evaluations": row["simulations"] + row["estimates"],
                "generations": row["generation"] + 1}[unit]
        bar.n = min(done, total)
        bar.set_postfix_str(f"generation {row['generation'] + 1}/{cfg.generations}, best {value:.4g} "
                            f"{label.split('(')[-1].rstrip(')')}, {row['evaluations_per_s']:.1f} eval/s", refresh=False)
        bar.refresh()

    return bar, update


_GA_FLAGS = (("--generations", "generations"), ("--population", "population"), ("--time-limit", "time_limit"),
             ("--no-seed", "seed_baseline"))


def _refuse_unused_flags(args: argparse.Namespace) -> None:
    """InputError for a flag the chosen algorithm would ignore (only mars runs generations; only
    mars and random spend a budget)."""
    if args.algorithm == "mars":
        return
    flags = [flag for flag, dest in _GA_FLAGS if getattr(args, dest) not in (None, True)]
    if args.algorithm != "random" and args.budget is not None:
        flags.append("--budget")
    if flags:
        raise InputError(None, flags[0], f"{', '.join(flags)} {'does' if len(flags) == 1 else 'do'} not apply to "
                                         f"--algorithm {args.algorithm} and would be ignored (generations, population, "
                                         "time limit and seeding are the GA's; only mars and random spend a budget)")


def run(args: argparse.Namespace) -> int:
    from marssim.search import run_algorithm
    from marssim.search.report import describe_mapping, fitness_display
    from marssim.search.result import SearchInterrupted

    check_output_dir(args.out)
    graph, system, cost, settings = load_case(args)
    if is_llm_case(graph, system, args):
        from .llm_search import run_search

        return run_search(args, graph, system, cost)
    _refuse_unused_flags(args)
    bar, update = _progress_bar(args, settings.ga_config(), settings.objective)
    with open_executor(args) as executor, bar:
        try:
            result = run_algorithm(args.algorithm, graph, system, cost, settings, executor=executor,
                                   progress=update)
        except ValueError as exc:
            raise InputError(None, "--algorithm", str(exc)) from None
        except SearchInterrupted as stop:
            bar.close()
            return _keep_interrupted(stop.result, graph, args)
    label, value = fitness_display(result.objective, result.fitness)
    print(result.summary())
    print(f"best {label}: {value:.6g}")
    print(describe_mapping(result, graph))
    if not result.evaluation.feasible:
        print(f"warning: no feasible mapping found ({result.evaluation.error})", file=sys.stderr)
    if args.out:
        print()
        print("\n".join(write_search_outputs(result, graph, system, cost, args.out)))
    return 0


INTERRUPTED_FILE = "interrupted-best-mapping.yaml"
"""Where an interrupted search without --out leaves its best mapping (working directory)."""


def _keep_interrupted(result, graph, args: argparse.Namespace) -> int:
    """Ctrl-C: write the best mapping found so far (``--out DIR/best_mapping.yaml`` with
    ``history.csv`` and ``search.json``, else :data:`INTERRUPTED_FILE`), say where; exit 130."""
    import json

    from marssim.fsutil import staged_dir
    from marssim.mapping import save_mapping
    from marssim.search.report import search_summary

    if args.out:
        with staged_dir(Path(args.out)) as tmp:
            save_mapping(result.best, graph, tmp / "best_mapping.yaml")
            result.history.to_csv(tmp / "history.csv", index=False)
            (tmp / "search.json").write_text(json.dumps(search_summary(result, graph), indent=2, sort_keys=True)
                                             + "\n")
        path = Path(args.out) / "best_mapping.yaml"
    else:
        path = Path(INTERRUPTED_FILE)
        save_mapping(result.best, graph, path)
    print(f"interrupted after {len(result.history)} generations ({result.simulations} simulations, "
          f"{result.estimates} estimates): the best mapping so far ({result.makespan * 1e3:.4f} ms, simulated) "
          f"is in {path}; `marssim simulate --mapping {path}` evaluates it", file=sys.stderr)
    return 130


def write_result_and_trace(sim: Result, tmp: Path, out_dir: Path) -> list[str]:
    """Save the best candidate's simulation ``sim`` as ``result/`` and its Perfetto
    ``trace.json`` in the staging directory ``tmp``; one line per file, named as ``out_dir``
    will hold them."""
    from marssim.trace import write_chrome_trace

    sim.save(tmp / "result")
    write_chrome_trace(sim, tmp / "trace.json")
    return [f"result       {out_dir / 'result'}/ (marssim simulate --out format)",
            f"trace        {out_dir / 'trace.json'} (open in https://ui.perfetto.dev)"]


def write_search_outputs(result, graph, system, cost, out: str) -> list[str]:
    """Write into ``out`` atomically (it appears whole or not at all): ``best_mapping.yaml``,
    ``search.json`` (summary), ``history.csv``, ``convergence.png``/``.svg``, ``result/`` (the
    best mapping's full simulation, :meth:`Result.save`) and ``trace.json`` (Perfetto). Returns
    one line per file for the user."""
    import json

    from marssim.fsutil import staged_dir
    from marssim.lower import lower
    from marssim.mapping import save_mapping
    from marssim.search.report import plot_convergence, search_summary
    from marssim.sim import simulate

    out_dir = Path(out)
    lines: list[str] = []
    sim = simulate(lower(graph, system, result.best, cost), system)
    if sim.makespan != result.evaluation.makespan:  # the search's number is a simulation, never an estimate
        raise RuntimeError(f"the best mapping simulates to {sim.makespan} s, the search reported "
                           f"{result.evaluation.makespan} s")
    with staged_dir(out_dir) as tmp:
        save_mapping(result.best, graph, tmp / "best_mapping.yaml")
        lines.append(f"mapping      {out_dir / 'best_mapping.yaml'} (marssim simulate --mapping ...)")
        (tmp / "search.json").write_text(json.dumps(search_summary(result, graph), indent=2, sort_keys=True) + "\n")
        result.history.to_csv(tmp / "history.csv", index=False)
        lines.append(f"history      {out_dir / 'history.csv'} ({len(result.history)} rows)")
        for p in plot_convergence(result, tmp / "convergence.png"):
            lines.append(f"figure       {out_dir / p.name}")
        lines += write_result_and_trace(sim, tmp, out_dir)
    return lines
