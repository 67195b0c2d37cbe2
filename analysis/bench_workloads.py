"""Time building every zoo workload and importing the onnx wheel's weight-free models.

Run: ``PYTHONPATH=. python analysis/bench_workloads.py``; the table is committed in
``analysis/results/bench_workloads.txt``. Times are medians of repeated builds on one machine;
compare them with each other, not with other machines.
"""

from __future__ import annotations

import os
import platform
import statistics
import time

from marssim.workload import load_workload, zoo_entries


def _median_time(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
          f"Python {platform.python_version()}")
    print(f"{'workload':48s} {'ops':>5s} {'GMACs':>9s} {'build ms':>9s}")
    for name in zoo_entries():
        graph = load_workload(name)
        t = _median_time(lambda: load_workload(name), 21)
        print(f"{name:48s} {len(graph):5d} {graph.macs / 1e9:9.4f} {t * 1e3:9.2f}")
    try:
        import onnx
    except ImportError:
        print("onnx not installed: ONNX import not timed")
        return
    light = os.path.join(os.path.dirname(onnx.__file__), "backend", "test", "data", "light")
    for file in sorted(f for f in os.listdir(light) if f.endswith(".onnx")):
        path = os.path.join(light, file)
        graph = load_workload(path)
        t = _median_time(lambda: load_workload(path), 5)
        print(f"{file:48s} {len(graph):5d} {graph.macs / 1e9:9.4f} {t * 1e3:9.2f}")


if __name__ == "__main__":
    main()
