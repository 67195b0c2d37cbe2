"""``marssim compare``: the GA and every baseline on one case, in one table."""

from __future__ import annotations

import argparse
import sys

from marssim.errors import InputError

from ._searching import open_executor
from .search import add_search_args, load_case, llm_settings

VERB = "compare"
ORDER = 55


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        VERB, help="run the MARS GA and all baselines on one case and print one table",
        description="Run data_parallel, h2h, the MARS GA (seeded with both baselines' mappings), random search "
                    "simulating as many mappings as the GA evaluated (simulated or estimated), and exhaustive search "
                    "when the space has at most "
                    "--exhaustive-limit points, each with its own evaluation cache; print makespan, the change "
                    "against data_parallel, simulations and wall time. For an LLM workload on a GPU cluster: the "
                    "Megatron grid of uniform configurations (uniform layers on every GPU kind) and the MARS "
                    "search over parallel configurations, on the same evaluator; with --also-system, the same on other "
                    "systems of as many GPUs, and one table of each system's winning configuration: iteration "
                    "time, MFU, tokens per second, memory peak. For serving deployments (--model): the grid of "
                    "uniform deployments, the MARS search seeded with its best, and exhaustive search when the "
                    "space has at most --exhaustive-limit deployments.")
    add_search_args(p)
    p.add_argument("--also-system", dest="also_system", action="append", default=[], metavar="SYSTEM",
                   help="an LLM workload: compare on this system too (as many GPUs as --system; repeat for more)")
    p.add_argument("--exhaustive-limit", dest="exhaustive_limit", type=int, default=20_000, metavar="N",
                   help="run exhaustive search when the space has at most N points (default 20000; 0: never)")
    p.add_argument("--csv", metavar="FILE", help="also write the table as CSV")
    p.set_defaults(func=run)


def format_table(table, objective: str) -> str:
    """The comparison of per-op mapping searches as aligned text."""
    from marssim.search.report import fitness_display

    label, _ = fitness_display(objective, 1.0)
    lines = [f"{'algorithm':<15}{'makespan ms':>14}{'vs data_parallel':>18}{'simulations':>13}{'estimates':>11}"
             f"{'wall s':>9}"
             + (f"  {label}" if objective != "latency" else "")]
    for row in table.itertuples():
        extra = f"  {fitness_display(objective, row.fitness)[1]:.6g}" if objective != "latency" else ""
        lines.append(f"{row.algorithm:<15}{row.makespan_ms:>14.4f}{row.vs_data_parallel_pct:>+17.1f}%"
                     f"{row.simulations:>13d}{row.estimates:>11d}{row.wall_s:>9.1f}{extra}")
    return "\n".join(lines)


def llm_table(results, system: str = ""):
    """One row per LLM search: best configuration, its simulated time (ms), MFU, memory peak
    (GiB), the change against the first row (%), screened, rejected by memory, simulated, wall
    time (s); ``system``: a column naming the system (several systems compared)."""
    import pandas as pd

    rows = []
    base = None
    for r in results:
        e = r.evaluation
        value = e.time_s
        base = value if base is None else base
        rows.append({**({"system": system} if system else {}), "algorithm": r.algorithm, "best": r.best.text(),
                     "time_ms": value * 1e3, "mfu": e.mfu, "memory_GiB": e.memory_peak / 2**30,
                     "vs_grid_pct": (value / base - 1) * 100, "screened": r.estimates,
                     "rejected_memory": r.rejected_memory, "simulations": r.simulations, "wall_s": r.wall_s})
    return pd.DataFrame(rows)


def systems_table(rows) -> str:
    """The winning configuration of each system (``rows``: ``(system, GPU capacity in bytes,
    tokens per iteration, its better search result)``) in one table within 120 columns, a long
    configuration continued on the next lines."""
    from marssim.search.report import WIDTH
    from marssim.tables import wrap_last_cell

    name = max([30, *(len(str(row[0])) + 1 for row in rows)])
    lines = [f"{'system':<{name}}{'iteration ms':>13}{'MFU':>7}{'tok/s/GPU':>10}{'memory GiB':>14}  winning configuration"]
    for system, capacity, tokens, r in rows:
        e = r.evaluation
        gpus = r.best.gpus
        rate = tokens / e.makespan / gpus if e.makespan > 0 else 0.0
        line = (f"{system:<{name}}{e.makespan * 1e3:>13.1f}{e.mfu:>7.1%}{rate:>10,.0f}"
                f"{e.memory_peak / 2**30:>7.1f} of {capacity / 2**30:>3.0f}  ")
        lines += wrap_last_cell(line, r.best.text(), WIDTH)
    return "\n".join(lines)


def format_llm_table(table) -> str:
    from marssim.search.report import WIDTH
    from marssim.tables import wrap_last_cell

    lines = [f"{'algorithm':<15}{'time ms':>11}{'vs grid':>9}{'MFU':>7}{'mem GiB':>8}{'screened':>9}{'rejected':>9}"
             f"{'simulated':>10}{'wall s':>7}  best configuration"]
    for r in table.itertuples():
        line = (f"{r.algorithm:<15}{r.time_ms:>11.3f}{r.vs_grid_pct:>+8.1f}%{r.mfu:>7.1%}{r.memory_GiB:>8.1f}"
                f"{r.screened:>9d}{r.rejected_memory:>9d}{r.simulations:>10d}{r.wall_s:>7.1f}  ")
        lines += wrap_last_cell(line, r.best, WIDTH)
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    from dataclasses import replace

    from marssim.fsutil import atomic_file
    from marssim.search import compare
    from marssim.workload.llm import require_transformer

    from .search import mapping_settings

    from ._common import check_output_file

    check_output_file(args.csv, "--csv", (".csv",))
    if args.exhaustive_limit < 0:
        raise InputError(None, "--exhaustive-limit", f"expected 0 or a positive integer, got {args.exhaustive_limit}")
    from ._serve_search import run_compare, serving_requested
    from .search import plan_case

    if serving_requested(args):
        if args.also_system:
            raise InputError(None, "--also-system", "applies to an LLM's parallel configurations; a serving "
                                                    "comparison (--model) runs on one system")
        return run_compare(args)
    plan_case(args)
    graph, system, cost, llm = load_case(args)
    quiet = args.quiet or not sys.stderr.isatty()
    if args.also_system and not llm:
        raise InputError(None, "--also-system", "applies to an LLM workload (gpt:, llama:, moe: or a preset) on GPU "
                                                "clusters")
    if llm:
        import pandas as pd

        from marssim.search.llm import grid_search, llm_search_available, mars_llm
        from marssim.system import load_system

        systems = [system] + [load_system(spec) for spec in args.also_system]
        for other in systems[1:]:
            if len(other.accelerators) != len(system.accelerators):
                raise InputError(other.spec, "--also-system", f"has {len(other.accelerators)} GPUs; expected "
                                                              f"{len(system.accelerators)}, as --system has")
            if not llm_search_available(graph, other):
                raise InputError(other.spec, "--also-system", "expected a cluster of GPUs")
        settings = llm_settings(args, graph)
        tables, winners = [], []
        t = require_transformer(graph, "the search over parallel configurations")
        for one in systems:
            with open_executor(args) as executor:
                grid = grid_search(graph, one, cost, settings, executor=executor)
                mars = mars_llm(graph, one, cost, settings, executor=executor)
            table = llm_table([grid, mars], system=one.spec if len(systems) > 1 else "")
            tables.append(table)
            best = min((grid, mars), key=lambda r: r.evaluation.makespan)
            capacity = min(a.memory.capacity for a in one.accelerators)
            winners.append((one.spec, capacity, best.best.batch * t.seq, best))
            print(f"{one.spec} / {graph.spec} / objective {settings.objective} / seed {settings.seed}")
            print(format_llm_table(table.drop(columns=["system"], errors="ignore")))
            print()
        if len(systems) > 1:
            print(f"winning configuration per system, {len(system.accelerators)} GPUs each (simulated; MFU over each "
                  "GPU's dense peak for the model's tensor type: bf16 under an FP8 recipe, whose GEMM inputs alone "
                  "are FP8; memory: the busiest GPU's peak of its capacity)")
            print(systems_table(winners))
        table = pd.concat(tables, ignore_index=True)
    else:
        settings = replace(mapping_settings(args), exhaustive_limit=args.exhaustive_limit)

        from marssim.progress import SearchDone, SearchStarted

        def progress(event: SearchStarted | SearchDone) -> None:
            if quiet:
                return
            match event:
                case SearchStarted(algorithm=name):
                    print(f"{name}: running", file=sys.stderr)
                case SearchDone(algorithm=name, result=result):
                    print(f"{name}: {result.summary()}", file=sys.stderr)

        with open_executor(args) as executor:
            table, _ = compare(graph, system, cost, settings, executor=executor, progress=progress)
        print(f"{system.name} / {graph.spec} / objective {settings.objective} / seed {settings.seed}")
        print(format_table(table, settings.objective))
    if args.csv:
        with atomic_file(args.csv) as handle:
            table.to_csv(handle, index=False)
        print(f"\ntable        {args.csv}")
    return 0
