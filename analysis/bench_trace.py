"""Trace output at scale: size and time of the Chrome/Perfetto JSON, the interval table and the
figures for ResNet-50 on 16 accelerators, and the peak memory of the streaming writer against
building the whole event list first.

    PYTHONPATH=$PWD python analysis/bench_trace.py > analysis/results/bench_trace.txt

Peak memory is Python's (tracemalloc, numpy included) during the write alone, the result
already in memory; times are wall-clock on this machine, each measured once without tracemalloc.
"""

from __future__ import annotations

import json
import os
import platform
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _cases import run  # noqa: E402

from marssim.trace import build_layout, chrome_events, export_intervals, plot_result, write_chrome_trace  # noqa: E402

CASES = [  # (mapping, batch, micro-batches)
    ("dp", 8, 1),
    ("pipeline", 8, 4),
    ("oc", 8, 1),
    ("oc", 64, 8),  # the large case: ~1 M events
]


def naive_write(result, path: Path) -> None:
    """The usual way: every event as a dict in one list, then json.dump of the whole document."""
    events = [json.loads(e) for e in chrome_events(result)]
    with open(path, "w") as f:
        json.dump({"traceEvents": events}, f)


def measure(fn) -> tuple[float, float]:
    """(seconds, peak MiB) of ``fn()``: timed alone, then run again under tracemalloc."""
    t = time.perf_counter()
    fn()
    seconds = time.perf_counter() - t
    tracemalloc.start()
    fn()
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    return seconds, peak / 2**20


def main() -> None:
    print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores; "
          f"Python {platform.python_version()}")
    tmp = Path(tempfile.mkdtemp(prefix="bench-trace-"))
    rows = []
    cost_name = ""
    for kind, batch, mbs in CASES:
        t = time.perf_counter()
        result, cost_name = run(kind, batch=batch, micro_batches=mbs)
        sim_s = time.perf_counter() - t
        layout = build_layout(result)
        n_events = sum(1 for _ in chrome_events(result, layout))
        plain, gz = tmp / "t.json", tmp / "t.json.gz"
        t_json, mem_json = measure(lambda: write_chrome_trace(result, plain))
        t_gz, _ = measure(lambda: write_chrome_trace(result, gz))
        t_naive, mem_naive = measure(lambda: naive_write(result, tmp / "naive.json"))
        t_pq, _ = measure(lambda: export_intervals(result, tmp / "iv.parquet"))
        t_csv, _ = measure(lambda: export_intervals(result, tmp / "iv.csv"))
        t = time.perf_counter()
        plot_result(result, tmp / "fig.png")
        t_fig = time.perf_counter() - t
        rows.append({
            "case": f"{kind} b{batch} mb{mbs}", "intervals": len(result.intervals), "edges": len(result.edges),
            "events": n_events, "sim_s": sim_s, "json_MiB": plain.stat().st_size / 2**20, "json_s": t_json,
            "gz_MiB": gz.stat().st_size / 2**20, "gz_s": t_gz, "peak_stream_MiB": mem_json,
            "peak_naive_MiB": mem_naive, "naive_s": t_naive, "parquet_MiB": (tmp / "iv.parquet").stat().st_size / 2**20,
            "parquet_s": t_pq, "csv_MiB": (tmp / "iv.csv").stat().st_size / 2**20, "csv_s": t_csv, "figures_s": t_fig,
            "makespan_ms": result.makespan * 1e3,
        })
    print(f"workload: ResNet-50 (zoo) on mars-adaptive-16; cost model: {cost_name}")
    print("mappings: dp = one set of 16, data parallel; pipeline = 4 boards as 4 stages (os32, ws32, nvdla64, shi32),")
    print("          output-channel sharding inside each; oc = one set of 16, output-channel sharding (all-gathers)")
    print()
    head = (f"{'case':<20}{'intervals':>10}{'edges':>8}{'events':>9}{'makespan':>10}{'simulate':>9}"
            f"{'json':>9}{'write':>7}{'json.gz':>9}{'write':>7}{'peak mem':>10}{'naive peak':>11}{'naive':>7}")
    units = (f"{'':<20}{'':>10}{'':>8}{'':>9}{'ms':>10}{'s':>9}{'MiB':>9}{'s':>7}{'MiB':>9}{'s':>7}"
             f"{'MiB':>10}{'MiB':>11}{'s':>7}")
    print(head)
    print(units)
    for r in rows:
        print(f"{r['case']:<20}{r['intervals']:>10}{r['edges']:>8}{r['events']:>9}{r['makespan_ms']:>10.3f}"
              f"{r['sim_s']:>9.2f}{r['json_MiB']:>9.2f}{r['json_s']:>7.2f}{r['gz_MiB']:>9.2f}{r['gz_s']:>7.2f}"
              f"{r['peak_stream_MiB']:>10.1f}{r['peak_naive_MiB']:>11.1f}{r['naive_s']:>7.2f}")
    print()
    print(f"{'case':<20}{'parquet':>9}{'write':>7}{'csv':>9}{'write':>7}{'figures':>9}{'bytes/event':>13}"
          f"{'naive/stream peak':>19}")
    print(f"{'':<20}{'MiB':>9}{'s':>7}{'MiB':>9}{'s':>7}{'s':>9}{'(json)':>13}{'':>19}")
    for r in rows:
        print(f"{r['case']:<20}{r['parquet_MiB']:>9.2f}{r['parquet_s']:>7.2f}{r['csv_MiB']:>9.2f}{r['csv_s']:>7.2f}"
              f"{r['figures_s']:>9.2f}{r['json_MiB'] * 2**20 / r['events']:>13.0f}"
              f"{r['peak_naive_MiB'] / r['peak_stream_MiB']:>18.1f}x")
    print()
    print("peak mem: Python heap (tracemalloc) while writing, over the result already in memory.")
    print("naive: every event as a dict in one list, then json.dump (same events, same content).")
    for p in tmp.iterdir():
        p.unlink()
    tmp.rmdir()


if __name__ == "__main__":
    main()
