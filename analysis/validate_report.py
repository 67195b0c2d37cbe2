"""The analytical estimate against the simulator on the shipped topologies and zoo workloads.

For each (system, workload) pair, ``N`` mappings are sampled as ``marssim validate --sample``
samples them (a third uniformly from the mapping space, a third pipelines with the most
micro-batches, a third with channel sharding on every layer) and evaluated both ways. Each
pair's report (``validate.csv``, ``summary.txt``, ``attribution.csv``, ``scatter.png``/``.svg``)
goes to ``analysis/results/validate/<system>_<workload>/``, and the table of all pairs to
``analysis/results/validate_report.txt``.

Run: ``PYTHONPATH=. python analysis/validate_report.py [--per-pair N] [--workers W]``.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from marssim.cost import default_cost_model
from marssim.fsutil import atomic_file
from marssim.system import load_system
from marssim.search.sample import sample_mappings
from marssim.validate import validate
from marssim.workload import load_workload

PAIRS = [("mars-adaptive-16", "resnet50:batch=8"), ("dgx-h100", "bert-base:batch=8"),
         ("ring-8", "mobilenetv2:batch=8")]
RESULTS = Path(__file__).parent / "results"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--per-pair", type=int, default=200, help="mappings sampled per pair (default 200)")
    ap.add_argument("--workers", type=int, default=2, help="processes (default 2)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    cost, cost_name = default_cost_model(), "marssim.cost.default_cost_model()"
    lines = [f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
             f"Python {platform.python_version()}; cost model: {cost_name}",
             f"{args.per_pair} sampled mappings per pair (seed {args.seed}); |error| = |estimate - simulation| / "
             "simulation over the mappings that fit memory", ""]
    header = (f"{'':<39}{'':>5}{'contention-free estimate':^54}{'max(estimate, bound)':^30}\n"
              f"{'system':<18}{'workload':<21}{'fit':>5}{'median':>8}{'p90':>8}{'max':>8}{'exact':>7}{'above':>7}"
              f"{'tau':>7}{'rho':>7}   {'median':>8}{'p90':>8}{'tau':>7}{'rho':>7}")
    table = [header]
    blame = ["", "contention behind the largest gaps (share of the critical-path delay of the worst tenth):"]
    wall = time.perf_counter()
    with ProcessPoolExecutor(max_workers=args.workers) as pool:
        for system_name, spec in PAIRS:
            system = load_system(system_name)
            graph = load_workload(spec)
            mappings = sample_mappings(graph, system, args.per_pair, seed=args.seed)
            t0 = time.perf_counter()
            report = validate(graph, system, mappings, cost, executor=pool, meta={"seed": args.seed})
            out = RESULTS / "validate" / f"{system_name}_{spec.replace(':', '_').replace('=', '')}"
            report.save(out)
            s = report.summary
            b = s["bounded"]
            table.append(f"{system_name:<18}{spec:<21}{s['n']:>5}{s['median_abs_error']:>8.1%}"
                         f"{s['p90_abs_error']:>8.1%}{s['max_abs_error']:>8.1%}{s['exact']:>7}{s['above']:>7}"
                         f"{s['kendall_tau']:>7.3f}{s['spearman_rho']:>7.3f}   {b['median_abs_error']:>8.1%}"
                         f"{b['p90_abs_error']:>8.1%}{b['kendall_tau']:>7.3f}{b['spearman_rho']:>7.3f}")
            kinds = report.attribution.groupby("kind")["share"].sum().sort_values(ascending=False)
            top = ", ".join(f"{r.resource} {r.share:.0%}" for r in report.attribution.head(4).itertuples())
            blame.append(f"  {system_name} / {spec}: {top}  (by kind: "
                         + ", ".join(f"{k} {v:.0%}" for k, v in kinds.items()) + ")")
            print(f"{system_name} / {spec}: {len(mappings)} mappings in {time.perf_counter() - t0:.0f} s "
                  f"(estimate {s['speedup_median']:.0f}x faster than simulation, median)", file=sys.stderr)
            print(report.text(), file=sys.stderr)
    lines += table + blame
    lines += ["", "fit: mappings that fit memory (the others are left out); exact: |error| <= 1e-9; above: estimate "
                  "above the simulation; tau, rho: Kendall and Spearman rank correlation of estimate and simulation.",
              f"Per-pair reports (CSV, summary, attribution, scatter plots): analysis/results/validate/. "
              f"Total {time.perf_counter() - wall:.0f} s with {args.workers} workers."]
    text = "\n".join(lines) + "\n"
    with atomic_file(RESULTS / "validate_report.txt") as handle:
        handle.write(text)
    print(text)


if __name__ == "__main__":
    main()
