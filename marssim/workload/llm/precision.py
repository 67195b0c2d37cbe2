"""Low-precision GEMMs as Transformer Engine runs them, and the bytes each precision holds.

``dtype=fp8`` is Transformer Engine's FP8 recipe (``DelayedScaling``, format ``HYBRID``, as
Megatron-LM's ``--fp8-format hybrid`` runs it): activations, weights as stored, norms, element-wise
ops, attention and the optimizer stay in bf16 (``dtype`` becomes ``bf16``); only the GEMMs of the
transformer blocks read FP8 inputs (``gemm_dtype=fp8``: ``attn.qkv``, ``attn.proj``, the MLP's
and the experts' GEMMs -- not the MoE router, the output layer or the embedding, which
Megatron-LM runs outside Transformer Engine), at the design's FP8 tensor-core peak, writing bf16.
What ``transformer_engine/pytorch/module/linear.py`` runs per GEMM:

=========================  ===========================================================================
forward                    ``<x>.fp8``: the input cast to E4M3 (one kernel per tensor however many
                           GEMMs read it: the experts' ``gate`` and ``up`` read one), its amax taken in the
                           same pass (delayed scaling: the scale is the history's), writing the FP8
                           tensor and, in training, its transpose (the wgrad GEMM's operand, the copy
                           kept for backward: 1 B per element instead of the bf16 input's 2 B); the
                           GEMM reads it and the weights' FP8 copy
backward                   ``<gemm>.grad_fp8``: the output gradient cast to E5M2 (and its transpose);
                           ``dgrad`` reads it and the weights' FP8 transpose, ``wgrad`` reads it and
                           the kept FP8 input; both write bf16
once per step              ``<group>.fp8_weights`` after each group's AdamW step: the weights cast to
                           FP8 and transposed (Transformer Engine casts them in the first
                           micro-batch; the cost is the same once per step); ``fp8.amax_fwd`` and
                           ``fp8.amax_bwd``: the fused amax-and-scale update of the forward's and the
                           backward's amax histories (``fused_amax_and_scale_update_after_reduction``,
                           :data:`AMAX_HISTORY` entries per tensor, 3 tensors per GEMM forward and 2
                           backward)
=========================  ===========================================================================

``fp8_recipe=current`` is Transformer Engine's ``Float8CurrentScaling`` ("FP8-CS", the recipe of
NeMo's and Megatron-Bridge's recent FP8 runs, Megatron-LM's ``--fp8-recipe tensorwise``): the
same casts, formats and GEMMs, but each cast takes its tensor's own amax first, in a kernel of its
own that reads the tensor once more (``<x>.amax`` before ``<x>.fp8``, ``<gemm>.grad_amax`` before
``<gemm>.grad_fp8``: read 2 B per element, write one fp32 amax that the cast reads; a reduction
whose loops are its input's, so a tensor-parallel rank reads its own share, and a serving
iteration its own tokens), the weights'
cast after each AdamW step reads the weights once more for theirs (``extra_per_elem`` grows by
the source's bytes; its param ``amax``), and there is no amax history: no ``fp8.amax_fwd`` or
``fp8.amax_bwd``. ``fp8_recipe=delayed`` (the default of ``dtype=fp8``) is the recipe above, graph
for graph. The option is refused without FP8, and in serving modes (static scales).

``fp8_recipe=blockwise`` is Transformer Engine's ``Float8BlockScaling`` (Megatron-LM's
``--fp8-recipe blockwise``, DeepSeek-V3's granularity): E4M3 with an fp32 scale per 1 x 128
elements of activations and gradients and per 128 x 128 of weights (element type ``fp8_block``,
1.03125 B per element); ``fp8_recipe=mxfp8`` is ``MXFP8BlockScaling`` ("FP8-MX", Megatron-LM's
``--fp8-recipe mxfp8``, Blackwell): E4M3 with an E8M0 scale per 32 elements (element type
``mxfp8``, 1.03125 B). Both: the same casts and GEMMs as above, each cast taking its blocks'
amaxes in its own pass (no amax kernel, no history) and writing, in training, the copy scaled
along the other axis beside the first (as delayed scaling writes the transpose); the GEMMs read
that element type. The GEMMs are timed by the measured rows of their type: AIConfigurator's
``fp8_block`` GEMMs (TensorRT-LLM's blockwise FP8 kernels); no table measures MXFP8 GEMMs, so the
per-tensor FP8 kernels of a shape stand in for them (:data:`marssim.cost.calibrated.DTYPE_STANDINS`:
Blackwell applies the block scales inside its MMA at the FP8 rate). A GPU below Blackwell has no
MXFP8 (:data:`marssim.cost.gpu.BLOCK_SCALED_FP8`).

``dtype=fp4`` is NVFP4 (``NVFP4BlockScaling``; Blackwell): the same GEMMs with 4-bit inputs
(0.5625 B per element with their block scales), each cast preceded by its ``<x>.amax`` kernel
(current scaling: the amax of the tensor itself, one more read of it) and no amax history. The
random Hadamard transform Transformer Engine applies to the weight-gradient operands is not
counted.

Serving modes (``prefill``, ``decode``, ``serve``) take the FP8 (or FP4) weights as they are
stored (TensorRT-LLM's quantized checkpoints: one copy, no bf16 weights) and cast each GEMM's
input (no transpose, static scales: no amax update). ``kv_dtype=fp8`` keeps the KV cache in
FP8: the keys and values are cast as they are written, and attention reads them at 1 B per
element (computing in bf16).

The amax reduction across the data- and tensor-parallel group (an all-reduce of a few bytes per
tensor) is left out: its bytes are negligible and its latency is not a kernel of the graph (under
current scaling with sequence parallelism Transformer Engine reduces a cast's amax over the
tensor-parallel group before the cast: a latency this model does not charge either).

Memory per parameter (:func:`held_weight_bytes`; gradients and optimizer state do not depend on
the GEMMs' precision: 4 B of fp32 main gradient and 12 B of fp32 master weight and Adam moments):

=================================  ======================================================================
training, GEMM weights             2 B bf16 weight + 2 B of FP8 copies (rowwise and transposed, Hopper's
                                   FP8 GEMMs reading both layouts); with ``fp8_param_gather`` the FP8
                                   weight is the parameter (Megatron-LM's ``--fp8-param-gather``): 1 B
                                   + 1 B transpose, no bf16 copy, and the distributed optimizer gathers
                                   FP8 bytes; NVFP4: 2 B + 2 x 0.5625 B, with ``fp4_param_gather``
                                   2 x 0.5625 B, the gather moving NVFP4 bytes
serving, GEMM weights              the quantized weight only (1 B FP8, 0.5625 B NVFP4)
every other parameter              the activation type (2 B bf16)
=================================  ======================================================================
"""

from __future__ import annotations

from marssim.workload.op import DTYPE_BYTES, Op

__all__ = ["LOW_PRECISION", "LOW_PRECISION_GEMMS", "AMAX_HISTORY", "FP8_TENSORS_FWD", "FP8_TENSORS_BWD",
           "low_precision_gemm", "held_weight_bytes", "param_gather_bytes"]

LOW_PRECISION = ("fp8", "fp4", "fp8_block", "mxfp8")
"""GEMM input types of Transformer Engine's recipes (``fp8``: E4M3/E5M2 with a scale per tensor;
``fp4``: NVFP4; ``fp8_block``, ``mxfp8``: FP8 with block scales)."""

LOW_PRECISION_GEMMS = ("attn.qkv", "attn.proj", "mlp.fc1", "mlp.fc2", "mlp.down", "moe.gate", "moe.up", "moe.fc1",
                       "moe.down", "shared.fc1", "shared.fc2", "shared.down")
"""The GEMMs of a block (name suffixes) that Megatron-LM runs through Transformer Engine's linear
layers, in FP8 under its recipe; the MoE router and the output layer are plain PyTorch GEMMs."""

AMAX_HISTORY = 1024
"""Entries of each FP8 tensor's amax history (``DelayedScaling.amax_history_len``'s default)."""
FP8_TENSORS_FWD = 3
"""FP8 tensors per GEMM whose amax the forward updates (input, weight, output)."""
FP8_TENSORS_BWD = 2
"""FP8 tensors per GEMM whose amax the backward updates (output gradient, input gradient)."""


def low_precision_gemm(name: str) -> bool:
    """True for a block GEMM (by name, ``layers.3.mlp.fc1``) that a low-precision recipe casts."""
    return any(name.endswith("." + suffix) for suffix in LOW_PRECISION_GEMMS)


def held_weight_bytes(op: Op, cfg) -> float:
    """Bytes the model holds per parameter of ``op`` (a forward op owning weights) under the
    precision of ``cfg`` (a :class:`~marssim.workload.llm.config.TransformerConfig`); see the
    module docstring."""
    base = DTYPE_BYTES[cfg.dtype]
    low = op.param("w_dtype")
    if low not in LOW_PRECISION:
        return float(base)
    q = DTYPE_BYTES[low]
    if not cfg.training:
        return float(q)
    if cfg.fp8_param_gather:
        return 2.0 * q
    return float(base) + 2.0 * q


def param_gather_bytes(cfg) -> float:
    """Bytes per parameter that the distributed optimizer's all-gather of updated weights moves:
    the FP8 weights' bytes (with their block scales under a block recipe) with
    ``fp8_param_gather``, else the activation type's."""
    return float(DTYPE_BYTES[cfg.low_dtype]) if cfg.fp8_param_gather else float(DTYPE_BYTES[cfg.dtype])
