"""Decoder-transformer configurations: every dimension a parameter, published models as presets.

A :class:`TransformerConfig` holds the architecture (``family`` ``gpt``, ``llama`` or ``moe``),
the run (batch, tokens, data type) and the mode (``forward``, ``train``, ``prefill``,
``decode``, ``serve``). Spec strings set any field by name (``gpt3-175b:mode=train,batch=1``);
:func:`check_config` reports the first inconsistent field by its name.

Presets and their sources:

* GPT-3 (Brown et al. 2020, "Language Models are Few-Shot Learners", Table 2.1): 125M ... 175B;
  context 2,048, the GPT-2 byte-level BPE vocabulary of 50,257 tokens, learned positions,
  pre-LayerNorm blocks with a GeLU MLP of 4 x hidden, biases, dropout 0.1 (GPT-2's), the output
  projection tied to the token embedding. Table 2.1 gives GPT-3 13B ``d_model`` 5,140 with 40
  heads of 128; 40 x 128 = 5,120, which is what the released 13B-class models (and
  Megatron's GPT-3 13B configuration) use: the preset takes 5,120. Likewise GPT-3 XL is listed
  with 24 heads of 128 for ``d_model`` 2,048; the preset takes 16 heads of 128 (the parameter
  count does not depend on the number of heads).
* Llama 3 (Meta, "The Llama 3 Herd of Models", 2024, Table 3; the released ``config.json``
  files): vocabulary 128,256, RMSNorm, SwiGLU MLP, rotary positions, grouped-query attention
  with 8 key/value heads, no biases, untied output projection, no dropout. 8B: 32 layers,
  hidden 4,096, 32 heads, FFN 14,336; 70B: 80 layers, 8,192, 64 heads, 28,672; 405B: 126
  layers, 16,384, 128 heads, 53,248.
* Mixtral (Jiang et al. 2024, "Mixtral of Experts"; the released ``config.json`` files):
  Llama-style attention with 8 key/value heads, 8 SwiGLU experts per layer, top-2 routing,
  vocabulary 32,000 (8x7B) / 32,768 (8x22B). 8x7B: 32 layers, hidden 4,096, 32 heads, FFN
  14,336; 8x22B: 56 layers, 6,144, 48 heads, 16,384.
* Fine-grained experts with shared experts (the released ``config.json`` files):
  DeepSeekMoE 16B (Dai et al. 2024, "DeepSeekMoE"): 28 layers, hidden 2,048, 16 heads (multi-head
  attention), vocabulary 102,400, 64 routed experts of width 1,408 (``moe_intermediate_size``),
  top-6, 2 shared experts of the same width, the first block dense with an MLP of 10,944
  (``first_k_dense_replace`` 1): 16.4B parameters, 2.8B active. Qwen1.5-MoE-A2.7B
  (``model_type`` ``qwen2_moe``): 24 layers, hidden 2,048, 16 heads, vocabulary 151,936, 60
  routed experts of 1,408, top-4, a shared expert of 5,632 scaled by a sigmoid gate: 14.3B,
  2.7B active (the query/key/value biases, 0.001 %, left out). Qwen3-30B-A3B (``qwen3_moe``): 48
  layers, hidden 2,048, 32 heads of 128 with 4 key/value heads, 128 routed experts of 768, top-8,
  no shared expert: 30.5B, 3.3B active (the per-head query/key RMSNorms, 256 parameters a block,
  left out). Qwen3-235B-A22B: 94 such layers of hidden 4,096, 64 heads of 128 with 4 key/value
  heads, 128 experts of 1,536, top-8: 235.1B, 22.2B active.

A mixture of experts' MLP: ``experts`` routed SwiGLU experts of width ``expert_ffn`` (0:
``ffn``), ``top_k`` of them per token; ``shared_experts`` more that every token runs, each of
width ``shared_ffn`` (0: ``expert_ffn``), fused into one dense MLP (as DeepSeek's and Qwen's code
run them), their output scaled by a sigmoid of a learned score with ``shared_gate`` (Qwen-MoE);
the first ``dense_layers`` blocks have a dense MLP of width ``ffn`` instead (DeepSeek's
``first_k_dense_replace``).

Sizes are exact integers; ``dropout`` and ``capacity_factor`` are real numbers; ``expert_load``
(a mixture of experts' routing: the tokens each expert receives, relative, measured or assumed,
``3/1/1/1/1/1/1/1``; uniform when left out) is one number per expert. The graph holds the
uniform capacity (the FLOPs of a step do not depend on the routing when no token is dropped);
a parallel configuration times every expert-parallel rank at the busiest rank's share.

Precision: ``dtype`` is the type of activations, weights as stored, and every kernel but the
low-precision GEMMs; ``dtype=fp8`` (or ``fp4``) is Transformer Engine's recipe, short for
``dtype=bf16,gemm_dtype=fp8``: the blocks' GEMMs read FP8 (NVFP4) inputs, everything else stays
bf16 (:mod:`.precision`); ``fp8_recipe`` picks its scaling, ``delayed`` (the default),
``current``, ``blockwise`` or ``mxfp8`` (:data:`FP8_RECIPES`; refused without FP8).
``fp8_param_gather`` keeps those GEMMs' weights in FP8 as parameters (training), ``fp4_param_gather``
in NVFP4 (Megatron-Bridge's name for the same setting under ``dtype=fp4``); ``first_layers_bf16`` and
``last_layers_bf16`` keep that many blocks at the start and at the end out of the recipe, their GEMMs
in ``dtype`` (Megatron-LM's ``--first-last-layers-bf16`` with ``--num-layers-at-start-in-bf16`` and
``--num-layers-at-end-in-bf16``: training recipes keep the last layers of an NVFP4 run in bf16;
training only); ``kv_dtype=fp8`` stores a serving run's KV cache in FP8.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any

from marssim.errors import InputError
from marssim.workload.op import DTYPE_BYTES

__all__ = ["TransformerConfig", "PRESETS", "FAMILY_DEFAULTS", "MODES", "RECOMPUTE", "ATTENTION", "FP8_RECIPES",
           "FP8_ELEMENT_TYPES", "CROSS_ENTROPY", "cross_entropy_bytes", "cross_entropy_op", "check_config",
           "config_from"]

MODES = ("forward", "train", "prefill", "decode", "serve")
"""``forward``: one forward pass over ``seq`` tokens (logits for every token); ``train``: one
training step of one (micro-)batch (forward, loss, backward, optimizer); ``prefill``: a prompt of
``seq`` tokens written to the KV cache, logits of the last token; ``decode``: one token per
sequence attending over a KV cache of ``context`` tokens; ``serve``: a prefill of ``prompt``
tokens and ``generate`` decode steps."""

ATTENTION = ("unfused", "flash", "efficient", "cudnn")
"""How the attention core runs: ``unfused`` as separate ops (``Q K^T``, softmax, dropout, ``P V``:
the setting of Korthikanti et al. 2022), or one fused kernel per block in forward and one in
backward (the scores never leave the chip; dropout inside the kernel, no mask kept), timed as
PyTorch's scaled-dot-product attention with the ``flash`` (FlashAttention-2, Dao 2023),
memory-``efficient`` (xFormers; Rabe and Staats 2021) or ``cudnn`` (cuDNN's fused attention)
backend."""

CROSS_ENTROPY = ("unfused", "fused")
"""How a training step's loss runs over its vocabulary shard: ``unfused`` as Megatron-LM's
``vocab_parallel_cross_entropy`` (its default: ``cross_entropy_loss_fusion`` off; NeMo 1.0 and
Megatron-LM's own scripts), several PyTorch kernels over fp32 logits (:func:`cross_entropy_bytes`);
``fused`` as one kernel each way that reads the logits and writes the probabilities or the
gradient in the logits' type (``cross_entropy_loss_fusion`` with Transformer Engine's
implementation, Megatron-Bridge's recipes)."""

FP8_RECIPES = ("delayed", "current", "blockwise", "mxfp8")
"""How an FP8 run scales its casts (Transformer Engine's recipes, :mod:`.precision`): ``delayed``
(``DelayedScaling``: each scale from an amax history updated once per forward and backward),
``current`` (``Float8CurrentScaling``, "FP8-CS": each cast takes its tensor's own amax first, no
history), ``blockwise`` (``Float8BlockScaling``: an fp32 scale per 1 x 128 elements of activations
and gradients and per 128 x 128 of weights, DeepSeek-V3's; element type ``fp8_block``) or
``mxfp8`` (``MXFP8BlockScaling``, "FP8-MX", Blackwell: an E8M0 scale per 32 elements; element
type ``mxfp8``); the two block recipes take each block's amax inside the cast, no history."""

FP8_ELEMENT_TYPES = {"blockwise": "fp8_block", "mxfp8": "mxfp8"}
"""The element type (:data:`marssim.workload.op.DTYPE_BYTES`) the casts and GEMMs of a block
recipe read; ``delayed`` and ``current`` read ``fp8``."""

RECOMPUTE = ("none", "selective", "full")
"""Activation recomputation (Korthikanti et al. 2022): ``selective`` re-runs the attention core
(Q K^T, softmax, dropout, P V) in backward instead of keeping its activations; ``full`` keeps
each block's input only and re-runs the whole block in backward."""


@dataclass(frozen=True)
class TransformerConfig:
    """One decoder transformer and the run it takes part in. Units: counts of tokens,
    features, heads; bytes follow from ``dtype``."""

    family: str  # gpt | llama | moe
    layers: int
    hidden: int
    heads: int
    vocab: int
    ffn: int = 0  # MLP width (0: 4 x hidden)
    kv_heads: int = 0  # key/value heads (0: heads, i.e. multi-head attention)
    head_dim: int = 0  # 0: hidden / heads
    seq: int = 2048
    batch: int = 1
    max_positions: int = 2048  # learned position table (gpt)
    dtype: str = "bf16"  # activations and weights as stored; fp8/fp4: bf16 with gemm_dtype fp8/fp4
    gemm_dtype: str = ""  # "" (dtype), fp8 or fp4: the input type of the blocks' GEMMs (Transformer Engine)
    fp8_param_gather: bool = False  # the FP8 GEMMs' weights are FP8 parameters, gathered in FP8 (training)
    fp4_param_gather: bool = False  # dtype=fp4: the NVFP4 GEMMs' weights as NVFP4 parameters (sets fp8_param_gather)
    first_layers_bf16: int = 0  # fp8/fp4 training: the first blocks whose GEMMs stay in dtype (layers at start)
    last_layers_bf16: int = 0  # fp8/fp4 training: the last blocks whose GEMMs stay in dtype (layers at end)
    fp8_recipe: str = ""  # "" (delayed, an FP8 run's default), delayed or current: FP8 scaling (FP8_RECIPES)
    kv_dtype: str = ""  # "" (dtype) or fp8: the KV cache of prefill, decode and serve
    mode: str = "forward"
    recompute: str = "none"
    attention: str = "unfused"  # unfused | flash | efficient | cudnn (ATTENTION)
    cross_entropy: str = "unfused"  # unfused | fused: the training loss's kernels (CROSS_ENTROPY)
    dropout: float = 0.0
    bias: bool = False
    tie_embeddings: bool = False
    norm: str = "layer"  # layer | rms
    activation: str = "gelu"  # gelu | swiglu
    positions: str = "learned"  # learned | rotary
    experts: int = 0  # moe
    top_k: int = 0
    capacity_factor: float = 1.0
    expert_load: tuple[float, ...] = ()  # moe: tokens routed to each expert, relative (): uniform
    expert_ffn: int = 0  # moe: width of each routed expert's MLP (0: ffn)
    shared_experts: int = 0  # moe: experts every token runs (DeepSeekMoE, Qwen-MoE), fused into one MLP
    shared_ffn: int = 0  # moe: width of each shared expert (0: expert_ffn)
    shared_gate: bool = False  # moe: the shared experts' output scaled by sigmoid(a learned linear score) (Qwen-MoE)
    dense_layers: int = 0  # moe: the first blocks with a dense MLP of width ffn instead of experts (DeepSeek)
    context: int = 0  # decode: tokens in the KV cache
    prompt: int = 0  # serve
    generate: int = 0  # serve
    name: str = ""
    extras: dict = field(default_factory=dict, compare=False)

    def __post_init__(self) -> None:
        # dtype=fp8 / fp4: Transformer Engine's recipe, bf16 with the blocks' GEMMs in that type
        if self.dtype in ("fp8", "fp4"):
            object.__setattr__(self, "gemm_dtype", self.gemm_dtype or self.dtype)
            object.__setattr__(self, "dtype", "bf16")
        if self.fp4_param_gather:  # one setting: the low-precision weights are the parameters
            object.__setattr__(self, "fp8_param_gather", True)

    # ------------------------------------------------------------------ derived
    @property
    def cache_dtype(self) -> str:
        """Element type of the KV cache (``kv_dtype``, else ``dtype``)."""
        return self.kv_dtype or self.dtype

    @property
    def ffn_size(self) -> int:
        return self.ffn or 4 * self.hidden

    @property
    def kv(self) -> int:
        """Key/value heads."""
        return self.kv_heads or self.heads

    @property
    def d_head(self) -> int:
        return self.head_dim or self.hidden // self.heads

    @property
    def kv_group(self) -> int:
        """Query heads per key/value head."""
        return self.heads // self.kv

    @property
    def is_moe(self) -> bool:
        return self.experts > 0

    @property
    def expert_ffn_size(self) -> int:
        """Width of each routed expert's MLP (``expert_ffn``, else ``ffn``)."""
        return self.expert_ffn or self.ffn_size

    @property
    def shared_width(self) -> int:
        """Width of the fused MLP of the shared experts: ``shared_experts x (shared_ffn or
        expert_ffn)`` (0: none)."""
        return self.shared_experts * (self.shared_ffn or self.expert_ffn_size)

    def is_moe_layer(self, layer: int) -> bool:
        """Whether block ``layer`` holds experts (a mixture-of-experts model past its
        ``dense_layers`` first blocks)."""
        return self.is_moe and layer >= self.dense_layers

    @property
    def dense_ffn_used(self) -> bool:
        """Whether some block runs the dense MLP of ``ffn``: a dense model, a mixture of experts'
        dense first blocks, or experts of width ``ffn`` (no ``expert_ffn``)."""
        return not self.is_moe or self.dense_layers > 0 or not self.expert_ffn

    def experts_text(self) -> str:
        """The experts in words: ``64 experts of 1408 top-6, 2 shared, first 1 block dense`` (``""``
        for a dense model)."""
        if not self.is_moe:
            return ""
        text = f"{self.experts} experts" + (f" of {self.expert_ffn}" if self.expert_ffn else "") + f" top-{self.top_k}"
        if self.shared_experts:
            text += f", {self.shared_experts} shared of {self.shared_ffn or self.expert_ffn_size}"
            text += " (sigmoid-gated)" if self.shared_gate else ""
        if self.dense_layers:
            text += f", first {self.dense_layers} block{'s' if self.dense_layers > 1 else ''} dense"
        return text

    @property
    def split_widths(self) -> tuple[int, ...]:
        """The MLP widths a tensor-parallel group splits: the dense MLP's (of a dense model, or of
        the dense first blocks), the routed experts' and the shared experts' of a mixture of
        experts."""
        if not self.is_moe:
            return (self.ffn_size,)
        out = [self.expert_ffn_size]
        if self.dense_layers:
            out.append(self.ffn_size)
        if self.shared_width:
            out.append(self.shared_width)
        return tuple(out)

    @property
    def current_scaling(self) -> bool:
        """Whether every low-precision cast takes its tensor's own amax first, in a kernel of its
        own (NVFP4, and FP8 with ``fp8_recipe=current``), rather than a scale from an amax history
        (FP8's delayed scaling) or each block's amax inside the cast (the block recipes)."""
        return self.gemm_dtype == "fp4" or (self.gemm_dtype == "fp8" and self.fp8_recipe == "current")

    @property
    def amax_history(self) -> bool:
        """Whether the run keeps amax histories (FP8's delayed scaling, its default recipe)."""
        return self.gemm_dtype == "fp8" and self.fp8_recipe in ("", "delayed")

    def low_precision_layer(self, layer: int) -> bool:
        """Whether block ``layer`` runs its GEMMs in the low-precision recipe (not one of the
        ``first_layers_bf16`` or ``last_layers_bf16`` blocks)."""
        return self.first_layers_bf16 <= layer < self.layers - self.last_layers_bf16

    @property
    def low_dtype(self) -> str:
        """The element type the low-precision casts write and the block GEMMs read: ``fp8``,
        ``fp8_block`` or ``mxfp8`` by ``fp8_recipe`` (:data:`FP8_ELEMENT_TYPES`), ``fp4``; ``""``
        without a low-precision recipe. Op names keep ``gemm_dtype`` (``<x>.fp8``)."""
        if self.gemm_dtype == "fp8":
            return FP8_ELEMENT_TYPES.get(self.fp8_recipe, "fp8")
        return self.gemm_dtype

    @property
    def training(self) -> bool:
        return self.mode == "train"

    @property
    def tokens(self) -> int:
        """Tokens of one forward pass (batch x seq; decode: one per sequence)."""
        return self.batch * (1 if self.mode == "decode" else self.seq)

    @property
    def expert_capacity(self) -> int:
        """Tokens each expert processes per forward pass: ``ceil(capacity_factor * top_k *
        tokens / experts)`` (uniform routing; capacity factor 1 is dropless with a perfect balance)."""
        if not self.is_moe:
            return 0
        import math

        return max(1, math.ceil(self.capacity_factor * self.top_k * self.tokens / self.experts))

    def params_dict(self) -> dict[str, Any]:
        """Every field but the name and extras (what a spec string can set)."""
        out = asdict(self)
        out.pop("name")
        out.pop("extras")
        return out


def _gpt(layers: int, hidden: int, heads: int) -> dict[str, Any]:
    return dict(family="gpt", layers=layers, hidden=hidden, heads=heads, vocab=50257, seq=2048, max_positions=2048,
                norm="layer", activation="gelu", positions="learned", dropout=0.1, bias=True, tie_embeddings=True)


def _llama(layers: int, hidden: int, heads: int, ffn: int, kv_heads: int = 8, vocab: int = 128256) -> dict[str, Any]:
    return dict(family="llama", layers=layers, hidden=hidden, heads=heads, kv_heads=kv_heads, ffn=ffn, vocab=vocab,
                seq=8192, max_positions=131072, norm="rms", activation="swiglu", positions="rotary", dropout=0.0,
                bias=False, tie_embeddings=False)


def _mixtral(layers: int, hidden: int, heads: int, ffn: int, vocab: int) -> dict[str, Any]:
    return dict(_llama(layers, hidden, heads, ffn, 8, vocab), family="moe", experts=8, top_k=2, capacity_factor=1.0,
                seq=4096, max_positions=65536)


def _deepseek_moe(layers: int, hidden: int, heads: int, ffn: int, expert_ffn: int, experts: int, top_k: int,
                  shared: int, dense: int, vocab: int, positions: int) -> dict[str, Any]:
    """DeepSeekMoE-style: fine-grained routed experts beside ``shared`` always-active experts
    of the same width, the first ``dense`` blocks with a dense MLP of ``ffn``, multi-head attention."""
    return {**_llama(layers, hidden, heads, ffn, heads, vocab), "family": "moe", "experts": experts, "top_k": top_k,
            "expert_ffn": expert_ffn, "shared_experts": shared, "dense_layers": dense, "capacity_factor": 1.0,
            "seq": min(positions, 8192), "max_positions": positions}


def _qwen_moe(layers: int, hidden: int, heads: int, kv_heads: int, ffn: int, expert_ffn: int, experts: int,
              top_k: int, shared_ffn: int, positions: int, head_dim: int = 0) -> dict[str, Any]:
    """Qwen-MoE-style: every block's MLP routed experts, with one gated shared expert of
    ``shared_ffn`` where it is not 0."""
    out = {**_llama(layers, hidden, heads, ffn, kv_heads, 151936), "family": "moe", "experts": experts,
           "top_k": top_k, "expert_ffn": expert_ffn, "capacity_factor": 1.0, "seq": min(positions, 8192),
           "max_positions": positions, "head_dim": head_dim}
    if shared_ffn:
        out.update(shared_experts=1, shared_ffn=shared_ffn, shared_gate=True)
    return out


PRESETS: dict[str, tuple[dict[str, Any], str]] = {
    "gpt3-125m": (_gpt(12, 768, 12), "GPT-3 Small (Brown et al. 2020, Table 2.1)"),
    "gpt3-350m": (_gpt(24, 1024, 16), "GPT-3 Medium (Brown et al. 2020, Table 2.1)"),
    "gpt3-760m": (_gpt(24, 1536, 16), "GPT-3 Large (Brown et al. 2020, Table 2.1)"),
    "gpt3-1.3b": (_gpt(24, 2048, 16), "GPT-3 XL (Brown et al. 2020, Table 2.1; 16 heads of 128 = hidden 2,048)"),
    "gpt3-2.7b": (_gpt(32, 2560, 32), "GPT-3 2.7B (Brown et al. 2020, Table 2.1)"),
    "gpt3-6.7b": (_gpt(32, 4096, 32), "GPT-3 6.7B (Brown et al. 2020, Table 2.1)"),
    "gpt3-13b": (_gpt(40, 5120, 40), "GPT-3 13B (Brown et al. 2020, Table 2.1; hidden 5,120 = 40 x 128)"),
    "gpt3-175b": (_gpt(96, 12288, 96), "GPT-3 175B (Brown et al. 2020, Table 2.1)"),
    "llama3-8b": (_llama(32, 4096, 32, 14336), "Llama 3 8B (Meta 2024; config.json)"),
    "llama3-70b": (_llama(80, 8192, 64, 28672), "Llama 3 70B (Meta 2024; config.json)"),
    "llama3-405b": (_llama(126, 16384, 128, 53248), "Llama 3.1 405B (Meta 2024; config.json)"),
    "mixtral-8x7b": (_mixtral(32, 4096, 32, 14336, 32000), "Mixtral 8x7B (Jiang et al. 2024; config.json)"),
    "mixtral-8x22b": (_mixtral(56, 6144, 48, 16384, 32768), "Mixtral 8x22B (Mistral AI 2024; config.json)"),
    "deepseek-moe-16b": (_deepseek_moe(28, 2048, 16, 10944, 1408, 64, 6, 2, 1, 102400, 4096),
                         "DeepSeekMoE 16B (Dai et al. 2024; deepseek-moe-16b-base config.json)"),
    "qwen1.5-moe-a2.7b": (_qwen_moe(24, 2048, 16, 16, 5632, 1408, 60, 4, 5632, 8192),
                          "Qwen1.5-MoE-A2.7B (Qwen team 2024; config.json, model_type qwen2_moe)"),
    "qwen3-30b-a3b": (_qwen_moe(48, 2048, 32, 4, 6144, 768, 128, 8, 0, 40960, head_dim=128),
                      "Qwen3-30B-A3B (Qwen team 2025; config.json, model_type qwen3_moe)"),
    "qwen3-235b-a22b": (_qwen_moe(94, 4096, 64, 4, 12288, 1536, 128, 8, 0, 40960, head_dim=128),
                        "Qwen3-235B-A22B (Qwen team 2025; config.json, model_type qwen3_moe)"),
}
"""Published models: (configuration, source)."""

FAMILY_DEFAULTS: dict[str, tuple[dict[str, Any], str]] = {
    "gpt": (PRESETS["gpt3-125m"][0], "GPT-3-style decoder (learned positions, LayerNorm, GeLU MLP of 4 x hidden, "
                                     "biases, tied embeddings); defaults: GPT-3 125M"),
    "llama": (PRESETS["llama3-8b"][0], "Llama-style decoder (RMSNorm, SwiGLU, rotary positions, grouped-query "
                                       "attention with kv_heads, no biases); defaults: Llama 3 8B"),
    "moe": (PRESETS["mixtral-8x7b"][0], "Mixture-of-experts decoder (Llama-style attention, experts x SwiGLU MLPs, "
                                        "top_k routing with a capacity factor; fine-grained: expert_ffn, "
                                        "shared_experts, shared_ffn, shared_gate, dense_layers); defaults: "
                                        "Mixtral 8x7B"),
}
"""The parameterised families: defaults (a published model) and a description."""

_SPEC_FIELDS = {f.name for f in fields(TransformerConfig)} - {"name", "extras", "family"}


def config_from(base: dict[str, Any], name: str, **params: Any) -> TransformerConfig:
    """A checked configuration: ``base`` (a preset or family default) with ``params`` over it."""
    cfg = TransformerConfig(name=name, **{**base, **params})
    check_config(cfg)
    return cfg


def cross_entropy_bytes(how: str, logit_bytes: int) -> tuple[int, int]:
    """Bytes a training loss moves per logit (forward, backward), the logits stored in
    ``logit_bytes`` bytes a value, for ``how`` in :data:`CROSS_ENTROPY`.

    ``unfused`` (Megatron-LM ``megatron/core/tensor_parallel/cross_entropy.py``, core 0.8): forward,
    the logits cast to fp32 (read ``e``, write 4; no copy when they are fp32), then in place over
    the fp32 copy the row maximum (read 4), its subtraction (read and write 4), ``exp`` (8), the
    row sum (4) and the division by it (8): 38 B from bf16. Backward, the saved probabilities less
    one at the target (one element a row), scaled in place by the loss's gradient (8) and cast back
    to the logits' type (read 4, write ``e``): 14 B from bf16. ``fused``: the logits read and the
    probabilities written in their type forward, the probabilities read and the gradient written
    backward: ``2 e`` each way."""
    if how == "fused":
        return 2 * logit_bytes, 2 * logit_bytes
    cast = logit_bytes + 4 if logit_bytes < 4 else 0
    return cast + 4 + 8 + 8 + 4 + 8, 8 + cast


def cross_entropy_op(cfg: TransformerConfig, backward: bool) -> dict[str, Any]:
    """The ``dtype`` and ``extra_per_elem`` of the training loss's op (``loss``, or its backward
    ``loss.grad``) under ``cfg.cross_entropy``: the type its kernels compute in and keep the
    probabilities in (fp32 when unfused: the softmax runs in place over the fp32 copy of the
    logits; the logits' type when fused), and the bytes per logit beyond one read and one write
    of that type, so that the op moves :func:`cross_entropy_bytes`."""
    dtype = "fp32" if cfg.cross_entropy == "unfused" else cfg.dtype
    moved = cross_entropy_bytes(cfg.cross_entropy, DTYPE_BYTES[cfg.dtype])[1 if backward else 0]
    return {"dtype": dtype, "extra_per_elem": moved - 2 * DTYPE_BYTES[dtype]}


def _fail(key: str, message: str) -> None:
    raise InputError(None, key, message)


def check_config(cfg: TransformerConfig) -> None:
    """Raise InputError naming the first field that cannot work, and what it expected."""
    for key in ("layers", "hidden", "heads", "vocab", "seq", "batch", "max_positions"):
        value = getattr(cfg, key)
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            _fail(key, f"expected a positive integer, got {value!r}")
    for key in ("ffn", "kv_heads", "head_dim", "experts", "top_k", "context", "prompt", "generate", "expert_ffn",
                "shared_experts", "shared_ffn", "dense_layers", "first_layers_bf16", "last_layers_bf16"):
        value = getattr(cfg, key)
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            _fail(key, f"expected a positive integer, got {value!r}")
    if cfg.family not in FAMILY_DEFAULTS:
        _fail("family", f"expected one of {', '.join(FAMILY_DEFAULTS)}, got {cfg.family!r}")
    if cfg.mode not in MODES:
        _fail("mode", f"expected one of {', '.join(MODES)}, got {cfg.mode!r}")
    if cfg.recompute not in RECOMPUTE:
        _fail("recompute", f"expected one of {', '.join(RECOMPUTE)}, got {cfg.recompute!r}")
    if cfg.attention not in ATTENTION:
        _fail("attention", f"expected one of {', '.join(ATTENTION)}, got {cfg.attention!r}")
    if cfg.cross_entropy not in CROSS_ENTROPY:
        _fail("cross_entropy", f"expected one of {', '.join(CROSS_ENTROPY)}, got {cfg.cross_entropy!r}")
    if cfg.cross_entropy != "unfused" and cfg.mode != "train":
        _fail("cross_entropy", f"the training loss's kernels apply to mode=train only, got mode={cfg.mode}")
    if cfg.recompute != "none" and cfg.mode != "train":
        _fail("recompute", f"activation recomputation applies to mode=train only, got mode={cfg.mode}")
    if cfg.dtype not in ("fp32", "bf16", "fp16"):
        _fail("dtype", f"expected one of fp32, bf16, fp16, fp8, fp4, got {cfg.dtype!r}")
    if cfg.gemm_dtype not in ("", "fp8", "fp4"):
        _fail("gemm_dtype", f"expected fp8 or fp4 (Transformer Engine's recipes), got {cfg.gemm_dtype!r}")
    for key in ("first_layers_bf16", "last_layers_bf16"):
        if getattr(cfg, key) and (not cfg.gemm_dtype or cfg.mode != "train"):
            _fail(key, f"keeps blocks out of a low-precision training recipe: needs dtype=fp8 or fp4 and mode=train, "
                       f"got dtype={cfg.gemm_dtype or cfg.dtype}, mode={cfg.mode}")
    if cfg.first_layers_bf16 + cfg.last_layers_bf16 > cfg.layers:
        _fail("last_layers_bf16", f"expected first_layers_bf16 + last_layers_bf16 at most the {cfg.layers} layers, got "
                                  f"{cfg.first_layers_bf16} + {cfg.last_layers_bf16}")
    if cfg.fp4_param_gather and (cfg.gemm_dtype != "fp4" or cfg.mode != "train"):
        _fail("fp4_param_gather", "applies to NVFP4 training (dtype=fp4, mode=train)")
    if cfg.fp8_param_gather and (cfg.gemm_dtype not in ("fp8", "fp4") or cfg.mode != "train"):
        _fail("fp8_param_gather", "applies to FP8 or NVFP4 training (dtype=fp8 or fp4, mode=train)")
    if cfg.fp8_recipe and cfg.fp8_recipe not in FP8_RECIPES:
        _fail("fp8_recipe", f"expected one of {', '.join(FP8_RECIPES)}, got {cfg.fp8_recipe!r}")
    if cfg.fp8_recipe and (cfg.gemm_dtype != "fp8" or cfg.mode not in ("forward", "train")):
        _fail("fp8_recipe", f"applies to FP8 training and forward passes (dtype=fp8, mode=train or forward; serving "
                            f"takes static scales), got dtype={cfg.gemm_dtype or cfg.dtype}, mode={cfg.mode}")
    if cfg.kv_dtype not in ("", "fp8", "bf16", "fp16", "fp32"):
        _fail("kv_dtype", f"expected fp8, bf16, fp16 or fp32, got {cfg.kv_dtype!r}")
    if cfg.kv_dtype and cfg.mode not in ("prefill", "decode", "serve"):
        _fail("kv_dtype", f"applies to the KV cache of prefill, decode and serve, got mode={cfg.mode}")
    if cfg.norm not in ("layer", "rms"):
        _fail("norm", f"expected layer or rms, got {cfg.norm!r}")
    if cfg.activation not in ("gelu", "swiglu"):
        _fail("activation", f"expected gelu or swiglu, got {cfg.activation!r}")
    if cfg.positions not in ("learned", "rotary"):
        _fail("positions", f"expected learned or rotary, got {cfg.positions!r}")
    if not cfg.head_dim and cfg.hidden % cfg.heads:
        _fail("heads", f"expected a divisor of hidden ({cfg.hidden}), got {cfg.heads}")
    if cfg.kv_heads and (cfg.kv_heads > cfg.heads or cfg.heads % cfg.kv_heads):
        _fail("kv_heads", f"expected a divisor of heads ({cfg.heads}), got {cfg.kv_heads}")
    if not 0.0 <= cfg.dropout < 1.0:
        _fail("dropout", f"expected a probability in [0, 1), got {cfg.dropout!r}")
    if cfg.family == "moe" or cfg.experts:
        if cfg.experts < 1:
            _fail("experts", f"expected a positive number of experts, got {cfg.experts}")
        if cfg.top_k < 1:
            _fail("top_k", f"expected a positive integer, got {cfg.top_k}")
        if cfg.top_k > cfg.experts:
            _fail("top_k", f"expected at most experts ({cfg.experts}), got {cfg.top_k}")
        if not cfg.capacity_factor > 0:
            _fail("capacity_factor", f"expected a positive number, got {cfg.capacity_factor!r}")
        if cfg.expert_load and (len(cfg.expert_load) != cfg.experts or not all(x > 0 for x in cfg.expert_load)):
            _fail("expert_load", f"expected {cfg.experts} positive numbers (the tokens routed to each expert, "
                                 f"relative), got {'/'.join(f'{x:g}' for x in cfg.expert_load)}")
        if cfg.dense_layers > cfg.layers:
            _fail("dense_layers", f"expected at most the {cfg.layers} layers, got {cfg.dense_layers}")
        if not cfg.shared_experts:
            for key in ("shared_ffn", "shared_gate"):
                if getattr(cfg, key):
                    _fail(key, "applies to shared experts (set shared_experts)")
        if not isinstance(cfg.shared_gate, bool):
            _fail("shared_gate", f"expected true or false, got {cfg.shared_gate!r}")
    elif cfg.top_k:
        _fail("top_k", "applies to mixture-of-experts models (set experts)")
    elif cfg.expert_load:
        _fail("expert_load", "applies to mixture-of-experts models (set experts)")
    else:
        for key in ("expert_ffn", "shared_experts", "shared_ffn", "shared_gate", "dense_layers"):
            if getattr(cfg, key):
                _fail(key, "applies to mixture-of-experts models (set experts)")
    if cfg.mode == "decode":
        if not cfg.context:
            _fail("context", "mode=decode needs context=C, the tokens already in the KV cache")
        if cfg.context > cfg.max_positions and cfg.positions == "learned":
            _fail("context", f"expected at most max_positions ({cfg.max_positions}), got {cfg.context}")
    elif cfg.context:
        _fail("context", f"applies to mode=decode, got mode={cfg.mode}")
    if cfg.mode == "serve":
        if not cfg.prompt:
            _fail("prompt", "mode=serve needs prompt=P, the tokens of each prompt")
        if not cfg.generate:
            _fail("generate", "mode=serve needs generate=G, the decode steps after the prefill")
        if cfg.positions == "learned" and cfg.prompt + cfg.generate > cfg.max_positions:
            _fail("generate", f"prompt + generate ({cfg.prompt + cfg.generate}) exceeds max_positions "
                              f"({cfg.max_positions})")
    else:
        for key in ("prompt", "generate"):
            if getattr(cfg, key):
                _fail(key, f"applies to mode=serve, got mode={cfg.mode}")
    if cfg.mode in ("forward", "train", "prefill") and cfg.positions == "learned" and cfg.seq > cfg.max_positions:
        _fail("seq", f"expected at most max_positions ({cfg.max_positions}, the position table), got {cfg.seq}")


def with_overrides(cfg: TransformerConfig, **changes: Any) -> TransformerConfig:
    """A checked copy with some fields changed."""
    out = replace(cfg, **changes)
    check_config(out)
    return out


SPEC_FIELDS = frozenset(_SPEC_FIELDS)
"""Fields a spec string may set."""
