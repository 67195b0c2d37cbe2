"""Compile the Triton kernels SIP tunes (marssim.calibrate.sip.kernels) to cubins, offline (no
GPU): gemm_leaky_relu (the paper's GEMM) and attention_fwd (HEAD_DIM=64), each for its Hopper
code path (sm_90a) and its Ampere code path (sm_80, the paper's A100 setting), the latter also
assembled for sm_90 (what runs on an H100: a cubin runs only on GPUs of its major version).
Usage: python build_triton.py OUT_DIR [NAME.TARGET[.SASS] ...] (default: all; see build.sh)."""

import json
import sys
from pathlib import Path

from marssim.calibrate.sip.kernels import KERNELS, compile_cubin

BUILDS = {  # file stem -> (kernel, Triton target, SASS architecture)
    "gemm_leaky_relu.sm_90a": ("gemm_leaky_relu", 90, None),
    "attention_fwd.sm_90a": ("attention_fwd", 90, None),
    "gemm_leaky_relu.sm_80": ("gemm_leaky_relu", 80, None),
    "attention_fwd.sm_80": ("attention_fwd", 80, None),
    "gemm_leaky_relu.sm_80.sm_90": ("gemm_leaky_relu", 80, "sm_90"),
    "attention_fwd.sm_80.sm_90": ("attention_fwd", 80, "sm_90"),
}

out = Path(sys.argv[1])
wanted = sys.argv[2:] or list(BUILDS)
meta_path = out / "triton_meta.json"
meta_all = json.loads(meta_path.read_text()) if meta_path.exists() else {}
for stem in wanted:
    name, arch, sass = BUILDS[stem]
    spec = KERNELS[name]
    cubin, meta = compile_cubin(spec, spec.default_shape, arch=arch, sass_arch=sass)
    (out / f"{stem}.cubin").write_bytes(cubin)
    meta_all[name if stem.endswith("sm_90a") else stem] = meta
meta_path.write_text(json.dumps(meta_all, indent=1, sort_keys=True) + "\n")
