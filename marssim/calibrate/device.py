"""What the GPU and its software stack are: queries shared by the harness and the SIP tuner.

:func:`nvidia_smi` reads fields of ``nvidia-smi --query-gpu`` (driver version, clocks, power
limit); :func:`torch_cuda_status` says whether torch sees a CUDA device (and why not);
:func:`library_versions` lists torch, CUDA runtime, cuDNN, cuBLAS and Triton versions. Each
import of torch or Triton happens inside the function that needs it.
"""

from __future__ import annotations

import subprocess
from collections.abc import Sequence

__all__ = ["nvidia_smi", "torch_cuda_status", "library_versions", "distribution_version"]


def nvidia_smi(fields: Sequence[str], index: int = 0, timeout: float = 30.0) -> dict[str, str]:
    """``nvidia-smi --query-gpu=FIELDS`` for GPU ``index`` as ``{field: text}`` (units dropped;
    ``""`` for a field it does not know or when ``nvidia-smi`` is missing)."""
    try:
        out = subprocess.run(["nvidia-smi", f"--query-gpu={','.join(fields)}", "--format=csv,noheader,nounits",
                              f"--id={index}"], capture_output=True, text=True, timeout=timeout).stdout
    except (OSError, subprocess.SubprocessError):
        return {f: "" for f in fields}
    lines = out.strip().splitlines()
    if not lines:
        return {f: "" for f in fields}
    values = [v.strip() for v in lines[0].split(",")]
    if len(values) != len(fields):
        return {f: "" for f in fields}
    return {f: ("" if v.startswith("[") else v) for f, v in zip(fields, values)}  # "[N/A]", "[Not Supported]"


def torch_cuda_status() -> tuple[bool, str]:
    """(True, device name) when torch is installed and sees a CUDA device, else (False, why)."""
    try:
        import torch
    except ImportError:
        return False, "torch is not installed (pip install 'marssim[gpu]')"
    try:
        if not torch.cuda.is_available() or torch.cuda.device_count() < 1:
            built = torch.version.cuda
            why = "no CUDA device is visible" if built else f"torch {torch.__version__} is a CPU-only build"
            return False, why
        return True, torch.cuda.get_device_name(0)
    except Exception as exc:  # noqa: BLE001 - any driver failure means "no usable device"
        return False, f"CUDA unusable: {exc}"


def distribution_version(*names: str) -> str:
    """Version of the first installed distribution among ``names`` ("" if none)."""
    from importlib import metadata

    for name in names:
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return ""


def library_versions() -> dict[str, str]:
    """``torch``, ``cuda`` (the runtime torch was built with), ``cudnn``, ``cublas`` (from the
    ``nvidia-cublas-*`` wheel torch uses, "" when torch links a system cuBLAS) and ``triton``."""
    out = {"torch": "", "cuda": "", "cudnn": "", "cublas": "", "triton": ""}
    try:
        import torch
    except ImportError:
        return out
    out["torch"] = torch.__version__
    out["cuda"] = torch.version.cuda or ""
    try:
        v = torch.backends.cudnn.version()
        out["cudnn"] = "" if v is None else str(v)
    except Exception:  # noqa: BLE001 - cuDNN missing or unloadable
        out["cudnn"] = ""
    out["cublas"] = distribution_version("nvidia-cublas-cu13", "nvidia-cublas-cu12", "nvidia-cublas-cu11",
                                         "nvidia-cublas")
    out["triton"] = distribution_version("triton", "pytorch-triton")
    return out
