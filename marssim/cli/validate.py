"""``marssim validate``: the analytical estimate (and a user's numbers) against the simulator."""

from __future__ import annotations

import argparse
import sys

from ._common import add_cost_args, check_output_dir, cost_model, positive_int

VERB = "validate"
ORDER = 60


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        VERB, help="compare the analytical estimate with simulation over many mappings",
        description="Evaluate many mappings both ways, analytically (no link contention) and by simulation, and "
                    "report per mapping the relative error; over all of them the median, p90 and max error, the "
                    "rank correlation (Kendall tau, Spearman rho) and which resources' contention explains the "
                    "largest gaps. Writes validate.csv, summary.txt, attribution.csv and a scatter plot "
                    "(scatter.png/.svg) into --out.")
    p.add_argument("--system", required=True, metavar="SYSTEM", help="system YAML or shipped name")
    p.add_argument("--workload", required=True, metavar="SPEC", help="zoo spec like resnet50:batch=8 or an .onnx file")
    p.add_argument("--batch", type=positive_int, help="override the workload's batch")
    src = p.add_mutually_exclusive_group()
    src.add_argument("--mappings", metavar="DIR", help="evaluate every mapping YAML in DIR (named by file stem)")
    src.add_argument("--sample", type=positive_int, metavar="N",
                     help="draw N mappings from the mapping space (default 50): a third uniformly, a third "
                          "pipelines with the most micro-batches, a third with channel sharding on every layer")
    p.add_argument("--seed", type=int, default=0, help="seed for --sample (default 0)")
    p.add_argument("--max-sets", dest="max_sets", type=positive_int, help="at most this many accelerator sets when sampling")
    p.add_argument("--estimates", metavar="FILE.csv",
                   help="also compare your own numbers: columns mapping,makespan_s (per mapping: name or key prefix) "
                        "or op,time_s (per layer, optional mapping column)")
    p.add_argument("--out", metavar="DIR", default="validate-out", help="output directory (default validate-out)")
    p.add_argument("--workers", type=positive_int, default=1, help="evaluate mappings in N processes (default 1)")
    p.add_argument("--memory-policy", dest="memory_policy", choices=("error", "spill"), default="error",
                   help="mappings that overflow a memory are left out (error, default) or spill to host DRAM")
    p.add_argument("--quiet", action="store_true", help="no progress line on stderr")
    add_cost_args(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from marssim.system import load_system
    from marssim.search.sample import sample_mappings
    from marssim.validate import load_mapping_dir, read_estimates, validate
    from marssim.workload import load_workload

    check_output_dir(args.out)
    system = load_system(args.system)
    graph = load_workload(args.workload, batch=args.batch)
    estimates = read_estimates(args.estimates) if args.estimates else None
    meta = {}
    if args.mappings:
        mappings = load_mapping_dir(args.mappings, graph, system)
    else:
        n = args.sample or 50
        mappings = sample_mappings(graph, system, n, seed=args.seed, max_sets=args.max_sets)
        meta["seed"] = args.seed
    progress = None if args.quiet or not sys.stderr.isatty() else _progress
    if args.workers > 1:
        from concurrent.futures import ProcessPoolExecutor

        with ProcessPoolExecutor(max_workers=args.workers) as pool:
            report = validate(graph, system, mappings, cost_model(args), memory_policy=args.memory_policy,
                              estimates=estimates, executor=pool, progress=progress, meta=meta)
    else:
        report = validate(graph, system, mappings, cost_model(args), memory_policy=args.memory_policy,
                          estimates=estimates, progress=progress, meta=meta)
    paths = report.save(args.out)
    print(report.text())
    print()
    print("\n".join(f"wrote     {p}" for p in paths))
    return 0


def _progress(done: int, total: int) -> None:
    print(f"\r{done}/{total} mappings", end="" if done < total else "\n", file=sys.stderr, flush=True)
