"""LLM workloads: parameter counts against published totals and closed forms, training FLOPs and
recomputation against closed forms derived here, activation bytes against Korthikanti et al.
2022, KV-cache bytes of decode steps, the order autograd runs backward in, bad specs, and the
existing evaluators on small LLM graphs."""

from __future__ import annotations

import math

import networkx as nx
import pytest

from marssim.cli import main
from marssim.errors import InputError
from marssim.mapping import legal_strategies, shard_regions, split_dim, split_sizes
from marssim.mapping.sharding import box_elems
from marssim.workload import OpKind, load_workload
from marssim.workload.llm import footprint
from marssim.workload.llm.footprint import saved_tensors
from marssim.workload.op import _reshape

# a GPT-3-style model small enough to build in milliseconds, with every feature of the family
SMALL_GPT = "gpt:layers=3,hidden=256,heads=4,vocab=1000,seq=64,batch=2,max_positions=128"
SMALL_LLAMA = "llama:layers=3,hidden=256,heads=8,kv_heads=2,ffn=640,vocab=1000,seq=64,batch=2"
SMALL_MOE = "moe:layers=2,hidden=128,heads=4,kv_heads=2,ffn=256,vocab=500,seq=32,batch=2,experts=4,top_k=2"


def _gemm_flops(graph, phases=("fwd", "bwd")) -> float:
    return sum(op.flops for op in graph.ops if op.is_gemm_like and op.param("phase") in phases)


# ---------------------------------------------------------------- parameters


def _gpt_params(l: int, h: int, v: int, p: int) -> int:
    """Per block: QKV (h x 3h + 3h), projection (h^2 + h), MLP (2 x 4h^2 + 5h), two LayerNorms
    (4h); token and position tables; final LayerNorm; the output projection is tied."""
    return l * (12 * h * h + 13 * h) + v * h + p * h + 2 * h


def _llama_params(l: int, h: int, heads: int, kv: int, f: int, v: int, experts: int = 0, k: int = 0) -> tuple[int, int]:
    """(total, active): per block Q/K/V/O, the MLP (gate, up, down; per expert for MoE, with a
    router), two RMSNorms (h each); untied input and output tables; final RMSNorm."""
    d = h // heads
    attn = h * (heads + 2 * kv) * d + heads * d * h + 2 * h
    if experts:
        total = attn + h * experts + experts * 3 * h * f
        active = attn + h * experts + k * 3 * h * f
    else:
        total = active = attn + 3 * h * f
    tables = 2 * v * h + h
    return l * total + tables, l * active + tables


@pytest.mark.parametrize("spec,published,expected", [
    ("gpt3-175b", 174.6e9, _gpt_params(96, 12288, 50257, 2048)),
    ("gpt3-125m", 125e6, _gpt_params(12, 768, 50257, 2048)),
    ("gpt3-13b", 13e9, _gpt_params(40, 5120, 50257, 2048)),
    ("llama3-8b", 8.03e9, _llama_params(32, 4096, 32, 8, 14336, 128256)[0]),
    ("llama3-70b", 70.6e9, _llama_params(80, 8192, 64, 8, 28672, 128256)[0]),
    ("mixtral-8x7b", 46.7e9, _llama_params(32, 4096, 32, 8, 14336, 32000, 8, 2)[0]),
])
def test_parameter_counts_equal_the_closed_form_and_the_published_total(spec, published, expected) -> None:
    graph = load_workload(spec + ":seq=16")
    assert graph.parameters == expected
    tolerance = 0.001 if spec == "gpt3-175b" else 0.005 if spec != "gpt3-13b" else 0.02  # "13B" is a rounded name
    assert graph.parameters == pytest.approx(published, rel=tolerance)


def test_mixtral_active_parameters_per_token() -> None:
    f = footprint(load_workload("mixtral-8x7b:seq=16"))
    assert f.active_parameters == _llama_params(32, 4096, 32, 8, 14336, 32000, 8, 2)[1]
    assert f.active_parameters == pytest.approx(12.9e9, rel=0.005)
    assert f.parameters == pytest.approx(46.7e9, rel=0.005)


def test_parameters_do_not_change_with_mode_batch_or_recomputation() -> None:
    base = load_workload("llama:layers=2,hidden=256,heads=8,kv_heads=2,ffn=512,vocab=1000,seq=32").parameters
    for extra in ("mode=train", "mode=train,recompute=full", "mode=prefill,batch=4", "mode=decode,context=40",
                  "mode=serve,prompt=8,generate=3,batch=2"):
        spec = f"llama:layers=2,hidden=256,heads=8,kv_heads=2,ffn=512,vocab=1000,seq=32,{extra}"
        assert load_workload(spec).parameters == base, extra


# ---------------------------------------------------------------- FLOPs


@pytest.mark.parametrize("l,h,a,v,s,b", [(3, 256, 4, 1000, 64, 2), (2, 512, 8, 777, 96, 3)])
def test_gpt_training_flops_equal_the_closed_form(l, h, a, v, s, b) -> None:
    graph = load_workload(f"gpt:layers={l},hidden={h},heads={a},vocab={v},seq={s},batch={b},max_positions=128,"
                          "mode=train")
    # forward per block: QKV, projection and MLP GEMMs 2bs(3h^2 + h^2 + 8h^2), the two attention products 4bs^2h;
    # the logits 2bshV; backward twice every GEMM (Narayanan et al. 2021: 72bslh^2 (1 + s/6h + V/12lh))
    forward = l * (24 * b * s * h * h + 4 * b * s * s * h) + 2 * b * s * h * v
    assert _gemm_flops(graph, ("fwd",)) == forward
    assert _gemm_flops(graph, ("bwd",)) == 2 * forward
    assert _gemm_flops(graph) == 72 * b * s * l * h * h * (1 + s / (6 * h) + v / (12 * l * h))


def test_llama_training_flops_equal_the_closed_form() -> None:
    l, h, heads, kv, f, v, s, b = 3, 256, 8, 2, 640, 1000, 64, 2
    d = h // heads
    graph = load_workload(SMALL_LLAMA + ",mode=train")
    forward = l * (2 * b * s * (h * (heads + 2 * kv) * d + heads * d * h + 3 * h * f) + 4 * b * s * s * heads * d)
    forward += 2 * b * s * h * v
    assert _gemm_flops(graph, ("fwd",)) == forward
    assert _gemm_flops(graph, ("bwd",)) == 2 * forward


def test_every_backward_product_is_twice_its_forward() -> None:
    for spec in (SMALL_GPT, SMALL_LLAMA, SMALL_MOE):
        graph = load_workload(spec + ",mode=train")
        back: dict[str, int] = {}
        for op in graph.ops:
            if op.param("phase") == "bwd" and op.is_gemm_like:
                owner = op.name.rsplit(".", 1)[0]
                back[owner] = back.get(owner, 0) + op.macs
        forward = {op.name: op.macs for op in graph.ops if op.param("phase") == "fwd" and op.is_gemm_like}
        assert back == {name: 2 * macs for name, macs in forward.items()}, spec


def test_moe_expert_work_is_top_k_of_the_tokens() -> None:
    graph = load_workload(SMALL_MOE)
    tokens, h, f, e, k = 64, 128, 256, 4, 2
    capacity = math.ceil(k * tokens / e)
    experts = [op for op in graph.ops if op.param("grouped")]
    assert {op.dim("M") for op in experts} == {capacity}
    assert sum(op.macs for op in experts) == 2 * 3 * capacity * e * h * f  # gate, up, down per layer, 2 layers
    assert sum(op.macs for op in experts) == 2 * 3 * k * tokens * h * f  # dropless: top_k experts per token


def test_selective_recomputation_reruns_the_attention_core() -> None:
    l, h, s, b = 3, 256, 64, 2
    base = load_workload(SMALL_GPT + ",mode=train")
    graph = load_workload(SMALL_GPT + ",mode=train,recompute=selective")
    assert _gemm_flops(graph, ("recompute",)) == l * 4 * b * s * s * h  # Q K^T and P V again
    core = sum(op.flops for op in base.ops if op.param("core") and op.param("phase") == "fwd")
    assert footprint(graph).flops["recompute"] == core
    assert _gemm_flops(graph) == _gemm_flops(base)  # model FLOPs unchanged


def test_full_recomputation_reruns_every_block() -> None:
    l, h, s, b = 3, 256, 64, 2
    base = load_workload(SMALL_GPT + ",mode=train")
    graph = load_workload(SMALL_GPT + ",mode=train,recompute=full")
    assert _gemm_flops(graph, ("recompute",)) == l * (24 * b * s * h * h + 4 * b * s * s * h)
    blocks = sum(op.flops for op in base.ops if op.param("phase") == "fwd" and 0 <= op.param("layer") < l)
    assert footprint(graph).flops["recompute"] == blocks


def test_optimizer_moves_30_bytes_per_parameter() -> None:
    graph = load_workload(SMALL_LLAMA + ",mode=train")
    adam = [op for op in graph.ops if op.param("fn") == "adam"]
    assert sum(op.out_elems for op in adam) == graph.parameters
    assert sum(op.bytes_moved for op in adam) == 30 * graph.parameters
    assert all(op.dtype == "fp32" and op.param("phase") == "opt" for op in adam)


def test_a_shard_of_the_optimizer_step_moves_30_bytes_per_parameter_it_updates() -> None:
    """A rank updating a part of a group's parameters (tensor parallelism, ZeRO) reads and
    writes the master weights and moments of that part only."""
    graph = load_workload(SMALL_LLAMA + ",mode=train")
    adam = graph.op("layers.0.adam")
    for share in (2, 3, 8):
        part = adam.with_loops(C=adam.dim("C") // share)
        assert part.bytes_moved == 30 * part.dim("C")
        assert part.weight_elems == 3 * part.dim("C")


# ---------------------------------------------------------------- activation memory


@pytest.mark.parametrize("dtype,e", [("bf16", 2), ("fp32", 4)])
@pytest.mark.parametrize("recompute", ["none", "selective", "full"])
def test_activation_bytes_per_block_follow_korthikanti(dtype, e, recompute) -> None:
    """Korthikanti et al. 2022, section 4.1, with e-byte activations and 1-byte dropout masks:
    per block s*b*h*(16e + 2) + a*s^2*b*(2e + 1) (34sbh + 5as^2b at e = 2); selective
    recomputation keeps s*b*h*(16e + 2); full recomputation keeps the block input, e*s*b*h."""
    s, b, h, a = 64, 2, 256, 4
    graph = load_workload(SMALL_GPT + f",mode=train,dtype={dtype},recompute={recompute}")
    per_layer = footprint(graph).activation_bytes_per_layer
    sbh = s * b * h
    expected = {"none": sbh * (16 * e + 2) + a * s * s * b * (2 * e + 1), "selective": sbh * (16 * e + 2),
                "full": e * sbh}[recompute]
    assert [per_layer[i] for i in range(3)] == [expected] * 3


def test_llama_keeps_no_dropout_masks_and_the_narrower_key_value_heads() -> None:
    s, b, h, heads, kv, f, e = 64, 2, 256, 8, 2, 640, 2
    per_layer = footprint(load_workload(SMALL_LLAMA + ",mode=train")).activation_bytes_per_layer
    kvh = h * kv // heads
    # norm inputs (2h), Q/K/V projection input (h), rotated q and k, v, attention output (h), MLP input (h),
    # gate and up outputs (2f), SwiGLU output (f); softmax output (a s^2 b, read by both its own backward and P V's)
    expected = e * s * b * (2 * h + h + h + 2 * kvh + h + h + 3 * f) + e * heads * s * s * b
    assert per_layer[1] == expected


# ---------------------------------------------------------------- serving


def test_decode_step_reads_the_whole_kv_cache() -> None:
    l, h, heads, kv, c, b, e = 3, 256, 8, 2, 300, 4, 2
    graph = load_workload(SMALL_LLAMA.replace("seq=64,batch=2", f"batch={b}") + f",mode=decode,context={c}")
    d = h // heads
    cache_reads = sum(op.in_shapes[1][1] * op.in_shapes[1][2] * op.in_shapes[1][0] * e
                      for op in graph.ops if op.kind == OpKind.MATMUL)
    assert cache_reads == 2 * l * kv * d * c * b * e
    f = footprint(graph)
    assert f.kv_cache_bytes == 2 * l * kv * d * c * b * e
    # every query attends over the full context: one query row per sequence and head
    assert {(op.dim("M"), op.dim("N") if op.name.endswith("qk") else op.dim("K"))
            for op in graph.ops if op.kind == OpKind.MATMUL} == {(1, c)}


def test_serve_is_a_prefill_then_decode_steps_over_a_growing_cache() -> None:
    p, g = 16, 3
    graph = load_workload(SMALL_LLAMA.replace("seq=64,", "") + f",mode=serve,prompt={p},generate={g}")
    names = {op.name for op in graph.ops}
    assert "prefill.layers.0.attn.kv_write" in names
    for step in range(1, g + 1):
        qk = graph.op(f"decode.{step}.layers.0.attn.qk")
        assert (qk.dim("M"), qk.dim("N")) == (1, p + step)
    # each step takes the token the step before it sampled
    chain = nx.ancestors(graph.to_networkx(), f"decode.{g}.sample")
    assert {"prefill.sample"} | {f"decode.{s}.sample" for s in range(1, g)} <= chain
    f = footprint(graph)
    assert f.kv_cache_bytes == 2 * 3 * 2 * 32 * (p + g) * 2 * 2


def test_prefill_logits_are_for_the_last_token_only() -> None:
    graph = load_workload(SMALL_GPT + ",mode=prefill")
    out = graph.op("output")
    assert out.dim("M") == 1 and out.dim("N") == 1000
    assert graph.op("layers.0.attn.kv_write").param("keep")
    assert [graph.ops[i].name for i in graph.outputs] == ["sample"]


# ---------------------------------------------------------------- backward structure


def test_backward_follows_autograd_order() -> None:
    graph = load_workload(SMALL_GPT.replace("layers=3", "layers=2") + ",mode=train")

    def preds(name: str) -> list[str]:
        return list(graph.op(name).inputs)

    # the MLP of the last block, backward: fc2 first, its input gradient through GeLU into fc1
    assert preds("layers.1.mlp.fc2.dgrad") == ["layers.1.mlp.dropout.grad"]
    assert preds("layers.1.mlp.fc2.wgrad") == ["layers.1.mlp.act", "layers.1.mlp.dropout.grad"]
    assert preds("layers.1.mlp.act.grad") == ["layers.1.mlp.fc1", "layers.1.mlp.fc2.dgrad"]
    # the residual stream's gradient: what passed the MLP's residual add plus the post-norm's input gradient
    assert preds("layers.1.attn.residual.grad_sum") == ["final_norm.grad", "layers.1.post_norm.grad"]
    # the three projections' gradients joined into the fused QKV projection's output gradient
    assert preds("layers.1.attn.qkv.grad_concat") == ["layers.1.attn.qk.grad_a", "layers.1.attn.qk.grad_b",
                                                      "layers.1.attn.pv.grad_b"]
    order = {op.name: i for i, op in enumerate(graph.ops)}
    last_fwd = max(i for i, op in enumerate(graph.ops) if op.param("phase") == "fwd")
    first_bwd_0 = min(order[op.name] for op in graph.ops if op.param("phase") == "bwd" and op.param("layer") == 0)
    last_bwd_1 = max(order[op.name] for op in graph.ops if op.param("phase") == "bwd" and op.param("layer") == 1)
    assert last_fwd < order["loss.grad"] and last_bwd_1 < first_bwd_0  # later blocks' backward first
    nxg = graph.to_networkx()
    for i in range(2):
        adam = f"layers.{i}.adam"
        wgrads = {op.name for op in graph.ops if op.param("layer") == i and op.param("grad") == "weight"}
        assert wgrads <= nx.ancestors(nxg, adam)
        assert "loss" in nx.ancestors(nxg, adam)


def test_tied_output_projection_accumulates_into_the_embedding_group() -> None:
    graph = load_workload(SMALL_GPT + ",mode=train")
    assert graph.op("output").param("shares") == "embed.tokens"
    assert "output.wgrad" in graph.op("embed.grad_buffer").inputs
    assert graph.op("embed.adam").out_elems == 1000 * 256 + 128 * 256  # tokens and positions


def test_shapes_regions_and_reshapes_of_every_op_agree() -> None:
    """For every op of training and serving graphs: its shapes reproduce under a re-shape to the
    same loops, inputs are within their producers' tensors, and each legal split into two gives
    regions whose sizes are the shard op's tensor sizes."""
    for spec in (SMALL_GPT + ",mode=train,recompute=selective", SMALL_LLAMA + ",mode=train",
                 SMALL_MOE + ",mode=train", SMALL_LLAMA.replace("seq=64,", "") + ",mode=serve,prompt=8,generate=2"):
        graph = load_workload(spec)
        for op in graph.ops:
            if op.kind == OpKind.INPUT:
                continue
            same = _reshape(op, op.loop_dict)
            assert (same.in_shapes, same.out_shape, same.weight_elems) == (op.in_shapes, op.out_shape,
                                                                           op.weight_elems), op.name
            for src, shape in zip(op.inputs, op.in_shapes):
                assert all(a <= b for a, b in zip(shape, graph.op(src).out_shape)), (op.name, src)
            for strategy in legal_strategies(op):
                dim = split_dim(op, strategy)
                if dim is None:
                    continue
                lo = 0
                for part in split_sizes(op.dim(dim), 2):
                    shard = op.with_loops(**{dim: part})
                    out, ins, _ = shard_regions(op, dim, lo, lo + part)
                    assert box_elems(out) == math.prod(shard.out_shape), (op.name, strategy)
                    assert [box_elems(b) for b in ins] == [math.prod(s) for s in shard.in_shapes], (op.name, strategy)
                    lo += part


# ---------------------------------------------------------------- bad input


@pytest.mark.parametrize("spec,key", [
    ("gpt:hidden=1000,heads=3", "heads"),
    ("llama:kv_heads=5", "kv_heads"),
    ("moe:top_k=9", "top_k"),
    ("llama3-8b:mode=decode", "context"),
    ("gpt:layers=-2", "layers"),
    ("gpt:hidden=12.5", "hidden"),
    ("gpt3-175b:mode=training", "mode"),
    ("gpt3-175b:recompute=full", "recompute"),
    ("llama3-8b:mode=serve,prompt=16", "generate"),
    ("gpt3-125m:seq=4096", "seq"),
    ("gpt3-125m:dropout=1.5", "dropout"),
    ("mixtral-8x7b:capacity_factor=fast", "capacity_factor"),
])
def test_bad_spec_is_one_line_naming_the_parameter(spec, key, capsys) -> None:
    with pytest.raises(InputError) as info:
        load_workload(spec)
    assert info.value.problems[0][0] == key
    assert main(["show", spec]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and key in err


def test_unknown_preset_lists_the_known_ones(capsys) -> None:
    assert main(["show", "gpt3-999b"]) == 2
    err = capsys.readouterr().err
    assert "gpt3-175b" in err and "llama3-70b" in err and len(err.strip().splitlines()) == 1


# ---------------------------------------------------------------- where it shows


def test_workloads_and_show_print_the_llm_numbers(capsys) -> None:
    assert main(["workloads"]) == 0
    out = capsys.readouterr().out
    rows = {line.split()[0]: line for line in out.splitlines() if line and not line.startswith(" ")}
    assert "174.6" in rows["gpt3-175b"] and "46.7 (12.9 active)" in rows["mixtral-8x7b"]
    assert main(["show", "gpt3-175b:mode=train,batch=1"]) == 0
    out = capsys.readouterr().out
    graph = load_workload("gpt3-175b:mode=train,batch=1")
    f = footprint(graph)
    assert "parameters 174,604,259,328 = 174.6 B" in out
    assert "optimizer state 1.906 TiB" in out and f.optimizer_bytes == 12 * f.parameters
    assert "activations kept for backward" in out and "KV cache" not in out
    assert main(["show", "llama3-8b:mode=decode,context=1024,batch=4"]) == 0
    assert "KV cache 512 MiB" in capsys.readouterr().out  # 2 x 32 x 8 x 128 x 1024 x 4 x 2 B


# ---------------------------------------------------------------- the evaluators, unchanged


@pytest.mark.parametrize("spec", [SMALL_GPT + ",mode=train,recompute=selective", SMALL_MOE + ",mode=train",
                                  SMALL_LLAMA.replace("seq=64,", "") + ",mode=serve,prompt=8,generate=2",
                                  SMALL_LLAMA + ",mode=prefill"])
def test_existing_evaluators_run_llm_graphs(spec) -> None:
    from marssim.analytical import estimate
    from marssim.cost import default_cost_model
    from marssim.lower import lower
    from marssim.mapping import Mapping
    from marssim.sim import simulate
    from marssim.system import load_system

    graph = load_workload(spec)
    cost = default_cost_model()
    for name in ("ring-8", "dgx-h100"):
        system = load_system(name)
        one = lower(graph, system, Mapping.single_set(graph, system, sharding="none"), cost)
        result, est = simulate(one, system), estimate(one, system)
        # one device: only the two token-id inputs share the host link
        assert est.makespan == pytest.approx(result.makespan, rel=1e-3)
        busy = result.devices["busy_s"].sum()
        assert busy == pytest.approx(sum(one.duration), rel=1e-12) and result.makespan >= busy
        split = lower(graph, system, Mapping.single_set(graph, system, sharding=("head", "oc", "seq", "dp")), cost)
        res = simulate(split, system)
        assert estimate(split, system).lower_bound <= res.makespan * (1 + 1e-9)
        assert res.intervals["flops"].sum() == pytest.approx(sum(op.flops for op in graph.ops), rel=1e-9)


def test_a_training_step_takes_one_micro_batch_in_a_per_op_mapping() -> None:
    from marssim.mapping import Mapping, validate_mapping
    from marssim.system import load_system

    graph = load_workload(SMALL_GPT + ",mode=train")
    system = load_system("ring-8")
    mapping = Mapping.single_set(graph, system, micro_batches=2)
    with pytest.raises(InputError) as info:
        validate_mapping(mapping, graph, system)
    assert info.value.problems[0][0] == "micro_batches"


def test_kv_cache_is_resident_on_the_devices_that_read_it() -> None:
    from marssim.cost import default_cost_model
    from marssim.lower import lower
    from marssim.mapping import Mapping
    from marssim.system import load_system

    graph = load_workload(SMALL_LLAMA.replace("seq=64,", "") + ",mode=decode,context=100")
    system = load_system("dgx-h100")
    whole = lower(graph, system, Mapping.single_set(graph, system, devices=("gpu0",), sharding="none"),
                  default_cost_model())
    weights = sum(op.weight_bytes for op in graph.ops if not op.param("shares"))
    assert whole.resident["gpu0"] == weights + footprint(graph).kv_cache_bytes
    assert sum(b for _, _, b in whole.setup) == weights  # the cache is made on the device, not loaded


# Megatron-LM core 0.8 vocab_parallel_cross_entropy, pass by pass: (bytes read, bytes written) per logit
_UNFUSED_FORWARD = [("cast to fp32", "e", 4), ("row max", 4, 0), ("subtract max in place", 4, 4),
                    ("exp in place", 4, 4), ("row sum", 4, 0), ("divide in place", 4, 4)]
_UNFUSED_BACKWARD = [("scale by the loss gradient in place", 4, 4), ("cast back", 4, "e")]


def _passes(passes, e: int) -> int:
    if e == 4:  # fp32 logits: .float() is no copy, nor its backward
        passes = [p for p in passes if not p[0].startswith("cast")]
    return sum((e if r == "e" else r) + (e if w == "e" else w) for _, r, w in passes)


@pytest.mark.parametrize("dtype,e", [("bf16", 2), ("fp16", 2), ("fp32", 4)])
def test_the_unfused_loss_moves_megatrons_passes_over_the_logits_and_the_fused_one_a_read_and_a_write(dtype, e):
    """The training loss's bytes per logit, forward and backward, are the sum of Megatron-LM's
    unfused cross-entropy kernels (38 and 14 B from bf16), or with cross_entropy=fused one read
    and one write each way; a tensor-parallel shard of the vocabulary keeps the bytes per logit."""
    spec = f"gpt:layers=2,hidden=256,heads=4,seq=128,vocab=4096,mode=train,dtype={dtype}"
    for how, fwd, bwd in (("unfused", _passes(_UNFUSED_FORWARD, e), _passes(_UNFUSED_BACKWARD, e)),
                          ("fused", 2 * e, 2 * e)):
        ops = {o.name: o for o in load_workload(f"{spec},cross_entropy={how}").ops}
        loss, grad = ops["loss"], ops["loss.grad"]
        assert loss.out_elems == grad.out_elems == 128 * 4096
        assert loss.bytes_moved == fwd * loss.out_elems and grad.bytes_moved == bwd * grad.out_elems, how
        shard = loss.with_loops(L=4096 // 4)
        assert shard.bytes_moved == fwd * shard.out_elems
        # the probabilities backward reads are kept in fp32 by the unfused loss, in the logits' type fused
        kept = saved_tensors(load_workload(f"{spec},cross_entropy={how}"))[("loss", "out")][0]
        assert kept == (4 if how == "unfused" else e) * loss.out_elems
    assert (_passes(_UNFUSED_FORWARD, 2), _passes(_UNFUSED_BACKWARD, 2)) == (38, 14)


def test_an_unknown_cross_entropy_is_refused_naming_the_key():
    with pytest.raises(InputError, match="cross_entropy: expected one of unfused, fused"):
        load_workload("gpt:layers=2,hidden=256,heads=4,seq=128,vocab=4096,mode=train,cross_entropy=chunked")
    with pytest.raises(InputError, match="cross_entropy: the training loss's kernels apply to mode=train"):
        load_workload("gpt:layers=2,hidden=256,heads=4,seq=128,vocab=4096,mode=prefill,cross_entropy=fused")
