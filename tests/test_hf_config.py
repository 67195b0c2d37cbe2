"""Models from a Hugging Face ``config.json`` (``hf:PATH[:key=value,...]``): the parameter counts of
public configurations (tests/data/hf/, see its README) against their published totals, the same
graph as the preset of the same model, the fields that cannot be mapped refused by name, and a
dense configuration served, simulated and searched."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
import yaml

from marssim.cli import main
from marssim.errors import InputError
from marssim.serve import load_model
from marssim.workload import load_workload
from marssim.workload.llm import footprint, transformer_of
from support import write_switch_system

DATA = Path(__file__).parent / "data" / "hf"

# Published totals, counted from the released checkpoints: Llama 3 8B and 70B (Meta, the model
# cards' parameter counts 8.03B / 70.6B; the safetensors totals), Qwen2.5-7B (Qwen's model card:
# 7.61B, 6.53B without embeddings), Mixtral 8x7B (Jiang et al. 2024: 47B total, 13B active;
# safetensors total), GPT-NeoX-20B (Black et al. 2022, Table 1: 20,554,567,680).
PUBLISHED = {
    "llama-3-8b": 8_030_261_248,
    "llama-3-70b": 70_553_706_496,
    "qwen2.5-7b": 7_615_616_512,
    "mixtral-8x7b": 46_702_792_704,
    "gpt-neox-20b": 20_554_567_680,
}


def hf(name: str, params: str = "") -> str:
    return f"hf:{DATA / name / 'config.json'}" + (f":{params}" if params else "")


@pytest.mark.parametrize("name", ["llama-3-8b", "llama-3-70b", "mixtral-8x7b", "gpt-neox-20b"])
def test_parameter_counts_equal_the_published_totals(name):
    assert footprint(load_workload(hf(name, "mode=forward,seq=2"))).parameters == PUBLISHED[name]


def test_qwen2_is_its_published_total_less_the_query_key_value_biases():
    """Qwen2's q, k and v projections have biases that the llama family leaves out (0.002 % of
    the parameters): the count is the published total less exactly those."""
    cfg = json.loads((DATA / "qwen2.5-7b" / "config.json").read_text())
    kv_features = cfg["num_key_value_heads"] * cfg["hidden_size"] // cfg["num_attention_heads"]
    biases = cfg["num_hidden_layers"] * (cfg["hidden_size"] + 2 * kv_features)
    assert footprint(load_workload(hf("qwen2.5-7b", "mode=forward,seq=2"))).parameters == \
        PUBLISHED["qwen2.5-7b"] - biases
    assert biases / PUBLISHED["qwen2.5-7b"] < 2e-5


def test_mixtral_active_parameters_are_two_of_eight_experts():
    f = footprint(load_workload(hf("mixtral-8x7b", "mode=forward,seq=2")))
    expert = 3 * 4096 * 14336  # one SwiGLU expert of one layer
    assert f.parameters - f.active_parameters == 32 * 6 * expert
    assert f.active_parameters == pytest.approx(12.9e9, rel=0.005)  # "13B active" (12.9B on the model card)


@pytest.mark.parametrize("name,preset", [("llama-3-8b", "llama3-8b"), ("llama-3-70b", "llama3-70b"),
                                         ("mixtral-8x7b", "mixtral-8x7b")])
def test_a_config_json_is_the_preset_of_the_same_model(name, preset):
    a = transformer_of(load_workload(hf(name, "mode=train,seq=512,layers=2")))
    b = transformer_of(load_workload(f"{preset}:mode=train,seq=512,layers=2"))
    # the same architecture and run; only the name and the length of the rotary table may differ
    assert replace(a, name="", max_positions=0) == replace(b, name="", max_positions=0)


def test_spec_parameters_and_names():
    graph = load_workload(hf("llama-3-8b", "mode=prefill,seq=64,batch=2,layers=3,attention=flash"))
    cfg = transformer_of(graph)
    assert (cfg.mode, cfg.seq, cfg.batch, cfg.layers, cfg.attention, cfg.name) == \
        ("prefill", 64, 2, 3, "flash", "llama-3-8b")
    assert transformer_of(load_workload(f"hf:{DATA / 'llama-3-8b'}:layers=1", batch=4)).batch == 4  # a directory
    neox = transformer_of(load_workload(hf("gpt-neox-20b", "layers=1")))
    assert (neox.family, neox.positions, neox.norm, neox.bias, neox.tie_embeddings, neox.dtype) == \
        ("gpt", "rotary", "layer", True, False, "fp16")


def write(tmp_path: Path, **changes) -> str:
    cfg = json.loads((DATA / "llama-3-8b" / "config.json").read_text())
    cfg.update(changes)
    for key in [k for k, v in changes.items() if v is None]:
        del cfg[key]
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    return str(path)


@pytest.mark.parametrize("changes,key,message", [
    ({"model_type": "gemma"}, "model_type",
     "expected one of llama, mistral, qwen2, mixtral, qwen2_moe, qwen3_moe, deepseek, gpt_neox"),
    ({"hidden_size": None}, "hidden_size", "missing"),
    ({"num_attention_heads": 0}, "num_attention_heads", "expected a positive integer"),
    ({"hidden_act": "gelu"}, "hidden_act", "expected silu"),
    ({"sliding_window": 4096}, "sliding_window", "sliding-window attention"),
    ({"mlp_bias": True}, "mlp_bias", "biased MLP"),
    ({"torch_dtype": "int8"}, "torch_dtype", "expected one of bfloat16"),
    ({"model_type": "qwen2_moe", "num_experts": 60, "num_experts_per_tok": 4, "moe_intermediate_size": 1408,
      "decoder_sparse_step": 2}, "decoder_sparse_step", "expected 1"),
    ({"model_type": "qwen3_moe", "num_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 1408,
      "mlp_only_layers": [1, 3]}, "mlp_only_layers", "the first ones only"),
    ({"model_type": "deepseek", "n_routed_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 1408,
      "moe_layer_freq": 2}, "moe_layer_freq", "expected 1"),
    ({"model_type": "deepseek", "num_experts_per_tok": 2, "moe_intermediate_size": 1408}, "n_routed_experts",
     "missing"),
    ({"num_key_value_heads": 5}, "kv_heads", "expected a divisor of heads"),
])
def test_fields_that_cannot_be_mapped_are_refused_by_name(tmp_path, changes, key, message):
    path = write(tmp_path, **changes)
    with pytest.raises(InputError) as err:
        load_workload(f"hf:{path}")
    text = str(err.value)
    assert f"{key}:" in text and message in text and str(path) in text, text


def test_a_qwen2_moe_without_shared_experts_counts_its_experts(tmp_path):
    h, layers, vocab, experts, width = 512, 3, 1000, 6, 256
    path = write(tmp_path, model_type="qwen2_moe", hidden_size=h, num_hidden_layers=layers, num_attention_heads=8,
                 num_key_value_heads=2, vocab_size=vocab, num_experts=experts, num_experts_per_tok=2,
                 moe_intermediate_size=width, shared_expert_intermediate_size=0, intermediate_size=4096)
    kv = 2 * h // 8
    # attention, experts, router, norms
    block = (h * h + 2 * h * kv + h * h) + experts * 3 * h * width + h * experts + 2 * h
    f = footprint(load_workload(f"hf:{path}:mode=forward,seq=2"))
    assert f.parameters == 2 * vocab * h + layers * block + h
    assert f.parameters - f.active_parameters == layers * (experts - 2) * 3 * h * width


# Published totals and active parameters of the fine-grained mixtures of experts, as their model cards
# round them (billions, one decimal): DeepSeekMoE 16B (Dai et al. 2024: 16.4B, 2.8B activated),
# Qwen1.5-MoE-A2.7B (14.3B, 2.7B activated), Qwen3-30B-A3B (30.5B, 3.3B activated; 29.9B without
# the two embedding matrices).
PUBLISHED_MOE = {"deepseek-moe-16b": (16.4, 2.8), "qwen1.5-moe-a2.7b": (14.3, 2.7), "qwen3-30b-a3b": (30.5, 3.3)}


@pytest.mark.parametrize("name", sorted(PUBLISHED_MOE))
def test_fine_grained_experts_count_the_published_totals(name):
    """The configs' arithmetic against the model cards' rounded totals. The active count takes
    ``top_k`` routed experts, every shared expert and the dense first blocks; Qwen3's published
    3.3B active is the 3.35B here rounded down (its card rounds 3.35 so), within 2 %."""
    f = footprint(load_workload(hf(name, "mode=forward,seq=2")))
    total, active = PUBLISHED_MOE[name]
    assert round(f.parameters / 1e9, 1) == total
    assert f.active_parameters / 1e9 == pytest.approx(active, rel=0.02)
    assert f.active_parameters < f.parameters / 4


def test_qwen3_moe_without_embeddings_is_its_published_count():
    f = footprint(load_workload(hf("qwen3-30b-a3b", "mode=forward,seq=2")))
    assert round((f.parameters - 2 * 151936 * 2048) / 1e9, 1) == 29.9


def test_qwen3_235b_is_its_published_count():
    """Qwen3-235B-A22B's card rounds to whole billions: 235B, 22B activated."""
    f = footprint(load_workload(hf("qwen3-235b-a22b", "mode=forward,seq=2")))
    assert (round(f.parameters / 1e9), round(f.active_parameters / 1e9)) == (235, 22)


@pytest.mark.parametrize("name", [*sorted(PUBLISHED_MOE), "qwen3-235b-a22b"])
def test_a_fine_grained_config_json_is_its_preset(name):
    a = transformer_of(load_workload(hf(name, "mode=train,seq=256,layers=2")))
    b = transformer_of(load_workload(f"{name}:mode=train,seq=256,layers=2"))
    assert replace(a, name="") == replace(b, name="")


def test_deepseek_moe_counts_shared_experts_and_dense_first_blocks(tmp_path):
    """A small DeepSeekMoE configuration, its parameters in closed form: the first block's dense
    MLP of ``intermediate_size``, then per block the routed experts, the shared ones (a dense MLP
    of ``n_shared_experts x moe_intermediate_size``) and the router; active: ``top_k`` experts."""
    h, layers, vocab, experts, width, dense_ffn, shared, k = 256, 3, 1000, 8, 64, 512, 2, 3
    path = write(tmp_path, model_type="deepseek", hidden_size=h, num_hidden_layers=layers, num_attention_heads=4,
                 num_key_value_heads=4, vocab_size=vocab, n_routed_experts=experts, num_experts_per_tok=k,
                 moe_intermediate_size=width, n_shared_experts=shared, first_k_dense_replace=1, moe_layer_freq=1,
                 intermediate_size=dense_ffn)
    graph = load_workload(f"hf:{path}:mode=forward,seq=2")
    attention, norms = 4 * h * h, 2 * h
    dense = attention + 3 * h * dense_ffn + norms
    moe = attention + experts * 3 * h * width + shared * 3 * h * width + h * experts + norms
    f = footprint(graph)
    assert f.parameters == 2 * vocab * h + dense + (layers - 1) * moe + h
    assert f.parameters - f.active_parameters == (layers - 1) * (experts - k) * 3 * h * width
    names = {op.name for op in graph.ops}
    assert "layers.0.mlp.down" in names and "layers.0.moe.router" not in names
    assert {"layers.1.shared.fc1", "layers.1.shared.down", "layers.1.moe.down"} <= names
    # the shared experts' gate and up projections: one GEMM of twice their width
    assert next(op for op in graph.ops if op.name == "layers.1.shared.fc1").loop_dict["N"] == 2 * shared * width


def test_qwen2_moe_shared_expert_is_gated_and_first_mlp_only_layers_are_dense(tmp_path):
    h, layers, vocab, experts, width, shared_ffn, ffn = 256, 3, 1000, 6, 64, 384, 512
    path = write(tmp_path, model_type="qwen2_moe", hidden_size=h, num_hidden_layers=layers, num_attention_heads=4,
                 num_key_value_heads=2, vocab_size=vocab, num_experts=experts, num_experts_per_tok=2,
                 moe_intermediate_size=width, shared_expert_intermediate_size=shared_ffn, intermediate_size=ffn,
                 mlp_only_layers=[0])
    cfg = transformer_of(load_workload(f"hf:{path}:mode=forward,seq=2"))
    assert (cfg.dense_layers, cfg.shared_experts, cfg.shared_ffn, cfg.shared_gate, cfg.expert_ffn, cfg.ffn) == \
        (1, 1, shared_ffn, True, width, ffn)
    f = footprint(load_workload(f"hf:{path}:mode=forward,seq=2"))
    kv = 2 * h // 4
    attention = 2 * h * h + 2 * h * kv
    moe = attention + experts * 3 * h * width + 3 * h * shared_ffn + h + h * experts + 2 * h  # + gate, router
    assert f.parameters == 2 * vocab * h + (attention + 3 * h * ffn + 2 * h) + 2 * moe + h


def test_deepseek_mla_is_refused_naming_the_field():
    with pytest.raises(InputError, match="kv_lora_rank: multi-head latent attention"):
        load_workload(hf("deepseek-v3"))


def test_unreadable_files_and_unknown_parameters(tmp_path):
    with pytest.raises(InputError, match="file not found"):
        load_workload(f"hf:{tmp_path / 'none.json'}")
    bad = tmp_path / "bad.json"
    bad.write_text('{"model_type": "llama",\n "hidden_size": }')
    with pytest.raises(InputError, match="line 2, column .*not valid JSON"):
        load_workload(f"hf:{bad}")
    with pytest.raises(InputError, match="widht: unknown parameter"):
        load_workload(hf("llama-3-8b", "widht=3"))


# ---------------------------------------------------------------------- serve, simulate, search
TINY = {"model_type": "qwen2", "hidden_size": 256, "num_hidden_layers": 2, "num_attention_heads": 4,
        "num_key_value_heads": 4, "intermediate_size": 512, "vocab_size": 1000, "max_position_embeddings": 4096,
        "hidden_act": "silu", "torch_dtype": "bfloat16", "sliding_window": 4096, "use_sliding_window": False}
SAME = "llama:layers=2,hidden=256,heads=4,ffn=512,kv_heads=4,vocab=1000"


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("hf") / "config.json"
    path.write_text(json.dumps(TINY))
    return str(path)


@pytest.fixture(scope="module")
def quad(tmp_path_factory) -> str:
    return write_switch_system(tmp_path_factory.mktemp("sys"))


def test_a_config_json_serves_as_the_same_model_by_parameters(tiny, quad, tmp_path, capsys):
    assert replace(load_model(f"hf:{tiny}"), name="", max_positions=0) == \
        replace(load_model(SAME), name="", max_positions=0)
    base = ["serve", "--system", quad, "--pool", "replicas=2", "--rate", "200", "--prompt", "uniform:16-256",
            "--output", "uniform:2-64", "--requests", "80"]
    assert main([*base, "--model", f"hf:{tiny}", "--out", str(tmp_path / "hf")]) == 0
    assert main([*base, "--model", SAME, "--out", str(tmp_path / "by-hand")]) == 0
    a = json.loads((tmp_path / "hf" / "summary.json").read_text())
    b = json.loads((tmp_path / "by-hand" / "summary.json").read_text())
    assert a.pop("model") == Path(tiny).parent.name and b.pop("model") == "llama"  # named after its directory
    assert a == b and a["completed"] == 80


def test_a_mixture_of_experts_config_serves_as_the_same_model_with_expert_parallelism(tmp_path, quad, capsys):
    small = {"model_type": "mixtral", "hidden_size": 256, "num_hidden_layers": 2, "num_attention_heads": 4,
             "num_key_value_heads": 4, "intermediate_size": 512, "vocab_size": 1000,
             "max_position_embeddings": 4096, "hidden_act": "silu", "torch_dtype": "bfloat16",
             "num_local_experts": 4, "num_experts_per_tok": 2, "tie_word_embeddings": False}
    path = tmp_path / "moe" / "config.json"
    path.parent.mkdir()
    path.write_text(json.dumps(small))
    by_hand = "moe:layers=2,hidden=256,heads=4,kv_heads=4,ffn=512,experts=4,top_k=2,vocab=1000"
    assert replace(load_model(f"hf:{path}"), name="", max_positions=0) == \
        replace(load_model(by_hand), name="", max_positions=0)
    base = ["serve", "--system", quad, "--pool", "replicas=2,tp=2,ep=2", "--rate", "200", "--prompt",
            "uniform:16-256", "--output", "uniform:2-64", "--requests", "60"]
    assert main([*base, "--model", f"hf:{path}", "--out", str(tmp_path / "hf")]) == 0
    assert main([*base, "--model", by_hand, "--out", str(tmp_path / "by-hand")]) == 0
    a = json.loads((tmp_path / "hf" / "summary.json").read_text())
    b = json.loads((tmp_path / "by-hand" / "summary.json").read_text())
    a.pop("model"), b.pop("model")
    assert a == b and a["completed"] == 60


def test_a_config_json_simulates_as_the_same_model_by_parameters(tiny, quad, tmp_path, capsys):
    for spec, out in ((f"hf:{tiny}:mode=train,seq=64,batch=2", "hf"), (f"{SAME},mode=train,seq=64,batch=2", "hand")):
        assert main(["simulate", "--system", quad, "--workload", spec, "--strategy", "dp",
                     "--out", str(tmp_path / out)]) == 0
    a = json.loads((tmp_path / "hf" / "summary.json").read_text())
    b = json.loads((tmp_path / "hand" / "summary.json").read_text())
    assert a["makespan_s"] == b["makespan_s"] > 0


def test_a_config_json_is_searched(tiny, quad, tmp_path, capsys):
    out = tmp_path / "found"
    assert main(["search", "--system", quad, "--model", f"hf:{tiny}", "--rate", "200", "--prompt", "uniform:16-256",
                 "--output", "uniform:2-64", "--requests", "120", "--slo", "ttft_p99=5ms,tbt_p99=1ms", "--workers", "1",
                 "--quiet", "--objective", "gpus", "--budget", "4", "--generations", "2", "--population", "4",
                 "--out", str(out)]) == 0
    found = yaml.safe_load((out / "best_deployment.yaml").read_text())
    assert found["model"] == f"hf:{tiny}"
    # beside it, the engines' command lines load the model from the configuration's directory
    vllm = [line for line in (out / "launch_vllm.sh").read_text().splitlines() if line.startswith("vllm serve")]
    assert len(vllm) == len(found["pools"]) and all(line.startswith(f"vllm serve {Path(tiny).parent} ")
                                                     for line in vllm)
    assert f"--tensor-parallel-size {found['pools'][0]['tp']} " in vllm[0]
