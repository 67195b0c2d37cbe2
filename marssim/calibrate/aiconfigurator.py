"""Kernel timings of NVIDIA's AIConfigurator (``aiconfigurator-core`` on PyPI, Apache-2.0) as rows
of marssim's calibration tables.

The package ships its measurements as parquet files under ``aiconfigurator_core/systems/data``::

    <gpu>/<family>/<framework>/<version>/<table>_perf.parquet    (+ collection_meta.yaml)

``<gpu>`` a system name (``h100_sxm``, ``h200_sxm``, ``b200_sxm``, ``gb200``, ``a100_sxm``, ...),
``<framework>`` the serving engine whose kernels were timed (``trtllm``, ``vllm``, ``sglang``) at
its ``<version>``. The GEMM table (``gemm/.../gemm_perf.parquet``) has one row per
``(gemm_dtype, m, n, k)``: ``m`` tokens (1 to 32,768), ``n`` and ``k`` from a grid of 22 widths
(32 to 65,536), ``latency`` in milliseconds (one ``m x k`` by ``k x n`` GEMM writing bf16);
``gemm_dtype`` ``bfloat16``, ``fp8`` (per-tensor scaled E4M3, Hopper and later), ``fp8_block``
(128-wide block scales, DeepSeek's recipe), ``nvfp4`` (Blackwell). Attention, collectives, MoE and
quantisation kernels sit in sibling families (``attention/.../context_attention_perf.parquet``
by batch, prompt length, heads, key/value heads and head size; ``generation_attention_perf``
by batch and KV length).

:func:`gemm_rows` converts the GEMM rows of one table into :class:`~marssim.cost.calibrated.
KernelTiming` rows: ``kind=gemm``, ``batch=1``, the dtype mapped by :data:`GEMM_DTYPES`
(``fp8_block`` is marssim's ``fp8_block``: FP8 with block scales), ``flops = 2 m n k``,
``bytes`` the compulsory traffic (each input at its own width, a bf16 output), ``median_s`` the
latency in seconds, ``tuning=vendor`` (the engine's own kernel choice), ``stack`` the
framework and version (``trtllm-1.3.0rc20``), and on every row the source, its version and its
licence in the note. The package publishes neither the spread nor the sample count nor the
date of a measurement: ``spread_s`` is 0, ``samples`` 1 and ``date`` the date of the import.

:func:`context_attention_rows` converts the context (prefill) attention table -- the fused, causal
attention kernel of the engine by ``batch_size``, ``isl`` (prompt tokens), ``num_heads``,
``num_key_value_heads`` and ``head_dim`` -- into fused attention rows as the cost model looks them
up (:mod:`marssim.cost.calibrated`): ``kind=attention``, ``backend=flash``, phase ``fwd``,
``batch = 2 x batch_size x num_heads`` (its two products), ``m = n = isl``, ``k = head_dim``,
``flops = 2 batch m n k`` (the full ``s^2``, the workloads' convention; the kernel runs the causal
half), ``bytes`` the queries and output in bf16, the keys and values at the cache's width (the key/value
heads in the note, and ``kv_dtype=fp8`` for a row measured with an FP8 cache). bf16 attention
over a bf16 or an FP8 cache without a sliding window is imported: the engine's context kernel
with an FP8 cache is its own measured kernel (on AIConfigurator's H100 grid of TensorRT-LLM
1.3.0rc20 at 8k-16k-token prompts 1.3-1.5x faster than over a bf16 cache), which a prefill of a
run with ``kv_dtype=fp8`` looks up, as AIConfigurator's model of TensorRT-LLM's Llama block looks
its context attention up by the cache's type (``sdk/models/llama.py``); rows of one shape that
differ in key/value heads are kept apart by their bytes, and a lookup takes the fastest
(:meth:`marssim.cost.model.DataflowCost.measured_for`). No backward attention is measured there.

:func:`generation_attention_rows` converts the generation (decode) attention table -- the
engine's decode kernel, one query per sequence over its KV cache, by ``batch_size``, ``isl``
(queries per sequence, 1), ``step`` (tokens generated before it), ``num_heads``,
``num_key_value_heads``, ``head_dim`` and ``kv_cache_dtype`` -- into the fused attention rows
the decode ops of the LLM graphs look up (``attn.core`` with ``attention=flash`` in
``mode=decode`` or ``mode=serve``: :mod:`marssim.workload.llm.forward`): ``kind=attention``,
``backend=flash``, phase ``fwd``, ``batch = 2 x batch_size x num_heads``, ``m = isl`` (1),
``n = isl + step`` (the keys each query attends to: the cache and its own token, 2 to 131,072),
``k = head_dim``, ``dtype=bf16`` (the queries' and the output's type), ``flops = 2 batch m n k``,
``bytes`` the queries and output in bf16 and the keys and values at the cache's width; the note
has the heads, key/value heads and ``kv_dtype`` (``bf16`` or ``fp8``), which the lookups match
(:func:`marssim.cost.calibrated.attention_geometry`).

The shipped tables hold a subset (:data:`DEFAULT_M`, :data:`DEFAULT_WIDTHS`): the token counts
and widths of transformer GEMMs, enough for the curve and its local correction to interpolate
between them (:mod:`marssim.cost.calibrated`), a few MB rather than the package's 89.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from marssim.cost.calibrated import KernelTiming
from marssim.errors import InputError

from .table import format_note

__all__ = ["AIC_SOURCE", "AIC_LICENSE", "AicGpu", "AIC_GPUS", "GEMM_DTYPES", "DEFAULT_M", "DEFAULT_WIDTHS",
           "DEFAULT_HEAD_DIMS", "DEFAULT_MIN_TOKENS", "DEFAULT_ATTENTION_HEADS", "KV_DTYPES", "data_root", "table_path",
           "stack_name", "gemm_rows", "context_attention_rows", "generation_attention_rows", "generation_attention_row",
           "MOE_DTYPES", "MOE_GATED_KERNELS", "default_moe_shapes", "moe_rows",
           "AIC_COLLECTIVE_SYSTEMS", "AIC_COLLECTIVES", "AIC_NCCL_VERSIONS", "AIC_CUSTOM_ALLREDUCE", "collective_tables",
           "collective_rows", "collective_table_rows"]

AIC_SOURCE = "aiconfigurator-core"
AIC_LICENSE = "Apache-2.0"


@dataclass(frozen=True)
class AicGpu:
    """A GPU of the package: the name designs use (``gpu.calibration``) and its SM count."""

    device: str
    sms: int


AIC_GPUS: dict[str, AicGpu] = {
    "a100_sxm": AicGpu("A100", 108), "h100_sxm": AicGpu("H100", 132), "h200_sxm": AicGpu("H200", 132),
    "b200_sxm": AicGpu("B200", 148), "b300_sxm": AicGpu("B300", 160), "gb200": AicGpu("GB200", 152),
    "gb300": AicGpu("GB300", 160),
}
"""The package's system names with a marssim design, and their devices (SM counts from the
vendors' datasheets: B200 148 SMs of the HGX part, GB200 152 of the superchip's GPU, B300 and GB300
160, Blackwell Ultra's count as NVIDIA's technical blog gives it)."""

GEMM_DTYPES = {"bfloat16": "bf16", "float16": "fp16", "fp8": "fp8", "nvfp4": "fp4", "fp8_block": "fp8_block"}
"""The package's ``gemm_dtype`` values that are a marssim dtype (``fp8``: per-tensor scaled E4M3,
Transformer Engine's delayed and current scaling; ``nvfp4``: NVFP4 with its block scales;
``fp8_block``: E4M3 with fp32 scales per 1 x 128 of activations and 128 x 128 of weights,
Transformer Engine's ``Float8BlockScaling``)."""

DEFAULT_M = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768)
"""Token counts (``m``) of the shipped subset: powers of two (the package measures these and
their odd neighbours, 4,097 beside 4,096)."""
DEFAULT_WIDTHS = (256, 512, 768, 1024, 1536, 2048, 2560, 3072, 3584, 4096, 5120, 6144, 7168, 8192, 10240, 12288,
                  16384, 51200, 65536)
"""``n`` and ``k`` of the shipped subset: the package's grid from 256 up (transformer widths and
their tensor-parallel shards, the vocabularies' 51,200 and 65,536)."""

DEFAULT_HEAD_DIMS = (128,)
"""Head dimensions of the shipped attention subset (Llama 2/3, GPT-3 175B and most models since)."""
DEFAULT_MIN_TOKENS = 128
"""Fewest prompt tokens of the shipped attention subset (shorter prompts: launch-bound kernels)."""
DEFAULT_ATTENTION_HEADS = (4, 8, 16, 32, 64)
"""Query heads per GPU of the shipped attention subsets: those of Llama 3 8B and 70B (32 and 64
heads) at tensor-parallel degrees 1 to 8 and of Llama 3 405B (128) at 2 to 8, with every
key/value head count the package measured for them."""
KV_DTYPES = {"bfloat16": "bf16", "fp8": "fp8"}
"""The package's ``kv_cache_dtype`` values that are a marssim dtype (``fp8``: E4M3)."""


def data_root(given: str | Path | None = None) -> Path:
    """The package's ``systems/data`` directory: ``given`` (that directory, the unpacked
    package's ``aiconfigurator_core``, or a directory holding it), else the installed package's;
    InputError when none is found."""
    if given is None:
        spec = importlib.util.find_spec("aiconfigurator_core")
        if spec is None or not spec.submodule_search_locations:
            raise InputError(None, "--from", "aiconfigurator-core is not installed; `pip install "
                                             "aiconfigurator-core==0.12.0` or give the unpacked package's directory")
        given = Path(next(iter(spec.submodule_search_locations)))
    root = Path(given)
    for cand in (root, root / "systems" / "data", root / "aiconfigurator_core" / "systems" / "data"):
        if cand.is_dir() and any(p.name in AIC_GPUS for p in cand.iterdir() if p.is_dir()):
            return cand
    raise InputError(str(root), "--from", "expected aiconfigurator-core's systems/data directory (with h100_sxm/, "
                                          "h200_sxm/, ...), the package directory, or a directory holding it")


def table_path(root: Path, gpu: str, family: str, framework: str, version: str, table: str) -> Path:
    """``root/<gpu>/<family>/<framework>/<version>/<table>_perf.parquet``; InputError naming the
    versions there when absent."""
    where = root / gpu / family / framework
    path = where / version / f"{table}_perf.parquet"
    if not path.is_file():
        have = sorted(p.name for p in where.iterdir() if p.is_dir()) if where.is_dir() else []
        raise InputError(str(root), f"{gpu}/{family}/{framework}",
                         f"no {table}_perf.parquet of version {version!r}; versions there: {', '.join(have) or 'none'}")
    return path


def stack_name(framework: str, version: str) -> str:
    """The ``stack`` of imported rows: ``trtllm-1.3.0rc20``."""
    return f"{framework}-{version}"


def _read_parquet(path: Path):
    try:
        import pandas as pd

        return pd.read_parquet(path)
    except ImportError as err:  # pyarrow is the "parquet" extra
        raise InputError(str(path), "parquet", f"reading it needs pyarrow (pip install 'marssim[parquet]'): {err}") \
            from None


def gemm_rows(path: Path, gpu: str, stack: str, package_version: str, date: str,
              m_values: Iterable[int] | None = DEFAULT_M,
              widths: Iterable[int] | None = DEFAULT_WIDTHS) -> list[KernelTiming]:
    """The GEMM rows of the package's ``gemm_perf.parquet`` at ``path`` measured on ``gpu`` (a
    key of :data:`AIC_GPUS`) as calibration rows (see the module docstring); ``m_values`` and
    ``widths`` select the subset (None: all)."""
    if gpu not in AIC_GPUS:
        raise InputError(str(path), "gpu", f"expected one of {', '.join(AIC_GPUS)}, got {gpu!r}")
    dev = AIC_GPUS[gpu]
    frame = _read_parquet(path)
    need = {"gemm_dtype", "m", "n", "k", "latency"}
    missing = need - set(frame.columns)
    if missing:
        raise InputError(str(path), "columns", f"missing {', '.join(sorted(missing))}")
    frame = frame[frame["gemm_dtype"].isin(list(GEMM_DTYPES))]
    if m_values is not None:
        frame = frame[frame["m"].isin(list(m_values))]
    if widths is not None:
        w = list(widths)
        frame = frame[frame["n"].isin(w) & frame["k"].isin(w)]
    note = format_note({"source": f"{AIC_SOURCE} {package_version}", "license": AIC_LICENSE,
                        "device": str(frame["device"].iloc[0]) if "device" in frame and len(frame) else gpu})
    from marssim.workload.op import DTYPE_BYTES

    out = []
    for dt, m, n, k, ms, src in zip(frame["gemm_dtype"], frame["m"], frame["n"], frame["k"], frame["latency"],
                                     frame["kernel_source"] if "kernel_source" in frame else [""] * len(frame)):
        m, n, k = int(m), int(n), int(k)
        if not (ms > 0 and m > 0 and n > 0 and k > 0):
            raise InputError(str(path), f"{dt} m={m} n={n} k={k}", f"expected positive sizes and latency, got {ms!r}")
        dtype = GEMM_DTYPES[dt]
        eb = DTYPE_BYTES[dtype]
        out.append(KernelTiming(
            kind="gemm", dtype=dtype, batch=1, m=m, n=n, k=k, flops=2.0 * m * n * k,
            bytes=float(round((m * k + k * n) * eb + m * n * DTYPE_BYTES["bf16"])), device=dev.device, sms=dev.sms,
            driver="unknown", cuda="unknown", tuning="vendor", median_s=float(ms) * 1e-3, spread_s=0.0, samples=1,
            date=date, kernel=f"aiconfigurator:{src}" if src else "aiconfigurator", note=note, phase="fwd",
            stack=stack))
    return out


MOE_DTYPES = {"bfloat16": "bf16", "fp8": "fp8", "nvfp4": "fp4"}
"""The package's ``moe_dtype`` values imported (``fp8``: per-tensor scaled E4M3 experts; ``nvfp4``:
NVFP4, Blackwell; the block-scaled FP8 and the MXFP4 variants have no marssim dtype of their own)."""
MOE_GATED_KERNELS = ("moe_torch_flow", "moe_torch_flow_cutlass", "moe_torch_flow_min_latency")
"""TensorRT-LLM's fused MoE operators of gated (SwiGLU) experts (``min_latency``: its NVFP4
small-batch variant; a curve takes the faster at each token count, as the engine's choice);
``moe_torch_flow_nongated`` runs experts without a gate (not a shape of the shipped models)."""


def default_moe_shapes() -> set[tuple[int, int, int, int]]:
    """``(hidden, intermediate, top-k, experts)`` of the shipped mixture-of-experts presets: the
    shipped subset of the package's MoE table."""
    from marssim.workload.llm.config import PRESETS, TransformerConfig

    out = set()
    for fields, _ in PRESETS.values():
        c = TransformerConfig(**fields)
        if c.is_moe:
            out.add((c.hidden, c.expert_ffn_size, c.top_k, c.experts))
    return out


def moe_rows(path: Path, gpu: str, stack: str, package_version: str, date: str,
             shapes: set[tuple[int, int, int, int]] | None = None,
             distributions: Iterable[str] | None = None) -> list:
    """The fused MoE rows of the package's ``moe_perf.parquet`` at ``path`` measured on ``gpu`` as
    :class:`marssim.cost.moe_kernels.MoeKernelRow`: gated operators (:data:`MOE_GATED_KERNELS`) of
    the types of :data:`MOE_DTYPES`, ``latency`` (ms) in seconds; ``shapes`` the ``(hidden,
    intermediate, top-k, experts)`` and ``distributions`` the token distributions to keep (None:
    all)."""
    from marssim.cost.moe_kernels import MoeKernelRow, MoeShape

    if gpu not in AIC_GPUS:
        raise InputError(str(path), "gpu", f"expected one of {', '.join(AIC_GPUS)}, got {gpu!r}")
    frame = _read_parquet(path)
    need = {"moe_dtype", "num_tokens", "hidden_size", "inter_size", "topk", "num_experts", "moe_tp_size",
            "moe_ep_size", "distribution", "latency", "kernel_source"}
    missing = need - set(frame.columns)
    if missing:
        raise InputError(str(path), "columns", f"missing {', '.join(sorted(missing))}")
    frame = frame[frame["moe_dtype"].isin(list(MOE_DTYPES)) & frame["kernel_source"].isin(list(MOE_GATED_KERNELS))]
    if distributions is not None:
        frame = frame[frame["distribution"].isin(list(distributions))]
    rel = "/".join(path.parts[-5:])
    out = []
    for row in frame.itertuples(index=False):
        key = (int(row.hidden_size), int(row.inter_size), int(row.topk), int(row.num_experts))
        if shapes is not None and key not in shapes:
            continue
        ms = float(row.latency)
        if not ms > 0 or int(row.num_tokens) < 1:
            raise InputError(str(path), f"{row.moe_dtype} tokens={row.num_tokens} {key}",
                             f"expected positive tokens and latency, got {ms!r}")
        shape = MoeShape(AIC_GPUS[gpu].device, stack, MOE_DTYPES[row.moe_dtype], *key, int(row.moe_tp_size),
                         int(row.moe_ep_size), str(row.distribution))
        out.append(MoeKernelRow(shape, int(row.num_tokens), ms * 1e-3, str(row.kernel_source), AIC_SOURCE,
                                package_version, AIC_LICENSE, f"systems/data/{rel}", date))
    return out


def _attention_frame(path: str | Path, need: set[str], caches: tuple[str, ...], head_dims: Iterable[int] | None,
                     heads: Iterable[int] | None):
    """The rows of an attention table at ``path`` with the columns ``need`` (InputError naming
    those missing) of bf16 queries over a cache of a type in ``caches``, no sliding window, one
    beam, and a head size in ``head_dims`` and query heads in ``heads`` (None: all)."""
    frame = _read_parquet(path)
    missing = need - set(frame.columns)
    if missing:
        raise InputError(str(path), "columns", f"missing {', '.join(sorted(missing))}")
    keep = (frame["attn_dtype"] == "bfloat16") & frame["kv_cache_dtype"].isin(list(caches))
    if "window_size" in frame:
        keep &= frame["window_size"] == 0
    if "beam_width" in frame:
        keep &= frame["beam_width"] == 1
    if head_dims is not None:
        keep &= frame["head_dim"].isin(list(head_dims))
    if heads is not None:
        keep &= frame["num_heads"].isin(list(heads))
    return frame[keep]


def context_attention_rows(path: Path, gpu: str, stack: str, package_version: str, date: str,
                           head_dims: Iterable[int] | None = DEFAULT_HEAD_DIMS,
                           min_tokens: int = DEFAULT_MIN_TOKENS,
                           heads: Iterable[int] | None = DEFAULT_ATTENTION_HEADS) -> list[KernelTiming]:
    """The rows of the package's ``context_attention_perf.parquet`` at ``path`` measured on
    ``gpu`` -- bf16 queries over a bf16 or FP8 cache -- as fused attention rows (see the module
    docstring); ``head_dims``, ``heads`` (query heads; None: all) and ``min_tokens`` select the
    subset."""
    from marssim.workload.op import DTYPE_BYTES

    if gpu not in AIC_GPUS:
        raise InputError(str(path), "gpu", f"expected one of {', '.join(AIC_GPUS)}, got {gpu!r}")
    dev = AIC_GPUS[gpu]
    frame = _attention_frame(path, {"batch_size", "isl", "num_heads", "num_key_value_heads", "head_dim", "attn_dtype",
                                    "kv_cache_dtype", "latency"}, tuple(KV_DTYPES), head_dims, heads)
    frame = frame[frame["isl"] >= min_tokens]
    device = str(frame["device"].iloc[0]) if "device" in frame and len(frame) else gpu
    out = []
    for b, s, h, kvh, d, cache, ms in zip(frame["batch_size"], frame["isl"], frame["num_heads"],
                                          frame["num_key_value_heads"], frame["head_dim"], frame["kv_cache_dtype"],
                                          frame["latency"]):
        b, s, h, kvh, d = int(b), int(s), int(h), int(kvh), int(d)
        if not (ms > 0 and min(b, s, h, kvh, d) > 0):
            raise InputError(str(path), f"batch {b} isl {s} heads {h}/{kvh} dim {d}",
                             f"expected positive sizes and latency, got {ms!r}")
        batch = 2 * b * h
        kv = KV_DTYPES[cache]
        fields = {"source": f"{AIC_SOURCE} {package_version}", "license": AIC_LICENSE, "device": device,
                  "batch": b, "heads": h, "kv_heads": kvh, "causal": "true"}
        if kv != "bf16":  # a bf16 cache's rows keep the note (and so the lookup key) they always had
            fields["kv_dtype"] = kv
        note = format_note(fields)
        nbytes = b * s * d * (2 * h * DTYPE_BYTES["bf16"] + 2 * kvh * DTYPE_BYTES[kv])
        out.append(KernelTiming(
            kind="attention", dtype="bf16", batch=batch, m=s, n=s, k=d, flops=2.0 * batch * s * s * d,
            bytes=float(nbytes), device=dev.device, sms=dev.sms, driver="unknown",
            cuda="unknown", tuning="vendor", median_s=float(ms) * 1e-3, spread_s=0.0, samples=1, date=date,
            kernel="aiconfigurator:context_attention", note=note, phase="fwd", backend="flash", stack=stack))
    return out


def generation_attention_row(gpu: str, stack: str, package_version: str, date: str, batch_size: int,
                             isl: int, step: int, heads: int, kv_heads: int, head_dim: int, kv_dtype: str,
                             latency_ms: float, where: str = "") -> KernelTiming:
    """One row of the package's generation attention table as a fused attention row (see the
    module docstring; the note names the source, its licence, the heads and the cache's type, the
    table's comment the GPU): ``gpu`` a key of :data:`AIC_GPUS`, ``kv_dtype`` a key of
    :data:`KV_DTYPES`, ``latency_ms`` in milliseconds. InputError
    (naming ``where``) for a non-positive size or latency or an unknown cache type."""
    if gpu not in AIC_GPUS:
        raise InputError(where or None, "gpu", f"expected one of {', '.join(AIC_GPUS)}, got {gpu!r}")
    b, q, h, kvh, d = int(batch_size), int(isl), int(heads), int(kv_heads), int(head_dim)
    s = q + int(step)
    if not (latency_ms > 0 and min(b, q, h, kvh, d) > 0 and step >= 0):
        raise InputError(where or None, f"batch {b} isl {q} step {step} heads {h}/{kvh} dim {d}",
                         f"expected positive sizes and latency, got {latency_ms!r}")
    if kv_dtype not in KV_DTYPES:
        raise InputError(where or None, "kv_cache_dtype", f"expected one of {', '.join(KV_DTYPES)}, got {kv_dtype!r}")
    from marssim.workload.op import DTYPE_BYTES

    kv = KV_DTYPES[kv_dtype]
    dev = AIC_GPUS[gpu]
    batch = 2 * b * h
    note = format_note({"source": f"{AIC_SOURCE} {package_version}", "license": AIC_LICENSE, "heads": h,
                        "kv_heads": kvh, "kv_dtype": kv})
    nbytes = b * d * (2 * h * q * DTYPE_BYTES["bf16"] + 2 * kvh * s * DTYPE_BYTES[kv])
    return KernelTiming(
        kind="attention", dtype="bf16", batch=batch, m=q, n=s, k=d, flops=2.0 * batch * q * s * d,
        bytes=float(round(nbytes)), device=dev.device, sms=dev.sms, driver="unknown", cuda="unknown", tuning="vendor",
        median_s=float(latency_ms) * 1e-3, spread_s=0.0, samples=1, date=date,
        kernel="aiconfigurator:generation_attention", note=note, phase="fwd", backend="flash", stack=stack)


def generation_attention_rows(path: Path, gpu: str, stack: str, package_version: str, date: str,
                              head_dims: Iterable[int] | None = DEFAULT_HEAD_DIMS,
                              heads: Iterable[int] | None = DEFAULT_ATTENTION_HEADS) -> list[KernelTiming]:
    """The rows of the package's ``generation_attention_perf.parquet`` at ``path`` measured on
    ``gpu`` -- bf16 queries over a bf16 or FP8 cache, no sliding window, one beam -- as fused
    attention rows (:func:`generation_attention_row`); ``head_dims`` and ``heads`` (query heads;
    None: all) select the subset."""
    if gpu not in AIC_GPUS:
        raise InputError(str(path), "gpu", f"expected one of {', '.join(AIC_GPUS)}, got {gpu!r}")
    frame = _attention_frame(path, {"batch_size", "isl", "step", "num_heads", "num_key_value_heads", "head_dim",
                                    "attn_dtype", "kv_cache_dtype", "latency"}, tuple(KV_DTYPES), head_dims, heads)
    return [generation_attention_row(gpu, stack, package_version, date, b, q, st, h, kvh, d, kv, ms, str(path))
            for b, q, st, h, kvh, d, kv, ms in zip(frame["batch_size"], frame["isl"], frame["step"],
                                                    frame["num_heads"], frame["num_key_value_heads"],
                                                    frame["head_dim"], frame["kv_cache_dtype"], frame["latency"])]


AIC_COLLECTIVE_SYSTEMS = {"a100_sxm": "hgx-a100", "h100_sxm": "hgx-h100", "h200_sxm": "hgx-h200",
                          "b200_sxm": "hgx-b200", "b300_sxm": "hgx-b300", "gb200": "gb200-nvl72",
                          "gb300": "gb300-nvl72"}
"""The package's systems whose collectives are imported, and the measured-machine names their rows
get (:data:`marssim.collectives.plan.MEASURED_SYSTEMS`): eight GPUs of one HGX board on NVSwitch
(host not named), GB200 and GB300 GPUs of one NVL72 NVLink domain."""

AIC_COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter")
"""The package's ``op_name`` values imported as collectives, marssim's names too (``alltoall`` has
no marssim collective)."""

AIC_NCCL_VERSIONS = {"a100_sxm": "2.27.3", "h100_sxm": "2.29.2", "h200_sxm": "2.29.2", "b200_sxm": "2.29.2",
                     "b300_sxm": "2.29.2", "gb200": "2.29.2", "gb300": "2.29.2"}
"""The NCCL measurements imported per GPU: the package's newest (A100 has one)."""
AIC_CUSTOM_ALLREDUCE = (("h100_sxm", "trtllm", "1.3.0rc20"), ("h100_sxm", "vllm", "0.24.0"),
                        ("h100_sxm", "sglang", "0.5.14"))
"""The engines' own all-reduces imported, ``(gpu, framework, version)`` (measured on H100 only)."""

_ELEMENT_DTYPES = {"half": "fp16", "float16": "fp16", "bfloat16": "bf16"}  # all 2 bytes


def collective_rows(frame, gpu: str, stack: str, file: str, package_version: str, date: str,
                    note: str = "") -> list:
    """The half-precision all-reduce, all-gather and reduce-scatter rows of one of the package's
    collective tables -- ``comm/nccl/<version>/nccl_perf.parquet`` (column ``nccl_dtype``) or an
    engine's ``comm/<framework>/<version>/custom_allreduce_perf.parquet`` (``allreduce_dtype``) --
    as :class:`~marssim.collectives.measured.CollectiveRow`: one row per (collective, GPUs, size),
    the median of the package's repeated rows. ``message_size`` counts elements of nccl-tests'
    total (the all-reduce buffer, the all-gather output, the reduce-scatter input), so ``bytes`` is
    it times 2; ``latency`` is in milliseconds. One node: ``ranks_per_node = ranks``. ``frame`` a
    pandas DataFrame of the table; ``file`` its path under ``systems/data``."""
    from marssim.collectives.measured import CollectiveRow

    if gpu not in AIC_COLLECTIVE_SYSTEMS:
        raise InputError(file, "gpu", f"expected one of {', '.join(AIC_COLLECTIVE_SYSTEMS)}, got {gpu!r}")
    dtype_col = "nccl_dtype" if "nccl_dtype" in frame.columns else "allreduce_dtype"
    need = {dtype_col, "op_name", "num_gpus", "message_size", "latency"}
    if not need <= set(frame.columns):
        raise InputError(file, "columns", f"expected {', '.join(sorted(need))}; got {', '.join(frame.columns)}")
    half = frame[frame[dtype_col].isin(list(_ELEMENT_DTYPES)) & frame["op_name"].isin(AIC_COLLECTIVES)]
    medians = half.groupby(["op_name", "num_gpus", "message_size", dtype_col])["latency"].median().reset_index()
    out = []
    for op, n, size, dt, ms in zip(medians["op_name"], medians["num_gpus"], medians["message_size"],
                                   medians[dtype_col], medians["latency"]):
        if not (ms > 0 and int(n) >= 2):
            continue
        out.append(CollectiveRow(AIC_COLLECTIVE_SYSTEMS[gpu], AIC_GPUS[gpu].device, stack, str(op),
                                 int(n), int(n), float(size) * 2, float(ms) * 1e-3, _ELEMENT_DTYPES[dt],
                                 AIC_SOURCE, package_version, file, AIC_LICENSE, date, note))
    out.sort(key=lambda r: (r.collective, r.ranks, r.bytes))
    return out


def collective_tables() -> list[tuple[str, str, str]]:
    """The collective tables :func:`collective_table_rows` imports, ``(gpu, stack, path under
    systems/data)``: each GPU's NCCL table of :data:`AIC_NCCL_VERSIONS` (stack ``nccl-<version>``),
    then the engines' all-reduces of :data:`AIC_CUSTOM_ALLREDUCE` (stack ``<framework>-<version>``)."""
    out = [(gpu, f"nccl-{ver}", f"{gpu}/comm/nccl/{ver}/nccl_perf.parquet") for gpu, ver in AIC_NCCL_VERSIONS.items()]
    out += [(gpu, stack_name(fw, ver), f"{gpu}/comm/{fw}/{ver}/custom_allreduce_perf.parquet")
            for gpu, fw, ver in AIC_CUSTOM_ALLREDUCE]
    return out


def collective_table_rows(root: Path, gpu: str, stack: str, rel: str, package_version: str, date: str) -> list:
    """The rows of the collective table ``root/rel`` (:func:`collective_rows`), each noting where
    the table's own ``version`` column disagrees with its folder's version; InputError naming the
    table when it is missing."""
    path = root / rel
    if not path.is_file():
        raise InputError(str(root), rel, f"expected this table of aiconfigurator-core {package_version}'s collectives")
    frame = _read_parquet(path)
    versions = sorted({str(v) for v in frame["version"].dropna()}) if "version" in frame.columns else []
    folder = Path(rel).parent.name
    note = f"the rows' version column says {', '.join(versions)}" if versions and versions != [folder] else ""
    return collective_rows(frame, gpu, stack, f"systems/data/{rel}", package_version, date, note)
