"""``marssim estimate``: evaluate one mapping analytically (no link contention), with the same
report and outputs as ``marssim simulate``."""

from __future__ import annotations

import argparse

from ._common import add_cost_args, add_output_args, check_outputs, cost_model, load_inputs, write_outputs
from .simulate import add_mapping_args, add_report_args, print_report

VERB = "estimate"
ORDER = 42


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        VERB, help="estimate a mapping analytically (no link contention): the same report and outputs as simulate",
        description="Evaluate a mapping with the contention-free analytical estimate (the simulator's device rule, "
                    "every transfer at its route's bottleneck bandwidth; exact wherever no two flows share a "
                    "resource) and print the same summary and per-layer report as `marssim simulate`, with the "
                    "estimate's proven lower bound. --out, --trace, --plot and --intervals write the same files "
                    "(memory and link usage are those of the contention-free schedule).")
    add_mapping_args(p)
    add_report_args(p)
    add_cost_args(p)
    add_output_args(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from marssim.analytical import estimate
    from marssim.lower import lower

    check_outputs(args)
    mapping, graph, system = load_inputs(args)
    est = estimate(lower(graph, system, mapping, cost_model(args)), system)
    result = est.result(level=args.group)
    result.meta["mapping_file"] = args.mapping or ""
    print_report(result, args)
    print(f"lower bound  {est.lower_bound * 1e3:.4f} ms ({max(est.bounds, key=est.bounds.get)}; no schedule of "
          "these tasks is faster, contention or not)")
    lines = write_outputs(result, args)
    if lines:
        print()
        print("\n".join(lines))
    return 0
