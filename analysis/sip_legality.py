"""How much freedom the SIP legality model leaves in the test kernels, and why it refuses the
rest (CPU only).

For each test cubin and each legality setting -- ``before`` (the 6-cycle latency table alone:
the model the H100 results were tuned and verified under), ``default`` (the table raised to
the distances ptxas keeps repeatedly, e.g. 13 cycles from a compare to the instruction its
predicate guards), and the widenings not yet verified on a GPU (``latency=observed``,
``reuse=clear``, ``commit_group``, ``all``) -- the legal adjacent swaps and legal SIP moves in
the compiler's order and how far a random walk of legal SIP moves gets (instructions displaced
after 700 moves, the paper's run length), with the time per legality check. Then, per kernel,
the SIP moves (a memory instruction one slot up or down) each rule refuses: ``any`` counts a
move under every rule that refuses it, ``sole`` only the moves that rule alone refuses (what
lifting it would gain). Prints tables; the latest output is committed in
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
from marssim.calibrate.sip.deps import RULES, Legality, LegalityOptions
from marssim.calibrate.sip.perturb import apply_swap, legal_swaps, random_move, sip_move_reasons, sip_moves
from marssim.calibrate.sip.sass import disassemble, nvdisasm_version

DATA = Path(__file__).resolve().parent.parent / "tests" / "data" / "sip"
SETTINGS = {
    "before": LegalityOptions(latency="table-only"),
    "default": LegalityOptions(),
    "latency=observed": LegalityOptions(latency="observed"),
    "reuse=clear": LegalityOptions(reuse="clear"),
    "commit_group": LegalityOptions(commit_group=True),
    "all": LegalityOptions("observed", "clear", True),
}
PAPER_KERNELS = ("gemm_leaky_relu", "attention_fwd")


def walk(lg: Legality, n: int, steps: int = 700) -> int:
    rng = random.Random(0)
    order = tuple(range(n))
    for _ in range(steps):
        m = random_move(rng, lg, order, "sip")
        if m is None:
            break
        order = apply_swap(order, m.pos)
    return sum(1 for s, i in enumerate(order) if s != i)


def main() -> None:
    print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores; {nvdisasm_version()}")
    kernels = []
    for path in sorted(DATA.glob("*.cubin")):
        cubin = read_cubin(path)
        for name, lst in disassemble(cubin).items():
            label = path.name if len(cubin.kernels) == 1 else f"{path.name}:{name}"
            kernels.append((label, cubin.arch, lst))

    print("\nLegal moves in the compiler's order per setting: adjacent swaps / SIP moves / instructions displaced by "
          "700 random legal SIP moves")
    header = f"{'cubin[:kernel]':36s} {'arch':6s} {'insns':>5s} {'mem':>4s} " + " ".join(
        f"{s:>17s}" for s in SETTINGS) + f" {'us/check':>8s}"
    print(header)
    print("-" * len(header))
    for label, arch, lst in kernels:
        cells = []
        order = tuple(range(len(lst)))
        per_check = 0.0
        for setting, options in SETTINGS.items():
            lg = Legality(lst, options)
            t = time.perf_counter()
            swaps = len(legal_swaps(lg, order))
            if setting == "default":
                per_check = (time.perf_counter() - t) / max(1, len(lst) - 1) * 1e6
            cells.append(f"{swaps:5d}/{len(sip_moves(lg, order)):3d}/{walk(lg, len(lst)):4d}".rjust(17))
        mem = sum(1 for i in lst.instructions if i.mem is not None)
        print(f"{label:36s} {arch:6s} {len(lst):5d} {mem:4d} " + " ".join(cells) + f" {per_check:8.1f}")

    print("\nSIP moves refused per rule (any: refused by that rule among others; sole: by that rule alone), "
          "paper kernels")
    shown = ("before", "default", "all")
    for label, arch, lst in kernels:
        if not label.startswith(PAPER_KERNELS):
            continue
        order = tuple(range(len(lst)))
        counts = {}
        for setting in shown:
            refused = sip_move_reasons(Legality(lst, SETTINGS[setting]), order)
            counts[setting] = (len(refused), Counter(r for rules in refused for r in rules),
                               Counter(rules[0] for rules in refused if len(rules) == 1))
        total = len(sip_moves(Legality(lst, SETTINGS["before"]), order)) + counts["before"][0]
        print(f"\n{label} ({arch}): {total} candidate SIP moves; refused "
              + ", ".join(f"{s} {counts[s][0]}" for s in shown))
        print(f"  {'rule':11s} " + " ".join(f"{s + ' any':>12s} {s + ' sole':>13s}" for s in shown))
        for rule in RULES:
            if not any(counts[s][1][rule] for s in shown):
                continue
            print(f"  {rule:11s} " + " ".join(f"{counts[s][1][rule]:12d} {counts[s][2][rule]:13d}" for s in shown))


if __name__ == "__main__":
    main()
