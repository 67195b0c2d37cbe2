"""``marssim estimate``: evaluate one plan analytically (no link contention), with the same
report and outputs as ``marssim simulate``."""

from __future__ import annotations

import argparse

from ._common import add_cost_args, add_output_args, check_outputs
from ._plan import add_plan_args, add_report_args, run_plan_verb

VERB = "estimate"
ORDER = 42


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        VERB, help="estimate a plan analytically (no link contention): the same report and outputs as simulate",
        description="Evaluate a plan (a mapping, or a parallel configuration with --parallel) with the "
                    "contention-free analytical estimate (the simulator's device rule, every transfer at its route's "
                    "bottleneck bandwidth; exact wherever no two flows share a resource) and print the same summary "
                    "and report as `marssim simulate`, with the estimate's proven lower bound. --out, --trace, --plot "
                    "and --intervals write the same files (memory and link usage are those of the contention-free "
                    "schedule).")
    add_plan_args(p, simulate=False)
    add_report_args(p)
    add_cost_args(p)
    add_output_args(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    check_outputs(args)
    return run_plan_verb(args, "estimate")
