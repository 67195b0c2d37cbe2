"""Benchmark: request-level serving simulation (``marssim serve``).

1. 10,000 requests of the Azure conversation trace (prompt and output lengths of its rows, Poisson
   arrivals at 32 and 96 requests/s, the second near the deployment's capacity) on 16 replicas of
   Llama-3 70B, tp 4, on 8 DGX H100 nodes (64 GPUs): vLLM's continuous batching and chunked
   prefill, exact decode contexts and 16-token buckets. Wall time, CPU time
   (user + sys), peak RSS, engine iterations, and the run's latencies. Each case runs in a fresh
   process (its peak RSS is its own); the cost model's one-time fit of the H100 calibration table
   is timed apart (every process pays it once, a sweep worker too).
2. A 10-point rate sweep of case 1 (continuous batching, 10 to 100 requests/s) on 2 worker processes.
3. The ``mode=serve`` shape as requests: 240 equal requests (prompt 128, 2,048 decode steps)
   statically batched on one DGX A100, Llama-3-70B-class at tp 4 (A100 has no calibration table
   here: the analytical roofline times it): wall time, and the time to first token and per
   output token against :func:`marssim.parallel.analytic.serving_times` of the equivalent
   ``mode=serve`` graph at a short generation (its TPOT is the mean of per-step times whose
   contexts grow; here compared over the first 8 steps).

Usage: ``python analysis/bench_serve.py [--quick]`` (quick: 2,000 requests, 4-point sweep).
Prints a table; the committed output is ``analysis/results/bench_serve.txt``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import time

SYSTEM = "dgx-h100-cluster:nodes=8"
MODEL = "llama3-70b"
TRACE = "azure-conv-2023"


def _deployment(kind: str, bucket: int):
    from marssim.serve import Deployment, Pool, SchedulerConfig

    return Deployment((Pool(replicas=16, tp=4, scheduler=SchedulerConfig(kind=kind)),), context_bucket=bucket)


def _spec(n: int, rate: float):
    from marssim.serve import Arrivals, Lengths, RequestSpec

    return RequestSpec(Arrivals("poisson", rate=rate), Lengths("trace", trace=TRACE), Lengths("trace", trace=TRACE), n)


def case_run(kind: str, bucket: int, n: int, rate: float) -> dict:
    from marssim.cost import default_cost_model
    from marssim.serve import load_model, simulate_serving
    from marssim.system import load_system

    t0, c0 = time.perf_counter(), _cpu()
    cost = default_cost_model()
    system = load_system(SYSTEM)
    model = load_model(MODEL)
    design = system.design("gpu0", system.accelerator("gpu0").designs[0])
    from marssim.serve.itermodel import IterationModel

    IterationModel(model, system, (("gpu0",),), cost).stage_times((1, 1), (0, 0), (), 1, 1, 1)  # the fit
    del design
    fit_wall, fit_cpu = time.perf_counter() - t0, _cpu() - c0
    requests = _spec(n, rate).draw(0)
    t1, c1 = time.perf_counter(), _cpu()
    r = simulate_serving(_deployment(kind, bucket), model, system, cost, requests)
    s = r.summary
    return {"fit_wall": fit_wall, "fit_cpu": fit_cpu, "wall": time.perf_counter() - t1, "cpu": _cpu() - c1,
            "rss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, "iterations": s["iterations"],
            "ttft_p50": s["ttft_s"]["p50"], "ttft_p99": s["ttft_s"]["p99"], "tpot_p50": s["tpot_s"]["p50"],
            "tpot_p99": s["tpot_s"]["p99"], "e2e_p99": s["e2e_s"]["p99"], "tok_s": s["output_tokens_per_s"],
            "batch": s["batch_size"]["mean"], "preemptions": s["preemptions"]}


def case_sweep(n: int, rates: list[float], workers: int) -> dict:
    from concurrent.futures import ProcessPoolExecutor

    from marssim.cost import default_cost_model
    from marssim.serve import load_model, rate_sweep
    from marssim.serve.itermodel import IterationModel
    from marssim.system import load_system

    t0, c0 = time.perf_counter(), _cpu()
    cost = default_cost_model()
    system = load_system(SYSTEM)
    model = load_model(MODEL)
    IterationModel(model, system, (("gpu0",),), cost).stage_times((1, 1), (0, 0), (), 1, 1, 1)  # fit once, pickled fitted
    with ProcessPoolExecutor(workers) as pool:
        rows = rate_sweep(_deployment("continuous", 1), model, system, cost, _spec(n, 1.0), rates, executor=pool)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return {"wall": time.perf_counter() - t0, "cpu": _cpu() - c0 + children.ru_utime + children.ru_stime,
            "rss": max(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, children.ru_maxrss) / 1024,
            "rows": [(r["rate"], r["summary"]["output_tokens_per_s"], r["summary"]["ttft_s"]["p99"],
                      r["summary"]["tpot_s"]["p50"], r["summary"]["tpot_s"]["p99"], r["summary"]["preemptions"])
                     for r in rows]}


def case_static() -> dict:
    from marssim.cost import default_cost_model
    from marssim.parallel import parse_parallel
    from marssim.parallel.analytic import serving_times
    from marssim.serve import Deployment, Pool, Requests, SchedulerConfig, load_model, simulate_serving
    from marssim.system import load_system
    from marssim.workload import load_workload

    spec = "llama:layers=80,hidden=8192,heads=64,kv_heads=8,ffn=28672,vocab=32000"
    system = load_system("dgx-a100-cluster:nodes=1")
    cost = default_cost_model(allow_uncalibrated=True)
    b, prompt, steps = 240, 128, 2048
    t0, c0 = time.perf_counter(), _cpu()
    # vLLM-style paging: every prompt admitted at once (one prefill iteration of 240 x 128 tokens)
    cfg = SchedulerConfig(kind="continuous", max_num_seqs=256, max_batched_tokens=b * prompt)
    dep = Deployment((Pool(replicas=1, tp=4, scheduler=cfg),))
    r = simulate_serving(dep, load_model(spec), system, cost, Requests.of([0.0] * b, [prompt] * b, [steps + 1] * b))
    wall, cpu = time.perf_counter() - t0, _cpu() - c0
    pr = r.per_request
    it = r.iterations
    short = 8
    graph = load_workload(f"{spec},mode=serve,prompt={prompt},generate={short},batch={b}")
    ttft, tpot = serving_times(graph, system, parse_parallel(f"tp=4,micro_batch={b}"), cost)
    first = float(it["end"][short] - it["start"][0])  # the prefill and the first 8 decode iterations
    return {"wall": wall, "cpu": cpu, "rss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
            "ttft": float(pr["first_token_s"].max()), "ttft_closed": ttft, "e2e": float(pr["finish_s"].max()),
            "first": first, "first_closed": ttft + short * tpot,
            "preemptions": r.summary["preemptions"], "blocks": r.replicas[0].memory.blocks,
            "iterations": r.summary["iterations"], "kv_gib": max(r.replicas[0].memory.kv_bytes) / 2**30,
            "weights_gib": max(r.replicas[0].memory.weights) / 2**30,
            "need_gib": b * (prompt + steps + 1) * r.replicas[0].memory.kv_bytes_per_token[0] / 2**30}


def _cpu() -> float:
    u = resource.getrusage(resource.RUSAGE_SELF)
    return u.ru_utime + u.ru_stime


def _child(*args) -> dict:
    out = subprocess.run([sys.executable, __file__, "--case", json.dumps(list(args))], capture_output=True, text=True,
                         check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--case", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.case:
        name, *rest = json.loads(args.case)
        print(json.dumps({"run": case_run, "sweep": case_sweep, "static": case_static}[name](*rest)))
        return
    n = 2000 if args.quick else 10000
    rate = 32.0
    print(f"machine: {platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}")
    print(f"\n1. {n:,} requests ({TRACE} lengths, Poisson arrivals) on 16 x {MODEL} tp 4, {SYSTEM} (64 GPUs)")
    print(f"{'scheduler':<12}{'rate':>7}{'bucket':>7}{'fit s':>7}{'wall s':>8}{'cpu s':>7}{'RSS MiB':>9}{'iters':>9}"
          f"{'TTFT P50':>9}{'P99':>7}{'TPOT P50':>9}{'P99':>7}{'E2E P99':>9}{'tok/s':>8}{'batch':>7}  (ms)")
    for kind, bucket, at in (("continuous", 1, rate), ("continuous", 16, rate), ("chunked", 1, rate),
                             ("continuous", 1, 3 * rate), ("chunked", 1, 3 * rate)):
        r = _child("run", kind, bucket, n, at)
        print(f"{kind:<12}{at:>5.0f}/s{bucket:>7}{r['fit_wall']:>7.1f}{r['wall']:>8.1f}{r['cpu']:>7.1f}{r['rss']:>9.0f}"
              f"{r['iterations']:>9,}{r['ttft_p50'] * 1e3:>9.1f}{r['ttft_p99'] * 1e3:>7.0f}{r['tpot_p50'] * 1e3:>9.1f}"
              f"{r['tpot_p99'] * 1e3:>7.1f}{r['e2e_p99'] * 1e3:>9.0f}{r['tok_s']:>8.0f}{r['batch']:>7.1f}")
    print("fit s: the cost model's one-time fit of the H100 table in this process; wall s, cpu s (user + sys): "
          "the simulation; RSS: the process's peak (fit included)")
    rates = [10.0, 40.0, 70.0, 100.0] if args.quick else [10.0 * k for k in range(1, 11)]
    print(f"\n2. Rate sweep of case 1 (continuous, exact contexts): {len(rates)} points x {n:,} requests on 2 workers")
    r = _child("sweep", n, rates, 2)
    print(f"wall {r['wall']:.1f} s, cpu {r['cpu']:.1f} s (parent and workers, fits included), peak RSS "
          f"{r['rss']:.0f} MiB per process")
    print(f"{'rate/s':>8}{'tok/s':>9}{'TTFT P99':>10}{'TPOT P50':>10}{'TPOT P99':>10}{'preempt':>9}  (ms)")
    for rate_, tok, ttft99, tpot50, tpot99, pre in r["rows"]:
        print(f"{rate_:>8.0f}{tok:>9.0f}{ttft99 * 1e3:>10.0f}{tpot50 * 1e3:>10.1f}{tpot99 * 1e3:>10.1f}{pre:>9,}")
    print("\n3. mode=serve's shape as requests: 240 x (prompt 128, 2,048 decode steps) at once, 70B-class tp 4 on one "
          "DGX A100 (roofline), paged KV cache")
    r = _child("static")
    print(f"wall {r['wall']:.1f} s, cpu {r['cpu']:.1f} s, peak RSS {r['rss']:.0f} MiB, {r['iterations']:,} iterations; "
          f"per GPU: weights {r['weights_gib']:.1f} GiB, KV cache {r['kv_gib']:.1f} GiB ({r['blocks']:,} blocks) for "
          f"the {r['need_gib']:.1f} GiB all 240 would hold at their longest: {r['preemptions']:,} preemptions")
    print(f"TTFT {r['ttft'] * 1e3:.3f} ms; serving_times of the mode=serve graph at batch 240: {r['ttft_closed'] * 1e3:.3f} ms")
    print(f"prefill + 8 decode steps {r['first'] * 1e3:.3f} ms; serving_times (generate=8): {r['first_closed'] * 1e3:.3f} ms; "
          f"last token at {r['e2e']:.2f} s")


if __name__ == "__main__":
    main()
