"""Import an ONNX model as a :class:`~marssim.workload.Graph`.

Shapes come from ``onnx.shape_inference`` (static shapes are required; a symbolic batch is set to
the requested batch). Weights are the initializers and everything computed from constants alone
(``Constant``, ``ConstantOfShape``, shape arithmetic): they become the ``weight_elems`` of the op
that reads them, not ops. Every other node becomes one builder op:

=============================================  ==============================================
ONNX                                           marssim
=============================================  ==============================================
Conv (1-D and 2-D; grouped and depthwise)      ``conv`` (1-D: ``R x 1`` kernels over ``(n, c, L, 1)``)
ConvTranspose (1-D and 2-D)                    ``conv`` of 1x1 kernels making the ``K*R*S`` columns at
                                               the input's resolution (exactly the transposed
                                               convolution's MACs), then ``NAME.col2im``, a
                                               memory-only op scattering them to the output
Gemm, MatMul with a constant operand           ``gemm`` (a linear layer)
MatMul of two activations                      ``matmul`` (leading dims after the batch = heads)
MaxPool, AveragePool (1-D and 2-D),            ``pool``
Global{Average,Max}Pool, ReduceMean over the
spatial axes of an image (global or partial
average pooling)
Relu, Add, Mul, Sigmoid, Clip, Sum, ... (list   ``eltwise`` (broadcast activations are first
in ``ELEMENTWISE``)                            expanded by a memory-only op ``NAME.expandK``)
BatchNormalization, LayerNormalization, LRN    ``norm``
Softmax, LogSoftmax (over the last axis)       ``softmax``
Gather of a constant table by token ids        ``embedding``
Reshape, Flatten, Transpose, Concat, Split,    ``reshape`` (memory-only; ``what`` is the ONNX
Squeeze, Unsqueeze, Identity, Dropout, ...     op type)
=============================================  ==============================================

An unsupported node raises :class:`~marssim.errors.InputError` naming the file, the node and its
op type; nothing is dropped silently.

Tensor layout: ``[n, c, h, w]`` images are ``(n, c, h, w)``; ``[n, c, L]`` signals of 1-D
convolutions and pools are ``(n, c, L, 1)``; ``[b, tokens, features]`` is
``(b, features, tokens, 1)``; ``[b, features]`` is ``(b, features, 1, 1)``; integer ``[b, tokens]``
(token ids) is ``(b, 1, tokens, 1)``; 4-D tensors that reach a MatMul or a Softmax are attention
tensors ``[b, heads, rows, cols]`` -> ``(b, heads*cols, rows, 1)`` (see :mod:`.op`). The batch must be
the leading dimension of every activation.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from marssim.errors import InputError, warn_input

from .builder import GraphBuilder, T
from .graph import Graph
from .op import DTYPE_BYTES

__all__ = ["load_onnx", "SUPPORTED_OPS", "ELEMENTWISE", "MEMORY_ONLY"]

ELEMENTWISE = {
    "Relu": "relu", "LeakyRelu": "leaky_relu", "PRelu": "leaky_relu", "Sigmoid": "sigmoid", "Tanh": "tanh",
    "Clip": "clip", "HardSigmoid": "hard_sigmoid", "HardSwish": "hard_swish", "Elu": "elu", "Selu": "selu",
    "Softplus": "softplus", "Gelu": "gelu", "Erf": "erf", "Exp": "exp", "Log": "log", "Sqrt": "sqrt",
    "Reciprocal": "reciprocal", "Neg": "neg", "Abs": "abs", "Pow": "pow", "Add": "add", "Sum": "add",
    "Sub": "sub", "Mul": "mul", "Div": "div", "Max": "max", "Min": "min", "Mean": "mean", "Where": "where",
    "Equal": "equal", "Less": "less", "Greater": "greater", "Not": "not", "And": "and", "Or": "or",
}
"""ONNX element-wise op types and the ``fn`` name of the ``eltwise`` op they become."""

MEMORY_ONLY = frozenset({
    "Reshape", "Flatten", "Transpose", "Concat", "Split", "Squeeze", "Unsqueeze", "Identity", "Dropout", "Slice",
    "Gather", "Expand", "Tile", "Pad", "Cast", "DepthToSpace", "SpaceToDepth",
})
"""ONNX op types that only move or re-label data: ``reshape`` ops (one per used output)."""

_POOLS = {"MaxPool": "max", "AveragePool": "avg"}
_GLOBAL_POOLS = {"GlobalAveragePool": "avg", "GlobalMaxPool": "max"}
_NORMS = {"BatchNormalization": "batch", "LayerNormalization": "layer", "LRN": "lrn"}
_SOFTMAX = ("Softmax", "LogSoftmax")
SUPPORTED_OPS = frozenset({"Conv", "ConvTranspose", "Gemm", "MatMul", *_POOLS, *_GLOBAL_POOLS, "ReduceMean",
                           *ELEMENTWISE, *_NORMS, *_SOFTMAX, *MEMORY_ONLY, "Constant", "ConstantOfShape", "Shape",
                           "Size"})
"""Every ONNX op type the importer understands (constant-only nodes of any type are folded)."""

# ops that fix the layout of the 4-D tensors they touch
_IMAGE_OPS = frozenset({"Conv", "ConvTranspose", *_POOLS, *_GLOBAL_POOLS, "BatchNormalization", "LRN", "DepthToSpace",
                        "SpaceToDepth"})
_SEQ_OPS = frozenset({"MatMul", "LayerNormalization"})
_SAME_LAYOUT = frozenset({"ReduceMean"})  # the output is laid out as the input (a reduced image is an image)
_ALWAYS_CONSTANT = frozenset({"Constant", "Shape", "Size"})  # static shapes make Shape/Size constants

_FLOAT_DTYPES = {1: "fp32", 10: "fp16", 16: "bf16", 11: "fp32"}  # FLOAT, FLOAT16, BFLOAT16, DOUBLE (as fp32)
_INT_TYPES = frozenset({2, 3, 4, 5, 6, 7, 9, 12, 13})  # (u)int8..64 and bool


def _import_onnx():
    try:
        import onnx
        from onnx import shape_inference  # noqa: F401
    except ImportError:
        raise InputError(None, "onnx", "reading .onnx files needs the onnx package: pip install 'marssim[onnx]'") from None
    return onnx


def load_onnx(path: str | Path, batch: int | None = None, *, dtype: str | None = None) -> Graph:
    """Read an ONNX model into a :class:`Graph` (``load_workload`` calls this for ``*.onnx``).

    ``batch`` replaces the leading (batch) dimension of every activation (default: the file's, or
    1 where it is symbolic); ``dtype`` the element type (default: that of the model's floating
    inputs or weights). Raises InputError naming the file, and the node where one is at fault."""
    onnx = _import_onnx()
    file = str(path)
    if batch is not None and (not isinstance(batch, int) or batch < 1):
        raise InputError(file, "batch", f"expected a positive integer, got {batch!r}")
    if dtype is not None and dtype not in DTYPE_BYTES:
        raise InputError(file, "dtype", f"expected one of {', '.join(DTYPE_BYTES)}, got {dtype!r}")
    if not Path(file).is_file():
        raise InputError(file, "", "no such file; expected an ONNX model (.onnx)")
    from marssim.limits import MAX_ONNX_BYTES, check_file_size

    check_file_size(file, MAX_ONNX_BYTES, "an ONNX model file")
    try:
        model = onnx.load(file, load_external_data=False)  # shapes only: weights stay on disk
    except Exception as err:  # protobuf DecodeError, ...
        raise InputError(file, "", f"not a valid ONNX model: {_first_line(err)}") from None
    try:
        # by path, so that weights stored beside the model (torch's NAME.onnx.data) are found
        # relative to the model's folder, not the working directory
        onnx.checker.check_model(file)
    except Exception as err:  # onnx ValidationError
        raise InputError(file, "", f"not a valid ONNX model: {_first_line(err)}") from None
    _load_small_external(onnx, model, file)
    importer = _Importer(onnx, model, file, batch, dtype)
    graph = importer.build()
    suffix = []
    if batch is not None:
        suffix.append(f"batch={batch}")
    if dtype is not None:
        suffix.append(f"dtype={dtype}")
    graph.spec = file + (":" + ",".join(suffix) if suffix else "")
    return graph


def _load_small_external(onnx: Any, model: Any, file: str) -> None:
    """Read the values of small or integer initializers stored as external data (axes, shapes,
    scalars: what shape inference and the importer read), from beside the model; weights stay
    on disk."""
    from onnx.external_data_helper import load_external_data_for_tensor, uses_external_data

    base = str(Path(file).resolve().parent)
    for init in model.graph.initializer:
        if uses_external_data(init) and (init.data_type in _INT_TYPES or math.prod(init.dims) <= 1024):
            try:
                load_external_data_for_tensor(init, base)
            except Exception as err:
                raise InputError(file, f"graph.initializer[{init.name}]",
                                 f"cannot read its external data: {_first_line(err)}") from None
            init.data_location = onnx.TensorProto.DEFAULT
            del init.external_data[:]


def _first_line(err: BaseException) -> str:
    text = str(err).strip().splitlines()
    return text[0] if text else type(err).__name__


class _Importer:
    """One import: shapes, constants and layouts of the tensors, then one builder op per node."""

    def __init__(self, onnx: Any, model: Any, file: str, batch: int | None, dtype: str | None) -> None:
        self.onnx = onnx
        self.file = file
        self.name = Path(file).stem
        graph = model.graph
        initializers = {t.name for t in graph.initializer}
        self.real_inputs = [v for v in graph.input if v.name not in initializers]
        if not self.real_inputs:
            raise InputError(file, "graph.input", "no graph input that is not an initializer; expected the model's data input")
        self.nodes = list(graph.node)
        self.constants = set(initializers)
        self.consumers: dict[str, list[int]] = {}
        self._find_constants()
        self._check_supported()
        self.file_batch = self._fix_batch(model, batch)
        self.batch = batch if batch is not None else self.file_batch
        try:
            inferred = onnx.shape_inference.infer_shapes(model, strict_mode=True, data_prop=True)
        except Exception as err:
            raise InputError(file, "", f"ONNX shape inference failed: {_first_line(err)}") from None
        self.graph = inferred.graph
        self.nodes = list(self.graph.node)
        self._opset_version = next((int(o.version) for o in model.opset_import if o.domain in ("", "ai.onnx")), 13)
        self.dims: dict[str, tuple[int, ...] | None] = {}
        self.elem_type: dict[str, int] = {}
        for info in [*self.graph.input, *self.graph.value_info, *self.graph.output]:
            self._record(info)
        for init in self.graph.initializer:
            self.dims[init.name] = tuple(int(d) for d in init.dims)
            self.elem_type[init.name] = init.data_type
        self.dtype = dtype or self._model_dtype()
        self.layout = self._layouts()

    # ------------------------------------------------------------------ tensors
    def _record(self, info: Any) -> None:
        t = info.type.tensor_type
        if not info.type.HasField("tensor_type"):
            return
        self.elem_type[info.name] = t.elem_type
        if not t.HasField("shape"):
            self.dims[info.name] = None
            return
        dims = []
        for d in t.shape.dim:
            dims.append(int(d.dim_value) if d.HasField("dim_value") and d.dim_value > 0 else -1)
        self.dims[info.name] = tuple(dims)

    def _fix_batch(self, model: Any, batch: int | None) -> int:
        """The file's batch (leading dim of the first data input); a symbolic one is set to
        ``batch`` (or 1) before shape inference. Other symbolic dims are an error."""
        file_batch = None
        for k, info in enumerate(self.real_inputs):
            shape = info.type.tensor_type.shape
            if not info.type.tensor_type.HasField("shape") or len(shape.dim) == 0:
                raise InputError(self.file, f"graph.input[{info.name}]", "expected a tensor with a static shape "
                                                                          "whose leading dimension is the batch")
            for axis, d in enumerate(shape.dim):
                static = d.HasField("dim_value") and d.dim_value > 0
                if axis == 0:
                    if not static:
                        name = d.dim_param or "?"
                        d.Clear()
                        d.dim_value = batch or 1
                        if batch is None and file_batch is None:
                            warn_input(self.file, f"the batch dimension ({name}) of input {info.name!r} is symbolic; "
                                                  f"batch 1 is used (give another as {self.file}:batch=8 or --batch)")
                    if file_batch is None:
                        file_batch = int(d.dim_value)
                    elif int(d.dim_value) != file_batch:
                        raise InputError(self.file, f"graph.input[{info.name}]",
                                         f"leading dimension {d.dim_value} differs from the batch {file_batch} of "
                                         f"input {self.real_inputs[0].name!r}")
                elif not static:
                    raise InputError(self.file, f"graph.input[{info.name}]",
                                     f"dimension {axis} is symbolic ({d.dim_param or '?'}); expected static shapes "
                                     "apart from the batch")
        assert file_batch is not None
        return file_batch

    def _find_constants(self) -> None:
        """Mark constant tensors (initializers and anything computed from constants alone) and
        check the node order is topological."""
        known = set(self.constants) | {v.name for v in self.real_inputs} | {""}
        for i, node in enumerate(self.nodes):
            for t in node.input:
                if t not in known:
                    raise self._error(i, f"reads tensor {t!r}, which no earlier node produces (the nodes must be "
                                         "in topological order)")
                self.consumers.setdefault(t, []).append(i)
            inputs = [t for t in node.input if t]
            if node.op_type in _ALWAYS_CONSTANT or (inputs and all(t in self.constants for t in inputs)) or \
                    (not inputs and node.op_type == "ConstantOfShape"):
                self.constants.update(t for t in node.output if t)
            known.update(node.output)

    def _check_supported(self) -> None:
        """Refuse the first node of an unsupported type that does not fold to a constant."""
        for i, node in enumerate(self.nodes):
            if node.op_type not in SUPPORTED_OPS and not self._is_constant_node(node):
                raise self._error(i, f"unsupported operator {node.op_type!r} (domain {node.domain or 'ai.onnx'}); "
                                     f"supported: {', '.join(sorted(SUPPORTED_OPS))}")

    def _model_dtype(self) -> str:
        for info in self.real_inputs:
            if self.elem_type.get(info.name) in _FLOAT_DTYPES:
                return _FLOAT_DTYPES[self.elem_type[info.name]]
        for init in self.graph.initializer:
            if init.data_type in _FLOAT_DTYPES:
                return _FLOAT_DTYPES[init.data_type]
        return "fp32"

    def _layouts(self) -> dict[str, str]:
        """``image`` or ``seq`` for each 4-D activation: element-wise ops join their same-shaped
        operands and result into one group; Conv/pool/BN fix a group to ``image``, MatMul and
        LayerNorm to ``seq``; unfixed groups are images. Each op then checks that the box it
        computes for its output is the box its tensor has, so a layout that does not fit is an
        error at that node, never a wrong shape."""
        parent: dict[str, str] = {}

        def find(t: str) -> str:
            parent.setdefault(t, t)
            while parent[t] != t:
                parent[t] = parent[parent[t]]
                t = parent[t]
            return t

        fixed: dict[str, tuple[str, int]] = {}
        for i, node in enumerate(self.nodes):
            if self._is_constant_node(node):
                continue
            acts = [t for t in [*node.input, *node.output] if t and t not in self.constants]
            if node.op_type in ELEMENTWISE and node.output:
                out = node.output[0]
                for t in acts:
                    if self.dims.get(t) == self.dims.get(out):
                        parent[find(t)] = find(out)
            if node.op_type in _SAME_LAYOUT and node.output and acts:
                parent[find(acts[0])] = find(node.output[0])
            kind = "image" if node.op_type in _IMAGE_OPS else "seq" if node.op_type in _SEQ_OPS else None
            if kind:
                for t in acts:
                    fixed.setdefault(t, (kind, i))
        groups: dict[str, tuple[str, int]] = {}
        for t, (kind, i) in fixed.items():
            root = find(t)
            if root in groups and groups[root][0] != kind:
                other = groups[root][1]
                raise self._error(i, f"tensor {t!r} is used both as an image (by node {self._name(other)!r}) and as "
                                     "attention rows/columns; expected one layout per tensor")
            groups.setdefault(root, (kind, i))
        return {t: groups[find(t)][0] for t in parent if find(t) in groups} | \
            {t: kind for t, (kind, _) in fixed.items()}

    def _is_constant_node(self, node: Any) -> bool:
        outs = [t for t in node.output if t]
        return bool(outs) and all(t in self.constants for t in outs)

    def _shape(self, i: int | None, tensor: str) -> tuple[int, ...]:
        dims = self.dims.get(tensor)
        if dims is None or any(d < 0 for d in dims):
            raise self._error(i, f"shape inference gives no static shape for tensor {tensor!r} ({dims}); expected "
                                 "static shapes", tensor)
        return dims

    def _numel(self, i: int, tensor: str) -> int:
        return math.prod(self._shape(i, tensor))

    def box(self, i: int | None, tensor: str) -> tuple[int, int, int, int]:
        """The logical ``(n, c, h, w)`` box of an activation, with the batch replaced."""
        dims = list(self._shape(i, tensor))
        if not dims:
            raise self._error(i, f"activation {tensor!r} is a scalar; expected the batch as its leading dimension",
                              tensor)
        if dims[0] != self.file_batch:
            raise self._error(i, f"activation {tensor!r} has shape {dims}: its leading dimension is not the batch "
                                 f"({self.file_batch}); marssim keeps the batch as the leading dimension of every "
                                 "activation", tensor)
        dims[0] = self.batch
        rank = len(dims)
        if rank == 1:
            return (dims[0], 1, 1, 1)
        if rank == 2:
            if self.elem_type.get(tensor) in _INT_TYPES:  # token ids [b, tokens]
                return (dims[0], 1, dims[1], 1)
            return (dims[0], dims[1], 1, 1)
        if rank == 4 and self.layout.get(tensor, "image") == "image":
            return (dims[0], dims[1], dims[2], dims[3])
        if rank == 3 and self.layout.get(tensor) == "image":  # [n, c, L] of 1-D convolutions and pools
            return (dims[0], dims[1], dims[2], 1)
        middle = math.prod(dims[1:-2])
        return (dims[0], middle * dims[-1], dims[-2], 1)

    # ------------------------------------------------------------------ errors and names
    def _name(self, i: int) -> str:
        return self.op_names[i] if hasattr(self, "op_names") else (self.nodes[i].name or self.nodes[i].output[0])

    def _error(self, i: int | None, message: str, tensor: str = "") -> InputError:
        if i is None:  # a graph input
            return InputError(self.file, f"graph.input[{tensor}]", message)
        node = self.nodes[i]
        label = node.name or (node.output[0] if node.output else "")
        return InputError(self.file, f"graph.node[{i}]", f"{node.op_type} node {label!r}: {message}")

    def _unique_names(self, taken: set[str]) -> list[str]:
        names = []
        for i, node in enumerate(self.nodes):
            base = node.name or next((t for t in node.output if t), "") or f"{node.op_type}_{i}"
            name = base
            k = 1
            while name in taken:
                name = f"{base}_{k}"
                k += 1
            taken.add(name)
            names.append(name)
        return names

    # ------------------------------------------------------------------ build
    def build(self) -> Graph:
        b = GraphBuilder(self.name, batch=self.batch, dtype=self.dtype)
        self.tensors: dict[str, T] = {}
        used = set(self.consumers) | {o.name for o in self.graph.output}
        for info in self.real_inputs:
            if info.name not in used:
                continue
            n, c, h, w = self.box(None, info.name)
            self.tensors[info.name] = b.input(info.name, c=c, h=h, w=w, n=n)
        self.op_names = self._unique_names(set(self.tensors))
        for i, node in enumerate(self.nodes):
            if self._is_constant_node(node):
                continue
            try:
                self._convert(b, i, node)
            except InputError:
                raise
            except ValueError as err:  # the builder rejects a shape
                raise self._error(i, str(err)) from None
        if not any(t for t in self.tensors if t not in {v.name for v in self.real_inputs}):
            raise InputError(self.file, "graph.node", "no operator reads the model's inputs; expected a network")
        return b.build()

    def _attrs(self, node: Any) -> dict[str, Any]:
        return {a.name: self.onnx.helper.get_attribute_value(a) for a in node.attribute}

    def _acts(self, i: int, node: Any) -> list[T]:
        """Handles of the activation inputs of a node, in operand order."""
        out = []
        for t in node.input:
            if t and t not in self.constants:
                if t not in self.tensors:
                    raise self._error(i, f"reads {t!r}, an output this importer does not model")
                out.append(self.tensors[t])
        return out

    def _const_inputs(self, node: Any) -> list[str]:
        return [t for t in node.input if t and t in self.constants]

    def _single_output(self, i: int, node: Any) -> str:
        for extra in node.output[1:]:
            if extra and (extra in self.consumers or extra in {o.name for o in self.graph.output}):
                raise self._error(i, f"uses the optional output {extra!r}; expected only the first output to be read")
        return node.output[0]

    def _emit(self, i: int, tensor: str, handle: T) -> None:
        expected = self.box(i, tensor)
        if handle.shape != expected:
            raise self._error(i, f"marssim computes output shape {handle.shape} but ONNX shape inference gives "
                                 f"{self._shape(i, tensor)} (box {expected}); unsupported attribute combination")
        self.tensors[tensor] = handle

    def _convert(self, b: GraphBuilder, i: int, node: Any) -> None:
        op = node.op_type
        name = self.op_names[i]
        attrs = self._attrs(node)
        acts = self._acts(i, node)
        if op in MEMORY_ONLY:
            self._memory_only(b, i, node, name, acts)
            return
        out = self._single_output(i, node)
        if not acts:
            raise self._error(i, "has no activation input")
        if op == "Conv":
            self._conv(b, i, node, name, acts, attrs, out)
        elif op == "ConvTranspose":
            self._conv_transpose(b, i, node, name, acts, attrs, out)
        elif op == "ReduceMean":
            self._reduce_mean(b, i, node, name, acts[0], attrs, out)
        elif op in ("Gemm", "MatMul"):
            self._gemm(b, i, node, name, acts, attrs, out)
        elif op in _POOLS:
            self._pool(b, i, name, acts[0], attrs, out, _POOLS[op])
        elif op in _GLOBAL_POOLS:
            self._emit(i, out, b.global_pool(name, acts[0], mode=_GLOBAL_POOLS[op]))
        elif op in ELEMENTWISE:
            self._eltwise(b, i, node, name, acts, attrs, out)
        elif op in _NORMS:
            if op == "LayerNormalization" and attrs.get("axis", -1) not in (-1, len(self._shape(i, node.input[0])) - 1):
                raise self._error(i, f"normalises from axis {attrs['axis']}; expected the last axis only")
            self._emit(i, out, b.norm(name, acts[0], norm=_NORMS[op]))
        elif op in _SOFTMAX:
            self._softmax(b, i, node, name, acts[0], attrs, out)
        else:  # pragma: no cover - SUPPORTED_OPS and the branches above agree
            raise self._error(i, "unsupported operator")

    def _opset(self) -> int:
        return self._opset_version

    # ------------------------------------------------------------------ op kinds
    def _conv(self, b: GraphBuilder, i: int, node: Any, name: str, acts: list[T], attrs: dict, out: str) -> None:
        if len(acts) != 1 or node.input[0] not in self.tensors or (len(node.input) > 1 and node.input[1] not in self.constants):
            raise self._error(i, "expected an activation input and constant weights (weights computed at run time "
                                 "are not supported)")
        x = acts[0]
        spatial = self._spatial(i, node.input[0], "convolutions")
        w_dims = self._shape(i, node.input[1])
        kernel, strides, dilations = self._window(i, attrs, spatial, tuple(w_dims[2:]))
        if len(set(dilations)) != 1:
            raise self._error(i, f"dilations {list(dilations)} differ per axis; expected equal dilations")
        pads = self._pads(i, attrs, spatial, kernel, strides, dilations[0])
        bias = len(node.input) > 2 and bool(node.input[2])
        y = b.conv(name, x, out_channels=w_dims[0], kernel=kernel, stride=strides, pad=pads,
                   groups=int(attrs.get("group", 1)), bias=bias, dilation=dilations[0])
        self._emit(i, out, y)

    def _spatial(self, i: int, tensor: str, what: str) -> tuple[int, int]:
        """The spatial extent of a 1-D ``[n, c, L]`` or 2-D ``[n, c, h, w]`` tensor as ``(rows,
        cols)`` (a signal is ``L`` rows of one column)."""
        dims = self._shape(i, tensor)
        if len(dims) == 4:
            return (dims[2], dims[3])
        if len(dims) == 3:
            return (dims[2], 1)
        raise self._error(i, f"a rank-{len(dims)} input; expected 1-D or 2-D {what} ([n, c, L] or [n, c, h, w])")

    def _window(self, i: int, attrs: dict, spatial: tuple[int, int],
                kernel_default: tuple[int, ...]) -> tuple[tuple[int, int], tuple[int, int], tuple[int, int]]:
        """Kernel, strides and dilations as 2-D pairs (a 1-D window is ``(k, 1)``)."""
        one_d = spatial[1] == 1 and len(kernel_default) == 1 or len(attrs.get("kernel_shape", kernel_default)) == 1
        n = 1 if one_d else 2

        def pair(key: str, default) -> tuple[int, int]:
            value = tuple(int(v) for v in attrs.get(key, default))
            if len(value) != n:
                raise self._error(i, f"{key} {list(value)}; expected {n} value{'s' if n > 1 else ''} for a "
                                     f"{n}-D window")
            return (value[0], 1) if n == 1 else (value[0], value[1])

        return pair("kernel_shape", kernel_default), pair("strides", (1,) * n), pair("dilations", (1,) * n)

    def _conv_transpose(self, b: GraphBuilder, i: int, node: Any, name: str, acts: list[T], attrs: dict,
                        out: str) -> None:
        """A transposed convolution: every input element times the ``R x S`` kernel of every output
        channel of its group, scattered (and summed where windows overlap) into the output. As a
        1x1 convolution making the ``K*R*S`` columns at the input's resolution (its MACs are the
        transposed convolution's exactly: ``N*C*H*W*(K/groups)*R*S``), then ``NAME.col2im``, a
        memory-only op that scatters the columns to the output shape shape inference gives."""
        if len(acts) != 1 or len(node.input) < 2 or node.input[1] not in self.constants:
            raise self._error(i, "expected an activation input and constant weights (weights computed at run time "
                                 "are not supported)")
        spatial = self._spatial(i, node.input[0], "transposed convolutions")
        w_dims = self._shape(i, node.input[1])  # [C, K / groups, R(, S)]
        groups = int(attrs.get("group", 1))
        kernel, _, _ = self._window(i, attrs, spatial, tuple(w_dims[2:]))
        columns = w_dims[1] * groups * kernel[0] * kernel[1]
        bias = len(node.input) > 2 and bool(node.input[2])
        y = b.conv(name, acts[0], out_channels=columns, kernel=1, stride=1, pad=0, groups=groups, bias=False)
        shape = self.box(i, out)
        self._emit(i, out, b.reshape(f"{name}.col2im", y, shape=shape, what="col2im",
                                     weight_elems=shape[1] if bias else 0))

    def _reduce_mean(self, b: GraphBuilder, i: int, node: Any, name: str, x: T, attrs: dict, out: str) -> None:
        """The mean over spatial axes of an image or signal: global average pooling when it covers
        them all, else an average pool whose window spans the reduced axes."""
        dims = self._shape(i, node.input[0])
        rank = len(dims)
        if "axes" in attrs:
            axes = list(attrs["axes"])
        elif len(node.input) > 1 and node.input[1]:
            values = self._constant_array(node.input[1])
            if values is None:
                raise self._error(i, "takes its axes from a tensor computed at run time; expected constant axes")
            axes = [int(a) for a in values.reshape(-1)]
        else:
            axes = [] if attrs.get("noop_with_empty_axes", 0) else list(range(rank))
        axes = sorted({a + rank if a < 0 else a for a in axes})
        layout = self.layout.get(node.input[0], "image" if rank == 4 else "")
        if rank not in (3, 4) or layout != "image" or not axes or any(a < 2 for a in axes):
            raise self._error(i, f"averages axes {axes} of a tensor of shape {list(dims)}; expected spatial axes "
                                 "(2 and up) of an image [n, c, h, w] or signal [n, c, L] (average pooling)")
        rows, cols = (dims[2], dims[3]) if rank == 4 else (dims[2], 1)
        window = (rows if 2 in axes else 1, cols if 3 in axes else 1)
        if window == (rows, cols):
            y = b.global_pool(name, x, mode="avg")
        else:
            y = b.pool(name, x, kernel=window, stride=window, pad=0, mode="avg")
        self._emit(i, out, y)

    def _pads(self, i: int, attrs: dict, spatial: Sequence[int], kernel: Sequence[int], strides: Sequence[int],
              dilation: int) -> tuple[int, int, int, int]:
        auto = attrs.get("auto_pad", b"NOTSET")
        auto = auto.decode() if isinstance(auto, bytes) else str(auto)
        one_d = kernel[1] == 1 and spatial[1] == 1 and len(attrs.get("kernel_shape", (0, 0))) == 1
        if auto in ("NOTSET", ""):
            pads = tuple(attrs.get("pads", (0, 0) if one_d else (0, 0, 0, 0)))
            if one_d and len(pads) == 2:
                return (pads[0], 0, pads[1], 0)  # a signal's rows: (begin, end)
            if len(pads) != 4 or one_d:
                raise self._error(i, f"pads {list(pads)}; expected {2 if one_d else 4} values for a "
                                     f"{1 if one_d else 2}-D window")
            return pads  # ONNX order (top, left, bottom, right), as the builder's
        if auto == "VALID":
            return (0, 0, 0, 0)
        lo, hi = [], []
        for size, k, s in zip(spatial, kernel, strides):
            total = max((-(-size // s) - 1) * s + dilation * (k - 1) + 1 - size, 0)
            small, large = total // 2, total - total // 2
            lo.append(small if auto == "SAME_UPPER" else large)
            hi.append(large if auto == "SAME_UPPER" else small)
        return (lo[0], lo[1], hi[0], hi[1])  # a signal's second axis (size 1, kernel 1) gets none

    def _gemm(self, b: GraphBuilder, i: int, node: Any, name: str, acts: list[T], attrs: dict, out: str) -> None:
        a_name, b_name = node.input[0], node.input[1]
        if a_name in self.constants:
            raise self._error(i, "has a constant first operand; expected activations times weights")
        if b_name in self.constants:  # a linear layer
            if attrs.get("transA", 0):
                raise self._error(i, "transposes its activation (transA=1); expected transA=0")
            w = self._shape(i, b_name)
            if len(w) != 2:
                raise self._error(i, f"weights of shape {list(w)}; expected a 2-D weight matrix")
            out_features = w[0] if attrs.get("transB", 0) else w[1]
            a_rank = len(self._shape(i, a_name))
            if a_rank not in (2, 3):
                raise self._error(i, f"a rank-{a_rank} activation times weights; expected [batch, features] or "
                                     "[batch, tokens, features]")
            bias = node.op_type == "Gemm" and len(node.input) > 2 and bool(node.input[2])
            self._emit(i, out, b.linear(name, acts[0], out_features, bias=bias))
            return
        if node.op_type == "Gemm":
            raise self._error(i, "multiplies two activations; expected constant weights as its second operand "
                                 "(use MatMul for activation x activation)")
        da, db = self._shape(i, a_name), self._shape(i, b_name)
        if len(da) < 3 or da[:-2] != db[:-2]:
            raise self._error(i, f"operands {list(da)} x {list(db)}; expected [batch, ..., M, K] x [batch, ..., K, N] "
                                 "with equal leading dimensions")
        heads = math.prod(da[1:-2])
        self._emit(i, out, b.matmul(name, acts[0], acts[1], heads=heads, b_feature="N"))

    def _softmax(self, b: GraphBuilder, i: int, node: Any, name: str, x: T, attrs: dict, out: str) -> None:
        """Softmax over one axis followed only by size-1 axes (the last axis in effect; before opset
        13 the axis and all after it are normalised together, the same thing then)."""
        dims = self._shape(i, node.input[0])
        axis = attrs.get("axis", -1 if self._opset() >= 13 else 1)
        axis = axis + len(dims) if axis < 0 else axis
        keys = dims[axis] if 0 < axis < len(dims) else 0
        if not keys or any(d != 1 for d in dims[axis + 1:]) or x.w != 1 or x.c % keys:
            raise self._error(i, f"normalises over axis {attrs.get('axis', axis)} of shape {list(dims)}; expected the "
                                 "last axis (or one followed by size-1 axes) of [batch, ..., rows, keys]")
        self._emit(i, out, b.softmax(name, x, heads=x.c // keys))

    def _pool(self, b: GraphBuilder, i: int, name: str, x: T, attrs: dict, out: str, mode: str) -> None:
        if "kernel_shape" not in attrs or len(attrs["kernel_shape"]) not in (1, 2):
            raise self._error(i, "expected a 1-D or 2-D kernel_shape")
        kernel, strides, dilations = self._window(i, attrs, x.shape[2:], tuple(attrs["kernel_shape"]))
        if any(d != 1 for d in dilations):
            raise self._error(i, "dilated pooling is not supported")
        pads = self._pads(i, attrs, x.shape[2:], kernel, strides, 1)
        y = b.pool(name, x, kernel=kernel, stride=strides, pad=pads, mode=mode,
                   ceil_mode=bool(attrs.get("ceil_mode", 0)))
        self._emit(i, out, y)

    def _eltwise(self, b: GraphBuilder, i: int, node: Any, name: str, acts: list[T], attrs: dict, out: str) -> None:
        op = node.op_type
        fn = ELEMENTWISE[op]
        if op == "Clip":
            low, high = self._clip_bounds(node, attrs)
            if low == 0.0 and high == 6.0:
                fn = "relu6"
            weights = 0  # the bounds are settings, not parameters
        else:
            weights = sum(self._numel(i, t) for t in self._const_inputs(node))
        shape = self.box(i, out)
        operands = []
        for k, x in enumerate(acts):
            if x.shape != shape:  # a broadcast activation: materialise it at the output's shape
                x = b.reshape(f"{name}.expand{k}", x, shape=shape, what="expand")
            operands.append(x)
        self._emit(i, out, b.eltwise(name, *operands, fn=fn, weight_elems=weights))

    def _clip_bounds(self, node: Any, attrs: dict) -> tuple[float | None, float | None]:
        if "min" in attrs or "max" in attrs:
            return attrs.get("min"), attrs.get("max")
        values = []
        for t in list(node.input[1:3]):
            values.append(self._constant_value(t))
        values += [None] * (2 - len(values))
        return values[0], values[1]

    def _constant_value(self, tensor: str) -> float | None:
        arr = self._constant_array(tensor)
        return float(arr.reshape(-1)[0]) if arr is not None and arr.size == 1 else None

    def _constant_array(self, tensor: str):
        """The value of an initializer or Constant node's output (numpy), else None."""
        if not tensor:
            return None
        for init in self.graph.initializer:
            if init.name == tensor:
                return self.onnx.numpy_helper.to_array(init)
        for node in self.graph.node:
            if node.op_type == "Constant" and node.output and node.output[0] == tensor:
                for a in node.attribute:
                    if a.name == "value":
                        return self.onnx.numpy_helper.to_array(a.t)
                    if a.name in ("value_ints", "value_int"):
                        import numpy as np

                        return np.asarray(self.onnx.helper.get_attribute_value(a))
        return None

    def _memory_only(self, b: GraphBuilder, i: int, node: Any, name: str, acts: list[T]) -> None:
        op = node.op_type
        if op == "Gather":
            data = node.input[0]
            if data in self.constants:  # an embedding table looked up by token ids
                table = self._shape(i, data)
                if len(table) != 2 or self._attrs(node).get("axis", 0) != 0 or len(acts) != 1:
                    raise self._error(i, "gathers from a constant that is not a [vocab, hidden] table along axis 0")
                out = self._single_output(i, node)
                ids = acts[0]
                if ids.c != 1 or ids.w != 1:
                    raise self._error(i, f"token ids of shape {list(self._shape(i, node.input[1]))}; expected "
                                         "[batch, tokens]")
                self._emit(i, out, b.embedding(name, ids, vocab=table[0], hidden=table[1]))
                return
        if not acts:
            raise self._error(i, "has no activation input")
        weights = sum(self._numel(i, t) for t in self._const_inputs(node)) if op == "Concat" else 0
        outputs = [t for t in node.output if t]
        if op == "Dropout":
            outputs = [self._single_output(i, node)]
        for k, tensor in enumerate(outputs):
            if len(outputs) > 1 and tensor not in self.consumers and tensor not in {o.name for o in self.graph.output}:
                continue
            op_name = name if len(outputs) == 1 else f"{name}.out{k}"
            y = b.reshape(op_name, *acts, shape=self.box(i, tensor), what=op.lower(), weight_elems=weights)
            self.tensors[tensor] = y
