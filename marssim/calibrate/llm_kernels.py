"""Kernels of the LLM workloads' ops for the measurement harness: what PyTorch runs for them.

Builders ``(point, device, seed) -> Built`` in the form of :mod:`marssim.calibrate.kernels`
(which registers them); torch is imported when a kernel is built. Token tensors are held as
PyTorch holds them, features last (``(n, tokens, features)``); attention scores as ``(n,
heads, queries, keys)``.

==================  ==================================================================================
op                  kernel (``kernel`` column; one launch unless said)
==================  ==================================================================================
GEMM, forward       ``torch.linear``: ``x W^T`` with ``W`` stored ``(out, in)`` as ``nn.Linear`` holds it
                    (its bias as the cuBLASLt epilogue); grouped (MoE experts): ``torch.bmm``
GEMM, ``dgrad``     ``torch.matmul``: ``dY W`` (``W`` as the forward stores it)
GEMM, ``wgrad``     ``torch.matmul``: ``dY^T X``, the tokens contracted (``A^T B``), the ``(out, in)``
                    weight gradient ``nn.Linear``'s backward computes
attention products  ``torch.bmm`` with the query heads of each key/value head folded into the rows
                    (grouped-query attention without copying keys and values); the key and value
                    gradients (``a_t``) read the scores transposed and contract the group's queries
fused attention     ``torch.sdpa``: ``scaled_dot_product_attention`` with the backend forced
                    (``sdpa_kernel``) and named in the ``backend`` column; causal where the op is,
                    the op's dropout; keys and values with fewer heads through ``enable_gqa``, or,
                    for a backend that refuses it, expanded beforehand (the backward then includes
                    the sum over each group); ``bwd``: ``autograd.grad`` of the forward (every
                    kernel the backend's backward launches)
dropout             ``torch.native_dropout`` (output and the one-byte mask); gradient
                    ``native_dropout_backward``
GeLU gradient       ``aten.gelu_backward``
SwiGLU              ``silu(gate) * up``: two launches, as eager PyTorch runs it; gradients
                    ``silu_backward(dY * up, gate)`` and ``silu(gate) * dY`` (two each)
rotary embedding    ``x cos + rotate_half(x) sin``, eager (mul, neg, cat, mul, add: five launches);
                    its gradient the same with ``-sin``
softmax gradient    ``torch._softmax_backward_data`` over rows of the forward softmax's length
cross-entropy grad  ``P / tokens`` then the targets' ``-1 / tokens`` (an ``index_add``): two launches
embedding gradient  ``index_add_`` of the output-gradient rows into the table gradient (a rank's part
                    of the vocabulary)
MoE router          softmax, ``topk`` and the renormalised gates scattered back; backward the softmax
                    gradient of the kept gates
gradient sums       ``torch.add`` (one launch per extra operand)
RMSNorm             ``torch.nn.functional.rms_norm``; gradient: ``autograd.grad`` of it (input and
                    scale gradients)
LayerNorm gradient  ``aten.native_layer_norm_backward`` (input, scale and shift gradients)
AdamW step          ``torch.optim.AdamW(fused=True)`` over one flat fp32 buffer of the group's
                    parameters (``backend`` ``fused``), then the 16-bit weight copy
==================  ==================================================================================
"""

from __future__ import annotations

from typing import Any

from marssim.workload.op import kv_heads_of

from .grid import GridPoint
from .tensors import Built, random_input, seeded_generator

__all__ = ["llm_gemm", "attention_product", "sdpa_builder", "llm_elementwise", "llm_norm", "adamw",
           "LLM_ELEMENTWISE", "SDPA_BACKEND_ENUMS"]

SDPA_BACKEND_ENUMS = {"flash": "FLASH_ATTENTION", "efficient": "EFFICIENT_ATTENTION", "cudnn": "CUDNN_ATTENTION",
                      "math": "MATH"}
"""The ``torch.nn.attention.SDPBackend`` member of each backend name."""


def _tokens(shape) -> tuple[int, int, int]:
    """``(n, c, h, w)`` -> ``(n, h*w, c)``: a token tensor, features last."""
    n, c, h, w = shape
    return (n, h * w, c)


# ----------------------------------------------------------------------------- GEMMs
def llm_gemm(point: GridPoint, device, seed: int):
    """A GEMM of an LLM graph: forward, ``dgrad`` or ``wgrad``, plain or grouped (see the module
    docstring)."""
    import torch

    op = point.op
    gen = seeded_generator(device, seed)
    b, m, n, k = op.dim("B"), op.dim("M"), op.dim("N"), op.dim("K")
    grad = op.param("grad")
    dt = point.dtype
    if op.param("grouped", False):
        if grad == "weight":
            x, dy = random_input((b, m, k), dt, device, gen), random_input((b, m, n), dt, device, gen)
            return Built(lambda: torch.bmm(dy.transpose(1, 2), x), (b, n, k), "torch.bmm", {"layout": "A^T B"})
        x, w = random_input((b, m, k), dt, device, gen), random_input((b, k, n), dt, device, gen)
        return Built(lambda: torch.bmm(x, w), (b, m, n), "torch.bmm")
    tokens = b * m
    if grad == "weight":  # dW (N, K) = dY^T X: the tokens are the contraction
        x, dy = random_input((tokens, k), dt, device, gen), random_input((tokens, n), dt, device, gen)
        return Built(lambda: torch.matmul(dy.t(), x), (n, k), "torch.matmul", {"layout": "A^T B"})
    if grad == "input":  # dX = dY W, W stored (out, in) = (K, N) of this GEMM
        dy, w = random_input((tokens, k), dt, device, gen), random_input((k, n), dt, device, gen)
        return Built(lambda: torch.matmul(dy, w), (tokens, n), "torch.matmul")
    x, w = random_input((tokens, k), dt, device, gen), random_input((n, k), dt, device, gen)
    bias = random_input((n,), dt, device, gen) if op.param("bias", False) else None
    return Built(lambda: torch.nn.functional.linear(x, w, bias), (tokens, n), "torch.linear")


# ----------------------------------------------------------------------------- attention
def attention_product(point: GridPoint, device, seed: int):
    """An attention product of an LLM graph as one batched GEMM: the ``g`` query heads that share
    a key/value head folded into the rows (``batch x kv`` GEMMs); ``a_t`` products read the
    scores transposed and contract the group's queries."""
    import torch

    op = point.op
    gen = seeded_generator(device, seed)
    b, h, m, n, k = (op.dim(d) for d in "BHMNK")
    dt = point.dtype
    group = op.param("out_group", 1) if op.param("a_t") else op.param("kv_group", 1)
    kv = kv_heads_of(h, group)
    if h % kv:  # heads that do not fill their groups: every head its own batch entry
        kv = h
    per = h // kv  # query heads per folded GEMM
    if op.param("a_t"):  # (B*kv, M, per*K) x (B*kv, per*K, N): A stored (queries, M) per head, read transposed
        a = random_input((b * kv, per * k, m), dt, device, gen)
        bb = random_input((b * kv, per * k, n), dt, device, gen)
        return Built(lambda: torch.bmm(a.transpose(1, 2), bb), (b * kv, m, n), "torch.bmm",
                     {"layout": "A^T B", "folded_heads": str(per)})
    a = random_input((b * kv, per * m, k), dt, device, gen)
    if op.param("b_feature", "K") == "K":  # B stored (N, K) per head (keys), read transposed
        bb = random_input((b * kv, n, k), dt, device, gen).transpose(1, 2)
    else:
        bb = random_input((b * kv, k, n), dt, device, gen)
    return Built(lambda: torch.bmm(a, bb), (b * kv, per * m, n), "torch.bmm", {"folded_heads": str(per)})


def sdpa_builder(backend: str):
    """The builder of fused attention kernels with the scaled-dot-product attention ``backend``
    forced (``flash``, ``efficient``, ``cudnn``, ``math``)."""

    def build(point: GridPoint, device, seed: int):
        return _sdpa(point, device, seed, backend)

    return build


def _sdpa(point: GridPoint, device, seed: int, backend: str):
    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel

    op = point.op
    if point.backend and point.backend != backend:
        raise ValueError(f"the point is for the {point.backend} backend, this kernel runs {backend}")
    gen = seeded_generator(device, seed)
    b, h, m, n, d = (op.dim(x) for x in "BHMNK")
    kv = kv_heads_of(h, op.param("kv_group", 1))
    dt = point.dtype
    causal = bool(op.param("causal", False))
    dropout = float(op.param("dropout", 0.0))
    which = getattr(SDPBackend, SDPA_BACKEND_ENUMS[backend])
    backward = op.param("fused") == "bwd"
    q = random_input((b, h, m, d), dt, device, gen).requires_grad_(backward)
    k = random_input((b, kv, n, d), dt, device, gen).requires_grad_(backward)
    v = random_input((b, kv, n, d), dt, device, gen).requires_grad_(backward)
    note = {"layout": "BHSD"}

    def call(q_, k_, v_, gqa: bool):
        with sdpa_kernel(which):
            return torch.nn.functional.scaled_dot_product_attention(q_, k_, v_, dropout_p=dropout, is_causal=causal,
                                                                    enable_gqa=gqa)

    gqa = kv < h
    k_in, v_in = k, v
    if gqa:
        try:  # the backend reads the shared key/value heads itself, or refuses to
            with torch.no_grad():
                call(q[:1, :, :1].detach(), k[:1, :, :1].detach(), v[:1, :, :1].detach(), True)
        except RuntimeError:
            gqa = False
            k_in, v_in = k.repeat_interleave(h // kv, dim=1), v.repeat_interleave(h // kv, dim=1)
            note["kv"] = "expanded"
    if not backward:
        def fn():
            with torch.no_grad():
                return call(q, k_in, v_in, gqa)

        return Built(fn, (b, h, m, d), "torch.sdpa", note, backend)
    out = call(q, k_in, v_in, gqa)
    dout = random_input((b, h, m, d), dt, device, gen)

    def fn_bwd():
        return torch.autograd.grad(out, (q, k, v), dout, retain_graph=True)[0]

    note["backward"] = "autograd"
    return Built(fn_bwd, (b, h, m, d), "torch.sdpa", note, backend)


# ----------------------------------------------------------------------------- element-wise
def _dropout(point, device, gen, x, **_):
    import torch

    p = float(point.op.param("p", 0.1))
    return lambda: torch.native_dropout(x[0], p, True)[0], "torch.native_dropout", {}


def _dropout_grad(point, device, gen, x, **_):
    import torch

    p = float(point.op.param("p", 0.1))
    mask = torch.rand(x[0].shape, generator=gen, device=device) >= p
    return (lambda: torch.ops.aten.native_dropout_backward(x[0], mask, 1.0 / (1.0 - p)),
            "torch.native_dropout_backward", {})


def _gelu_grad(point, device, gen, x, **_):
    import torch

    inp, dy = x
    return lambda: torch.ops.aten.gelu_backward(dy, inp), "torch.gelu_backward", {}


def _swiglu(point, device, gen, x, **_):
    import torch.nn.functional as F

    gate, up = x
    return lambda: F.silu(gate) * up, "torch.silu_mul", {"launches": "2"}


def _swiglu_gate_grad(point, device, gen, x, **_):
    import torch

    gate, up, dy = x
    return lambda: torch.ops.aten.silu_backward(dy * up, gate), "torch.silu_backward_mul", {"launches": "2"}


def _swiglu_up_grad(point, device, gen, x, **_):
    import torch.nn.functional as F

    gate, dy = x
    return lambda: F.silu(gate) * dy, "torch.silu_mul", {"launches": "2"}


def _rope(point, device, gen, x, random, **_):
    import torch

    (t,) = x
    n, tokens, features = t.shape
    d = point.hint("head_dim") or features
    if features % d or d % 2:
        raise ValueError(f"rotary embedding over {features} features needs an even head dimension dividing it, got {d}")
    x4 = t.view(n, tokens, features // d, d)
    cos = random((tokens, 1, d))
    sin = random((tokens, 1, d))
    if point.op.param("fn") == "rope_grad":
        sin = -sin
    half = d // 2

    def fn():
        rotated = torch.cat((-x4[..., half:], x4[..., :half]), dim=-1)
        return x4 * cos + rotated * sin

    return fn, "torch.rope_eager", {"launches": "5"}


def _softmax_grad(point, device, gen, x, **_):
    import torch

    y, dy = x
    rows = point.hint("rows") or y.shape[-1]
    if y.numel() % rows:
        raise ValueError(f"softmax rows of {rows} do not divide {y.numel()} elements")
    y2, dy2 = y.reshape(-1, rows), dy.reshape(-1, rows)
    return lambda: torch._softmax_backward_data(dy2, y2, -1, y2.dtype), "torch.softmax_backward", {}


def _cross_entropy_grad(point, device, gen, x, **_):
    import torch

    (p,) = x
    n, tokens, vocab = p.shape
    rows = n * tokens
    scale = 1.0 / rows
    flat = p.reshape(rows, vocab)
    targets = torch.randint(0, vocab, (rows,), generator=gen, device=device)
    index = torch.arange(rows, device=device) * vocab + targets
    minus = torch.full((rows,), -scale, dtype=p.dtype, device=device)

    def fn():
        g = flat * scale
        g.view(-1).index_add_(0, index, minus)
        return g.view(n, tokens, vocab)

    return fn, "torch.cross_entropy_backward", {"launches": "2"}


def _embedding_grad(point, device, gen, x, **_):
    import torch

    (dy,) = x
    n, tokens, hidden = dy.shape
    vocab = point.hint("vocab") or tokens
    rows = dy.reshape(n * tokens, hidden)
    ids = torch.randint(0, vocab, (n * tokens,), generator=gen, device=device)
    table = torch.zeros((vocab, hidden), dtype=dy.dtype, device=device)
    return lambda: table.index_add_(0, ids, rows), "torch.index_add", {"table_rows": str(vocab)}


def _router(point, device, gen, x, **_):
    """MoE gating over the experts (features last): forward softmax, top-k and the renormalised
    gates scattered back; backward (inputs gates and dY) the softmax gradient of the kept gates."""
    import torch

    top_k = point.hint("top_k") or 1
    if len(x) == 1:
        (logits,) = x

        def fn():
            probs = torch.softmax(logits, dim=-1)
            vals, idx = torch.topk(probs, top_k, dim=-1)
            return torch.zeros_like(probs).scatter_(-1, idx, vals / vals.sum(-1, keepdim=True))

        return fn, "torch.topk_gating", {"top_k": str(top_k)}
    gates, dy = x
    return (lambda: torch._softmax_backward_data(dy * (gates > 0), gates, -1, gates.dtype),
            "torch.topk_gating_backward", {"top_k": str(top_k)})


def _grad_accumulate(point, device, gen, x, **_):
    import torch

    first, *rest = x

    def fn():
        y = torch.add(first, rest[0]) if rest else first.clone()
        for t in rest[1:]:
            y = torch.add(y, t)
        return y

    return fn, "torch.add", {}


LLM_ELEMENTWISE = {"dropout": _dropout, "dropout_grad": _dropout_grad, "gelu_grad": _gelu_grad, "swiglu": _swiglu,
                   "swiglu_gate_grad": _swiglu_gate_grad, "swiglu_up_grad": _swiglu_up_grad, "rope": _rope,
                   "rope_grad": _rope, "softmax_grad": _softmax_grad, "cross_entropy_grad": _cross_entropy_grad,
                   "embedding_grad": _embedding_grad, "grad_accumulate": _grad_accumulate, "router": _router}
"""Element-wise functions of training graphs (``fn``) and their kernels."""


def llm_elementwise(point: GridPoint, device, seed: int):
    """An element-wise op of an LLM graph whose ``fn`` is in :data:`LLM_ELEMENTWISE`: its inputs
    as token tensors (features last), then the function's kernel."""
    op = point.op
    gen = seeded_generator(device, seed)
    fn_name = op.param("fn")
    make = LLM_ELEMENTWISE[fn_name]
    inputs = [random_input(_tokens(s), point.dtype, device, gen) for s in op.in_shapes]
    fn, kernel, note = make(point, device, gen, inputs,
                            random=lambda shape: random_input(shape, point.dtype, device, gen))
    out = fn()
    return Built(fn, tuple(out.shape), kernel, note)


# ----------------------------------------------------------------------------- norms
def llm_norm(point: GridPoint, device, seed: int):
    """RMSNorm forward, and the LayerNorm and RMSNorm gradients (over the features)."""
    import torch
    import torch.nn.functional as F

    op = point.op
    gen = seeded_generator(device, seed)
    kind = op.param("norm")
    n, c, h, w = op.in_shapes[0]
    shape = (n, h * w, c)
    x = random_input(shape, point.dtype, device, gen)
    scale = random_input((c,), point.dtype, device, gen)
    if kind == "rms":
        return Built(lambda: F.rms_norm(x, (c,), scale, 1e-5), shape, "torch.rms_norm")
    dy = random_input(shape, point.dtype, device, gen)
    if kind == "layer_grad":
        shift = random_input((c,), point.dtype, device, gen)
        _, mean, rstd = torch.native_layer_norm(x, (c,), scale, shift, 1e-5)

        def fn():
            return torch.ops.aten.native_layer_norm_backward(dy, x, (c,), mean, rstd, scale, shift,
                                                             (True, True, True))[0]

        return Built(fn, shape, "torch.layer_norm_backward")
    if kind == "rms_grad":
        xg = x.detach().requires_grad_(True)
        sg = scale.detach().requires_grad_(True)
        y = F.rms_norm(xg, (c,), sg, 1e-5)
        return Built(lambda: torch.autograd.grad(y, (xg, sg), dy, retain_graph=True)[0], shape,
                     "torch.rms_norm_backward", {"backward": "autograd"})
    raise ValueError(f"no LLM kernel for norm {kind!r}")


# ----------------------------------------------------------------------------- optimizer
def adamw(point: GridPoint, device, seed: int) -> Any:
    """The AdamW step of one parameter group: ``torch.optim.AdamW(fused=True)`` over a flat fp32
    buffer of its parameters (gradient, two moments), then the 16-bit weight copy."""
    import torch

    op = point.op
    gen = seeded_generator(device, seed)
    count = op.dim("N") * op.dim("C") * op.dim("H") * op.dim("W")
    param = torch.nn.Parameter(random_input((count,), "fp32", device, gen))
    param.grad = random_input((count,), "fp32", device, gen)
    weight16 = torch.empty((count,), dtype=torch.bfloat16, device=device)
    opt = torch.optim.AdamW([param], lr=1e-4, weight_decay=0.1, fused=True)

    def fn():
        opt.step()
        weight16.copy_(param.detach())
        return param.detach()

    return Built(fn, (count,), "torch.adamw", {"weight_copy": "bf16"}, "fused")
