"""How well a kernel set's rates between its measured lengths are known: each interior measured
length of every kernel (set, backend, dtype, mask, head dimension) held out and predicted from
its two neighbours as :class:`marssim.cost.attention_kernels.AttentionRescale` interpolates
(forward TFLOP/s, and the backward-over-forward time ratio, linear in ``ln s``), against the
published figure. The end points are not checked (the model holds them constant outside).

    PYTHONPATH=. python analysis/attention_kernels_holdout.py > analysis/results/attention_kernels_holdout.txt
"""

from __future__ import annotations

import math
import platform
import statistics
import sys

from marssim.cost.attention_backward import between
from marssim.cost.attention_kernels import forward_flops, kernel_sets, load_kernel_set


def _errors(points: list[tuple[float, float]]) -> list[float]:
    """``|predicted / published - 1|`` of every interior point from its two neighbours."""
    out = []
    for i in range(1, len(points) - 1):
        at, value = points[i]
        out.append(abs(between([points[i - 1], points[i + 1]], at) / value - 1))
    return out


def main() -> int:
    print(f"attention_kernels_holdout: each interior measured length predicted from its neighbours "
          f"(Python {platform.python_version()}, {platform.machine()})\n")
    print(f"{'set':22s} {'kernel':26s} {'lengths':>7s}  {'fwd rate median':>15s} {'max':>7s}  "
          f"{'bwd/fwd median':>14s} {'max':>7s}")
    every_fwd, every_bwd = [], []
    for name in kernel_sets():
        ks = load_kernel_set(name)
        for (backend, dtype, causal, head_dim), line in sorted(ks.points.items()):
            fwd = [(math.log(p.seq), forward_flops(p.batch, p.heads, p.seq, head_dim, causal) / p.fwd_s) for p in line]
            ratio = [(math.log(p.seq), p.bwd_s / p.fwd_s) for p in line]
            ef, eb = _errors(fwd), _errors(ratio)
            if not ef:
                continue
            every_fwd += ef
            every_bwd += eb
            label = f"{backend} {dtype} {'causal' if causal else 'full'} d{head_dim}"
            print(f"{name:22s} {label:26s} {len(line):7d}  {statistics.median(ef):15.1%} {max(ef):7.1%}  "
                  f"{statistics.median(eb):14.1%} {max(eb):7.1%}")
    print(f"\nall {len(every_fwd)} held-out lengths: forward rate median {statistics.median(every_fwd):.1%}, "
          f"max {max(every_fwd):.1%}; backward/forward ratio median {statistics.median(every_bwd):.1%}, "
          f"max {max(every_bwd):.1%}")
    print("(a held-out length is predicted across a gap of lengths twice as wide as any the model interpolates "
          "across; the largest errors are at 1,024-4,096 tokens, where the rates change fastest)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
