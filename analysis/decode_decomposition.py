"""Where the time of one decode iteration goes, kernel by kernel, for rows of the TensorRT-LLM
throughput table (``traces/published/trtllm-1.0-h100-h200-fp8-throughput.csv``), beside a
bytes/FLOPs lower bound per kernel and what aiconfigurator's own TensorRT-LLM backend sums for
the same step from the same measured kernel rows.

    PYTHONPATH=. python analysis/decode_decomposition.py > analysis/results/decode_decomposition.txt

The iteration is a decode-only step of ``B`` sequences at a context of ``ctx`` tokens each
(the row's prompt plus half its output: the mean over a request's decode steps), ``B`` the
mean batch the serving simulation reports for the row. Every op of a block is timed as the
serving engine times it (:class:`marssim.serve.itermodel.IterationModel`), with the model that
timed it (``measured``: a kernel row of the shape; ``interpolated`` / ``extrapolated``: from
measured fused attention kernels; ``fitted``: the kind's efficiency curve and its local
correction; ``gpu-roofline``: no measured kernel of the kind). The bound of a kernel is
``max(bytes / DRAM bandwidth, FLOPs / peak)`` of its shard, of an all-reduce its ring bytes at
the link's line rate. The measured figures of the table are not used.
"""

from __future__ import annotations

import argparse
import math
import sys
from dataclasses import dataclass

ROWS = (
    # name, system, model, tp, batch, ctx, the table's KV cache, aiconfigurator model and system
    ("Llama3.1-8B H100 TP1 128/2048", "dgx-h100-cluster:nodes=1,stack=trtllm-1.3.0rc20", "llama3-8b", 1, 238, 1152,
     "fp8", "meta-llama/Meta-Llama-3.1-8B", "h100_sxm"),
    ("Llama3.3-70B H100 TP2 128/2048", "dgx-h100-cluster:nodes=1,stack=trtllm-1.3.0rc20", "llama3-70b", 2, 120, 1152,
     "fp8", "meta-llama/Meta-Llama-3.1-70B", "h100_sxm"),
    ("Llama3.1-405B H100 TP8 128/2048", "dgx-h100-cluster:nodes=1,stack=trtllm-1.3.0rc20", "llama3-405b", 8, 201, 1152,
     "bf16", "meta-llama/Meta-Llama-3.1-405B", "h100_sxm"),
)
"""The batch is the mean the simulation reported for the row before the table's KV cache and
fusion were set (bf16 KV cache, every op its own kernel), the same batch in both settings."""


@dataclass(frozen=True)
class Kernel:
    """One kernel of a block (or of the head) of the step: seconds, the model that timed it, the
    bound (s), how many times the step runs it."""

    name: str
    group: str
    seconds: float
    model: str
    bound: float
    count: int


def _group(op) -> str:
    from marssim.workload import OpKind

    if op.param("core"):
        return "attention"
    if op.kind == OpKind.GEMM:
        return "gemm"
    return "norm/eltwise"


def step_kernels(system_spec: str, model_spec: str, tp: int, batch: int, ctx: int, cost,
                 fused: bool = False) -> tuple[list[Kernel], float]:
    """The kernels of one decode step of ``batch`` sequences at ``ctx`` tokens, and the step's
    seconds as the serving engine times it (``stage_times``); ``fused``: an engine that absorbs
    the element-wise ops it fuses (``fused_elementwise``)."""
    from marssim.parallel.partition import shard_loops
    from marssim.serve.itermodel import attention_loops, resize_tokens
    from marssim.serve.model import load_model
    from marssim.serve.simulate import iteration_model
    from marssim.system import load_system

    system = load_system(system_spec)
    model = load_model(model_spec)
    stages = (tuple(system.accelerator_ids[:tp]),)
    im = iteration_model(model, system, stages, cost, fused=fused)
    design = im.design(0)
    acc = system.accelerator(stages[0][0])
    bw = acc.memory.bandwidth
    layers = im.blocks[0]
    peaks = design.gpu.peak_flops

    def bound(part, scale: float) -> float:
        dt = part.math_dtype
        return max(part.bytes_moved / bw, part.flops / peaks.get(dt, peaks["bf16"])) / scale

    out: list[Kernel] = []

    def add(op, rule, part, count: int) -> None:
        c = cost.op_cost(part, design)
        scale = max(1, rule.scale)
        seconds, how = (part.bytes_moved / bw, "absorbed") if op.name in im.absorbed else (c.time, c.model)
        out.append(Kernel(op.name.split("layers.0.")[-1].replace("prefill.", ""), _group(op), seconds / scale, how,
                          bound(part, scale), count))

    for op, rule in im.token_ops:
        if rule.alias:
            continue
        part = resize_tokens(op, batch, 1, im.ref_tokens)
        sizes = shard_loops(part, rule, {}, 1)
        add(op, rule, part.with_loops(**sizes) if sizes else part, layers)
    for op, rule, split in im.attention_ops if ctx <= 1 else im._cache_attention_split:
        loops = op.loop_dict
        loops.update(attention_loops(op, batch, 1, ctx))
        for dim, num, den in split:
            loops[dim] = max(1, -(-loops[dim] * num // den))
        add(op, rule, op.with_loops(**loops), layers)
    if tp > 1:  # the two all-reduces of a block (after the attention output and the MLP down GEMMs)
        size = float(batch * model.hidden * im.dtype_bytes)
        seconds, nbytes, _ = im._ring(0, size, "all_reduce")
        hops = im.ring_hops(0)
        line = min(b for _, b in hops)
        out.append(Kernel("all_reduce x2", "all-reduce", 2 * seconds, "collective", 2 * nbytes / line, layers))
    block = sum(k.seconds * k.count for k in out)
    step = im.stage_times((batch, 1), (0, 0), (), batch, batch * ctx, batch)[0]
    rest = step - block  # embedding and head: the final norm, the logits GEMM and its gather, sampling
    out.append(Kernel("embedding + head (norm, logits, sampling)", "head", rest, "-", math.nan, 1))
    return out, step


def aiconfigurator_step(model_path: str, system: str, tp: int, batch: int, ctx: int,
                        kv: str = "bf16") -> dict[str, tuple[float, str]] | None:
    """aiconfigurator-core's TensorRT-LLM backend: the per-op ms of one generation step of ``batch``
    sequences at ``ctx`` tokens (FP8 GEMMs, the KV cache in ``kv``, bf16 or fp8), with each op's
    source; None when the package is not installed."""
    try:
        from aiconfigurator_core.sdk import common, config
        from aiconfigurator_core.sdk.backends.factory import get_backend
        from aiconfigurator_core.sdk.models import get_model
        from aiconfigurator_core.sdk.perf_database import get_database
    except ImportError:
        return None
    import contextlib
    import io

    with contextlib.redirect_stderr(io.StringIO()), contextlib.redirect_stdout(io.StringIO()):
        db = get_database(system, "trtllm", "1.3.0rc20")
        mc = config.ModelConfig(tp_size=tp, gemm_quant_mode=common.GEMMQuantMode.fp8,
                                kvcache_quant_mode=getattr(common.KVCacheQuantMode,
                                                           "bfloat16" if kv == "bf16" else kv),
                                fmha_quant_mode=common.FMHAQuantMode.bfloat16)
        m = get_model(model_path, mc, "trtllm")
        rc = config.RuntimeConfig(batch_size=batch, isl=ctx, osl=2)
        parts = get_backend("trtllm")._run_static_breakdown(m, db, rc, "static_gen", stride=1)
    latency, source = parts[2], parts[5]
    return {k: (v, source.get(k, "")) for k, v in latency.items() if v > 0}


def main(argv: list[str] | None = None) -> int:
    from marssim.cost import default_cost_model

    argparse.ArgumentParser(description=__doc__.splitlines()[0]).parse_args(argv)
    cost = default_cost_model()
    print("decode_decomposition: one decode step, kernel by kernel (us per kernel, ms per step), model dtype=fp8, "
          "attention=flash; as the table ran before (KV cache bf16, every op its own kernel) and with the table's "
          "KV cache and fused_elementwise=true")
    for name, system, model, tp, batch, ctx, table_kv, aic_model, aic_system in ROWS:
        for kv, fused in (("bf16", False), (table_kv, True)):
            spec = f"{model}:dtype=fp8,attention=flash" + (",kv_dtype=fp8" if kv == "fp8" else "")
            kernels, step = step_kernels(system, spec, tp, batch, ctx, cost, fused)
            print(f"\n{name}: TP{tp}, batch {batch}, context {ctx}, KV cache {kv}, "
                  f"{'fused_elementwise' if fused else 'every op its own kernel'}; step {step * 1e3:.2f} ms")
            print(f"  {'kernel':<44}{'us':>9}{'bound us':>10}{'x bound':>9}  {'model':<14}{'per step':>10}")
            groups: dict[str, list[float]] = {}
            for k in kernels:
                ratio = k.seconds / k.bound if k.bound and not math.isnan(k.bound) else math.nan
                bound = f"{k.bound * 1e6:10.1f}" if not math.isnan(k.bound) else f"{'':>10}"
                print(f"  {k.name[:43]:<44}{k.seconds * 1e6:9.1f}{bound}{ratio:9.2f}  {k.model:<14}"
                      f"{k.seconds * k.count * 1e3:8.2f}ms")
                g = groups.setdefault(k.group, [0.0, 0.0])
                g[0] += k.seconds * k.count
                g[1] += (k.bound if not math.isnan(k.bound) else 0.0) * k.count
            print("  per step: " + ", ".join(f"{g} {t * 1e3:.2f} ms (bound {b * 1e3:.2f})" for g, (t, b) in
                                           groups.items()))
            if fused:
                if kv != "fp8":
                    continue
                # an FP8 cache holds twice the tokens: the same step at twice the batch
                for b in (batch, 2 * batch):
                    aic = aiconfigurator_step(aic_model, aic_system, tp, b, ctx, kv)
                    if aic is not None:
                        total = sum(v for v, _ in aic.values())
                        print(f"  aiconfigurator-core, KV cache fp8, batch {b}: {total:.2f} ms, "
                              f"{b / total * 1e3:,.0f} tokens/s")
                continue
            aic = aiconfigurator_step(aic_model, aic_system, tp, batch, ctx)
            if aic is None:
                print("  aiconfigurator-core not installed: no comparison")
                continue
            total = sum(v for v, _ in aic.values())
            print(f"  aiconfigurator-core 0.12.0 trtllm backend, same step ({aic_model}, {aic_system}): "
                  f"{total:.2f} ms, {batch / total * 1e3:,.0f} tokens/s")
            print("    " + ", ".join(f"{k.replace('generation_', '')} {v:.2f} ({s})" for k, (v, s) in aic.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
