"""Helpers shared by CLI verbs: argument types and loading inputs with clear errors."""

from __future__ import annotations

import argparse
from pathlib import Path

from marssim.errors import InputError

__all__ = ["positive_int", "add_output_args", "write_outputs", "load_inputs"]


def positive_int(text: str) -> int:
    """argparse type: an integer >= 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


def add_output_args(p: argparse.ArgumentParser) -> None:
    """--out, --trace, --plot, --intervals: where a simulation's results go."""
    p.add_argument("--out", metavar="DIR", help="write the result (summary.json and CSV tables) into DIR")
    p.add_argument("--trace", metavar="FILE", help="write a Perfetto/Chrome trace (.json or .json.gz)")
    p.add_argument("--plot", metavar="FILE", help="write figures (PNG and SVG; FILE names the PNG stem)")
    p.add_argument("--intervals", metavar="FILE", help="write the interval log as .parquet or .csv")


def _check_suffix(path: str, allowed: tuple[str, ...], flag: str) -> None:
    if not any(path.endswith(s) for s in allowed):
        raise InputError(path, flag, f"expected a file name ending in {' or '.join(allowed)}")


def write_outputs(result, args: argparse.Namespace) -> list[str]:
    """Write what --out/--trace/--plot/--intervals ask for; return lines describing the files."""
    lines = []
    if getattr(args, "trace", None):
        _check_suffix(args.trace, (".json", ".json.gz"), "--trace")
    if getattr(args, "intervals", None):
        _check_suffix(args.intervals, (".parquet", ".csv"), "--intervals")
    if getattr(args, "plot", None):
        _check_suffix(args.plot, (".png",), "--plot")
    if getattr(args, "out", None):
        result.save(args.out)
        lines.append(f"result    {args.out}/")
    if getattr(args, "trace", None) or getattr(args, "plot", None) or getattr(args, "intervals", None):
        from marssim import trace

        if args.trace:
            size = trace.write_chrome_trace(result, args.trace)
            lines.append(f"trace     {args.trace} ({size / 2**20:.2f} MiB; open in https://ui.perfetto.dev)")
        if args.intervals:
            trace.export_intervals(result, args.intervals)
            lines.append(f"intervals {args.intervals}")
        if args.plot:
            for path in trace.plot_result(result, args.plot):
                lines.append(f"figure    {path}")
    return lines


def load_inputs(args: argparse.Namespace):
    """(mapping, graph, system) from --mapping and/or --system/--workload/--batch/--strategy."""
    from marssim.mapping import Mapping, load_mapping
    from marssim.system import load_system
    from marssim.workload import load_workload

    batch = getattr(args, "batch", None)
    if getattr(args, "mapping", None):
        for flag, value in (("--strategy", getattr(args, "strategy", None)),
                            ("--micro-batches", getattr(args, "micro_batches", None))):
            if value is not None:
                raise InputError(None, flag, "applies only without --mapping (the mapping file sets each op's sharding "
                                             "and the micro-batches); drop it, or drop --mapping")
        return load_mapping(args.mapping, system=args.system, workload=args.workload, batch=batch)
    if not args.system or not args.workload:
        raise InputError(None, "arguments", "give --mapping FILE, or --system and --workload (a data-parallel "
                                            "mapping over all accelerators is used)")
    system = load_system(args.system)
    graph = load_workload(args.workload, batch=batch)
    strategy = tuple(s.strip() for s in (getattr(args, "strategy", None) or "dp").split(","))
    from marssim.mapping.sharding import STRATEGIES

    for s in strategy:
        if s not in STRATEGIES:
            raise InputError(None, "--strategy", f"expected strategies from {', '.join(STRATEGIES)}, got {s!r}")
    mapping = Mapping.single_set(graph, system, sharding=strategy,
                                 micro_batches=getattr(args, "micro_batches", 1) or 1)
    return mapping, graph, system


def existing_dir(path: str) -> Path:
    p = Path(path)
    if not p.is_dir():
        raise InputError(path, "", "no such directory")
    return p
