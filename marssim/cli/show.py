"""``marssim show SYSTEM|WORKLOAD``: a readable summary of a system or of a workload.

A system is a YAML file or the short name of a shipped one (``dgx-h100``); anything else is read
as a workload: a zoo spec (``resnet50:batch=8``) or an ``.onnx`` file.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from marssim.errors import InputError

VERB = "show"
ORDER = 15

_SYSTEM_SUFFIXES = (".yaml", ".yml")


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        VERB, help="describe a system (devices, links, bandwidths, routes) or a workload (ops, FLOPs, bytes)",
        description="Describe a system or a workload. SYSTEM is a system YAML file or the name of a shipped "
                    "one (see `marssim systems`): its designs, accelerators, hosts, switches, links and a few "
                    "example routes. WORKLOAD is a zoo spec such as resnet50:batch=8 (see `marssim workloads`) "
                    "or an .onnx file: its ops, MACs, FLOPs and bytes.")
    p.add_argument("spec", metavar="SYSTEM|WORKLOAD", help="system YAML path or shipped name, zoo spec or .onnx file")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    print(describe(args.spec))
    return 0


def _shipped_names() -> list[str]:
    from marssim.system import shipped_systems

    return [p.stem for p in shipped_systems()]


def is_system_spec(spec: str) -> bool:
    """True when ``spec`` names a system: a ``.yaml``/``.yml`` path (existing or not) or the name of a
    shipped system, with parameters or not (``gb200-nvl72:racks=4``). Everything else is taken for a
    workload."""
    from marssim.specs import split_spec

    if Path(spec).suffix.lower() in _SYSTEM_SUFFIXES:
        return True
    if Path(spec).exists():
        return False
    try:
        name = split_spec(spec).name
    except InputError:  # not a well-formed spec of anything: let the workload loader say why
        return False
    return name in _shipped_names()


def describe(spec: str) -> str:
    """The text ``marssim show`` prints for ``spec``. Raises InputError (exit 2 at the CLI) when
    ``spec`` is neither a system nor a workload, or when the file it names is invalid."""
    from marssim.errors import InputError

    path = Path(spec)
    if path.is_dir():
        raise InputError(spec, "", "is a directory; expected a system .yaml file, a shipped system name, "
                                   "a workload spec or an .onnx file")
    if is_system_spec(spec):
        from marssim.system import load_system
        from marssim.system.describe import describe_system

        return describe_system(load_system(spec))
    from marssim.workload import is_onnx_spec, load_workload, parse_spec, zoo_entries

    if path.exists() and not is_onnx_spec(spec):
        raise InputError(spec, "", "unknown kind of file; expected a system .yaml file or an .onnx model")
    if not is_onnx_spec(spec) and not spec.startswith("hf:"):  # hf:PATH: a Hugging Face config.json
        name, _ = parse_spec(spec)
        entries = zoo_entries()
        if name not in entries:
            systems = ", ".join(_shipped_names()) or "none found"
            workloads = ", ".join(sorted(entries)) or "none registered"
            raise InputError(spec, "", "no such file, shipped system or workload; expected a system .yaml path, "
                                       f"a shipped system ({systems}), a zoo workload ({workloads}) "
                                       "or an .onnx file")
    from marssim.workload.describe import describe_graph

    return describe_graph(load_workload(spec))
