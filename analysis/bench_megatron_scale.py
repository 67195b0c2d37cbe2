"""Benchmark: Megatron-scale configurations simulated event by event and estimated.

The configurations (the configurations only, none of the published throughputs):

* the ten weak-scaling GPT configurations of Narayanan et al. 2021 (SC'21, Table 1): GPUs =
  t * p * d, sequence 2,048, vocabulary 51,200, on ``dgx-a100-cluster`` with its real scalable
  units of 20 nodes; each with micro-batch 1 and 2, the 1F1B and the interleaved schedule
  (``virtual_stages``: the fewest that cut the stage's layers evenly; none for p = 1), and full
  and selective recomputation;
* the ZeRO-3 configurations of its Table 2 (no tensor or pipeline parallelism: 174.6B on 384, 768
  and 1,536 GPUs, 529.6B on 640, 1,280 and 2,560 GPUs, micro-batch 4, 2, 1);
* Llama-3 405B on 16,384 H100 (Dubey et al. 2024, Table 4: tp 8, pp 16, dp 128, sequence 8,192, 16
  sequences per replica), and GPT-3 175B on 11,616 H100 (tp 4, pp 6, interleaved with 8 virtual
  stages, dp 484, sequence parallel, ZeRO-1, global batch 2,904: 6 micro-batches per pipeline).

For each, in a fresh process pinned to one core: lowering + simulation (compiled engine,
``simulate_summary``) and lowering + analytical estimate (lowered as ``marssim estimate`` lowers:
each ring over several GPU classes one task per class with coupled steps, ``coupled_rings``; the
``tasks`` column is the simulation's), each with wall time, CPU time (user + sys) and peak RSS; the closed-form screen in ms of CPU time per configuration (the median of 20
calls, after a first call); a configuration the size bound refuses (``marssim.parallel.size``;
here at 8 GiB, ``SIZE_BOUND``) is listed with its size and the time to the refusal.
Then fitted exponents of time and memory against GPUs, layers and micro-batches (least squares on
log-log over the rows that ran). The one-time costs of a process (imports, the cost model's
table fit, loading the compiled kernels of the evaluator measured) are paid before the timers
start.

Usage: ``python analysis/bench_megatron_scale.py [--quick] [--only TEXT] [--out FILE]``: quick
runs micro-batch 2, 1F1B, full recomputation only. Results are appended to ``--out`` (JSON lines,
one per configuration, default ``analysis/results/bench_megatron_scale.jsonl``) as they come, and
the table is printed at the end (``--table`` prints it from the file without running).
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import platform
import subprocess
import sys
import textwrap

import numpy as np

HERE = pathlib.Path(__file__).resolve().parent
OUT = HERE / "results" / "bench_megatron_scale.jsonl"
MEMORY_CAP = 16 * 2**30  # address-space limit of a child (so a run that would not fit cannot take the machine)
SIZE_BOUND = 8 * 2**30  # the bytes a child's lowering and simulation may plan (MARSSIM_MAX_BYTES)

# params, layers, hidden, heads, t, p, GPUs, global batch (Narayanan et al. 2021, Table 1)
NARAYANAN = [
    ("1.7B", 24, 2304, 24, 1, 1, 32, 512),
    ("3.6B", 30, 3072, 32, 2, 1, 64, 512),
    ("7.5B", 36, 4096, 32, 4, 1, 128, 512),
    ("18.4B", 40, 6144, 48, 8, 1, 256, 1024),
    ("39.1B", 48, 8192, 64, 8, 2, 512, 1536),
    ("76.1B", 60, 10240, 80, 8, 4, 1024, 1792),
    ("145.6B", 80, 12288, 96, 8, 8, 1536, 2304),
    ("310.1B", 96, 16384, 128, 8, 16, 1920, 2160),
    ("529.6B", 105, 20480, 128, 8, 35, 2520, 2520),
    ("1008B", 128, 25600, 160, 8, 64, 3072, 3072),
]

# ZeRO-3 (Narayanan et al. 2021, Table 2): model, layers, hidden, heads, GPUs, micro-batch, global batch
ZERO3 = [
    ("174.6B", 96, 12288, 96, 384, 4, 1536), ("174.6B", 96, 12288, 96, 768, 2, 1536),
    ("174.6B", 96, 12288, 96, 1536, 1, 1536),
    ("529.6B", 105, 20480, 128, 640, 4, 2560), ("529.6B", 105, 20480, 128, 1280, 2, 2560),
    ("529.6B", 105, 20480, 128, 2560, 1, 2560),
]


def gpt(layers: int, hidden: int, heads: int, micro: int) -> str:
    return (f"gpt:layers={layers},hidden={hidden},heads={heads},vocab=51200,seq=2048,max_positions=2048,"
            f"mode=train,batch={micro}")


def virtual_stages(layers: int, pp: int) -> int:
    per_stage = layers // pp
    return next(v for v in range(2, per_stage + 1) if per_stage % v == 0 and layers % (pp * v) == 0)


def cases(quick: bool) -> list[dict]:
    out = []
    for name, layers, hidden, heads, t, p, gpus, batch in NARAYANAN:
        d = gpus // (t * p)
        for micro in ((2,) if quick else (1, 2)):
            for schedule in (("1f1b",) if quick else ("1f1b", "interleaved")):
                if schedule == "interleaved" and p == 1:
                    continue
                for recompute in (("full",) if quick else ("full", "selective")):
                    cfg = f"tp={t},pp={p},dp={d},micro_batch={micro},global_batch={batch},recompute={recompute}"
                    if schedule == "interleaved":
                        cfg += f",schedule=interleaved,virtual_stages={virtual_stages(layers, p)}"
                    out.append(dict(group="narayanan", model=name, layers=layers, gpus=gpus, micro=micro,
                                    schedule=schedule, recompute=recompute, system=f"dgx-a100-cluster:nodes={gpus // 8}",
                                    workload=gpt(layers, hidden, heads, micro), config=cfg))
    for name, layers, hidden, heads, gpus, micro, batch in ZERO3:
        out.append(dict(group="zero3", model=name, layers=layers, gpus=gpus, micro=micro, schedule="1f1b",
                        recompute="full", system=f"dgx-a100-cluster:nodes={gpus // 8}",
                        workload=gpt(layers, hidden, heads, micro),
                        config=f"tp=1,pp=1,dp={gpus},zero=3,micro_batch={micro},global_batch={batch},recompute=full"))
    out.append(dict(group="llama3", model="Llama-3 405B", layers=126, gpus=16384, micro=1, schedule="1f1b",
                    recompute="none", system="dgx-h100-cluster:nodes=2048",
                    workload="llama3-405b:mode=train,seq=8192,batch=1",
                    config="tp=8,pp=16,dp=128,micro_batch=1,global_batch=2048"))
    out.append(dict(group="gpt3-11616", model="GPT-3 175B", layers=96, gpus=11616, micro=1, schedule="interleaved",
                    recompute="none", system="dgx-h100-cluster:nodes=1452",
                    workload="gpt3-175b:mode=train,seq=2048,batch=1",
                    config="tp=4,pp=6,dp=484,sp=true,zero=1,schedule=interleaved,virtual_stages=8,micro_batch=1,"
                           "global_batch=2904"))
    return out


_CHILD = textwrap.dedent("""
    import json, resource, sys, time
    from marssim.cost import default_cost_model
    from marssim.errors import InputError
    from marssim.parallel import lower_parallel, parse_parallel
    from marssim.system import load_system
    from marssim.workload import load_workload

    system_spec, workload_spec, config, what = sys.argv[1:5]

    def cpu():
        r = resource.getrusage(resource.RUSAGE_SELF)
        return r.ru_utime + r.ru_stime

    cost = default_cost_model()
    # the one-time costs of a process: imports, the cost model's table fit, the compiled kernels
    # of the evaluator measured (a process that only estimates never loads the simulator's)
    # the estimate's lowering holds each ring over several GPU classes as one task per class with
    # coupled steps, as `marssim estimate` lowers it (lower_parallel's coupled_rings)
    coupled = what == "estimate"
    small = load_system("dgx-a100-cluster:nodes=1")
    tiny = lower_parallel(load_workload("gpt:layers=2,hidden=256,heads=4,vocab=1000,seq=64,mode=train,max_positions=64"),
                          small, parse_parallel("tp=2,pp=2,dp=2,global_batch=4"), cost, coupled_rings=coupled)
    if what == "sim":
        from marssim.sim import simulate_summary
        simulate_summary(tiny, small, memory_policy="ignore")
    elif what == "estimate":
        from marssim.analytical import estimate
        estimate(tiny, small)
    out = {}
    w0, c0 = time.perf_counter(), cpu()
    system, graph = load_system(system_spec), load_workload(workload_spec)
    cfg = parse_parallel(config)
    design = system.designs[system.accelerators[0].designs[0]]
    cost.op_time(next(op for op in graph.ops if op.kind.value == "gemm"), design)
    out["load_s"] = time.perf_counter() - w0
    w1, c1 = time.perf_counter(), cpu()
    try:
        tg = lower_parallel(graph, system, cfg, cost, coupled_rings=coupled)
    except InputError as err:
        out["refused"] = str(err)
        out["wall_s"] = time.perf_counter() - w1
        out["cpu_s"] = cpu() - c1
        out["rss_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        print(json.dumps(out))
        sys.exit(0)
    out["lower_s"] = time.perf_counter() - w1
    out["tasks"] = int(tg.n_tasks)
    out["classes"] = int(tg.meta.get("fold_classes", 0))
    if what == "sim":
        summary = simulate_summary(tg, system, memory_policy="ignore")
        out["iteration_s"] = summary.makespan
    elif what == "estimate":
        est = estimate(tg, system)
        out["iteration_s"] = est.makespan
    else:
        from marssim.parallel.analytic import screen
        reps = 20
        screen(graph, system, cfg, cost)
        t = time.perf_counter()
        each = []
        for _ in range(reps):
            tc = time.process_time()  # CPU time of the process, to the ns
            s = screen(graph, system, cfg, cost)
            each.append(time.process_time() - tc)
        out["screen_wall_ms"] = (time.perf_counter() - t) / reps * 1e3
        out["screen_mean_ms"] = sum(each) / reps * 1e3  # CPU time (user + sys)
        out["screen_ms"] = sorted(each)[reps // 2] * 1e3  # the median call: a spike of the machine moves the mean
        out["iteration_s"] = s.iteration_s
    out["wall_s"] = time.perf_counter() - w1
    out["cpu_s"] = cpu() - c1
    out["rss_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(json.dumps(out))
""")


def child(case: dict, what: str) -> dict:
    """One measurement in a fresh single-threaded process pinned to one core, its address space
    capped at MEMORY_CAP."""
    env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", MKL_NUM_THREADS="1",
               NUMBA_NUM_THREADS="1", MARSSIM_MAX_BYTES=str(SIZE_BOUND))
    cmd = [sys.executable, "-c", _CHILD, case["system"], case["workload"], case["config"], what]
    if sys.platform.startswith("linux"):
        cmd = ["taskset", "-c", "0", "prlimit", f"--as={MEMORY_CAP}", *cmd]
    done = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if done.returncode != 0:
        tail = (done.stderr.strip().splitlines() or ["?"])[-1]
        return {"error": f"exit {done.returncode}: {tail[:300]}"}
    return json.loads(done.stdout.strip().splitlines()[-1])


def slope(x, y) -> float:
    return float(np.polyfit(np.log(x), np.log(y), 1)[0])


def table(rows: list[dict]) -> str:
    lines = []
    head = (f"{'model':<13}{'GPUs':>6}{'mb':>3} {'schedule':<12}{'recompute':<10}{'tasks':>12}{'classes':>8}"
            f"{'sim s':>8}{'cpu s':>8}{'RSS MiB':>8}{'est s':>7}{'cpu s':>7}{'RSS MiB':>8}{'screen ms':>10}"
            f"{'sim ms':>10}{'est ms':>10}")
    lines.append(head)
    for r in rows:
        sim, est, scr = r.get("sim", {}), r.get("estimate", {}), r.get("screen", {})
        prefix = (f"{r['model']:<13}{r['gpus']:>6}{r['micro']:>3} {r['schedule']:<12}{r['recompute']:<10}")
        refused = next((p for p in (sim, est) if "refused" in p), None)
        if refused is not None:
            lines.append(prefix + f"  refused after {refused['wall_s']:.1f} s, {refused['cpu_s']:.1f} s cpu "
                         f"({refused['rss_mib']:.0f} MiB): " + refused["refused"].split(": ", 1)[-1])
            continue
        if "error" in sim:
            lines.append(prefix + "  " + sim["error"])
            continue

        def f(d, key, fmt):
            return format(d[key], fmt) if key in d else "-"

        lines.append(prefix + f"{f(sim, 'tasks', ','):>12}{f(sim, 'classes', 'd'):>8}{f(sim, 'wall_s', '.1f'):>8}"
                     f"{f(sim, 'cpu_s', '.1f'):>8}{f(sim, 'rss_mib', '.0f'):>8}{f(est, 'wall_s', '.1f'):>7}"
                     f"{f(est, 'cpu_s', '.1f'):>7}{f(est, 'rss_mib', '.0f'):>8}{f(scr, 'screen_ms', '.1f'):>10}"
                     f"{sim.get('iteration_s', float('nan')) * 1e3:>10.1f}"
                     f"{est.get('iteration_s', float('nan')) * 1e3:>10.1f}")
    return "\n".join(lines)


def exponents(rows: list[dict]) -> str:
    ok = [r for r in rows if r["group"] == "narayanan" and "cpu_s" in r.get("sim", {}) and "refused" not in r["sim"]]
    if len(ok) < 3:
        return ""
    out = []
    for what in ("sim", "estimate"):
        sel = [r for r in ok if "cpu_s" in r.get(what, {})]
        if len(sel) < 3:
            continue
        cpu = [r[what]["cpu_s"] for r in sel]
        rss = [r[what]["rss_mib"] for r in sel]
        for var in ("gpus", "layers"):
            x = [r[var] for r in sel]
            out.append(f"{what}: CPU time ~ {var}^{slope(x, cpu):.2f}, peak RSS ~ {var}^{slope(x, rss):.2f}")
        tasks = [r["sim"]["tasks"] for r in sel]
        out.append(f"{what}: CPU time ~ tasks^{slope(tasks, cpu):.2f}, peak RSS ~ tasks^{slope(tasks, rss):.2f}")
        # micro-batches: the same model and schedule with micro-batch 1 (twice the micro-batches) and 2
        pairs = {}
        for r in sel:
            pairs.setdefault((r["model"], r["schedule"], r["recompute"]), {})[r["micro"]] = r
        ratios_t, ratios_m = [], []
        for p in pairs.values():
            if 1 in p and 2 in p:
                ratios_t.append(np.log(p[1][what]["cpu_s"] / p[2][what]["cpu_s"]) / np.log(2))
                ratios_m.append(np.log(p[1][what]["rss_mib"] / p[2][what]["rss_mib"]) / np.log(2))
        if ratios_t:
            out.append(f"{what}: doubling the micro-batches (micro-batch 2 -> 1): CPU time x2^{np.mean(ratios_t):.2f}, "
                       f"peak RSS x2^{np.mean(ratios_m):.2f} (mean over {len(ratios_t)} pairs)")
    return "\n".join(out)


def markdown(rows: list[dict]) -> str:
    """The two tables of README and docs/parallelism.md: per Table 1 model its micro-batch 2,
    1F1B, full-recomputation row and its slowest variant (simulation; estimate), then the ZeRO-3
    and the largest runs."""
    def ok(r, part):
        return part in r and "wall_s" in r[part] and "refused" not in r[part] and "error" not in r[part]

    lines = ["| model | GPUs | tasks | classes | simulate s | RSS MiB | estimate s | RSS MiB | screen ms | slowest of "
             "the 8 variants: simulate s / RSS MiB, estimate s / RSS MiB |", "|---|---|---|---|---|---|---|---|---|---|"]
    for name, *_ in NARAYANAN:
        mine = [r for r in rows if r.get("group") == "narayanan" and r["model"] == name and ok(r, "sim")]
        base = next((r for r in mine if (r["micro"], r["schedule"], r["recompute"]) == (2, "1f1b", "full")), None)
        if base is None or not ok(base, "estimate"):
            continue
        sim = max(mine, key=lambda r: r["sim"]["wall_s"])
        est = max((r for r in mine if ok(r, "estimate")), key=lambda r: r["estimate"]["wall_s"])
        lines.append(f"| {name} | {base['gpus']:,} | {base['sim']['tasks']:,} | {base['sim']['classes']} | "
                     f"{base['sim']['wall_s']:.1f} | {base['sim']['rss_mib']:.0f} | {base['estimate']['wall_s']:.1f} | "
                     f"{base['estimate']['rss_mib']:.0f} | {base['screen']['screen_ms']:.1f} | "
                     f"{sim['sim']['wall_s']:.1f} / {sim['sim']['rss_mib']:.0f}, "
                     f"{est['estimate']['wall_s']:.1f} / {est['estimate']['rss_mib']:.0f} |")
    lines += ["", "| ZeRO-3 and the largest runs | GPUs | tasks | classes | simulate s | RSS MiB | estimate s | RSS MiB "
              "| screen ms |", "|---|---|---|---|---|---|---|---|---|"]
    labels = {"llama3": "Llama-3 405B (tp 8, pp 16, dp 128, seq 8192), DGX H100",
              "gpt3-11616": "GPT-3 175B (tp 4, pp 6, interleaved 8, dp 484, sp, ZeRO-1), DGX H100"}
    for r in rows:
        if r.get("group") not in ("zero3", "llama3", "gpt3-11616") or not ok(r, "sim") or not ok(r, "estimate"):
            continue
        label = labels.get(r["group"], f"{r['model']} ZeRO-3, micro-batch {r['micro']}")
        lines.append(f"| {label} | {r['gpus']:,} | {r['sim']['tasks']:,} | {r['sim']['classes']} | "
                     f"{r['sim']['wall_s']:.1f} | {r['sim']['rss_mib']:.0f} | {r['estimate']['wall_s']:.1f} | "
                     f"{r['estimate']['rss_mib']:.0f} | {r['screen']['screen_ms']:.1f} |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--only", default="", help="run only the cases whose model or group contains this")
    ap.add_argument("--out", default=str(OUT))
    ap.add_argument("--table", action="store_true", help="print the table from --out without running")
    ap.add_argument("--markdown", action="store_true",
                    help="print README's and docs/parallelism.md's tables from --out without running")
    ap.add_argument("--parts", default="sim,estimate,screen",
                    help="what to measure (a configuration's other parts are kept from earlier runs in --out)")
    args = ap.parse_args()
    parts = args.parts.split(",")
    out = pathlib.Path(args.out)
    if not (args.table or args.markdown):
        with out.open("a") as f:
            f.write(json.dumps({"machine": f"{platform.machine()}, {os.cpu_count()} cores, Python "
                                           f"{platform.python_version()}, {platform.processor() or ''}"}) + "\n")
        for case in cases(args.quick):
            if args.only and args.only not in case["model"] and args.only not in case["group"]:
                continue
            row = dict(case)
            for part in parts:
                row[part] = child(case, part)
                if "refused" in row[part]:
                    break
            with out.open("a") as f:
                f.write(json.dumps(row) + "\n")
            print(table([row]).splitlines()[-1], flush=True)
    rows, machine = {}, ""
    for line in out.read_text().splitlines():
        r = json.loads(line)
        if "machine" in r:
            machine = r["machine"]
            continue
        key = (r["system"], r["workload"], r["config"])
        rows[key] = {**rows.get(key, {}), **r}  # each part from the latest run that measured it
    if args.markdown:
        print(markdown(list(rows.values())))
        return
    print(f"\nmachine: {machine}; every case in a fresh process pinned to one core")
    print(table(list(rows.values())))
    print("sim s / est s: wall time of lowering + simulation / + estimate (cpu s: user + sys), RSS: peak resident "
          "memory of the process; sim ms / est ms: the iteration time each gives")
    print(exponents(list(rows.values())))


if __name__ == "__main__":
    main()
