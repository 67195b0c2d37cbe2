"""Summarise `marssim sip tune` result files (``*.result.json``) as a table: baseline and tuned
median with IQR, latency change, moved instructions, verification samples and mismatches.

    python analysis/sip_results_table.py analysis/results/sip
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def main(folder: str) -> int:
    files = sorted(Path(folder).glob("*.result.json"))
    if not files:
        print(f"no *.result.json in {folder}")
        return 1
    print(f"{'kernel':18s} {'shape':28s} {'device':24s} {'baseline us (IQR)':>20s} {'SIP us (IQR)':>20s} "
          f"{'latency':>8s} {'moved':>5s} {'verified elements':>17s} {'mismatches':>10s}")
    for f in files:
        r = json.loads(f.read_text())
        b, t = r["baseline"], r["tuned"]
        shape = ",".join(f"{k}={v}" for k, v in r["shape"].items())
        print(f"{r['kernel']:18s} {shape:28s} {r['device'][:24]:24s} "
              f"{b['median_s'] * 1e6:10.2f} ({b['iqr_s'] * 1e6:6.2f}) {t['median_s'] * 1e6:10.2f} ({t['iqr_s'] * 1e6:6.2f}) "
              f"{-r['latency_reduction'] * 100:+7.2f}% {r['moved_instructions']:5d} {r['verified_elements']:17d} "
              f"{r['mismatches']:10d}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else "analysis/results/sip"))
