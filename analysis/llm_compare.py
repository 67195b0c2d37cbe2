"""Llama 3 70B training (FP8, Transformer Engine's recipe; sequence 8,192; 72 sequences per
iteration) on 72 GPUs of each system LLM teams choose between in 2026 -- DGX H100, DGX H200, DGX
B200 (nine nodes of 8) and one GB200 NVL72 rack -- each searched with ``marssim compare``: the
Megatron grid of uniform configurations (context parallelism and every overlap setting included,
the overlaps on wherever they apply) and the two-level search seeded with its best, both on
simulated iteration times; then one table of each system's winning configuration.

These are predictions from the systems' files (datasheet figures, each with its source) and the
H100's measured kernel table where it has a row (bf16 kernels; FP8 GEMMs and the other GPUs by
the analytical roofline at their datasheet peaks); no constant is fitted to any end-to-end
figure.

Usage: ``python analysis/llm_compare.py [--gpus 72] [--budget 12]``; writes
``analysis/results/llm_compare.txt`` (the CLI's output, the command, the machine, wall and CPU
time).
"""

from __future__ import annotations

import argparse
import os
import platform
import resource
import subprocess
import sys
import time
from pathlib import Path

SYSTEMS = ("dgx-h100-cluster:nodes={nodes}", "dgx-h200-cluster:nodes={nodes}", "dgx-b200-cluster:nodes={nodes}",
           "gb200-nvl72:racks={racks}")
WORKLOAD = "llama3-70b:mode=train,seq=8192,dtype=fp8,attention=cudnn"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--gpus", type=int, default=72, help="a multiple of 72 (default 72)")
    parser.add_argument("--global-batch", type=int, default=72)
    parser.add_argument("--budget", type=int, default=12, help="simulations per search (default 12)")
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--out", default=str(Path(__file__).parent / "results" / "llm_compare.txt"))
    args = parser.parse_args()
    specs = [s.format(nodes=args.gpus // 8, racks=args.gpus // 72) for s in SYSTEMS]
    command = [sys.executable, "-m", "marssim", "compare", "--system", specs[0]]
    for spec in specs[1:]:
        command += ["--also-system", spec]
    command += ["--workload", WORKLOAD, "--global-batch", str(args.global_batch), "--budget", str(args.budget),
                "--workers", str(args.workers), "--quiet"]
    wall = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, env={**os.environ, "PYTHONHASHSEED": "0"})
    wall = time.perf_counter() - wall
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = usage.ru_utime + usage.ru_stime
    if done.returncode:
        sys.stderr.write(done.stderr)
        raise SystemExit(done.returncode)
    text = [f"$ marssim {' '.join(command[3:])}", "",
            done.stdout.rstrip(), "",
            f"machine: {platform.machine()}, {os.cpu_count()} CPUs (shared), Python {platform.python_version()}; "
            f"wall {wall:.0f} s, CPU {cpu:.0f} s"]
    Path(args.out).write_text("\n".join(text) + "\n")
    print("\n".join(text))


if __name__ == "__main__":
    main()
