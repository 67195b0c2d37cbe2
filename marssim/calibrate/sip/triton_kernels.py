"""Triton sources of the kernels SIP tunes: the paper's GEMM + LeakyReLU and a fused attention
forward pass (online softmax, one query block per program).

This module imports :mod:`triton` at import time; import it only through
:mod:`marssim.calibrate.sip.kernels`, which keeps the launch metadata and works without Triton.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def gemm_leaky_relu_kernel(a_ptr, b_ptr, c_ptr, M, N, K,
                           stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn,
                           BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                           GROUP_M: tl.constexpr, ACTIVATION: tl.constexpr):
    """C = act(A @ B) with fp32 accumulation, fp16 output; ``ACTIVATION`` 1 = LeakyReLU(0.01),
    0 = none. Programs are grouped ``GROUP_M`` block rows at a time so neighbouring programs
    share tiles of B in L2."""
    pid = tl.program_id(axis=0)
    blocks_m = tl.cdiv(M, BLOCK_M)
    blocks_n = tl.cdiv(N, BLOCK_N)
    programs_per_group = GROUP_M * blocks_n
    group = pid // programs_per_group
    first_m = group * GROUP_M
    rows_in_group = min(blocks_m - first_m, GROUP_M)
    block_m = first_m + (pid % programs_per_group) % rows_in_group
    block_n = (pid % programs_per_group) // rows_in_group

    rows = (block_m * BLOCK_M + tl.arange(0, BLOCK_M)) % M
    cols = (block_n * BLOCK_N + tl.arange(0, BLOCK_N)) % N
    ks = tl.arange(0, BLOCK_K)
    a_tile = a_ptr + rows[:, None] * stride_am + ks[None, :] * stride_ak
    b_tile = b_ptr + ks[:, None] * stride_bk + cols[None, :] * stride_bn
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, tl.cdiv(K, BLOCK_K)):
        k_left = K - k0 * BLOCK_K
        a = tl.load(a_tile, mask=ks[None, :] < k_left, other=0.0)
        b = tl.load(b_tile, mask=ks[:, None] < k_left, other=0.0)
        acc = tl.dot(a, b, acc)
        a_tile += BLOCK_K * stride_ak
        b_tile += BLOCK_K * stride_bk
    if ACTIVATION == 1:
        acc = tl.where(acc >= 0, acc, 0.01 * acc)
    out = acc.to(tl.float16)
    out_rows = block_m * BLOCK_M + tl.arange(0, BLOCK_M)
    out_cols = block_n * BLOCK_N + tl.arange(0, BLOCK_N)
    c_tile = c_ptr + out_rows[:, None] * stride_cm + out_cols[None, :] * stride_cn
    tl.store(c_tile, out, mask=(out_rows[:, None] < M) & (out_cols[None, :] < N))


@triton.jit
def attention_fwd_kernel(q_ptr, k_ptr, v_ptr, o_ptr, sm_scale,
                         stride_qz, stride_qh, stride_qm, stride_qd,
                         stride_kz, stride_kh, stride_kn, stride_kd,
                         stride_vz, stride_vh, stride_vn, stride_vd,
                         stride_oz, stride_oh, stride_om, stride_od,
                         H, N_CTX,
                         HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """O = softmax(Q K^T * sm_scale) V for one (batch, head, query block) per program, streaming
    over key/value blocks with a running max and running sum (base-2 exponentials).
    Non-causal; ``N_CTX`` must be a multiple of ``BLOCK_N`` and of ``BLOCK_M``."""
    block_q = tl.program_id(0)
    zh = tl.program_id(1)
    z = zh // H
    h = zh % H
    q_base = q_ptr + z * stride_qz + h * stride_qh
    k_base = k_ptr + z * stride_kz + h * stride_kh
    v_base = v_ptr + z * stride_vz + h * stride_vh
    o_base = o_ptr + z * stride_oz + h * stride_oh

    rows = block_q * BLOCK_M + tl.arange(0, BLOCK_M)
    dims = tl.arange(0, HEAD_DIM)
    keys = tl.arange(0, BLOCK_N)
    q = tl.load(q_base + rows[:, None] * stride_qm + dims[None, :] * stride_qd)
    qk_scale = sm_scale * 1.4426950408889634  # log2(e): exp(x) = exp2(x * log2(e))
    running_max = tl.full((BLOCK_M,), float("-inf"), dtype=tl.float32)
    running_sum = tl.zeros((BLOCK_M,), dtype=tl.float32)
    acc = tl.zeros((BLOCK_M, HEAD_DIM), dtype=tl.float32)
    for start in range(0, N_CTX, BLOCK_N):
        k_t = tl.load(k_base + (start + keys)[None, :] * stride_kn + dims[:, None] * stride_kd)
        scores = tl.dot(q, k_t) * qk_scale
        new_max = tl.maximum(running_max, tl.max(scores, 1))
        p = tl.math.exp2(scores - new_max[:, None])
        correction = tl.math.exp2(running_max - new_max)
        running_sum = running_sum * correction + tl.sum(p, 1)
        acc = acc * correction[:, None]
        v = tl.load(v_base + (start + keys)[:, None] * stride_vn + dims[None, :] * stride_vd)
        acc = tl.dot(p.to(tl.float16), v, acc)
        running_max = new_max
    out = acc / running_sum[:, None]
    tl.store(o_base + rows[:, None] * stride_om + dims[None, :] * stride_od, out.to(tl.float16))
