"""Helpers shared by CLI verbs: argument types and loading inputs with clear errors."""

from __future__ import annotations

import argparse
import contextlib
import math
import sys
import tempfile
from pathlib import Path

from marssim.errors import InputError

__all__ = ["positive_int", "add_cost_args", "cost_model", "add_output_args", "write_outputs",
           "check_outputs", "check_output_dir", "check_output_file", "refuse_llm_off_gpus", "refuse_missing_precision",
           "seed_arg"]


def add_cost_args(p: argparse.ArgumentParser) -> None:
    """--allow-uncalibrated: what happens when a GPU design names a calibration table that
    cannot be found."""
    p.add_argument("--allow-uncalibrated", dest="allow_uncalibrated", action="store_true",
                   help="time GPU designs whose calibration table cannot be found by the analytical roofline "
                        "(with a warning) instead of stopping with an error")


def cost_model(args: argparse.Namespace):
    """The default cost model, with the fallback --allow-uncalibrated asks for."""
    from marssim.cost import default_cost_model

    return default_cost_model(allow_uncalibrated=getattr(args, "allow_uncalibrated", False))


def positive_int(text: str) -> int:
    """argparse type: an integer >= 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


MAX_SEED = 2**63 - 1
"""The largest seed: seeds are non-negative (numpy's generators take no negative seed)."""


def seed_arg(text: str) -> int:
    """argparse type: a random seed, an integer from 0 to :data:`MAX_SEED`."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a seed (an integer >= 0), got {text!r}") from None
    if not 0 <= value <= MAX_SEED:
        raise argparse.ArgumentTypeError(f"expected a seed from 0 to 2^63-1, got {text!r}")
    return value


def positive_float(text: str) -> float:
    """argparse type: a finite number > 0."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}") from None
    if not value > 0 or value == math.inf:
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}")
    return value


def add_output_args(p: argparse.ArgumentParser) -> None:
    """--out, --trace, --plot, --intervals: where a simulation's results go."""
    p.add_argument("--out", metavar="DIR", help="write the result (summary.json and CSV tables) into DIR")
    p.add_argument("--trace", metavar="FILE", help="write a Perfetto/Chrome trace (.json or .json.gz)")
    p.add_argument("--plot", metavar="FILE", help="write figures (PNG and SVG; FILE names the PNG stem)")
    p.add_argument("--intervals", metavar="FILE", help="write the interval log as .parquet or .csv")
    p.add_argument("--per-link", dest="per_link", action="store_true",
                   help="with --out: also write link_timeline.csv, every link's bandwidth in use over time (tens of "
                        "MB on a cluster; the Perfetto trace of `marssim trace DIR` then has bandwidth counters)")


def _check_suffix(path: str, allowed: tuple[str, ...], flag: str) -> None:
    if not any(path.endswith(s) for s in allowed):
        raise InputError(path, flag, f"expected a file name ending in {' or '.join(allowed)}")


def _check_writable_parent(path: Path, flag: str) -> None:
    """The nearest existing ancestor of ``path`` must be a directory this process can write in."""
    parent = path.absolute().parent
    while not parent.exists():
        parent = parent.parent
    if not parent.is_dir():
        raise InputError(str(path), flag, f"{parent} is a file, not a directory; expected a path under a directory")
    try:  # a real probe: permissions, read-only and special file systems alike
        with tempfile.TemporaryFile(dir=parent):
            pass
    except OSError as err:
        raise InputError(str(path), flag, f"cannot write in {parent} ({err.strerror or err})") from None


def check_output_dir(path: str | None, flag: str = "--out") -> None:
    """InputError unless ``path`` can be created or written into as a directory (checked before
    any work, so that a long run never ends in an error about its output)."""
    if not path:
        return
    p = Path(path)
    if p.exists() and not p.is_dir():
        raise InputError(path, flag, "exists and is not a directory; expected a directory to write into "
                                     "(or a new name)")
    _check_writable_parent(p / "x", flag)


def check_output_file(path: str | None, flag: str, suffixes: tuple[str, ...]) -> None:
    """InputError unless ``path`` ends in one of ``suffixes`` and can be written as a file."""
    if not path:
        return
    _check_suffix(path, suffixes, flag)
    p = Path(path)
    if p.is_dir():
        raise InputError(path, flag, f"is a directory; expected a file name ending in {' or '.join(suffixes)}")
    _check_writable_parent(p, flag)
    if path.endswith(".parquet"):
        import importlib.util

        if importlib.util.find_spec("pyarrow") is None:
            raise InputError(path, flag, "writing Parquet needs pyarrow: pip install 'marssim[parquet]' (or write .csv)")


TRACE_SUFFIXES = (".json", ".json.gz")
INTERVAL_SUFFIXES = (".parquet", ".csv")
PLOT_SUFFIXES = (".png",)


def check_outputs(args: argparse.Namespace) -> None:
    """Check every output path of :func:`add_output_args` before any work (see
    :func:`check_output_dir`, :func:`check_output_file`)."""
    check_output_dir(getattr(args, "out", None))
    if getattr(args, "per_link", False) and not getattr(args, "out", None):
        raise InputError(None, "--per-link", "adds link_timeline.csv to the result directory: give --out DIR too")
    check_output_file(getattr(args, "trace", None), "--trace", TRACE_SUFFIXES)
    check_output_file(getattr(args, "intervals", None), "--intervals", INTERVAL_SUFFIXES)
    check_output_file(getattr(args, "plot", None), "--plot", PLOT_SUFFIXES)


def write_outputs(result, args: argparse.Namespace, shown=None) -> list[str]:
    """Write what --out/--trace/--plot/--intervals ask for (checked by :func:`check_outputs`
    again); ``shown``: what the trace, the figures and the interval table draw (a folded run's
    rows, :func:`marssim.results.view.folded_view`; default ``result``). Return lines describing
    the files."""
    lines = []
    check_outputs(args)
    shown = result if shown is None else shown
    with _steps(args) as step:
        if getattr(args, "out", None):
            result.save(args.out, per_link=getattr(args, "per_link", False), progress=lambda n: step(f"--out {n}"))
            lines.append(f"result    {args.out}/")
        if getattr(args, "trace", None) or getattr(args, "plot", None) or getattr(args, "intervals", None):
            from marssim import trace

            if args.trace:
                step("--trace")
                size = trace.write_chrome_trace(shown, args.trace)
                lines.append(f"trace     {args.trace} ({size / 2**20:.2f} MiB; open in https://ui.perfetto.dev)")
            if args.intervals:
                step("--intervals")
                trace.export_intervals(shown, args.intervals)
                lines.append(f"intervals {args.intervals}")
            if args.plot:
                for path in trace.plot_result(shown, args.plot, progress=lambda n: step(f"--plot {n}")):
                    lines.append(f"figure    {path}")
    return lines


@contextlib.contextmanager
def _steps(args: argparse.Namespace):
    """A line on stderr naming the output being written (a terminal, without --quiet): on a
    cluster of a thousand GPUs the tables, trace and figures take seconds each. Yields the
    callback that names the next step."""
    if getattr(args, "quiet", False) or not sys.stderr.isatty():
        yield lambda name: None
        return
    from tqdm import tqdm

    bar = tqdm(total=0, desc="writing", bar_format="{desc} ({elapsed})", file=sys.stderr, leave=False)
    try:
        yield lambda name: bar.set_description(f"writing {name}")
    finally:
        bar.close()


def refuse_llm_off_gpus(system, llm: str, where: str = "--system") -> None:
    """InputError, before any work, when ``system`` has accelerators that are not GPUs: a large
    language model (``llm``, its spec) is trained and served on GPU clusters only (parallel
    configurations, kernel tables, NCCL collectives, the KV cache), and a per-op mapping search
    of its thousands of ops over such accelerators does not end in useful time."""
    others = sorted({d for a in system.accelerators for d in a.designs if system.designs[d].dataflow != "gpu"})
    if others:
        kinds = ", ".join(f"{d} ({system.designs[d].dataflow})" for d in others[:4])
        more = f" and {len(others) - 4} more" if len(others) > 4 else ""
        raise InputError(None, where, f"{llm} is a large language model, which runs on GPUs; the accelerators of "
                                      f"{system.spec} are not GPUs (designs {kinds}{more}); give a GPU system "
                                      "(`marssim systems` lists them: dgx-h100-cluster, ...)")


def refuse_missing_precision(transformer, system, llm: str, where: str = "--workload") -> None:
    """InputError, before any work, when a GPU design of ``system`` has no peak rate for a type
    the LLM ``transformer`` (a :class:`~marssim.workload.llm.config.TransformerConfig`; ``llm``:
    its spec) computes in: its ``dtype``, and the element type of its low-precision GEMMs
    (``fp8``, ``fp4``: tensor cores an A100 or an H100 lacks; ``fp8_block`` needs FP8 tensor cores,
    ``mxfp8`` Blackwell's, :data:`~marssim.cost.gpu.BLOCK_SCALED_FP8`). The message names the
    precisions each such GPU has."""
    from marssim.cost.gpu import computes_in

    needed = [d for d in (transformer.dtype, transformer.low_dtype) if d]
    designs = dict.fromkeys(d for a in system.accelerators for d in a.designs)
    for name in designs:
        design = system.designs[name]
        gpu = design.gpu
        if gpu is None:
            continue
        missing = [d for d in needed if not computes_in(design, d)]
        if missing:
            raise InputError(None, where, f"{llm} computes in {' and '.join(missing)}, which the {name} GPUs of "
                                          f"{system.spec} do not have (no {missing[0].upper()} tensor cores); they "
                                          f"have {', '.join(gpu.peak_flops)}")


def existing_dir(path: str) -> Path:
    p = Path(path)
    if not p.is_dir():
        raise InputError(path, "", "no such directory")
    return p


def request_flags(args: argparse.Namespace):
    """The request flags of ``marssim serve``, ``search`` and ``compare`` as a
    :class:`~marssim.serve.inputs.RequestFlags` (a verb without a flag leaves it None)."""
    from marssim.serve.inputs import RequestFlags

    return RequestFlags(replay=args.replay, arrival=args.arrival, prompt=args.prompt, output=args.output,
                        count=args.requests, rate=args.rate, prefix=args.prefix,
                        concurrency=getattr(args, "concurrency", None), duration=getattr(args, "duration", None))
