"""What a Megatron-LM training iteration runs that the workload graph does not, kernel by kernel.

The workload graph (:mod:`marssim.workload.llm`) holds a transformer's operations as PyTorch runs
them one by one: a linear layer's bias inside its GEMM, dropout and the residual add as two
kernels, the softmax of attention as one kernel, the optimizer as one AdamW pass. Megatron-LM runs
some of them fused, some as kernels of their own, and adds the optimizer's bookkeeping. This module
says, per op of the graph, which kernels its task runs (:func:`op_kernels`), and which the
optimizer step runs per group of parameters (:func:`optimizer_kernels`); the lowering
(:mod:`.lower`) times each by the cost model and gives the op's task their sum, the screen
(:mod:`.analytic`) the same.

Sources: Megatron-LM (github.com/NVIDIA/Megatron-LM) at commit 2755bcb87b (June 2022: the code of
Korthikanti et al. 2022's runs; Narayanan et al. 2021's runs used the same kernels), files named
below; where the current code (``megatron/core``) differs, it is said.

==========================  ====================================================================
what                        kernels (the switch: :class:`~.config.ParallelConfig`)
==========================  ====================================================================
linear bias                 a column-parallel linear that adds its own bias (the attention's
                            Q/K/V projection: ``skip_bias_add`` off) runs ``matmul`` then
                            ``output + bias``, a kernel of its own (``mpu/layers.py``,
                            ``LinearWithGradAccumulationAndAsyncCommunication.forward``); its
                            backward reduces the bias gradient ``grad_output.sum(dim=0)``
                            (``.backward``). The other linears skip the bias add and hand the bias
                            to the fused kernels below, whose backward reduces it (autograd's
                            ``sum_to`` of a broadcast add): one reduction kernel per biased
                            linear, reading its output gradient (where nvFuser fuses it into the
                            backward kernel, this overstates by one read)
bias-GeLU                   ``bias_gelu_fusion``: ``bias_gelu_impl`` (``model/fused_bias_gelu.py``)
                            is the graph's GeLU op (the bias read is negligible); off:
                            ``F.gelu(x + bias)``, a bias add kernel first (``model/transformer.py``,
                            ``ParallelMLP.forward``)
bias-dropout-add            ``bias_dropout_fusion``: ``bias_dropout_add_fused_train`` (TorchScript,
                            ``model/transformer.py``): one kernel reading the projection's output
                            and the residual, writing the sum and the dropout mask, in place of the
                            graph's dropout and add; off: ``dropout(x + bias) + residual``, three
                            kernels (bias add, the graph's dropout and add)
scaled masked softmax       ``masked_softmax_fusion``: ``FusedScaleMaskSoftmax``
                            (``model/fused_softmax.py``) runs ``scaled_upper_triang_masked_softmax``,
                            the graph's one softmax kernel, where ``is_kernel_available`` (16-bit
                            scores, ``16 < keys <= 4096``, queries and heads x batch multiples of
                            4); otherwise, or off, ``forward_torch_softmax``: the scores cast to
                            fp32 (``apply_query_key_layer_scaling``, on by default, sets
                            ``attention_softmax_in_fp32``), scaled, masked, the softmax, cast back:
                            four kernels more, and their four gradients in backward (the softmax
                            itself stays timed in the scores' type)
fused LayerNorm             ``persist_layer_norm``: ``MixedFusedLayerNorm`` (``model/fused_layer_norm.py``)
                            runs apex's persistent ``FastLayerNormFN`` for the hidden sizes of
                            ``persist_ln_hidden_sizes``: each row held in registers, so one read of
                            the input and one write of the output forward, one read of the input
                            and its gradient and one write of the input gradient backward (its
                            scale and shift gradients reduced from per-block partial sums), timed
                            as one pass over those bytes by the stack's element-wise kernels (the
                            kernel tables measure no apex LayerNorm: their norm rows are serving
                            engines' norm kernels, which read a row twice); off, or another hidden
                            size: apex's non-persistent ``FusedLayerNormAffineFunction``, timed as
                            the graph's norm ops (by those rows). RMSNorm as the graph has it
optimizer                   ``Float16OptimizerWithFloat16Params.step`` (``optimizer/optimizer.py``),
                            per parameter a rank updates: the gradient copied to fp32
                            (``_copy_model_grads_to_main_grads``: ``main_grad.float()``, a copy
                            unless the buffer is fp32), unscaled and checked for inf/NaN with fp16
                            (``_amp_foreach_non_finite_check_and_unscale_``, fp16's loss scaler;
                            bf16 has none), its L2 norm (``clip_grads.py``, ``multi_tensor_l2norm``)
                            when ``clip_grad`` > 0 and its scaling when the norm exceeds it
                            (``multi_tensor_scale``, ``grads_clipped``), the Adam step
                            (``fused_adam``: apex's ``FusedAdam``, 28 B per parameter; off:
                            PyTorch's ``AdamW`` with ``foreach``, eight passes, 80 B;
                            ``optimizer_dtype=bf16``: the gradient in its buffer's type (no fp32
                            copy), bf16 weight and moments read and the three written, 16 B from
                            an fp32 buffer, 14 from bf16, no master copy), the fp32
                            master copied to the 16-bit weight (``_copy_main_params_to_model_params``)
                            and the gradient buffer zeroed for the next iteration
                            (``zero_grad_buffer``)
==========================  ====================================================================

The small all-reduces of the optimizer step (the inf/NaN flag with fp16, the norm) over the
model-parallel group, the tied embedding's gradient between the first and last stage, the norm
and bias gradients of sequence parallelism over the tensor-parallel group, the data-parallel
reduction in the gradient buffer's type and the pipeline's scatter/gather are collectives, which
the lowering adds (:mod:`.lower`, with these sources).

Units: bytes, seconds (through the cost model). Pure.
"""

from __future__ import annotations

from collections.abc import Callable
from marssim.workload import Graph, Op, OpKind
from marssim.workload.op import DTYPE_BYTES

__all__ = ["ROLES", "roles", "op_kernels", "optimizer_kernels", "grad_dtype", "grad_scaled", "softmax_fused",
           "sequence_parallel_params", "kernels_key"]

ROLES = ("linear_bias", "bias_grad", "gelu_bias", "bda", "bda_add", "add_bias", "softmax", "softmax_grad",
         "layer_norm")

PERSIST_LN_HIDDEN_SIZES = (1024, 1536, 2048, 2304, 3072, 3840, 4096, 5120, 6144, 8192, 10240, 12288, 12800, 15360,
                           16384, 18432, 20480, 24576, 25600, 30720, 32768, 40960, 49152, 65536)
"""The hidden sizes apex's persistent LayerNorm kernel supports (Megatron-LM's
``model/fused_layer_norm.py``, ``persist_ln_hidden_sizes``)."""
"""What an op of the graph is to Megatron-LM's kernels (see :func:`roles`)."""


def roles(graph: Graph) -> dict[str, tuple[str, ...]]:
    """The Megatron-LM roles of the graph's ops (an op may have several):

    * ``linear_bias``: a forward (or recomputed) linear with a bias that no fused kernel after it
      takes, so it adds the bias itself;
    * ``gelu_bias``: a GeLU whose input is a linear with a bias (bias-GeLU);
    * ``bda``: a dropout between a linear and a residual add (bias-dropout-add); ``bda_add``: that
      add; ``add_bias``: a residual add right after a linear with a bias (no dropout: the fused
      kernel is the add);
    * ``bias_grad``: the backward op whose output is the gradient a biased linear's bias is
      reduced from (the linear's weight-gradient GEMM when it adds its own bias; the GeLU's or
      the dropout's gradient where the bias went into a fused kernel);
    * ``softmax``, ``softmax_grad``: the attention's softmax and its gradient;
    * ``layer_norm``: a LayerNorm or its gradient.
    """
    ops = {op.name: op for op in graph.ops}
    consumers: dict[str, list[Op]] = {}
    for op in graph.ops:
        for src in op.inputs:
            consumers.setdefault(src, []).append(op)
    out: dict[str, list[str]] = {}

    def add(name: str, role: str) -> None:
        out.setdefault(name, []).append(role)

    def fn(op: Op) -> str:
        return op.param("fn") or ""

    for op in graph.ops:
        phase = op.param("phase", "fwd")
        if op.kind == OpKind.SOFTMAX and fn(op) != "cross_entropy" and phase in ("fwd", "recompute"):
            add(op.name, "softmax")
        if op.kind == OpKind.ELTWISE and fn(op) == "softmax_grad":
            add(op.name, "softmax_grad")
        if op.kind == OpKind.NORM and op.param("norm") in ("layer", "layer_grad"):
            add(op.name, "layer_norm")
        if op.kind != OpKind.GEMM or phase not in ("fwd", "recompute") or not op.param("bias") \
                or op.param("grad") or op.param("grouped"):
            continue
        after = [c for c in consumers.get(op.name, []) if c.param("phase", "fwd") == phase]  # not its backward
        nxt = after[0] if len(after) == 1 else None
        base = op.name[:-len(".recompute")] if phase == "recompute" else op.name
        if nxt is not None and nxt.kind == OpKind.ELTWISE and fn(nxt) == "gelu":
            add(nxt.name, "gelu_bias")
            if phase == "fwd":
                _grad_of(ops, nxt.name + ".grad", add)
        elif nxt is not None and nxt.kind == OpKind.ELTWISE and fn(nxt) == "dropout" \
                and len(then := [c for c in consumers.get(nxt.name, []) if c.param("phase", "fwd") == phase]) == 1 \
                and fn(then[0]) == "add":
            add(nxt.name, "bda")
            add(then[0].name, "bda_add")
            if phase == "fwd":
                _grad_of(ops, nxt.name + ".grad", add)
        elif nxt is not None and nxt.kind == OpKind.ELTWISE and fn(nxt) == "add":
            add(nxt.name, "add_bias")
            if phase == "fwd":
                _grad_of(ops, base + ".wgrad", add)
        else:
            add(op.name, "linear_bias")
            if phase == "fwd":
                _grad_of(ops, base + ".wgrad", add)
    return {k: tuple(v) for k, v in out.items()}


def _grad_of(ops: dict[str, Op], name: str, add: Callable[[str, str], None]) -> None:
    if name in ops:
        add(name, "bias_grad")


def softmax_fused(op: Op, cfg) -> bool:
    """Whether Megatron-LM's fused scaled-masked-softmax kernel runs for this softmax (or its
    gradient): ``masked_softmax_fusion`` and ``FusedScaleMaskSoftmax.is_kernel_available``'s
    conditions on the full scores (16-bit, ``16 < keys <= 4096``, queries and heads x batch
    multiples of 4)."""
    if not cfg.masked_softmax_fusion or op.dtype not in ("fp16", "bf16"):
        return False
    if op.kind == OpKind.SOFTMAX:
        b, heads, sq, sk = (op.dim(d) for d in "NAHL")
    else:  # the gradient, (n, heads * keys, queries, 1) with the heads in its tag
        b, sq = op.dim("N"), op.dim("H")
        sk = sq
        heads = max(1, op.dim("C") // max(1, sk))
    return 16 < sk <= 4096 and sq % 4 == 0 and (b * heads) % 4 == 0


def _elt(name: str, shape: tuple[int, int, int, int], fn: str, dtype: str, *, inputs: int = 1,
         in_dtypes: tuple[str, ...] | None = None, out: tuple[int, int, int, int] | None = None, extra: float = 0,
         weights: int = 0) -> Op:
    """An element-wise kernel over ``shape`` (n, c, h, w) for the cost model: ``inputs`` operands of
    that shape, the output ``out`` (default: the shape) in ``dtype``, ``extra`` bytes per output
    element beyond them, ``weights`` elements of a learned operand."""
    n, c, h, w = shape
    params = {"fn": fn}
    if in_dtypes is not None:
        params["in_dtypes"] = in_dtypes
    if extra:
        params["extra_per_elem"] = extra
    return Op(name, OpKind.ELTWISE, (("N", n), ("C", c), ("H", h), ("W", w)),
              tuple(f"{name}.in{i}" for i in range(inputs)), tuple(shape for _ in range(inputs)), out or shape,
              tuple(sorted(params.items())), weights, dtype)


def _shape(part: Op) -> tuple[int, int, int, int]:
    """The output of a shard as (n, c, h, w)."""
    return tuple(part.out_shape)  # type: ignore[return-value]


def op_kernels(op: Op, part: Op, op_roles: tuple[str, ...], cfg) -> tuple[Op, ...] | None:
    """The kernels the task of ``op`` runs in Megatron-LM, ``part`` being its shard on one rank
    (see the module docstring): None where it is the op's own kernel alone; otherwise the ops to
    time in order (``part`` itself among them where it runs)."""
    if not op_roles:
        return None
    shape = _shape(part)
    dt = part.dtype
    before: list[Op] = []
    fused: list[Op] = []
    after: list[Op] = []
    own = True
    for role in op_roles:
        if role == "linear_bias":  # output + bias, after the GEMM
            after.append(_elt(op.name + ".bias_add", shape, "bias_add", dt, weights=shape[1]))
        elif role == "gelu_bias" and not cfg.bias_gelu_fusion:  # F.gelu(x + bias)
            before.append(_elt(op.name + ".bias_add", shape, "bias_add", dt, weights=shape[1]))
        elif role == "bda":
            if cfg.bias_dropout_fusion:  # one kernel: x + bias, dropout, + residual; writes the 1-byte mask
                fused.append(_elt(op.name + ".bias_dropout_add", shape, "bias_dropout_add", dt, inputs=2, extra=1,
                                  weights=shape[1]))
                own = False
            else:
                before.append(_elt(op.name + ".bias_add", shape, "bias_add", dt, weights=shape[1]))
        elif role == "bda_add" and cfg.bias_dropout_fusion:
            own = False  # the fused kernel of its dropout did it
        elif role == "add_bias" and not cfg.bias_dropout_fusion:
            before.append(_elt(op.name + ".bias_add", shape, "bias_add", dt, weights=shape[1]))
        elif role == "bias_grad":
            after.append(_bias_grad(op, part))
        elif role in ("softmax", "softmax_grad") and not softmax_fused(op, cfg):
            after.extend(_torch_softmax(op, part))
        elif role == "layer_norm" and cfg.persist_layer_norm and op.dim("C") in PERSIST_LN_HIDDEN_SIZES:
            # one pass: the input (and the gradient) read, the output written, the scale and shift
            fused.append(_elt(op.name + ".fast_layer_norm", shape, "layer_norm", dt, inputs=len(part.in_shapes),
                              weights=part.weight_elems))
            own = False
    return tuple(before + ([part] if own else []) + fused + after)


def _bias_grad(op: Op, part: Op) -> Op:
    """The reduction of a bias gradient over the tokens: it reads the output gradient the op
    produces (a weight-gradient GEMM: the gradient ``dY`` it reads, tokens x out features)."""
    if op.kind == OpKind.GEMM:
        b, m, n = part.dim("B"), part.dim("M"), part.dim("N")
        shape = (b, n, m, 1)
        dt = part.dtype if not part.param("in_dtypes") else part.param("in_dtypes")[-1]
    else:
        shape = _shape(part)
        dt = part.dtype
    return _elt(op.name + ".bias_grad", shape, "sum", dt, out=(1, shape[1], 1, 1))


def _torch_softmax(op: Op, part: Op) -> list[Op]:
    """``forward_torch_softmax``'s kernels beyond the softmax: the scores cast to fp32, scaled,
    masked and the probabilities cast back; in backward their gradients, as many."""
    if part.kind == OpKind.SOFTMAX:
        n, a, h, l_ = (part.dim(d) for d in "NAHL")
        shape = (n, a * l_, h, 1)
    else:
        shape = _shape(part)
    dt = part.dtype
    name = op.name
    return [_elt(name + ".to_fp32", shape, "cast", "fp32", in_dtypes=(dt,)),
            _elt(name + ".scale", shape, "mul", "fp32"),
            _elt(name + ".mask", shape, "masked_fill", "fp32"),
            _elt(name + ".to_16bit", shape, "cast", dt, in_dtypes=("fp32",))]


OPTIMIZER_STATE_BYTES = {"fp32": 12.0, "bf16": 4.0}
"""Bytes of optimizer state per parameter by ``optimizer_dtype``: fp32 master weights and Adam's
two moments (Megatron-LM), or two bf16 moments beside the bf16 weights (Apex's
DistributedFusedAdam with ``dtype`` bf16: the master is the weight itself)."""


def grad_dtype(cfg, t) -> str:
    """The type of the gradient buffer and of its data-parallel reduction: ``grad_reduce_dtype``,
    or with ``auto`` Megatron-LM's: fp32 when training in bf16 (``arguments.py``: bf16 sets
    ``accumulate_allreduce_grads_in_fp32``), the model's type otherwise (fp16: the buffer is in
    ``params_dtype``, ``model/distributed.py``)."""
    if cfg.grad_reduce_dtype != "auto":
        return cfg.grad_reduce_dtype
    return t.dtype if t.dtype in ("fp16", "fp32") else "fp32"


def grad_scaled(t) -> bool:
    """Whether the run has a loss scaler (fp16; ``optimizer/__init__.py``: bf16 has none), whose
    unscale-and-check kernel and inf/NaN all-reduce the optimizer step runs."""
    return t.dtype == "fp16"


def optimizer_kernels(name: str, params: int, t, cfg) -> tuple[tuple[Op, ...], tuple[Op, ...]]:
    """The kernels of the optimizer step over ``params`` parameters of one rank (see the module
    docstring), split at the global norm's all-reduce: ``(before, after)``. ``t``: the
    :class:`~marssim.workload.llm.TransformerConfig`."""
    if params <= 0:
        return (), ()
    shape = (1, params, 1, 1)
    g = grad_dtype(cfg, t)
    before: list[Op] = []
    after: list[Op] = []
    bf16_state = cfg.optimizer_dtype == "bf16"  # Apex's DistributedFusedAdam reads the buffer's type
    work = g if bf16_state else "fp32"  # what the norm, the clipping and the Adam step read
    if g != "fp32" and not bf16_state:
        before.append(_elt(name + ".grad_to_fp32", shape, "cast", "fp32", in_dtypes=(g,)))
    if grad_scaled(t):
        before.append(_elt(name + ".unscale", shape, "mul", work))
    if cfg.clip_grad > 0:
        before.append(_elt(name + ".grad_norm", shape, "sum", "fp32", in_dtypes=(work,), out=(1, 1, 1, 1)))
        if cfg.grads_clipped:
            after.append(_elt(name + ".clip", shape, "mul", work))
    if bf16_state:  # the gradient, bf16 weight and moments read; the three written back
        after.append(_elt(name + ".fused_adam", shape, "adam", "bf16", in_dtypes=(work,), extra=4,
                          weights=3 * params))
    elif cfg.fused_adam:  # reads the gradient, master weight and moments; writes the three back
        after.append(_elt(name + ".fused_adam", shape, "adam", "fp32", extra=8, weights=3 * params))
    else:  # torch.optim.AdamW, foreach: eight passes, 48 B read and 32 B written per parameter
        after.append(_elt(name + ".adamw_foreach", shape, "adam", "fp32", extra=72))
    model = t.dtype if t.dtype in DTYPE_BYTES and t.dtype not in ("fp8", "fp4") else "bf16"
    if model != "fp32" and not bf16_state:  # a bf16 state updates the weights in place
        after.append(_elt(name + ".to_model", shape, "cast", model, in_dtypes=("fp32",)))
    after.append(_elt(name + ".zero_grad", shape, "fill", g, inputs=0))
    return tuple(before), tuple(after)


def sequence_parallel_params(t) -> int:
    """Parameters per block whose gradients sequence parallelism all-reduces over the
    tensor-parallel group (``allreduce_layernorm_grads``: the parameters marked
    ``sequence_parallel``: both norms' scale and shift, the row-parallel linears' biases)."""
    norm = (2 if t.norm == "layer" else 1) * t.hidden
    return 2 * norm + (2 * t.hidden if t.bias else 0)


def kernels_key(cfg) -> tuple:
    """The settings of ``cfg`` the kernels of an op depend on (for memoised timings)."""
    return (cfg.bias_gelu_fusion, cfg.bias_dropout_fusion, cfg.masked_softmax_fusion, cfg.persist_layer_norm)
