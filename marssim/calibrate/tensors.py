"""What every kernel builder of the harness shares (:mod:`.kernels`, :mod:`.llm_kernels`): the
:class:`Built` launcher a builder returns, the torch dtype of a table dtype, whether TF32 is
allowed, and the seeded random inputs (never zero).

Building needs torch, imported by these functions, not by this module."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

__all__ = ["Built", "torch_dtype", "tf32_allowed", "random_input", "seeded_generator"]

_TORCH_DTYPE_NAMES = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32", "tf32": "float32"}


@dataclass
class Built:
    """A kernel ready to run: ``fn()`` launches it once and returns its output; ``expected``
    is the output shape the op says it has (checked after the first run); ``kernel`` the name
    recorded in the table; ``note`` extra ``key=value`` facts (layout, tiles); ``backend`` the
    table's ``backend`` column (which of a call's implementations ran; empty when one)."""

    fn: Callable[[], Any]
    expected: tuple[int, ...]
    kernel: str
    note: dict[str, str] = field(default_factory=dict)
    backend: str = ""


def torch_dtype(dtype: str):
    """The torch dtype of a table dtype (``tf32`` -> ``torch.float32``)."""
    import torch

    return getattr(torch, _TORCH_DTYPE_NAMES[dtype])


def tf32_allowed(dtype: str) -> bool:
    """Whether cuBLAS/cuDNN may use TF32 tensor cores for this dtype's kernels."""
    return dtype == "tf32"


def random_input(shape: Sequence[int], dtype: str, device, gen, *, positive: bool = False):
    """Normal random values moved away from zero by 1/64 (``positive``: |x| + 1/2)."""
    import torch

    x = torch.randn(tuple(shape), generator=gen, device=device, dtype=torch.float32)
    if positive:
        x = x.abs_().add_(0.5)
    else:
        x = torch.where(x >= 0, x + 1.0 / 64, x - 1.0 / 64)
    return x.to(torch_dtype(dtype))


def seeded_generator(device, seed: int):
    """A torch random generator on ``device`` seeded with ``seed``."""
    import torch

    gen = torch.Generator(device=device)
    gen.manual_seed(seed)
    return gen
