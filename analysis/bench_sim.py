"""Simulator benchmark: raw SimPy event rate vs marssim's, wall time and peak memory of real
cases, and how simulation time grows with the number of accelerators.

Run: ``python analysis/bench_sim.py [--quick]``. Prints tables; the committed output lives in
``analysis/results/bench_sim.txt``. Times are wall-clock seconds on this machine (compare ratios
within one run, not across machines); memory is the peak of Python allocations (tracemalloc)
during lowering + simulation, measured in a separate pass so that tracing does not slow the
timed pass.

"Events" are the events SimPy schedules. marssim needs about one per task: a device's compute is
one timeout, flows that finish at one instant share one network wake-up, rates are recomputed
once per timestamp, and memory accounting schedules no events at all. Each event therefore
carries a task's whole bookkeeping (dependencies, buffers, max-min rates), which is why the
rate per event is a fraction of a bare timeout loop's; tasks per second is the number to compare
between versions. The event rate is measured on the time spent inside SimPy's ``run``, as the
raw loop's is (the set-up of the per-task lists and the summary are outside both).
"""

from __future__ import annotations

import argparse
import os
from contextlib import contextmanager
import platform
import time
import tracemalloc

import simpy

from marssim.cost import default_cost_model
from marssim.lower import lower
from marssim.mapping import AcceleratorSet, Mapping
from marssim.search.space import MappingSpace
from marssim.sim import simulate, simulate_summary
from marssim.system import System, load_system, system_from_dict
from marssim.workload import Graph, load_workload


def raw_simpy_rate(n: int = 400_000) -> float:
    """Events per second of a bare SimPy timeout loop (one process, ``n`` timeouts)."""
    env = simpy.Environment()

    def loop():
        for _ in range(n):
            yield env.timeout(1.0)

    env.process(loop())
    t0 = time.perf_counter()
    env.run()
    return n / (time.perf_counter() - t0)


def pipeline(graph: Graph, system: System, n_sets: int, design: str, sharding, micro: int) -> Mapping:
    """``n_sets`` equal contiguous sets of accelerators, FLOP-balanced layer segments."""
    accs = system.accelerator_ids
    size = len(accs) // n_sets
    sets = [AcceleratorSet(tuple(accs[i * size:(i + 1) * size]), design) for i in range(n_sets)]
    space = MappingSpace(graph, system)
    bounds = list(space.balanced_boundaries([1.0] * n_sets))
    return Mapping.pipeline(graph, system, sets, bounds, sharding=sharding, micro_batches=micro)


def cases(graph: Graph, system: System) -> dict[str, Mapping]:
    return {
        "data-parallel": Mapping.single_set(graph, system, design="os32", sharding="dp"),
        "model-parallel": Mapping.single_set(graph, system, design="os32", sharding=("oc", "head", "seq", "dp")),
        "pipelined 4x4": pipeline(graph, system, 4, "os32", ("spatial", "seq", "oc", "dp"), 8),
    }


@contextmanager
def env_run_seconds(spent: list[float]):
    """While active, every ``simpy.Environment.run`` call appends its wall seconds to ``spent``:
    the event loop alone, timed as :func:`raw_simpy_rate` times the bare loop."""
    original = simpy.Environment.run

    def timed(self, *args, **kwargs):
        t = time.perf_counter()
        try:
            return original(self, *args, **kwargs)
        finally:
            spent.append(time.perf_counter() - t)

    simpy.Environment.run = timed
    try:
        yield spent
    finally:
        simpy.Environment.run = original


def measure(graph: Graph, system: System, mapping: Mapping, cost, repeats: int = 3) -> dict:
    """Lowering, simulate() and simulate_summary() wall times; run s and loop s are the best of
    ``repeats`` summary runs (loop s: inside SimPy's ``run`` only)."""
    t0 = time.perf_counter()
    tg = lower(graph, system, mapping, cost)
    t1 = time.perf_counter()
    result = simulate(tg, system, record=False, setup=False)
    t2 = time.perf_counter()
    runs, loops = [], []
    for _ in range(repeats):
        spent: list[float] = []
        with env_run_seconds(spent):
            start = time.perf_counter()
            simulate_summary(tg, system)
            runs.append(time.perf_counter() - start)
        loops.append(sum(spent))
    run_s, loop_s = min(runs), min(loops)
    tracemalloc.start()
    tg2 = lower(graph, system, mapping, cost)
    simulate(tg2, system, record=False, setup=False)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    events = result.meta["events"]
    return {"tasks": tg.n_tasks, "events": events, "lower_s": t1 - t0, "sim_s": t2 - t1, "run_s": run_s,
            "loop_s": loop_s, "events_per_s": events / loop_s / 1e6, "tasks_per_s": tg.n_tasks / run_s / 1e6,
            "makespan_ms": result.makespan * 1e3, "peak_mib": peak / 2**20}


def scaled_system(n: int) -> System:
    """``n`` accelerators of the mars-adaptive-16 kind, boards of 4 fully linked, boards joined by
    an Ethernet switch, the host on PCIe (same numbers as topologies/mars-adaptive-16.yaml)."""
    base = load_system("mars-adaptive-16")
    designs = {name: d.model_dump(exclude={"name", "dram_bandwidth"}, exclude_none=True)
               for name, d in base.designs.items()}
    boards = n // 4
    links = [{"pattern": "full", "nodes": f"acc[{4 * b}-{4 * b + 3}]", "bandwidth": 25e9, "latency": 2e-7}
             for b in range(boards)]
    links.append({"pattern": "star", "hub": "eth0", "nodes": f"acc[0-{n - 1}]", "bandwidth": 12.5e9,
                  "latency": 5e-7})
    links.append({"pattern": "star", "hub": "host0", "nodes": f"acc[0-{n - 1}]", "bandwidth": 15.75e9,
                  "latency": 5e-7})
    return system_from_dict({
        "name": f"scaled-{n}", "designs": designs,
        "accelerators": [{"id": f"acc[0-{n - 1}]", "designs": list(designs),
                          "memory": {"capacity": "64 GiB", "bandwidth": "77 GB/s"}}],
        "hosts": [{"id": "host0", "dram": {"capacity": "512 GiB", "bandwidth": "204.8 GB/s"}}],
        "switches": [{"id": "eth0", "latency": "500 ns"}], "links": links,
    }, f"<scaled-{n}>", require_units=False)


def table(rows: list[dict], columns: list[tuple[str, str, str]]) -> str:
    """Rows as aligned columns: the first left-aligned, the others right-aligned."""
    cells = [[format(row[key], fmt) for _, key, fmt in columns] for row in rows]
    widths = [max(len(title), *(len(c[i]) for c in cells)) for i, (title, _, _) in enumerate(columns)]
    lines = []
    for values in [[title for title, _, _ in columns], *cells]:
        lines.append("  ".join(v.ljust(w) if i == 0 else v.rjust(w) for i, (v, w) in enumerate(zip(values, widths))))
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="skip the BERT seq-512 cases and the 64-accelerator point")
    args = parser.parse_args()
    print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
          f"Python {platform.python_version()}, SimPy {simpy.__version__}")
    cost = default_cost_model()
    raw = raw_simpy_rate()
    print(f"\nraw SimPy timeout loop: {raw / 1e6:.3f} M events/s")

    system = load_system("mars-adaptive-16")
    workloads = ["resnet50:batch=8"] + ([] if args.quick else ["bert-base:seq=512,batch=8"])
    rows = []
    for spec in workloads:
        graph = load_workload(spec)
        for name, mapping in cases(graph, system).items():
            row = measure(graph, system, mapping, cost)
            row["case"] = f"{spec} {name}"
            row["vs_raw"] = row["events_per_s"] * 1e6 / raw
            rows.append(row)
    print("\nmars-adaptive-16 (16 accelerators); target: sim <= 0.5 s, peak <= 500 MiB, events/s >= 50% of raw")
    print("sim s: simulate() with its result tables; run s: simulate_summary() as searches use it (set-up,\n"
          "event loop, summary; tasks/s on it); loop s: SimPy's run() inside it, the event loop alone, timed as\n"
          "the raw loop is (M ev/s and of raw on it); run s and loop s: best of 3")
    print(table(rows, [("case", "case", ""), ("tasks", "tasks", "d"), ("events", "events", "d"),
                       ("lower s", "lower_s", ".3f"), ("sim s", "sim_s", ".3f"), ("run s", "run_s", ".3f"),
                       ("loop s", "loop_s", ".3f"), ("M ev/s", "events_per_s", ".3f"), ("of raw", "vs_raw", ".0%"),
                       ("M tasks/s", "tasks_per_s", ".3f"),
                       ("makespan ms", "makespan_ms", ".3f"), ("peak MiB", "peak_mib", ".1f")]))

    graph = load_workload("resnet50:batch=8")
    rows = []
    sizes = (4, 8, 16, 32) if args.quick else (4, 8, 16, 32, 64)
    for n in sizes:
        system = scaled_system(n)
        mapping = pipeline(graph, system, max(1, n // 4), "os32", ("spatial", "oc", "dp"), 8)
        row = measure(graph, system, mapping, cost)
        row["case"] = f"{n} accelerators, {max(1, n // 4)} stages of 4"
        rows.append(row)
    base = rows[0]["sim_s"]
    for row in rows:
        row["growth"] = row["sim_s"] / base
    print("\nscaling: resnet50:batch=8, pipeline of n/4 stages x 4 accelerators (spatial sharding), 8 micro-batches")
    print(table(rows, [("case", "case", ""), ("tasks", "tasks", "d"), ("events", "events", "d"),
                       ("lower s", "lower_s", ".3f"), ("sim s", "sim_s", ".3f"), ("x of n=4", "growth", ".2f"),
                       ("M ev/s", "events_per_s", ".3f"), ("peak MiB", "peak_mib", ".1f")]))


if __name__ == "__main__":
    main()
