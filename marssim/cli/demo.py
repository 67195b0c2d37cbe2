"""``marssim demo``: the main job end to end on built-in defaults, in about a minute at most.

ResNet-50 (batch 8) on the adaptive 16-accelerator system: the data-parallel and H2H baselines,
the hand-written example mapping, a short MARS search seeded with both baselines (stopped by a
count of evaluations, so its result is the same on every machine); the best mapping
simulated in full, its analytical estimate checked against the simulation, and its trace,
figures, mapping and result written to ``--out``.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from ._common import add_cost_args, check_output_dir, cost_model, seed_arg

VERB = "demo"
ORDER = 5

DEFAULT_SYSTEM = "mars-adaptive-16"
DEFAULT_WORKLOAD = "resnet50:batch=8"


DEFAULT_EVALUATIONS = 600
"""Evaluations (simulations and analytical estimates) after which the demo's MARS search stops,
at the end of the generation that passes them: three generations of the default case, about
half a minute on one laptop core. A count, not a time, so every machine finds the same mapping."""


def register(sub: argparse._SubParsersAction) -> None:
    from ._common import positive_int

    p = sub.add_parser(
        VERB, help="run the main job on built-in defaults: baselines, a MARS search, simulation, trace, figures",
        description="Map ResNet-50 (batch 8) onto the adaptive 16-accelerator system (topologies/"
                    "mars-adaptive-16.yaml): evaluate the data-parallel and H2H baselines and the hand-written "
                    "example mapping, run a short MARS search, then simulate the best mapping in full, compare "
                    "its analytical estimate with the simulation, and write its mapping, result, Perfetto "
                    "trace and figures into --out.")
    p.add_argument("--out", metavar="DIR", default="marssim-demo", help="output directory (default marssim-demo)")
    p.add_argument("--system", metavar="SYSTEM", default=DEFAULT_SYSTEM, help=f"default {DEFAULT_SYSTEM}")
    p.add_argument("--workload", metavar="SPEC", default=DEFAULT_WORKLOAD, help=f"default {DEFAULT_WORKLOAD}")
    p.add_argument("--evaluations", type=positive_int, default=DEFAULT_EVALUATIONS, metavar="N",
                   help="the MARS search stops at the end of the generation that passes N evaluations "
                        f"(simulations and analytical estimates; default {DEFAULT_EVALUATIONS}): the same mapping on "
                        "every machine")
    p.add_argument("--seed", type=seed_arg, default=0, help="search seed (default 0)")
    p.add_argument("--workers", type=positive_int, default=1, help="processes evaluating candidates (default 1)")
    add_cost_args(p)
    p.set_defaults(func=run)


def _example_mapping(system_name: str, workload: str) -> Path | None:
    from marssim.system import topologies_dir
    from marssim.workload import parse_spec

    path = topologies_dir() / "mappings" / f"{system_name}-{parse_spec(workload)[0]}.yaml"
    return path if path.is_file() else None


def run(args: argparse.Namespace) -> int:
    from marssim.analytical import estimate
    from marssim.search.parallel import worker_pool
    from marssim.fsutil import staged_dir
    from marssim.lower import lower
    from marssim.mapping import load_mapping, save_mapping
    from marssim.search.evaluate import Evaluator, Problem
    from marssim.search.ga import GAConfig
    from marssim.search.runner import SearchSettings, run_algorithm
    from marssim.sim import simulate
    from marssim.system import load_system
    from marssim.trace import plot_result, write_chrome_trace
    from marssim.workload import load_workload

    check_output_dir(args.out)
    t_start = time.perf_counter()
    system = load_system(args.system)
    graph = load_workload(args.workload)
    cost = cost_model(args)
    print(f"system    {system.name}: {len(system.accelerators)} accelerators, {len(system.designs)} designs "
          f"({', '.join(system.designs)})")
    print(f"workload  {graph.spec}: {graph.macs / 1e9:.3f} GMACs in {len(graph.compute_ops)} ops, "
          f"{len(graph.layers)} layers")
    print()

    rows: list[tuple[str, float, float, str]] = []
    executor = worker_pool(args.workers, ignore_ctrl_c=False) if args.workers > 1 else None
    try:
        settings = SearchSettings(config=GAConfig(max_evaluations=args.evaluations), seed=args.seed)
        baselines = {}
        for name in ("data_parallel", "h2h"):
            r = baselines[name] = run_algorithm(name, graph, system, cost, settings, executor=executor)
            rows.append((name, r.makespan, r.evaluation.throughput, f"{r.simulations} simulations"))
            print(f"{name:<16}{r.makespan * 1e3:>10.3f} ms   ({r.simulations} simulations, {r.wall_s:.1f} s)")
        example = _example_mapping(system.name, args.workload)
        if example is not None:
            mapping, _, _ = load_mapping(example, system=system, workload=graph)
            e = Evaluator(Problem(graph, system, cost)).simulate([mapping])[0]
            rows.append(("hand-written", e.makespan, e.throughput, str(example)))
            print(f"{'hand-written':<16}{e.makespan * 1e3:>10.3f} ms   ({example})")
        print(f"mars            searching ({args.evaluations} evaluations) ...", flush=True)
        best = run_algorithm("mars", graph, system, cost, settings, executor=executor, baselines=baselines)
        rows.append(("mars", best.makespan, best.evaluation.throughput,
                     f"{best.simulations} simulations, {best.estimates} estimates"))
        print(f"{'mars':<16}{best.makespan * 1e3:>10.3f} ms   ({best.simulations} simulations, "
              f"{best.estimates} analytical estimates, {best.wall_s:.1f} s)")
    finally:
        if executor is not None:
            executor.shutdown()

    base = rows[0][1]
    print()
    print(f"{'mapping':<16}{'latency ms':>12}{'vs data-parallel':>18}{'samples/s':>12}")
    for name, makespan, throughput, _ in rows:
        print(f"{name:<16}{makespan * 1e3:>12.3f}{(makespan / base - 1) * 100:>17.1f}%{throughput:>12.1f}")

    mapping = best.best
    tg = lower(graph, system, mapping, cost)
    result = simulate(tg, system)
    est = estimate(tg, system)
    error = (est.makespan - result.makespan) / result.makespan
    print()
    print(f"best mapping: {len(mapping.sets)} accelerator sets "
          f"({', '.join(f'{len(s.devices)}x {s.design}' for s in mapping.sets)}), {mapping.n_stages} pipeline "
          f"stages, {mapping.micro_batches} micro-batches")
    print(f"analytical estimate {est.makespan * 1e3:.3f} ms vs simulation {result.makespan * 1e3:.3f} ms "
          f"({error:+.1%}: the difference is contention the estimate leaves out)")

    out = Path(args.out)
    with staged_dir(out) as tmp:
        save_mapping(mapping, graph, tmp / "best_mapping.yaml")
        result.save(tmp / "result")
        size = write_chrome_trace(result, tmp / "trace.json.gz")
        figures = plot_result(result, tmp / "timeline.png")
    print()
    print(f"wrote {out}/: best_mapping.yaml, result/, trace.json.gz ({size / 2**20:.2f} MiB), "
          f"{', '.join(Path(f).name for f in figures)}")
    print(f"open {out}/trace.json.gz in https://ui.perfetto.dev; re-simulate with "
          f"`marssim simulate --mapping {out}/best_mapping.yaml`")
    print(f"done in {time.perf_counter() - t_start:.1f} s")
    return 0
