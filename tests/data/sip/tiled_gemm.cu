// 16x16 shared-memory tiled SGEMM, C = A (MxK) * B (KxN), row major, with cp.async
// double buffering on sm_80+: LDGSTS, DEPBAR, LDS, FFMA chains, BAR.SYNC.
// Source of test cubins for marssim.calibrate.sip.
#include <cuda_pipeline.h>

#define TILE 16

extern "C" __global__ void tiled_gemm(const float *__restrict__ A, const float *__restrict__ B,
                                      float *__restrict__ C, int M, int N, int K) {
    __shared__ float As[2][TILE][TILE];
    __shared__ float Bs[2][TILE][TILE];
    int tx = threadIdx.x, ty = threadIdx.y;
    int row = blockIdx.y * TILE + ty;
    int col = blockIdx.x * TILE + tx;
    float acc = 0.0f;
    int tiles = K / TILE;
    __pipeline_memcpy_async(&As[0][ty][tx], &A[row * K + tx], sizeof(float));
    __pipeline_memcpy_async(&Bs[0][ty][tx], &B[ty * N + col], sizeof(float));
    __pipeline_commit();
    for (int t = 0; t < tiles; ++t) {
        int cur = t & 1;
        if (t + 1 < tiles) {
            int k0 = (t + 1) * TILE;
            __pipeline_memcpy_async(&As[cur ^ 1][ty][tx], &A[row * K + k0 + tx], sizeof(float));
            __pipeline_memcpy_async(&Bs[cur ^ 1][ty][tx], &B[(k0 + ty) * N + col], sizeof(float));
        }
        __pipeline_commit();
        __pipeline_wait_prior(1);
        __syncthreads();
#pragma unroll
        for (int k = 0; k < TILE; ++k) {
            acc += As[cur][ty][k] * Bs[cur][k][tx];
        }
        __syncthreads();
    }
    if (row < M && col < N) {
        C[row * N + col] = acc;
    }
}
