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
    zoo = {n: e for n, e in entries.items() if e.group == "zoo"}
    for name in sorted(zoo, key=lambda n: (zoo[n].multi_model, n)):
        entry = zoo[name]
        graph = load_workload(name)
        params = ", ".join(f"{k}={_text(v)}" for k, v in entry.defaults.items())
        rows.append([name, params, f"{graph.macs / 1e9:.4g}", str(len(graph)), entry.description])
    print("\n".join(format_table(["name", "parameters (defaults)", "GMACs", "ops", "description"], rows, indent="")))
    print()
    print(_llm_table(entries))
    print(f"\n{len(entries)} workloads. Give parameters after a colon: `bert-base:seq=512,batch=4`; GMACs are at "
          "the defaults and scale with batch.\nLLM families and presets take every dimension above as a parameter "
          "and a mode: `llama3-70b:mode=train,seq=4096,recompute=selective`, `gpt3-175b:mode=serve,prompt=512,"
          "generate=128,batch=8`, `llama3-8b:mode=decode,context=2048,batch=32`, `gpt:layers=96,hidden=12288,"
          "heads=96,seq=2048,vocab=51200,batch=8`.\nAn ONNX file is accepted wherever a workload is: `model.onnx` or "
          "`model.onnx:batch=8` (needs the onnx package: pip install 'marssim[onnx]').\n"
          "`marssim show SPEC` describes one, layer by layer.")
    return 0


def _llm_table(entries) -> str:
    """Families and presets of large language models: dimensions and parameter counts."""
    from marssim.system.describe import format_table
    from marssim.workload.llm import FAMILY_DEFAULTS, MODES, TransformerConfig, require_transformer
    from marssim.workload.llm.footprint import footprint

    rows = []
    for name, entry in entries.items():
        if entry.group != "llm":
            continue
        graph = entry.build(**{**entry.defaults, "seq": 1, "mode": "forward"})
        cfg: TransformerConfig = require_transformer(graph, "an LLM entry of the zoo", name)
        f = footprint(graph)
        ffn = f"ffn {cfg.ffn_size}" if cfg.dense_ffn_used else "ffn -"
        dims = f"{cfg.layers} x {cfg.hidden}, {cfg.heads}/{cfg.kv} heads, {ffn}, vocab {cfg.vocab}"
        if cfg.is_moe:
            dims += f", {cfg.experts_text()}"
        params = f"{f.parameters / 1e9:.4g}" + (f" ({f.active_parameters / 1e9:.3g} active)" if cfg.is_moe else "")
        kind = "family" if name in FAMILY_DEFAULTS else "preset"
        rows.append([name, kind, dims, params, entry.description])
    table = format_table(["name", "kind", "layers x hidden, heads/kv, ffn, vocab", "params (B)", "defaults / source"],
                         rows, indent="")
    return ("Large language models (modes: " + ", ".join(MODES) + ")\n" + "\n".join(table))


def _text(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)
