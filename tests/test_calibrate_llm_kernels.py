"""The harness's kernels for the LLM grid, built and run on the CPU with tiny shapes: every point
gets a kernel whose output has the op's elements; gradient kernels compute what autograd
computes on the same inputs (drawn again from the same seed); the fused attention kernels name
their backend, and flash and math agree where both run on a CPU (the memory-efficient and cuDNN
backends are CUDA-only: constructed and named, not run). Skipped without torch."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

torch = pytest.importorskip("torch", reason="building the harness's kernels needs torch (marssim[gpu])")

from marssim.calibrate.grid import SDPA, MEASURE_KINDS, build_grid  # noqa: E402
from marssim.calibrate.kernels import kernels_for  # noqa: E402
from marssim.calibrate.tensors import random_input  # noqa: E402
from marssim.calibrate.llm import LlmGridOptions, llm_grid  # noqa: E402

GPT = "gpt3-125m:hidden=128,heads=2,vocab=301"
LLAMA = "llama:hidden=128,heads=4,kv_heads=2,ffn=256,vocab=301"
OPTIONS = LlmGridOptions(models=(GPT, LLAMA), tp=(1, 2), micro_batches=(1,), seq=32, decode_contexts=(16,),
                         decode_batches=(2,), backends=("flash", "efficient", "cudnn", "math"))
CPU_BACKENDS = ("flash", "math")


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def points():
    return llm_grid(OPTIONS)


def _runs_on_cpu(point) -> bool:
    """Whether the point's kernel has a CPU implementation: the fused attention backends flash
    (without dropout) and math."""
    if point.measure_kind != SDPA:
        return True
    return point.backend in CPU_BACKENDS and not (point.backend == "flash" and point.op.param("dropout"))


def test_every_llm_kernel_gives_the_ops_elements(points):
    ran = set()
    for p in points:
        impls = kernels_for(p, triton=False)
        assert len(impls) == 1, (p.describe(), [k.name for k in impls])
        impl = impls[0]
        assert impl.backend == (p.backend or ("fused" if p.op.param("fn") == "adam" else ""))
        if not _runs_on_cpu(p):
            continue
        built = impl.build(p, "cpu", 0)
        out = built.fn()
        assert tuple(out.shape) == tuple(built.expected), (impl.name, p.describe())
        assert bool(torch.isfinite(out).all()), (impl.name, p.describe())
        op = p.op
        if p.measure_kind == SDPA:  # the context, or (backward) the queries' gradient
            assert out.numel() == op.dim("B") * op.dim("H") * op.dim("M") * op.dim("K")
            assert built.backend == p.backend and built.kernel == "torch.sdpa"
        elif op.param("fn") == "embedding_grad":  # the table gradient the rows are added into
            assert out.shape == (p.hint("vocab"), op.out_shape[1])
        elif op.param("fn") == "adam":
            assert out.numel() == op.dim("C")
        else:
            assert out.numel() == math.prod(op.out_shape), (impl.name, p.describe())
        ran.add((p.measure_kind, p.phase, p.backend))
    assert {("gemm", "dgrad", ""), ("gemm", "wgrad", ""), ("attention", "wgrad", ""), ("elementwise", "update", ""),
            ("norm", "bwd", ""), ("sdpa", "fwd", "flash"), ("sdpa", "bwd", "math"), ("sdpa", "fwd", "math"),
            ("elementwise", "bwd", ""), ("softmax", "fwd", ""), ("embedding", "fwd", "")} <= ran


def test_cuda_only_backends_are_built_for_their_points_only(points):
    for backend in ("efficient", "cudnn"):
        mine = [p for p in points if p.backend == backend]
        assert mine and all([k.name for k in kernels_for(p)] == [f"torch.sdpa.{backend}"] for p in mine)
    p = next(p for p in points if p.backend == "flash")
    impl = next(k for k in kernels_for(p))
    with pytest.raises(ValueError, match="efficient"):  # a kernel never times another backend's point
        impl.builder(replace(p, backend="efficient"), "cpu", 0)


def test_flash_and_math_agree_forward_and_backward(points):
    sdpa = [p for p in points if p.backend == "flash" and _runs_on_cpu(p)]
    assert any(p.phase == "bwd" for p in sdpa) and any(p.op.param("kv_group", 1) > 1 for p in sdpa)
    for p in sdpa:
        math_point = next(q for q in points if q.backend == "math" and q.key[:10] == p.key[:10])
        a = kernels_for(p)[0].build(p, "cpu", 3).fn().float()
        b = kernels_for(math_point)[0].build(math_point, "cpu", 3).fn().float()  # the same seed, the same inputs
        assert float((a - b).abs().max()) < 0.05 * float(b.abs().max()), p.describe()


def _draw(point, seed, shapes):
    gen = torch.Generator(device="cpu")
    gen.manual_seed(seed)
    return [random_input(s, point.dtype, "cpu", gen) for s in shapes]


def _point(points, predicate):
    return next(p for p in points if predicate(p))


def test_gemm_gradients_are_the_products_autograd_computes(points):
    p = _point(points, lambda p: p.phase == "wgrad" and p.kind == "gemm")
    b, m, n, k = (p.op.dim(d) for d in "BMNK")
    x, dy = _draw(p, 1, [(b * m, k), (b * m, n)])
    w = torch.zeros((n, k), dtype=x.dtype, requires_grad=True)
    (torch.nn.functional.linear(x, w) * dy).sum().backward()  # nn.Linear's weight gradient
    got = kernels_for(p)[0].build(p, "cpu", 1).fn()
    assert torch.allclose(got.float(), w.grad.float(), rtol=2e-2, atol=2e-2)
    p = _point(points, lambda p: p.phase == "dgrad" and p.kind == "gemm")
    b, m, n, k = (p.op.dim(d) for d in "BMNK")
    dy, w = _draw(p, 1, [(b * m, k), (k, n)])  # W stored (out, in): out = this GEMM's K
    x = torch.zeros((b * m, n), dtype=dy.dtype, requires_grad=True)
    (torch.nn.functional.linear(x, w) * dy).sum().backward()
    assert torch.allclose(kernels_for(p)[0].build(p, "cpu", 1).fn().float(), x.grad.float(), rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize("fn", ["swiglu_gate_grad", "swiglu_up_grad", "gelu_grad", "softmax_grad"])
def test_activation_gradients_are_what_autograd_computes(points, fn):
    p = _point(points, lambda p: p.op.param("fn") == fn)
    shapes = [(s[0], s[2] * s[3], s[1]) for s in p.op.in_shapes]
    ins = [t.float() for t in _draw(p, 2, shapes)]
    got = kernels_for(p)[0].build(p, "cpu", 2).fn().float()
    if fn == "softmax_grad":
        y, dy = (t.reshape(-1, p.hint("rows")) for t in ins)
        want = y * (dy - (dy * y).sum(-1, keepdim=True))
        assert torch.allclose(got.reshape(want.shape), want, rtol=5e-2, atol=5e-2)
        return
    leaf = ins[0].clone().requires_grad_(True)
    if fn == "swiglu_gate_grad":
        gate, up, dy = ins
        (torch.nn.functional.silu(leaf) * up * dy).sum().backward()
    elif fn == "swiglu_up_grad":  # d/dup of silu(gate) * up is silu(gate): the kernel reads gate and dy
        gate, dy = ins
        up = torch.zeros_like(gate, requires_grad=True)
        (torch.nn.functional.silu(gate) * up * dy).sum().backward()
        leaf = up
    else:
        x, dy = ins
        (torch.nn.functional.gelu(leaf) * dy).sum().backward()
    assert torch.allclose(got, leaf.grad, rtol=5e-2, atol=5e-2), fn


@pytest.mark.parametrize("norm", ["layer_grad", "rms_grad"])
def test_norm_gradients_are_what_autograd_computes(points, norm):
    p = _point(points, lambda p: p.op.param("norm") == norm)
    n, c, h, w = p.op.in_shapes[0]
    x, scale, dy = _draw(p, 4, [(n, h * w, c), (c,), (n, h * w, c)])
    if norm == "layer_grad":  # the kernel draws the shift after the scale and dY
        shift = _draw(p, 4, [(n, h * w, c), (c,), (n, h * w, c), (c,)])[3]
    xs = x.float().requires_grad_(True)
    y = torch.nn.functional.layer_norm(xs, (c,), scale.float(), shift.float(), 1e-5) if norm == "layer_grad" else \
        torch.nn.functional.rms_norm(xs, (c,), scale.float(), 1e-5)
    (y * dy.float()).sum().backward()
    got = kernels_for(p)[0].build(p, "cpu", 4).fn().float()
    assert torch.allclose(got, xs.grad, rtol=5e-2, atol=5e-2)


def test_adamw_step_moves_every_parameter_once_per_run(points):
    p = _point(points, lambda p: p.op.param("fn") == "adam")
    built = kernels_for(p)[0].build(p, "cpu", 0)
    first = built.fn().clone()
    second = built.fn()
    assert built.backend == "fused" and built.kernel == "torch.adamw"
    assert bool((first != second).all())  # every parameter updated by the second step


def test_zoo_kinds_keep_their_kernels():
    """The LLM kernels serve only ops of LLM graphs: a zoo GEMM is still torch.matmul/linear as
    measured before, and sdpa is a kind of the LLM grid only."""
    points = build_grid(("bert-base",), ("gemm", "attention"), ("fp32",), sweep=False)
    kernels = {kernels_for(p, triton=False)[0].build(p, "cpu", 0).kernel for p in points}
    assert kernels == {"torch.linear", "torch.bmm"}
    assert SDPA in MEASURE_KINDS


def test_a_mixture_of_experts_grid_builds_too():
    options = LlmGridOptions(models=("mixtral-8x7b:hidden=128,heads=4,kv_heads=2,ffn=256,vocab=301",), tp=(1, 2),
                             micro_batches=(1,), seq=32, prefill=False, decode_contexts=(), attention=("unfused",))
    points = llm_grid(options)
    grouped = [p for p in points if p.op.param("grouped")]
    assert {p.phase for p in grouped} == {"fwd", "dgrad", "wgrad"}
    for p in points:
        built = kernels_for(p, triton=False)[0].build(p, "cpu", 0)
        out = built.fn()
        assert tuple(out.shape) == tuple(built.expected) and bool(torch.isfinite(out).all()), p.describe()
        if p.op.param("fn") == "router" and p.phase == "fwd":  # top-2 of 8 experts, renormalised
            assert bool(((out > 0).sum(-1) == 2).all()) and torch.allclose(out.float().sum(-1),
                                                                          torch.ones(out.shape[:-1]), atol=1e-2)
