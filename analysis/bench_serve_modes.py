"""Benchmark: the serving benchmark modes (``marssim serve --concurrency N``, ``--arrival offline``).

2,000 requests with the Azure conversation trace's prompt and output lengths on 8 replicas of
Llama-3 8B (tp 1) on one DGX H100 node, vLLM's continuous batching (256 sequences per replica),
16-token context buckets: a closed loop of 8, 64, 512 and 2,048 users, and the offline run (every
request at time 0). Per mode: output tokens/s (in all and per GPU), requests/s, TTFT and TPOT
medians, the median user's decode speed (1 / TPOT), the mean number of requests in the system,
and the CPU seconds (user + sys) of the simulation. 2,048 users for 2,000 requests is the offline
run (every request sent at time 0): its figures must be those of the offline row.

Usage: ``python analysis/bench_serve_modes.py``. Prints a table; the committed output is
``analysis/results/bench_serve_modes.txt``.
"""

from __future__ import annotations

import platform
import resource
import time


def main() -> None:
    from marssim.cost import default_cost_model
    from marssim.serve import Arrivals, Deployment, Lengths, Pool, RequestSpec, load_model, simulate_serving
    from marssim.serve.requests import closed_loop
    from marssim.system import load_system

    import os

    print(f"machine: {platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}")
    model = load_model("llama3-8b")
    system = load_system("dgx-h100-cluster:nodes=1")
    cost = default_cost_model()
    dep = Deployment((Pool(replicas=8, tp=1),), context_bucket=16)
    lengths = Lengths("trace", trace="azure-conv-2023")
    start = time.process_time()
    simulate_serving(dep, model, system, cost, RequestSpec(closed_loop(1), lengths, lengths, 8).draw(0))
    print(f"cost model fit and first run: {time.process_time() - start:.1f} s CPU")
    print("2,000 requests, azure-conv-2023 lengths, 8 x llama3-8b tp 1 on dgx-h100-cluster:nodes=1, continuous")
    print(f"{'mode':<16}{'tok/s':>9}{'per GPU':>9}{'req/s':>8}{'TTFT P50':>10}{'TPOT P50':>10}{'user tok/s':>11}"
          f"{'in system':>11}{'cpu s':>8}")
    modes = [(f"closed N={n:,}", closed_loop(n)) for n in (8, 64, 512, 2048)] + [("offline", Arrivals("offline"))]
    for name, arrivals in modes:
        start = time.process_time()
        s = simulate_serving(dep, model, system, cost, RequestSpec(arrivals, lengths, lengths, 2000).draw(0)).summary
        cpu = time.process_time() - start
        print(f"{name:<16}{s['output_tokens_per_s']:>9,.0f}{s['output_tokens_per_s_per_gpu']:>9,.0f}"
              f"{s['throughput_rps']:>8.2f}{s['ttft_s']['p50'] * 1e3:>10.1f}{s['tpot_s']['p50'] * 1e3:>10.2f}"
              f"{s['user_tokens_per_s']['p50']:>11.1f}{s['little']['mean_in_system']:>11.1f}{cpu:>8.1f}")
    print("(TTFT, TPOT in ms; user tok/s: the median request's output tokens per second while decoding; in system:"
          " time-average requests in the system)")
    print(f"peak RSS {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MiB")


if __name__ == "__main__":
    main()
