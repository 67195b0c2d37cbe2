"""The serving side of ``marssim search`` and ``marssim compare`` (``--model`` instead of
``--workload``): the search over deployments of an LLM serving a request stream under
service-level constraints (:mod:`marssim.search.serve`), its flags, its table and its outputs --
the best deployment as a file ``marssim serve --deployment`` reads back and re-simulates to the
reported figures."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from marssim.errors import InputError

from . import _searching
from ._common import positive_float, positive_int

REQUEST_FLAGS = ("replay", "arrival", "prompt", "output", "requests", "rate", "prefix")
DEPLOYMENT_FILE = "best_deployment.yaml"
INTERRUPTED_FILE = "interrupted-best-deployment.yaml"
"""Where an interrupted search without --out leaves its best deployment (working directory)."""


def add_serving_args(p: argparse.ArgumentParser) -> None:
    """The flags of a search over serving deployments."""
    g = p.add_argument_group(
        "serving deployments (with --model instead of --workload)",
        "Search deployments of --model serving a request stream: replicas, tensor/pipeline parallelism and GPU "
        "kind per pool, disaggregated prefill and decode, each pool's engine scheduler; under --slo "
        "constraints, --objective goodput (highest request rate meeting them), gpus (fewest GPUs meeting "
        "them at the offered load) or cost (dollars per million output tokens at the offered load, with "
        "--gpu-price).")
    g.add_argument("--model", metavar="SPEC", help="the LLM served (llama3-70b, llama3-8b:attention=flash, gpt:...)")
    g.add_argument("--replay", metavar="TRACE", help="arrivals and lengths of a request trace (shipped name or CSV)")
    g.add_argument("--arrival", metavar="SPEC", help="poisson:rate=R, gamma:rate=R,cv=C, trace:NAME")
    g.add_argument("--prompt", metavar="SPEC", help="prompt lengths: N, uniform:LOW-HIGH, zipf:a=A,low=L,high=H, "
                                                    "trace:NAME")
    g.add_argument("--output", metavar="SPEC", help="output lengths (generated tokens, the first included)")
    g.add_argument("--requests", type=positive_int, metavar="N",
                   help="requests per simulation (default 1000; a replayed trace: all its rows)")
    g.add_argument("--rate", type=positive_float, metavar="R",
                   help="offered load in requests/s (Poisson, or the replayed trace sped up to it); the goodput "
                        "objective scales it to find the highest rate meeting --slo")
    g.add_argument("--prefix", metavar="SETTINGS", help="shared prompt prefixes: tokens=T,groups=G,share=S")
    g.add_argument("--slo", metavar="BOUNDS",
                   help="constraints on the run's statistics, METRIC_STAT=TIME: ttft_p99=2s,tbt_p99=100ms (METRIC: "
                        "ttft, tbt, tpot, e2e, queue; STAT: p50, p90, p99, mean, max); every request must be served")
    g.add_argument("--gpu-price", dest="gpu_price", action="append", metavar="DESIGN=DOLLARS",
                   help="dollars per GPU-hour of a GPU design, e.g. h100=2.5,a100=1.2 (for --objective cost, and "
                        "the $/M tokens column)")
    g.add_argument("--no-disaggregation", dest="disaggregation", action="store_false",
                   help="only deployments whose replicas prefill and decode (no separate prefill and decode pools)")
    g.add_argument("--max-gpus", dest="max_gpus", type=positive_int, metavar="N",
                   help="deployments of at most N GPUs (default: the system's)")
    g.add_argument("--max-pp", dest="max_pp", type=positive_int, metavar="N",
                   help="largest pipeline-parallel degree of a replica (default 4)")
    g.add_argument("--router", choices=("round_robin", "least_tokens", "least_requests", "random"),
                   help="how requests pick a replica (default least_tokens)")
    g.add_argument("--context-bucket", dest="context_bucket", type=positive_int, metavar="TOKENS",
                   help="time decode attention at the batch's mean context rounded to this many tokens (default 1: "
                        "exact; 16 almost halves a simulation's CPU time, docs/serving.md)")


def serving_requested(args: argparse.Namespace) -> bool:
    return getattr(args, "model", None) is not None


def refuse_serving_flags(args: argparse.Namespace) -> None:
    """Without --model: InputError for a serving flag that would be ignored."""
    for flag in REQUEST_FLAGS + ("slo", "gpu_price", "max_gpus", "max_pp", "router", "context_bucket"):
        if getattr(args, flag, None) is not None:
            raise InputError(None, "--" + flag.replace("_", "-"), "applies to a search over serving deployments "
                                                                  "(--model with a request stream)")
    if not args.disaggregation:
        raise InputError(None, "--no-disaggregation", "applies to a search over serving deployments (--model)")


def serving_inputs(args: argparse.Namespace):
    """``(case, system, cost model, settings, model spec)`` from the flags, every check done
    before any work; InputError (one line, exit 2) otherwise."""
    from marssim.search.evaluate import SERVING_OBJECTIVES
    from marssim.search.serve import ServeSearchSettings
    from marssim.serve.case import ServeCase
    from marssim.serve.model import load_model
    from marssim.serve.inputs import check_context, request_spec
    from marssim.serve.slo import parse_constraints, parse_prices
    from marssim.system import load_system

    from ._common import cost_model, refuse_llm_off_gpus, refuse_missing_precision, request_flags

    if args.workload is not None:
        raise InputError(None, "--workload", "give --workload (plans of a workload) or --model (serving deployments), "
                                             "not both")
    for flag, dest in (("--batch", "batch"), ("--global-batch", "global_batch"), ("--ttft-bound", "ttft_bound")):
        if getattr(args, dest, None) is not None:
            raise InputError(None, flag, "does not apply to serving deployments (--model); the requests set the "
                                         "batches, --slo the latency bounds")
    objective = args.objective or "goodput"
    if objective not in SERVING_OBJECTIVES:
        raise InputError(None, "--objective", f"serving deployments are searched for {', '.join(SERVING_OBJECTIVES)}; "
                                              f"got {objective}")
    from marssim.plan.kinds import KINDS, PlanKind

    algorithm = getattr(args, "algorithm", "mars")
    KINDS[PlanKind.DEPLOYMENT].check_algorithm(algorithm)
    if args.dask and args.workers:
        raise InputError(None, "--workers", "give --workers (local processes) or --dask (a cluster), not both")
    if algorithm != "mars":
        flags = [flag for flag, dest in (("--generations", "generations"), ("--population", "population"),
                                         ("--time-limit", "time_limit"), ("--budget", "budget"))
                 if getattr(args, dest, None) is not None]
        if not getattr(args, "seed_baseline", True):
            flags.append("--no-seed")
        if flags:
            raise InputError(None, flags[0], f"does not apply to --algorithm {algorithm} and would be ignored "
                                             "(generations, population, time limit, budget and seeding are the GA's)")
    if not args.slo:
        raise InputError(None, "--slo", "give the constraints a deployment must meet, e.g. ttft_p99=2s,tbt_p99=100ms")
    constraints = parse_constraints(args.slo)
    model = load_model(args.model)
    system = load_system(args.system)
    kinds = {system.accelerator(a).designs[0] for a in system.accelerator_ids}
    prices = parse_prices(args.gpu_price, kinds) if args.gpu_price else {}
    if objective == "cost":
        missing = sorted(kinds - set(prices))
        if missing:
            raise InputError(None, "--gpu-price", f"--objective cost needs a price per GPU-hour of every GPU design "
                                                  f"of {system.spec}; missing: {', '.join(missing)} (e.g. "
                                                  f"--gpu-price {missing[0]}=2.5)")
    spec = request_spec(request_flags(args))
    if spec.arrivals.kind in ("offline", "closed"):
        raise InputError(None, "--arrival", "a serving search needs arrivals at a rate (poisson, gamma or a trace), "
                                            f"not {spec.arrivals.kind}")
    refuse_llm_off_gpus(system, str(args.model))
    refuse_missing_precision(model, system, str(args.model), "--model")
    check_context(model, spec, args.seed)
    case = ServeCase(model, spec, args.seed, constraints, tuple(sorted(prices.items())), goodput=objective == "goodput")
    changes = {k: v for k, v in (("generations", args.generations), ("population", args.population),
                                 ("max_simulations", args.budget), ("time_limit_s", args.time_limit)) if v}
    settings = ServeSearchSettings(objective=objective, seed=args.seed, disaggregation=args.disaggregation,
                                   max_gpus=args.max_gpus, max_pp=args.max_pp or 4,
                                   router=args.router or "least_tokens",
                                   context_bucket=args.context_bucket or 1,
                                   seed_with_grid=getattr(args, "seed_baseline", True), **changes)
    return case, system, cost_model(args), settings, args.model


def requests_section(args: argparse.Namespace, rate: float | None, seed: int) -> dict:
    """The ``requests`` section of a deployment file that draws the search's stream (at ``rate``
    requests/s when given: the goodput found)."""
    out: dict = {}
    for flag in ("replay", "arrival", "prompt", "output", "prefix"):
        value = getattr(args, flag)
        if value is not None:
            out[flag] = value
    if args.requests is not None:
        out["count"] = args.requests
    if rate is not None:
        out["rate"] = float(rate)
    elif args.rate is not None:
        out["rate"] = float(args.rate)
    out["seed"] = seed
    return out


# ---------------------------------------------------------------------------- running
def run_search(args: argparse.Namespace) -> int:
    """``marssim search --model ...``: the search, its report, its outputs (--out), Ctrl-C."""
    from marssim.search.report import describe_best, fitness_display, format_top
    from marssim.search.result import SearchInterrupted

    from ._common import check_output_dir

    check_output_dir(args.out)
    case, system, cost, settings, model_spec = serving_inputs(args)
    bar, update = _searching.progress_bar(args, settings, settings.objective)
    with bar:
        try:
            with _searching.open_executor(args) as executor:
                result = _search(args.algorithm, case, system, cost, settings, executor, update)
        except SearchInterrupted as stop:
            bar.close()
            return keep_interrupted(stop.result, case, system, args, model_spec)
        except KeyboardInterrupt:
            bar.close()
            print("interrupted before any deployment was simulated; nothing written", file=sys.stderr)
            return 130
    label, value = fitness_display(result.objective, result.fitness)
    print(f"{case.model.name} on {system.spec} ({len(system.accelerators)} GPUs), objective {result.objective}, "
          f"constraints {case.constraints.text()}")
    print(f"requests: {case.spec.text()}, seed {case.seed}")
    print(result.summary())
    print(f"best {label}: {value:.6g}")
    print(describe_best(result, None))
    from marssim.serve.launch import launch_commands, launch_lines

    print("launch settings of the best deployment (one command per replica):")
    print("\n".join(launch_lines(launch_commands(result.best, case.model, model_spec))))
    print()
    print(format_top(result))
    print()
    print(pareto_text(front_of([result], settings.objective), [result]))
    if args.out:
        print()
        print("\n".join(write_outputs(result, case, system, cost, args.out, model_spec, args)))
    return 0


# ---------------------------------------------------------------------------- Pareto fronts
PARETO_FILE = "pareto.csv"
PARETO_FIGURE = "pareto.png"


def front_of(results: list, objective: str):
    """The Pareto table (:func:`marssim.search.pareto.front_table`) of the deployments the
    searches simulated that meet the constraints (a deployment simulated by several, once)."""
    from marssim.search.pareto import front_points, front_table

    return front_table(front_points([c for r in results for c in r.candidates], objective))


def _rate_label(objective: str, unit: bool = True) -> str:
    if objective == "goodput":
        return "goodput (requests/s within the constraints)" if unit else "goodput"
    return "requests/s served (the offered load)" if unit else "req/s"


def pareto_text(table, results: list) -> str:
    """The front of output tokens/s per GPU against tokens/s per user as printed: a heading
    saying what it is drawn from (simulations only; the screen's front deployments the GA
    simulated for it and those its budget left out), then the points."""
    import textwrap

    from marssim.search.pareto import format_front

    objective = results[0].objective
    simulated, on = len(table), int(table["on_tokens_front"].sum()) if len(table) else 0
    head = (f"Pareto front, output tokens/s per GPU against tokens/s per user: {on} of the {simulated} simulated "
            f"deployments meeting the constraints (screen-only deployments never count)")
    notes = [r.notes["pareto"] for r in results if isinstance(r.notes.get("pareto"), dict)]
    if notes:
        done = sum(n["simulated_for_front"] for n in notes)
        left = sum(n["left_by_budget"] for n in notes)
        head += (f"; {done} deployment(s) on the screen's front simulated for it"
                 + (f", {left} left unsimulated by the budget of simulations (--budget)" if left else ""))
    return "\n".join(textwrap.wrap(head, 120)) + "\n" + format_front(table, _rate_label(objective, unit=False))


def write_pareto(table, directory: Path, title: str, objective: str) -> list[Path]:
    """``pareto.csv`` and ``pareto.png``/``.svg`` (both fronts) into ``directory``."""
    from marssim.search.pareto import plot_fronts

    table.to_csv(directory / PARETO_FILE, index=False)
    paths = [directory / PARETO_FILE]
    if len(table):
        paths += plot_fronts(table, directory / PARETO_FIGURE, title, _rate_label(objective))
    return paths


def _pareto_title(case, system) -> str:
    return (f"{case.model.name} on {system.spec}, {case.spec.text()}: simulated deployments meeting "
            f"{case.constraints.text()}")


def _search(algorithm: str, case, system, cost, settings, executor, progress=None):
    from marssim.search.serve import mars_serve, serve_exhaustive, serve_grid_search

    if algorithm == "mars":
        return mars_serve(case, system, cost, settings, executor=executor, progress=progress)
    if algorithm == "uniform_grid":
        return serve_grid_search(case, system, cost, settings, executor=executor)
    return serve_exhaustive(case, system, cost, settings, executor=executor)


def _header(result, case) -> str:
    from marssim.search.result import deployment_figures

    text = f"# {result.algorithm} search, objective {result.objective}, seed {result.seed}"
    if result.interrupted:
        text += " (interrupted)"
    text += f"\n# constraints: {case.constraints.text()}"
    text += f"\n# simulated: {deployment_figures(result.evaluation)}"
    text += "\n# `marssim serve --deployment THIS_FILE` simulates it again, to these figures\n"
    return text


def save_deployment(result, case, system, model_spec: str, args, path: str | Path) -> Path:
    """The best deployment as a file ``marssim serve --deployment`` reads: model, system, pools,
    router, the requests (at the goodput found, for that objective) and their seed, the
    per-request bounds of the constraints."""
    import yaml

    from marssim.fsutil import atomic_file
    from marssim.mapping.systemref import canonical_system_ref
    from marssim.serve.deployment import deployment_to_dict

    # ``marssim serve`` reads a system path from where it runs: a file's is written absolute
    data: dict = {"model": model_spec, "system": canonical_system_ref(system)}
    data.update(deployment_to_dict(result.best))
    data["requests"] = requests_section(args, result.evaluation.rate if case.goodput else None, case.seed)
    slo = case.constraints.request_slo()
    bounds = {k: f"{getattr(slo, k)!r} s" for k in ("ttft", "tpot", "e2e") if getattr(slo, k) is not None}
    if bounds:
        data["slo"] = bounds
    text = _header(result, case) + yaml.safe_dump(data, sort_keys=False, default_flow_style=None, width=110)
    with atomic_file(path) as handle:
        handle.write(text)
    return Path(path)


def resimulate(result, case, system, cost):
    """The best deployment's full simulation (at its reported rate), checked to give the
    figures the search reported."""
    from marssim.serve.case import simulate_case

    e = result.evaluation
    run = simulate_case(result.best, case, system, cost, e.rate if case.goodput else None)
    s = run.summary
    again = (s["ttft_s"]["p99"], s["tbt_s"]["p99"], s["output_tokens_per_s"])
    reported = (e.latency.get("ttft_p99"), e.latency.get("tbt_p99"), e.throughput)
    if again != reported:
        raise RuntimeError(f"the best deployment simulates to {again}, the search reported {reported}")
    return run


def write_outputs(result, case, system, cost, out: str | Path, model_spec: str, args, baselines: tuple = ()
                  ) -> list[str]:
    """Write into ``out`` atomically: ``best_deployment.yaml`` (and beside it ``launch_vllm.sh``,
    ``launch_sglang.sh``: :mod:`marssim.serve.launch`), ``search.json``,
    ``history.csv``, ``top10.csv``, ``convergence.png``/``.svg`` and ``result/`` (the best
    deployment's simulation: summary.json and the tables of ``marssim serve --out``),
    ``pareto.csv`` and ``pareto.png``/``.svg`` (the Pareto fronts of the simulated deployments
    meeting the constraints: :mod:`marssim.search.pareto`). The best deployment is simulated
    again and must give the reported figures. One line per file."""
    from marssim.fsutil import staged_dir
    from marssim.serve import outputs

    run = resimulate(result, case, system, cost)
    out_dir = Path(out)
    lines: list[str] = []
    from marssim.serve.launch import launch_commands, write_launch_scripts

    with staged_dir(out_dir) as tmp:
        save_deployment(result, case, system, model_spec, args, tmp / DEPLOYMENT_FILE)
        lines.append(f"deployment   {out_dir / DEPLOYMENT_FILE} (marssim serve --deployment ...)")
        for path in write_launch_scripts(launch_commands(result.best, case.model, model_spec), result.best, tmp):
            lines.append(f"launch       {out_dir / path.name} (the best deployment's engine command lines)")
        lines += _searching.write_search_files(result, None, system, baselines, tmp, out_dir)
        written = write_pareto(front_of([result], result.objective), tmp, _pareto_title(case, system),
                               result.objective)
        lines += [f"pareto       {out_dir / p.name}" for p in written]
        (tmp / "result").mkdir()
        outputs.write_tables(run, tmp / "result")
        lines.append(f"result       {out_dir / 'result'}/ (summary.json, requests.csv, iterations.csv, replicas.csv)")
    return lines


def keep_interrupted(result, case, system, args, model_spec: str) -> int:
    """Ctrl-C: write the best deployment so far (``--out DIR/best_deployment.yaml`` with
    ``history.csv`` and ``search.json``, else :data:`INTERRUPTED_FILE`), say where; exit 130."""
    from marssim.fsutil import staged_dir
    from marssim.search.report import search_summary
    from marssim.search.result import deployment_figures

    if args.out:
        with staged_dir(Path(args.out)) as tmp:
            save_deployment(result, case, system, model_spec, args, tmp / DEPLOYMENT_FILE)
            result.history.to_csv(tmp / "history.csv", index=False)
            (tmp / "search.json").write_text(json.dumps(search_summary(result, None, system), indent=2,
                                                        sort_keys=True) + "\n")
        path = Path(args.out) / DEPLOYMENT_FILE
    else:
        path = Path(INTERRUPTED_FILE)
        save_deployment(result, case, system, model_spec, args, path)
    print(f"interrupted after {len(result.history)} generations ({result.simulations} simulations, "
          f"{result.estimates} screens): the best deployment so far ({deployment_figures(result.evaluation)}, "
          f"simulated) is in {path}; `marssim serve --deployment {path}` simulates it", file=sys.stderr)
    return 130


# ---------------------------------------------------------------------------- compare
def compare_table(results: list):
    """One row per search: the objective in its unit, the change against the first row (%),
    GPUs, rate or goodput, TTFT and TBT P99 (ms), $/M tokens, screens, simulations, wall time,
    the best deployment."""
    import pandas as pd

    from marssim.search.report import fitness_display

    rows = []
    base = None
    for r in results:
        e = r.evaluation
        label, value = fitness_display(r.objective, r.fitness)
        base = value if base is None else base
        rows.append({"algorithm": r.algorithm, "objective": label, "value": value,
                     "vs_grid_pct": (value / base - 1) * 100 if base else float("nan"), "gpus": e.gpus,
                     "rate_rps": e.goodput if r.objective == "goodput" else e.rate,
                     "ttft_p99_ms": e.latency.get("ttft_p99", float("nan")) * 1e3,
                     "tbt_p99_ms": e.latency.get("tbt_p99", float("nan")) * 1e3, "cost_per_mtok": e.cost_per_mtok,
                     "screened": r.estimates, "simulations": r.simulations, "runs": r.notes.get("runs", 0),
                     "wall_s": r.wall_s, "best": r.best.text(), "best_short": _short(r.best)})
    return pd.DataFrame(rows)


def format_compare(table, objective: str) -> str:
    from marssim.search.report import WIDTH
    from marssim.tables import wrap_last_cell

    rate = "goodput" if objective == "goodput" else "req/s"
    lines = [f"{'algorithm':<14}{'value':>10}{'vs grid':>9}{'GPUs':>6}{rate:>9}{'TTFT P99':>10}{'TBT P99':>9}"
             f"{'$/Mtok':>8}{'screened':>9}{'sims':>6}{'wall s':>8}  best deployment"]
    for r in table.itertuples():
        cost = f"{r.cost_per_mtok:>8.3g}" if r.cost_per_mtok == r.cost_per_mtok else f"{'-':>8}"
        line = (f"{r.algorithm:<14}{r.value:>10.4g}{r.vs_grid_pct:>+8.1f}%{r.gpus:>6d}{r.rate_rps:>9.4g}"
                f"{r.ttft_p99_ms:>10.1f}{r.tbt_p99_ms:>9.1f}{cost}{r.screened:>9d}{r.simulations:>6d}"
                f"{r.wall_s:>8.1f}  ")
        best = r.best if len(r.best) <= WIDTH - len(line) else r.best_short
        lines += wrap_last_cell(line, best, WIDTH)
    return "\n".join(lines)


def _short(dep) -> str:
    from marssim.search.report import short_deployment

    return short_deployment(dep)


def run_compare(args: argparse.Namespace) -> int:
    """``marssim compare --model ...``: the uniform grid, the GA seeded with its best, and
    exhaustive search when the space is small enough, on the same case; one table, and the Pareto
    front of every deployment they simulated (with ``--csv NAME.csv``: beside it
    ``NAME-pareto.csv`` and ``NAME-pareto.png``/``.svg``)."""
    from dataclasses import replace

    from marssim.fsutil import atomic_file
    from marssim.search.serve import ServeSpace, all_deployments, mars_serve, serve_exhaustive, serve_grid_search

    case, system, cost, settings, _ = serving_inputs(args)
    quiet = args.quiet or not sys.stderr.isatty()
    results = []
    with _searching.open_executor(args) as executor:
        if not quiet:
            print("uniform grid: running", file=sys.stderr)
        grid = serve_grid_search(case, system, cost, settings, executor=executor)
        results.append(grid)
        seeds = [c.plan for c in grid.top(settings.grid_simulate) if c.simulated is not None]
        if not quiet:
            print("mars: running", file=sys.stderr)
        results.append(mars_serve(case, system, cost, replace(settings, seed_with_grid=False), executor=executor,
                                  seeds=seeds))
        limit = args.exhaustive_limit
        if limit:
            import itertools

            space = ServeSpace.of(case, system, settings)
            size = sum(1 for _ in itertools.islice(all_deployments(space), limit + 1))
            if size <= limit:
                if not quiet:
                    print(f"exhaustive: {size} deployments", file=sys.stderr)
                results.append(serve_exhaustive(case, system, cost, settings, executor=executor, limit=limit))
    table = compare_table(results)
    print(f"{system.spec} / {case.model.name} / {case.spec.text()} / constraints {case.constraints.text()} / "
          f"objective {settings.objective} / seed {settings.seed}")
    print(format_compare(table, settings.objective))
    front = front_of(results, settings.objective)
    print()
    print(pareto_text(front, results))
    if args.csv:
        with atomic_file(args.csv) as handle:
            table.to_csv(handle, index=False)
        print(f"\ntable        {args.csv}")
        written = write_pareto_beside(front, Path(args.csv), _pareto_title(case, system), settings.objective)
        for path in written:
            print(f"pareto       {path}")
    return 0


def write_pareto_beside(table, csv: Path, title: str, objective: str) -> list[Path]:
    """``compare --csv DIR/NAME.csv``'s fronts: ``DIR/NAME-pareto.csv`` and
    ``DIR/NAME-pareto.png``/``.svg``, each written whole or not at all."""
    import shutil
    import tempfile

    stem = f"{csv.stem}-pareto"
    tmp = Path(tempfile.mkdtemp(prefix=f".{stem}.", dir=csv.parent))
    try:
        written = write_pareto(table, tmp, title, objective)
        out = []
        for path in written:
            target = csv.with_name(stem + path.suffix)
            path.replace(target)
            out.append(target)
        return out
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
