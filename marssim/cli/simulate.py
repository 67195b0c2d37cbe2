"""``marssim simulate``: evaluate one plan by discrete-event simulation."""

from __future__ import annotations

import argparse

from ._common import add_cost_args, add_output_args, check_outputs
from ._plan import add_plan_args, add_report_args, run_plan_verb

VERB = "simulate"
ORDER = 40


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        VERB, help="simulate a mapping or a parallel configuration event by event and report it",
        description="Simulate a plan event by event, with contention, and print a summary and the per-layer report "
                    "(per layer group: when it ran, its time on the critical path and share of the makespan, its "
                    "busiest device's compute, bytes moved, energy, the cost model that timed it). The plan is a "
                    "mapping file (naming its system and workload), a parallel configuration of an LLM on a GPU "
                    "cluster (--parallel, or a mapping file with a 'parallel:' section: iteration time, MFU and "
                    "HFU, bubble, exposed communication and memory per pipeline stage), or without either every op "
                    "sharded over all accelerators of --system (data parallel by default, see --strategy). --out "
                    "writes the result, ops.csv and layers.csv included.")
    add_plan_args(p, simulate=True)
    add_report_args(p)
    add_cost_args(p)
    add_output_args(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    check_outputs(args)
    return run_plan_verb(args, "simulate")
