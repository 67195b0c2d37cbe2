"""Benchmark of the cost models: (op, design) evaluations per second, scalar vs vectorised,
the effect of memoisation, and the calibrated model's held-out error on the synthetic table.

Run from the repository root (the latest output is committed in analysis/results/bench_cost.txt):

    PYTHONPATH=$PWD python analysis/bench_cost.py

Designs: every design of the shipped systems (12). Ops: distinct shapes made by shrinking the
loops of a conv, a depthwise conv, a gemm, an attention matmul and an element-wise op at random.
Times are the best of three runs; compare ratios within one run, not absolute numbers.
"""

from __future__ import annotations

import dataclasses
import os
import platform
import time
from pathlib import Path

import numpy as np

from marssim.cost import DataflowCost, fit, holdout_errors, load_table
from marssim.system import load_system
from marssim.workload import GraphBuilder

SYSTEMS = ("mars-adaptive-16", "herald-soc", "dgx-h100", "ring-8", "chiplet-mesh-4x4")
TABLE = Path(__file__).resolve().parents[1] / "tests" / "data" / "calibration" / "synthetic-h100.csv"
N_SHAPES = 100_000
N_PAIRS = 1_000_000
N_SCALAR = 20_000


def designs():
    out = []
    for name in SYSTEMS:
        system = load_system(name)
        for d in system.designs:
            host = next(a.id for a in system.accelerators if d in a.designs)
            out.append(system.design(host, d))
    return out


def distinct_ops(count: int, seed: int = 0):
    b = GraphBuilder("bench", batch=64)
    x = b.input("x", c=512, h=64, w=64)
    b.conv("conv", x, 512, 3)
    b.conv("dw", x, 512, 3, groups=512)
    b.eltwise("relu", x, fn="relu")
    t = b.input("t", c=4096, h=2048)
    b.linear("fc", t, 4096)
    q = b.input("q", c=16 * 128, h=2048)
    b.matmul("qk", q, q, heads=16)
    g = b.build()
    bases = [g.op(n) for n in ("conv", "dw", "fc", "qk", "relu")]
    shrink = {"conv": "NKCP", "dw": "NKP", "fc": "BMNK", "qk": "BHMNK", "relu": "NCHW"}
    rng = np.random.default_rng(seed)
    seen, ops = set(), []
    while len(ops) < count:
        base = bases[len(ops) % len(bases)]
        dims = {d: int(rng.integers(1, base.dim(d) + 1)) for d in shrink[base.name]}
        key = (base.name, tuple(sorted(dims.items())))
        if key not in seen:
            seen.add(key)
            ops.append(base.with_loops(**dims))
    return ops


def best_of(fn, repeats: int = 3) -> float:
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def main() -> None:
    import pandas  # noqa: F401  (imported by the vectorised path; keep its import out of the timings)

    machine = f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}"
    ds = designs()
    t0 = time.perf_counter()
    ops = distinct_ops(N_SHAPES)
    make_s = time.perf_counter() - t0
    rng = np.random.default_rng(1)
    rows: list[tuple[str, float, str]] = []

    # ---------------------------------------------------------------- scalar path
    # 4,000 ops x 12 designs: the objects fit the model's identity cache (16,384 entries)
    pairs = [(ops[i], ds[j]) for i, j in zip(rng.integers(0, 4000, N_SCALAR), rng.integers(0, len(ds), N_SCALAR))]

    def scalar_cold():
        m = DataflowCost()
        for o, d in pairs:
            m.op_cost(o, d)

    warm = DataflowCost()
    for o, d in pairs:
        warm.op_cost(o, d)

    def scalar_hit():
        for o, d in pairs:
            warm.op_cost(o, d)

    copies = [(dataclasses.replace(o), d) for o, d in pairs]  # equal values, new objects

    def scalar_hit_equal_objects():
        for o, d in copies:
            warm.op_cost(o, d)

    t_cold = best_of(scalar_cold)
    t_hit = best_of(scalar_hit)
    t_hit_eq = best_of(scalar_hit_equal_objects)
    rows.append(("scalar op_cost, cold (features + formulas + memo store)", N_SCALAR / t_cold, "fresh model"))
    rows.append(("scalar op_cost, memo hit, same objects", N_SCALAR / t_hit, "identity cache"))
    rows.append(("scalar op_cost, memo hit, equal new objects", N_SCALAR / t_hit_eq, "by value, as in a new lowering"))

    # ---------------------------------------------------------------- vectorised path, distinct pairs
    combos = rng.permutation(N_SHAPES * len(ds))[:N_PAIRS]
    p_ops = [ops[i] for i in (combos // len(ds)).tolist()]
    p_des = [ds[j] for j in (combos % len(ds)).tolist()]
    cold_model = [None]

    def vector_cold():
        cold_model[0] = DataflowCost()
        cold_model[0].op_times(p_ops, p_des)

    t_vcold = best_of(vector_cold)
    vm = cold_model[0]
    t_vwarm = best_of(lambda: vm.op_times(p_ops, p_des))
    sid, did = vm.shape_ids(p_ops), vm.design_ids(p_des)
    t_arr = best_of(lambda: vm.times(sid, did))
    rows.append((f"op_times, {N_PAIRS:,} distinct pairs, cold ({N_SHAPES:,} shapes to extract)", N_PAIRS / t_vcold,
                 "includes feature extraction"))
    rows.append((f"op_times, {N_PAIRS:,} distinct pairs, shapes interned", N_PAIRS / t_vwarm, "objects -> ids each call"))
    rows.append((f"times(shape_ids, design_ids), {N_PAIRS:,} distinct pairs", N_PAIRS / t_arr, "array-only core"))

    # ---------------------------------------------------------------- vectorised path, repeated shapes
    few = ops[:2000]
    r_ops = [few[i] for i in rng.integers(0, len(few), N_PAIRS).tolist()]
    r_des = [ds[j] for j in rng.integers(0, len(ds), N_PAIRS).tolist()]
    vm.op_times(r_ops, r_des)
    t_rep = best_of(lambda: vm.op_times(r_ops, r_des))
    rsid, rdid = vm.shape_ids(r_ops), vm.design_ids(r_des)
    t_rep_arr = best_of(lambda: vm.times(rsid, rdid))
    rows.append((f"op_times, {N_PAIRS:,} pairs over 2,000 shapes x {len(ds)} designs", N_PAIRS / t_rep,
                 "each distinct pair once"))
    rows.append((f"times(), {N_PAIRS:,} pairs over 2,000 shapes x {len(ds)} designs", N_PAIRS / t_rep_arr,
                 "each distinct pair once"))

    # exactness spot check: vectorised == scalar on a sample
    sample = rng.integers(0, N_PAIRS, 2000)
    check = DataflowCost()
    exact = all(check.op_time(p_ops[i], p_des[i]) == v for i, v in zip(sample.tolist(), vm.times(sid[sample], did[sample])))

    # ---------------------------------------------------------------- calibrated model
    table = load_table(TABLE)
    t0 = time.perf_counter()
    fits = fit(table)
    fit_s = time.perf_counter() - t0
    held = holdout_errors(table, every=4)

    load = os.getloadavg()
    lines = [f"bench_cost: marssim cost-model throughput ({machine})",
             f"load average during the run (1, 5, 15 min): {load[0]:.2f}, {load[1]:.2f}, {load[2]:.2f} "
             f"(the machine is shared; throughput falls when it is loaded)", ""]
    lines.append(f"{len(ds)} designs from {', '.join(SYSTEMS)}; {N_SHAPES:,} distinct op shapes (made in {make_s:.1f} s)")
    lines.append("")
    width = max(len(r[0]) for r in rows)
    lines.append(f"{'evaluation':<{width}}  {'evals/s':>12}  note")
    for name, rate, note in rows:
        lines.append(f"{name:<{width}}  {rate:>12,.0f}  {note}")
    lines.append("")
    lines.append(f"vectorised (times, distinct pairs) / scalar cold: {N_PAIRS / t_arr / (N_SCALAR / t_cold):,.0f}x; "
                 f"scalar memo hit / cold: {(N_SCALAR / t_hit) / (N_SCALAR / t_cold):.1f}x; "
                 f"repeated / distinct shapes (op_times): {t_vwarm / t_rep:.1f}x")
    lines.append(f"vectorised equals scalar bit for bit on a 2,000-pair sample: {exact}")
    lines.append("")
    lines.append(f"calibrated model on the SYNTHETIC table {TABLE.name} ({len(table)} rows; fit of "
                 f"{len(fits)} groups in {fit_s:.2f} s)")
    lines.append(f"{'device/kind/dtype':<34} {'fit pts':>7} {'fit max err':>11} {'held out':>8} "
                 f"{'median err':>10} {'max err':>8}")
    for h in held:
        f = fits[h.key]
        lines.append(f"{'/'.join(h.key[:3]):<34} {f.n_points:>7} {100 * f.max_rel_error:>10.2f}% {h.n_held:>8} "
                     f"{100 * h.median_rel_error:>9.2f}% {100 * h.max_rel_error:>7.2f}%")
    lines.append("(held out: every 4th row of each group, fitted on the other rows; the synthetic table is the curve "
                 "itself plus 0.5% noise, so this checks the fit, not the curve against real GPUs)")
    lines += h100_correction_cost()
    print("\n".join(lines))


H100_TABLE = Path(__file__).resolve().parents[1] / "traces" / "calibration" / "H100.csv"
N_GPU_SHAPES = 20_000


def h100_correction_cost() -> list[str]:
    """Cost of the residual correction on the measured H100 table: cold evaluations of distinct
    GPU shapes (none measured) on dgx-h100's GPU, correction on vs off, scalar and vectorised,
    and the fit (curve + leave-one-out choice of the correction) of the whole table."""
    from marssim.cost import CalibratedCost, fit as fit_table

    if not H100_TABLE.is_file():
        return []
    table = load_table(H100_TABLE)
    t0 = time.perf_counter()
    fit_table(table, correct=False)
    curve_fit_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    fit_table(table)
    full_fit_s = time.perf_counter() - t0
    design = load_system("dgx-h100").design("gpu0", "h100")
    ops = [op for op in distinct_ops(N_GPU_SHAPES, seed=1) if op.dtype in ("bf16", "fp16", "fp32")]
    out = ["", f"calibrated model on the MEASURED table {H100_TABLE.name} ({len(table)} rows), dgx-h100 GPU, "
               f"{len(ops):,} distinct shapes, cold (fresh model, fits done before timing)"]
    out.append(f"{'evaluation':<44} {'correction off':>15} {'on':>12}  time on / off")
    results = {}
    for correction in (False, True):
        def scalar():
            m = CalibratedCost(table, correction=correction)
            m.fits_for("h100")
            m._did(design)
            t = time.perf_counter()
            for op in ops:
                m.op_cost(op, design)
            return time.perf_counter() - t

        def vector():
            m = CalibratedCost(table, correction=correction)
            m.fits_for("h100")
            m._did(design)
            t = time.perf_counter()
            m.op_times(ops, [design] * len(ops))
            return time.perf_counter() - t

        results[correction] = (min(scalar() for _ in range(2)), min(vector() for _ in range(2)))
    for i, name in enumerate(("scalar op_cost evals/s", "op_times evals/s (distinct shapes)")):
        off, on = len(ops) / results[False][i], len(ops) / results[True][i]
        out.append(f"{name:<44} {off:>15,.0f} {on:>12,.0f}  {off / on:.1f}x")
    out.append(f"{'fit of the whole table, s':<44} {curve_fit_s:>15.2f} {full_fit_s:>12.2f}  "
               f"{full_fit_s / curve_fit_s:.1f}x")
    out.append("(memo hits and repeated shapes cost the same with or without the correction: it is computed once "
               "per distinct shape and design)")
    return out


if __name__ == "__main__":
    main()
