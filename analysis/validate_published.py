"""Predictions of the shipped published tables (``marssim validate --published``), each row's error
and where its predicted time went, with the machine, wall and CPU time.

    PYTHONPATH=. python analysis/validate_published.py --kind train > analysis/results/validate_published.txt
    PYTHONPATH=. python analysis/validate_published.py --kind train --how simulate
    PYTHONPATH=. python analysis/validate_published.py --kind serve > analysis/results/validate_published_serving.txt

Serving tables (``trtllm-...``, ``sglang-...``) are predicted by the serving simulation whatever
``--how`` says; where a table sets the KV cache's type on some rows (``kv_dtype=`` in a model
spec), its variants store the KV cache of every row in FP8 (``kv_dtype=fp8``), then in bf16.
``--tables`` picks tables by name, ``--kind`` by kind (default: every shipped one).

The measured figures are checks, never fitted to: every number of the model comes from a
datasheet, a kernel or collective measurement, or Megatron-LM's code (docs/parallelism.md, "What
a Megatron-LM iteration runs beyond the graph"). Besides the tables, a few settings are changed
one at a time on each table, to show how much each moves the prediction: two the papers do not
state (whether the gradients were clipped; Megatron-LM's pipeline scatter/gather) and two of the
model's own (collectives at the links' line rate, no host launch gaps); a table of FP8 runs with
current scaling (``fp8_recipe=current``) also under delayed scaling; a table of Hopper runs with
fused attention also with other attention kernels: rows timed by the H100's measured grid with the
kernels the cuDNN frontend benchmark published for the PyTorch 24.03 container
(``attention_kernels=pytorch-24.03-h200``), FlashAttention-2 then cuDNN 9.1; rows that already name
that set (NeMo's, whose launcher disabled cuDNN) on the measured grid, then with the set's cuDNN 9.1.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time
from dataclasses import replace


CURRENT = "fp8_recipe=current"
"""The workload setting of FP8 current scaling: a table's rows with it are also predicted under
delayed scaling, to show what the recipe's amax kernels cost."""
HOPPER = ("dgx-h100-cluster", "dgx-h200-cluster")
"""Systems whose tables are also predicted with other attention kernels."""
KERNEL_SET = "pytorch-24.03-h200"
"""The 2024 training stack's attention kernel set (FlashAttention-2 and cuDNN 9.1 in the PyTorch
24.03 container)."""


def main(argv: list[str] | None = None) -> int:
    from marssim.cost import default_cost_model
    from marssim.validate.accuracy import summary
    from marssim.validate.published import (PublishedServing, format_predictions, load_published, predict_all,
                                            published_tables)

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--how", choices=("estimate", "simulate"), default="estimate")
    parser.add_argument("--no-variants", dest="variants", action="store_false")
    parser.add_argument("--tables", help="comma-separated table names (default: every shipped table)")
    parser.add_argument("--kind", choices=("train", "serve"), help="only the training or the serving tables")
    args = parser.parse_args(argv)
    names = args.tables.split(",") if args.tables else list(published_tables())
    if args.kind:
        names = [n for n in names if isinstance(load_published(n)[0], PublishedServing) == (args.kind == "serve")]
    cost = default_cost_model()
    print(f"validate_published: shipped published tables, training runs predicted by {args.how}, serving runs by "
          f"simulation ({platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
          f"Python {platform.python_version()})")
    for name in names:
        runs = load_published(name)
        serving = isinstance(runs[0], PublishedServing)
        how = "simulate (serving)" if serving else args.how
        t0, c0 = time.perf_counter(), time.process_time()
        predictions = predict_all(runs, cost, args.how)
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
        print(f"\n{name}: {len(runs)} published runs, predicted by {how} in {wall:.1f} s wall, {cpu:.1f} s CPU")
        print(format_predictions(predictions))
        if not args.variants:
            continue
        if serving and not any("kv_dtype=" in r.model for r in runs):
            continue
        if serving:
            print("\n  the same rows with the KV cache of every row in one type (mean |error|, worst, mean signed):")
            for kv in ("fp8", "bf16"):
                varied = [replace(r, model=_with_kv(r.model, kv)) for r in runs]
                if varied == list(runs):
                    continue
                s = summary(predict_all(varied, cost, args.how))
                print(f"    {'kv_dtype=' + kv:22s} {s['mean_abs']:6.2%}  {s['worst_abs']:6.2%}  {s['mean']:+6.2%}")
            continue
        print("\n  the same rows with one setting changed (mean |error|, worst, mean signed):")
        for setting in ("grads_clipped=true", "scatter_gather=false", "collectives=line", "host_gaps=false"):
            varied = [replace(r, parallel=f"{r.parallel},{setting}") for r in runs]
            s = summary(predict_all(varied, cost, args.how))
            print(f"    {setting:22s} {s['mean_abs']:6.2%}  {s['worst_abs']:6.2%}  {s['mean']:+6.2%}")
        if any(CURRENT in r.workload for r in runs):  # FP8 current scaling against delayed scaling
            varied = [replace(r, workload=r.workload.replace(CURRENT, "fp8_recipe=delayed")) for r in runs]
            s = summary(predict_all(varied, cost, args.how))
            print(f"    {'fp8_recipe=delayed':22s} {s['mean_abs']:6.2%}  {s['worst_abs']:6.2%}  {s['mean']:+6.2%}")
        if all(r.system.startswith(HOPPER) and "attention=flash" in r.workload for r in runs):
            for label, system, backend in _attention_variants(runs):
                varied = [replace(r, system=system(r.system), workload=r.workload.replace("attention=flash",
                                                                                          f"attention={backend}"))
                          for r in runs]
                s = summary(predict_all(varied, cost, args.how))
                print(f"    {label:22s} {s['mean_abs']:6.2%}  {s['worst_abs']:6.2%}  {s['mean']:+6.2%}"
                      f"  ({_SET_NOTE[label]})")
    return 0


_SET_NOTE = {"FlashAttention-2": f"attention_kernels={KERNEL_SET}", "cuDNN 9.1": f"attention_kernels={KERNEL_SET}",
             "measured grid": "no attention_kernels: TensorRT-LLM's kernels"}


def _attention_variants(runs) -> list[tuple[str, object, str]]:
    """The attention kernels a Hopper table's rows are also predicted with: (label, the system spec
    rewritten, the backend). Rows that name the 2024 kernel set (FlashAttention-2) are also run on
    the H100's measured grid and with the set's cuDNN 9.1; rows that do not, with the set's
    FlashAttention-2 and cuDNN 9.1."""
    named = f",attention_kernels={KERNEL_SET}"
    if all(named in r.system for r in runs):
        return [("measured grid", lambda s: s.replace(named, ""), "flash"), ("cuDNN 9.1", lambda s: s, "cudnn")]
    def with_set(s: str) -> str:
        return s if named in s else s + named

    return [("FlashAttention-2", with_set, "flash"), ("cuDNN 9.1", with_set, "cudnn")]


def _with_kv(model: str, kv: str) -> str:
    """The model spec ``model`` with its KV cache in ``kv`` (``kv_dtype=`` replaced or added; bf16:
    the cache in the model's bf16, no ``kv_dtype``)."""
    name, _, params = model.partition(":")
    kept = [p for p in params.split(",") if p and not p.startswith("kv_dtype=")]
    if kv != "bf16":
        kept.append(f"kv_dtype={kv}")
    return f"{name}:{','.join(kept)}" if kept else name


if __name__ == "__main__":
    sys.exit(main())
