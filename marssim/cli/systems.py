"""``marssim systems``: list the shipped system files (``topologies/*.yaml``)."""

from __future__ import annotations

import argparse
import sys

VERB = "systems"
ORDER = 10


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        VERB, help="list the shipped systems (topologies/*.yaml): accelerators, designs, description",
        description="List the system files shipped in topologies/ (or $MARSSIM_TOPOLOGIES). Any of them can be "
                    "named by its short name wherever a system is expected, e.g. `marssim show dgx-h100`.")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from marssim.errors import InputError
    from marssim.system import load_system, shipped_systems, topologies_dir
    from marssim.tables import format_table

    paths = shipped_systems()
    if not paths:
        raise InputError(str(topologies_dir()), "", "no system files (*.yaml) found; expected the shipped "
                                                    "topologies/ directory or $MARSSIM_TOPOLOGIES")
    rows = []
    failed = []
    for path in paths:
        try:
            system = load_system(path)
        except InputError as err:
            failed.append(str(err))
            rows.append([path.stem, "-", "-", "invalid (see below)"])
            continue
        designs = ", ".join(system.designs)
        rows.append([path.stem, str(len(system.accelerators)), designs, system.description])
    print("\n".join(format_table(["name", "accs", "designs", "description"], rows, indent="")))
    print(f"\n{len(paths)} systems in {topologies_dir()}; `marssim show NAME` describes one.")
    if failed:
        for message in failed:
            print(f"marssim {VERB}: error: {message}", file=sys.stderr)
        return 2
    return 0
