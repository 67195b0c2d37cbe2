// Grid-stride SAXPY with a data-dependent branch: global loads and stores in a loop,
// predicated tails, a conditional block. Source of test cubins for marssim.calibrate.sip.
extern "C" __global__ void saxpy_loop(int n, float a, const float *__restrict__ x,
                                      const float *__restrict__ y, float *__restrict__ out) {
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
        float v = a * x[i] + y[i];
        if (v < 0.0f) {
            v = 0.01f * v;  // LeakyReLU
        }
        out[i] = v;
    }
}
