"""How well the calibrated GPU model predicts the shapes model-parallel mappings ask for.

The calibration table (``traces/calibration/H100.csv``) holds the zoo's layers and a sweep of
their batch; a mapping that shards a layer across GPUs asks the cost model for shapes it does
not hold. ``traces/held-out/H100-shards.csv`` holds such shards, measured separately on the same
GPU (``marssim calibrate measure --kinds gemm,conv,attention --dtype bf16,fp32 --no-sweep
--shards 2,4,8``): each layer split 2, 4 and 8 ways by every legal sharding strategy. The
model never sees that file; this script asks the model (as the simulator does, through
``DataflowCost`` with the ``h100`` design of ``dgx-h100``) for every shard the calibration
table does not hold, and compares with the measured median of the vendor kernel (cuBLAS /
cuDNN). Shards whose GEMM shape the table holds are left out (the model charges those as
measured, or as measured neighbours).

Convolutions are predicted twice: with the table as it is (each conv row carries its
geometry, the correction from measured neighbours in a space that includes it), and with the
geometry columns dropped (the correction by the GEMM view alone, as for tables measured
before the columns existed) -- the same shards, the same measurements.

    PYTHONPATH=. python analysis/shard_prediction.py > analysis/results/shard_prediction.txt
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
from collections import defaultdict
from pathlib import Path

import numpy as np

WORKLOADS = ("resnet50", "bert-base", "gpt2", "vit-b16", "mobilenetv2", "vgg16")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--table", type=Path, default=Path("traces/calibration/H100.csv"))
    parser.add_argument("--held-out", type=Path, default=Path("traces/held-out/H100-shards.csv"))
    parser.add_argument("--system", default="dgx-h100")
    args = parser.parse_args(argv)

    from dataclasses import replace

    from marssim.calibrate.grid import build_grid
    from marssim.cost import DataflowCost, KernelTable, load_table
    from marssim.cost.calibrated import KEY_GEOMETRY
    from marssim.system import load_system

    table = load_table(args.table)
    held = load_table(args.held_out)
    gemm_view = {r.shape[:KEY_GEOMETRY] for r in table.rows}  # the shapes' GEMM views (geometry left out)
    measured: dict[tuple, float] = {}
    for r in held.rows:
        if r.tuning == "vendor":
            measured[r.shape] = min(measured.get(r.shape, np.inf), r.median_s)
    system = load_system(args.system)
    acc = system.accelerator_ids[0]
    design = system.design(acc, system.accelerator(acc).designs[0])
    models = {"geometry": DataflowCost(calibration=table),
              "GEMM view": DataflowCost(calibration=KernelTable(tuple(replace(r, conv=None) for r in table.rows)))}
    points = build_grid(WORKLOADS, ("gemm", "conv", "attention"), ("bf16", "fp32"), sweep=False, shards=(2, 4, 8))
    errors: dict[tuple[str, str, str], list[float]] = defaultdict(list)
    signed: dict[tuple[str, str, str], list[float]] = defaultdict(list)
    used: dict[str, int] = defaultdict(int)
    for p in points:
        if p.key[:KEY_GEOMETRY] in gemm_view or p.key not in measured:
            continue
        for name, model in models.items():
            if name != "geometry" and p.kind != "conv":
                continue
            cost = model.op_cost(p.op, design)
            used[cost.model] += name == "geometry"
            ratio = cost.time / measured[p.key]
            label = p.kind if p.kind != "conv" else f"conv, by {name}"
            errors[(label, p.dtype)].append(abs(ratio - 1))
            signed[(label, p.dtype)].append(np.log(ratio))
    print(f"# shard shapes not in {args.table}, predicted by the cost model vs measured ({args.held_out});")
    print(f"# computed on {platform.processor() or platform.machine()}, {os.cpu_count()} cores; "
          f"models used: {dict(used)}")
    print(f"{'kind':22s} {'dtype':5s} {'shards':>6s} {'median':>7s} {'p90':>7s} {'max':>7s} {'bias':>7s}")
    for (kind, dtype), e in sorted(errors.items()):
        bias = float(np.exp(statistics.median(signed[(kind, dtype)])) - 1)
        print(f"{kind:22s} {dtype:5s} {len(e):6d} {100 * statistics.median(e):6.1f}% "
              f"{100 * float(np.quantile(e, 0.9)):6.1f}% {100 * max(e):6.1f}% {100 * bias:+6.1f}%")
    print("error: |predicted / measured - 1| per shard; bias: median predicted / measured - 1; conv, by GEMM view: "
          "the table with its geometry columns dropped (the correction from neighbours by the GEMM view alone)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
