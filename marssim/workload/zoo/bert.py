"""BERT-base encoder as in HuggingFace ``BertModel`` (uncased vocabulary)."""

from __future__ import annotations

from ..builder import GraphBuilder, T
from ..graph import Graph
from ..registry import register
from ._common import attention, new_builder, require

__all__ = ["bert_base", "bert_encoder_layer"]

HIDDEN = 768
HEADS = 12
LAYERS = 12
INTERMEDIATE = 3072
VOCAB = 30522
MAX_POSITIONS = 512
TYPE_VOCAB = 2


def bert_encoder_layer(b: GraphBuilder, name: str, x: T, heads: int = HEADS, intermediate: int = INTERMEDIATE) -> T:
    """One post-LN ``BertLayer`` on tokens ``(n, hidden, seq, 1)``; dropout (identity) left out."""
    hidden = x.c
    prefix = f"{name}.attention"
    q = b.linear(f"{prefix}.self.query", x, hidden)
    k = b.linear(f"{prefix}.self.key", x, hidden)
    v = b.linear(f"{prefix}.self.value", x, hidden)
    ctx = attention(b, f"{prefix}.self", q, k, v, heads)
    y = b.linear(f"{prefix}.output.dense", ctx, hidden)
    y = b.eltwise(f"{prefix}.output.residual", y, x, fn="add")
    x = b.norm(f"{prefix}.output.LayerNorm", y, norm="layer")
    y = b.linear(f"{name}.intermediate.dense", x, intermediate)
    y = b.eltwise(f"{name}.intermediate.intermediate_act_fn", y, fn="gelu")
    y = b.linear(f"{name}.output.dense", y, hidden)
    y = b.eltwise(f"{name}.output.residual", y, x, fn="add")
    return b.norm(f"{name}.output.LayerNorm", y, norm="layer")


@register("bert-base", description="BERT-base encoder (HuggingFace BertModel, 12 layers, hidden 768)", batch=1,
          seq=128, dtype="fp16")
def bert_base(batch: int = 1, seq: int = 128, dtype: str = "fp16") -> Graph:
    """HuggingFace ``bert-base-uncased`` encoder: embeddings and 12 layers, no pooler or task head.

    Counted MACs: per layer the six linear layers (query, key, value, attention output, intermediate,
    output: ``12 * 768^2 * seq``) and both attention matmuls (Q K^T and P V: ``2 * seq^2 * 768``):
    11.17 GMACs at seq 128, 48.32 at seq 512. Embedding lookups, additions, layer norms, softmax and
    GELU are ops with their bytes but no MACs.

    Op names are HuggingFace's module names without a model prefix: ``embeddings.word_embeddings``,
    ``encoder.layer.0.attention.self.query``, ``encoder.layer.0.intermediate.dense``,
    ``encoder.layer.0.output.LayerNorm``. Added names: ``...attention.self.matmul_qk``,
    ``.softmax`` (scale and mask folded in), ``.matmul_pv``, ``...output.residual``; inputs are
    ``input_ids`` and ``token_type_ids``; ``embeddings.add`` sums word and token-type embeddings and
    ``embeddings.position_embeddings`` adds the position table (512 x 768 parameters)."""
    require(1 <= seq <= MAX_POSITIONS, "seq", f"expected 1..{MAX_POSITIONS} tokens (the position table), got {seq}")
    b = new_builder("bert-base", batch=batch, dtype=dtype)
    ids = b.input("input_ids", c=1, h=seq)
    types = b.input("token_type_ids", c=1, h=seq)
    words = b.embedding("embeddings.word_embeddings", ids, vocab=VOCAB, hidden=HIDDEN)
    type_emb = b.embedding("embeddings.token_type_embeddings", types, vocab=TYPE_VOCAB, hidden=HIDDEN)
    x = b.eltwise("embeddings.add", words, type_emb, fn="add")
    x = b.eltwise("embeddings.position_embeddings", x, fn="add", weight_elems=MAX_POSITIONS * HIDDEN)
    x = b.norm("embeddings.LayerNorm", x, norm="layer")
    for layer in range(LAYERS):
        x = bert_encoder_layer(b, f"encoder.layer.{layer}", x)
    return b.build()
