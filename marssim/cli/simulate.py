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
    p.add_argument("--memory-policy", choices=("error", "spill"), default="error",
                   help="what happens when a memory overflows (default: error)")
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
    mapping, graph, system = load_inputs(args)
    tg = lower(graph, system, mapping, cost_model(args))
    result = simulate(tg, system, memory_policy=args.memory_policy, streams=args.streams)
    result.meta["mapping_file"] = args.mapping or ""
    print_report(result, args)
    lines = write_outputs(result, args)
    if lines:
        print()
        print("\n".join(lines))
    return 0
