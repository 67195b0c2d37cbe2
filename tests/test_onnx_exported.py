"""ONNX as users export it today: weights in an external ``NAME.onnx.data`` file (torch's dynamo
exporter's default) found beside the model from any working directory, and the ops that exporter
emits for common layers (ReduceMean as global average pooling, 1-D Conv and pooling,
ConvTranspose), with shapes and MACs checked against formulas written out here. The torch test
runs where torch is installed; the same code path runs without it on models built with the onnx
package."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

from marssim.errors import InputError  # noqa: E402
from marssim.workload import OpKind, load_workload  # noqa: E402
from marssim.workload.onnx_import import load_onnx  # noqa: E402

F = TensorProto.FLOAT


def _weights(name: str, shape) -> onnx.TensorProto:
    rng = np.random.default_rng(len(name))
    return numpy_helper.from_array(rng.standard_normal(shape).astype(np.float32), name)


def _layers_model(tmp_path: Path) -> Path:
    """Conv (2-D) -> ReLU -> ConvTranspose (stride 2, pads 1, output_padding 1) and -> ReduceMean over
    (2, 3) -> Gemm, on a 2 x 3 x 16 x 16 input; the weights saved as external data."""
    nodes = [
        helper.make_node("Conv", ["x", "wc", "bc"], ["c"], name="conv", kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c"], ["r"], name="relu"),
        helper.make_node("ConvTranspose", ["r", "wt", "bt"], ["up"], name="up", kernel_shape=[3, 3], strides=[2, 2],
                         pads=[1, 1, 1, 1], output_padding=[1, 1]),
        helper.make_node("ReduceMean", ["r", "axes"], ["g"], name="gap", keepdims=0),
        helper.make_node("Gemm", ["g", "wf", "bf"], ["logits"], name="fc", transB=1),
    ]
    inits = [_weights("wc", (16, 3, 3, 3)), _weights("bc", (16,)), _weights("wt", (16, 4, 3, 3)),
             _weights("bt", (4,)), numpy_helper.from_array(np.array([2, 3], dtype=np.int64), "axes"),
             _weights("wf", (10, 16)), _weights("bf", (10,))]
    graph = helper.make_graph(nodes, "layers", [helper.make_tensor_value_info("x", F, [2, 3, 16, 16])],
                              [helper.make_tensor_value_info("logits", F, [2, 10]),
                               helper.make_tensor_value_info("up", F, [2, 4, 32, 32])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    folder = tmp_path / "models"
    folder.mkdir()
    path = folder / "layers.onnx"
    onnx.save_model(model, str(path), save_as_external_data=True, all_tensors_to_one_file=True,
                    location="layers.onnx.data", size_threshold=0)
    return path


def _signal_model(tmp_path: Path) -> Path:
    """1-D: Conv (k5, s2, p2) -> MaxPool (k3, s2, p1) -> AveragePool (k2) -> ConvTranspose1d (k4, s2, p1)
    and -> ReduceMean over the last axis (keepdims) on a 2 x 4 x 64 signal."""
    nodes = [
        helper.make_node("Conv", ["x", "w1"], ["c"], name="conv1d", kernel_shape=[5], strides=[2], pads=[2, 2]),
        helper.make_node("MaxPool", ["c"], ["m"], name="maxpool1d", kernel_shape=[3], strides=[2], pads=[1, 1]),
        helper.make_node("AveragePool", ["m"], ["a"], name="avgpool1d", kernel_shape=[2], strides=[2]),
        helper.make_node("ConvTranspose", ["a", "wt"], ["up"], name="up1d", kernel_shape=[4], strides=[2],
                         pads=[1, 1]),
        helper.make_node("ReduceMean", ["a"], ["g"], name="mean", axes=[-1], keepdims=1),
    ]
    graph = helper.make_graph(nodes, "signal", [helper.make_tensor_value_info("x", F, [2, 4, 64])],
                              [helper.make_tensor_value_info("up", F, [2, 6, 16]),
                               helper.make_tensor_value_info("g", F, [2, 8, 1])],
                              [_weights("w1", (8, 4, 5)), _weights("wt", (8, 6, 4))])
    path = tmp_path / "signal.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]), str(path))
    return path


def test_external_weights_are_found_beside_the_model_from_another_directory(tmp_path, monkeypatch):
    path = _layers_model(tmp_path)
    assert (path.parent / "layers.onnx.data").is_file()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    graph = load_workload(str(path))
    assert graph.op("conv").weight_elems == 16 * 3 * 9 + 16
    # without its weights file the model is refused, saying which file is missing
    (path.parent / "layers.onnx.data").unlink()
    with pytest.raises(InputError, match="layers.onnx.data"):
        load_onnx(path)


def test_reduce_mean_conv_transpose_shapes_and_macs(tmp_path):
    graph = load_onnx(_layers_model(tmp_path))
    gap = graph.op("gap")
    assert gap.kind == OpKind.POOL and gap.param("global") and gap.param("mode") == "avg"
    assert gap.out_shape == (2, 16, 1, 1) and gap.flops == 2 * 16 * 16 * 16  # one per element averaged
    up, col2im = graph.op("up"), graph.op("up.col2im")
    # out = (16 - 1) * 2 - 1 - 1 + (3 - 1) + 1 + 1 = 32
    assert col2im.out_shape == (2, 4, 32, 32) and col2im.kind == OpKind.RESHAPE
    # every input element times every 3x3 kernel of each of the 4 output channels
    assert up.macs == 2 * 16 * 16 * 16 * 4 * 9
    assert up.weight_elems + col2im.weight_elems == 16 * 4 * 9 + 4
    assert graph.op("fc").inputs == ("gap",)


def test_one_dimensional_layers_shapes_and_macs(tmp_path):
    graph = load_onnx(_signal_model(tmp_path))
    conv = graph.op("conv1d")
    # L_out = (64 + 2 + 2 - 5) // 2 + 1 = 32; MACs = N K C L_out k
    assert conv.out_shape == (2, 8, 32, 1) and conv.macs == 2 * 8 * 4 * 32 * 5
    assert graph.op("maxpool1d").out_shape == (2, 8, 16, 1)  # (32 + 2 - 3) // 2 + 1
    assert graph.op("avgpool1d").out_shape == (2, 8, 8, 1)
    assert graph.op("mean").out_shape == (2, 8, 1, 1) and graph.op("mean").flops == 2 * 8 * 8
    up = graph.op("up1d")
    assert graph.op("up1d.col2im").out_shape == (2, 6, 16, 1)  # (8 - 1) * 2 - 2 + 4 = 16
    assert up.macs == 2 * 8 * 8 * 6 * 4


def test_reduce_mean_over_channels_is_refused_clearly(tmp_path):
    nodes = [helper.make_node("Relu", ["x"], ["r"], name="relu"),
             helper.make_node("ReduceMean", ["r"], ["m"], name="channel_mean", axes=[1], keepdims=1)]
    graph = helper.make_graph(nodes, "bad", [helper.make_tensor_value_info("x", F, [1, 4, 8, 8])],
                              [helper.make_tensor_value_info("m", F, [1, 1, 8, 8])])
    path = tmp_path / "bad.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]), str(path))
    with pytest.raises(InputError) as info:
        load_onnx(path)
    assert info.value.path == "graph.node[1]" and "expected spatial axes" in str(info.value)


def test_a_model_exported_by_torch_dynamo_imports_from_another_directory(tmp_path, monkeypatch):
    torch = pytest.importorskip("torch")
    pytest.importorskip("onnxscript")  # the dynamo exporter needs it
    nn = torch.nn

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv2d(3, 16, 3, padding=1)
            self.up = nn.ConvTranspose2d(16, 4, 3, stride=2, padding=1, output_padding=1)
            self.c1 = nn.Conv1d(16, 8, 5, stride=2, padding=2)
            self.pool = nn.MaxPool1d(3, stride=2, padding=1)
            self.fc = nn.Linear(16, 10)

        def forward(self, x):
            y = torch.relu(self.conv(x))
            signal = self.pool(self.c1(y.flatten(2)))  # [n, 16, 256] -> conv1d -> pool
            return self.fc(y.mean(dim=(2, 3))), self.up(y), signal

    model = Net().eval()
    x = torch.randn(2, 3, 16, 16)
    folder = tmp_path / "export"
    folder.mkdir()
    path = folder / "net.onnx"
    torch.onnx.export(model, (x,), str(path), dynamo=True, external_data=True)
    assert (folder / "net.onnx.data").is_file()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    graph = load_workload(str(path))
    with torch.no_grad():
        logits, up, signal = model(x)
    outputs = {op.out_shape for op in graph.ops}
    assert (2, 4, 32, 32) == tuple(up.shape) and (2, 4, 32, 32) in outputs
    assert (2, 8, signal.shape[2], 1) in outputs and (2, 10, 1, 1) in outputs
    kinds = [op.kind for op in graph.ops]
    assert OpKind.POOL in kinds and OpKind.CONV in kinds
    # the network's MACs written out: conv 2*16*3*16*16*9, transposed conv 2*16*16*16*4*9, conv1d
    # 2*8*16*128*5, linear 2*16*10
    assert graph.macs == 2 * 16 * 3 * 16 * 16 * 9 + 2 * 16 * 16 * 16 * 4 * 9 + 2 * 8 * 16 * 128 * 5 + 2 * 16 * 10
