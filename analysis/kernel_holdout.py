"""Held-out error of the GPU cost model per kernel family, on the shipped A100 and H100 tables, per
software stack; what the measured rows do to the GEMM rates of GPT-3 175B; and how much the stack
matters (an H100 model fitted on one stack predicting the other stack's rows).

    PYTHONPATH=. python analysis/kernel_holdout.py > analysis/results/kernel_holdout.txt

1. Held-out error per (GPU, stack, family, dtype): the cost model's curve and its local residual
   correction fitted on 80 % of a group's distinct shapes and asked for the other 20 %
   (:func:`marssim.calibrate.fitting.fit_report`: the split by the SHA-256 of each shape), median
   and p90 of ``|predicted / measured - 1|``; the curve alone beside it. A measured shape is
   charged its measured time (error 0 by construction): these errors are those of shapes the
   table lacks.
2. The same errors of the Vidur GEMM rows split by operator and by regime: decode-sized
   (``m <= 64`` tokens) and prefill/training-sized.
3. Stack dependence: the H100 model of the harness's stack (``pytorch-2.11.0+cu130``, 2026)
   predicting Vidur's H100 rows (``vidur-2024``) and the other way round, median and p90 by
   family: what choosing the wrong stack costs.
4. GPT-3 175B (hidden 12,288, 96 heads; Megatron-LM's tensor-parallel split) GEMMs of one
   rank: forward, input- and weight-gradient GEMMs of a training micro-batch of one 2,048-token
   sequence at tp=8 and tp=4, and the forward GEMMs of a decode step of 8 and 64 sequences at
   tp=8 -- FLOP/s on the shipped A100 design before (the roofline: 0.80 x 312 TFLOP/s x wave and
   tile factors) and after (the A100 table), and on the H100 design with each stack; which model
   timed each shape. Also the norms, GeLU and residual adds of the decode step.
"""

from __future__ import annotations

import os
import platform
import sys
import time

import numpy as np


def _pct(x: float) -> str:
    return f"{100 * x:.1f} %"


def _stats(errors) -> tuple[float, float]:
    e = np.asarray(errors, dtype=float)
    return float(np.median(e)), float(np.percentile(e, 90))


def holdout_tables(lines: list[str]) -> None:
    from marssim.calibrate.fitting import fit_report
    from marssim.cost.calibrated import load_table
    from marssim.data import calibration
    from marssim.system.describe import format_table

    rows = []
    for gpu in ("A100", "H100"):
        table = load_table(calibration() / f"{gpu}.csv")
        for r in fit_report(table):
            device, kind, dtype, tuning = r.key
            if tuning != "vendor":
                continue
            if r.holdout is None:
                rows.append([gpu, r.stack, kind, dtype, str(r.n_rows), "-", "-", "-", "-", "-", r.reason])
                continue
            h, c = r.holdout, r.curve_holdout
            rows.append([gpu, r.stack, kind, dtype, str(r.n_rows), str(h.n_held), _pct(h.median), _pct(h.p90),
                         _pct(c.median), _pct(c.p90), ""])
    lines.append("1. Held-out error per kernel family (20 % of each group's shapes held out of the fit)")
    lines.append("")
    lines.extend(format_table(["GPU", "stack", "family", "dtype", "rows", "held out", "median", "p90",
                               "curve median", "curve p90", "note"], rows, indent="  "))
    lines.append("")
    lines.append("  median/p90: the cost model on shapes it did not see (fitted curve x local residual correction); "
                 "curve: the fitted curve alone. Vendor-tuned rows (cuBLAS, cuDNN, PyTorch kernels); the Triton "
                 "GEMM rows (tuning none) are in traces/calibration/H100.fit.json.")
    lines.append("")


def vidur_gemm_breakdown(lines: list[str]) -> None:
    from marssim.calibrate.fitting import holdout_split
    from marssim.calibrate.table import parse_note
    from marssim.cost.calibrated import fit_group, load_table, predict
    from marssim.data import calibration
    from marssim.system.describe import format_table

    lines.append("2. Vidur GEMM rows: held-out error by operator and regime (same split as in 1)")
    lines.append("")
    out = []
    for gpu in ("A100", "H100"):
        table = load_table(calibration() / f"{gpu}.csv").for_stack("vidur-2024")
        rows = [r for r in table.rows if r.kind == "gemm" and r.stack == "vidur-2024"]
        fit_rows, held = holdout_split(rows)
        f = fit_group(fit_rows)
        pred = predict(f, "gemm", batch=[r.batch for r in held], m=[r.m for r in held], n=[r.n for r in held],
                       k=[r.k for r in held], nbytes=[r.bytes for r in held])
        err = np.abs(np.asarray(pred) / np.array([r.median_s for r in held]) - 1)
        groups: dict[tuple[str, str], list[float]] = {}
        for r, e in zip(held, err):
            op = parse_note(r.note)["op"]
            regime = "decode (m <= 64)" if r.m <= 64 else "prefill/train (m > 64)"
            groups.setdefault((op, regime), []).append(float(e))
            groups.setdefault(("all", regime), []).append(float(e))
        for (op, regime), es in sorted(groups.items()):
            med, p90 = _stats(es)
            out.append([gpu, op, regime, str(len(es)), _pct(med), _pct(p90)])
    lines.extend(format_table(["GPU", "operator", "regime", "held out", "median", "p90"], out, indent="  "))
    lines.append("")


def stack_dependence(lines: list[str]) -> None:
    from marssim.cost.calibrated import KernelTable, fit, load_table, predict
    from marssim.cost.gpu import design_peaks
    from marssim.data import calibration
    from marssim.system import load_system
    from marssim.system.describe import format_table

    table = load_table(calibration() / "H100.csv")
    peaks = design_peaks(load_system("dgx-h100").design("gpu0", "h100"))
    lines.append("3. Stack dependence on H100: one stack's model (its measured shapes, else its fitted curve x "
                 "correction, as the cost model charges) asked for the other stack's fp16 rows")
    lines.append("")
    out = []
    for fitted_on, asked in (("pytorch-2.11.0+cu130", "vidur-2024"), ("vidur-2024", "pytorch-2.11.0+cu130")):
        mine = KernelTable(tuple(r for r in table.rows if r.stack == fitted_on and r.tuning == "vendor"))
        fits = {(k[1], k[2]): f for k, f in fit(mine, peaks=peaks).items()}
        measured = {}
        for r in mine.rows:
            measured[r.shape] = min(measured.get(r.shape, r.median_s), r.median_s)
        by_kind: dict[str, list[float]] = {}
        for r in table.rows:
            if r.stack != asked or r.dtype != "fp16" or r.phase != "fwd" or r.tuning != "vendor":
                continue
            f = fits.get((r.kind, r.dtype))
            if r.shape in measured:
                t = measured[r.shape]
            elif f is not None:
                t = float(predict(f, r.kind, batch=r.batch, m=r.m, n=r.n, k=r.k, flops=r.flops, nbytes=r.bytes))
            else:
                continue
            by_kind.setdefault(r.kind, []).append(t / r.median_s - 1)
        for kind, errs in sorted(by_kind.items()):
            signed = float(np.median(errs))
            med, p90 = _stats(np.abs(errs))
            out.append([fitted_on, asked, kind, str(len(errs)), f"{100 * signed:+.1f} %", _pct(med), _pct(p90)])
    lines.extend(format_table(["model of stack", "rows of stack", "family", "rows", "median signed", "median |err|",
                               "p90 |err|"], out, indent="  "))
    lines.append("")
    lines.append("  signed: predicted / measured - 1 (negative: the model is faster than the other stack measured). "
                 "Shapes both stacks measured (few) are charged the first stack's time.")
    lines.append("")


def gpt3_rates(lines: list[str]) -> None:
    from marssim.calibrate.grid import _point
    from marssim.calibrate.llm import tp_shards
    from marssim.cost import DataflowCost
    from marssim.data import calibration
    from marssim.parallel.config import ParallelConfig
    from marssim.system import load_system
    from marssim.system.describe import format_table
    from marssim.workload import load_workload

    a100 = load_system("dgx-a100-cluster:nodes=1").design("gpu0", "a100")
    h100 = load_system("dgx-h100-cluster:nodes=1").design("gpu0", "h100")
    h100_vidur = h100.model_copy(update={"gpu": h100.gpu.model_copy(update={"stack": "vidur-2024"})})
    shipped = DataflowCost(calibration=calibration())
    roofline = DataflowCost(calibration=None)
    columns = [("A100 before (roofline)", roofline, a100), ("A100 after (A100.csv)", shipped, a100),
               ("H100 shipped (pytorch-2.11.0+cu130)", shipped, h100), ("H100 stack vidur-2024", shipped, h100_vidur)]
    runs = [("train tp=8", "gpt3-175b:mode=train,seq=2048,batch=1,layers=1", 8),
            ("train tp=4", "gpt3-175b:mode=train,seq=2048,batch=1,layers=1", 4),
            ("decode 8 seq tp=8", "gpt3-175b:mode=decode,context=2048,batch=8,layers=1", 8),
            ("decode 64 seq tp=8", "gpt3-175b:mode=decode,context=2048,batch=64,layers=1", 8)]
    lines.append("4. GPT-3 175B on one GPU of Megatron-LM's tensor-parallel split: TFLOP/s of each GEMM shard "
                 "(bf16), before and after the measured rows; the model that timed it (m: measured, f: fitted, "
                 "r: roofline)")
    lines.append("")
    tag = {"measured": "m", "fitted": "f", "gpu-roofline": "r"}
    out = []
    totals: dict[tuple[str, str], list[float]] = {}
    small: list[list[str]] = []
    for label, spec, tp in runs:
        graph = load_workload(spec)
        seen = set()
        for op, shard in tp_shards(graph, ParallelConfig(tp=tp, micro_batch=1)):
            if not op.name.startswith("layers.0.") and op.name != "output":
                continue
            p = _point(shard, "gemm", op.name)
            if p is None:
                for kind in ("norm", "elementwise", "softmax") if label.startswith("decode") else ():
                    q = _point(shard, kind, op.name)
                    if q is not None and (label, op.name) not in seen:
                        seen.add((label, op.name))
                        cells = [label, op.name.removeprefix("layers.0."), kind]
                        for _, model, design in columns:
                            c = model.op_cost(shard, design)
                            cells.append(f"{1e6 * c.time:.1f} us {tag.get(c.model, c.model)}")
                        small.append(cells)
                continue
            key = (label, p.m, p.n, p.k, p.phase)
            if key in seen:
                continue
            seen.add(key)
            cells = [label, op.name.removeprefix("layers.0."), f"{p.m}x{p.n}x{p.k}"]
            for name, model, design in columns:
                c = model.op_cost(shard, design)
                cells.append(f"{p.flops / c.time / 1e12:.0f} {tag.get(c.model, c.model)}")
                totals.setdefault((label, name), [0.0, 0.0])
                totals[(label, name)][0] += p.flops
                totals[(label, name)][1] += c.time
            out.append(cells)
    headers = ["run", "op", "m x n x k", *[c[0] for c in columns]]
    lines.extend(format_table(headers, out, indent="  "))
    lines.append("")
    agg = []
    for label, *_ in runs:
        agg.append([label, *[f"{totals[(label, n)][0] / totals[(label, n)][1] / 1e12:.0f}" for n, *_ in columns]])
    lines.append("  FLOP-weighted (sum of FLOPs / sum of times) over the shards above, TFLOP/s:")
    lines.extend(format_table(["run", *[c[0] for c in columns]], agg, indent="  "))
    lines.append("")
    lines.append("  Decode step, the non-GEMM kernels of one layer (time per kernel):")
    lines.extend(format_table(["run", "op", "family", *[c[0] for c in columns]], small, indent="  "))
    lines.append("")


def main() -> int:
    t0, c0 = time.perf_counter(), time.process_time()
    lines = [f"kernel_holdout: the GPU cost model on the shipped calibration tables "
             f"({platform.processor() or platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()})",
             ""]
    holdout_tables(lines)
    vidur_gemm_breakdown(lines)
    stack_dependence(lines)
    gpt3_rates(lines)
    lines.append(f"wall {time.perf_counter() - t0:.1f} s, CPU {time.process_time() - c0:.1f} s")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
