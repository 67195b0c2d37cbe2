"""Held-out error of the GPU cost model on AIConfigurator's measured kernels (aiconfigurator-core
0.12.0, TensorRT-LLM 1.3.0rc20), per GPU, kernel family and dtype.

    PYTHONPATH=. python analysis/aiconfigurator_holdout.py [--data PATH] > analysis/results/aiconfigurator_holdout.txt

1. The shipped subsets (``traces/calibration/<GPU>-aiconfigurator.csv``): the curve and its local
   residual correction fitted on 80 % of a group's distinct shapes and asked for the other 20 %
   (:func:`marssim.calibrate.fitting.fit_report`, the split by the SHA-256 of each shape), median
   and p90 of ``|predicted / measured - 1|``; the curve alone beside it.
2. With the package's data (``--data``: its ``systems/data`` directory or the unpacked package;
   default the installed package, skipped when absent): the model the shipped subset gives a
   design (measured rows where a shape is one of them, else the curve x correction fitted on all
   of them, bounded by the design's peaks) asked for every measured row of the package that the
   subset left out -- the odd token counts (3, 4,097, ...) and the widths below 256 -- split into
   shapes inside the subset's grid (``256 <= n, k <= 65,536``, ``m <= 32,768``: interpolation)
   and outside it (narrower widths: extrapolation), by regime (decode-sized ``m <= 64`` and larger).
3. Fused (causal) context attention: each shipped row over a bf16 cache predicted by the kind's
   curve as if the measured rows were absent (the fused kernel's shape by the curve of the unfused products), by
   prompt length: what shapes off the grid got before they were interpolated.
4. Fused attention interpolated (:mod:`marssim.cost.attention_grid`): per GPU and family
   (context and decode, each over a bf16 and over an FP8 cache), 20 % of the shipped rows' shapes
   held out (the SHA-256 split of 1.), the grid built from the other 80 % asked for them: median,
   p90 and max of ``|predicted / measured - 1|`` over the held-out rows it interpolates, and how
   many it cannot (outside the remaining grid: those fall back to the curve).
5. With the package's data: the shipped grids asked for the package's rows of query-head counts
   the subset left out (12, 24, 40, 48 heads between the shipped 4 to 64: interpolated over heads).
6. Fused mixture-of-experts operators (:mod:`marssim.cost.moe_kernels`,
   ``traces/moe-kernels/``): per GPU and dtype, each measured token count strictly inside a
   curve predicted from the curve without it (log-linear between its neighbours), median and p90
   of ``|predicted / measured - 1|``; and what the measured operator replaces: the experts' ops
   one by one (dispatch, grouped GEMMs, activation, casts, combine, each by the cost model) over
   the measured operator, for the shipped presets' layers at every tensor/expert-parallel split a
   serving replica of 1-8 GPUs runs (``ep = 1`` or ``ep = tp``), at every measured token count.
7. The H100 harness's own bf16 GEMM rows (``traces/calibration/H100.csv``, stack
   ``pytorch-2.11.0+cu130``: cuBLAS through PyTorch, each repetition after writing 256 MiB to flush
   L2, CUDA events around the kernel) against AIConfigurator's rows of the same shapes (the same
   cuBLAS GEMMs as TensorRT-LLM calls them), by the kernel's measured time: the difference and the
   ratio, median and range.
8. Decode attention past the end of a grid line (:mod:`marssim.cost.attention_grid`): the last
   measured key count of every decode line (query heads, sequences) of the shipped grids with at
   least three points held out and predicted three ways: from the neighbouring lines of fewer and
   of more sequences at the same cached tokens (the grid without the point: what a kernel between
   two lines of which one stops short now takes), the line's own last slope continued (between 0
   and linear: a line past its end below the plateau), and linear in the keys (the cache it
   streams: a line past its end at the plateau); by whether the line's last point streams fewer
   or at least ``SATURATED_DECODE_ROWS`` key/value-head rows. Median and p90 of
   ``|predicted / measured - 1|`` and the mean signed error.
9. Linear layers' GEMMs between measured shapes (:mod:`marssim.cost.gemm_grid`): with the package's
   data, its rows the shipped subset left out inside the subset's ranges (the odd token counts
   between powers of two) predicted by the shipped grid; and, on the shipped rows alone, every
   interior width and every interior depth of the grid held out in turn (all its rows) and
   predicted from the others. Median and p90 of ``|predicted / measured - 1|``, beside the fitted
   curve with its local correction on the same left-out rows (2.).
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time

import numpy as np

GPUS = {"H100": "h100_sxm", "H200": "h200_sxm", "B200": "b200_sxm", "B300": "b300_sxm", "GB200": "gb200",
        "GB300": "gb300"}
SYSTEMS = {"H100": "dgx-h100-cluster:nodes=1,stack=trtllm-1.3.0rc20", "H200": "dgx-h200-cluster:nodes=1",
           "B200": "dgx-b200-cluster:nodes=1", "B300": "dgx-b300-cluster:nodes=1", "GB200": "gb200-nvl72:racks=1",
           "GB300": "gb300-nvl72:racks=1"}


def _pct(x: float) -> str:
    return f"{100 * x:.1f} %"


def shipped_holdout(lines: list[str]) -> None:
    from marssim.calibrate.fitting import fit_report
    from marssim.cost.calibrated import load_table
    from marssim.data import calibration
    from marssim.system.describe import format_table

    rows = []
    for gpu in GPUS:
        table = load_table(calibration() / f"{gpu}-aiconfigurator.csv")
        for r in fit_report(table):
            _, kind, dtype, _ = r.key
            if r.holdout is None:
                rows.append([gpu, kind, dtype, str(r.n_rows), "-", "-", "-", "-", "-", r.reason])
                continue
            h, c = r.holdout, r.curve_holdout
            rows.append([gpu, kind, dtype, str(r.n_rows), str(h.n_held), _pct(h.median), _pct(h.p90), _pct(c.median),
                         _pct(c.p90), "meets 10 %" if h.median <= 0.10 else "misses 10 %"])
    lines.append("1. Held-out error on the shipped subsets (20 % of each group's shapes held out of the fit)")
    lines.append("")
    lines.extend(format_table(["GPU", "family", "dtype", "rows", "held out", "median", "p90", "curve median",
                               "curve p90", "target"], rows, indent="  "))
    lines.append("")


def package_holdout(lines: list[str], data: str | None) -> None:
    from marssim.calibrate.aiconfigurator import DEFAULT_M, DEFAULT_WIDTHS, GEMM_DTYPES, data_root, gemm_rows, table_path
    from marssim.cost import default_cost_model
    from marssim.cost.calibrated import predict
    from marssim.cost.gpu import design_peaks
    from marssim.errors import InputError
    from marssim.system import load_system
    from marssim.system.describe import format_table

    try:
        root = data_root(data)
    except InputError as err:
        lines.append(f"2. skipped: {err}")
        return
    lines.append(f"2. The shipped model asked for the package's measured rows it was not given ({root})")
    lines.append("")
    lo, hi = min(DEFAULT_WIDTHS), max(DEFAULT_WIDTHS)
    out = []
    model = default_cost_model()
    for gpu, system in SYSTEMS.items():
        design = next(iter(load_system(system).designs.values()))
        fits = model.fits_for(gpu, design_peaks(design), design.gpu.stack)
        path = table_path(root, GPUS[gpu], "gemm", "trtllm", "1.3.0rc20", "gemm")
        every = gemm_rows(path, GPUS[gpu], "x", "x", "2026-01-01", m_values=None, widths=None)
        kept = set(DEFAULT_M), set(DEFAULT_WIDTHS)
        left = [r for r in every if not (r.m in kept[0] and r.n in kept[1] and r.k in kept[1])]
        for dtype in sorted({GEMM_DTYPES[d] for d in GEMM_DTYPES} & {r.dtype for r in left}):
            f = fits.get(("gemm", dtype))
            if f is None:
                continue
            mine = [r for r in left if r.dtype == dtype]
            pred = np.asarray(predict(f, "gemm", batch=[1] * len(mine), m=[r.m for r in mine], n=[r.n for r in mine],
                                      k=[r.k for r in mine], nbytes=[r.bytes for r in mine]))
            err = np.abs(pred / np.array([r.median_s for r in mine]) - 1)
            inside = np.array([lo <= r.n <= hi and lo <= r.k <= hi for r in mine])
            small = np.array([r.m <= 64 for r in mine])
            for where, sel in (("inside", inside), ("outside", ~inside)):
                for regime, part in (("m <= 64", small), ("m > 64", ~small), ("all", np.ones_like(small))):
                    e = err[sel & part]
                    if len(e):
                        out.append([gpu, dtype, where, regime, str(len(e)), _pct(float(np.median(e))),
                                    _pct(float(np.percentile(e, 90)))])
    lines.extend(format_table(["GPU", "dtype", "grid", "regime", "rows", "median", "p90"], out, indent="  "))
    lines.append("")
    lines.append("  inside: widths of the shipped grid's range, interpolated between its rows (the odd token counts "
                 "4,097 etc. between powers of two); outside: widths below 256, extrapolated by the curve.")
    lines.append("")


def attention_without_rows(lines: list[str]) -> None:
    """Every shipped context attention row predicted by the cost model as if the row were absent
    (the fused kernel's shape timed by the curve of its kind and its correction: the harness's
    unfused products on the H100, the roofline on the H200, B200, B300, GB200 and GB300), by sequence length."""
    from marssim.cost import DataflowCost
    from marssim.cost.calibrated import calibration_dir, load_table
    from marssim.data import calibration
    from marssim.serve import load_model
    from marssim.system import load_system
    from marssim.system.describe import format_table
    from marssim.workload.llm import build_transformer
    from marssim.workload.llm.config import with_overrides

    cfg = with_overrides(load_model("llama3-70b"), mode="prefill", seq=128, batch=1, layers=1, attention="flash")
    template = build_transformer(cfg).op("layers.0.attn.core")
    model = DataflowCost(calibration=calibration_dir(), measured=False)  # curve x correction, no measured shape
    out = []
    for gpu, system in SYSTEMS.items():
        design = next(iter(load_system(system.replace(",stack=trtllm-1.3.0rc20", "")).designs.values()))
        rows = [r for r in load_table(calibration() / f"{gpu}-aiconfigurator.csv").rows
                if r.kind == "attention" and r.m == r.n and "kv_dtype" not in r.note]  # prefill, bf16 cache
        by_len: dict[str, list[float]] = {}
        for r in rows:
            note = dict(part.split("=", 1) for part in r.note.split("; "))
            op = template.with_loops(B=int(note["batch"]), H=int(note["heads"]), M=r.m, N=r.n, K=r.k)
            e = model.op_time(op, design) / r.median_s - 1
            band = "<= 1,024" if r.m <= 1024 else "2,048-4,096" if r.m <= 4096 else ">= 6,144"
            by_len.setdefault(band, []).append(e)
            by_len.setdefault("all", []).append(e)
        for band, es in by_len.items():
            e = np.asarray(es)
            out.append([gpu, band, str(len(e)), f"{100 * float(np.median(e)):+.1f} %", _pct(float(np.median(np.abs(e)))),
                        _pct(float(np.percentile(np.abs(e), 90)))])
    lines.append("3. Fused (causal) context attention: the curve without the measured rows asked for them "
                 "(what shapes off the grid got before the interpolation of 4.)")
    lines.append("")
    lines.extend(format_table(["GPU", "tokens", "rows", "median signed", "median", "p90"], out, indent="  "))
    lines.append("")
    lines.append("  signed > 0: predicted slower than measured. A shape on the grid is charged its measured time "
                 "(error 0); a shape between grid points is now interpolated (4.); these errors remain those of "
                 "the shapes outside every grid.")
    lines.append("")


def _families(rows):
    """Rows by family label: context and decode, each over a bf16 and over an fp8 cache."""
    from marssim.cost.attention_grid import row_entries

    out: dict[str, list] = {}
    for r in rows:
        entries = row_entries([r])
        if not entries:
            continue
        key = entries[0][0]
        label = f"{key.family.value}, {key.kv_bits}-bit cache"
        out.setdefault(label, []).append(r)
    return out


def _grid_errors(grid, rows) -> tuple[np.ndarray, int]:
    """``|predicted / measured - 1|`` of the rows ``grid`` interpolates, and how many it cannot."""
    from marssim.cost.attention_grid import row_entries

    errs, missed = [], 0
    for key, h, b, s, seconds in row_entries(rows):
        t = grid.seconds(key, h, b, s)
        if t is None:
            missed += 1
        else:
            errs.append(abs(t / seconds - 1))
    return np.asarray(errs), missed


def attention_holdout(lines: list[str]) -> None:
    from marssim.calibrate.fitting import holdout_split
    from marssim.cost.attention_grid import AttentionGrid, row_entries
    from marssim.cost.calibrated import load_table
    from marssim.data import calibration
    from marssim.system.describe import format_table

    out = []
    for gpu in GPUS:
        rows = [r for r in load_table(calibration() / f"{gpu}-aiconfigurator.csv").rows if r.kind == "attention"]
        for label, mine in sorted(_families(rows).items()):
            fit_rows, held = holdout_split(mine)
            grid = AttentionGrid(row_entries(fit_rows))
            e, missed = _grid_errors(grid, held)
            if not len(e):
                out.append([gpu, label, str(len(mine)), str(len(held)), "0", str(missed), "-", "-", "-", "-"])
                continue
            med, p90 = float(np.median(e)), float(np.percentile(e, 90))
            out.append([gpu, label, str(len(mine)), str(len(held)), str(len(e)), str(missed), _pct(med), _pct(p90),
                        _pct(float(e.max())), "meets 10 %" if med <= 0.10 else "misses 10 %"])
    lines.append("4. Fused attention between measured shapes: 20 % of each family's shapes held out, interpolated "
                 "from the other 80 %")
    lines.append("")
    lines.extend(format_table(["GPU", "family", "rows", "held out", "interpolated", "outside grid", "median", "p90",
                               "max", "target"], out, indent="  "))
    lines.append("")
    lines.append("  A held-out shape sits between grid points up to twice as far apart as the shipped grid's (powers "
                 "of two in sequences and keys), so these errors bound those of shapes between the shipped points.")
    lines.append("")


def attention_package(lines: list[str], data: str | None) -> None:
    from marssim.calibrate.aiconfigurator import (
        DEFAULT_ATTENTION_HEADS, context_attention_rows, data_root, generation_attention_rows, table_path,
    )
    from marssim.cost.attention_grid import AttentionGrid, row_entries
    from marssim.cost.calibrated import load_table
    from marssim.data import calibration
    from marssim.errors import InputError
    from marssim.system.describe import format_table

    try:
        root = data_root(data)
    except InputError as err:
        lines.append(f"5. skipped: {err}")
        return
    out = []
    for gpu, system in GPUS.items():
        shipped = [r for r in load_table(calibration() / f"{gpu}-aiconfigurator.csv").rows if r.kind == "attention"]
        grid = AttentionGrid(row_entries(shipped))
        ctx = context_attention_rows(table_path(root, system, "attention", "trtllm", "1.3.0rc20", "context_attention"),
                                     system, "x", "x", "2026-01-01", heads=None)
        gen = generation_attention_rows(table_path(root, system, "attention", "trtllm", "1.3.0rc20",
                                                   "generation_attention"), system, "x", "x", "2026-01-01", heads=None)
        left = [r for r in ctx + gen if int(dict(p.split("=", 1) for p in r.note.split("; "))["heads"])
                not in DEFAULT_ATTENTION_HEADS]
        for label, mine in sorted(_families(left).items()):
            e, missed = _grid_errors(grid, mine)
            if len(e):
                out.append([gpu, label, str(len(mine)), str(len(e)), str(missed), _pct(float(np.median(e))),
                            _pct(float(np.percentile(e, 90))), _pct(float(e.max()))])
    lines.append(f"5. The shipped grids asked for the package's attention rows of other head counts ({root})")
    lines.append("")
    lines.extend(format_table(["GPU", "family", "rows", "interpolated", "outside grid", "median", "p90", "max"], out,
                              indent="  "))
    lines.append("")
    lines.append("  Outside: head counts beyond the shipped 64, or group ratios the shipped heads lack.")
    lines.append("")


MOE_PRESETS = ("mixtral-8x7b", "mixtral-8x22b", "qwen3-30b-a3b")


def moe_holdout(lines: list[str]) -> None:
    from marssim.cost import default_cost_model
    from marssim.cost.moe_kernels import MoeCurve, shipped_moe_curves
    from marssim.serve import load_model
    from marssim.serve.itermodel import IterationModel
    from marssim.system import load_system
    from marssim.system.describe import format_table

    table = shipped_moe_curves()
    errs: dict[tuple[str, str], list[float]] = {}
    for shape, c in table.items():
        for i in range(1, len(c.tokens) - 1):
            without = MoeCurve(shape, c.tokens[:i] + c.tokens[i + 1:], c.seconds[:i] + c.seconds[i + 1:], c.source)
            errs.setdefault((shape.device, shape.dtype), []).append(abs(without(c.tokens[i]) / c.seconds[i] - 1))
    rows = []
    for (device, dtype), e in sorted(errs.items()):
        a = np.array(e)
        rows.append([device, dtype, str(sum(1 for s in table if (s.device, s.dtype) == (device, dtype))), str(len(a)),
                     _pct(float(np.median(a))), _pct(float(np.quantile(a, 0.9))), _pct(float(a.max())),
                     "meets 10 %" if np.median(a) <= 0.10 else "misses 10 %"])
    lines.append("6. Fused MoE operators (traces/moe-kernels/: TensorRT-LLM 1.3.0rc20's, balanced routing)")
    lines.append("")
    lines.append("  a. each interior measured token count held out of its curve")
    lines.extend(format_table(["GPU", "dtype", "curves", "held out", "median", "p90", "max", "median"], rows,
                              indent="  "))
    lines.append("")
    cost = default_cost_model()
    ratios: dict[tuple[str, str, str], list[float]] = {}
    for device, spec in SYSTEMS.items():
        system = load_system(spec)
        gpus = system.accelerator_ids
        for preset in MOE_PRESETS:
            for dtype in ("bf16", "fp8", "fp4"):
                if dtype == "fp4" and device not in ("B200", "B300", "GB200", "GB300"):  # NVFP4: Blackwell only
                    continue
                model = load_model(preset + ("" if dtype == "bf16" else f":dtype={dtype}"))
                for tp in (1, 2, 4, 8):
                    for ep in sorted({1, tp}):
                        if model.experts % ep:
                            continue
                        im = IterationModel(model, system, (tuple(gpus[:tp]),), cost, ep=ep)
                        curve = im.expert_curves[0]
                        if curve is None:
                            continue
                        for t, measured in zip(curve.tokens, curve.seconds):
                            regime = "decode (<= 64 tokens)" if t <= 64 else "prefill (> 64 tokens)"
                            ratios.setdefault((device, dtype, regime), []).append(im._expert_ops_seconds(0, t)
                                                                                  / measured)
    rows = []
    for (device, dtype, regime), r in sorted(ratios.items()):
        a = np.array(r)
        rows.append([device, dtype, regime, str(len(a)), f"{np.median(a):.2f}", f"{np.quantile(a, 0.1):.2f}",
                     f"{np.quantile(a, 0.9):.2f}"])
    lines.append(f"  b. the experts' ops one by one over the measured operator ({', '.join(MOE_PRESETS)}; "
                 "tp 1-8, ep 1 or tp)")
    lines.extend(format_table(["GPU", "dtype", "tokens", "points", "median", "p10", "p90"], rows, indent="  "))
    lines.append("")
    lines.append("  A serving iteration's experts take the measured operator where the design's stacks measured the "
                 "layer at its split under balanced routing (skewed expert_load: the ops one by one).")
    lines.append("")


def harness_against_aiconfigurator(lines: list[str]) -> None:
    from marssim.cost.calibrated import load_table
    from marssim.data import calibration
    from marssim.system.describe import format_table

    theirs = {(r.m, r.n, r.k): r.median_s for r in load_table(calibration() / "H100-aiconfigurator.csv").rows
              if r.kind == "gemm" and r.dtype == "bf16" and r.batch == 1}
    pairs = [(r.median_s, theirs[(r.m, r.n, r.k)]) for r in load_table(calibration() / "H100.csv").rows
             if r.kind == "gemm" and r.dtype == "bf16" and r.tuning == "vendor" and r.batch == 1
             and r.stack.startswith("pytorch") and (r.m, r.n, r.k) in theirs]
    rows = []
    for lo, hi in ((0.0, 10e-6), (10e-6, 30e-6), (30e-6, 100e-6), (100e-6, 1.0)):
        sel = [(o, t) for o, t in pairs if lo <= t < hi]
        if not sel:
            continue
        diff = np.array([o - t for o, t in sel]) * 1e6
        ratio = np.array([o / t for o, t in sel])
        rows.append([f"{lo * 1e6:g}-{hi * 1e6:g} us" if hi < 1 else f">= {lo * 1e6:g} us", str(len(sel)),
                     f"{np.median(diff):.1f}", f"{diff.min():.1f} to {diff.max():.1f}", f"{np.median(ratio):.2f}",
                     f"{ratio.min():.2f} to {ratio.max():.2f}"])
    lines.append("7. The H100 harness's bf16 GEMMs (pytorch-2.11.0+cu130) against AIConfigurator's at the same shapes "
                 f"({len(pairs)} shapes)")
    lines.append("")
    lines.extend(format_table(["AIConfigurator's time", "shapes", "harness - theirs, us (median)", "range",
                               "harness / theirs (median)", "range"], rows, indent="  "))
    lines.append("")
    lines.append("  The harness times each repetition of a kernel alone after a 256 MiB write (an L2 left full of "
                 "dirty lines), between two CUDA events; an engine's kernels run back to back.")
    lines.append("")


def decode_line_ends(lines: list[str]) -> None:
    import math

    from marssim.cost.attention_grid import AttentionFamily, AttentionGrid, row_entries, saturated
    from marssim.cost.calibrated import load_table
    from marssim.data import calibration
    from marssim.system.describe import format_table

    out = []
    for gpu in GPUS:
        rows = [r for r in load_table(calibration() / f"{gpu}-aiconfigurator.csv").rows if r.kind == "attention"]
        entries = [e for e in row_entries(rows) if e[0].family is AttentionFamily.DECODE]
        lines_of: dict[tuple, dict[int, float]] = {}
        for key, h, b, s, seconds in entries:
            line = lines_of.setdefault((key, h, b), {})
            line[s] = min(seconds, line.get(s, math.inf))
        errors: dict[tuple[str, str], list[float]] = {}
        for (key, h, b), line in lines_of.items():
            keys = sorted(line)
            if len(keys) < 3:
                continue
            last, prev = keys[-1], keys[-2]
            truth, at_prev = line[last], line[prev]
            band = "at the plateau" if saturated(key.family, key.group, h, b, prev) else "below the plateau"
            slope = min(max(math.log(at_prev / line[keys[-3]]) / math.log(prev / keys[-3]), 0.0), 1.0)
            errors.setdefault((band, "own last slope"), []).append(at_prev * (last / prev) ** slope / truth - 1)
            errors.setdefault((band, "linear in the keys"), []).append(at_prev * last / prev / truth - 1)
            grid = AttentionGrid([e for e in entries if e[:4] != (key, h, b, last)])
            got = grid.seconds(key, h, b, last, extrapolate=False)
            if got is not None:
                errors.setdefault((band, "same cached tokens"), []).append(got / truth - 1)
        for (band, method), e in sorted(errors.items()):
            a = np.abs(np.asarray(e))
            out.append([gpu, band, method, f"{len(e):,}", _pct(float(np.median(a))), _pct(float(np.percentile(a, 90))),
                        f"{100 * float(np.mean(e)):+.1f} %"])
    lines.append("8. Decode attention past the end of a grid line: each line's last measured key count held out")
    lines.append("")
    lines.extend(format_table(["GPU", "line's last point", "predicted from", "points", "median", "p90",
                               "mean signed"], out, indent="  "))
    lines.append("")
    lines.append("  same cached tokens: the lines of fewer and of more sequences that measured them, each at its own "
                 "keys (a point no such pair of lines brackets is not counted); own last slope: the line's "
                 "last two remaining points' slope of ln t over ln keys, between 0 and 1; signed > 0: predicted "
                 "slower than measured.")
    lines.append("")


def gemm_between(lines: list[str], data: str | None) -> None:
    from marssim.calibrate.aiconfigurator import DEFAULT_M, DEFAULT_WIDTHS, data_root, gemm_rows, table_path
    from marssim.cost.calibrated import load_table
    from marssim.cost.gemm_grid import GemmGrid
    from marssim.data import calibration
    from marssim.errors import InputError
    from marssim.system.describe import format_table

    try:
        root = data_root(data)
    except InputError:
        root = None
    lo, hi = min(DEFAULT_WIDTHS), max(DEFAULT_WIDTHS)
    out = []

    def stats(errors: list[float]) -> list[str]:
        e = np.abs(np.asarray(errors))
        return [f"{len(e):,}", _pct(float(np.median(e))), _pct(float(np.percentile(e, 90)))] if len(e) else ["0", "-", "-"]

    for gpu in GPUS:
        shipped = [r for r in load_table(calibration() / f"{gpu}-aiconfigurator.csv").rows if r.kind == "gemm"]
        every = []
        if root is not None:
            path = table_path(root, GPUS[gpu], "gemm", "trtllm", "1.3.0rc20", "gemm")
            every = gemm_rows(path, GPUS[gpu], "x", "x", "2026-01-01", m_values=None, widths=None)
        kept = set(DEFAULT_M), set(DEFAULT_WIDTHS)
        for dtype in sorted({r.dtype for r in shipped}):
            mine = [r for r in shipped if r.dtype == dtype]
            grid = GemmGrid((0, r.m, r.n, r.k, r.median_s) for r in mine)
            left = [r for r in every if r.dtype == dtype and not (r.m in kept[0] and r.n in kept[1] and r.k in kept[1])
                    and lo <= r.n <= hi and lo <= r.k <= hi and r.m <= max(kept[0])]
            errors = [grid.seconds(0, r.m, r.n, r.k) / r.median_s - 1 for r in left]
            errors = [e for e in errors if e == e]
            out.append([gpu, dtype, "token counts between the shipped ones", *stats(errors)])
            for axis in ("n", "k"):
                values = sorted({getattr(r, axis) for r in mine})
                errors = []
                for v in values[1:-1]:
                    rest = GemmGrid((0, r.m, r.n, r.k, r.median_s) for r in mine if getattr(r, axis) != v)
                    for r in mine:
                        if getattr(r, axis) == v:
                            t = rest.seconds(0, r.m, r.n, r.k)
                            if t is not None:
                                errors.append(t / r.median_s - 1)
                out.append([gpu, dtype, f"each interior {'width' if axis == 'n' else 'depth'} held out", *stats(errors)])
    lines.append("9. Linear layers' GEMMs between measured shapes: the grid asked for shapes it was not given")
    lines.append("")
    lines.extend(format_table(["GPU", "dtype", "shapes", "rows", "median", "p90"], out, indent="  "))
    lines.append("")
    lines.append("  Token counts between: the package's rows inside the shipped ranges that the subset left out (the "
                 "fitted curve with its local correction on the same rows: 2., \"inside\"). A held-out width or depth "
                 "is bridged across a gap twice as wide as the shipped grid's.")
    lines.append("")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", help="aiconfigurator-core's systems/data (default: the installed package)")
    args = parser.parse_args()
    t0, c0 = time.perf_counter(), time.process_time()
    lines = [f"aiconfigurator_holdout: the GPU cost model on AIConfigurator's measured kernels "
             f"({platform.processor() or platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()})",
             ""]
    shipped_holdout(lines)
    package_holdout(lines, args.data)
    attention_without_rows(lines)
    attention_holdout(lines)
    attention_package(lines, args.data)
    moe_holdout(lines)
    harness_against_aiconfigurator(lines)
    decode_line_ends(lines)
    gemm_between(lines, args.data)
    lines.append(f"wall {time.perf_counter() - t0:.1f} s, CPU {time.process_time() - c0:.1f} s")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
