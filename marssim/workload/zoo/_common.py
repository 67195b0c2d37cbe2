"""Helpers shared by the zoo builders: checked parameters and the attention block."""

from __future__ import annotations

from marssim.errors import InputError

from ..builder import GraphBuilder, T
from ..op import DTYPE_BYTES

__all__ = ["new_builder", "require", "attention"]


def require(ok: bool, key: str, message: str) -> None:
    """Raise ``InputError(None, key, message)`` unless ``ok``; :func:`~marssim.workload.load_workload`
    fills in the spec string as the file."""
    if not ok:
        raise InputError(None, key, message)


def new_builder(name: str, *, batch: int, dtype: str) -> GraphBuilder:
    """A :class:`GraphBuilder` for a zoo model, with the spec parameters checked."""
    require(isinstance(batch, int) and batch >= 1, "batch", f"expected a positive integer, got {batch!r}")
    require(dtype in DTYPE_BYTES, "dtype", f"expected one of {', '.join(DTYPE_BYTES)}, got {dtype!r}")
    return GraphBuilder(name, batch=batch, dtype=dtype)


def attention(b: GraphBuilder, prefix: str, q: T, k: T, v: T, heads: int) -> T:
    """Scaled dot-product attention over token tensors ``(n, hidden, tokens, 1)``.

    Three ops: ``{prefix}.matmul_qk`` (Q K^T per head), ``{prefix}.softmax`` (the 1/sqrt(d) scale
    and any mask are folded into it, as fused attention kernels do) and ``{prefix}.matmul_pv``
    (P V per head). The head split and merge are layout views in the ``(n, heads*d, tokens, 1)``
    convention, not ops."""
    scores = b.matmul(f"{prefix}.matmul_qk", q, k, heads=heads, b_feature="K")
    probs = b.softmax(f"{prefix}.softmax", scores, heads=heads)
    return b.matmul(f"{prefix}.matmul_pv", probs, v, heads=heads, b_feature="N")
