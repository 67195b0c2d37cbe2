// Two kernels in one cubin (saxpy_loop and smem_reduce): multi-kernel parsing and patching.
#include "saxpy_loop.cu"
#include "smem_reduce.cu"
