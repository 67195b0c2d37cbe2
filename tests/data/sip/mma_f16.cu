// One m16n8k16 fp16 tensor-core tile per warp (mma.sync), fp32 accumulate, with ldmatrix
// from shared memory: LDSM, HMMA. Source of test cubins for marssim.calibrate.sip.
#include <cuda_fp16.h>

extern "C" __global__ void mma_f16(const half *__restrict__ A, const half *__restrict__ B,
                                   float *__restrict__ C) {
    __shared__ __align__(16) half As[16 * 16];
    __shared__ __align__(16) half Bs[8 * 16];
    int lane = threadIdx.x;
    for (int i = lane; i < 256; i += 32) As[i] = A[i];
    for (int i = lane; i < 128; i += 32) Bs[i] = B[i];
    __syncthreads();
    unsigned a[4], b[2];
    unsigned a_addr = (unsigned)__cvta_generic_to_shared(&As[(lane % 16) * 16 + (lane / 16) * 8]);
    unsigned b_addr = (unsigned)__cvta_generic_to_shared(&Bs[(lane % 8) * 16 + ((lane / 8) % 2) * 8]);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(a[0]), "=r"(a[1]), "=r"(a[2]), "=r"(a[3]) : "r"(a_addr));
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0,%1}, [%2];"
                 : "=r"(b[0]), "=r"(b[1]) : "r"(b_addr));
    float c[4] = {0.f, 0.f, 0.f, 0.f};
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
    int g = lane / 4, t = lane % 4;
    C[g * 8 + t * 2] = c[0];
    C[g * 8 + t * 2 + 1] = c[1];
    C[(g + 8) * 8 + t * 2] = c[2];
    C[(g + 8) * 8 + t * 2 + 1] = c[3];
}
