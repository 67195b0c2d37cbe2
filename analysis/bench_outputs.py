"""The outputs of a folded run at 1,024 GPUs against its simulation: CPU seconds and bytes of
``--out``, ``--trace`` and ``--plot`` for GPT-3 175B training on 128 DGX H100 nodes
(tp 8, pp 8, dp 16, sequence parallel, ZeRO-1, selective recomputation, global batch 512), as
``marssim simulate`` writes them.

    PYTHONPATH=$PWD python analysis/bench_outputs.py > analysis/results/bench_outputs.txt

Each output is written once, in one process after one simulation (numba's kernels compiled
before, so the simulation's CPU time is its own); CPU time is user + system of this process
(``time.process_time``), sizes are of the files written (``--out``: the whole directory).
"""

from __future__ import annotations

import os
import platform
import resource
import sys
import tempfile
import time
from pathlib import Path

from marssim.cost import default_cost_model
from marssim.parallel import parse_parallel
from marssim.plan import bind_parallel, run
from marssim.results.view import folded_view
from marssim.system import load_system
from marssim.trace import plot_result, write_chrome_trace
from marssim.workload import load_workload

SYSTEM = "dgx-h100-cluster:nodes=128"
WORKLOAD = "gpt3-175b:mode=train"
PARALLEL = "tp=8,pp=8,dp=16,sp=true,zero=1,recompute=selective,global_batch=512"


def _size(path: Path) -> int:
    return path.stat().st_size


def main() -> None:
    system = load_system(SYSTEM)
    cfg, graph = bind_parallel(parse_parallel(PARALLEL), load_workload(WORKLOAD), system, "--parallel",
                               micro_batch_given=False, batch_given=False)
    cost = default_cost_model()
    t0 = time.process_time()
    done = run(cfg, graph, system, cost, how="simulate", fold=True)
    sim_s = time.process_time() - t0
    result = done.result
    shown = folded_view(result)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        for name, write, path in (
                ("--out DIR", lambda p: result.save(p), tmp / "run"),
                ("--out DIR --per-link", lambda p: result.save(p, per_link=True), tmp / "run-links"),
                ("--trace FILE.json.gz", lambda p: write_chrome_trace(shown, p), tmp / "trace.json.gz"),
                ("--plot FILE.png", lambda p: plot_result(shown, p), tmp / "fig.png")):
            t = time.process_time()
            try:
                write(path)
            except TypeError:  # a version that writes every table always (no per_link)
                continue
            cpu = time.process_time() - t
            files = sorted(tmp.glob("fig*")) if name.startswith("--plot") else \
                [p for p in path.rglob("*") if p.is_file()] if path.is_dir() else [path]
            rows.append((name, cpu, sum(_size(p) for p in files), max((_size(p) for p in files), default=0)))
    print(f"# {WORKLOAD} on {SYSTEM} with {PARALLEL}: {done.taskgraph.n_tasks:,} tasks, "
          f"{done.taskgraph.meta['fold_classes']} classes of identical GPUs, {len(result.intervals):,} intervals")
    print(f"# {platform.machine()}, {platform.python_version()}, {os.cpu_count()} CPUs ({platform.processor() or '-'})")
    print(f"{'output':<24}{'CPU s':>8}{'x simulation':>14}{'MiB':>9}{'largest file MiB':>18}")
    print(f"{'simulation':<24}{sim_s:>8.1f}{1.0:>14.2f}{'-':>9}{'-':>18}")
    for name, cpu, size, largest in rows:
        print(f"{name:<24}{cpu:>8.1f}{cpu / sim_s:>14.2f}{size / 2**20:>9.1f}{largest / 2**20:>18.1f}")
    print(f"max RSS {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MiB")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
