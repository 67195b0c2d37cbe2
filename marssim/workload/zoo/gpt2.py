"""GPT-2 small as in HuggingFace ``GPT2Model`` (the LM head optional)."""

from __future__ import annotations

from ..builder import GraphBuilder, T
from ..graph import Graph
from ..registry import register
from ._common import attention, new_builder, require

__all__ = ["gpt2"]

HIDDEN = 768
HEADS = 12
LAYERS = 12
VOCAB = 50257
MAX_POSITIONS = 1024


def _block(b: GraphBuilder, name: str, x: T) -> T:
    """One pre-LN GPT-2 block; ``attn.c_attn`` is one packed Q/K/V projection, split by three
    memory-only ops (each reads the packed tensor)."""
    n, hidden, seq, _ = x.shape
    y = b.norm(f"{name}.ln_1", x, norm="layer")
    qkv = b.linear(f"{name}.attn.c_attn", y, 3 * hidden)
    q, k, v = (b.reshape(f"{name}.attn.split.{part}", qkv, shape=(n, hidden, seq, 1), what="split")
               for part in "qkv")
    ctx = attention(b, f"{name}.attn", q, k, v, HEADS)
    y = b.linear(f"{name}.attn.c_proj", ctx, hidden)
    x = b.eltwise(f"{name}.attn.residual", y, x, fn="add")
    y = b.norm(f"{name}.ln_2", x, norm="layer")
    y = b.linear(f"{name}.mlp.c_fc", y, 4 * hidden)
    y = b.eltwise(f"{name}.mlp.act", y, fn="gelu")
    y = b.linear(f"{name}.mlp.c_proj", y, hidden)
    return b.eltwise(f"{name}.mlp.residual", y, x, fn="add")


@register("gpt2", description="GPT-2 small (HuggingFace GPT2Model, 12 layers, hidden 768), one forward pass",
          batch=1, seq=1024, lm_head=False, dtype="fp16")
def gpt2(batch: int = 1, seq: int = 1024, lm_head: bool = False, dtype: str = "fp16") -> Graph:
    """HuggingFace ``gpt2`` (small): token and position embeddings, 12 pre-LN blocks, ``ln_f``;
    one forward pass over ``seq`` tokens (a prefill).

    Counted MACs: per block ``attn.c_attn`` (768 -> 2304), ``attn.c_proj``, ``mlp.c_fc`` and
    ``mlp.c_proj`` (``12 * 768^2 * seq`` together) and both attention matmuls in full (Q K^T and
    P V, ``2 * seq^2 * 768``; the causal mask is applied in the softmax, no work is skipped):
    106.3 GMACs at seq 1024. ``lm_head=true`` adds the tied output projection ``lm_head``
    (``seq * 768 * 50257`` MACs; it shares ``wte``'s parameters but is counted with its own weights).

    Op names are HuggingFace's: ``wte``, ``h.0.ln_1``, ``h.0.attn.c_attn``, ``h.0.attn.c_proj``,
    ``h.0.mlp.c_fc``, ``h.0.mlp.act``, ``ln_f``. Added names: ``wpe`` (adds the 1024 x 768
    position table), ``h.0.attn.split.q/k/v``, ``h.0.attn.matmul_qk``, ``.softmax``,
    ``.matmul_pv``, ``h.0.attn.residual``, ``h.0.mlp.residual``."""
    require(1 <= seq <= MAX_POSITIONS, "seq", f"expected 1..{MAX_POSITIONS} tokens (the position table), got {seq}")
    b = new_builder("gpt2", batch=batch, dtype=dtype)
    ids = b.input("input_ids", c=1, h=seq)
    x = b.embedding("wte", ids, vocab=VOCAB, hidden=HIDDEN)
    x = b.eltwise("wpe", x, fn="add", weight_elems=MAX_POSITIONS * HIDDEN)
    for layer in range(LAYERS):
        x = _block(b, f"h.{layer}", x)
    x = b.norm("ln_f", x, norm="layer")
    if lm_head:
        b.linear("lm_head", x, VOCAB, bias=False)
    return b.build()
