"""The backward of a fused attention kernel, derived from its measured forward.

No measured table holds fused attention *backward* kernels (AIConfigurator times inference
kernels only; the project's own harness has no Hopper rows of it), while the forward kernels of
the same shapes are measured densely (:mod:`marssim.cost.attention_grid`). The backward kernel
is not a forward kernel of another shape: it recomputes ``Q K^T``, and computes ``dV = P^T dO``,
``dP = dO V^T``, ``dQ = dS K`` and ``dK = dS^T Q`` -- five products where the forward has two,
at a lower throughput (more shared-memory traffic, atomics on ``dQ``). A backward op
(``phase=bwd``, ``batch = 4 x batch x heads``) is therefore timed as its forward twin
(``phase=fwd``, ``batch = 2 x batch x heads``, same queries, keys, head dimension, heads and
cache type: :func:`forward_twin`) times :func:`backward_ratio`, the published ratio of the
backward to the forward time of one implementation at the same shape::

    t_bwd(s, d) = t_fwd(s, d) x 2.5 x F(s, d) / B(s, d)

with ``F``, ``B`` the forward and backward throughputs FlashAttention-3 reports on an H100 SXM5
in bf16 without a causal mask (Shah et al., "FlashAttention-3: Fast and Accurate Attention with
Asynchrony and Low-precision", 2024, arXiv:2407.08608, the forward and backward speed figures,
head dimensions 64 and 128, 512 to 16k tokens, batch x tokens = 16k, 2,048 hidden), and 2.5 the
backward's FLOPs over the forward's in the paper's count. The ratio is taken between the
measured values of :data:`FA3_H100_BF16` linearly in ``ln s`` and ``ln d`` and held constant
outside them. Assumptions the report's label (``derived``) stands for: the ratio of a causal
kernel is that of a full one (both skip the masked half), and the ratio carries over to the
engine whose forward kernel was measured and to other GPUs of the same generation.
"""

from __future__ import annotations

import bisect
import math

from .features import CLASS_GEMM, F_BACKEND, F_CLASS, F_G, F_KK, F_NN, F_PHASE, KERNEL_PHASES

__all__ = ["FA3_H100_BF16", "FA3_SOURCE", "BACKWARD_FLOP_RATIO", "backward_ratio", "forward_twin", "twin_ratio",
           "between"]

FA3_SOURCE = ("Shah et al., FlashAttention-3 (arXiv:2407.08608, 2024): attention forward and backward speed "
              "without a causal mask, bf16, H100 80GB SXM5")

BACKWARD_FLOP_RATIO = 2.5
"""The backward kernel's FLOPs over the forward's, as FlashAttention counts them."""

FA3_H100_BF16: dict[int, dict[int, tuple[float, float]]] = {
    64: {512: (333.0, 272.0), 1024: (392.0, 363.0), 2048: (460.0, 422.0), 4096: (476.0, 453.0),
         8192: (496.0, 472.0), 16384: (497.0, 474.0)},
    128: {512: (467.0, 316.0), 1024: (565.0, 424.0), 2048: (625.0, 501.0), 4096: (638.0, 542.0),
          8192: (646.0, 559.0), 16384: (648.0, 561.0)},
}
"""Head dimension -> sequence length -> (forward, backward) TFLOP/s of FlashAttention-3 (see
:data:`FA3_SOURCE`; each in the paper's FLOP count)."""

_FWD = KERNEL_PHASES.index("fwd")
_BWD = KERNEL_PHASES.index("bwd")
_PRODUCTS_FWD, _PRODUCTS_BWD = 2, 4


def between(points: list[tuple[float, float]], at: float) -> float:
    """Linear in ``at`` between the ``(position, value)`` points (sorted), constant outside."""
    xs = [p for p, _ in points]
    i = bisect.bisect_left(xs, at)
    if i == 0:
        return points[0][1]
    if i == len(points):
        return points[-1][1]
    (x0, y0), (x1, y1) = points[i - 1], points[i]
    return y0 + (y1 - y0) * (at - x0) / (x1 - x0)


def _ratio_at(head_dim: int, seq: float) -> float:
    row = FA3_H100_BF16[head_dim]
    return between([(math.log(s), BACKWARD_FLOP_RATIO * f / b) for s, (f, b) in sorted(row.items())], math.log(seq))


def backward_ratio(head_dim: int, seq: int) -> float:
    """The backward kernel's time over its forward twin's at ``seq`` keys and head dimension
    ``head_dim`` (dimensionless, > 1; see the module docstring)."""
    if head_dim < 1 or seq < 1:
        raise ValueError(f"head_dim and seq must be positive, got {head_dim} and {seq}")
    dims = sorted(FA3_H100_BF16)
    return between([(math.log(d), _ratio_at(d, seq)) for d in dims], math.log(head_dim))


def forward_twin(x: tuple[int, ...]) -> tuple[int, ...] | None:
    """The feature tuple of the forward kernel of a fused attention backward op ``x`` (same
    queries, keys, head dimension, heads, cache type; two products per sequence and head where
    the backward counts four), None for any other op."""
    if x[F_CLASS] != CLASS_GEMM or not x[F_BACKEND] or x[F_PHASE] != _BWD or x[F_G] % 2:
        return None
    twin = list(x)
    twin[F_G] = x[F_G] * _PRODUCTS_FWD // _PRODUCTS_BWD
    twin[F_PHASE] = _FWD
    return tuple(twin)


def twin_ratio(x: tuple[int, ...]) -> float:
    """:func:`backward_ratio` at the keys and head dimension of feature tuple ``x``."""
    return backward_ratio(x[F_KK], x[F_NN])
