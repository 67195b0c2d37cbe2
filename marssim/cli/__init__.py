"""The ``marssim`` command line. Each verb lives in its own module of this package, which
defines ``VERB`` (its name), ``ORDER`` (its place in ``--help``) and ``register(subparsers)``.
:data:`VERBS` names them statically, so that a command imports only its own verb's module (and
``--version`` or ``--help`` none): pandas, matplotlib, scipy, pydantic, the simulator and the cost
model are loaded by the verbs that use them. Bad input exits with status 2 and one clear message,
never a traceback."""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

__all__ = ["main", "console", "build_parser", "VERBS", "Verb"]

_DESCRIPTION = """\
marssim: simulate and map DNN workloads on multi-accelerator systems.

A system is a YAML file (see `marssim systems`), a workload a zoo name such as
`resnet50:batch=8` or an ONNX file (see `marssim workloads`). A mapping assigns the
workload's layers to sets of accelerators, picks each set's design and each layer's sharding;
every mapping is evaluated by discrete-event simulation.
"""


@dataclass(frozen=True)
class Verb:
    """A verb of the command line: its name, the module of ``marssim.cli`` that registers it
    and the one-line help ``marssim --help`` lists (the same text the module registers)."""

    name: str
    module: str
    help: str


VERBS: tuple[Verb, ...] = (  # in the order of --help (each module's ORDER)
    Verb("demo", "demo", "run the main job on built-in defaults: baselines, a MARS search, simulation, trace, "
                         "figures"),
    Verb("systems", "systems", "list the shipped systems (topologies/*.yaml): accelerators, designs, description"),
    Verb("workloads", "workloads", "list the built-in workloads: parameters and defaults, GMACs, ops; .onnx files "
                                   "are accepted too"),
    Verb("show", "show", "describe a system (devices, links, bandwidths, routes) or a workload (ops, FLOPs, bytes)"),
    Verb("cost", "cost", "per-layer time of a workload on one accelerator of each design of a system"),
    Verb("simulate", "simulate", "simulate a mapping or a parallel configuration event by event and report it"),
    Verb("estimate", "estimate", "estimate a plan analytically (no link contention): the same report and outputs "
                                 "as simulate"),
    Verb("trace", "trace", "write a Perfetto trace, the interval table or figures from a saved result"),
    Verb("serve", "serve", "simulate LLM serving: requests, continuous batching, paged KV cache, disaggregated "
                           "prefill/decode; latency percentiles, throughput, goodput"),
    Verb("search", "search", "search for the best mapping or parallel configuration (MARS two-level GA, or a "
                             "baseline)"),
    Verb("compare", "compare", "run the MARS GA and all baselines on one case and print one table"),
    Verb("validate", "validate", "compare the analytical estimate with simulation over many mappings"),
    Verb("calibrate", "calibrate", "measure GPU kernel timings and fit the cost model's GPU curves to them"),
    Verb("sip", "sip", "tune GPU kernels' native SASS schedules (SIP) and inspect cubins"),
)


class _ExactParser(argparse.ArgumentParser):
    """An argument parser that takes no abbreviation of a long option (``--out`` is never taken
    for ``--output``): every verb's parser and sub-parser is one of these."""

    def __init__(self, *args, **kwargs) -> None:
        kwargs["allow_abbrev"] = False
        super().__init__(*args, **kwargs)


def build_parser(verbs: Iterable[str] | None = None) -> argparse.ArgumentParser:
    """The argument parser. ``verbs``: the verbs whose modules are imported and registered with
    all their flags (default: every verb); the others are listed by name and help only. No long
    option may be abbreviated."""
    parser = _ExactParser(prog="marssim", description=_DESCRIPTION,
                          formatter_class=argparse.RawDescriptionHelpFormatter)
    from marssim import __version__

    parser.add_argument("--version", action="version", version=f"marssim {__version__}")
    sub = parser.add_subparsers(dest="verb", metavar="VERB", title="verbs", parser_class=_ExactParser)
    wanted = None if verbs is None else set(verbs)
    for verb in VERBS:
        if wanted is None or verb.name in wanted:
            importlib.import_module(f"{__name__}.{verb.module}").register(sub)
        else:
            sub.add_parser(verb.name, help=verb.help)
    return parser


def _verb_named(argv: Sequence[str]) -> str | None:
    """The verb a command line names: its first word that is not an option (the top-level
    options take no values), if it is a verb."""
    names = {verb.name for verb in VERBS}
    word = next((a for a in argv if not a.startswith("-")), None)
    return word if word in names else None


def console() -> None:
    """The ``marssim`` command (and ``python -m marssim``): :func:`main`, then the process exits
    without a last walk of the cyclic garbage collector over what the run kept (hundreds of
    thousands of objects after a large run; finalisers and atexit handlers run as before). A
    caller that goes on after :func:`main` (a test, a notebook) calls :func:`main` itself."""
    import gc

    code = main()
    gc.freeze()
    sys.exit(code)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line on ``argv`` (default ``sys.argv[1:]``); returns the exit status."""
    from marssim.cachedir import use_numba_cache_dir

    use_numba_cache_dir()  # numba's compiled kernels in the user's cache folder (before numba is imported)
    argv = list(sys.argv[1:] if argv is None else argv)
    verb = _verb_named(argv)
    parser = build_parser([verb] if verb else ())  # --version, --help: no verb module imported
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    import warnings

    from marssim.errors import CapacityError, InputError, InputWarning

    def show(message, category, filename, lineno, file=None, line=None):
        if issubclass(category, InputWarning):
            print(f"marssim {args.verb}: warning: {message}", file=sys.stderr)
        else:
            default_show(message, category, filename, lineno, file, line)

    with warnings.catch_warnings():
        warnings.simplefilter("always", InputWarning)
        default_show = warnings.showwarning
        warnings.showwarning = show
        try:
            return int(args.func(args) or 0)
        except InputError as err:
            print(f"marssim {args.verb}: error: {err}", file=sys.stderr)
            return 2
        except CapacityError as err:  # the user's plan or batch: input like any other
            print(f"marssim {args.verb}: error: the plan does not fit: {err}", file=sys.stderr)
            return 2
        except KeyboardInterrupt:
            print("interrupted", file=sys.stderr)
            return 130
        except BrokenPipeError:
            # the reader went away (`marssim show x | head`): stop quietly, as other Unix tools do
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
            return 141
        except OSError as err:  # a file that vanished or cannot be written after the checks
            where = f": {err.filename}" if err.filename else ""
            print(f"marssim {args.verb}: error: {err.strerror or err}{where}", file=sys.stderr)
            return 1


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
