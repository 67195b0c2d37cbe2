"""Load, launch and time cubins on a CUDA device with cuda-python's driver API.

Nothing here is imported unless a GPU path runs (``marssim sip tune``, the GPU tests). A cubin is
loaded with ``cuModuleLoadData``; parameters are laid out from the cubin's own
``EIATTR_KPARAM_INFO`` (so Triton's hidden trailing scratch pointers get null, which is what
Triton passes when the kernel needs no scratch memory); launches use ``cuLaunchKernel`` with the
kernel's dynamic shared memory (opted in above 48 KiB with
``CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES``). Times come from CUDA events around single
launches, with L2 flushed before each launch by writing a buffer larger than L2.
"""

from __future__ import annotations

import ctypes
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from marssim.calibrate.stats import TimingStats, summarize

from .cubin import parse_cubin
from .kernels import LaunchPlan

__all__ = ["cuda_device_available", "device_capability", "GpuSession", "LoadedKernel", "TimingStats", "summarize",
           "outputs_match"]

_NP_TO_CTYPE = {"i32": ctypes.c_int32, "i64": ctypes.c_int64, "fp32": ctypes.c_float, "u32": ctypes.c_uint32}


def _driver():
    try:
        from cuda.bindings import driver  # cuda-python >= 12.6
    except ImportError:  # pragma: no cover - older cuda-python
        from cuda import cuda as driver  # type: ignore[no-redef]
    return driver


def cuda_device_available() -> tuple[bool, str]:
    """(True, device name) when cuda-python is installed and a CUDA device answers, else (False,
    the reason)."""
    try:
        drv = _driver()
    except ImportError:
        return False, "cuda-python is not installed (pip install 'marssim[gpu]')"
    try:
        (err,) = drv.cuInit(0)
        if err != drv.CUresult.CUDA_SUCCESS:
            return False, f"cuInit failed: {err.name}"
        err, count = drv.cuDeviceGetCount()
        if err != drv.CUresult.CUDA_SUCCESS or count < 1:
            return False, "no CUDA device"
        err, dev = drv.cuDeviceGet(0)
        err, name = drv.cuDeviceGetName(128, dev)
        return True, name.split(b"\0", 1)[0].decode()
    except Exception as exc:  # noqa: BLE001 - any driver failure means "no usable device"
        return False, f"CUDA driver unusable: {exc}"


def device_capability(index: int = 0) -> tuple[int, int] | None:
    """(major, minor) compute capability of CUDA device ``index``, None without one."""
    try:
        drv = _driver()
        (err,) = drv.cuInit(0)
        if err != drv.CUresult.CUDA_SUCCESS:
            return None
        err, dev = drv.cuDeviceGet(index)
        if err != drv.CUresult.CUDA_SUCCESS:
            return None
        attrs = drv.CUdevice_attribute
        err1, major = drv.cuDeviceGetAttribute(attrs.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev)
        err2, minor = drv.cuDeviceGetAttribute(attrs.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, dev)
        if err1 != drv.CUresult.CUDA_SUCCESS or err2 != drv.CUresult.CUDA_SUCCESS:
            return None
        return int(major), int(minor)
    except Exception:  # noqa: BLE001 - no driver, no device
        return None


def _check(result):
    """Unwrap a cuda-python return tuple, raising on an error code."""
    drv = _driver()
    err, *rest = result if isinstance(result, tuple) else (result,)
    if err != drv.CUresult.CUDA_SUCCESS:
        _, msg = drv.cuGetErrorString(err)
        raise RuntimeError(f"CUDA error {err.name}: {msg.decode() if msg else ''}")
    if not rest:
        return None
    return rest[0] if len(rest) == 1 else tuple(rest)


@dataclass
class LoadedKernel:
    """A function loaded from one cubin, with its parameter layout."""

    module: object
    function: object
    name: str
    param_sizes: tuple[int, ...]
    shared_bytes: int


class GpuSession:
    """One CUDA context on device 0, a stream, device buffers for a launch plan, and an L2
    flush buffer. Use as a context manager."""

    def __init__(self, l2_flush_bytes: int = 256 << 20) -> None:
        self.drv = _driver()
        _check(self.drv.cuInit(0))
        self.device = _check(self.drv.cuDeviceGet(0))
        self.context = _check(self.drv.cuDevicePrimaryCtxRetain(self.device))
        _check(self.drv.cuCtxSetCurrent(self.context))
        self.stream = _check(self.drv.cuStreamCreate(0))
        self.flush_bytes = l2_flush_bytes
        self.flush = _check(self.drv.cuMemAlloc(l2_flush_bytes))
        self.buffers: dict[str, tuple[object, np.ndarray]] = {}
        self.start = _check(self.drv.cuEventCreate(0))
        self.end = _check(self.drv.cuEventCreate(0))

    def __enter__(self) -> "GpuSession":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        for ptr, _ in self.buffers.values():
            self.drv.cuMemFree(ptr)
        self.buffers.clear()
        self.drv.cuMemFree(self.flush)
        self.drv.cuStreamDestroy(self.stream)
        self.drv.cuDevicePrimaryCtxRelease(self.device)

    def device_name(self) -> str:
        name = _check(self.drv.cuDeviceGetName(128, self.device))
        return name.split(b"\0", 1)[0].decode()

    def sm_count(self) -> int:
        """Streaming multiprocessors of the device."""
        attr = self.drv.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT
        return int(_check(self.drv.cuDeviceGetAttribute(attr, self.device)))

    def driver_version(self) -> str:
        """CUDA version the driver supports (``cuDriverGetVersion``), e.g. ``12.4``."""
        v = _check(self.drv.cuDriverGetVersion())
        return f"{v // 1000}.{(v % 1000) // 10}"

    @staticmethod
    def nvidia_driver() -> str:
        """The NVIDIA driver version from ``nvidia-smi`` ("" when unavailable)."""
        from marssim.calibrate.device import nvidia_smi

        return nvidia_smi(["driver_version"])["driver_version"]

    # ---------------------------------------------------------------- modules
    def load(self, cubin: bytes, name: str | None = None, shared_bytes: int = 0) -> LoadedKernel:
        """Load ``cubin`` (``cuModuleLoadData``) and get its kernel ``name`` (the only one by
        default); opt in to ``shared_bytes`` of dynamic shared memory."""
        parsed = parse_cubin(cubin)
        kernel = parsed.kernel(name)
        module = _check(self.drv.cuModuleLoadData(cubin))
        function = _check(self.drv.cuModuleGetFunction(module, kernel.name.encode()))
        if shared_bytes > 48 * 1024:
            attr = self.drv.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
            _check(self.drv.cuFuncSetAttribute(function, attr, shared_bytes))
        sizes = tuple(size for _, _, size in kernel.param_sizes())
        return LoadedKernel(module, function, kernel.name, sizes, shared_bytes)

    def unload(self, k: LoadedKernel) -> None:
        self.drv.cuModuleUnload(k.module)

    # ---------------------------------------------------------------- data
    def upload(self, plan: LaunchPlan) -> None:
        """Allocate and fill device buffers for the plan's array arguments (replacing old ones)."""
        for ptr, _ in self.buffers.values():
            self.drv.cuMemFree(ptr)
        self.buffers = {}
        for name, value in zip(plan.arg_names, plan.args):
            if isinstance(value, np.ndarray):
                host = np.ascontiguousarray(value)
                ptr = _check(self.drv.cuMemAlloc(max(host.nbytes, 16)))
                _check(self.drv.cuMemcpyHtoD(ptr, host.ctypes.data, host.nbytes))
                self.buffers[name] = (ptr, host)

    def refill(self, plan: LaunchPlan) -> None:
        """Copy new input values of the same shapes into the existing buffers."""
        for name, value in zip(plan.arg_names, plan.args):
            if isinstance(value, np.ndarray):
                ptr, _ = self.buffers[name]
                host = np.ascontiguousarray(value)
                _check(self.drv.cuMemcpyHtoD(ptr, host.ctypes.data, host.nbytes))
                self.buffers[name] = (ptr, host)

    def download(self, plan: LaunchPlan) -> dict[str, np.ndarray]:
        """The plan's output buffers, copied back."""
        out = {}
        for name in plan.outputs:
            ptr, host = self.buffers[name]
            result = np.empty_like(host)
            _check(self.drv.cuMemcpyDtoH(result.ctypes.data, ptr, result.nbytes))
            out[name] = result
        return out

    def zero_outputs(self, plan: LaunchPlan) -> None:
        for name in plan.outputs:
            ptr, host = self.buffers[name]
            _check(self.drv.cuMemsetD8Async(ptr, 0, host.nbytes, self.stream))

    # ---------------------------------------------------------------- launch
    def _params(self, k: LoadedKernel, plan: LaunchPlan) -> list:
        """One ctypes value per kernel parameter, sized as the cubin's KPARAM_INFO says."""
        holders: list = []
        for i, size in enumerate(k.param_sizes):
            if i < len(plan.args):
                name, value, ty = plan.arg_names[i], plan.args[i], plan.arg_types[i]
                if isinstance(value, np.ndarray):
                    holder = ctypes.c_uint64(int(self.buffers[name][0]))
                else:
                    holder = _NP_TO_CTYPE[ty](value)
                if ctypes.sizeof(holder) != size:
                    raise RuntimeError(f"parameter {i} ({name}) is {size} bytes in the cubin, "
                                       f"{ctypes.sizeof(holder)} in the launch plan")
            else:  # Triton's hidden scratch pointers: null when no scratch is needed
                holder = ctypes.c_uint64(0) if size == 8 else (ctypes.c_uint8 * size)()
            holders.append(holder)
        return holders

    def launch(self, k: LoadedKernel, plan: LaunchPlan) -> None:
        """Launch once on the session's stream (parameters passed as a void** array; the driver
        copies them during the call)."""
        holders = self._params(k, plan)
        pointers = (ctypes.c_void_p * max(1, len(holders)))(*[ctypes.addressof(h) for h in holders])
        _check(self.drv.cuLaunchKernel(k.function, *plan.grid, *plan.block, k.shared_bytes, self.stream,
                                       ctypes.addressof(pointers), 0))

    def run(self, k: LoadedKernel, plan: LaunchPlan) -> dict[str, np.ndarray]:
        """Zero the outputs, launch once, synchronise, return the outputs."""
        self.zero_outputs(plan)
        self.launch(k, plan)
        _check(self.drv.cuStreamSynchronize(self.stream))
        return self.download(plan)

    def time(self, k: LoadedKernel, plan: LaunchPlan, repeats: int = 50, warmup: int = 5,
             flush_l2: bool = True) -> list[float]:
        """Seconds per launch, one CUDA-event pair around each of ``repeats`` launches, with L2
        flushed before each (the flush is outside the timed interval)."""
        for _ in range(warmup):
            self.launch(k, plan)
        times = []
        for _ in range(repeats):
            if flush_l2:
                _check(self.drv.cuMemsetD8Async(self.flush, 0, self.flush_bytes, self.stream))
            _check(self.drv.cuEventRecord(self.start, self.stream))
            self.launch(k, plan)
            _check(self.drv.cuEventRecord(self.end, self.stream))
            _check(self.drv.cuEventSynchronize(self.end))
            ms = _check(self.drv.cuEventElapsedTime(self.start, self.end))
            times.append(ms * 1e-3)
        return times


def outputs_match(a: Mapping[str, np.ndarray], b: Mapping[str, np.ndarray], rtol: float = 0.0,
                  atol: float = 0.0) -> tuple[bool, int]:
    """(all equal, number of mismatching elements). With zero tolerances the comparison is
    bitwise (NaNs with identical bits match); otherwise ``np.isclose`` with NaN == NaN."""
    bad = 0
    for name in a:
        x, y = a[name], b[name]
        if rtol == 0.0 and atol == 0.0:
            bad += int(np.count_nonzero(x.view(f"u{x.itemsize}") != y.view(f"u{y.itemsize}")))
        else:
            bad += int(np.count_nonzero(~np.isclose(x.astype(np.float64), y.astype(np.float64), rtol=rtol,
                                                    atol=atol, equal_nan=True)))
    return bad == 0, bad
