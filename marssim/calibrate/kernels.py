"""The kernels the harness times, one or more per kernel kind, each built for a grid point.

Each :class:`KernelImpl` maps a ``--kinds`` name (and so a calibration-table ``kind``) to the
kernel a framework runs for the zoo's ops of that kind:

==================  =====================================  ===========  =============================
measure kind        kernel (``kernel`` column)             ``tuning``   zoo ops
==================  =====================================  ===========  =============================
gemm                ``torch.matmul`` / ``torch.linear``    vendor       ``gemm`` (linear layers; the
                    (cuBLAS; ``linear`` when the layer                  bias, when the layer has one,
                    has a bias, as a cuBLASLt epilogue)                 is the GEMM's epilogue)
gemm                ``triton.gemm`` (the SIP package's     none         the same, bf16/fp16 inputs
                    Triton GEMM, 64x64x64 tiles, fp16                   only: a fixed-tile compiled
                    output)                                             kernel
conv                ``torch.conv2d`` (cuDNN, NHWC,         vendor       ``conv`` (asymmetric padding
                    heuristic algorithm choice)                         applied to the input once)
attention           ``torch.bmm`` (cuBLAS batched GEMM)    vendor       ``matmul`` (``Q K^T``, ``P V``)
fused-attention     ``torch.sdpa`` (scaled dot-product     vendor       one attention block's
                    attention; flash/efficient kernel)                  ``matmul``-softmax-``matmul``
elementwise         ``torch.<fn>`` (relu, add, gelu, ...)  vendor       ``eltwise``
norm                ``torch.batch_norm`` (inference),      vendor       ``norm``
                    ``torch.layer_norm``,
                    ``torch.local_response_norm``
softmax             ``torch.softmax`` (last dim)           vendor       ``softmax``
pool                ``torch.max_pool2d`` /                 vendor       ``pool``
                    ``torch.avg_pool2d`` / adaptive
embedding           ``torch.embedding``                    vendor       ``embedding``
==================  =====================================  ===========  =============================

The ops of the LLM workloads (training GEMMs and their gradients, grouped-query attention
products, fused attention per scaled-dot-product attention backend -- measure kind ``sdpa`` --,
dropout, SwiGLU, rotary embeddings, norm gradients, the AdamW step) get the kernels PyTorch runs
for them: :mod:`marssim.calibrate.llm_kernels`. A kernel family is named by its measure kind,
``tuning`` and ``backend`` (the ``backend`` column of its rows: ``flash``, ``efficient``,
``cudnn``, ``math`` for the fused attention kernels, ``fused`` for AdamW).

``vendor`` is the schema's word for kernels a library picks (cuBLAS/cuDNN heuristics, PyTorch's
own kernels); ``none`` a compiled kernel with fixed tiles. Inputs are random normal values moved
away from zero by 1/64 (never zeros: no sparsity or zero-skipping shortcut can make a kernel
look fast); seeds are fixed per point. ``tf32`` points use fp32 tensors with TF32 allowed in
cuBLAS and cuDNN; ``fp32`` points forbid it.

Building needs torch (imported by :meth:`KernelImpl.build`, not by this module), so the
registry -- which kernels exist, for which kinds and dtypes -- is usable without it.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from .grid import FUSED_ATTENTION, SDPA, GridPoint
from .tensors import Built, random_input, seeded_generator

__all__ = ["KernelImpl", "Built", "KERNELS", "kernels_for", "triton_specialization", "TRITON_COMPILE_S"]

TRITON_COMPILE_S = 2.0
"""Seconds Triton takes to compile the GEMM once (per dtype and specialization), for estimates."""

@dataclass(frozen=True)
class KernelImpl:
    """One kernel family: the measure kind it times, its ``tuning`` label, the dtypes it takes, a
    builder ``build(point, device, seed) -> Built`` and the ``backend`` its rows name (which of a
    call's implementations it forces; empty when one)."""

    name: str
    measure_kind: str
    tuning: str
    dtypes: tuple[str, ...]
    builder: Callable[[GridPoint, Any, int], Built] = field(repr=False)
    applies: Callable[[GridPoint], bool] = field(default=lambda p: True, repr=False)
    backend: str = ""

    def accepts(self, point: GridPoint) -> bool:
        return point.measure_kind == self.measure_kind and point.dtype in self.dtypes and self.applies(point)

    def build(self, point: GridPoint, device: Any = "cuda", seed: int = 0) -> Built:
        """Allocate random inputs for ``point`` on ``device`` and return the launcher."""
        return self.builder(point, device, seed)


# ----------------------------------------------------------------------------- GEMM-class
def _llm_op(op) -> bool:
    """An op of an LLM graph (it carries a training/serving ``phase``): its kernels are PyTorch's
    for transformer layers (:mod:`marssim.calibrate.llm_kernels`)."""
    return op.param("phase") is not None or op.param("grad") is not None or bool(op.param("grouped", False))


def _gemm(point: GridPoint, device, seed: int) -> Built:
    import torch

    if _llm_op(point.op):
        from .llm_kernels import llm_gemm

        return llm_gemm(point, device, seed)
    op = point.op
    gen = seeded_generator(device, seed)
    m, n, k = op.dim("B") * op.dim("M"), op.dim("N"), op.dim("K")
    x = random_input((m, k), point.dtype, device, gen)
    if op.param("bias", False):
        w = random_input((n, k), point.dtype, device, gen)
        b = random_input((n,), point.dtype, device, gen)
        return Built(lambda: torch.nn.functional.linear(x, w, b), (m, n), "torch.linear")
    w = random_input((k, n), point.dtype, device, gen)
    return Built(lambda: torch.matmul(x, w), (m, n), "torch.matmul")


def _triton_gemm(point: GridPoint, device, seed: int) -> Built:
    import torch
    import triton

    from .sip import triton_kernels
    from .sip.kernels import KERNELS as SIP_KERNELS

    spec = SIP_KERNELS["gemm"]  # C = A @ B, the SIP package's GEMM without the activation
    blocks = {name: spec.constexprs[name] for name in ("BLOCK_M", "BLOCK_N", "BLOCK_K", "GROUP_M", "ACTIVATION")}
    op = point.op
    gen = seeded_generator(device, seed)
    m, n, k = op.dim("B") * op.dim("M"), op.dim("N"), op.dim("K")
    a = random_input((m, k), point.dtype, device, gen)
    b = random_input((k, n), point.dtype, device, gen)
    c = torch.empty((m, n), dtype=torch.float16, device=device)  # the kernel writes fp16 (as SIP tunes it)
    grid = (triton.cdiv(m, blocks["BLOCK_M"]) * triton.cdiv(n, blocks["BLOCK_N"]),)
    kernel = getattr(triton_kernels, spec.function)

    def fn():
        kernel[grid](a, b, c, m, n, k, a.stride(0), a.stride(1), b.stride(0), b.stride(1), c.stride(0), c.stride(1),
                     num_warps=spec.num_warps, num_stages=spec.num_stages, **blocks)
        return c

    tiles = f"{blocks['BLOCK_M']}x{blocks['BLOCK_N']}x{blocks['BLOCK_K']}"
    return Built(fn, (m, n), "triton.gemm", {"tiles": tiles, "warps": str(spec.num_warps),
                                             "stages": str(spec.num_stages), "output": "fp16"})


def triton_specialization(point: GridPoint) -> tuple:
    """What Triton compiles the GEMM anew for: the dtype and, per integer argument (``M, N, K``
    and the row strides ``K, N, N``), whether it is 1 or a multiple of 16."""
    op = point.op
    m, n, k = op.dim("B") * op.dim("M"), op.dim("N"), op.dim("K")
    return (point.dtype, *((v == 1, v % 16 == 0) for v in (m, n, k)))


def _conv(point: GridPoint, device, seed: int) -> Built:
    import torch

    from marssim.cost.convgeom import conv_launch

    op = point.op
    gen = seeded_generator(device, seed)
    # the geometry the row records: a spatial shard keeps only the padding its output still needs
    # (its rows come with the halo from the neighbouring shards); asymmetric padding is applied
    # to the input once, outside the timed kernel
    launch = conv_launch(op)
    geo = launch.geometry
    x = random_input((launch.n, geo.c, launch.rows, launch.cols), point.dtype, device, gen)
    if any(launch.pre_pad):
        x = torch.nn.functional.pad(x, launch.pre_pad)
    x = x.contiguous(memory_format=torch.channels_last)
    weight = random_input((geo.k, geo.c // geo.groups, geo.r, geo.s), point.dtype, device,
                     gen).contiguous(memory_format=torch.channels_last)
    bias = random_input((geo.k,), point.dtype, device, gen) if op.param("bias", False) else None
    stride, padding = (geo.stride_h, geo.stride_w), (geo.pad_h, geo.pad_w)

    def fn():
        return torch.nn.functional.conv2d(x, weight, bias, stride, padding, geo.dilation, geo.groups)

    return Built(fn, tuple(op.out_shape), "torch.conv2d", {"layout": "NHWC"})


def _bmm(point: GridPoint, device, seed: int) -> Built:
    import torch

    if _llm_op(point.op) or point.op.param("kv_group", 1) > 1 or point.op.param("a_t"):
        from .llm_kernels import attention_product

        return attention_product(point, device, seed)
    op = point.op
    gen = seeded_generator(device, seed)
    g, m, n, k = op.dim("B") * op.dim("H"), op.dim("M"), op.dim("N"), op.dim("K")
    a = random_input((g, m, k), point.dtype, device, gen)
    b = random_input((g, k, n), point.dtype, device, gen)
    return Built(lambda: torch.bmm(a, b), (g, m, n), "torch.bmm")


def _sdpa(point: GridPoint, device, seed: int) -> Built:
    import torch

    op = point.op  # the block's Q K^T product: B, H, M = N = tokens, K = head dim
    gen = seeded_generator(device, seed)
    shape = (op.dim("B"), op.dim("H"), op.dim("M"), op.dim("K"))
    q, k, v = (random_input(shape, point.dtype, device, gen) for _ in range(3))
    return Built(lambda: torch.nn.functional.scaled_dot_product_attention(q, k, v), shape, "torch.sdpa")


# ----------------------------------------------------------------------------- streaming
def _elementwise_fn(fn_name: str):
    import torch
    import torch.nn.functional as F

    unary = {"relu": torch.relu, "relu6": F.relu6, "gelu": F.gelu, "sigmoid": torch.sigmoid, "silu": F.silu,
             "tanh": torch.tanh, "leaky_relu": F.leaky_relu, "clip": lambda x: torch.clamp(x, -1.0, 1.0),
             "identity": torch.clone}
    binary = {"add": torch.add, "mul": torch.mul, "sub": torch.sub, "div": torch.div}
    return unary.get(fn_name), binary.get(fn_name)


def _elementwise(point: GridPoint, device, seed: int) -> Built:
    from .llm_kernels import LLM_ELEMENTWISE, llm_elementwise

    op = point.op
    if op.param("fn") in LLM_ELEMENTWISE:
        return llm_elementwise(point, device, seed)
    gen = seeded_generator(device, seed)
    fn_name = op.param("fn", "identity")
    unary, binary = _elementwise_fn(fn_name)
    out = tuple(op.out_shape)
    inputs = [random_input(s, point.dtype, device, gen) for s in op.in_shapes]
    if binary is not None:
        if len(inputs) < 2:  # a learned operand (bias, position embedding), broadcast over the batch
            inputs.append(random_input(out[1:], point.dtype, device, gen, positive=fn_name == "div"))
        elif fn_name == "div":
            inputs[1] = random_input(op.in_shapes[1], point.dtype, device, gen, positive=True)
        a, b = inputs[0], inputs[1]
        rest = inputs[2:]

        def fn():
            y = binary(a, b)
            for t in rest:  # n-ary sums: one kernel per extra operand, as eager PyTorch runs them
                y = binary(y, t)
            return y

        return Built(fn, out, f"torch.{fn_name}")
    if unary is None:
        raise ValueError(f"no kernel for element-wise function {fn_name!r}")
    x = inputs[0]
    return Built(lambda: unary(x), out, f"torch.{fn_name}")


def _norm(point: GridPoint, device, seed: int) -> Built:
    import torch
    import torch.nn.functional as F

    op = point.op
    kind = op.param("norm", "layer")
    if kind in ("rms", "layer_grad", "rms_grad"):
        from .llm_kernels import llm_norm

        return llm_norm(point, device, seed)
    gen = seeded_generator(device, seed)
    n, c, h, w = op.in_shapes[0]
    if kind == "batch":
        x = random_input((n, c, h, w), point.dtype, device, gen).contiguous(memory_format=torch.channels_last)
        mean = random_input((c,), point.dtype, device, gen)
        var = random_input((c,), point.dtype, device, gen, positive=True)
        scale = random_input((c,), point.dtype, device, gen)
        shift = random_input((c,), point.dtype, device, gen)
        return Built(lambda: F.batch_norm(x, mean, var, scale, shift, False, 0.0, 1e-5), (n, c, h, w),
                     "torch.batch_norm", {"layout": "NHWC"})
    if kind == "lrn":
        x = random_input((n, c, h, w), point.dtype, device, gen)
        return Built(lambda: F.local_response_norm(x, 5), (n, c, h, w), "torch.local_response_norm")
    x = random_input((n, h * w, c), point.dtype, device, gen)  # features last, as transformers hold them
    scale = random_input((c,), point.dtype, device, gen)
    shift = random_input((c,), point.dtype, device, gen)
    return Built(lambda: F.layer_norm(x, (c,), scale, shift, 1e-5), (n, h * w, c), "torch.layer_norm")


def _softmax(point: GridPoint, device, seed: int) -> Built:
    import torch

    op = point.op
    gen = seeded_generator(device, seed)
    shape = (op.dim("N") * op.dim("A"), op.dim("H"), op.dim("L"))
    x = random_input(shape, point.dtype, device, gen)
    return Built(lambda: torch.softmax(x, dim=-1), shape, "torch.softmax")


def _pool(point: GridPoint, device, seed: int) -> Built:
    import torch
    import torch.nn.functional as F

    op = point.op
    gen = seeded_generator(device, seed)
    n, c, h, w = op.in_shapes[0]
    out = tuple(op.out_shape)
    mode = op.param("mode", "max")
    x = random_input((n, c, h, w), point.dtype, device, gen).contiguous(memory_format=torch.channels_last)
    if op.param("global", False):
        pool = F.adaptive_max_pool2d if mode == "max" else F.adaptive_avg_pool2d
        return Built(lambda: pool(x, 1), out, f"torch.adaptive_{mode}_pool2d", {"layout": "NHWC"})
    r, s = op.dim("R"), op.dim("S")
    sh, sw = op.param("stride", (r, s))
    top, left, bottom, right = op.param("pad", (0, 0, 0, 0))
    # symmetric padding within half a window goes to the kernel; anything else pads the input once
    if (top, left) == (bottom, right) and 2 * top <= r and 2 * left <= s:
        padding = (top, left)
    else:
        fill = -math.inf if mode == "max" else 0.0
        x = F.pad(x, (left, right, top, bottom), value=fill).contiguous(memory_format=torch.channels_last)
        padding = (0, 0)
    p_floor = (x.shape[2] + 2 * padding[0] - r) // sh + 1
    ceil_mode = p_floor != out[2]
    if mode == "max":
        return Built(lambda: F.max_pool2d(x, (r, s), (sh, sw), padding, ceil_mode=ceil_mode), out,
                     "torch.max_pool2d", {"layout": "NHWC"})
    return Built(lambda: F.avg_pool2d(x, (r, s), (sh, sw), padding, ceil_mode=ceil_mode), out,
                 "torch.avg_pool2d", {"layout": "NHWC"})


def _embedding(point: GridPoint, device, seed: int) -> Built:
    import torch

    op = point.op
    gen = seeded_generator(device, seed)
    n, h, c = op.dim("N"), op.dim("H"), op.dim("C")
    vocab = int(op.param("vocab", 1))
    ids = torch.randint(0, vocab, (n, h), generator=gen, device=device, dtype=torch.int64)
    table = random_input((vocab, c), point.dtype, device, gen)
    return Built(lambda: torch.nn.functional.embedding(ids, table), (n, h, c), "torch.embedding")


def _adamw(point: GridPoint, device, seed: int) -> Built:
    from .llm_kernels import adamw

    return adamw(point, device, seed)


# ----------------------------------------------------------------------------- registry
_ALL = ("bf16", "fp16", "fp32", "tf32")
_TENSOR_CORE_HALF = ("bf16", "fp16")

def _sdpa_impls() -> tuple[KernelImpl, ...]:
    from .llm_kernels import SDPA_BACKEND_ENUMS, sdpa_builder

    return tuple(KernelImpl(f"torch.sdpa.{b}", SDPA, "vendor", ("bf16", "fp16", "fp32"), sdpa_builder(b),
                            applies=lambda p, b=b: p.backend == b, backend=b) for b in SDPA_BACKEND_ENUMS)


def _is_adam(p: GridPoint) -> bool:
    return p.op.param("fn") == "adam"


def _plain_gemm(p: GridPoint) -> bool:
    """A GEMM the fixed-layout Triton GEMM computes: ``A B`` with both row-major (no weight
    gradient, no grouped experts)."""
    return p.op.param("grad") != "weight" and not p.op.param("grouped", False)


KERNELS: tuple[KernelImpl, ...] = (
    KernelImpl("torch.matmul", "gemm", "vendor", _ALL, _gemm),
    KernelImpl("triton.gemm", "gemm", "none", _TENSOR_CORE_HALF, _triton_gemm, applies=_plain_gemm),
    KernelImpl("torch.conv2d", "conv", "vendor", _ALL, _conv),
    KernelImpl("torch.bmm", "attention", "vendor", _ALL, _bmm),
    KernelImpl("torch.sdpa", FUSED_ATTENTION, "vendor", ("bf16", "fp16", "fp32"), _sdpa),
    *_sdpa_impls(),
    KernelImpl("torch.elementwise", "elementwise", "vendor", ("bf16", "fp16", "fp32"), _elementwise,
               applies=lambda p: not _is_adam(p)),
    KernelImpl("torch.adamw", "elementwise", "vendor", ("fp32",), _adamw, applies=_is_adam, backend="fused"),
    KernelImpl("torch.norm", "norm", "vendor", ("bf16", "fp16", "fp32"), _norm),
    KernelImpl("torch.softmax", "softmax", "vendor", ("bf16", "fp16", "fp32"), _softmax),
    KernelImpl("torch.pool", "pool", "vendor", ("bf16", "fp16", "fp32"), _pool),
    KernelImpl("torch.embedding", "embedding", "vendor", ("bf16", "fp16", "fp32"), _embedding),
)
"""Every kernel family the harness knows (see the module docstring)."""


def kernels_for(point: GridPoint, *, triton: bool = True) -> tuple[KernelImpl, ...]:
    """The kernel families that time ``point`` (without Triton ones when ``triton`` is False)."""
    return tuple(k for k in KERNELS if k.accepts(point) and (triton or not k.name.startswith("triton")))
