"""Benchmark: the command line as a user runs it.

The other benchmarks of ``analysis/`` time the engines in-process, after the imports, the cost
model's table fit and the numba compilation. This one runs ``python -m marssim VERB ...`` in a
fresh process, from an empty directory outside the checkout, and reports what the user pays:
the child's CPU time (user + sys, from ``wait4``) and its peak RSS.

*Warm*: a cache folder (numba's and marssim's) filled first by four unmeasured runs (the
compiled simulator, the estimate's kernels, the A100 and H100 fits; ``--no-prime``: each case run
once before instead), and the bytecode of marssim's modules that Python wrote then.
*Cold* (the quick cases and the 1008B simulation): an empty cache folder and no bytecode of
marssim's modules, as on the first run after ``pip install -e .``. The children write bytecode
as a user's Python does, whatever ``PYTHONDONTWRITEBYTECODE`` says here (:func:`child_environment`). Beside them
the in-process figures of ``analysis/bench_megatron_scale.py`` (``results/bench_megatron_scale.jsonl``:
lowering + simulation or estimate, CPU s and peak RSS of the process) where the case is one of
its configurations.

The cases: the verbs of the README's tour (``--version``, ``--help``, ``systems``, ``workloads``,
``show``, ``cost``, a mapping simulated and estimated, a 2-layer GPT on 8 GPUs, the README's LLM
runs, ``serve`` of 10,000 requests, ``search`` of GPT-3 175B on 1,024 A100 with 2 workers) and the
Megatron-scale rows (Narayanan et al. 2021 Table 1 at micro-batch 2, 1F1B, full recomputation,
the 1008B run at micro-batch 1, the ZeRO-3 rows of its Table 2, and the two runs of over 10,000
GPUs), ``simulate`` and ``estimate``.

Usage: ``python analysis/bench_cli.py [--quick] [--only TEXT] [--cold all|quick|none] [--out FILE]``;
``--quick`` runs a subset of a few minutes (start-up verbs, the 2-layer GPT, 145.6B simulate and
estimate; cold runs by default for those only). The table is printed and written to ``--out`` (default
``analysis/results/bench_cli.txt``; ``--out -`` prints only).
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import platform
import shutil
import subprocess
import sys
import tempfile
import time

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parent
OUT = HERE / "results" / "bench_cli.txt"
INPROC = HERE / "results" / "bench_megatron_scale.jsonl"
MEMORY_CAP = 16 * 2**30

sys.path.insert(0, str(HERE))
from bench_megatron_scale import cases as megatron_cases  # noqa: E402

TINY = ["simulate", "--system", "dgx-a100-cluster:nodes=1", "--workload",
        "gpt:layers=2,hidden=256,heads=4,vocab=1000,seq=64,mode=train,max_positions=64",
        "--parallel", "tp=2,pp=2,dp=2,global_batch=4"]
MAPPING = "topologies/mappings/mars-adaptive-16-resnet50.yaml"  # as README writes it (found from any directory)
LLAMA70 = ["--system", "dgx-h100-cluster:nodes=16", "--workload", "llama3-70b:mode=train,seq=4096",
           "--parallel", "tp=8,pp=2,dp=8,sp=true,recompute=full,zero=1,global_batch=64"]


def tour() -> list[dict]:
    """The README tour's verbs (the long searches and comparisons excepted, see ``heavy``)."""
    c = [
        dict(name="--version", argv=["--version"], quick=True),
        dict(name="--help", argv=["--help"], quick=True),
        dict(name="systems", argv=["systems"], quick=True),
        dict(name="workloads", argv=["workloads"], quick=True),
        dict(name="show mars-adaptive-16", argv=["show", "mars-adaptive-16"]),
        dict(name="show gpt3-175b train", argv=["show", "gpt3-175b:mode=train,batch=1"]),
        dict(name="cost resnet50 mars-adaptive-16", argv=["cost", "resnet50:batch=8", "--system", "mars-adaptive-16"]),
        dict(name="simulate mapping resnet50 --out --trace --plot",
             argv=["simulate", "--mapping", MAPPING, "--out", "run/", "--trace", "run/trace.json.gz",
                   "--plot", "run/timeline.png"]),
        dict(name="estimate mapping resnet50 --per-op", argv=["estimate", "--mapping", MAPPING, "--per-op"]),
        dict(name="simulate gpt2 dgx-h100", argv=["simulate", "--system", "dgx-h100", "--workload",
                                                  "gpt2:batch=8,seq=1024"]),
        dict(name="simulate 2-layer GPT on 8 GPUs", argv=TINY, quick=True),
        dict(name="simulate llama3-70b 128 H100 --plot", argv=["simulate", *LLAMA70, "--plot", "run/llm.png"]),
        dict(name="estimate llama3-70b 128 H100", argv=["estimate", *LLAMA70]),
        dict(name="simulate llama3-70b 128 H100 --estimate", argv=["simulate", *LLAMA70, "--estimate"]),
        dict(name="trace run/ (re-export)", argv=["trace", "run/", "--trace", "run/t2.json", "--intervals",
                                                  "run/intervals.csv", "--plot", "run/fig.png"]),
    ]
    return c


def heavy() -> list[dict]:
    """The long verbs: serving the shipped Azure conversation trace (5,000 requests) and searching GPT-3 175B on 1,024 A100."""
    return [
        dict(name="serve 5,000 requests (the whole trace), 16 x 70B tp 4",
             argv=["serve", "--system", "dgx-h100-cluster:nodes=8", "--model", "llama3-70b", "--pool",
                   "replicas=16,tp=4", "--replay", "azure-conv-2023", "--requests", "5000", "--rate", "20",
                   "--slo", "ttft=2s,tpot=100ms"]),
        dict(name="search GPT-3 175B 1,024 A100, 2 workers, --out",
             argv=["search", "--system", "dgx-a100-cluster:nodes=128", "--workload",
                   "gpt3-175b:mode=train,seq=2048,batch=1", "--global-batch", "1536", "--workers", "2",
                   "--out", "search/"]),
    ]


def prime() -> list[list[str]]:
    """Runs that fill the warm cache before the warm figures (not measured): the compiled
    simulator (a run too large for SimPy), the estimate's kernels, the A100 and H100 fits."""
    big = next(c for c in megatron_cases(quick=True) if c["model"] == "529.6B")
    return [["simulate", "--system", big["system"], "--workload", big["workload"], "--parallel", big["config"]],
            ["estimate", "--system", big["system"], "--workload", big["workload"], "--parallel", big["config"]],
            ["estimate", *LLAMA70], ["estimate", "--mapping", MAPPING]]


def megatron(quick: bool) -> list[dict]:
    """The Megatron-scale rows of README (micro-batch 2, 1F1B, full recomputation for Table 1;
    the 1008B run at micro-batch 1; Table 2; the two largest), simulate and estimate."""
    chosen = []
    for c in megatron_cases(quick=False):
        base = c["group"] == "narayanan" and c["micro"] == 2 and c["schedule"] == "1f1b" and c["recompute"] == "full"
        big = c["group"] == "narayanan" and c["model"] == "1008B" and c["micro"] == 1 and c["schedule"] == "1f1b" \
            and c["recompute"] == "full"
        if base or big or c["group"] in ("zero3", "llama3", "gpt3-11616"):
            chosen.append(c)
    out = []
    for c in chosen:
        label = f"{c['model']} {c['gpus']:,} GPUs mb {c['micro']}" + (" ZeRO-3" if c["group"] == "zero3" else "")
        # as analysis/bench_megatron_scale.py runs them: memory not checked (ZeRO-3 and the largest runs do not fit
        # 80 GiB); the estimate verb checks it, so those are estimated only where they fit
        fits = c["group"] == "narayanan"
        for verb in (("simulate", "estimate") if fits else ("simulate",)):
            q = quick and c["model"] == "145.6B" and c["group"] == "narayanan"
            compiles = verb == "simulate" and c["model"] == "1008B" and c["micro"] == 1  # too big for SimPy
            out.append(dict(name=f"{verb} {label}", quick=q, cold=compiles, megatron=c,
                            inproc="sim" if verb == "simulate" else "estimate",
                            argv=[verb, "--system", c["system"], "--workload", c["workload"], "--parallel",
                                  c["config"], *(() if fits else ("--memory-policy", "ignore"))]))
    return out


def inproc_figures() -> dict:
    rows = {}
    if INPROC.exists():
        for line in INPROC.read_text().splitlines():
            r = json.loads(line)
            if "system" not in r:  # the machine's line
                continue
            rows.setdefault((r["system"], r["workload"], r["config"]), {}).update(
                {k: v for k, v in r.items() if isinstance(v, dict) and "cpu_s" in v})
    return rows


def child_environment(cache: str) -> dict:
    """The environment of a measured child: this one's, one thread per library, the numba and
    marssim caches in ``cache``, and Python writing its bytecode as a user's does (an environment
    with ``PYTHONDONTWRITEBYTECODE`` would compile every marssim module from source in every
    process, a cost no default Python has after its first run)."""
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1",
               MKL_NUM_THREADS="1", NUMBA_NUM_THREADS="1", MPLBACKEND="Agg",
               NUMBA_CACHE_DIR=os.path.join(cache, "numba"), MARSSIM_CACHE_DIR=cache, XDG_CACHE_HOME=cache)
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    return env


def forget_bytecode() -> None:
    """Delete the compiled bytecode of marssim's modules in the checkout (as after ``pip install -e .``,
    which compiles nothing: the first run compiles them)."""
    for f in (ROOT / "marssim").rglob("__pycache__/*.pyc"):
        f.unlink(missing_ok=True)


def run_child(argv: list[str], env: dict, cwd: str) -> dict:
    """``python -m marssim *argv`` in a fresh process; its CPU s (user + sys), peak RSS, status."""
    cmd = [sys.executable, "-m", "marssim", *argv]
    if sys.platform.startswith("linux") and shutil.which("prlimit"):
        cmd = ["prlimit", f"--as={MEMORY_CAP}", *cmd]
    t = time.perf_counter()
    with open(os.path.join(cwd, "stdout.txt"), "w") as out, open(os.path.join(cwd, "stderr.txt"), "w") as err:
        proc = subprocess.Popen(cmd, env=env, cwd=cwd, stdout=out, stderr=err)
        _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)
    wall = time.perf_counter() - t
    res = dict(cpu_s=usage.ru_utime + usage.ru_stime, rss_mib=usage.ru_maxrss / 1024, wall_s=wall,
               rc=proc.returncode)
    if proc.returncode != 0:
        tail = pathlib.Path(cwd, "stderr.txt").read_text().strip().splitlines() or ["?"]
        res["error"] = tail[-1][:200]
    return res


def machine() -> str:
    import importlib.util

    cpu = platform.processor() or platform.machine()
    try:
        cpu = next(line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    numba = "numba installed" if importlib.util.find_spec("numba") else "no numba"
    return (f"{platform.system()} {platform.machine()}, {cpu}, {os.cpu_count()} cores, Python "
            f"{platform.python_version()}, {numba}")


def fmt_table(rows: list[dict], cold: bool) -> str:
    head = f"{'what a user runs':<52}"
    if cold:
        head += f"{'cold cpu s':>11}{'RSS MiB':>9}"
    head += f"{'warm cpu s':>11}{'RSS MiB':>9}{'in-process cpu s':>17}{'RSS MiB':>9}"
    lines = [head, "-" * len(head)]
    for r in rows:
        line = f"{r['name']:<52}"
        parts = (("cold", "warm") if cold else ("warm",))
        for part in parts:
            m = r.get(part)
            if m is None:
                line += f"{'-':>11}{'-':>9}"
            elif "error" in m:
                line += f"{'exit ' + str(m['rc']):>11}{m['rss_mib']:>9.0f}"
            else:
                line += f"{m['cpu_s']:>11.2f}{m['rss_mib']:>9.0f}"
        ip = r.get("inproc_fig")
        line += (f"{ip['cpu_s']:>17.2f}{ip['rss_mib']:>9.0f}" if ip else f"{'':>17}{'':>9}")
        lines.append(line)
    errors = [f"  {r['name']}: {m['error']}" for r in rows for m in (r.get("cold"), r.get("warm"))
              if m and "error" in m]
    if errors:
        lines += ["", "errors:", *errors]
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="start-up verbs, the 2-layer GPT, 145.6B only")
    ap.add_argument("--only", help="only the cases whose name contains TEXT (alternatives separated by |)")
    ap.add_argument("--cold", choices=("all", "quick", "none"), default="quick",
                    help="which cases also run cold (default: those of --quick)")
    ap.add_argument("--no-heavy", dest="heavy", action="store_false", help="without serve and search")
    ap.add_argument("--no-prime", dest="prime", action="store_false",
                    help="warm each case by running it once before (instead of four priming runs)")
    ap.add_argument("--out", default=str(OUT))
    args = ap.parse_args()

    cases = tour() + megatron(args.quick) + (heavy() if args.heavy else [])
    if args.quick:
        cases = [c for c in cases if c.get("quick")]
    if args.only:
        cases = [c for c in cases if any(part in c["name"] for part in args.only.split("|"))]
    figures = inproc_figures()
    with tempfile.TemporaryDirectory(prefix="marssim-bench-cli-") as tmp:
        warm_cache, cold_cache = os.path.join(tmp, "warm"), os.path.join(tmp, "cold")
        work = os.path.join(tmp, "work")
        os.makedirs(work, exist_ok=True)
        if args.prime:
            for argv in prime():
                run_child(argv, child_environment(warm_cache), work)
        rows = []
        for case in cases:
            row = dict(name=case["name"])
            if args.cold == "all" or (args.cold == "quick" and (case.get("quick") or case.get("cold"))):
                shutil.rmtree(cold_cache, ignore_errors=True)  # the first run after installing
                forget_bytecode()
                row["cold"] = run_child(case["argv"], child_environment(cold_cache), work)
            if not args.prime:  # its own warm-up
                run_child(case["argv"], child_environment(warm_cache), work)
            row["warm"] = run_child(case["argv"], child_environment(warm_cache), work)
            if "megatron" in case:
                c = case["megatron"]
                ip = figures.get((c["system"], c["workload"], c["config"]), {}).get(case["inproc"])
                if ip and "cpu_s" in ip:
                    row["inproc_fig"] = ip
            rows.append(row)
            print(fmt_table([row], args.cold != "none").splitlines()[-1], flush=True)
    text = (f"marssim command line, each run a fresh `python -m marssim` process from an empty directory outside "
            f"the checkout;\nCPU s = user + sys of the child, RSS = its peak; cold = empty numba and marssim cache "
            f"folders and no compiled bytecode of marssim's modules\n(as after `pip install -e .`), warm = a filled "
            f"cache folder and the bytecode Python wrote on an earlier run (PYTHONDONTWRITEBYTECODE\nunset). "
            f"In-process: analysis/bench_megatron_scale.py (lowering + simulation or estimate, after imports, fit and "
            f"compilation).\nMachine: {machine()}\n\n"
            + fmt_table(rows, args.cold != "none") + "\n")
    print()
    print(text)
    if args.out != "-":
        pathlib.Path(args.out).write_text(text)


if __name__ == "__main__":
    main()
