// Block sum reduction through shared memory and warp shuffles: STS/LDS, BAR.SYNC, SHFL,
// a global atomic. Source of test cubins for marssim.calibrate.sip.
extern "C" __global__ void smem_reduce(const float *__restrict__ x, float *__restrict__ total, int n) {
    __shared__ float partial[256];
    int tid = threadIdx.x;
    int i = blockIdx.x * 256 + tid;
    partial[tid] = (i < n) ? x[i] : 0.0f;
    __syncthreads();
    for (int stride = 128; stride >= 32; stride >>= 1) {
        if (tid < stride) {
            partial[tid] += partial[tid + stride];
        }
        __syncthreads();
    }
    if (tid < 32) {
        float v = partial[tid];
        for (int offset = 16; offset > 0; offset >>= 1) {
            v += __shfl_down_sync(0xffffffffu, v, offset);
        }
        if (tid == 0) {
            atomicAdd(total, v);
        }
    }
}
