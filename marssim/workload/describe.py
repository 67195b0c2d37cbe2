"""A readable text summary of a :class:`~marssim.workload.Graph` (``marssim show WORKLOAD``).

Work is shown in MACs and FLOPs with decimal prefixes (GMACs = 1e9 MACs), bytes with binary
prefixes (MiB), from the exact counts the graph holds.
"""

from __future__ import annotations

from marssim.tables import format_table
from marssim.units import fmt_bytes

from .graph import Graph
from .op import Op, OpKind

__all__ = ["describe_graph", "describe_transformer", "op_shape_text", "fmt_count"]

_KIND_ORDER = [OpKind.INPUT, OpKind.CONV, OpKind.GEMM, OpKind.MATMUL, OpKind.POOL, OpKind.ELTWISE, OpKind.NORM,
               OpKind.SOFTMAX, OpKind.EMBEDDING, OpKind.RESHAPE]


def fmt_count(n: float, unit: str = "") -> str:
    """A count with a decimal prefix: ``fmt_count(4.089e9, "MACs") == '4.089 GMACs'``; exact below 1000."""
    for prefix, scale in (("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(n) >= scale:
            return f"{n / scale:.4g} {prefix}{unit}".rstrip()
    return f"{int(n)} {unit}".rstrip()


def _hw(h: int, w: int) -> str:
    return f"{h}x{w}"


def op_shape_text(op: Op) -> str:
    """A compact description of an op's shape: ``3->64 7x7/2 224x224->112x112`` for a conv,
    ``768->3072 x128`` for a linear layer over 128 tokens, ``12x 128x64 @ 64x128`` for a matmul."""
    m = op.loop_dict
    if op.kind == OpKind.CONV:
        stride = op.param("stride", (1, 1))
        groups = op.param("groups", 1)
        c_in = op.in_shapes[0][1]
        extra = " dw" if op.param("depthwise") else f" g{groups}" if groups > 1 else ""
        s = f"/{stride[0]}" if stride[0] == stride[1] else f"/{stride[0]}x{stride[1]}"
        return (f"{c_in}->{m['K']} {m['R']}x{m['S']}{s}{extra} "
                f"{_hw(*op.in_shapes[0][2:])}->{_hw(m['P'], m['Q'])}")
    if op.kind == OpKind.GEMM:
        rows = f" x{m['M']}" if m["M"] != 1 else ""
        return f"{m['K']}->{m['N']}{rows}"
    if op.kind == OpKind.MATMUL:
        return f"{m['H']}x {m['M']}x{m['K']} @ {m['K']}x{m['N']}"
    if op.kind == OpKind.POOL:
        if op.param("global"):
            return f"global {op.param('mode', 'avg')} {_hw(m['R'], m['S'])}->1x1"
        stride = op.param("stride", (1, 1))[0]
        return f"{op.param('mode', 'max')} {m['R']}x{m['S']}/{stride} ->{_hw(m['P'], m['Q'])}"
    if op.kind == OpKind.SOFTMAX:
        return f"{m['A']} heads, {m['H']} rows x {m['L']} keys"
    if op.kind == OpKind.EMBEDDING:
        return f"{op.param('vocab')}x{m['C']} table, {m['H']} tokens"
    n, c, h, w = op.out_shape
    label = op.param("fn") or op.param("norm") or op.param("what") or ""
    label = f"{label} " if label else ""
    if h == 1 and w == 1:
        return f"{label}{c}"
    if w == 1:
        return f"{label}{c} x{h}"
    return f"{label}{c}x{h}x{w}"


def _row(op: Op) -> list[str]:
    inputs = fmt_bytes(op.input_bytes) if op.kind != OpKind.INPUT else "-"
    return [op.name, op.kind.value, op_shape_text(op), fmt_count(op.macs) if op.macs else "-",
            fmt_bytes(op.weight_bytes) if op.weight_bytes else "-", inputs, fmt_bytes(op.output_bytes)]


def describe_graph(graph: Graph, *, max_rows: int = 60) -> str:
    """Multi-line summary: name, batch, models, op counts per kind, total MACs/FLOPs, weight and
    activation bytes, and a per-op table.

    Graphs of more than ``max_rows`` ops list their GEMM-like layers only (the other ops are in
    the totals); if those are still too many, the first and last ``max_rows // 2`` are shown and
    a line says how many were left out."""
    ops = graph.ops
    lines = [f"Workload {graph.name}  (spec {graph.spec})"]
    from .llm import transformer_of

    if transformer_of(graph) is not None:
        lines += describe_transformer(graph)
    dtypes = sorted({op.dtype for op in ops})
    models = graph.models
    model_text = ", ".join(models) if len(models) > 1 else models[0] if models else "-"
    lines.append(f"  batch {graph.batch}, {len(models)} model{'s' if len(models) != 1 else ''} ({model_text}), "
                 f"dtype {'/'.join(dtypes)}")
    gemm_flops = sum(op.flops for op in ops if op.is_gemm_like)
    lines.append(f"  {fmt_count(graph.macs, 'MACs')} ({graph.macs:,} MACs), {fmt_count(graph.flops, 'FLOP')} "
                 f"({fmt_count(gemm_flops, 'FLOP')} in conv/gemm/matmul, "
                 f"{fmt_count(graph.flops - gemm_flops, 'FLOP')} in the other ops)")
    written = [op for op in ops if not op.param("view")]  # a view writes nothing
    activation = sum(op.output_bytes for op in written)
    largest = max(written, key=lambda o: o.output_bytes)
    owned = sum(op.weight_bytes for op in ops if op.param("phase", "fwd") == "fwd" and not op.param("shares"))
    state = graph.weight_bytes - owned - sum(op.weight_bytes for op in ops if op.param("shares"))
    state_text = f"; optimizer state read {fmt_bytes(state)}" if state > 0 else ""
    lines.append(f"  weights {fmt_bytes(owned)} ({graph.parameters:,} parameters){state_text}; "
                 f"activations {fmt_bytes(activation)} written in all (largest {fmt_bytes(largest.output_bytes)}, "
                 f"{largest.name})")

    if len(models) > 1:
        lines.append("")
        lines.append("Models")
        rows = []
        for model in models:
            part = [op for op in ops if op.model == model]
            rows.append([model, str(len(part)), fmt_count(sum(o.macs for o in part), "MACs"),
                         fmt_bytes(sum(o.weight_bytes for o in part)), fmt_bytes(sum(o.output_bytes for o in part))])
        lines += format_table(["model", "ops", "work", "weights", "activations"], rows)

    lines.append("")
    lines.append(f"Ops by kind ({len(ops)} ops)")
    rows = []
    for kind in _KIND_ORDER:
        of_kind = [op for op in ops if op.kind == kind]
        if not of_kind:
            continue
        rows.append([kind.value, str(len(of_kind)), fmt_count(sum(o.macs for o in of_kind), "MACs") if kind in
                     (OpKind.CONV, OpKind.GEMM, OpKind.MATMUL) else "-",
                     fmt_count(sum(o.flops for o in of_kind), "FLOP"),
                     fmt_bytes(sum(o.weight_bytes for o in of_kind)), fmt_bytes(sum(o.output_bytes for o in of_kind))])
    lines += format_table(["kind", "count", "MACs", "FLOPs", "weights", "outputs"], rows)

    listed = list(ops)
    title = f"Ops ({len(ops)})"
    note = ""
    if len(listed) > max_rows:
        listed = [op for op in ops if op.is_gemm_like]
        title = f"GEMM-like layers ({len(listed)} of {len(ops)} ops; the others are counted above)"
    if len(listed) > max_rows:
        head, tail = listed[: max_rows // 2], listed[-(max_rows - max_rows // 2):]
        note = f"  ... {len(listed) - len(head) - len(tail)} more layers not shown ..."
        rows = [_row(op) for op in head]
        table = format_table(["name", "kind", "shape", "MACs", "weights", "in", "out"],
                             rows + [_row(op) for op in tail])
        table = table[: 1 + len(head)] + [note] + table[1 + len(head):]
    else:
        table = format_table(["name", "kind", "shape", "MACs", "weights", "in", "out"], [_row(op) for op in listed])
    lines.append("")
    lines.append(title)
    lines += table
    return "\n".join(lines)


def _precision(cfg) -> str:
    """The run's element types in words: ``bf16``, or Transformer Engine's low-precision GEMMs."""
    if not cfg.gemm_dtype:
        return cfg.dtype
    if cfg.gemm_dtype == "fp8":
        scaling = {"current": "current scaling", "blockwise": "blockwise scaling (1 x 128 and 128 x 128 blocks)",
                   "mxfp8": "MXFP8 block scaling (32-element blocks)"}.get(cfg.fp8_recipe, "delayed scaling")
        text = (f"{cfg.dtype} with FP8 GEMMs in the blocks (Transformer Engine: E4M3 forward, E5M2 gradients, "
                f"{scaling}" if cfg.training else f"{cfg.dtype} with FP8 GEMMs in the blocks (FP8 weights, "
                "activations cast per GEMM")
    else:
        text = f"{cfg.dtype} with NVFP4 GEMMs in the blocks (Transformer Engine's NVFP4 recipe"
    what = "FP8" if cfg.gemm_dtype == "fp8" else "NVFP4"
    kept = [f"the first {cfg.first_layers_bf16}" if cfg.first_layers_bf16 else "",
            f"the last {cfg.last_layers_bf16}" if cfg.last_layers_bf16 else ""]
    kept_text = " and ".join(k for k in kept if k)
    if kept_text:
        text += f"; {kept_text} block{'s' if cfg.first_layers_bf16 + cfg.last_layers_bf16 > 1 else ''} in {cfg.dtype}"
    return text + (f", {what} parameters gathered in {what})" if cfg.fp8_param_gather else ")")


def describe_transformer(graph: Graph) -> list[str]:
    """The lines ``marssim show`` prints for an LLM graph: configuration, parameters, FLOPs per
    phase and the bytes one step holds (see :mod:`marssim.workload.llm.footprint`)."""
    from .llm import require_transformer
    from .llm.footprint import footprint

    cfg = require_transformer(graph, "an LLM description")
    f = footprint(graph)
    kv = f"{cfg.kv} kv heads" if cfg.kv != cfg.heads else "multi-head"
    arch = (f"  {cfg.family}: {cfg.layers} layers, hidden {cfg.hidden}, {cfg.heads} heads of {cfg.d_head} ({kv}), "
            f"{'SwiGLU' if cfg.activation == 'swiglu' else 'GeLU'} MLP"
            f"{f' {cfg.ffn_size}' if cfg.dense_ffn_used else ' (experts only)'}, vocabulary {cfg.vocab}, "
            f"{'RMSNorm' if cfg.norm == 'rms' else 'LayerNorm'}, {cfg.positions} positions")
    if cfg.is_moe:
        arch += f", {cfg.experts_text()} (capacity {cfg.expert_capacity} tokens per expert)"
    run = {"forward": f"forward over {cfg.seq} tokens", "train": f"training step over {cfg.seq} tokens",
           "prefill": f"prefill of {cfg.seq} tokens", "decode": f"decode step over a cache of {cfg.context} tokens",
           "serve": f"prefill of {cfg.prompt} tokens + {cfg.generate} decode steps"}[cfg.mode]
    extra = f", recompute {cfg.recompute}" if cfg.training else ""
    lines = [arch, f"  mode {cfg.mode}: {run}, batch {cfg.batch}, {_precision(cfg)}{extra}"]
    active = f" ({f.active_parameters / 1e9:.4g} B active per token)" if f.active_parameters != f.parameters else ""
    lines.append(f"  parameters {f.parameters:,} = {f.parameters / 1e9:.4g} B{active}")
    phases = [(name, f.flops.get(key, 0.0)) for key, name in
              (("fwd", "forward"), ("bwd", "backward"), ("recompute", "recompute"), ("opt", "optimizer"),
               ("cast", "casts and amax updates")) if f.flops.get(key)]
    lines.append("  FLOPs per step: " + ", ".join(f"{name} {fmt_count(v, 'FLOP')}" for name, v in phases)
                 + (f"; model FLOPs {fmt_count(f.model_flops, 'FLOP')}" if cfg.training else ""))
    copies = ""
    if f.low_precision_weight_bytes:
        what = "FP8" if cfg.gemm_dtype == "fp8" else "NVFP4"
        copies = (f" (of which {what} GEMM weights {fmt_bytes(f.low_precision_weight_bytes)}"
                  + (", the bf16 copies gone" if cfg.fp8_param_gather else "") + ")")
    held = [f"weights {fmt_bytes(f.weight_bytes)}{copies}"]
    if cfg.training:
        per_layer = [v for k, v in f.activation_bytes_per_layer.items() if 0 <= k < cfg.layers]
        block = f", {fmt_bytes(max(per_layer))} per block" if per_layer else ""
        held += [f"gradients {fmt_bytes(f.gradient_bytes)} (fp32)", f"optimizer state {fmt_bytes(f.optimizer_bytes)} "
                 "(fp32 master + 2 moments)", f"activations kept for backward {fmt_bytes(f.activation_bytes)}{block}"]
    if f.kv_cache_bytes:
        held.append(f"KV cache {fmt_bytes(f.kv_cache_bytes)} ({cfg.cache_dtype})")
    lines.append("  bytes (unsharded): " + "; ".join(held))
    return lines
