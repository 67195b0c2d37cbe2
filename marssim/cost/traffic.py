"""Off-chip re-reads of operands that do not fit the on-chip buffer (PE-array designs).

The compulsory DRAM traffic of an op is its tensors read and written once (``F_TRAFFIC``). A
dataflow that needs an operand X several times (``passes``: once per fold of a spatial dimension
X is not indexed by) gets the re-reads from the buffer when X fits in half of it (the other half
holds the stationary tile and the outputs). When X does not fit, the better of two loop orders
is taken:

* stream X from DRAM on every pass: ``(passes - 1) * X`` extra bytes; or
* cut X into chunks of half the buffer and finish all passes on a chunk before the next, which
  streams the partner operand Y once per chunk: ``(ceil(X / half) - 1) * Y`` extra bytes.

Partial sums spilled to DRAM are the same with X = the output, written and read back on every
pass but the last (``2 * (passes - 1) * X``), and Y = the stationary operand. This is a first-order tiling model (no search over loop orders
beyond these two), meant to keep memory-bound layers from looking free, not to replace a
mapper such as Timeloop or ZigZag.
"""

from __future__ import annotations

__all__ = ["refetch", "psum_refetch"]


def refetch(x_bytes, passes, y_bytes, half, mn):
    """Extra DRAM bytes for operand X (``x_bytes``) needed ``passes`` times, partner operand Y
    (``y_bytes``), half the buffer ``half`` (bytes). Scalars or numpy arrays; ``mn`` is ``min``
    or ``numpy.minimum``."""
    return (x_bytes > half) * mn((passes - 1) * x_bytes, (-(-x_bytes // half) - 1) * y_bytes)


def psum_refetch(out_bytes, passes, y_bytes, half, mn):
    """Extra DRAM bytes for partial sums of an output of ``out_bytes`` accumulated over
    ``passes`` passes (stationary operand ``y_bytes``; see the module docstring)."""
    return (out_bytes > half) * mn(2 * (passes - 1) * out_bytes, (-(-out_bytes // half) - 1) * y_bytes)
