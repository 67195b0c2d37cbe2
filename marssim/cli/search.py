"""``marssim search``: find a plan with the MARS two-level GA (or a baseline). One command for
both kinds of plan: per-op mappings of any workload, and parallel configurations of an LLM on a
GPU cluster; the same progress bar, Ctrl-C handling and outputs for both."""

from __future__ import annotations

import argparse
import json
import math
import sys
from dataclasses import replace
from pathlib import Path

from marssim.errors import InputError

from . import _searching
from ._common import (TRACE_SUFFIXES, add_cost_args, check_output_dir, check_output_file, cost_model, positive_float,
                      positive_int, seed_arg)

VERB = "search"
ORDER = 50



def add_search_args(p: argparse.ArgumentParser) -> None:
    """The flags ``search`` and ``compare`` share: case, objective, budget, parallelism, seed."""
    from marssim.search import OBJECTIVES

    from marssim.search.evaluate import SERVING_OBJECTIVES

    from ._serve_search import add_serving_args

    p.add_argument("--system", required=True, metavar="SYSTEM", help="system YAML or shipped name")
    p.add_argument("--workload", metavar="SPEC", help="zoo spec like resnet50:batch=8, an LLM like "
                                                      "llama3-8b:mode=train,seq=2048, or an .onnx file (or --model: "
                                                      "serving deployments)")
    p.add_argument("--batch", type=positive_int, help="override the workload's batch")
    p.add_argument("--objective", choices=OBJECTIVES + SERVING_OBJECTIVES,
                   help="what to minimise: latency (makespan, default; an LLM's iteration, or serving's time per "
                        "output token), throughput (maximised: samples/s, an LLM's sequences/s or serving's output "
                        "tokens/s), energy or edp (energy-delay product; need designs with energy figures); serving "
                        "deployments (--model): goodput (default; maximised), gpus or cost, under --slo")
    p.add_argument("--budget", type=positive_int, metavar="N",
                   help="most simulations (mars stops at the first generation past it, its screens not counted, "
                        "instead of after its default budget: 3000 evaluations for a mapping, 12 simulations for an "
                        "LLM, 24 for serving deployments; random runs exactly N)")
    p.add_argument("--generations", type=positive_int,
                   help="most GA generations (default 100 for a mapping, 30 for an LLM, 20 for serving deployments; "
                        "the GA also stops after "
                        "generations without improvement or at its budget)")
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
    p.add_argument("--seed", type=seed_arg, default=0, help="random seed (same seed, same result; default 0); for serving "
                                                       "deployments also the requests' and the random router's")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.add_argument("--global-batch", dest="global_batch", type=positive_int, metavar="N",
                   help="LLM training: sequences per iteration (default: the workload's batch)")
    p.add_argument("--ttft-bound", dest="ttft_bound", type=positive_float, metavar="SECONDS",
                   help="LLM serving with --objective throughput: only configurations whose time to first token "
                        "is at most this count (a constraint, not a weighted sum)")
    add_cost_args(p)
    add_serving_args(p)


def register(sub: argparse._SubParsersAction) -> None:
    from marssim.plan.kinds import KINDS

    p = sub.add_parser(
        VERB, help="search for the best mapping or parallel configuration (MARS two-level GA, or a baseline)",
        description="Search the plans of a workload on a system. A per-op mapping: accelerator sets, the design of "
                    "each set, the layer segment each set runs, micro-batches (level 1) and each layer's sharding "
                    "(level 2). An LLM workload on a GPU cluster: its parallel configuration (level 1: pipeline "
                    "stages, their GPUs and layer counts, tensor parallelism per stage, rank order; level 2: "
                    "sequence/expert parallelism, micro-batch, schedule, recomputation, ZeRO). Every candidate is "
                    "screened (analytical estimate, closed form) and the best simulated; every reported number is a "
                    "simulation. With --out, writes best_mapping.yaml (loadable by `marssim simulate --mapping`), "
                    "top10.csv, history.csv, search.json and convergence.png/.svg; with --trace FILE the best "
                    "plan is simulated once more for its Perfetto trace (and, with --out, its result/). Ctrl-C "
                    "writes the best plan so far and exits 130.")
    add_search_args(p)
    p.add_argument("--algorithm", choices=tuple(dict.fromkeys(a for k in KINDS.values() for a in k.algorithms)),
                   default="mars",
                   help="mars (default), data_parallel, h2h, random or exhaustive (small spaces only); for an LLM "
                        "workload on a GPU cluster: mars (the search over parallel configurations) or megatron_grid "
                        "(every uniform Megatron-legal configuration, screened, the best simulated); for serving "
                        "deployments (--model): mars, uniform_grid (every uniform deployment, screened, the best "
                        "simulated) or exhaustive (every deployment simulated, small spaces only)")
    p.add_argument("--no-seed", dest="seed_baseline", action="store_false",
                   help="do not seed the GA with the baselines (data_parallel and h2h; an LLM: the best of the "
                        "Megatron grid); seeded by default, the GA then never returns a worse plan than them")
    p.add_argument("--out", metavar="DIR", help="write the outputs into DIR")
    p.add_argument("--trace", metavar="FILE",
                   help="simulate the best plan once more with its per-task tables and write its Perfetto trace "
                        "(.json or .json.gz) to FILE and, with --out, its result/ (the `marssim simulate --out` "
                        "files); without it nothing is simulated after the search")
    p.set_defaults(func=run)


# ---------------------------------------------------------------------------- the case
def load_case(args: argparse.Namespace):
    """``(graph, system, cost model, llm)`` from the shared flags (``llm``: the search over
    parallel configurations applies); InputError on bad ones, and on flags the case would ignore."""
    from marssim.search.llm import llm_search_available
    from marssim.system import load_system
    from marssim.workload import load_workload
    from marssim.workload.llm import require_transformer

    if args.dask and args.workers:
        raise InputError(None, "--workers", "give --workers (local processes) or --dask (a cluster), not both")
    system = load_system(args.system)
    graph = load_workload(args.workload, batch=args.batch)
    from marssim.plan import is_llm

    from ._common import refuse_llm_off_gpus, refuse_missing_precision

    if is_llm(graph):
        refuse_llm_off_gpus(system, graph.spec)
        refuse_missing_precision(require_transformer(graph, "a precision check"), system, graph.spec)
    llm = llm_search_available(graph, system)
    if not llm:
        for flag, dest in (("--global-batch", "global_batch"), ("--ttft-bound", "ttft_bound")):
            if getattr(args, dest, None) is not None:
                raise InputError(None, flag, "applies to an LLM workload (gpt:, llama:, moe: or a preset) on a "
                                             "GPU cluster")
        from marssim.plan.kinds import KINDS, PlanKind

        KINDS[PlanKind.MAPPING].check_algorithm(getattr(args, "algorithm", "mars"))
        if args.objective in ("energy", "edp"):
            missing = [name for name, d in system.designs.items() if d.energy is None]
            if len(missing) == len(system.designs):
                raise InputError(args.system, "designs", f"--objective {args.objective} needs energy figures "
                                                          f"(designs.NAME.energy); none of {', '.join(missing)} has "
                                                          "them")
    return graph, system, cost_model(args), llm


def mapping_settings(args: argparse.Namespace):
    """The per-op mapping search's :class:`~marssim.search.SearchSettings` from the flags."""
    from marssim.search import GAConfig, SearchSettings
    from marssim.search.runner import SEED_BASELINES

    changes = {k: v for k, v in (("generations", args.generations), ("population", args.population),
                                 ("time_limit_s", args.time_limit)) if v}
    return SearchSettings(objective=args.objective, budget=args.budget, config=replace(GAConfig(), **changes),
                          seed=args.seed, seed_with=SEED_BASELINES if getattr(args, "seed_baseline", True) else ())


def llm_settings(args: argparse.Namespace, graph):
    """The LLM search's :class:`~marssim.search.llm.LLMSearchSettings` from the flags;
    InputError for flags that do not apply."""
    from marssim.search.llm import LLMSearchSettings
    from marssim.workload.llm import require_transformer

    t = require_transformer(graph, "the search over parallel configurations")
    if args.objective not in ("latency", "throughput"):
        raise InputError(None, "--objective", f"an LLM search minimises latency (training: iteration time; serving: "
                                              f"time per output token) or maximises throughput; got {args.objective}")
    if args.ttft_bound is not None and (t.mode != "serve" or args.objective != "throughput"):
        raise InputError(None, "--ttft-bound", "applies to a serving workload (mode=serve) with --objective "
                                               "throughput")
    if args.global_batch is not None and not t.training:
        raise InputError(None, "--global-batch", "applies to a training workload (mode=train)")
    changes = {k: v for k, v in (("generations", args.generations), ("population", args.population),
                                 ("max_simulations", args.budget), ("time_limit_s", args.time_limit)) if v}
    if not getattr(args, "seed_baseline", True):
        changes["seed_with_grid"] = False
    return LLMSearchSettings(objective=args.objective, ttft_bound=args.ttft_bound, seed=args.seed,
                             global_batch=args.global_batch or 0, **changes)


_GA_FLAGS = (("--generations", "generations"), ("--population", "population"), ("--time-limit", "time_limit"),
             ("--no-seed", "seed_baseline"))


def _refuse_unused_flags(args: argparse.Namespace, llm: bool) -> None:
    """InputError for an algorithm the case has not, or a flag the algorithm would ignore (only
    mars runs generations; only mars and random spend a budget)."""
    from marssim.plan.kinds import KINDS, PlanKind

    KINDS[PlanKind.PARALLEL if llm else PlanKind.MAPPING].check_algorithm(args.algorithm)
    if args.algorithm == "mars":
        return
    flags = [flag for flag, dest in _GA_FLAGS if getattr(args, dest) not in (None, True)]
    if args.algorithm != "random" and args.budget is not None:
        flags.append("--budget")
    if flags:
        raise InputError(None, flags[0], f"{', '.join(flags)} {'does' if len(flags) == 1 else 'do'} not apply to "
                                         f"--algorithm {args.algorithm} and would be ignored (generations, population, "
                                         "time limit and seeding are the GA's; only mars and random spend a budget)")


# ---------------------------------------------------------------------------- the run
def search(args: argparse.Namespace, graph, system, cost, llm: bool, executor, progress=None):
    """The search the flags ask for, on ``executor``: a :class:`~marssim.search.SearchResult`."""
    if llm:
        from marssim.search.llm import grid_search, mars_llm

        settings = llm_settings(args, graph)
        if args.algorithm == "mars":
            return mars_llm(graph, system, cost, settings, executor=executor, progress=progress)
        return grid_search(graph, system, cost, settings, executor=executor)
    from marssim.search import run_algorithm

    try:
        return run_algorithm(args.algorithm, graph, system, cost, mapping_settings(args), executor=executor,
                             progress=progress)
    except ValueError as exc:
        raise InputError(None, "--algorithm", str(exc)) from None


def plan_case(args: argparse.Namespace) -> None:
    """Checks for a search of a workload's plans (not serving deployments): a workload given, no
    serving flag, the objective defaulting to latency."""
    from marssim.search.evaluate import SERVING_OBJECTIVES

    from ._serve_search import refuse_serving_flags

    refuse_serving_flags(args)
    if args.workload is None:
        raise InputError(None, "--workload", "give the workload (e.g. --workload resnet50:batch=8), or --model for "
                                             "serving deployments")
    if args.objective in SERVING_OBJECTIVES:
        raise InputError(None, "--objective", f"{args.objective} applies to serving deployments (--model)")
    if args.objective is None:
        args.objective = "latency"
    from marssim.plan.kinds import KINDS, PlanKind

    algorithm = getattr(args, "algorithm", "mars")
    if algorithm not in KINDS[PlanKind.MAPPING].algorithms + KINDS[PlanKind.PARALLEL].algorithms:
        KINDS[PlanKind.MAPPING].check_algorithm(algorithm)


def run(args: argparse.Namespace) -> int:
    from marssim.search.report import describe_best, fitness_display, format_top
    from marssim.search.result import SearchInterrupted
    from marssim.workload.llm import require_transformer

    from ._serve_search import run_search, serving_requested

    if serving_requested(args):
        if getattr(args, "trace", None):
            raise InputError(None, "--trace", "applies to searches of mappings and parallel configurations; a "
                                              "serving search writes its best deployment's tables with --out")
        return run_search(args)
    plan_case(args)
    check_output_dir(args.out)
    check_output_file(args.trace, "--trace", TRACE_SUFFIXES)
    graph, system, cost, llm = load_case(args)
    _refuse_unused_flags(args, llm)
    budget = llm_settings(args, graph) if llm else mapping_settings(args).ga_config()
    bar, update = _searching.progress_bar(args, budget, args.objective)
    with bar:
        try:
            with _searching.open_executor(args) as executor:
                result = search(args, graph, system, cost, llm, executor, progress=update)
        except SearchInterrupted as stop:
            bar.close()
            return keep_interrupted(stop.result, graph, system, args)
        except KeyboardInterrupt:
            bar.close()
            print("interrupted before any plan was simulated; nothing written", file=sys.stderr)
            return 130
    serving = llm and require_transformer(graph, "an LLM search").mode == "serve"
    label, value = fitness_display(result.objective, result.fitness, serving)
    if llm:
        print(f"{graph.spec} on {system.spec} ({len(system.accelerators)} GPUs), objective {result.objective}")
    print(result.summary())
    print(f"best {label}: {value:.6g}")
    print(describe_best(result, graph))
    if not result.evaluation.feasible:
        print(f"warning: no feasible plan found ({result.evaluation.error})", file=sys.stderr)
    if llm:
        print()
        print(format_top(result))
    if args.out or args.trace:
        print()
        print("\n".join(write_search_outputs(result, graph, system, cost, args.out, trace=args.trace)))
    return 0


INTERRUPTED_FILE = "interrupted-best-mapping.yaml"
"""Where an interrupted search without --out leaves its best plan (working directory)."""


def keep_interrupted(result, graph, system, args: argparse.Namespace) -> int:
    """Ctrl-C: write the best plan found so far (``--out DIR/best_mapping.yaml`` with
    ``history.csv`` and ``search.json``, else :data:`INTERRUPTED_FILE`), say where; exit 130."""
    from marssim.fsutil import staged_dir
    from marssim.plan import save_plan
    from marssim.plan.kinds import kind_of
    from marssim.search.report import search_summary

    plan = result.best
    graph_of_plan = kind_of(plan).graph_of(graph, plan)
    if args.out:
        with staged_dir(Path(args.out)) as tmp:
            save_plan(plan, graph_of_plan, system, tmp / "best_mapping.yaml", header=_header(result))
            result.history.to_csv(tmp / "history.csv", index=False)
            (tmp / "search.json").write_text(json.dumps(search_summary(result, graph, system), indent=2,
                                                        sort_keys=True) + "\n")
        path = Path(args.out) / "best_mapping.yaml"
    else:
        path = Path(INTERRUPTED_FILE)
        save_plan(plan, graph_of_plan, system, path, header=_header(result))
    print(f"interrupted after {len(result.history)} generations ({result.simulations} simulations, "
          f"{result.estimates} estimates): the best plan so far ({result.makespan * 1e3:.4f} ms, simulated) "
          f"is in {path}; `marssim simulate --mapping {path}` evaluates it", file=sys.stderr)
    return 130


def _header(result) -> str:
    from marssim.plan.kinds import PlanKind

    e = result.evaluation
    text = f"# {result.algorithm} search, objective {result.objective}, seed {result.seed}"
    if result.interrupted:
        text += " (interrupted)"
    text += f"\n# simulated {e.makespan * 1e3:.4f} ms"
    if e.kind is PlanKind.PARALLEL and e.mfu == e.mfu:
        text += f" per iteration, MFU {e.mfu:.1%}"
    return text + "\n"


def write_search_outputs(result, graph, system, cost, out: str | Path | None, baselines: tuple = (),
                         trace: str | Path | None = None) -> list[str]:
    """Write into ``out`` atomically (it appears whole or not at all), from what the search
    found: ``best_mapping.yaml``, ``search.json`` (summary), ``history.csv``, ``top10.csv``,
    ``convergence.png``/``.svg`` (with the ``baselines``' lines). Only with ``trace`` (a file
    name) is the best plan simulated again, with its per-task tables (and must give the reported
    number): its Perfetto trace goes to ``trace`` and, with ``out``, its ``result/``
    (:meth:`Result.save`). Returns one line per file for the user."""

    from marssim.fsutil import staged_dir
    from marssim.plan import save_plan
    from marssim.plan.kinds import kind_of

    plan = result.best
    kind = kind_of(plan)
    graph_of_plan = kind.graph_of(graph, plan)
    sim = None
    if trace:
        from marssim.plan import run

        done = run(plan, graph_of_plan, system, cost)
        again = done.makespan
        if not math.isclose(again, result.evaluation.makespan, rel_tol=kind.rerun_rel_tol):
            raise RuntimeError(f"the best plan simulates to {again} s, the search reported "
                               f"{result.evaluation.makespan} s")
        sim = done.result
    lines: list[str] = []
    if out:
        out_dir = Path(out)
        with staged_dir(out_dir) as tmp:
            save_plan(plan, graph_of_plan, system, tmp / "best_mapping.yaml", header=_header(result))
            lines.append(f"mapping      {out_dir / 'best_mapping.yaml'} (marssim simulate --mapping ...)")
            lines += _searching.write_search_files(result, graph, system, baselines, tmp, out_dir)
            if sim is not None:
                sim.save(tmp / "result")
                lines.append(f"result       {out_dir / 'result'}/ (marssim simulate --out format)")
    if sim is not None:
        from marssim.results.view import folded_view
        from marssim.trace import write_chrome_trace

        shown = folded_view(sim, None) if kind.folded else sim
        size = write_chrome_trace(shown, trace)
        lines.append(f"trace        {trace} ({size / 2**20:.2f} MiB; open in https://ui.perfetto.dev)")
    return lines
