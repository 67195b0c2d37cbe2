"""``marssim simulate``: evaluate one mapping by discrete-event simulation."""

from __future__ import annotations

import argparse

from ._common import add_cost_args, add_output_args, check_outputs, cost_model, load_inputs, positive_int, write_outputs

VERB = "simulate"
ORDER = 40


def add_mapping_args(p: argparse.ArgumentParser) -> None:
    """The mapping to evaluate: --mapping FILE, or --system and --workload (one set of every
    accelerator, --strategy, --micro-batches); --batch."""
    p.add_argument("--mapping", metavar="FILE", help="mapping YAML (see topologies/mappings/)")
    p.add_argument("--system", metavar="SYSTEM", help="system YAML or shipped name (overrides the mapping's)")
    p.add_argument("--workload", metavar="SPEC", help="zoo spec like resnet50:batch=8 or an .onnx file")
    p.add_argument("--batch", type=positive_int, help="override the workload's batch")
    p.add_argument("--strategy",
                   help="without --mapping: sharding preference list, first legal wins (default dp)")
    p.add_argument("--micro-batches", dest="micro_batches", type=positive_int,
                   help="without --mapping: micro-batches (default 1)")


def add_parallel_args(p: argparse.ArgumentParser) -> None:
    """--parallel CONFIG and its companions (an LLM workload on a GPU cluster)."""
    p.add_argument("--parallel", metavar="CONFIG",
                   help="an LLM workload's parallel configuration, e.g. tp=8,pp=2,dp=8,sp=true,schedule=1f1b,"
                        "micro_batch=1,global_batch=512,recompute=selective,zero=1 (see docs/parallelism.md); "
                        "micro_batch defaults to the workload's batch")
    p.add_argument("--no-fold", dest="fold", action="store_false",
                   help="with --parallel: simulate every GPU, not one per class of identical GPUs (same result, slower)")
    p.add_argument("--trace-gpus", metavar="IDS",
                   help="with --parallel: GPUs to show in the trace and interval log (e.g. gpu[0-15],gpu512); "
                        "default: one per class of identical GPUs")
    p.add_argument("--estimate", action="store_true",
                   help="with --parallel: also print the analytical estimate's report")


def add_report_args(p: argparse.ArgumentParser) -> None:
    """How the per-layer report is printed: --per-op, --group block|stage, --no-report."""
    p.add_argument("--per-op", dest="per_op", action="store_true",
                   help="print the report per op instead of per layer group")
    p.add_argument("--group", choices=("block", "stage"), default="block",
                   help="layer groups of the report: block (a transformer block, a ResNet bottleneck; default) or "
                        "stage (all blocks of a ResNet stage)")
    p.add_argument("--no-report", dest="report", action="store_false", help="print no per-layer report")


def print_report(result, args: argparse.Namespace) -> None:
    """The summary, then the per-layer (or per-op) report the flags ask for."""
    print(result.summary())
    if args.report:
        print()
        if args.per_op:
            print(result.layer_report(per_op=True))
        else:
            print(result.layer_report(level=args.group))


MAX_STREAMS = 1024
"""The most compute streams per device: each is a process of the simulation, and no accelerator
runs more kernels at once than this (a GPU's hardware queues are a few dozen)."""


def _streams(text: str) -> int:
    value = positive_int(text)
    if value > MAX_STREAMS:
        raise argparse.ArgumentTypeError(f"expected at most {MAX_STREAMS} streams per device (each is a process of "
                                         f"the simulation; no accelerator runs more kernels at once), got {value}")
    return value


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        VERB, help="simulate a mapping event by event and print makespan, bottlenecks and a per-layer report",
        description="Simulate a mapping (a YAML file naming its system and workload) and print a summary and the "
                    "per-layer report (per layer group: when it ran, its time on the critical path and share of the "
                    "makespan, its busiest device's compute, bytes moved, energy, the cost model that timed it). "
                    "Without --mapping, every op is sharded over all accelerators of --system (data parallel "
                    "by default, see --strategy). --out writes the result, ops.csv and layers.csv included.")
    add_mapping_args(p)
    add_parallel_args(p)
    p.add_argument("--memory-policy", choices=("error", "spill", "ignore"), default="error",
                   help="what happens when a memory overflows (default: error; ignore: simulate and report the peak)")
    p.add_argument("--streams", type=_streams, default=1,
                   help=f"concurrent compute tasks per device (default 1, at most {MAX_STREAMS})")
    add_report_args(p)
    add_cost_args(p)
    add_output_args(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from marssim.lower import lower
    from marssim.sim import simulate

    check_outputs(args)
    if getattr(args, "parallel", None):
        return _run_parallel(args, *_parallel_inputs(args))
    mapping, graph, system = load_inputs(args)
    if mapping.parallel is not None:  # a mapping file with a parallel: section
        return _run_parallel(args, mapping, graph, system)
    tg = lower(graph, system, mapping, cost_model(args))
    result = simulate(tg, system, memory_policy=args.memory_policy, streams=args.streams)
    result.meta["mapping_file"] = args.mapping or ""
    print_report(result, args)
    lines = write_outputs(result, args)
    if lines:
        print()
        print("\n".join(lines))
    return 0


def _parallel_inputs(args: argparse.Namespace):
    """(mapping, graph, system) of ``--parallel`` with ``--system`` and ``--workload``."""
    from marssim.errors import InputError
    from marssim.mapping import Mapping
    from marssim.parallel import parse_parallel
    from marssim.system import load_system
    from marssim.workload import load_workload

    if args.mapping:
        raise InputError(None, "--parallel", "give either --mapping or --parallel (a mapping file may hold a "
                                             "'parallel:' section itself)")
    if not args.system or not args.workload:
        raise InputError(None, "--parallel", "needs --system and --workload")
    system = load_system(args.system)
    graph = load_workload(args.workload, batch=args.batch)
    cfg = parse_parallel(args.parallel)
    if "micro_batch" not in args.parallel:
        cfg = cfg.with_(micro_batch=graph.batch)
    if args.strategy or args.micro_batches:
        raise InputError(None, "--parallel", "decides the shardings and micro-batches itself; drop --strategy and "
                                             "--micro-batches")
    return Mapping.from_parallel(graph, system, cfg), graph, system


def _run_parallel(args: argparse.Namespace, mapping, graph, system) -> int:
    """A parallel configuration: check its memory, lower, simulate, report."""
    from marssim.errors import InputError
    from marssim.parallel import lower_parallel
    from marssim.parallel.run import check_memory, report_of, unfold_result
    from marssim.sim import simulate
    from marssim.system import expand_ids

    cfg = mapping.parallel
    if args.memory_policy == "error":
        check_memory(graph, system, cfg)
    tg = lower_parallel(graph, system, cfg, cost_model(args), folding=args.fold)
    policy = "ignore" if args.memory_policy == "ignore" else args.memory_policy
    result = simulate(tg, system, memory_policy=policy, streams=args.streams)
    report = report_of(tg, system, result)
    result.meta["parallel_report"] = report.to_dict()
    print(f"{graph.spec} on {system.spec} with {cfg.text()}: {tg.n_tasks:,} tasks, "
          f"{tg.meta['fold_classes']} classes of identical GPUs simulated")
    print("\n".join(report.lines()))
    if args.estimate:
        from marssim.analytical import estimate

        est = report_of(tg, system, estimate(tg, system))
        print(f"analytical estimate: iteration {est.iteration_s * 1e3:.3f} ms, MFU {est.mfu:.1%}, bubble "
              f"{est.bubble_share:.1%} (no link contention)")
    if args.trace_gpus:
        try:
            gpus = expand_ids([g.strip() for g in args.trace_gpus.split(",") if g.strip()])
        except ValueError as err:
            raise InputError(None, "--trace-gpus", str(err)) from None
        result = unfold_result(result, gpus)
    lines = write_outputs(result, args)
    if lines:
        print()
        print("\n".join(lines))
    return 0
