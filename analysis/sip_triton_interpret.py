"""Run the Triton kernels SIP tunes in Triton's CPU interpreter (TRITON_INTERPRET=1) at small
shapes and compare them with the numpy references of marssim.calibrate.sip.kernels: checks the
kernel sources without a GPU. Needs `triton` and a CPU `torch` (pip install torch==2.13.0 uses
the local CPU wheel here). The latest output is committed in
analysis/results/sip_triton_interpret.txt.

    PYTHONPATH=. python analysis/sip_triton_interpret.py
"""

from __future__ import annotations

import os

os.environ["TRITON_INTERPRET"] = "1"
os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")

import platform  # noqa: E402

import numpy as np  # noqa: E402
import torch  # noqa: E402
import triton  # noqa: E402

from marssim.calibrate.sip import triton_kernels  # noqa: E402
from marssim.calibrate.sip.kernels import KERNELS  # noqa: E402

CASES = [("gemm_leaky_relu", {"M": 128, "N": 128, "K": 256}), ("gemm", {"M": 64, "N": 128, "K": 128}),
         ("attention_fwd", {"Z": 1, "H": 2, "N_CTX": 256, "HEAD_DIM": 64})]


def main() -> None:
    print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores; "
          f"triton {triton.__version__} interpreter, torch {torch.__version__}")
    print(f"{'kernel':16s} {'shape':36s} {'output':7s} {'max |diff|':>11s} {'max |ref|':>10s} {'elements':>9s}")
    for name, shape in CASES:
        spec = KERNELS[name]
        plan = spec.plan(shape, np.random.default_rng(0))
        args = {n: torch.from_numpy(v.copy()) if isinstance(v, np.ndarray) else v
                for n, v in zip(plan.arg_names, plan.args)}
        consts = {**spec.constexprs, **{k: shape[k] for k in spec.shape_constexprs}}
        getattr(triton_kernels, spec.function)[plan.grid](**args, **consts)
        ref = spec.reference(plan)
        for out in plan.outputs:
            got = args[out].numpy().astype(np.float32)
            want = ref[out].astype(np.float32)
            diff = float(np.abs(got - want).max())
            print(f"{name:16s} {str(shape):36s} {out:7s} {diff:11.3g} {float(np.abs(want).max()):10.3g} "
                  f"{want.size:9d}")


if __name__ == "__main__":
    main()
