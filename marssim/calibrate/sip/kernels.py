"""The kernels SIP tunes, with everything needed to compile and launch them outside Triton's
runtime: Triton signature, compile-time constants, grid, block, and numpy inputs and reference.

Registered kernels (``KERNELS``):

* ``gemm_leaky_relu``: the paper's C = LeakyReLU(A @ B), fp16 in and out, fp32 accumulation;
  default shape M, N, K = 512, 512, 2048.
* ``gemm``: the same kernel without the activation; the GEMM the calibration harness times.
* ``attention_fwd``: fused attention forward (non-causal), fp16; default shape
  Z, H, N_CTX, HEAD_DIM = 4, 48, 4096, 64 (the Triton tutorial's benchmark shape) — the same
  kernel serves the calibration harness at other shapes.

Nothing here imports Triton or CUDA until :func:`compile_cubin` is called. Shapes are dicts of
positive ints; :func:`parse_shape` reads ``M=512,N=512,K=2048`` from the command line.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from marssim.errors import InputError

__all__ = ["KernelSpec", "KERNELS", "get_kernel", "parse_shape", "LaunchPlan", "compile_cubin",
           "reference_output", "TARGETS", "sass_arch_for"]


@dataclass(frozen=True)
class LaunchPlan:
    """How to launch one compiled kernel at one shape.

    ``args`` lists the kernel's runtime arguments in signature order: numpy arrays (copied to the
    device; ``outputs`` names those read back) or Python scalars with their Triton type in
    ``arg_types``. ``grid`` and ``block`` are CUDA launch dimensions (``block[0]`` = 32 x warps).
    """

    kernel: str
    shape: Mapping[str, int]
    arg_names: tuple[str, ...]
    arg_types: tuple[str, ...]
    args: tuple[Any, ...]
    outputs: tuple[str, ...]
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    flops: float


@dataclass(frozen=True)
class KernelSpec:
    """One tunable kernel: Triton function name (in :mod:`.triton_kernels`), runtime signature,
    compile-time constants, compile options and a launch-plan builder."""

    name: str
    function: str
    description: str
    shape_keys: tuple[str, ...]
    default_shape: Mapping[str, int]
    signature: Mapping[str, str]
    constexprs: Mapping[str, int]
    num_warps: int
    num_stages: int
    divisible_by_16: tuple[str, ...]
    shape_constexprs: tuple[str, ...]
    plan: Callable[[Mapping[str, int], np.random.Generator], LaunchPlan] = field(repr=False)
    reference: Callable[[LaunchPlan], dict[str, np.ndarray]] = field(repr=False)
    shape_rule: Callable[[Mapping[str, int]], str | None] = field(repr=False)


def _fp16(rng: np.random.Generator, *shape: int) -> np.ndarray:
    """Uniform(-1, 1) fp16 values: small enough that fp16 outputs do not overflow. Drawn in
    float32, whose conversion to fp16 is vectorised (the paper's attention inputs are 12.6 M
    values each, drawn afresh for every accepted candidate)."""
    x = rng.random(size=shape, dtype=np.float32)
    x *= np.float32(2.0)
    x -= np.float32(1.0)
    return x.astype(np.float16)


# ---------------------------------------------------------------- GEMM (+ LeakyReLU)
_GEMM_SIG = {"a_ptr": "*fp16", "b_ptr": "*fp16", "c_ptr": "*fp16", "M": "i32", "N": "i32", "K": "i32",
             "stride_am": "i32", "stride_ak": "constexpr", "stride_bk": "i32", "stride_bn": "constexpr",
             "stride_cm": "i32", "stride_cn": "constexpr", "BLOCK_M": "constexpr", "BLOCK_N": "constexpr",
             "BLOCK_K": "constexpr", "GROUP_M": "constexpr", "ACTIVATION": "constexpr"}
_GEMM_BLOCKS = {"BLOCK_M": 64, "BLOCK_N": 64, "BLOCK_K": 64, "GROUP_M": 8}


def _gemm_rule(shape: Mapping[str, int]) -> str | None:
    for key in ("M", "N", "K"):
        if shape[key] % 64:
            return f"{key} must be a multiple of 64 (the block size), got {shape[key]}"
    return None


def _gemm_plan(name: str) -> Callable[[Mapping[str, int], np.random.Generator], LaunchPlan]:
    def plan(shape: Mapping[str, int], rng: np.random.Generator) -> LaunchPlan:
        m, n, k = shape["M"], shape["N"], shape["K"]
        a, b = _fp16(rng, m, k), _fp16(rng, k, n)
        c = np.zeros((m, n), dtype=np.float16)
        names = ("a_ptr", "b_ptr", "c_ptr", "M", "N", "K", "stride_am", "stride_bk", "stride_cm")
        types = ("*fp16", "*fp16", "*fp16", "i32", "i32", "i32", "i32", "i32", "i32")
        grid = ((m // _GEMM_BLOCKS["BLOCK_M"]) * (n // _GEMM_BLOCKS["BLOCK_N"]), 1, 1)
        return LaunchPlan(name, dict(shape), names, types, (a, b, c, m, n, k, k, n, n), ("c_ptr",),
                          grid, (32 * 4, 1, 1), 2.0 * m * n * k)
    return plan


def _gemm_reference(activation: bool) -> Callable[[LaunchPlan], dict[str, np.ndarray]]:
    def reference(plan: LaunchPlan) -> dict[str, np.ndarray]:
        a, b = plan.args[0].astype(np.float32), plan.args[1].astype(np.float32)
        c = a @ b
        if activation:
            c = np.where(c >= 0, c, np.float32(0.01) * c)
        return {"c_ptr": c.astype(np.float16)}
    return reference


# ---------------------------------------------------------------- fused attention forward
_ATTN_SIG = {"q_ptr": "*fp16", "k_ptr": "*fp16", "v_ptr": "*fp16", "o_ptr": "*fp16", "sm_scale": "fp32",
             **{f"stride_{t}{d}": ("constexpr" if d == "d" else "i32")
                for t in "qkvo" for d in ("z", "h", "m" if t in "qo" else "n", "d")},
             "H": "i32", "N_CTX": "i32", "HEAD_DIM": "constexpr", "BLOCK_M": "constexpr", "BLOCK_N": "constexpr"}
_ATTN_BLOCKS = {"BLOCK_M": 128, "BLOCK_N": 64}


def _attn_rule(shape: Mapping[str, int]) -> str | None:
    if shape["HEAD_DIM"] not in (16, 32, 64, 128):
        return f"HEAD_DIM must be 16, 32, 64 or 128, got {shape['HEAD_DIM']}"
    if shape["N_CTX"] % 128:
        return f"N_CTX must be a multiple of 128 (the query block), got {shape['N_CTX']}"
    return None


def _attn_plan(shape: Mapping[str, int], rng: np.random.Generator) -> LaunchPlan:
    z, h, n, d = shape["Z"], shape["H"], shape["N_CTX"], shape["HEAD_DIM"]
    q, k, v = (_fp16(rng, z, h, n, d) for _ in range(3))
    o = np.zeros((z, h, n, d), dtype=np.float16)
    sm_scale = float(1.0 / np.sqrt(d))
    strides = (h * n * d, n * d, d)  # z, h, row; the head-dim stride 1 is a compile-time constant
    names = ["q_ptr", "k_ptr", "v_ptr", "o_ptr", "sm_scale"]
    values: list[Any] = [q, k, v, o, sm_scale]
    for t in "qkvo":
        for dim, stride in zip(("z", "h", "m" if t in "qo" else "n"), strides):
            names.append(f"stride_{t}{dim}")
            values.append(stride)
    names += ["H", "N_CTX"]
    values += [h, n]
    types = tuple(_ATTN_SIG[x] for x in names)
    grid = (n // _ATTN_BLOCKS["BLOCK_M"], z * h, 1)
    return LaunchPlan("attention_fwd", dict(shape), tuple(names), types, tuple(values), ("o_ptr",), grid,
                      (32 * 8, 1, 1), 4.0 * z * h * n * n * d)


def _attn_reference(plan: LaunchPlan) -> dict[str, np.ndarray]:
    q, k, v = (plan.args[i] for i in range(3))
    scale = np.float32(plan.args[4])
    out = np.empty(q.shape, dtype=np.float16)
    for z in range(q.shape[0]):  # one head at a time: the scores of all heads would not fit
        for h in range(q.shape[1]):
            scores = q[z, h].astype(np.float32) @ k[z, h].astype(np.float32).T
            scores *= scale
            scores -= scores.max(axis=-1, keepdims=True)
            p = np.exp(scores)
            p /= p.sum(axis=-1, keepdims=True)
            out[z, h] = p @ v[z, h].astype(np.float32)
    return {"o_ptr": out}


KERNELS: dict[str, KernelSpec] = {
    "gemm_leaky_relu": KernelSpec(
        "gemm_leaky_relu", "gemm_leaky_relu_kernel", "C = LeakyReLU(A @ B), fp16, the SIP paper's GEMM",
        ("M", "N", "K"), {"M": 512, "N": 512, "K": 2048}, _GEMM_SIG,
        {"stride_ak": 1, "stride_bn": 1, "stride_cn": 1, **_GEMM_BLOCKS, "ACTIVATION": 1}, 4, 4,
        ("a_ptr", "b_ptr", "c_ptr", "M", "N", "K", "stride_am", "stride_bk", "stride_cm"),
        (), _gemm_plan("gemm_leaky_relu"), _gemm_reference(True), _gemm_rule),
    "gemm": KernelSpec(
        "gemm", "gemm_leaky_relu_kernel", "C = A @ B, fp16 (the calibration harness's GEMM)",
        ("M", "N", "K"), {"M": 512, "N": 512, "K": 2048}, _GEMM_SIG,
        {"stride_ak": 1, "stride_bn": 1, "stride_cn": 1, **_GEMM_BLOCKS, "ACTIVATION": 0}, 4, 4,
        ("a_ptr", "b_ptr", "c_ptr", "M", "N", "K", "stride_am", "stride_bk", "stride_cm"),
        (), _gemm_plan("gemm"), _gemm_reference(False), _gemm_rule),
    "attention_fwd": KernelSpec(
        "attention_fwd", "attention_fwd_kernel", "fused attention forward, fp16, non-causal",
        ("Z", "H", "N_CTX", "HEAD_DIM"), {"Z": 4, "H": 48, "N_CTX": 4096, "HEAD_DIM": 64}, _ATTN_SIG,
        {"stride_qd": 1, "stride_kd": 1, "stride_vd": 1, "stride_od": 1, **_ATTN_BLOCKS}, 8, 3,
        ("q_ptr", "k_ptr", "v_ptr", "o_ptr", "stride_qz", "stride_qh", "stride_qm", "stride_kz", "stride_kh",
         "stride_kn", "stride_vz", "stride_vh", "stride_vn", "stride_oz", "stride_oh", "stride_om", "N_CTX"),
        ("HEAD_DIM",), _attn_plan, _attn_reference, _attn_rule),
}


def get_kernel(name: str) -> KernelSpec:
    """The registered kernel ``name``; an :class:`InputError` listing the names otherwise."""
    try:
        return KERNELS[name]
    except KeyError:
        raise InputError(None, "--kernel", f"expected one of {', '.join(sorted(KERNELS))}, got {name!r}") from None


def parse_shape(spec: KernelSpec, text: str | None) -> dict[str, int]:
    """``"M=512,N=512,K=2048"`` -> ``{"M": 512, ...}``; missing keys take the kernel's defaults.
    Raises :class:`InputError` (key ``--shape``) for unknown keys, non-positive values or a shape
    the kernel's block sizes do not divide."""
    shape = dict(spec.default_shape)
    for part in (text or "").split(","):
        if not part.strip():
            continue
        key, sep, value = part.partition("=")
        key = key.strip()
        if not sep or key not in spec.shape_keys:
            raise InputError(None, "--shape", f"expected KEY=INT pairs with keys from {', '.join(spec.shape_keys)}, "
                                              f"got {part.strip()!r}")
        try:
            number = int(value)
        except ValueError:
            number = 0
        if number < 1:
            raise InputError(None, "--shape", f"expected a positive integer for {key}, got {value.strip()!r}")
        shape[key] = number
    problem = spec.shape_rule(shape)
    if problem:
        raise InputError(None, "--shape", problem)
    if 32 * spec.num_warps > 1024:  # pragma: no cover - registry sanity
        raise InputError(None, "--kernel", "too many warps")
    if spec.name.startswith("attention") and shape["Z"] * shape["H"] > 65535:
        raise InputError(None, "--shape", "Z*H must be at most 65535 (grid y limit)")
    return shape


TARGETS = ("sm_90a", "sm_80")
"""Triton code paths a kernel is compiled for: ``sm_90a`` (Hopper: warpgroup MMA, TMA where
Triton uses them) and ``sm_80`` (Ampere: ``mma.sync``, ``cp.async``; the SIP paper's A100
setting)."""


def sass_arch_for(target: str, capability: tuple[int, int] | None) -> str:
    """The SASS architecture a ``target`` code path is assembled for on a GPU of compute
    ``capability`` (None: the target's own). A cubin runs only on GPUs of its own major
    version, so the ``sm_80`` path runs on a Hopper GPU as its PTX assembled for ``sm_90``;
    ``sm_90a`` needs a Hopper GPU."""
    if target not in TARGETS:
        raise InputError(None, "--target", f"expected one of {', '.join(TARGETS)}, got {target!r}")
    if capability is None:
        return target
    major, minor = capability
    if target == "sm_90a":
        if major != 9:
            raise InputError(None, "--target", f"sm_90a code runs on compute capability 9.x, this GPU is {major}.{minor}")
        return "sm_90a"
    if major < 8:
        raise InputError(None, "--target", f"the sm_80 path needs compute capability >= 8.0, this GPU is {major}.{minor}")
    return f"sm_{major}{minor}"


def compile_cubin(spec: KernelSpec, shape: Mapping[str, int], arch: int = 90,
                  sass_arch: str | None = None) -> tuple[bytes, dict[str, Any]]:
    """Compile ``spec`` with Triton for its ``sm_<arch>`` code path without a GPU: ``sm_90a``
    for 90, ``sm_80`` for 80 (see :data:`TARGETS`). With ``sass_arch`` (e.g. ``"sm_90"`` for the
    ``sm_80`` path on an H100) Triton's PTX is assembled by ptxas for that architecture instead,
    with the options Triton gives ptxas.

    Returns the cubin and a metadata dict: kernel name, shared memory bytes, warps, Triton
    version, ``arch`` (the SASS architecture) and ``target`` (the code path). The cubin depends on
    the shape only through ``spec.shape_constexprs`` (e.g. the attention head dimension); other
    dims are runtime arguments. Pointer and shape arguments are declared 16-divisible, as
    Triton's own launcher does for aligned inputs."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from . import triton_kernels

    fn = getattr(triton_kernels, spec.function)
    names = list(fn.arg_names)
    attrs = {(names.index(a),): [["tt.divisibility", 16]] for a in spec.divisible_by_16}
    constexprs = {**spec.constexprs, **{k: shape[k] for k in spec.shape_constexprs}}
    source = ASTSource(fn=fn, signature=dict(spec.signature), constexprs=constexprs, attrs=attrs)
    compiled = triton.compile(source, target=GPUTarget("cuda", arch, 32),
                              options={"num_warps": spec.num_warps, "num_stages": spec.num_stages,
                                       "enable_fp_fusion": True})  # Triton <= 3.9's default, made explicit
    meta = compiled.metadata
    target = f"sm_{arch}{'a' if arch == 90 else ''}"  # Triton targets sm_90a on Hopper
    cubin = bytes(compiled.asm["cubin"])
    if sass_arch is not None and sass_arch != target:
        cubin = _assemble(compiled.asm["ptx"], sass_arch)
    return cubin, {
        "kernel": meta.name, "shared_bytes": int(meta.shared), "num_warps": int(meta.num_warps),
        "num_stages": int(meta.num_stages), "triton": triton.__version__,
        "arch": sass_arch or target, "target": target,
        "global_scratch_size": int(getattr(meta, "global_scratch_size", 0) or 0),
        "profile_scratch_size": int(getattr(meta, "profile_scratch_size", 0) or 0),
    }


def _assemble(ptx: str, sass_arch: str) -> bytes:
    """``ptx`` assembled by Triton's ptxas for ``sass_arch``, with the options Triton uses."""
    import subprocess
    import tempfile
    from pathlib import Path

    from triton.backends.nvidia.compiler import get_ptxas

    ptxas = get_ptxas(int("".join(ch for ch in sass_arch if ch.isdigit()))).path
    with tempfile.TemporaryDirectory() as tmp:
        src, out = Path(tmp) / "kernel.ptx", Path(tmp) / "kernel.cubin"
        src.write_text(ptx)
        proc = subprocess.run([ptxas, "-lineinfo", "--regAllocOptLevel=2", f"--gpu-name={sass_arch}", str(src),
                               "-o", str(out)], capture_output=True, text=True)
        if proc.returncode != 0:
            raise RuntimeError(f"ptxas --gpu-name={sass_arch} failed: {proc.stderr.strip()[:500]}")
        return out.read_bytes()


def reference_output(spec: KernelSpec, plan: LaunchPlan) -> dict[str, np.ndarray]:
    """Outputs computed in numpy (fp32 math, fp16 result) for a sanity check of the original
    kernel; the SIP correctness check compares a candidate with the original kernel instead."""
    return spec.reference(plan)
