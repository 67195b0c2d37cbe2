"""ONNX import: the weight-free models shipped in the onnx wheel, small graphs built here with
``onnx.helper`` (MACs written out by hand), batch override, and the error paths."""

from __future__ import annotations

import os
import sys
from collections import deque
from pathlib import Path

import networkx as nx
import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

from marssim.errors import InputError  # noqa: E402
from marssim.mapping import legal_strategies, split_dim, split_sizes  # noqa: E402
from marssim.workload import OpKind, load_workload  # noqa: E402
from marssim.workload.onnx_import import load_onnx  # noqa: E402

LIGHT = Path(os.path.dirname(onnx.__file__)) / "backend" / "test" / "data" / "light"
LIGHT_MODELS = ["bvlc_alexnet", "densenet121", "inception_v1", "inception_v2", "resnet50", "shufflenet",
                "squeezenet", "vgg19", "zfnet512"]

# Published parameter counts: torchvision (vgg19, squeezenet1_1), the Caffe model zoo (bvlc_alexnet,
# bvlc_googlenet = inception_v1) and torchvision resnet50 (the light model is v1.5, see below).
PUBLISHED_PARAMETERS = {"vgg19": 143_667_240, "squeezenet": 1_235_496, "bvlc_alexnet": 60_965_224,
                        "inception_v1": 6_998_552, "resnet50": 25_557_032}
# Published MACs (torchvision's "GFLOPS", which count multiply-adds), to the published precision.
PUBLISHED_GMACS = {"vgg19": (19.63, 2), "squeezenet": (0.35, 2), "resnet50": (4.089, 3)}
# Convolution counts from the papers: GoogLeNet 3 stem + 9 inception x 6; DenseNet-121 1 stem +
# 58 dense layers x 2 + 3 transitions + the 1x1-conv classifier of the Caffe2 version; VGG-19 16.
PUBLISHED_CONVS = {"inception_v1": 57, "densenet121": 121, "vgg19": 16, "resnet50": 53, "squeezenet": 26}


def _light(name: str) -> Path:
    return LIGHT / f"light_{name}.onnx"


def _check_invariants(graph) -> None:
    assert nx.is_directed_acyclic_graph(graph.to_networkx())
    seen = {i for i, op in enumerate(graph.ops) if op.kind == OpKind.INPUT}
    queue = deque(seen)
    while queue:
        for j in graph.succs[queue.popleft()]:
            if j not in seen:
                seen.add(j)
                queue.append(j)
    assert len(seen) == len(graph.ops)
    for op in graph.ops:
        assert op.in_shapes == tuple(graph.op(src).out_shape for src in op.inputs), op.name
        assert op.out_shape[0] == graph.batch and op.output_bytes > 0


# ---------------------------------------------------------------- the light models


@pytest.mark.parametrize("name", LIGHT_MODELS)
def test_every_light_model_imports_with_every_node_kept(name: str) -> None:
    path = _light(name)
    graph = load_onnx(path)
    _check_invariants(graph)
    assert graph.name == f"light_{name}" and graph.spec == str(path) and graph.models == (f"light_{name}",)
    # independently: the nodes reachable from the data input are exactly the ops (unnamed nodes are
    # named after their first output), so no node was dropped and no constant became an op
    model = onnx.load(str(path))
    initializers = {t.name for t in model.graph.initializer}
    data = [v.name for v in model.graph.input if v.name not in initializers]
    live = set(data)
    expected = set(data)
    for node in model.graph.node:
        if any(t in live for t in node.input):
            live.update(node.output)
            expected.add(node.name or node.output[0])
    assert {op.name for op in graph.ops} == expected
    if name in PUBLISHED_PARAMETERS:
        assert sum(op.weight_elems for op in graph.ops) == PUBLISHED_PARAMETERS[name]
    if name in PUBLISHED_GMACS:
        gmacs, decimals = PUBLISHED_GMACS[name]
        assert abs(graph.macs / 1e9 - gmacs) <= 0.5 * 10 ** -decimals
    if name in PUBLISHED_CONVS:
        assert graph.count(OpKind.CONV) == PUBLISHED_CONVS[name]


def test_light_resnet50_is_the_zoo_resnet50_layer_for_layer() -> None:
    """The light model is Caffe2's ResNet-50 with its strides in the 3x3 convs (v1.5, like
    torchvision; a v1 model would put stride 2 on conv1 of each first block and have 3.87 GMACs):
    the same 53 convs + 1 fc in the same order with the same shapes, strides and pads."""
    imported = load_onnx(_light("resnet50"), dtype="fp16")
    zoo = load_workload("resnet50")

    def layers(graph):
        rows = []
        for op in graph.ops:
            if op.kind == OpKind.CONV:
                rows.append(("conv", *(op.dim(d) for d in "NKCPQRS"), op.param("stride"), op.param("pad"),
                             op.param("groups")))
            elif op.kind == OpKind.GEMM:
                rows.append(("gemm", *(op.dim(d) for d in "BMNK")))
        return rows

    assert len(layers(imported)) == 54
    assert layers(imported) == layers(zoo)
    assert imported.macs == zoo.macs == 4_089_184_256
    assert imported.weight_bytes == zoo.weight_bytes
    assert imported.count(OpKind.NORM) == zoo.count(OpKind.NORM) == 53
    # the 3x3 conv of each down-sampling block has the stride (v1.5)
    strided = [op for op in imported.ops if op.kind == OpKind.CONV and op.param("stride") == (2, 2)]
    assert [(op.dim("R"), op.dim("P")) for op in strided] == [(7, 112), (3, 28), (1, 28), (3, 14), (1, 14), (3, 7),
                                                             (1, 7)]


def test_batch_override_scales_work_and_keeps_weights() -> None:
    one = load_onnx(_light("resnet50"))
    four = load_onnx(_light("resnet50"), batch=4)
    assert four.batch == 4 and four.spec == f"{_light('resnet50')}:batch=4"
    assert four.macs == 4 * one.macs and four.weight_bytes == one.weight_bytes
    assert all(op.out_shape[0] == 4 for op in four.ops)
    _check_invariants(four)
    # the same through a workload spec
    assert load_workload(f"{_light('resnet50')}:batch=4").macs == four.macs
    assert load_workload(str(_light("resnet50")), batch=4).macs == four.macs


# ---------------------------------------------------------------- graphs built here


def _init(name: str, shape, dtype=np.float32) -> onnx.TensorProto:
    return numpy_helper.from_array(np.zeros(shape, dtype=dtype), name)


def _save(tmp_path: Path, graph, name: str, opset: int = 17) -> Path:
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    path = tmp_path / f"{name}.onnx"
    onnx.save(model, str(path))
    return path


def _small_cnn(tmp_path: Path) -> Path:
    """Conv+bias, BN, ReLU, depthwise conv (stride 2), grouped conv (2 groups), Clip(0, 6), max pool
    with ceil_mode, average pool, add, a squeeze-excite style broadcast multiply, global pool,
    flatten, Gemm (transB) and softmax, on a 2 x 8 x 16 x 16 input."""
    f = TensorProto.FLOAT
    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], name="conv1", pads=[1, 1, 1, 1], kernel_shape=[3, 3]),
        helper.make_node("BatchNormalization", ["c1", "s", "bb", "mean", "v"], ["n1"], name="bn1"),
        helper.make_node("Relu", ["n1"], ["r1"], name="relu1"),
        helper.make_node("Conv", ["r1", "wdw"], ["dw"], name="dwconv", group=16, strides=[2, 2], pads=[1, 1, 1, 1]),
        helper.make_node("Conv", ["dw", "wg"], ["g"], name="gconv", group=2),
        helper.make_node("Constant", [], ["lo"], value=helper.make_tensor("lo", f, [], [0.0])),
        helper.make_node("Constant", [], ["hi"], value=helper.make_tensor("hi", f, [], [6.0])),
        helper.make_node("Clip", ["g", "lo", "hi"], ["r6"], name="clip"),
        helper.make_node("MaxPool", ["r6"], ["mp"], name="maxpool", kernel_shape=[3, 3], strides=[2, 2], ceil_mode=1),
        helper.make_node("AveragePool", ["r6"], ["ap"], name="avgpool", kernel_shape=[2, 2], strides=[2, 2]),
        helper.make_node("Add", ["mp", "ap"], ["a"], name="add"),
        helper.make_node("Mul", ["a", "scale"], ["ms"], name="scale_mul"),
        helper.make_node("GlobalAveragePool", ["ms"], ["se"], name="se_pool"),
        helper.make_node("Sigmoid", ["se"], ["gate"], name="se_gate"),
        helper.make_node("Mul", ["ms", "gate"], ["m"], name="se_mul"),
        helper.make_node("GlobalAveragePool", ["m"], ["gp"], name="gap"),
        helper.make_node("Flatten", ["gp"], ["fl"], name="flatten"),
        helper.make_node("Gemm", ["fl", "wfc", "bfc"], ["logits"], name="fc", transB=1),
        helper.make_node("Softmax", ["logits"], ["prob"], name="softmax"),
    ]
    inits = [_init("w1", (16, 8, 3, 3)), _init("b1", (16,)), _init("s", (16,)), _init("bb", (16,)), _init("mean", (16,)),
             _init("v", (16,)), _init("wdw", (16, 1, 3, 3)), _init("wg", (32, 8, 1, 1)), _init("scale", (1, 32, 1, 1)),
             _init("wfc", (10, 32)), _init("bfc", (10,))]
    graph = helper.make_graph(nodes, "small_cnn", [helper.make_tensor_value_info("x", f, [2, 8, 16, 16])],
                              [helper.make_tensor_value_info("prob", f, [2, 10])], inits)
    return _save(tmp_path, graph, "small_cnn", opset=13)


def test_small_cnn_maps_every_op_kind(tmp_path: Path) -> None:
    graph = load_onnx(_small_cnn(tmp_path))
    _check_invariants(graph)
    # MACs by hand: conv1 2*16*8*16*16*9, depthwise 2*16*1*8*8*9, grouped 2*32*8*8*8, fc 2*32*10
    assert graph.macs == 2 * 16 * 8 * 16 * 16 * 9 + 2 * 16 * 8 * 8 * 9 + 2 * 32 * 8 * 8 * 8 + 2 * 32 * 10
    conv1, dw, gconv = graph.op("conv1"), graph.op("dwconv"), graph.op("gconv")
    assert conv1.param("bias") and conv1.weight_elems == 16 * 8 * 9 + 16 and conv1.out_shape == (2, 16, 16, 16)
    assert dw.param("depthwise") and dw.param("stride") == (2, 2) and dw.out_shape == (2, 16, 8, 8)
    assert gconv.param("groups") == 2 and not gconv.param("depthwise")
    assert "oc" in legal_strategies(dw) and not {"oc", "ic"} & set(legal_strategies(gconv))
    assert graph.op("bn1").kind == OpKind.NORM and graph.op("bn1").param("norm") == "batch"
    assert graph.op("clip").param("fn") == "relu6" and graph.op("clip").weight_elems == 0
    assert graph.op("maxpool").out_shape == (2, 32, 4, 4)  # ceil((8 - 3) / 2) + 1
    assert graph.op("avgpool").param("mode") == "avg" and graph.op("gap").param("global")
    assert graph.op("scale_mul").weight_elems == 32  # a constant operand is a parameter
    expand = graph.op("se_mul.expand1")  # the 2x32x1x1 gate is broadcast by a memory-only op
    assert expand.kind == OpKind.RESHAPE and expand.inputs == ("se_gate",) and expand.out_shape == (2, 32, 4, 4)
    assert graph.op("se_mul").inputs == ("scale_mul", "se_mul.expand1")
    fc = graph.op("fc")
    assert fc.kind == OpKind.GEMM and (fc.dim("B"), fc.dim("M"), fc.dim("N"), fc.dim("K")) == (2, 1, 10, 32)
    assert graph.op("flatten").kind == OpKind.RESHAPE and graph.op("flatten").param("what") == "flatten"
    assert graph.op("softmax").loop_dict == {"N": 2, "A": 1, "H": 1, "L": 10}
    assert {op.dtype for op in graph.ops} == {"fp32"}


def _attention_block(tmp_path: Path, batch="batch", t: int = 16, d: int = 32, heads: int = 4, vocab: int = 100) -> Path:
    """Token embedding, layer norm, Q/K/V projections, multi-head attention written the way PyTorch
    exports it (Reshape + Transpose to [b, h, t, dh], K transposed to [b, h, dh, t]), output
    projection and residual. The batch is symbolic by default."""
    f = TensorProto.FLOAT
    dh = d // heads
    nodes = [
        helper.make_node("Gather", ["table", "ids"], ["emb"], name="embed"),
        helper.make_node("LayerNormalization", ["emb", "ln_s", "ln_b"], ["x"], name="ln", axis=-1),
        helper.make_node("MatMul", ["x", "wq"], ["q0"], name="q_proj"),
        helper.make_node("Add", ["q0", "bq"], ["q1"], name="q_bias"),
        helper.make_node("Reshape", ["q1", "shape4"], ["q2"], name="q_split"),
        helper.make_node("Transpose", ["q2"], ["q"], name="q_heads", perm=[0, 2, 1, 3]),
        helper.make_node("MatMul", ["x", "wk"], ["k0"], name="k_proj"),
        helper.make_node("Reshape", ["k0", "shape4"], ["k1"], name="k_split"),
        helper.make_node("Transpose", ["k1"], ["kt"], name="k_heads", perm=[0, 2, 3, 1]),
        helper.make_node("MatMul", ["x", "wv"], ["v0"], name="v_proj"),
        helper.make_node("Reshape", ["v0", "shape4"], ["v1"], name="v_split"),
        helper.make_node("Transpose", ["v1"], ["v"], name="v_heads", perm=[0, 2, 1, 3]),
        helper.make_node("MatMul", ["q", "kt"], ["s"], name="scores"),
        helper.make_node("Div", ["s", "sqrt_dh"], ["s2"], name="scale"),
        helper.make_node("Softmax", ["s2"], ["p"], name="softmax", axis=-1),
        helper.make_node("MatMul", ["p", "v"], ["c"], name="context"),
        helper.make_node("Transpose", ["c"], ["c1"], name="merge_heads", perm=[0, 2, 1, 3]),
        helper.make_node("Reshape", ["c1", "shape3"], ["c2"], name="merge"),
        helper.make_node("MatMul", ["c2", "wo"], ["o"], name="out_proj"),
        helper.make_node("Add", ["o", "x"], ["y"], name="residual"),
    ]
    inits = [_init("table", (vocab, d)), _init("ln_s", (d,)), _init("ln_b", (d,)), _init("wq", (d, d)),
             _init("bq", (d,)), _init("wk", (d, d)), _init("wv", (d, d)), _init("wo", (d, d)),
             numpy_helper.from_array(np.array([0, t, heads, dh], dtype=np.int64), "shape4"),
             numpy_helper.from_array(np.array([0, t, d], dtype=np.int64), "shape3"),
             numpy_helper.from_array(np.array(float(np.sqrt(dh)), dtype=np.float32), "sqrt_dh")]
    graph = helper.make_graph(nodes, "attention", [helper.make_tensor_value_info("ids", TensorProto.INT64, [batch, t])],
                              [helper.make_tensor_value_info("y", f, [batch, t, d])], inits)
    return _save(tmp_path, graph, "attention")


def test_attention_block_maps_to_linear_matmul_and_softmax_with_heads(tmp_path: Path) -> None:
    t, d, heads = 16, 32, 4
    path = _attention_block(tmp_path, t=t, d=d, heads=heads)
    for batch in (None, 3):
        graph = load_onnx(path, batch=batch)
        n = batch or 1  # a symbolic batch defaults to 1
        _check_invariants(graph)
        assert graph.batch == n
        # by hand: four d x d projections over t tokens and two t x t x d attention products
        assert graph.macs == n * (4 * t * d * d + 2 * t * t * d)
        emb = graph.op("embed")
        assert emb.kind == OpKind.EMBEDDING and emb.loop_dict == {"N": n, "H": t, "C": d} and emb.param("vocab") == 100
        assert graph.op("ln").param("norm") == "layer" and graph.op("ln").weight_elems == 2 * d
        for proj in ("q_proj", "k_proj", "v_proj", "out_proj"):
            op = graph.op(proj)
            assert op.kind == OpKind.GEMM and op.loop_dict == {"B": n, "M": t, "N": d, "K": d}
        scores, context = graph.op("scores"), graph.op("context")
        assert scores.kind == context.kind == OpKind.MATMUL
        assert scores.loop_dict == {"B": n, "H": heads, "M": t, "N": t, "K": d // heads}
        assert context.loop_dict == {"B": n, "H": heads, "M": t, "N": d // heads, "K": t}
        assert graph.op("softmax").loop_dict == {"N": n, "A": heads, "H": t, "L": t}
        assert graph.op("q_heads").kind == OpKind.RESHAPE and graph.op("q_heads").param("what") == "transpose"
        assert graph.op("q_bias").weight_elems == d
        # the head split is legal and conserves work, as in the zoo's attention
        for name in ("scores", "softmax", "context"):
            op = graph.op(name)
            assert "head" in legal_strategies(op)
            dim = split_dim(op, "head")
            assert sum(op.with_loops(**{dim: s}).flops for s in split_sizes(op.dim(dim), 3)) == op.flops


# ---------------------------------------------------------------- errors


def _unsupported(tmp_path: Path, op_type: str = "ReduceL2", domain: str = "") -> Path:
    f = TensorProto.FLOAT
    nodes = [helper.make_node("Relu", ["x"], ["r"], name="relu"),
             helper.make_node(op_type, ["r"], ["mean"], name="channel_mean", domain=domain)]
    graph = helper.make_graph(nodes, "bad", [helper.make_tensor_value_info("x", f, [1, 4, 8, 8])],
                              [helper.make_tensor_value_info("mean", f, [1, 1, 1, 1])])
    opsets = [helper.make_opsetid("", 13)] + ([helper.make_opsetid(domain, 1)] if domain else [])
    path = tmp_path / f"unsupported_{op_type}.onnx"
    onnx.save(helper.make_model(graph, opset_imports=opsets), str(path))
    return path


@pytest.mark.parametrize("op_type,domain", [("ReduceL2", ""), ("FancyPool", "com.example")])
def test_unsupported_op_names_the_file_the_node_and_the_op_type(tmp_path: Path, op_type: str, domain: str) -> None:
    path = _unsupported(tmp_path, op_type, domain)
    with pytest.raises(InputError) as info:
        load_workload(str(path))
    err = info.value
    assert err.file == str(path) and err.path == "graph.node[1]"
    assert op_type in str(err) and "'channel_mean'" in str(err) and "unsupported operator" in str(err)


def test_malformed_and_missing_files_are_input_errors(tmp_path: Path) -> None:
    garbage = tmp_path / "garbage.onnx"
    garbage.write_bytes(b"this is not a protobuf \x00\x01\x02\xff")
    with pytest.raises(InputError) as info:
        load_onnx(garbage)
    assert info.value.file == str(garbage) and "not a valid ONNX model" in str(info.value)
    with pytest.raises(InputError) as info:
        load_workload(str(tmp_path / "missing.onnx"))
    assert "no such file" in str(info.value)


def test_symbolic_sequence_length_is_refused(tmp_path: Path) -> None:
    f = TensorProto.FLOAT
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"], name="relu")], "sym",
                              [helper.make_tensor_value_info("x", f, ["batch", "seq", 8])],
                              [helper.make_tensor_value_info("y", f, ["batch", "seq", 8])])
    with pytest.raises(InputError) as info:
        load_onnx(_save(tmp_path, graph, "sym"))
    assert info.value.path == "graph.input[x]" and "symbolic (seq)" in str(info.value)


def test_folding_the_batch_into_another_dimension_is_refused(tmp_path: Path) -> None:
    f = TensorProto.FLOAT
    nodes = [helper.make_node("Reshape", ["x", "shape"], ["flat"], name="fold"),
             helper.make_node("Relu", ["flat"], ["y"], name="relu")]
    graph = helper.make_graph(nodes, "fold", [helper.make_tensor_value_info("x", f, [2, 5, 8])],
                              [helper.make_tensor_value_info("y", f, [10, 8])],
                              [numpy_helper.from_array(np.array([-1, 8], dtype=np.int64), "shape")])
    with pytest.raises(InputError) as info:
        load_onnx(_save(tmp_path, graph, "fold"))
    assert info.value.path == "graph.node[0]" and "not the batch" in str(info.value)


def test_bad_onnx_spec_parameters(tmp_path: Path) -> None:
    path = _small_cnn(tmp_path)
    with pytest.raises(InputError) as info:
        load_workload(f"{path}:seq=4")
    assert info.value.path == "seq"
    with pytest.raises(InputError) as info:
        load_workload(f"{path}:batch=0")
    assert info.value.path == "batch"
    assert load_workload(f"{path}:batch=5,dtype=fp16").weight_bytes * 2 == load_onnx(path).weight_bytes


def test_missing_onnx_package_is_one_clear_error(tmp_path: Path, monkeypatch) -> None:
    path = _small_cnn(tmp_path)
    monkeypatch.setitem(sys.modules, "onnx", None)  # import onnx now raises ImportError
    with pytest.raises(InputError) as info:
        load_onnx(path)
    assert "pip install 'marssim[onnx]'" in str(info.value)
