"""A deployment's launch settings: the ``vllm serve`` and SGLang command lines map its settings one
to one (read back from the command line they give the deployment's values; changing one setting
changes its flags and no other), and ``marssim serve`` prints and writes them."""

from __future__ import annotations

import shlex
from dataclasses import replace

import pytest

from marssim.cli import main
from marssim.serve import Deployment, Pool, SchedulerConfig, load_model
from marssim.serve.launch import NVFP4_CHECKPOINT, launch_commands, model_source, script_text
from support import write_switch_system

MODEL = "llama:layers=2,hidden=256,heads=4,ffn=512,kv_heads=4,vocab=1000"

DEPLOYMENTS = [
    Deployment((Pool(replicas=3, tp=2, pp=2),)),
    Deployment((Pool(replicas=1, tp=4, scheduler=SchedulerConfig(kind="chunked", max_num_seqs=128,
                                                                  max_batched_tokens=2048, block_size=32,
                                                                  gpu_memory_utilization=0.85,
                                                                  prefix_caching=True)),)),
    Deployment((Pool(replicas=2, tp=1, role="prefill", scheduler=SchedulerConfig(kind="chunked")),
                Pool(replicas=4, tp=2, role="decode", scheduler=SchedulerConfig(max_num_seqs=512,
                                                                                 preemption="swap",
                                                                                 swap_space=8 * 2**30)))),
]


def parsed(line: str) -> tuple[list[str], dict[str, str]]:
    """The words before the first flag, and every flag with its value ("" for a switch)."""
    words = shlex.split(line)
    head = []
    while words and not words[0].startswith("--"):
        head.append(words.pop(0))
    flags: dict[str, str] = {}
    while words:
        flag = words.pop(0)
        value = words.pop(0) if words and not (words[0].startswith("--") and words[0] != "-1") else ""
        assert flag not in flags, f"{flag} given twice"
        flags[flag] = value
    return head, flags


def vllm_pool(flags: dict[str, str]) -> dict:
    """The deployment settings a vllm serve line sets (read as vLLM reads its flags)."""
    chunked = "--enable-chunked-prefill" in flags
    assert chunked != ("--no-enable-chunked-prefill" in flags)
    caching = "--enable-prefix-caching" in flags
    assert caching != ("--no-enable-prefix-caching" in flags)
    return {"tp": int(flags["--tensor-parallel-size"]), "pp": int(flags["--pipeline-parallel-size"]),
            "max_num_seqs": int(flags["--max-num-seqs"]), "max_batched_tokens": int(flags["--max-num-batched-tokens"]),
            "chunked": chunked, "block_size": int(flags["--block-size"]),
            "gpu_memory_utilization": float(flags["--gpu-memory-utilization"]), "prefix_caching": caching,
            "kv_fp8": flags["--kv-cache-dtype"] == "fp8", "dtype": flags["--dtype"],
            "swap_gib": float(flags["--swap-space"]) if "--swap-space" in flags else None,
            "disaggregated": "--kv-transfer-config" in flags}


def sglang_pool(flags: dict[str, str]) -> dict:
    """The deployment settings an SGLang launch_server line sets."""
    chunk = int(flags["--chunked-prefill-size"])
    return {"tp": int(flags["--tp-size"]), "pp": int(flags["--pp-size"]),
            "max_num_seqs": int(flags["--max-running-requests"]),
            "max_batched_tokens": chunk if chunk > 0 else int(flags["--max-prefill-tokens"]),
            "chunked": chunk > 0, "block_size": int(flags["--page-size"]),
            "gpu_memory_utilization": float(flags["--mem-fraction-static"]),
            "prefix_caching": "--disable-radix-cache" not in flags,
            "kv_fp8": flags["--kv-cache-dtype"] == "fp8_e4m3", "dtype": flags["--dtype"],
            "role": flags.get("--disaggregation-mode", "both")}


def expected(pool: Pool, model) -> dict:
    cfg = pool.scheduler
    return {"tp": pool.tp, "pp": pool.pp, "max_num_seqs": cfg.max_num_seqs,
            "max_batched_tokens": cfg.max_batched_tokens, "chunked": cfg.kind == "chunked",
            "block_size": cfg.block_size, "gpu_memory_utilization": cfg.gpu_memory_utilization,
            "prefix_caching": cfg.prefix_caching, "kv_fp8": model.cache_dtype == "fp8",
            "dtype": {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}[model.dtype]}


@pytest.mark.parametrize("dep", DEPLOYMENTS)
@pytest.mark.parametrize("kv", ["", "fp8"])
def test_the_command_lines_read_back_to_the_deployment(dep, kv):
    model = load_model(MODEL + (f",kv_dtype={kv}" if kv else ""))
    commands = launch_commands(dep, model, "llama3-8b")
    assert [(c.engine, c.pool) for c in commands] == \
        [("vllm", p) for p in range(len(dep.pools))] + [("sglang", p) for p in range(len(dep.pools))]
    for c in commands:
        pool = dep.pools[c.pool]
        head, flags = parsed(c.line())
        assert c.replicas == pool.replicas
        if c.engine == "vllm":
            assert head == ["vllm", "serve", "meta-llama/Meta-Llama-3-8B"]
            got = vllm_pool(flags)
            assert got.pop("swap_gib") == (pool.scheduler.swap_space / 2**30 if pool.scheduler.preemption == "swap"
                                           else None)
            assert got.pop("disaggregated") == (pool.role != "both")
        else:
            assert head == ["python", "-m", "sglang.launch_server"]
            assert flags.pop("--model-path") == "meta-llama/Meta-Llama-3-8B"
            got = sglang_pool(flags)
            assert got.pop("role") == pool.role
        assert got == expected(pool, model)


SETTINGS = {  # a setting, another value of it, and the flags that must change (vLLM, SGLang)
    "tp": (2, {"--tensor-parallel-size"}, {"--tp-size"}),
    "pp": (2, {"--pipeline-parallel-size"}, {"--pp-size"}),
    "max_num_seqs": (64, {"--max-num-seqs"}, {"--max-running-requests"}),
    "max_batched_tokens": (1024, {"--max-num-batched-tokens"}, {"--max-prefill-tokens"}),
    "block_size": (32, {"--block-size"}, {"--page-size"}),
    "gpu_memory_utilization": (0.8, {"--gpu-memory-utilization"}, {"--mem-fraction-static"}),
    "prefix_caching": (True, {"--enable-prefix-caching", "--no-enable-prefix-caching"}, {"--disable-radix-cache"}),
    "kind": ("chunked", {"--enable-chunked-prefill", "--no-enable-chunked-prefill"},
             {"--chunked-prefill-size", "--max-prefill-tokens"}),
}


@pytest.mark.parametrize("setting", sorted(SETTINGS))
def test_changing_one_setting_changes_its_flags_and_no_other(setting):
    model = load_model(MODEL)
    value, vllm_flags, sglang_flags = SETTINGS[setting]
    base = Pool(replicas=2, tp=1)
    if setting in ("tp", "pp"):
        other = replace(base, **{setting: value})
    else:
        other = replace(base, scheduler=replace(base.scheduler, **{setting: value}))
    before = launch_commands(Deployment((base,)), model, MODEL)
    after = launch_commands(Deployment((other,)), model, MODEL)
    for a, b, flags in zip(before, after, (vllm_flags, sglang_flags)):
        fa, fb = parsed(a.line())[1], parsed(b.line())[1]
        changed = {k for k in set(fa) | set(fb) if fa.get(k) != fb.get(k)}
        assert changed == flags, (a.engine, changed)


@pytest.mark.parametrize("dtype,flag", [("bf16", None), ("fp8", "fp8"), ("fp4", "modelopt_fp4")])
def test_the_gemm_type_sets_the_quantization_and_nvfp4_names_a_checkpoint_to_give(dtype, flag):
    """FP8 GEMMs: both engines' online FP8 quantization of the bf16 repository; NVFP4: a ModelOpt
    checkpoint the engines load as it is (a placeholder, with a note naming the repository it
    stands for); bf16: no --quantization. The activations stay bf16 (--dtype) in all three."""
    model = load_model(MODEL + f",dtype={dtype}")
    for c in launch_commands(Deployment((Pool(replicas=1, tp=2),)), model, "llama3-70b"):
        head, flags = parsed(c.line())
        source = head[2] if c.engine == "vllm" else flags.pop("--model-path")
        assert flags.get("--quantization") == flag and flags["--dtype"] == "bfloat16"
        repository = "meta-llama/Meta-Llama-3-70B"
        assert source == (NVFP4_CHECKPOINT if dtype == "fp4" else repository)
        assert any(repository in n for n in c.notes) == (dtype == "fp4")


def test_model_sources():
    assert model_source("llama3-70b") == "meta-llama/Meta-Llama-3-70B"
    assert model_source("llama3-70b:attention=flash") == "meta-llama/Meta-Llama-3-70B"
    assert model_source("hf:models/qwen/config.json") == "models/qwen"
    assert model_source("hf:models/qwen:layers=2") == "models/qwen"
    assert model_source(MODEL) == "MODEL"


def test_what_has_no_flag_is_a_comment_in_the_script():
    model = load_model(MODEL)
    dep = Deployment((Pool(replicas=2, scheduler=SchedulerConfig(kind="static", watermark=0.05)),))
    text = script_text(launch_commands(dep, model, MODEL), dep, "vllm")
    assert "# note: scheduler=static has no engine setting" in text and "# note: watermark=0.05" in text
    assert "# pool 0 (both): 2 replicas of 1 GPU, behind the least_tokens router" in text


def test_marssim_serve_prints_and_writes_the_launch_settings(tmp_path, capsys):
    system = write_switch_system(tmp_path)
    out = tmp_path / "run"
    assert main(["serve", "--system", str(system), "--model", MODEL, "--pool",
                 "replicas=2,tp=2,scheduler=chunked,max_batched_tokens=512,max_num_seqs=32", "--rate", "100",
                 "--prompt", "16", "--output", "4", "--requests", "10", "--out", str(out)]) == 0
    text = capsys.readouterr().out
    printed = [line for line in text.splitlines() if line.startswith("vLLM ")]
    assert len(printed) == 1 and "pool 0, x2: vllm serve MODEL" in printed[0]
    script = (out / "launch_vllm.sh").read_text().splitlines()
    line = [s for s in script if s.startswith("vllm serve")]
    assert printed[0].endswith(line[0])
    got = vllm_pool(parsed(line[0])[1])
    assert (got["tp"], got["max_num_seqs"], got["max_batched_tokens"], got["chunked"]) == (2, 32, 512, True)
    assert (out / "launch_sglang.sh").read_text().count("python -m sglang.launch_server") == 1
