"""``marssim workloads``: list the built-in workloads (the zoo) and how to name ONNX files."""

from __future__ import annotations

import argparse

VERB = "workloads"
ORDER = 12


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        VERB, help="list the built-in workloads: parameters and defaults, GMACs, ops; .onnx files are accepted too",
        description="List the zoo workloads with their parameters (defaults shown), their work at the defaults "
                    "(GMACs at batch 1) and their op count. Any of them can be named wherever a workload is "
                    "expected, with parameters: `resnet50:batch=8,image=224`, `bert-base:seq=512,batch=4`. "
                    "An ONNX file is accepted too: `model.onnx` or `model.onnx:batch=8`.")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from marssim.tables import format_table
    from marssim.workload import load_workload, zoo_entries

    rows = []
    entries = zoo_entries()
    for name in sorted(entries, key=lambda n: (entries[n].multi_model, n)):
        entry = entries[name]
        graph = load_workload(name)
        params = ", ".join(f"{k}={_text(v)}" for k, v in entry.defaults.items())
        rows.append([name, params, f"{graph.macs / 1e9:.4g}", str(len(graph)), entry.description])
    print("\n".join(format_table(["name", "parameters (defaults)", "GMACs", "ops", "description"], rows, indent="")))
    print(f"\n{len(rows)} workloads. Give parameters after a colon: `bert-base:seq=512,batch=4`; GMACs are at "
          "the defaults and scale with batch.\nAn ONNX file is accepted wherever a workload is: `model.onnx` or "
          "`model.onnx:batch=8` (needs the onnx package: pip install 'marssim[onnx]').\n"
          "`marssim show SPEC` describes one, layer by layer.")
    return 0


def _text(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)
