"""Assemble the graph of one run of a decoder transformer in each mode.

=========  ===================================================================================
mode       graph
=========  ===================================================================================
forward    embedding, ``layers`` blocks, final norm, output projection (logits of every token)
train      forward + ``loss`` (cross-entropy over the vocabulary, moving the bytes of its
           ``cross_entropy`` kernels) + backward + optimizer
           (:mod:`.autograd`); ``recompute`` adds the recomputed forward work
prefill    forward over ``seq`` prompt tokens writing each block's keys and values to the KV
           cache (``attn.kv_write``), logits of the last token, ``sample`` (the next token)
decode     one step: one token per sequence, each block reading ``context`` cached keys and
           values (resident inputs ``layers.i.k_cache``/``v_cache``) through cache views
serve      ``prefill.*`` over ``prompt`` tokens, then ``generate`` steps ``decode.1.*`` ...; step
           ``j`` attends over ``prompt + j`` cached tokens (its own included) and takes the token
           step ``j - 1`` (the prefill for step 1) sampled
=========  ===================================================================================

Token and position ids come from the host as graph inputs; the KV cache lives in device
memory (``resident`` inputs sized for the largest context of the graph).
"""

from __future__ import annotations

from marssim.errors import InputError
from marssim.workload.builder import GraphBuilder, T
from marssim.workload.graph import Graph

from .autograd import add_backward
from .config import TransformerConfig, cross_entropy_op
from .forward import Decoder

__all__ = ["build_transformer", "require_transformer", "transformer_of"]

_CONFIG = "transformer"
"""The key of ``Graph.meta`` under which a built graph keeps its configuration (read through
:func:`transformer_of` and :func:`require_transformer` alone)."""


def transformer_of(graph: Graph) -> TransformerConfig | None:
    """The configuration ``graph`` was built from by :func:`build_transformer`; None for any other
    workload (a zoo model, an ONNX file)."""
    return graph.meta.get(_CONFIG)


def require_transformer(graph: Graph, needs: str, where: str | None = None) -> TransformerConfig:
    """The configuration of ``graph`` (:func:`transformer_of`). Raises InputError naming ``where``
    (the file or flag the workload came from; the workload's spec when None), what ``needs`` an LLM
    workload (``"a parallel configuration"``) and the workload given, when it is no LLM."""
    cfg = graph.meta.get(_CONFIG)
    if cfg is None:
        raise InputError(graph.spec if where is None else where, "",
                         f"{needs} needs an LLM workload (gpt, llama, moe or a preset such as llama3-70b), "
                         f"got {graph.spec}")
    return cfg


def build_transformer(cfg: TransformerConfig, *, spec: str = "") -> Graph:
    """The graph of ``cfg`` (checked) in its mode; :func:`transformer_of` gives ``cfg`` back."""
    b = GraphBuilder(cfg.name or cfg.family, batch=cfg.batch, dtype=cfg.dtype, spec=spec)
    if cfg.mode in ("forward", "train"):
        _forward(cfg, b)
    elif cfg.mode == "prefill":
        _prefill(cfg, b, Decoder(cfg, b), cfg.seq)
    elif cfg.mode == "decode":
        caches = _caches(cfg, b, cfg.context)
        ids = b.input("input_ids", c=1, h=1)
        _decode_step(cfg, b, Decoder(cfg, b), ids, caches, cfg.context)
    else:
        _serve(cfg, b)
    b.tags = {}
    graph = b.build()
    graph.meta[_CONFIG] = cfg
    return graph


def _forward(cfg: TransformerConfig, b: GraphBuilder) -> None:
    dec = Decoder(cfg, b)
    b.tags = {"layer": -1, "phase": "fwd"}
    ids = b.input("input_ids", c=1, h=cfg.seq)
    x = dec.embed(ids)
    for i in range(cfg.layers):
        x = dec.block(i, x)
    logits = dec.head(x)
    if cfg.training:
        b.tags = {"layer": cfg.layers, "phase": "fwd"}
        b.softmax("loss", logits, heads=1)
        b.annotate_last(fn="cross_entropy", **cross_entropy_op(cfg, backward=False))
        add_backward(b, cfg, "loss")


def _sample(b: GraphBuilder, name: str, logits: T) -> T:
    """The next token of each sequence (argmax over the vocabulary): ``(n, 1, 1, 1)`` ids."""
    return b.reshape(name, logits, shape=(logits.n, 1, 1, 1), what="sample")


def _prefill(cfg: TransformerConfig, b: GraphBuilder, dec: Decoder, tokens: int) -> T:
    b.tags = {"layer": -1, "phase": "fwd"}
    ids = b.input(dec.n("input_ids"), c=1, h=tokens)
    x = dec.embed(ids)
    for i in range(cfg.layers):
        x = dec.block(i, x, cache_write=True)
    logits = dec.head(x, last_token=True)
    return _sample(b, dec.n("sample"), logits)


def _caches(cfg: TransformerConfig, b: GraphBuilder, length: int) -> list[tuple[T, T]]:
    """Per block, the resident key and value caches ``(batch, kv_heads * head_dim, length, 1)``
    at the cache's element type (``kv_dtype``)."""
    feat = cfg.kv * cfg.d_head
    out = []
    for i in range(cfg.layers):
        b.tags = {"layer": i, "phase": "fwd"}
        out.append((b.input(f"layers.{i}.k_cache", c=feat, h=length, resident=True, dtype=cfg.cache_dtype),
                    b.input(f"layers.{i}.v_cache", c=feat, h=length, resident=True, dtype=cfg.cache_dtype)))
    return out


def _decode_step(cfg: TransformerConfig, b: GraphBuilder, dec: Decoder, ids: T, caches: list[tuple[T, T]],
                 length: int, after: list[tuple[str, ...]] | None = None) -> T:
    x = dec.embed(ids)
    for i in range(cfg.layers):
        x = dec.block(i, x, cache=caches[i], cache_len=length, cache_after=after[i] if after else ())
    logits = dec.head(x)
    return _sample(b, dec.n("sample"), logits)


def _serve(cfg: TransformerConfig, b: GraphBuilder) -> None:
    caches = _caches(cfg, b, cfg.prompt + cfg.generate)
    token = _prefill(cfg, b, Decoder(cfg, b, "prefill."), cfg.prompt)
    writes = [(f"prefill.layers.{i}.attn.kv_write",) for i in range(cfg.layers)]
    for step in range(1, cfg.generate + 1):
        dec = Decoder(cfg, b, f"decode.{step}.")
        token = _decode_step(cfg, b, dec, token, caches, cfg.prompt + step, writes if step == 1 else None)
    # one model: the decode steps read the prefill's weights ("decode.3.layers.0.attn.qkv" -> "prefill.layers...")
    b.share_weights(lambda name: "prefill." + name.split(".", 2)[2] if name.startswith("decode.") else None)
