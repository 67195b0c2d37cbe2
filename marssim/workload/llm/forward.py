"""The forward pass of a decoder transformer as ops with exact shapes.

Tensors follow the ``(n, c, h, w)`` convention of :mod:`marssim.workload.op`: token tensors
``[batch, tokens, features]`` are ``(batch, features, tokens, 1)``; attention scores of ``H``
heads, ``M`` queries and ``N`` keys are ``(batch, H*N, M, 1)``; the tokens routed to ``E``
experts are ``(E, features, capacity, 1)``.

One block (pre-norm, as GPT-2/3, Llama and Mixtral)::

    input_norm -> attn.qkv (one fused projection, as Megatron-LM's linear_qkv) -> attn.q/k/v (views)
      [-> attn.q_rope, attn.k_rope]  -> attn.qk -> attn.softmax [-> attn.dropout] -> attn.pv
      -> attn.proj [-> attn.proj_dropout] -> attn.residual
    post_norm -> MLP -> mlp.residual

    MLP, gpt:    mlp.fc1 -> mlp.act (GeLU) -> mlp.fc2 [-> mlp.dropout]
    MLP, llama:  mlp.fc1 (gate and up in one projection, as Megatron-LM's linear_fc1) -> mlp.gate/up
                 (views) -> mlp.act (SwiGLU: silu(gate) * up) -> mlp.down
    MLP, moe:    moe.router -> moe.topk -> moe.dispatch -> moe.gate, moe.up (grouped GEMMs over the
                 experts) -> moe.act -> moe.down -> moe.combine
                 [-> shared.fc1 -> shared.gate/up -> shared.act -> shared.down (the shared experts, a dense
                 MLP on every token) [-> shared.router, shared.scale (Qwen's sigmoid gate)]
                 -> shared.add]
                 (the first ``dense_layers`` blocks of a mixture of experts: the llama MLP of ``ffn``)

The attention core (``attn.qk``, ``attn.softmax``, ``attn.dropout``, ``attn.pv``) carries
``core=True``; with ``attention=flash`` (or ``efficient``, ``cudnn``) it is one fused op
``attn.core`` (a ``matmul`` with ``fused=fwd``: :mod:`marssim.workload.op`). FLOPs of the
causal attention products count the full ``M x N`` product (the convention of Narayanan et al.
2021 and of the model-FLOPs utilisation of Chowdhery et al. 2022, so published formulas match
exactly); the mask is applied in the softmax and the products are marked ``causal`` for cost
models that skip masked blocks.

Every op carries ``layer`` (``-1`` for the embedding, ``layers`` for the final norm, head and
loss) and ``phase`` (``fwd``); every GEMM its tensor-parallel role (``tp_role``: column, row or
replicated, :mod:`.tprole`).

With ``gemm_dtype`` (``dtype=fp8`` or ``fp4``) the blocks' GEMMs read their input through a cast
(``<x>.fp8``, or ``<x>.amax`` and ``<x>.fp4``; ``<x>.amax`` and ``<x>.fp8`` under FP8's current
scaling) and their weights' low-precision copy
(:mod:`.precision`); with ``kv_dtype`` the KV cache holds that type, the keys and values cast as
they are written, and a fused prefill core reads its keys and values at that type (the engine's
context kernel with such a cache).
"""

from __future__ import annotations

import math

from marssim.workload.builder import GraphBuilder, T
from marssim.workload.op import DTYPE_BYTES, OpKind

from .config import TransformerConfig
from .precision import low_precision_gemm
from .tprole import TP_ROLE, TpRole

__all__ = ["Decoder", "HEAD_LAYER", "quantize"]

HEAD_LAYER = "head"
"""Name of the group after the last block (final norm, output projection, loss)."""


class Decoder:
    """Adds the ops of one forward pass of ``cfg`` to ``builder``; ``prefix`` prepends every op
    name (decode steps of a serving graph)."""

    def __init__(self, cfg: TransformerConfig, builder: GraphBuilder, prefix: str = "") -> None:
        self.cfg = cfg
        self.b = builder
        self.prefix = prefix
        self._casts: dict[str, T] = {}  # tensor -> its low-precision copy (one cast however many GEMMs read it)

    # ------------------------------------------------------------------ low precision
    def linear(self, name: str, x: T, out_features: int, role: TpRole, bias: bool = False, grouped: bool = False,
               shares: str | None = None) -> T:
        """A linear layer of tensor-parallel ``role`` (:mod:`.tprole`); a block GEMM of a
        low-precision recipe reads ``x`` cast and its weights' low-precision copy, and writes the
        activation type."""
        cfg, b = self.cfg, self.b
        low = cfg.low_dtype
        if not low or not low_precision_gemm(name) or not cfg.low_precision_layer(b.tags.get("layer", 0)):
            return b.linear(name, x, out_features, bias=bias, grouped=grouped, shares=shares, params={TP_ROLE: role})
        xq = self.cast(x)
        y = b.linear(name, xq, out_features, bias=bias, grouped=grouped, shares=shares, params={TP_ROLE: role})
        b.annotate_last(in_dtypes=(low,), w_dtype=low)
        return y

    def cast(self, x: T) -> T:
        """``x`` in the recipe's GEMM type (:mod:`.precision`): one cast kernel writing the
        low-precision tensor and, in training, its transpose (the copy backward keeps); current
        scaling (NVFP4, FP8's ``fp8_recipe=current``) takes the tensor's amax first (``<x>.amax``)."""
        got = self._casts.get(x.op)
        if got is not None:
            return got
        cfg, b = self.cfg, self.b
        low = cfg.gemm_dtype
        tags = dict(b.tags)
        t = quantize(b, cfg, x, f"{x.op}.{low}", "e4m3")
        b.tags = tags
        self._casts[x.op] = t
        return t

    def _tag(self, layer: int, **extra) -> None:
        self.b.tags = {"layer": layer, "phase": "fwd", **extra}

    def n(self, name: str) -> str:
        return f"{self.prefix}{name}"

    # ------------------------------------------------------------------ embedding and head
    def embed(self, ids: T) -> T:
        """Token embedding of ``ids`` ``(n, 1, tokens, 1)``; with learned positions, the position
        table looked up at the tokens' positions (ids from the host) and added (Megatron-LM's
        ``LanguageModelEmbedding``)."""
        cfg, b = self.cfg, self.b
        self._tag(-1)
        x = b.embedding(self.n("embed.tokens"), ids, vocab=cfg.vocab, hidden=cfg.hidden)
        if cfg.positions == "learned":
            pos = b.input(self.n("position_ids"), c=1, h=ids.h)
            pe = b.embedding(self.n("embed.positions"), pos, vocab=cfg.max_positions, hidden=cfg.hidden)
            x = b.eltwise(self.n("embed.add"), x, pe, fn="add")
        if cfg.dropout and cfg.training:
            x = self._dropout(self.n("embed.dropout"), x)
        return x

    def head(self, x: T, last_token: bool = False) -> T:
        """Final norm and the output projection (logits ``(n, vocab, tokens, 1)``); with
        ``last_token`` only the last position's logits (serving)."""
        cfg, b = self.cfg, self.b
        self._tag(cfg.layers)
        x = b.norm(self.n("final_norm"), x, norm=cfg.norm)
        if last_token and x.h > 1:
            x = b.reshape(self.n("last_token"), x, shape=(x.n, x.c, 1, 1), what="slice")
            b.annotate_last(view=True)
        # the vocabulary-parallel output layer: column-parallel over the vocabulary
        return self.linear(self.n("output"), x, cfg.vocab, TpRole.COLUMN, bias=False,
                           shares=self.n("embed.tokens") if cfg.tie_embeddings else None)

    # ------------------------------------------------------------------ blocks
    def block(self, i: int, x: T, cache: tuple[T, T] | None = None, cache_len: int = 0,
              cache_write: bool = False, cache_after: tuple[str, ...] = ()) -> T:
        """Block ``i`` on ``x``. ``cache``: the resident K and V cache inputs a decode step reads
        (``cache_len`` tokens of them, this step's own key and value included);
        ``cache_write``: a prefill writes its keys and values to the cache (``attn.kv_write``);
        ``cache_after``: ops the cache views wait for (the prefill's writes)."""
        cfg, b = self.cfg, self.b
        p = self.n(f"layers.{i}.")
        self._tag(i)
        h = b.norm(p + "input_norm", x, norm=cfg.norm)
        q, k, v = self._qkv(p, h)
        if cfg.positions == "rotary":
            q = b.eltwise(p + "attn.q_rope", q, fn="rope")
            k = b.eltwise(p + "attn.k_rope", k, fn="rope")
        if cache_write:
            kv = b.reshape(p + "attn.kv_write", k, v, shape=(k.n, k.c + v.c, k.h, 1), what="kv_write")
            b.annotate_last(keep=True)
            if cfg.cache_dtype != cfg.dtype:  # the cache's type: cast as written
                _retype(b, cfg.cache_dtype, (cfg.dtype, cfg.dtype))
            del kv
        if cache is not None:
            k_cache, v_cache = cache
            k = self._cache_view(p + "attn.k_cache", k_cache, k, cache_len, cache_after)
            v = self._cache_view(p + "attn.v_cache", v_cache, v, cache_len, cache_after)
        ctx = self._core(p, q, k, v, written=cache_write)
        y = self.linear(p + "attn.proj", ctx, cfg.hidden, TpRole.ROW, bias=cfg.bias)
        if cfg.dropout and cfg.training:
            y = self._dropout(p + "attn.proj_dropout", y)
        x = b.eltwise(p + "attn.residual", y, x, fn="add")
        h = b.norm(p + "post_norm", x, norm=cfg.norm)
        y = self._moe(p, h) if cfg.is_moe_layer(i) else self._mlp(p, h)
        if cfg.dropout and cfg.training:
            y = self._dropout(p + "mlp.dropout", y)
        return b.eltwise(p + "mlp.residual", y, x, fn="add")

    def _qkv(self, p: str, h: T) -> tuple[T, T, T]:
        cfg, b = self.cfg, self.b
        d = cfg.d_head
        q_feat, kv_feat = cfg.heads * d, cfg.kv * d
        qkv = self.linear(p + "attn.qkv", h, q_feat + 2 * kv_feat, TpRole.COLUMN, bias=cfg.bias)
        parts = []
        for part, feat in (("q", q_feat), ("k", kv_feat), ("v", kv_feat)):
            t = b.reshape(p + f"attn.{part}", qkv, shape=(h.n, feat, h.h, 1), what="split")
            b.annotate_last(view=True)
            parts.append(t)
        return parts[0], parts[1], parts[2]

    def _cache_view(self, name: str, cache: T, new: T, length: int, after: tuple[str, ...]) -> T:
        """The first ``length`` tokens of a resident cache, once this step's ``new`` token (and
        the ops ``after``) are in it: a view (no copy, no new buffer)."""
        b = self.b
        ins = [T(cache.op, (cache.n, cache.c, length, 1)), new] + [T(o, b.last(o).out_shape) for o in after]
        cfg = self.cfg
        params: dict = {"what": "cache", "view": True}
        if cfg.cache_dtype != cfg.dtype:
            params["in_dtypes"] = (cfg.cache_dtype, cfg.dtype) + tuple(b.last(o).dtype for o in after)
        t = b.op(name, OpKind.RESHAPE, {"N": new.n, "C": new.c, "H": length, "W": 1}, ins, (new.n, new.c, length, 1),
                 params=params, dtype=cfg.cache_dtype)
        return t

    def _core(self, p: str, q: T, k: T, v: T, written: bool = False) -> T:
        """The attention core of ``q`` over ``k`` and ``v``; ``written``: a prefill that writes
        its keys and values to the cache (see :meth:`_fused_core`)."""
        cfg, b = self.cfg, self.b
        b.tags = {**b.tags, "core": True}
        causal = cfg.mode != "decode"
        if cfg.attention != "unfused":
            ctx = self._fused_core(p, q, k, v, causal, written)
            b.tags = {k_: v_ for k_, v_ in b.tags.items() if k_ != "core"}
            return ctx
        kv_types = self._kv_types(k)
        s = b.matmul(p + "attn.qk", q, k, heads=cfg.heads, b_feature="K", kv_group=cfg.kv_group, causal=causal)
        if kv_types:
            _retype(b, cfg.dtype, (cfg.dtype, kv_types))
        s = b.softmax(p + "attn.softmax", s, heads=cfg.heads)
        if cfg.dropout and cfg.training:
            s = self._dropout(p + "attn.dropout", s)
        ctx = b.matmul(p + "attn.pv", s, v, heads=cfg.heads, b_feature="N", kv_group=cfg.kv_group, causal=causal)
        if kv_types:
            _retype(b, cfg.dtype, (cfg.dtype, kv_types))
        b.tags = {k_: v_ for k_, v_ in b.tags.items() if k_ != "core"}
        return ctx

    def _fused_core(self, p: str, q: T, k: T, v: T, causal: bool, written: bool = False) -> T:
        """``attn.core``: the attention core as one fused kernel (``attention=flash`` or
        ``efficient``; see :mod:`marssim.workload.op`, param ``fused``): the context of the
        queries ``q`` over the keys ``k`` and values ``v``; dropout of the probabilities inside the
        kernel in training (no mask kept). Keys and values from a cache of another type are read
        at its type; so are those of a prefill that writes them to such a cache (``written``): an
        engine's context kernel with an FP8 cache is its own kernel, measured as such
        (:mod:`marssim.calibrate.aiconfigurator`), where one over a bf16 cache stands in."""
        from marssim.workload.op import fused_attention_shapes

        cfg, b = self.cfg, self.b
        d = cfg.d_head
        loops = {"B": q.n, "H": cfg.heads, "M": q.h, "N": k.h, "K": d}
        _, out = fused_attention_shapes("fwd", q.n, cfg.heads, q.h, k.h, d, cfg.kv_group)
        params = {"fused": "fwd", "backend": cfg.attention, "kv_group": cfg.kv_group, "causal": causal}
        if cfg.dropout and cfg.training:
            params["dropout"] = cfg.dropout
        kv_types = self._kv_types(k) or (cfg.cache_dtype if written and cfg.cache_dtype != cfg.dtype else "")
        if kv_types:  # bf16 queries, keys and values of an FP8 cache (computed in bf16)
            params["in_dtypes"] = (cfg.dtype, kv_types, kv_types)
        return b.op(p + "attn.core", OpKind.MATMUL, loops, [q, k, v], out, params=params)

    def _kv_types(self, k: T) -> str:
        """The KV cache's type when ``k`` is a view of a cache of another type than the
        activations', else ``""``."""
        op = self.b.last(k.op)
        return op.dtype if op.dtype != self.cfg.dtype else ""

    def _mlp(self, p: str, h: T, part: str = "mlp", width: int = 0) -> T:
        """A dense MLP of ``width`` (default ``ffn``): ``<part>.fc1`` (the gate and up projections
        in one GEMM of ``2 x width``), its halves ``.gate`` and ``.up`` (views), ``.act``, ``.down``
        (``.fc1``, ``.act``, ``.fc2`` with GeLU)."""
        cfg, b = self.cfg, self.b
        width = width or cfg.ffn_size
        if cfg.activation == "gelu":
            y = self.linear(p + f"{part}.fc1", h, width, TpRole.COLUMN, bias=cfg.bias)
            y = b.eltwise(p + f"{part}.act", y, fn="gelu")
            return self.linear(p + f"{part}.fc2", y, cfg.hidden, TpRole.ROW, bias=cfg.bias)
        # gate and up projections in one GEMM of twice the width, as Megatron-LM (linear_fc1), vLLM and
        # SGLang (MergedColumnParallelLinear) and TensorRT-LLM (GatedMLP) run them; gate and up are views
        fc1 = self.linear(p + f"{part}.fc1", h, 2 * width, TpRole.COLUMN, bias=cfg.bias)
        halves = []
        for half in ("gate", "up"):
            halves.append(b.reshape(p + f"{part}.{half}", fc1, shape=(h.n, width, h.h, 1), what="split"))
            b.annotate_last(view=True)
        y = b.eltwise(p + f"{part}.act", *halves, fn="swiglu")
        return self.linear(p + f"{part}.down", y, cfg.hidden, TpRole.ROW, bias=cfg.bias)

    def _moe(self, p: str, h: T) -> T:
        """Router, top-k gating, dispatch of each token to ``top_k`` experts (``capacity`` tokens
        per expert, of the tokens ``h`` holds: a serving graph's prefill and decode steps have
        their own), grouped expert GEMMs, gate-weighted combine."""
        cfg, b = self.cfg, self.b
        e = cfg.experts
        cap = max(1, math.ceil(cfg.capacity_factor * cfg.top_k * h.n * h.h / e))
        logits = self.linear(p + "moe.router", h, e, TpRole.REPLICATED, bias=False)
        gates = b.eltwise(p + "moe.topk", logits, fn="router")
        routed = b.op(p + "moe.dispatch", OpKind.RESHAPE, {"N": e, "C": cfg.hidden, "H": cap, "W": 1}, [h, gates],
                      (e, cfg.hidden, cap, 1), params={"what": "dispatch"})
        act = cfg.activation
        width = cfg.expert_ffn_size
        if act == "swiglu":
            gate = self.linear(p + "moe.gate", routed, width, TpRole.COLUMN, bias=False, grouped=True)
            up = self.linear(p + "moe.up", routed, width, TpRole.COLUMN, bias=False, grouped=True)
            y = b.eltwise(p + "moe.act", gate, up, fn="swiglu")
        else:
            y = self.linear(p + "moe.fc1", routed, width, TpRole.COLUMN, bias=False, grouped=True)
            y = b.eltwise(p + "moe.act", y, fn="gelu")
        y = self.linear(p + "moe.down", y, cfg.hidden, TpRole.ROW, bias=False, grouped=True)
        out = b.op(p + "moe.combine", OpKind.RESHAPE, {"N": h.n, "C": h.c, "H": h.h, "W": 1}, [y, gates], h.shape,
                   params={"what": "combine"})
        if not cfg.shared_experts:
            return out
        return b.eltwise(p + "shared.add", out, self._shared(p, h), fn="add")

    def _shared(self, p: str, h: T) -> T:
        """The shared experts on every token of ``h``, after the routed ones (Megatron-LM's
        ``MoELayer``): one dense MLP of ``shared_experts x shared_ffn`` (``shared.fc1`` and its
        halves ``shared.gate`` and ``shared.up``, ``shared.act``, ``shared.down``), with
        ``shared_gate`` scaled per token by the sigmoid of a learned score (``shared.router``, a
        GEMM to one feature, and ``shared.scale``)."""
        cfg, b = self.cfg, self.b
        y = self._mlp(p, h, "shared", cfg.shared_width)
        if not cfg.shared_gate:
            return y
        score = self.linear(p + "shared.router", h, 1, TpRole.REPLICATED, bias=False)
        n, c, hh, w = y.shape
        return b.op(p + "shared.scale", OpKind.ELTWISE, {"N": n, "C": c, "H": hh, "W": w}, [y, score], y.shape,
                    params={"fn": "sigmoid_gate"})

    def _dropout(self, name: str, x: T) -> T:
        """Dropout: keeps a one-byte mask per element for backward."""
        t = self.b.eltwise(name, x, fn="dropout")
        self.b.annotate_last(p=self.cfg.dropout, extra_per_elem=1)
        return t



def _retype(b: GraphBuilder, out: str, ins: tuple[str, ...]) -> None:
    """The op added last writes ``out`` and reads its inputs at ``ins`` (element types)."""
    b.annotate_last(dtype=out, in_dtypes=ins)


def quantize(b: GraphBuilder, cfg: TransformerConfig, x: T, name: str, fp8_format: str) -> T:
    """``x`` cast to the recipe's element type (``cfg.low_dtype``) by the op ``name`` (named by
    ``cfg.gemm_dtype``, :mod:`.precision`): FP8 in format ``fp8_format`` (``e4m3`` forward,
    ``e5m2`` gradients) or NVFP4; delayed scaling takes the amax in the same pass, and so do the
    block recipes each block's; current scaling (NVFP4, ``fp8_recipe=current``) in an amax kernel
    over ``x`` first; training also writes the transpose (the block recipes: the copy scaled along
    the other axis)."""
    low, act = cfg.low_dtype, cfg.dtype
    params: dict = {"fn": "quantize", "in_dtypes": (act,)}
    ins = [x]
    if cfg.gemm_dtype == "fp8":
        params["fp8"] = fp8_format
    if cfg.current_scaling:  # the tensor's own amax first (<x>.amax, <gemm>.grad_amax): a reduction
        # over x, its loops x's (a shard reads its share of x) and its output one fp32 value
        n, c, h, w = x.shape
        amax = b.op(name.rpartition(cfg.gemm_dtype)[0] + "amax", OpKind.ELTWISE, {"N": n, "C": c, "H": h, "W": w},
                    [x], (1, 1, 1, 1), params={"fn": "amax", "in_dtypes": (act,)}, dtype="fp32")
        ins.append(amax)
        params["in_dtypes"] = (act, "fp32")
    if cfg.training:
        params["extra_per_elem"] = DTYPE_BYTES[low]  # the transposed copy
    n, c, h, w = x.shape
    return b.op(name, OpKind.ELTWISE, {"N": n, "C": c, "H": h, "W": w}, ins, x.shape, params=params, dtype=low)
