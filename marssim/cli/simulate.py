"""``marssim simulate``: evaluate one mapping by discrete-event simulation."""

from __future__ import annotations

import argparse

from ._common import add_output_args, check_outputs, load_inputs, positive_int, write_outputs

VERB = "simulate"
ORDER = 40


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        VERB, help="simulate a mapping event by event and print makespan, bottlenecks and utilisation",
        description="Simulate a mapping (a YAML file naming its system and workload) and print a summary. "
                    "Without --mapping, every op is sharded over all accelerators of --system (data parallel "
                    "by default, see --strategy).")
    p.add_argument("--mapping", metavar="FILE", help="mapping YAML (see topologies/mappings/)")
    p.add_argument("--system", metavar="SYSTEM", help="system YAML or shipped name (overrides the mapping's)")
    p.add_argument("--workload", metavar="SPEC", help="zoo spec like resnet50:batch=8 or an .onnx file")
    p.add_argument("--batch", type=positive_int, help="override the workload's batch")
    p.add_argument("--strategy",
                   help="without --mapping: sharding preference list, first legal wins (default dp)")
    p.add_argument("--micro-batches", dest="micro_batches", type=positive_int,
                   help="without --mapping: micro-batches (default 1)")
    p.add_argument("--memory-policy", choices=("error", "spill"), default="error",
                   help="what happens when a memory overflows (default: error)")
    p.add_argument("--streams", type=positive_int, default=1, help="concurrent compute tasks per device")
    add_output_args(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from marssim.cost import default_cost_model
    from marssim.lower import lower
    from marssim.sim import simulate

    check_outputs(args)
    mapping, graph, system = load_inputs(args)
    tg = lower(graph, system, mapping, default_cost_model())
    result = simulate(tg, system, memory_policy=args.memory_policy, streams=args.streams)
    result.meta["mapping_file"] = args.mapping or ""
    print(result.summary())
    lines = write_outputs(result, args)
    if lines:
        print()
        print("\n".join(lines))
    return 0
