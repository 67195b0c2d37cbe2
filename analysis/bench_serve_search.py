"""Benchmark: the search over serving deployments (``marssim search --model`` / ``compare``).

Llama-3 70B serving the Azure conversation trace (its first 2,000 requests, 4,000 for the goodput
case so that its runs last 4 times their mean end-to-end latency at higher rates: arrivals sped up
to the offered rate, prompt and output lengths of its rows), constraints TTFT P99 <= 2 s and TBT P99
<= 100 ms, 16-token context buckets, on 2 worker processes. Each case runs the uniform grid,
then the MARS GA seeded with the grid's best (as ``marssim compare`` does), on the same
evaluator settings:

1. fewest GPUs at 20 requests/s on 8 DGX H100 nodes (64 GPUs);
2. goodput (the highest rate meeting the constraints) of the 64 GPUs;
3. cost (dollars per million output tokens) at 10 requests/s on the mixed cluster of 4 DGX A100
   and 4 DGX H100 nodes, at illustrative prices of $1.30 (A100) and $2.50 (H100) per GPU-hour
   (assumptions of this benchmark, not quoted prices).

Reported per search: wall time, CPU time of this process and of its workers (user + sys),
simulations (a goodput simulation is several runs, one per rate tried), screens, the best
deployment and its simulated figures; and over every deployment simulated in the case, the rank
correlation (Spearman) between the screen's TTFT and TBT P99 and the simulation's.

Usage: ``python analysis/bench_serve_search.py [--quick]`` (quick: 600 requests, smaller budgets).
The committed output is ``analysis/results/bench_serve_search.txt``.
"""

from __future__ import annotations

import argparse
import os
import platform
import resource
import sys
import time

TRACE = "azure-conv-2023"
SLO = "ttft_p99=2s,tbt_p99=100ms"
CASES = (
    ("1. fewest GPUs at 20 requests/s", "dgx-h100-cluster:nodes=8", "gpus", 20.0, ()),
    ("2. goodput of 64 GPUs", "dgx-h100-cluster:nodes=8", "goodput", 20.0, ()),
    ("3. cost at 10 requests/s, mixed A100/H100", "mixed-a100-h100-cluster", "cost", 10.0,
     (("a100", 1.3), ("h100", 2.5))),
)


def _cpu_self() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def _cpu_children() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def run_case(title: str, system_name: str, objective: str, rate: float, prices: tuple, quick: bool) -> list[str]:
    from concurrent.futures import ProcessPoolExecutor
    from dataclasses import replace

    from scipy.stats import spearmanr

    from marssim.cost import default_cost_model
    from marssim.search.parallel import ignore_interrupts
    from marssim.search.result import deployment_figures
    from marssim.search.serve import ServeSearchSettings, mars_serve, serve_grid_search
    from marssim.serve import Arrivals, Lengths, RequestSpec, load_model
    from marssim.serve.case import ServeCase
    from marssim.serve.slo import parse_constraints
    from marssim.system import load_system

    n = (600 if quick else 2000) * (2 if objective == "goodput" else 1)
    spec = RequestSpec(Arrivals("trace", trace=TRACE), Lengths("trace", trace=TRACE), Lengths("trace", trace=TRACE),
                       n).with_rate(rate)
    system = load_system(system_name)
    case = ServeCase(load_model("llama3-70b"), spec, 0, parse_constraints(SLO), prices, goodput=objective == "goodput")
    budget = {"gpus": 16, "cost": 16, "goodput": 8}[objective] // (2 if quick else 1)
    settings = ServeSearchSettings(objective=objective, context_bucket=16, max_simulations=budget, generations=8,
                                   population=12, patience=4)
    lines = [f"{title}: {system.spec} ({len(system.accelerators)} GPUs), {spec.text()}, constraints {SLO}"]
    t0, c0, k0 = time.perf_counter(), _cpu_self(), _cpu_children()
    cost = default_cost_model()
    results = []
    with ProcessPoolExecutor(2, initializer=ignore_interrupts) as pool:
        grid = serve_grid_search(case, system, cost, settings, executor=pool)
        results.append(grid)
        seeds = [c.plan for c in grid.top(settings.grid_simulate) if c.simulated is not None]
        results.append(mars_serve(case, system, cost, replace(settings, seed_with_grid=False), executor=pool,
                                  seeds=seeds))
    wall, cpu, kids = time.perf_counter() - t0, _cpu_self() - c0, _cpu_children() - k0
    lines.append(f"  {'search':<13}{'wall s':>8}{'sims':>6}{'runs':>6}{'screens':>9}  best (simulated)")
    for r in results:
        lines.append(f"  {r.algorithm:<13}{r.wall_s:>8.1f}{r.simulations:>6d}{r.notes.get('runs', 0):>6d}"
                     f"{r.estimates:>9d}  {r.best.text()}")
        lines.append(f"  {'':<42}{deployment_figures(r.evaluation)}")
    g, m = results
    from marssim.search.report import fitness_display

    label, gv = fitness_display(objective, g.fitness)
    _, mv = fitness_display(objective, m.fitness)
    lines.append(f"  {label}: grid {gv:.4g}, GA {mv:.4g} ({(mv / gv - 1) * 100:+.1f} %)")
    lines.append(f"  both searches: wall {wall:.1f} s (cost model fit included), CPU {cpu:.1f} s here + {kids:.1f} s "
                 f"in the 2 workers")
    pairs = [(c.screened, c.simulated) for r in results for c in r.candidates
             if c.screened is not None and c.simulated is not None and c.simulated.feasible]
    for key in ("ttft_p99", "tbt_p99"):
        xs = [s.latency.get(key, float("nan")) for s, _ in pairs]
        ys = [e.latency.get(key, float("nan")) for _, e in pairs]
        ok = [(x, y) for x, y in zip(xs, ys) if x == x and y == y and x < float("inf")]
        if len(ok) >= 4:
            rho = spearmanr([x for x, _ in ok], [y for _, y in ok]).statistic
            lines.append(f"  screen vs simulation, {key}: Spearman {rho:.2f} over the {len(ok)} deployments simulated to "
                         "their end (runs stop once they miss a bound)")
    return lines


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--quick", action="store_true")
    p.add_argument("--case", type=int, action="append", help="run only these cases (1-3)")
    args = p.parse_args()
    print(f"machine: {platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}")
    print()
    for i, case in enumerate(CASES, start=1):
        if args.case and i not in args.case:
            continue
        for line in run_case(*case, quick=args.quick):
            print(line)
        print()
        sys.stdout.flush()


if __name__ == "__main__":
    main()
