"""``marssim validate``: the analytical estimate (and a user's numbers) against the simulator."""

from __future__ import annotations

import argparse
import sys

from ._common import add_cost_args, check_output_dir, cost_model, positive_int, seed_arg

VERB = "validate"
ORDER = 60


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        VERB, help="compare the analytical estimate with simulation over many mappings",
        description="Evaluate many mappings both ways, analytically (no link contention) and by simulation, and "
                    "report per mapping the relative error; over all of them the median, p90 and max error, the "
                    "rank correlation (Kendall tau, Spearman rho) and which resources' contention explains the "
                    "largest gaps. Writes validate.csv, summary.txt, attribution.csv and a scatter plot "
                    "(scatter.png/.svg) into --out. With --published TABLE: predict runs others measured (a table "
                    "of systems, workloads, parallel configurations and measured iteration times, or of serving "
                    "runs: a model's deployment, a batch of equal requests and the output tokens/s measured; "
                    "shipped: korthikanti2022-table5, nemo2407-h100-fp8, nemo2403-h100-fp8-long-context, "
                    "megatron-bridge-2511-fp8, megatron-bridge-2511-mxfp8, megatron-bridge-2604-fp8-fp4, "
                    "megatron-bridge-2604-moe, megatron-bridge-2604-qwen3-235b, "
                    "trtllm-1.0-h100-h200-fp8-throughput) and print per row the error and where the predicted "
                    "time went, and the mean and worst error; writes published.csv into --out.")
    p.add_argument("--published", metavar="TABLE",
                   help="a CSV of published measured runs, or a shipped table's name (korthikanti2022-table5, "
                        "nemo2407-h100-fp8, ...)")
    p.add_argument("--how", choices=("simulate", "estimate"), default="simulate",
                   help="with --published: predict training runs by simulation (default) or by the analytical "
                        "estimate (serving runs are always simulated)")
    p.add_argument("--system", metavar="SYSTEM", help="system YAML or shipped name")
    p.add_argument("--workload", metavar="SPEC", help="zoo spec like resnet50:batch=8 or an .onnx file")
    p.add_argument("--batch", type=positive_int, help="override the workload's batch")
    src = p.add_mutually_exclusive_group()
    src.add_argument("--mappings", metavar="DIR", help="evaluate every mapping YAML in DIR (named by file stem)")
    src.add_argument("--sample", type=positive_int, metavar="N",
                     help="draw N mappings from the mapping space (default 50): a third uniformly, a third "
                          "pipelines with the most micro-batches, a third with channel sharding on every layer")
    p.add_argument("--seed", type=seed_arg, default=0, help="seed for --sample (default 0)")
    p.add_argument("--max-sets", dest="max_sets", type=positive_int, help="at most this many accelerator sets when sampling")
    p.add_argument("--estimates", metavar="FILE.csv",
                   help="also compare your own numbers: columns mapping,makespan_s (per mapping: name or key prefix) "
                        "or op,time_s (per layer, optional mapping column)")
    p.add_argument("--out", metavar="DIR", help="output directory (default validate-out; with --published: none)")
    p.add_argument("--workers", type=positive_int, default=1, help="evaluate mappings in N processes (default 1)")
    p.add_argument("--memory-policy", dest="memory_policy", choices=("error", "spill"), default="error",
                   help="mappings that overflow a memory are left out (error, default) or spill to host DRAM")
    p.add_argument("--quiet", action="store_true", help="no progress line on stderr")
    add_cost_args(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from marssim.errors import InputError
    from marssim.system import load_system
    from marssim.search.sample import sample_mappings
    from marssim.validate import load_mapping_dir, read_estimates, validate
    from marssim.workload import load_workload

    if args.published:
        return run_published(args)
    if args.how != "simulate":
        raise InputError(None, "--how", "applies with --published (mappings are always both estimated and simulated)")
    if not args.system or not args.workload:
        raise InputError(None, "arguments", "give --system and --workload (or --published TABLE)")
    args.out = args.out or "validate-out"
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
        from marssim.search.parallel import worker_pool

        with worker_pool(args.workers, ignore_ctrl_c=False) as pool:
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


_MAPPING_FLAGS = (("--system", "system"), ("--workload", "workload"), ("--batch", "batch"), ("--mappings", "mappings"),
                  ("--sample", "sample"), ("--estimates", "estimates"), ("--max-sets", "max_sets"))


def run_published(args: argparse.Namespace) -> int:
    """``--published TABLE``: predict every row, print the errors, write ``published.csv``."""
    from marssim.errors import InputError
    from marssim.validate.published import format_predictions, load_published, predict_all, write_predictions

    given = [flag for flag, dest in _MAPPING_FLAGS if getattr(args, dest, None) is not None]
    if given:
        raise InputError(None, given[0], "does not apply with --published (each row names its system, workload and "
                                         "parallel configuration)")
    check_output_dir(args.out)
    runs = load_published(args.published)
    quiet = args.quiet or not sys.stderr.isatty()

    def progress(p) -> None:
        if not quiet:
            print(f"{p.run.name}: {p.wall_s:.1f} s", file=sys.stderr)

    if args.workers > 1:
        from marssim.search.parallel import open_executor

        with open_executor(args.workers) as pool:
            predictions = predict_all(runs, cost_model(args), args.how, executor=pool, progress=progress)
    else:
        predictions = predict_all(runs, cost_model(args), args.how, progress=progress)
    how = "simulate" if predictions and all(p.how == "simulate" for p in predictions) else args.how
    print(f"{args.published}: {len(runs)} published runs, predicted by {how}")
    print(format_predictions(predictions))
    if args.out:
        from pathlib import Path

        Path(args.out).mkdir(parents=True, exist_ok=True)
        print(f"\nwrote     {write_predictions(predictions, Path(args.out) / 'published.csv')}")
    return 0


def _progress(done: int, total: int) -> None:
    print(f"\r{done}/{total} mappings", end="" if done < total else "\n", file=sys.stderr, flush=True)
