"""Benchmark: the command line against the engines, measured in one sitting.

``analysis/bench_cli.py`` times what a user runs and sets beside it the in-process figures of
``analysis/bench_megatron_scale.py`` from that benchmark's own (earlier) run; on a shared machine
the two runs' loads differ. This one measures both for the Megatron-scale rows whose ratio is
asked (CLI at most twice the in-process figure; the largest estimates within 3 CPU s and 0.6 GiB),
row after row, so that each ratio compares figures of the same minutes: per row, the in-process
child of ``bench_megatron_scale`` (lowering + simulation or estimate after imports, the cost
model's fit and compilation; pinned to one core) and the command line as ``bench_cli`` runs it (a
fresh ``python -m marssim`` process from an empty directory, warm cache folder and bytecode; the
lower of two runs, after one unmeasured run). CPU s = user + sys; RSS = peak resident memory.

Usage: ``python analysis/bench_cli_ratio.py [--only LABEL|LABEL] [--out FILE]`` (default
``analysis/results/bench_cli_ratio.txt``; ``--out -`` prints only).
"""

from __future__ import annotations

import argparse
import os
import pathlib
import sys
import tempfile

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import bench_cli  # noqa: E402
import bench_megatron_scale  # noqa: E402

OUT = HERE / "results" / "bench_cli_ratio.txt"


def _narayanan(model: str, micro: int):
    return lambda c: (c["group"] == "narayanan" and c["model"] == model and c["micro"] == micro
                      and c["schedule"] == "1f1b" and c["recompute"] == "full")


ROWS = [  # label, which case, what is measured (bench_megatron_scale's parts)
    ("1.7B 32 GPUs mb 2", _narayanan("1.7B", 2), ("sim", "estimate")),
    ("145.6B 1,536 GPUs mb 2", _narayanan("145.6B", 2), ("sim", "estimate")),
    ("529.6B 2,520 GPUs mb 2", _narayanan("529.6B", 2), ("estimate",)),
    ("1008B 3,072 GPUs mb 1", _narayanan("1008B", 1), ("sim", "estimate")),
    ("1008B 3,072 GPUs mb 2", _narayanan("1008B", 2), ("estimate",)),
    ("529.6B 2,560 GPUs mb 1 ZeRO-3", lambda c: c["group"] == "zero3" and c["gpus"] == 2560, ("sim",)),
    ("Llama-3 405B 16,384 GPUs", lambda c: c["group"] == "llama3", ("sim",)),
    ("GPT-3 175B 11,616 GPUs", lambda c: c["group"] == "gpt3-11616", ("sim",)),
]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", help="only the rows whose label contains TEXT (alternatives separated by |)")
    ap.add_argument("--out", default=str(OUT))
    args = ap.parse_args()
    cases = bench_megatron_scale.cases(False)
    lines = []
    header = (f"{'row':<32} {'verb':<9} {'in-process s':>12} {'MiB':>6} {'CLI s':>7} {'MiB':>6} "
              f"{'CLI / in-process':>17}")
    print(header, flush=True)
    with tempfile.TemporaryDirectory(prefix="marssim-bench-ratio-") as tmp:
        cache, work = os.path.join(tmp, "cache"), os.path.join(tmp, "work")
        os.makedirs(work)
        env = bench_cli.child_environment(cache)
        os.environ.update(MARSSIM_CACHE_DIR=cache, NUMBA_CACHE_DIR=os.path.join(cache, "numba"))  # the children
        for argv in bench_cli.prime():
            bench_cli.run_child(argv, env, work)
        for label, match, parts in ROWS:
            if args.only and not any(part in label for part in args.only.split("|")):
                continue
            case = next(c for c in cases if match(c))
            fits = case["group"] == "narayanan"  # as both benchmarks run them: the others do not fit 80 GiB
            for part in parts:
                verb = "simulate" if part == "sim" else "estimate"
                argv = [verb, "--system", case["system"], "--workload", case["workload"], "--parallel",
                        case["config"], *(() if fits else ("--memory-policy", "ignore"))]
                bench_cli.run_child(argv, env, work)  # its own warm-up
                inproc = bench_megatron_scale.child(case, part)
                cli = min((bench_cli.run_child(argv, env, work) for _ in range(2)), key=lambda r: r["cpu_s"])
                if "error" in cli or "cpu_s" not in inproc:
                    line = f"{label:<32} {verb:<9} failed: {cli.get('error') or inproc.get('error')}"
                else:
                    line = (f"{label:<32} {verb:<9} {inproc['cpu_s']:12.2f} {inproc['rss_mib']:6.0f} "
                            f"{cli['cpu_s']:7.2f} {cli['rss_mib']:6.0f} {cli['cpu_s'] / inproc['cpu_s']:16.2f}x")
                lines.append(line)
                print(line, flush=True)
    text = ("bench_cli_ratio: the command line (fresh process, warm cache folder) against the in-process engines "
            "(bench_megatron_scale's child), row after row in one sitting; CPU s = user + sys, MiB = peak RSS\n"
            f"Machine: {bench_cli.machine()}\n\n" + header + "\n" + "\n".join(lines) + "\n")
    if args.out != "-":
        pathlib.Path(args.out).write_text(text)


if __name__ == "__main__":
    main()
