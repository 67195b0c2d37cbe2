"""How much freedom the SIP legality model leaves in the test kernels (CPU only).

For each test cubin: instructions, basic blocks, memory instructions, legal adjacent swaps and
legal SIP moves in the compiler's order, the rules that refuse the other swaps, and how far a
random walk of legal SIP moves gets (instructions displaced after 700 moves, the paper's run
length). Also times the legality check. Prints a table; the latest output is committed in
analysis/results/sip_legality.txt.

    PYTHONPATH=. python analysis/sip_legality.py
"""

from __future__ import annotations

import os
import platform
import random
import time
from collections import Counter
from pathlib import Path

from marssim.calibrate.sip.cubin import read_cubin
from marssim.calibrate.sip.deps import Legality
from marssim.calibrate.sip.perturb import apply_swap, legal_swaps, random_move, sip_moves
from marssim.calibrate.sip.sass import disassemble, nvdisasm_version

DATA = Path(__file__).resolve().parent.parent / "tests" / "data" / "sip"


def main() -> None:
    print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores; {nvdisasm_version()}")
    header = (f"{'cubin[:kernel]':30s} {'arch':7s} {'insns':>5s} {'blocks':>6s} {'mem':>4s} {'swaps':>5s} {'sip':>4s} "
              f"{'displaced@700':>13s} {'us/check':>8s}  refused by rule")
    print(header)
    print("-" * len(header))
    for path in sorted(DATA.glob("*.cubin")):
        cubin = read_cubin(path)
        for name, lst in disassemble(cubin).items():
            lg = Legality(lst)
            order = tuple(range(len(lst)))
            t = time.perf_counter()
            verdicts = [lg.check(order, p) for p in range(len(lst) - 1)]
            per_check = (time.perf_counter() - t) / max(1, len(verdicts)) * 1e6
            reasons = Counter(v.reason for v in verdicts if not v)
            swaps = len(legal_swaps(lg, order))
            moves = len(sip_moves(lg, order))
            rng = random.Random(0)
            walk = order
            for _ in range(700):
                m = random_move(rng, lg, walk, "sip")
                if m is None:
                    break
                walk = apply_swap(walk, m.pos)
            displaced = sum(1 for s, i in enumerate(walk) if s != i)
            mem = sum(1 for i in lst.instructions if i.mem is not None)
            top = ", ".join(f"{r} {n}" for r, n in reasons.most_common())
            label = path.name if len(cubin.kernels) == 1 else f"{path.name}:{name}"
            print(f"{label:30s} {cubin.arch:7s} {len(lst):5d} {len(lst.blocks):6d} {mem:4d} {swaps:5d} {moves:4d} "
                  f"{displaced:13d} {per_check:8.1f}  {top}")


if __name__ == "__main__":
    main()
