"""``marssim trace RESULT_DIR``: re-export or re-plot a result saved by ``marssim simulate --out``."""

from __future__ import annotations

import argparse

from ._common import INTERVAL_SUFFIXES, PLOT_SUFFIXES, TRACE_SUFFIXES, check_output_file, existing_dir, positive_int

VERB = "trace"
ORDER = 45


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        VERB, help="write a Perfetto trace, the interval table or figures from a saved result",
        description="Read a result directory written by `marssim simulate --out DIR` and write any of: a "
                    "Chrome/Perfetto trace (open it in https://ui.perfetto.dev or chrome://tracing), the interval "
                    "log as Parquet or CSV (one pandas.read_* call reads it back), and figures (Gantt chart, "
                    "utilisation, memory over time) as PNG and SVG. Prints each file with its size.")
    p.add_argument("result", metavar="RESULT_DIR", help="directory written by `marssim simulate --out`")
    p.add_argument("--trace", metavar="FILE", help="Chrome/Perfetto trace: .json, or .json.gz (gzip)")
    p.add_argument("--intervals", metavar="FILE", help="interval log: .parquet (needs pyarrow) or .csv")
    p.add_argument("--plot", metavar="FILE", help="figures: FILE (.png) gets the Gantt chart; FILE-utilisation and "
                                                   "FILE-memory the others; each also as .svg")
    p.add_argument("--color-by", dest="color_by", choices=("auto", "layer", "model"), default="auto",
                   help="Gantt colours: by layer (graph order) or by model (default: model when there are several)")
    p.add_argument("--max-links", dest="max_links", metavar="N", type=positive_int, default=24,
                   help="links shown in the figures: the busiest N (default 24)")
    p.add_argument("--no-flows", dest="flows", action="store_false",
                   help="leave the dependency arrows out of the trace (smaller file)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from marssim import trace
    from marssim.errors import InputError
    from marssim.sim import Result
    from marssim.units import fmt_bytes

    if not (args.trace or args.intervals or args.plot):
        raise InputError(None, "arguments", "nothing to write: give --trace FILE, --intervals FILE and/or --plot FILE")
    check_output_file(args.trace, "--trace", TRACE_SUFFIXES)
    check_output_file(args.intervals, "--intervals", INTERVAL_SUFFIXES)
    check_output_file(args.plot, "--plot", PLOT_SUFFIXES)
    result = Result.load(existing_dir(args.result))
    title = " / ".join(str(result.meta[k]) for k in ("system", "workload", "mapping") if result.meta.get(k))
    print(f"{title or args.result}: {len(result.intervals)} intervals, makespan {result.makespan * 1e3:.4f} ms")
    if args.trace:
        size = trace.write_chrome_trace(result, args.trace, flows=args.flows)
        print(f"trace     {args.trace} ({fmt_bytes(size)}; open in https://ui.perfetto.dev)")
    if args.intervals:
        size = trace.export_intervals(result, args.intervals)
        print(f"intervals {args.intervals} ({fmt_bytes(size)})")
    if args.plot:
        from pathlib import Path

        for path in trace.plot_result(result, args.plot, color_by=args.color_by, max_links=args.max_links):
            print(f"figure    {path} ({fmt_bytes(Path(path).stat().st_size)})")
    return 0
