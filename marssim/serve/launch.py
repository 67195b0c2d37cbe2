"""A deployment as the engines launch it: a ``vllm serve`` and an SGLang
(``python -m sglang.launch_server``) command line per pool, each setting mapped one to one.

====================================  ==============================  ==============================
deployment setting                    vLLM (``vllm serve``)           SGLang (``sglang.launch_server``)
====================================  ==============================  ==============================
``tp``                                ``--tensor-parallel-size``      ``--tp-size``
``pp``                                ``--pipeline-parallel-size``    ``--pp-size``
``ep`` (``tp``: whole experts)        ``--enable-expert-parallel``    ``--ep-size``
``max_num_seqs``                      ``--max-num-seqs``              ``--max-running-requests``
``max_batched_tokens``                ``--max-num-batched-tokens``    ``--chunked-prefill-size``
                                                                      (``chunked``), else
                                                                      ``--max-prefill-tokens``
``scheduler`` ``chunked`` or not      ``--enable-chunked-prefill`` /  ``--chunked-prefill-size -1``
                                      ``--no-enable-chunked-prefill``  when not chunked
``block_size``                        ``--block-size``                ``--page-size``
the model's KV-cache type             ``--kv-cache-dtype``            ``--kv-cache-dtype``
                                      (``auto``, ``fp8``)             (``auto``, ``fp8_e4m3``)
``gpu_memory_utilization``            ``--gpu-memory-utilization``    ``--mem-fraction-static``
``prefix_caching``                    ``--enable-prefix-caching`` /   ``--disable-radix-cache``
                                      ``--no-enable-prefix-caching``  when off
the model's ``dtype``                 ``--dtype``                     ``--dtype``
the model's GEMM type: ``fp8``        ``--quantization fp8``          ``--quantization fp8``
``fp4`` (NVFP4)                       ``--quantization modelopt_fp4`` ``--quantization modelopt_fp4``
``role`` ``prefill`` / ``decode``     ``--kv-transfer-config``        ``--disaggregation-mode``
                                      (NIXL connector)                ``prefill`` / ``decode``
``preemption=swap``, ``swap_space``   ``--swap-space`` (GiB; vLLM's   (none: SGLang recomputes)
                                      V0 engine)
``scheduler_steps``                   ``--num-scheduler-steps``       (none: a comment says so)
                                      (vLLM's V0 engine)
``spec_method=draft``, ``spec_model``,  ``--speculative-config``         ``--speculative-algorithm
``spec_k``                            ``{"model": ...,                STANDALONE``,
                                      "num_speculative_tokens": k}``  ``--speculative-draft-model-path``,
                                                                      ``--speculative-num-steps k``
``spec_method=mtp``, ``spec_k``       ``--speculative-config``         ``--speculative-algorithm EAGLE``
                                      ``{"method": "eagle", ...}``     (the head's path: ``DRAFT_HEAD``)
====================================  ==============================  ==============================

Each command runs one replica (``tp x pp`` GPUs); a pool of ``replicas`` replicas is that many
servers behind the deployment's router (a comment says how many). What has no flag is said in a
comment rather than dropped silently: the ``static`` scheduler (no engine runs it), ``mixed``
(Orca's prompts joining decodes: vLLM's V1 scheduler and SGLang's ``--enable-mixed-chunk`` do it
with chunked prefill), a KV watermark other than vLLM's 0.01, the router. ``--mem-fraction-static``
is SGLang's share of the memory for weights and KV cache, which is what
``gpu_memory_utilization`` bounds here (the activation workspace is taken out of it too: close,
not identical). The model is the Hugging Face repository of a preset (``llama3-8b`` ->
``meta-llama/Meta-Llama-3-8B``), the directory of an ``hf:PATH`` configuration, or ``MODEL`` (a
placeholder) for a model given by its dimensions. A model whose GEMMs are FP8 (``dtype=fp8``) is
served with ``--quantization fp8``: both engines cast a bf16 checkpoint's weights to FP8 as they
load it and scale the activations per tensor as they run (a ModelOpt FP8 checkpoint, with the
static scales TensorRT-LLM takes, is recognised by its own configuration). Neither engine
quantizes to NVFP4 as it loads: an NVFP4 model (``dtype=fp4``) loads ``NVFP4_CHECKPOINT``, a
placeholder for a ModelOpt NVFP4 checkpoint of the model, with ``--quantization modelopt_fp4``; a
comment names the repository it stands for.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from pathlib import Path

from marssim.workload.llm.config import TransformerConfig

from .deployment import Deployment, Pool

__all__ = ["LaunchCommand", "launch_commands", "launch_lines", "script_text", "model_source", "write_launch_scripts",
           "HF_REPOSITORIES", "NVFP4_CHECKPOINT", "VLLM_SCRIPT", "SGLANG_SCRIPT"]

HF_REPOSITORIES = {
    "llama3-8b": "meta-llama/Meta-Llama-3-8B",
    "llama3-70b": "meta-llama/Meta-Llama-3-70B",
    "llama3-405b": "meta-llama/Llama-3.1-405B",
    "mixtral-8x7b": "mistralai/Mixtral-8x7B-v0.1",
    "mixtral-8x22b": "mistralai/Mixtral-8x22B-v0.1",
}
"""Presets with released weights: their Hugging Face repositories."""

VLLM_SCRIPT = "launch_vllm.sh"
SGLANG_SCRIPT = "launch_sglang.sh"

_DTYPE = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}
_QUANTIZATION = {"fp8": "fp8", "fp4": "modelopt_fp4"}
"""``--quantization`` of both engines per GEMM type (``gemm_dtype``)."""
NVFP4_CHECKPOINT = "NVFP4_CHECKPOINT"
"""What an NVFP4 model's command loads: a ModelOpt NVFP4 checkpoint of the model, to be named."""


def _quantization(model: TransformerConfig, source: str) -> tuple[str, list[tuple[str, str]], list[str]]:
    """The checkpoint an engine loads for ``model`` (``source`` its bf16 repository), the
    ``--quantization`` argument its GEMM type needs and the notes that go with them."""
    low = model.gemm_dtype
    if low not in _QUANTIZATION:
        return source, [], []
    args = [("--quantization", _QUANTIZATION[low])]
    if low == "fp4":
        return NVFP4_CHECKPOINT, args, [f"{NVFP4_CHECKPOINT}: a ModelOpt NVFP4 checkpoint of {source} (the engines do "
                                        "not quantize to NVFP4 as they load)"]
    return source, args, ["dtype=fp8: --quantization fp8 casts the bf16 weights to FP8 at load and scales the "
                          "activations per tensor as it runs"]


@dataclass(frozen=True)
class LaunchCommand:
    """One pool's command line for an engine: the program and its ``(flag, value)`` arguments
    (value ``""`` for a switch), and the notes that go beside it as comments."""

    engine: str  # vllm | sglang
    pool: int
    replicas: int
    program: tuple[str, ...]
    arguments: tuple[tuple[str, str], ...]
    notes: tuple[str, ...] = ()

    def flags(self) -> dict[str, str]:
        """The arguments by flag."""
        return dict(self.arguments)

    def line(self) -> str:
        """The command as a shell line."""
        parts = list(self.program)
        for flag, value in self.arguments:
            parts.append(flag)
            if value != "":
                parts.append(shlex.quote(value))
        return " ".join(parts)


def model_source(spec: str) -> str:
    """What an engine loads for the model ``spec``: a preset's Hugging Face repository, the
    directory of an ``hf:PATH`` configuration, else ``MODEL``."""
    from marssim.workload.llm.hf import is_hf_spec, split_hf_spec
    from marssim.workload.registry import parse_spec

    if is_hf_spec(spec):
        path = Path(split_hf_spec(spec)[0])
        return str(path.parent if path.suffix == ".json" else path)
    name, _ = parse_spec(spec)
    return HF_REPOSITORIES.get(name, "MODEL")


def _common_notes(pool: Pool, engine: str) -> list[str]:
    cfg = pool.scheduler
    notes = []
    if cfg.kind == "static":
        notes.append("scheduler=static has no engine setting (no engine runs a batch to its last request); "
                     "these are the continuous batcher's flags")
    if cfg.mixed:
        notes.append("mixed=true (prompts join the decodes): vLLM's V1 scheduler does so with chunked prefill"
                     if engine == "vllm" else "mixed=true: --enable-mixed-chunk with chunked prefill")
    if cfg.watermark != 0.01:
        notes.append(f"watermark={cfg.watermark:g} has no flag (vLLM keeps 0.01)")
    if cfg.kv_cache_free_gpu_mem_fraction > 0:
        flag = "--gpu-memory-utilization" if engine == "vllm" else "--mem-fraction-static"
        notes.append(f"kv_cache_free_gpu_mem_fraction={cfg.kv_cache_free_gpu_mem_fraction:g} is TensorRT-LLM's share "
                     f"of the free memory for the KV cache; {flag} bounds the engine's whole memory instead (given "
                     "here at its default)")
    if cfg.fused_elementwise:
        notes.append("fused_elementwise=true (residual adds, FP8 quantizations and rotary embeddings inside other "
                     "kernels) is how TensorRT-LLM runs a Llama block; no flag sets it here")
    if cfg.capacity == "guaranteed_no_evict":
        notes.append("capacity=guaranteed_no_evict is TensorRT-LLM's capacity scheduler policy; "
                     f"{'vLLM' if engine == 'vllm' else 'SGLang'} admits by free blocks and preempts")
    return notes


def _spec_note(cfg) -> str:
    text = f"spec_alpha={cfg.spec_alpha:g} is the draft's acceptance on the workload, not a setting"
    if cfg.spec_method == "mtp":
        text += "; DRAFT_HEAD: the path of the model's trained draft head"
    return text


def _vllm(p: int, pool: Pool, model: TransformerConfig, source: str) -> LaunchCommand:
    cfg = pool.scheduler
    source, quantization, quantization_notes = _quantization(model, source)
    args: list[tuple[str, str]] = [
        ("--tensor-parallel-size", str(pool.tp)),
        ("--pipeline-parallel-size", str(pool.pp)),
        ("--max-num-seqs", str(cfg.max_num_seqs)),
        ("--max-num-batched-tokens", str(cfg.max_batched_tokens)),
        ("--enable-chunked-prefill" if cfg.kind == "chunked" else "--no-enable-chunked-prefill", ""),
        ("--block-size", str(cfg.block_size)),
        ("--kv-cache-dtype", "fp8" if model.cache_dtype == "fp8" else "auto"),
        ("--gpu-memory-utilization", f"{cfg.gpu_memory_utilization:g}"),
        ("--enable-prefix-caching" if cfg.prefix_caching else "--no-enable-prefix-caching", ""),
        ("--dtype", _DTYPE[model.dtype]),
        *quantization,
    ]
    if pool.ep > 1:
        args.append(("--enable-expert-parallel", ""))
    if cfg.engine != "none" and not cfg.cuda_graphs:
        args.append(("--enforce-eager", ""))
    if cfg.engine != "none" and cfg.overlap is not None:
        args.append(("--async-scheduling" if cfg.overlap else "--no-async-scheduling", ""))
    notes = _common_notes(pool, "vllm") + quantization_notes
    if cfg.scheduler_steps > 1:
        args.append(("--num-scheduler-steps", str(cfg.scheduler_steps)))
        notes.append("scheduler_steps: --num-scheduler-steps is the V0 engine's (vLLM 0.6-0.9); V1 schedules "
                     "every step")
    if cfg.preemption == "swap":
        args.append(("--swap-space", f"{cfg.swap_space / 2**30:g}"))
        notes.append("preemption=swap: --swap-space is the V0 engine's (vLLM before 0.10); V1 recomputes")
    if cfg.speculative:
        import json

        spec = {"model": model_source(cfg.spec_model)} if cfg.spec_method == "draft" else \
            {"method": "eagle", "model": "DRAFT_HEAD"}
        spec["num_speculative_tokens"] = cfg.spec_k
        args.append(("--speculative-config", json.dumps(spec, separators=(",", ":"))))
        notes.append(_spec_note(cfg))
    if pool.role != "both":
        args.append(("--kv-transfer-config", '{"kv_connector":"NixlConnector","kv_role":"kv_both"}'))
        notes.append(f"{pool.role} pool of a disaggregated deployment: run behind a prefill/decode proxy")
    return LaunchCommand("vllm", p, pool.replicas, ("vllm", "serve", source), tuple(args), tuple(notes))


def _sglang(p: int, pool: Pool, model: TransformerConfig, source: str) -> LaunchCommand:
    cfg = pool.scheduler
    source, quantization, quantization_notes = _quantization(model, source)
    args: list[tuple[str, str]] = [
        ("--model-path", source),
        ("--tp-size", str(pool.tp)),
        ("--pp-size", str(pool.pp)),
        ("--max-running-requests", str(cfg.max_num_seqs)),
    ]
    if pool.ep > 1:
        args.append(("--ep-size", str(pool.ep)))
    if cfg.kind == "chunked":
        args.append(("--chunked-prefill-size", str(cfg.max_batched_tokens)))
    else:
        args += [("--chunked-prefill-size", "-1"), ("--max-prefill-tokens", str(cfg.max_batched_tokens))]
    args += [
        ("--page-size", str(cfg.block_size)),
        ("--kv-cache-dtype", "fp8_e4m3" if model.cache_dtype == "fp8" else "auto"),
        ("--mem-fraction-static", f"{cfg.gpu_memory_utilization:g}"),
        ("--dtype", _DTYPE[model.dtype]),
        *quantization,
    ]
    if not cfg.prefix_caching:
        args.append(("--disable-radix-cache", ""))
    if cfg.mixed:
        args.append(("--enable-mixed-chunk", ""))
    if cfg.engine != "none" and not cfg.cuda_graphs:
        args.append(("--disable-cuda-graph", ""))
    if cfg.engine != "none" and cfg.overlap is False:
        args.append(("--disable-overlap-schedule", ""))
    notes = _common_notes(pool, "sglang") + quantization_notes
    if cfg.preemption == "swap":
        notes.append("preemption=swap has no SGLang setting (it recomputes)")
    if cfg.scheduler_steps > 1:
        notes.append(f"scheduler_steps={cfg.scheduler_steps} (vLLM's multi-step scheduling) has no SGLang setting; "
                     "SGLang schedules every step")
    if cfg.speculative:
        if cfg.spec_method == "draft":
            args += [("--speculative-algorithm", "STANDALONE"),
                     ("--speculative-draft-model-path", model_source(cfg.spec_model))]
        else:
            args += [("--speculative-algorithm", "EAGLE"), ("--speculative-draft-model-path", "DRAFT_HEAD")]
        args += [("--speculative-num-steps", str(cfg.spec_k)), ("--speculative-eagle-topk", "1"),
                 ("--speculative-num-draft-tokens", str(cfg.spec_k + 1))]
        notes.append(_spec_note(cfg))
    if pool.role != "both":
        args.append(("--disaggregation-mode", pool.role))
    return LaunchCommand("sglang", p, pool.replicas, ("python", "-m", "sglang.launch_server"), tuple(args),
                         tuple(notes))


def launch_commands(deployment: Deployment, model: TransformerConfig, model_spec: str) -> list[LaunchCommand]:
    """vLLM's and SGLang's command per pool of ``deployment`` serving ``model`` (given on the
    command line as ``model_spec``), vLLM's first (see the module docstring)."""
    source = model_source(model_spec)
    out = [_vllm(p, pool, model, source) for p, pool in enumerate(deployment.pools)]
    out += [_sglang(p, pool, model, source) for p, pool in enumerate(deployment.pools)]
    return out


def launch_lines(commands: list[LaunchCommand]) -> list[str]:
    """The commands as report lines: ``vLLM``/``SGLang``, the pool and its replicas, the line."""
    out = []
    for c in commands:
        label = "vLLM" if c.engine == "vllm" else "SGLang"
        out.append(f"{label:<7}pool {c.pool}, x{c.replicas}: {c.line()}")
    return out


def script_text(commands: list[LaunchCommand], deployment: Deployment, engine: str) -> str:
    """A shell script of ``engine``'s commands: each pool's line with its replicas and notes as
    comments."""
    lines = ["#!/bin/sh", f"# {deployment.text()}", "# one command per replica; each replica's GPUs: tp x pp"]
    for c in commands:
        if c.engine != engine:
            continue
        pool = deployment.pools[c.pool]
        lines.append("")
        lines.append(f"# pool {c.pool} ({pool.role}): {c.replicas} replica{'s' if c.replicas != 1 else ''} of "
                     f"{pool.gpus_per_replica} GPU{'s' if pool.gpus_per_replica != 1 else ''}, behind the "
                     f"{deployment.router} router")
        lines += [f"# note: {n}" for n in c.notes]
        lines.append(c.line())
    return "\n".join(lines) + "\n"


def write_launch_scripts(commands: list[LaunchCommand], deployment: Deployment, directory: str | Path) -> list[Path]:
    """``launch_vllm.sh`` and ``launch_sglang.sh`` into ``directory`` (atomically); their paths."""
    from marssim.fsutil import atomic_file

    paths = []
    for engine, name in (("vllm", VLLM_SCRIPT), ("sglang", SGLANG_SCRIPT)):
        path = Path(directory) / name
        with atomic_file(path, "w", encoding="utf-8", newline="\n") as f:
            f.write(script_text(commands, deployment, engine))
        paths.append(path)
    return paths
