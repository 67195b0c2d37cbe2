"""Time building every zoo workload, the LLM training and serving graphs, and importing the onnx
wheel's weight-free models.

The LLM rows build each graph in a fresh process (``python -c``), timing the build inside it
and reading the process's peak resident memory (``ru_maxrss``, which includes the interpreter
and numpy/pandas imports); ``marssim show`` is timed as a whole command.

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
    for name, entry in zoo_entries().items():
        if entry.group != "zoo":
            continue
        graph = load_workload(name)
        t = _median_time(lambda: load_workload(name), 21)
        print(f"{name:48s} {len(graph):5d} {graph.macs / 1e9:9.4f} {t * 1e3:9.2f}")
    _llm()
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


LLM_CASES = [
    "gpt3-175b:mode=train,batch=1,seq=2048",
    "gpt3-175b:mode=train,batch=1,seq=2048,recompute=full",
    "llama3-70b:mode=train,batch=1,seq=4096,recompute=selective",
    "mixtral-8x7b:mode=train,batch=1,seq=4096",
    "llama3-405b:mode=train,batch=1,seq=8192",
    "llama3-70b:mode=decode,batch=64,context=4096",
    "llama3-70b:mode=serve,batch=8,prompt=1024,generate=32",
]

_CHILD = """
import resource, sys, time
start = time.perf_counter()
from marssim.workload import load_workload
imported = time.perf_counter()
graph = load_workload(sys.argv[1])
built = time.perf_counter()
print(len(graph), built - imported, imported - start, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
"""


def _llm() -> None:
    import subprocess
    import sys

    print()
    print("LLM graphs: build time (s) in a fresh process after imports, its peak RSS (MiB, imports included), "
          "`marssim show` wall time (s)")
    print(f"{'workload':58s} {'ops':>7s} {'build s':>8s} {'import s':>8s} {'peak MiB':>9s} {'show s':>7s}")
    for spec in LLM_CASES:
        out = subprocess.run([sys.executable, "-c", _CHILD, spec], capture_output=True, text=True, check=True).stdout
        ops, build, imports, rss_kib = out.split()
        start = time.perf_counter()
        subprocess.run([sys.executable, "-m", "marssim", "show", spec], capture_output=True, check=True)
        show = time.perf_counter() - start
        print(f"{spec:58s} {int(ops):7d} {float(build):8.3f} {float(imports):8.3f} {int(rss_kib) / 1024:9.1f} "
              f"{show:7.2f}")


if __name__ == "__main__":
    main()
