"""The ``marssim`` command line. Each verb lives in its own module of this package, which
defines ``VERB`` (its name), ``ORDER`` (its place in ``--help``) and ``register(subparsers)``.
Bad input exits with status 2 and one clear message, never a traceback."""

from __future__ import annotations

import argparse
import importlib
import os
import pkgutil
import sys
from collections.abc import Sequence

from marssim.errors import CapacityError, InputError

__all__ = ["main", "build_parser"]

_DESCRIPTION = """\
marssim: simulate and map DNN workloads on multi-accelerator systems.

A system is a YAML file (see `marssim systems`), a workload a zoo name such as
`resnet50:batch=8` or an ONNX file (see `marssim workloads`). A mapping assigns the
workload's layers to sets of accelerators, picks each set's design and each layer's sharding;
every mapping is evaluated by discrete-event simulation.
"""


class _ExactParser(argparse.ArgumentParser):
    """An argument parser that takes no abbreviation of a long option (``--out`` is never taken
    for ``--output``): every verb's parser and sub-parser is one of these."""

    def __init__(self, *args, **kwargs) -> None:
        kwargs["allow_abbrev"] = False
        super().__init__(*args, **kwargs)


def build_parser() -> argparse.ArgumentParser:
    """The argument parser with every verb module found in ``marssim.cli`` registered; no long
    option may be abbreviated."""
    parser = _ExactParser(prog="marssim", description=_DESCRIPTION,
                          formatter_class=argparse.RawDescriptionHelpFormatter)
    from marssim import __version__

    parser.add_argument("--version", action="version", version=f"marssim {__version__}")
    sub = parser.add_subparsers(dest="verb", metavar="VERB", title="verbs", parser_class=_ExactParser)
    modules = []
    for info in pkgutil.iter_modules(__path__):
        if info.name.startswith("_"):
            continue
        module = importlib.import_module(f"{__name__}.{info.name}")
        if hasattr(module, "register"):
            modules.append(module)
    for module in sorted(modules, key=lambda m: (getattr(m, "ORDER", 100), m.__name__)):
        module.register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``marssim`` console script; returns the exit status."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    import warnings

    from marssim.errors import InputWarning

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
