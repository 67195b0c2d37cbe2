"""The built-in workloads: MAC totals against published numbers, per-layer shapes against tables
written by hand from the architectures, graph invariants, multi-model tags, and bad specs."""

from __future__ import annotations

from collections import deque

import networkx as nx
import pytest

from marssim.errors import InputError
from marssim.mapping import legal_strategies, shard_regions, split_dim, split_sizes
from marssim.workload import OpKind, load_workload, zoo_entries

# (spec, published GMACs at batch 1, decimals the number is published to); REFERENCE.md
PUBLISHED_GMACS = [
    ("resnet50", 4.089, 3),
    ("vgg16", 15.47, 2),
    ("mobilenetv2", 0.301, 3),
    ("bert-base", 11.17, 2),
    ("bert-base:seq=512", 48.32, 2),
    ("gpt2", 106.3, 1),
    ("vit-b16", 17.56, 2),
]

# Published parameter counts (torchvision model summaries, HuggingFace checkpoints; BERT without
# its pooler, 109,482,240 - 590,592): an independent check that no weight is missing or doubled.
PUBLISHED_PARAMETERS = {
    "resnet50": 25_557_032, "vgg16": 138_357_544, "mobilenetv2": 3_504_872, "bert-base": 108_891_648,
    "gpt2": 124_439_808, "vit-b16": 86_567_656,
}

SINGLE_MODELS = ["resnet50", "vgg16", "mobilenetv2", "bert-base", "gpt2", "vit-b16"]
MIXES = {
    "mix-vision": ["resnet50", "mobilenetv2", "vgg16"],
    "mix-nlp-vision": ["bert-base", "resnet50"],
    "mix-transformers": ["bert-base", "vit-b16", "gpt2:seq=128"],  # the mix's seq (128) applies to GPT-2 too
}


def _with_batch(spec: str, batch: int) -> str:
    return f"{spec}{',' if ':' in spec else ':'}batch={batch}"

# ResNet-50 v1.5 at 224x224, written from the architecture (He et al. 2016, torchvision's
# Bottleneck with the stride in conv2): name, C (in), K (out), R, S, stride, P, Q.
RESNET50_CONVS = [
    ("conv1", 3, 64, 7, 7, 2, 112, 112),
    ("layer1.0.conv1", 64, 64, 1, 1, 1, 56, 56),
    ("layer1.0.conv2", 64, 64, 3, 3, 1, 56, 56),
    ("layer1.0.conv3", 64, 256, 1, 1, 1, 56, 56),
    ("layer1.0.downsample.0", 64, 256, 1, 1, 1, 56, 56),
    ("layer1.1.conv1", 256, 64, 1, 1, 1, 56, 56),
    ("layer1.1.conv2", 64, 64, 3, 3, 1, 56, 56),
    ("layer1.1.conv3", 64, 256, 1, 1, 1, 56, 56),
    ("layer1.2.conv1", 256, 64, 1, 1, 1, 56, 56),
    ("layer1.2.conv2", 64, 64, 3, 3, 1, 56, 56),
    ("layer1.2.conv3", 64, 256, 1, 1, 1, 56, 56),
    ("layer2.0.conv1", 256, 128, 1, 1, 1, 56, 56),
    ("layer2.0.conv2", 128, 128, 3, 3, 2, 28, 28),
    ("layer2.0.conv3", 128, 512, 1, 1, 1, 28, 28),
    ("layer2.0.downsample.0", 256, 512, 1, 1, 2, 28, 28),
    ("layer2.1.conv1", 512, 128, 1, 1, 1, 28, 28),
    ("layer2.1.conv2", 128, 128, 3, 3, 1, 28, 28),
    ("layer2.1.conv3", 128, 512, 1, 1, 1, 28, 28),
    ("layer2.2.conv1", 512, 128, 1, 1, 1, 28, 28),
    ("layer2.2.conv2", 128, 128, 3, 3, 1, 28, 28),
    ("layer2.2.conv3", 128, 512, 1, 1, 1, 28, 28),
    ("layer2.3.conv1", 512, 128, 1, 1, 1, 28, 28),
    ("layer2.3.conv2", 128, 128, 3, 3, 1, 28, 28),
    ("layer2.3.conv3", 128, 512, 1, 1, 1, 28, 28),
    ("layer3.0.conv1", 512, 256, 1, 1, 1, 28, 28),
    ("layer3.0.conv2", 256, 256, 3, 3, 2, 14, 14),
    ("layer3.0.conv3", 256, 1024, 1, 1, 1, 14, 14),
    ("layer3.0.downsample.0", 512, 1024, 1, 1, 2, 14, 14),
    ("layer3.1.conv1", 1024, 256, 1, 1, 1, 14, 14),
    ("layer3.1.conv2", 256, 256, 3, 3, 1, 14, 14),
    ("layer3.1.conv3", 256, 1024, 1, 1, 1, 14, 14),
    ("layer3.2.conv1", 1024, 256, 1, 1, 1, 14, 14),
    ("layer3.2.conv2", 256, 256, 3, 3, 1, 14, 14),
    ("layer3.2.conv3", 256, 1024, 1, 1, 1, 14, 14),
    ("layer3.3.conv1", 1024, 256, 1, 1, 1, 14, 14),
    ("layer3.3.conv2", 256, 256, 3, 3, 1, 14, 14),
    ("layer3.3.conv3", 256, 1024, 1, 1, 1, 14, 14),
    ("layer3.4.conv1", 1024, 256, 1, 1, 1, 14, 14),
    ("layer3.4.conv2", 256, 256, 3, 3, 1, 14, 14),
    ("layer3.4.conv3", 256, 1024, 1, 1, 1, 14, 14),
    ("layer3.5.conv1", 1024, 256, 1, 1, 1, 14, 14),
    ("layer3.5.conv2", 256, 256, 3, 3, 1, 14, 14),
    ("layer3.5.conv3", 256, 1024, 1, 1, 1, 14, 14),
    ("layer4.0.conv1", 1024, 512, 1, 1, 1, 14, 14),
    ("layer4.0.conv2", 512, 512, 3, 3, 2, 7, 7),
    ("layer4.0.conv3", 512, 2048, 1, 1, 1, 7, 7),
    ("layer4.0.downsample.0", 1024, 2048, 1, 1, 2, 7, 7),
    ("layer4.1.conv1", 2048, 512, 1, 1, 1, 7, 7),
    ("layer4.1.conv2", 512, 512, 3, 3, 1, 7, 7),
    ("layer4.1.conv3", 512, 2048, 1, 1, 1, 7, 7),
    ("layer4.2.conv1", 2048, 512, 1, 1, 1, 7, 7),
    ("layer4.2.conv2", 512, 512, 3, 3, 1, 7, 7),
    ("layer4.2.conv3", 512, 2048, 1, 1, 1, 7, 7),
]
RESNET50_FC = ("fc", 2048, 1000)  # name, in features, out features

# One BERT-base encoder layer over s tokens (Devlin et al. 2019: hidden 768, 12 heads of 64,
# intermediate 3072): linear layers as (suffix, out features N, in features K), rows M = s.
BERT_LINEARS = [
    ("attention.self.query", 768, 768),
    ("attention.self.key", 768, 768),
    ("attention.self.value", 768, 768),
    ("attention.output.dense", 768, 768),
    ("intermediate.dense", 3072, 768),
    ("output.dense", 768, 3072),
]


def _bert_matmuls(s: int) -> list[tuple[str, int, int, int, int]]:
    """(suffix, heads, M, N, K): Q K^T contracts the head dim 64, P V contracts the s keys."""
    return [("attention.self.matmul_qk", 12, s, s, 64), ("attention.self.matmul_pv", 12, s, 64, s)]


def _graph(spec: str):
    return load_workload(spec)


# ---------------------------------------------------------------- totals


@pytest.mark.parametrize("spec,gmacs,decimals", PUBLISHED_GMACS, ids=[p[0] for p in PUBLISHED_GMACS])
def test_mac_total_matches_the_published_number(spec: str, gmacs: float, decimals: int) -> None:
    graph = _graph(spec)
    assert graph.batch == 1
    assert abs(graph.macs / 1e9 - gmacs) <= 0.5 * 10 ** -decimals, graph.macs


@pytest.mark.parametrize("name", SINGLE_MODELS)
def test_parameter_count_matches_the_published_number(name: str) -> None:
    graph = _graph(name)
    assert sum(op.weight_elems for op in graph.ops) == PUBLISHED_PARAMETERS[name]
    assert graph.weight_bytes == 2 * PUBLISHED_PARAMETERS[name]  # fp16 by default
    assert {op.dtype for op in graph.ops} == {"fp16"}


@pytest.mark.parametrize("name", SINGLE_MODELS + list(MIXES))
def test_work_scales_exactly_with_batch_and_weights_do_not(name: str) -> None:
    one, three = _graph(name), _graph(f"{name}:batch=3")
    assert three.batch == 3 and three.spec == f"{name}:batch=3"
    assert three.macs == 3 * one.macs
    assert three.flops == 3 * one.flops
    assert three.weight_bytes == one.weight_bytes
    assert sum(op.output_bytes for op in three.ops) == 3 * sum(op.output_bytes for op in one.ops)
    assert [op.name for op in three.ops] == [op.name for op in one.ops]


def test_dtype_parameter_sets_the_bytes_per_element() -> None:
    fp16, fp32 = _graph("resnet50"), _graph("resnet50:dtype=fp32")
    assert {op.dtype for op in fp32.ops} == {"fp32"}
    assert fp32.weight_bytes == 2 * fp16.weight_bytes and fp32.macs == fp16.macs


def test_bert_seq_512_is_the_seq_128_count_with_quadratic_attention() -> None:
    # closed form: 12 layers x (12 * 768^2 * s + 2 * s^2 * 768)
    for s in (1, 128, 384, 512):
        assert _graph(f"bert-base:seq={s}").macs == 12 * (12 * 768**2 * s + 2 * s * s * 768)


def test_gpt2_lm_head_adds_the_vocabulary_projection() -> None:
    base, head = _graph("gpt2:seq=64"), _graph("gpt2:seq=64,lm_head=true")
    assert head.macs - base.macs == 64 * 768 * 50257
    assert head.op("lm_head").dim("N") == 50257


# ---------------------------------------------------------------- per-layer shapes


def test_resnet50_every_conv_and_fc_matches_the_hand_table() -> None:
    graph = _graph("resnet50")
    convs = [op for op in graph.ops if op.kind == OpKind.CONV]
    assert [op.name for op in convs] == [row[0] for row in RESNET50_CONVS]
    for name, c, k, r, s, stride, p, q in RESNET50_CONVS:
        op = graph.op(name)
        assert (op.dim("C"), op.dim("K"), op.dim("R"), op.dim("S"), op.dim("P"), op.dim("Q")) == (c, k, r, s, p, q), name
        assert op.param("stride") == (stride, stride), name
        assert op.param("groups") == 1 and op.dim("N") == 1
    gemms = [op for op in graph.ops if op.kind == OpKind.GEMM]
    assert len(gemms) == 1
    name, k_in, n_out = RESNET50_FC
    assert gemms[0].name == name and (gemms[0].dim("K"), gemms[0].dim("N"), gemms[0].dim("M")) == (k_in, n_out, 1)
    # the table alone gives the published total: an independent sum
    table_macs = sum(c * k * r * s * p * q for _, c, k, r, s, _, p, q in RESNET50_CONVS) + k_in * n_out
    assert table_macs == graph.macs
    assert abs(table_macs / 1e9 - 4.089) < 5e-4


def test_resnet50_keeps_norms_activations_pools_and_residuals() -> None:
    graph = _graph("resnet50")
    assert graph.count(OpKind.NORM) == 53  # a batch norm after every conv
    assert graph.count(OpKind.POOL) == 2  # max pool and global average pool
    adds = [op for op in graph.ops if op.kind == OpKind.ELTWISE and op.param("fn") == "add"]
    relus = [op for op in graph.ops if op.kind == OpKind.ELTWISE and op.param("fn") == "relu"]
    assert len(adds) == 16 and len(relus) == 1 + 16 * 3
    assert graph.op("avgpool").param("global") is True
    assert graph.op("layer2.0.residual").inputs == ("layer2.0.bn3", "layer2.0.downsample.1")
    assert graph.op("layer2.1.residual").inputs == ("layer2.1.bn3", "layer2.0.relu3")


@pytest.mark.parametrize("seq", [128, 512])
def test_bert_every_gemm_of_every_layer_matches_the_hand_table(seq: int) -> None:
    graph = _graph(f"bert-base:seq={seq}")
    layers = sorted({int(op.name.split(".")[2]) for op in graph.ops if op.name.startswith("encoder.layer.")})
    assert layers == list(range(12))
    for layer in layers:
        prefix = f"encoder.layer.{layer}."
        gemms = [op for op in graph.ops if op.name.startswith(prefix) and op.is_gemm_like]
        expected = [prefix + row[0] for row in BERT_LINEARS] + [prefix + row[0] for row in _bert_matmuls(seq)]
        assert sorted(op.name for op in gemms) == sorted(expected)
        for suffix, n_out, k_in in BERT_LINEARS:
            op = graph.op(prefix + suffix)
            assert op.kind == OpKind.GEMM
            assert (op.dim("B"), op.dim("M"), op.dim("N"), op.dim("K")) == (1, seq, n_out, k_in), op.name
            assert op.weight_elems == n_out * k_in + n_out  # weights and bias
        for suffix, heads, m, n, k in _bert_matmuls(seq):
            op = graph.op(prefix + suffix)
            assert op.kind == OpKind.MATMUL and op.weight_elems == 0
            assert (op.dim("B"), op.dim("H"), op.dim("M"), op.dim("N"), op.dim("K")) == (1, heads, m, n, k), op.name
        softmax = graph.op(prefix + "attention.self.softmax")
        assert (softmax.dim("A"), softmax.dim("H"), softmax.dim("L")) == (12, seq, seq)
    per_layer = sum(seq * n * k for _, n, k in BERT_LINEARS) + sum(h * m * n * k for _, h, m, n, k in _bert_matmuls(seq))
    assert graph.macs == 12 * per_layer


def test_gpt2_and_vit_attention_shapes() -> None:
    gpt = _graph("gpt2")
    qk = gpt.op("h.11.attn.matmul_qk")
    assert (qk.dim("H"), qk.dim("M"), qk.dim("N"), qk.dim("K")) == (12, 1024, 1024, 64)
    assert gpt.op("h.0.attn.c_attn").dim("N") == 3 * 768
    assert gpt.op("h.0.attn.matmul_qk").inputs == ("h.0.attn.split.q", "h.0.attn.split.k")
    assert gpt.count(OpKind.GEMM) == 4 * 12 and gpt.count(OpKind.MATMUL) == 2 * 12
    vit = _graph("vit-b16")
    pv = vit.op("encoder.layer.0.attention.attention.matmul_pv")
    assert (pv.dim("H"), pv.dim("M"), pv.dim("N"), pv.dim("K")) == (12, 197, 64, 197)  # 14*14 patches + class
    proj = vit.op("embeddings.patch_embeddings.projection")
    assert (proj.dim("C"), proj.dim("K"), proj.dim("R"), proj.dim("P")) == (3, 768, 16, 14)
    assert vit.op("classifier").dim("M") == 1 and vit.op("classifier").dim("N") == 1000
    assert _graph("vit-b16:image=384").op("encoder.layer.0.attention.attention.matmul_qk").dim("M") == 24 * 24 + 1


def test_mobilenetv2_has_17_depthwise_convs_and_vgg16_13_convs() -> None:
    mobile = _graph("mobilenetv2")
    depthwise = [op for op in mobile.ops if op.kind == OpKind.CONV and op.param("depthwise")]
    assert len(depthwise) == 17
    for op in depthwise:
        assert op.param("groups") == op.dim("K") == op.in_shapes[0][1] and op.dim("C") == 1
        assert "oc" in legal_strategies(op) and "ic" not in legal_strategies(op)
    assert mobile.count(OpKind.CONV) == 52 and mobile.op("classifier.1").dim("K") == 1280
    vgg = _graph("vgg16")
    assert vgg.count(OpKind.CONV) == 13 and vgg.count(OpKind.GEMM) == 3
    assert vgg.op("classifier.0").dim("K") == 512 * 7 * 7


# ---------------------------------------------------------------- graph invariants


@pytest.mark.parametrize("name", SINGLE_MODELS + list(MIXES))
def test_graph_invariants(name: str) -> None:
    graph = _graph(name)
    assert nx.is_directed_acyclic_graph(graph.to_networkx())
    assert len({op.name for op in graph.ops}) == len(graph.ops)
    # every op reachable from an input
    seen = {i for i, op in enumerate(graph.ops) if op.kind == OpKind.INPUT}
    queue = deque(seen)
    while queue:
        for j in graph.succs[queue.popleft()]:
            if j not in seen:
                seen.add(j)
                queue.append(j)
    assert len(seen) == len(graph.ops)
    for op in graph.ops:
        # each input shape is exactly what its producer makes
        assert op.in_shapes == tuple(graph.op(src).out_shape for src in op.inputs), op.name
        assert op.output_bytes > 0 and op.out_shape[0] == graph.batch
        if op.kind == OpKind.INPUT:
            continue
        assert op.input_bytes > 0, op.name
        if op.kind not in (OpKind.RESHAPE, OpKind.EMBEDDING):  # memory-only ops and table lookups
            assert op.flops > 0, op.name
        if op.kind in (OpKind.CONV, OpKind.GEMM, OpKind.EMBEDDING):
            assert op.weight_bytes > 0, op.name
        assert (op.macs > 0) == op.is_gemm_like
    # one output per model (the classifier or the last encoder layer)
    assert len(graph.outputs) == len(graph.models)


@pytest.mark.parametrize("name", ["resnet50", "bert-base", "mobilenetv2"])
def test_every_legal_sharding_of_every_op_conserves_flops(name: str) -> None:
    graph = _graph(f"{name}:batch=2")
    for i in graph.compute_ops:
        op = graph.ops[i]
        assert "dp" in legal_strategies(op)
        if op.kind in (OpKind.MATMUL, OpKind.SOFTMAX):
            assert "head" in legal_strategies(op)
        for strategy in legal_strategies(op):
            dim = split_dim(op, strategy)
            if dim is None:
                continue
            lo, flops = 0, 0
            for size in split_sizes(op.dim(dim), 2):
                if size:
                    flops += op.with_loops(**{dim: size}).flops
                    _, ins, _ = shard_regions(op, dim, lo, lo + size)
                    for box, shape in zip(ins, op.in_shapes):
                        assert all(0 <= a <= b <= s for (a, b), s in zip(box, shape)), (op.name, strategy)
                lo += size
            assert flops == op.flops, (op.name, strategy)


# ---------------------------------------------------------------- multi-model workloads


@pytest.mark.parametrize("name", list(MIXES))
def test_multi_model_workloads_are_tagged_and_add_up(name: str) -> None:
    for batch in (1, 2):
        mix = _graph(f"{name}:batch={batch}")
        parts = [_graph(_with_batch(part, batch)) for part in MIXES[name]]
        assert zoo_entries()[name].multi_model
        assert mix.models == tuple(part.split(":")[0] for part in MIXES[name])
        assert mix.macs == sum(p.macs for p in parts)
        assert mix.weight_bytes == sum(p.weight_bytes for p in parts)
        assert len(mix) == sum(len(p) for p in parts)
        for part in parts:
            for op in part.ops:
                merged = mix.op(f"{part.name}/{op.name}")
                assert merged.model == part.name and merged.loops == op.loops
        # layer segments never span two models
        for segment in mix.layers:
            assert len({mix.ops[i].model for i in segment}) == 1


def test_mix_parameters_reach_the_parts() -> None:
    mix = _graph("mix-nlp-vision:seq=256")
    assert mix.op("bert-base/encoder.layer.0.attention.self.matmul_qk").dim("N") == 256
    assert mix.macs == _graph("bert-base:seq=256").macs + _graph("resnet50").macs


# ---------------------------------------------------------------- specs


def test_zoo_lists_every_model_with_batch_and_a_description() -> None:
    entries = {name: e for name, e in zoo_entries().items() if e.group == "zoo"}  # the LLMs: test_llm_workloads
    assert set(SINGLE_MODELS) | set(MIXES) <= set(entries)
    for entry in entries.values():
        assert entry.defaults["batch"] == 1 and entry.defaults["dtype"] == "fp16" and entry.description


@pytest.mark.parametrize("spec,key,words", [
    ("resnet50:batch=0", "batch", "positive integer"),
    ("resnet50:batch=-2", "batch", "positive integer"),
    ("resnet50:batch=two", "batch", "positive integer"),
    ("resnet50:depth=101", "depth", "unknown parameter"),
    ("bert-base:image=224", "image", "unknown parameter"),
    ("bert-base:seq=1024", "seq", "512"),
    ("gpt2:seq=2048", "seq", "1024"),
    ("gpt2:lm_head=maybe", "lm_head", "true or false"),
    ("resnet50:image=16", "image", "at least 32"),
    ("vgg16:image=256", "image", "multiple of 224"),
    ("vit-b16:image=200", "image", "multiple of 16"),
    ("resnet50:dtype=fp64", "dtype", "fp16"),
    ("resnet50:batch", "batch", "expected parameters"),
    ("mix-vision:seq=128", "seq", "unknown parameter"),
])
def test_bad_spec_names_the_key(spec: str, key: str, words: str) -> None:
    with pytest.raises(InputError) as info:
        load_workload(spec)
    assert info.value.file == spec
    assert info.value.path == key
    assert words in str(info.value)


def test_unknown_model_lists_the_zoo() -> None:
    with pytest.raises(InputError) as info:
        load_workload("resnet51:batch=2")
    message = str(info.value)
    assert "unknown workload 'resnet51'" in message and "resnet50" in message and ".onnx" in message


def test_spec_records_only_non_default_parameters_in_a_canonical_order() -> None:
    assert _graph("resnet50:image=224,batch=1").spec == "resnet50"
    assert _graph("bert-base:seq=512,batch=4").spec == _graph("bert-base:batch=4,seq=512").spec == \
        "bert-base:batch=4,seq=512"
    assert load_workload("bert-base:seq=64", batch=5).spec == "bert-base:batch=5,seq=64"


# ---------------------------------------------------------------- end to end


@pytest.mark.parametrize("name", SINGLE_MODELS + ["mix-nlp-vision"])
def test_every_model_lowers_and_simulates_with_work_conserved(name: str) -> None:
    """The zoo's op kinds and shapes are what the mapping layer expects: data-parallel and a
    head/sequence/channel-split mapping both lower, simulate, and keep every FLOP."""
    from marssim.lower import lower
    from marssim.mapping import Mapping
    from marssim.sim import simulate
    from marssim.taskgraph import COMPUTE
    from support import RooflineCost, make_system

    graph = _graph(f"{name}:batch=2,seq=64" if name in ("bert-base", "gpt2", "mix-nlp-vision") else f"{name}:batch=2")
    system = make_system(4, topology="switch", capacity="64 GiB")
    for sharding in (("dp",), ("head", "seq", "oc", "spatial", "dp")):
        tg = lower(graph, system, Mapping.single_set(graph, system, sharding=sharding), RooflineCost())
        assert tg.flops[tg.kind == COMPUTE].sum() == graph.flops
        assert simulate(tg, system).makespan > 0
