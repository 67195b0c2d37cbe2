"""marssim's systolic memory model against SCALE-Sim 3.0.0 on the committed reference grid.

Reads ``tests/data/scalesim/reference.csv`` (SCALE-Sim as released) and, when present,
``reference_repaired.csv`` (the same grid with SCALE-Sim's read buffers repaired: they seek to
what they need instead of going round the whole operand, keep the end of the half they leave and
charge a slide for what it advances; see that directory's README), times every row with
marssim under ``convention: scalesim`` (and, for comparison, the default ``marssim``
convention), and prints the errors the targets are stated in: total cycles (SCALE-Sim's "Total
Cycles (incl. prefetch)"), DRAM bytes (reads + writes of the three buffers) and the order of
the three dataflows by cycles per (layer, SRAM, bandwidth).

    PYTHONPATH=$PWD python analysis/scalesim_check.py      # output: analysis/results/scalesim_check.txt
"""

from __future__ import annotations

import os
import platform
import sys
from pathlib import Path

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "tests" / "data" / "scalesim"
sys.path.insert(0, str(ROOT / "tests"))

from scalesim_support import KEYS, marssim_columns, order_agreement, untouched  # noqa: E402


def stats(err: np.ndarray) -> str:
    a = np.abs(err)
    return (f"median {100 * np.median(a):5.1f}%  p90 {100 * np.quantile(a, 0.9):5.1f}%  max {100 * a.max():6.1f}%  "
            f"mean signed {100 * np.mean(err):+6.1f}%")


def report(name: str, ref: pd.DataFrame, lines: list[str]) -> None:
    lines.append(f"== {name}: {len(ref)} runs, {ref['layer'].nunique()} layers")
    ref = ref.reset_index(drop=True)
    for convention in ("scalesim", "marssim"):
        m = marssim_columns(ref, convention)
        cyc = m["cycles"] / ref["cycles_incl_prefetch"] - 1
        dram = m["dram_bytes"] / ref["dram_bytes"] - 1
        lines.append(f"  marssim convention {convention}:")
        lines.append(f"    cycles     all  {stats(cyc.to_numpy())}")
        lines.append(f"    DRAM bytes all  {stats(dram.to_numpy())}")
        agree, total = order_agreement(ref, m)
        lines.append(f"    order of os/ws/is by cycles equal to SCALE-Sim's: {agree}/{total} "
                     f"({100 * agree / max(total, 1):.0f}%) of (layer, SRAM, bandwidth) cases")
        if convention == "scalesim":
            by_df = []
            for df in ("os", "ws", "is"):
                sel = ref["dataflow"] == df
                by_df.append(f"{df}: cycles median {100 * np.median(np.abs(cyc[sel])):.1f}% / DRAM median "
                             f"{100 * np.median(np.abs(dram[sel])):.1f}%")
            lines.append("    by dataflow: " + "; ".join(by_df))
            worst = (cyc.abs()).sort_values(ascending=False).index[:8]
            lines.append("    largest cycle errors:")
            for i in worst:
                r = ref.loc[i]
                lines.append(f"      {r['layer']:<24} {r['dataflow']} {r['sram_kb']:>3} KB {r['bandwidth']:>2} B/cycle: "
                             f"SCALE-Sim {r['cycles_incl_prefetch']:>9,} marssim {m['cycles'][i]:>11,.0f} "
                             f"({100 * cyc[i]:+.0f}%); DRAM {r['dram_bytes']:>10,} vs {m['dram_bytes'][i]:>12,.0f}; "
                             f"wrap slides {r['ifmap_wrap_slides'] + r['filter_wrap_slides']}")
    lines.append("")


def main() -> None:
    machine = f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}"
    lines = [f"scalesim_check: marssim vs SCALE-Sim 3.0.0 ({machine})", ""]
    from scalesim_support import load_reference

    stock = load_reference(DATA / "reference.csv")
    report("SCALE-Sim 3.0.0 as released (reference.csv)", stock, lines)
    wraps = (stock["ifmap_wrap_slides"] + stock["filter_wrap_slides"]) > 0
    extra = (stock["ifmap_wrap_slides"] * stock["ifmap_slide_words"]
             + stock["filter_wrap_slides"] * stock["filter_slide_words"])
    lines.append(f"SCALE-Sim's read buffers slid while the address they needed lay outside their next window (and "
                 f"went round the operand) in {wraps.sum()} of {len(stock)} runs; there the words those slides fetched "
                 f"are {100 * (extra / stock['dram_bytes'])[wraps].median():.0f}% (median) and up to "
                 f"{100 * (extra / stock['dram_bytes']).max():.0f}% of its DRAM bytes")
    lines.append("")
    path = DATA / "reference_repaired.csv"
    if path.exists():
        repaired = load_reference(path)
        report("SCALE-Sim with repaired read buffers (reference_repaired.csv)", repaired, lines)
        both = stock.merge(repaired, on=KEYS, suffixes=("", "_rep"))
        same = untouched(stock, repaired)
        changed = ~same
        ratio = (both["cycles_incl_prefetch"] / both["cycles_incl_prefetch_rep"])[changed]
        dram = (both["dram_bytes"] / both["dram_bytes_rep"])[changed]
        lines.append(f"the repairs change {changed.sum()} of {len(both)} runs; there SCALE-Sim as released / repaired: "
                     f"cycles median {ratio.median():.2f}x, p90 {ratio.quantile(0.9):.2f}x, min {ratio.min():.2f}x, "
                     f"max {ratio.max():.1f}x; DRAM bytes median {dram.median():.2f}x, p90 {dram.quantile(0.9):.2f}x, "
                     f"max {dram.max():.1f}x")
        for df in ("os", "ws", "is"):
            sel = (both["dataflow"] == df).to_numpy()
            lines.append(f"  {df}: {changed[sel].sum()} of {sel.sum()} changed; cycles as released / repaired median "
                         f"{(both['cycles_incl_prefetch'] / both['cycles_incl_prefetch_rep'])[sel].median():.2f}x")
        if same.sum():
            lines.append("")
            report("SCALE-Sim as released, the runs the repairs leave as they are", stock[same], lines)
    print("\n".join(lines))


if __name__ == "__main__":
    main()
