"""Compile the Triton kernels SIP tunes (marssim.calibrate.sip.kernels) to sm_90a cubins,
offline (no GPU): gemm_leaky_relu (the paper's GEMM) and attention_fwd (HEAD_DIM=64).
Usage: python build_triton.py OUT_DIR (see build.sh)."""

import json
import sys
from pathlib import Path

from marssim.calibrate.sip.kernels import KERNELS, compile_cubin

out = Path(sys.argv[1])
meta_all = {}
for name in ("gemm_leaky_relu", "attention_fwd"):
    spec = KERNELS[name]
    cubin, meta = compile_cubin(spec, spec.default_shape, arch=90)
    (out / f"{name}.sm_90a.cubin").write_bytes(cubin)
    meta_all[name] = meta
(out / "triton_meta.json").write_text(json.dumps(meta_all, indent=1, sort_keys=True) + "\n")
