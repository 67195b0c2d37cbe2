"""Benchmark: LLM training iterations lowered, simulated and estimated on GPU clusters.

1. GPT-3 175B on 1,024 H100 (``dgx-h100-cluster:nodes=128``; tp 8, pp 16, dp 8, 1F1B,
   micro-batch 1, global batch 1,536, sequence 2,048): wall time and peak memory (RSS) of
   lowering, simulation and the analytical estimate, each run in a fresh process on one core.
2. Scaling 16 -> 3,072 GPUs (GPT-3 13B, tp 8, pp 2, dp growing with the cluster, global batch
   8 * dp, the folded lowering that simulates one GPU per class of identical GPUs), and the
   unfolded lowering (every GPU) up to 512 GPUs: tasks, lowering and simulation time, and the
   exponents of time against tasks and against GPUs (least squares on log-log).

Usage: ``python analysis/bench_parallel.py [--quick]`` (quick: the scaling sweep to 256 GPUs,
no 175B case). Prints a table; the committed output is ``analysis/results/bench_parallel.txt``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import textwrap

import numpy as np

CASE_175B = ("dgx-h100-cluster:nodes=128", "gpt3-175b:mode=train,seq=2048,batch=1",
             "tp=8,pp=16,dp=8,schedule=1f1b,micro_batch=1,global_batch=1536")

_CHILD = textwrap.dedent("""
    import json, resource, sys, time
    from marssim.cost import default_cost_model
    from marssim.parallel import lower_parallel, parse_parallel
    from marssim.parallel import report_of
    from marssim.system import load_system
    from marssim.workload import load_workload

    system_spec, workload_spec, config, what, fold = sys.argv[1:6]
    system, graph = load_system(system_spec), load_workload(workload_spec)
    cost = default_cost_model()
    cfg = parse_parallel(config)
    out = {}
    design = system.designs[system.accelerators[0].designs[0]]
    cost.op_time(next(op for op in graph.ops if op.kind.value == "gemm"), design)  # the one-time table fit
    t = time.perf_counter()
    tg = lower_parallel(graph, system, cfg, cost, folding=fold == "fold")
    out["lower_s"] = time.perf_counter() - t
    out["tasks"] = int(tg.n_tasks)
    out["classes"] = int(tg.meta.get("fold_classes", 0))
    if what in ("sim", "both"):
        from marssim.sim import simulate

        t = time.perf_counter()
        result = simulate(tg, system, record=False, setup=False)
        out["sim_s"] = time.perf_counter() - t
        out["iteration_s"] = report_of(tg, system, result).iteration_s
    if what in ("estimate", "both"):
        from marssim.analytical import estimate

        t = time.perf_counter()
        est = estimate(tg, system)
        out["estimate_s"] = time.perf_counter() - t
        out["estimate_iteration_s"] = report_of(tg, system, est).iteration_s
    out["rss_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(json.dumps(out))
""")


def child(system: str, workload: str, config: str, what: str, fold: bool = True) -> dict:
    """One measurement in a fresh single-threaded process (so its peak RSS is its own). The
    cost model's one-time calibration fit (a few seconds per process) is paid before the timer
    starts."""
    env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", MKL_NUM_THREADS="1")
    cmd = [sys.executable, "-c", _CHILD, system, workload, config, what, "fold" if fold else "full"]
    if sys.platform.startswith("linux"):
        cmd = ["taskset", "-c", "0", *cmd]
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def slope(x, y) -> float:
    return float(np.polyfit(np.log(x), np.log(y), 1)[0])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    print(f"machine: {platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}; "
          f"every case in a fresh process pinned to one core")
    if not args.quick:
        print("\nGPT-3 175B, 1,024 H100, " + CASE_175B[2])
        sim = child(*CASE_175B, "sim")
        est = child(*CASE_175B, "estimate")
        print(f"{'tasks':>12}{'classes':>9}{'lower s':>9}{'simulate s':>12}{'RSS MiB':>9}{'estimate s':>12}"
              f"{'RSS MiB':>9}{'sim ms':>10}{'estimate ms':>13}")
        print(f"{sim['tasks']:>12,}{sim['classes']:>9}{sim['lower_s']:>9.2f}{sim['sim_s']:>12.2f}"
              f"{sim['rss_mib']:>9.0f}{est['lower_s'] + est['estimate_s']:>12.2f}{est['rss_mib']:>9.0f}"
              f"{sim['iteration_s'] * 1e3:>10.1f}{est['estimate_iteration_s'] * 1e3:>13.1f}")
        print("simulate s: lowering + simulation; estimate s: lowering + estimate. Targets: <= 60 s and <= 4 GiB "
              "simulated, <= 5 s estimated.")

    print("\nScaling: GPT-3 13B training, tp 8, pp 2, dp = GPUs / 16, global batch 8 * dp, 1F1B")
    sizes = [16, 64, 256] if args.quick else [16, 64, 256, 1024, 3072]
    full_sizes = [16, 64] if args.quick else [16, 64, 256, 512]
    rows = []
    print(f"{'GPUs':>6}{'lowering':>10}{'tasks':>11}{'classes':>9}{'lower s':>9}{'sim s':>8}{'RSS MiB':>9}"
          f"{'iteration ms':>14}")
    for folded, grid in ((True, sizes), (False, full_sizes)):
        for gpus in grid:
            dp = gpus // 16
            cfg = f"tp=8,pp=2,dp={dp},micro_batch=1,global_batch={8 * dp}"
            r = child(f"dgx-h100-cluster:nodes={gpus // 8}", "gpt3-13b:mode=train,seq=2048,batch=1", cfg, "sim",
                      folded)
            rows.append((folded, gpus, r))
            print(f"{gpus:>6}{'folded' if folded else 'every GPU':>10}{r['tasks']:>11,}{r['classes']:>9}"
                  f"{r['lower_s']:>9.2f}{r['sim_s']:>8.2f}{r['rss_mib']:>9.0f}{r['iteration_s'] * 1e3:>14.2f}")
    for folded in (True, False):
        sel = [(g, r) for f, g, r in rows if f == folded]
        g = [x for x, _ in sel]
        tasks = [r["tasks"] for _, r in sel]
        lower = [r["lower_s"] for _, r in sel]
        sim = [r["sim_s"] for _, r in sel]
        name = "folded" if folded else "every GPU"
        print(f"{name}: lowering time ~ tasks^{slope(tasks, lower):.2f}, ~ GPUs^{slope(g, lower):.2f}; "
              f"simulation time ~ tasks^{slope(tasks, sim):.2f}, ~ GPUs^{slope(g, sim):.2f}; "
              f"tasks ~ GPUs^{slope(g, tasks):.2f}")
    same = {g: r["iteration_s"] for f, g, r in rows if f}
    diffs = [abs(r["iteration_s"] / same[g] - 1) for f, g, r in rows if not f and g in same]
    print(f"folded vs every GPU: largest relative iteration-time difference {max(diffs):.2e}")


if __name__ == "__main__":
    main()
