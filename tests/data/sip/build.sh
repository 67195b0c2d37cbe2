#!/usr/bin/env bash
# Regenerate the test cubins of marssim.calibrate.sip. Needs nvcc (CUDA 12.x/13.x) and, for the
# Triton kernels, the `triton` wheel (it compiles sm_90a and sm_80 cubins without a GPU; the sm_80
# code path is also assembled for sm_90, what an H100 runs):
#   bash tests/data/sip/build.sh            (from the repository root)
# TRITON_PYTHONPATH may point at a directory holding triton (pip install --target DIR triton).
# Records the tool versions in VERSIONS. CI never runs this: the cubins are committed.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../../.." && pwd)"
cd "$here"
for kernel in saxpy_loop smem_reduce tiled_gemm mma_f16; do
    for arch in sm_80 sm_90; do
        nvcc -cubin -O3 -arch="$arch" -o "$kernel.$arch.cubin" "$kernel.cu"
    done
done
nvcc -cubin -O3 -arch=sm_90a -o tiled_gemm.sm_90a.cubin tiled_gemm.cu
nvcc -cubin -O3 -arch=sm_90 -o pair.sm_90.cubin pair.cu
TRITON_DEFAULT_FP_FUSION=1 PYTHONPATH="$root${TRITON_PYTHONPATH:+:$TRITON_PYTHONPATH}" \
    python "$here/build_triton.py" "$here"
{
    nvcc --version | tail -n 2 | head -n 1
    TRITON_DEFAULT_FP_FUSION=1 PYTHONPATH="$root${TRITON_PYTHONPATH:+:$TRITON_PYTHONPATH}" \
        python -c "import triton; print('triton', triton.__version__)"
    TRITON_DEFAULT_FP_FUSION=1 PYTHONPATH="$root${TRITON_PYTHONPATH:+:$TRITON_PYTHONPATH}" \
        python -c "from triton.backends.nvidia.compiler import get_ptxas; print('triton ptxas: sm_80', get_ptxas(80).version, '| sm_90 and later', get_ptxas(90).version)"
} > VERSIONS
# the latency table the legality model reads is derived from these cubins
PYTHONPATH="$root" python "$root/analysis/sip_latencies.py" --write > "$root/analysis/results/sip_latencies.txt"
ls -l ./*.cubin
