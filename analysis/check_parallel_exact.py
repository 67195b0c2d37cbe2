"""Check: the figures of parallel configurations, bit for bit, against a saved reference.

For a set of small and medium parallel configurations (every schedule, sequence parallelism,
ZeRO 1 and 3, experts, recomputation, uneven stages on a mixed cluster, serving, partly filled
scalable units, an oversubscribed fabric, folded and unfolded), it lowers each one and records

* the simulation: iteration time (makespan), each simulated GPU's memory peak and last kernel end;
* the analytical estimate (of the lowering ``marssim estimate`` makes: ``coupled_rings``): makespan
  and lower bound;
* the closed-form screen: iteration time (training) or time to first token and per output token
  (serving);

each as the exact float (``float.hex``), and a SHA-256 over all of them. ``--save`` writes the
reference (``analysis/results/parallel_exact.json``); without it the script compares with a
reference (that one, or ``--reference PATH``: ``analysis/results/parallel_exact_before.json`` holds
the values of the code before the changes to the simulator's speed and memory) and prints every
value that differs, with its relative difference.

Usage: ``python analysis/check_parallel_exact.py [--save] [--only NAME] [--reference PATH]``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import pathlib
import sys
import time

HERE = pathlib.Path(__file__).resolve().parent
REFERENCE = HERE / "results" / "parallel_exact.json"

GPT_TINY = "gpt:layers=4,hidden=512,heads=8,vocab=1000,seq=128,mode=train,max_positions=128"
LLAMA_TINY = "llama:layers=4,hidden=512,heads=8,kv_heads=4,ffn=1024,vocab=1000,seq=128,mode=train"
MOE_TINY = "moe:layers=2,hidden=256,heads=4,kv_heads=2,ffn=512,vocab=500,seq=64,experts=4,top_k=2,mode=train"


def small_cluster(nodes: int, per_leaf: int, gpus: int, oversubscription: float = 1.0) -> dict:
    """A small cluster description (the tests' shape): ``nodes`` nodes of ``gpus`` GPUs, ``per_leaf``
    nodes per scalable unit."""
    return {
        "name": "check-cluster",
        "designs": {"g": {"dataflow": "gpu", "clock": "1 GHz", "sram": "40 MiB", "sram_bandwidth": "5 TB/s",
                          "gpu": {"sms": 100, "peak_flops": {"bf16": "300 TFLOP/s", "fp32": "20 TFLOP/s"}}}},
        "cluster": {"node_groups": [{"nodes": nodes, "gpus_per_node": gpus, "design": "g",
                                     "memory": {"capacity": "80 GiB", "bandwidth": "2 TB/s"},
                                     "nvlink": {"bandwidth": "300 GB/s", "latency": "150 ns"},
                                     "nvswitch_latency": "170 ns",
                                     "nic": {"bandwidth": "25 GB/s", "latency": "1.2 us"},
                                     "pcie": {"bandwidth": "32 GB/s", "latency": "500 ns"},
                                     "host_dram": {"capacity": "1 TiB", "bandwidth": "400 GB/s"},
                                     "nodes_per_leaf": per_leaf}],
                    "fabric": {"leaf_latency": "130 ns", "spine_latency": "130 ns", "uplink_latency": "100 ns",
                               "oversubscription": oversubscription}},
    }


# name, system (spec string or small_cluster arguments), workload, configuration, folded lowering
CASES = [
    ("1f1b-node", "dgx-a100-cluster:nodes=1", GPT_TINY, "tp=2,pp=2,dp=2,global_batch=8", True),
    ("gpipe-node", "dgx-a100-cluster:nodes=1", GPT_TINY, "tp=2,pp=2,dp=2,schedule=gpipe,global_batch=8", True),
    ("interleaved-sp-zero1", dict(nodes=4, per_leaf=2, gpus=4), LLAMA_TINY,
     "tp=2,pp=2,dp=4,sp=true,schedule=interleaved,virtual_stages=2,global_batch=8,zero=1", True),
    ("interleaved-sp-zero1-full", dict(nodes=4, per_leaf=2, gpus=4), LLAMA_TINY,
     "tp=2,pp=2,dp=4,sp=true,schedule=interleaved,virtual_stages=2,global_batch=8,zero=1", False),
    ("oversubscribed", dict(nodes=4, per_leaf=1, gpus=4, oversubscription=4.0), GPT_TINY,
     "tp=4,pp=2,dp=2,global_batch=8", True),
    ("oversubscribed-full", dict(nodes=4, per_leaf=1, gpus=4, oversubscription=4.0), GPT_TINY,
     "tp=4,pp=2,dp=2,global_batch=8", False),
    ("asymmetric-ring", dict(nodes=6, per_leaf=4, gpus=4), GPT_TINY, "tp=4,pp=2,dp=3,global_batch=6", True),
    ("asymmetric-ring-full", dict(nodes=6, per_leaf=4, gpus=4), GPT_TINY, "tp=4,pp=2,dp=3,global_batch=6", False),
    ("partial-unit-recompute-full", "dgx-a100-cluster:nodes=24", GPT_TINY,
     "tp=8,pp=2,dp=12,global_batch=48,recompute=full", True),
    ("partial-unit-selective-mb2", "dgx-a100-cluster:nodes=22",
     "gpt:layers=8,hidden=512,heads=8,vocab=1000,seq=128,mode=train,max_positions=128,batch=2",
     "tp=4,pp=4,dp=11,micro_batch=2,global_batch=176,recompute=selective,schedule=interleaved,virtual_stages=2",
     True),
    ("zero3", dict(nodes=2, per_leaf=2, gpus=4), GPT_TINY, "tp=2,pp=1,dp=4,zero=3,global_batch=8", True),
    ("zero3-full", dict(nodes=2, per_leaf=2, gpus=4), GPT_TINY, "tp=2,pp=1,dp=4,zero=3,global_batch=8", False),
    ("moe", dict(nodes=2, per_leaf=2, gpus=4), MOE_TINY, "tp=2,pp=1,dp=4,ep=2,sp=true,global_batch=8", True),
    ("moe-full", dict(nodes=2, per_leaf=2, gpus=4), MOE_TINY, "tp=2,pp=1,dp=4,ep=2,sp=true,global_batch=8", False),
    ("mixed-uneven", "mixed-a100-h100-cluster:nodes_a100=2,nodes_h100=2",
     "llama:layers=4,hidden=512,heads=8,kv_heads=4,ffn=1024,vocab=1024,seq=128,mode=train",
     "tp=8,pp=2,dp=2,sp=true,stage_start=16/0,layers_per_stage=1/3,global_batch=4", True),
    ("mixed-degrees", "mixed-a100-h100-cluster:nodes_a100=1,nodes_h100=2",
     "llama:layers=4,hidden=512,heads=8,kv_heads=4,ffn=1024,vocab=1024,seq=128,mode=train",
     "tp=4,pp=2,dp=2,sp=true,stage_tp=4/8,stage_start=0/8,layers_per_stage=1/3,global_batch=4", True),
    ("serve", "dgx-h100-cluster:nodes=1",
     "llama:layers=4,hidden=512,heads=8,kv_heads=4,ffn=1024,vocab=1000,mode=serve,prompt=64,generate=4,batch=2",
     "tp=4,dp=2,micro_batch=2,global_batch=4", True),
    ("gpt3-13b-64", "dgx-h100-cluster:nodes=8", "gpt3-13b:mode=train,seq=2048,batch=1",
     "tp=8,pp=2,dp=4,micro_batch=1,global_batch=32", True),
    ("gpt3-13b-64-full", "dgx-h100-cluster:nodes=8", "gpt3-13b:mode=train,seq=2048,batch=1",
     "tp=8,pp=2,dp=4,micro_batch=1,global_batch=32", False),
]


def run_case(system_spec, workload: str, config: str, folded: bool) -> dict[str, str]:
    from marssim.analytical import estimate
    from marssim.cost import default_cost_model
    from marssim.parallel import lower_parallel, parse_parallel, prepare_graph
    from marssim.parallel.analytic import screen, serving_times
    from marssim.sim import simulate
    from marssim.system import load_system, system_from_dict
    from marssim.taskgraph import COMPUTE
    from marssim.workload import load_workload
    from marssim.workload.llm import transformer_of

    system = load_system(system_spec) if isinstance(system_spec, str) else system_from_dict(small_cluster(**system_spec))
    graph = load_workload(workload)
    cfg = parse_parallel(config)
    cost = default_cost_model()
    tg = lower_parallel(graph, system, cfg, cost, folding=folded)
    out: dict[str, str] = {}
    # the estimate as `marssim estimate` lowers it: rings over several classes one task per class
    # with coupled steps (the same floats as one task per step)
    est = estimate(lower_parallel(graph, system, cfg, cost, folding=folded, coupled_rings=True), system)
    result = simulate(tg, system, memory_policy="ignore", setup=False)
    out["simulate.makespan"] = result.makespan.hex()
    reps = sorted(set(tg.meta["fold"].values()))
    peaks = result.memories["peak_bytes"]
    iv = result.intervals
    last = iv[iv["kind"] == "compute"].groupby("resource")["end"].max()
    for gpu in reps:
        out[f"simulate.peak.{gpu}"] = float(peaks[gpu]).hex()
        out[f"simulate.last_kernel.{gpu}"] = float(last[gpu]).hex()
    out["estimate.makespan"] = est.makespan.hex()
    out["estimate.lower_bound"] = float(est.lower_bound).hex()
    t = transformer_of(prepare_graph(graph, cfg))
    if t.training:
        out["screen.iteration"] = float(screen(graph, system, cfg, cost).iteration_s).hex()
    else:
        ttft, tpot = serving_times(graph, system, cfg, cost)
        out["serving.ttft"] = float(ttft).hex()
        out["serving.tpot"] = float(tpot).hex()
    del COMPUTE
    return out


def digest(values: dict[str, dict[str, str]]) -> str:
    h = hashlib.sha256()
    for case in sorted(values):
        for key in sorted(values[case]):
            h.update(f"{case} {key} {values[case][key]}\n".encode())
    return h.hexdigest()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--save", action="store_true", help="write the reference instead of comparing with it")
    ap.add_argument("--only", default="", help="run only the cases whose name contains this")
    ap.add_argument("--reference", default=str(REFERENCE), help="the reference to compare with")
    args = ap.parse_args()
    ref_path = pathlib.Path(args.reference)
    reference = json.loads(ref_path.read_text()) if ref_path.exists() and not args.save else None
    values: dict[str, dict[str, str]] = {}
    differ = 0
    for name, system_spec, workload, config, folded in CASES:
        if args.only and args.only not in name:
            continue
        wall = time.perf_counter()
        values[name] = run_case(system_spec, workload, config, folded)
        line = f"{name:<30}{len(values[name]):>4} values {time.perf_counter() - wall:>7.1f} s"
        if reference is not None:
            ref = reference["values"].get(name, {})
            bad = [(k, v, ref.get(k)) for k, v in values[name].items() if ref.get(k) != v]
            bad += [(k, None, v) for k, v in ref.items() if k not in values[name]]
            differ += len(bad)
            line += "  identical" if not bad else f"  {len(bad)} differ"
            for key, now, before in bad:
                if now is not None and before is not None:
                    a, b = float.fromhex(now), float.fromhex(before)
                    rel = abs(a - b) / abs(b) if b else float("inf")
                    line += f"\n    {key}: {b!r} -> {a!r} (relative {rel:.2e})"
                else:
                    line += f"\n    {key}: {before} -> {now}"
        print(line, flush=True)
    print(f"sha256 {digest(values)}")
    if args.save:
        REFERENCE.write_text(json.dumps({"sha256": digest(values), "values": values}, indent=1, sort_keys=True) + "\n")
        print(f"saved {REFERENCE}")
        return 0
    if reference is not None and not args.only:
        print("reference sha256 " + reference["sha256"])
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
