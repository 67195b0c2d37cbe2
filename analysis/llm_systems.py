"""One Llama 3 70B training step at an equal GPU count on the GPU systems marssim ships:
H100, H200, B200 (DGX nodes of 8), GB200 NVL72 (racks of 72) and MI300X (nodes of 8 on
Infinity Fabric), in bf16 and in FP8 (Transformer Engine's recipe; MI300X: FP8 at its datasheet
peak too), one parallel configuration for all (tp 8, pp 2, dp 9, sequence parallelism, ZeRO-1,
full recomputation, global batch 72 of 4,096 tokens), simulated.

These are the model's predictions: the H100, H200 and B200 GEMMs from measured kernel tables (the
project's own H100 table and AIConfigurator's, by each system's software stack), every other
system's kernels by the analytical GPU roofline from datasheet figures (the last column counts the
GEMMs by the cost model that timed them); no constant is fitted to any published iteration time.

Usage: ``python analysis/llm_systems.py [--gpus 144]``. Prints a table; the committed output is
``analysis/results/llm_systems.txt``.
"""

from __future__ import annotations

import argparse
import platform
import time

SYSTEMS = {  # name -> spec for a GPU count (nodes of 8, racks of 72)
    "H100": lambda g: f"dgx-h100-cluster:nodes={g // 8}",
    "H200": lambda g: f"dgx-h200-cluster:nodes={g // 8}",
    "B200": lambda g: f"dgx-b200-cluster:nodes={g // 8}",
    "GB200 NVL72": lambda g: f"gb200-nvl72:racks={g // 72}",
    "MI300X": lambda g: f"mi300x-cluster:nodes={g // 8}",
}
WORKLOAD = "llama3-70b:mode=train,seq=4096"
CONFIG = "tp=8,pp=2,dp={dp},sp=true,zero=1,recompute=full,global_batch={batch}"


def run(system_spec: str, workload: str, config: str) -> dict:
    from collections import Counter

    from marssim.cost import default_cost_model
    from marssim.parallel import parse_parallel
    from marssim.plan import graph_for
    from marssim.plan import run as run_plan
    from marssim.system import load_system
    from marssim.workload import load_workload

    system = load_system(system_spec)
    cfg = parse_parallel(config)
    graph = graph_for(load_workload(workload), cfg)
    cost = default_cost_model()
    wall = time.perf_counter()
    done = run_plan(cfg, graph, system, cost, how="simulate", detail=False)
    tg, rep = done.taskgraph, done.report
    gemm_models = Counter(info.cost_model for info in tg.ops if info.kind == "gemm" and info.cost_model)
    return {"iteration_ms": rep.iteration_s * 1e3, "tflops": rep.tflops_per_gpu, "mfu": rep.mfu,
            "peak": rep.peak_flops, "memory_gib": max(rep.memory_peak.values()) / 2**30,
            "capacity_gib": rep.memory_capacity / 2**30, "exposed": rep.exposed_s,
            "models": ", ".join(f"{k} {v}" for k, v in sorted(gemm_models.items())),
            "wall_s": time.perf_counter() - wall}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--gpus", type=int, default=144, help="a multiple of 72 (default 144)")
    args = parser.parse_args()
    gpus = args.gpus
    dp = gpus // 16
    config = CONFIG.format(dp=dp, batch=8 * dp)
    print(f"Llama 3 70B training step ({WORKLOAD}) on {gpus} GPUs, {config}; simulated")
    print(f"machine: {platform.machine()}, Python {platform.python_version()}")
    print()
    header = (f"{'system':<12} {'dtype':<5} {'iteration ms':>12} {'TFLOP/s/GPU':>11} {'MFU':>6} {'(peak TF/s)':>11} "
              f"{'mem GiB':>8} {'of':>5} {'TP exp. ms':>10} {'DP exp. ms':>10}  GEMMs (ops) timed by")
    print(header)
    for name, spec_of in SYSTEMS.items():
        for dtype in ("bf16", "fp8"):
            spec = spec_of(gpus)
            r = run(spec, WORKLOAD + f",dtype={dtype}", config)
            e = r["exposed"]
            print(f"{name:<12} {dtype:<5} {r['iteration_ms']:>12.1f} {r['tflops']:>11.1f} {100 * r['mfu']:>5.1f}% "
                  f"{r['peak'] / 1e12:>11.1f} {r['memory_gib']:>8.1f} {r['capacity_gib']:>5.0f} "
                  f"{1e3 * e.get('tp', 0.0):>10.1f} {1e3 * e.get('dp', 0.0):>10.1f}  {r['models']}", flush=True)
    print()
    print("MFU is over each GPU's dense bf16 peak (the FP8 runs' too). Memory: the simulated peak of the "
          "busiest GPU and its capacity.")
    print("MI300X: a ring collective inside a node moves each step over one 64 GB/s Infinity Fabric link; RCCL "
          "runs several rings over different links at once (up to 7 x 64 GB/s per GPU), which the collective "
          "algorithms do not yet, so its tensor-parallel communication is overstated here.")


if __name__ == "__main__":
    main()
