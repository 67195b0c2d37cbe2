"""ViT-B/16 as in HuggingFace ``ViTForImageClassification`` (``google/vit-base-patch16-224``)."""

from __future__ import annotations

from ..builder import GraphBuilder, T
from ..graph import Graph
from ..registry import register
from ._common import attention, new_builder, require

__all__ = ["vit_b16"]

HIDDEN = 768
HEADS = 12
LAYERS = 12
INTERMEDIATE = 3072
PATCH = 16
CLASSES = 1000


def _layer(b: GraphBuilder, name: str, x: T) -> T:
    """One pre-LN ``ViTLayer``; dropout (identity) left out."""
    y = b.norm(f"{name}.layernorm_before", x, norm="layer")
    prefix = f"{name}.attention.attention"
    q = b.linear(f"{prefix}.query", y, HIDDEN)
    k = b.linear(f"{prefix}.key", y, HIDDEN)
    v = b.linear(f"{prefix}.value", y, HIDDEN)
    ctx = attention(b, prefix, q, k, v, HEADS)
    y = b.linear(f"{name}.attention.output.dense", ctx, HIDDEN)
    x = b.eltwise(f"{name}.attention.residual", y, x, fn="add")
    y = b.norm(f"{name}.layernorm_after", x, norm="layer")
    y = b.linear(f"{name}.intermediate.dense", y, INTERMEDIATE)
    y = b.eltwise(f"{name}.intermediate.intermediate_act_fn", y, fn="gelu")
    y = b.linear(f"{name}.output.dense", y, HIDDEN)
    return b.eltwise(f"{name}.output.residual", y, x, fn="add")


@register("vit-b16", description="ViT-B/16 (HuggingFace ViTForImageClassification), ImageNet classifier",
          batch=1, image=224, dtype="fp16")
def vit_b16(batch: int = 1, image: int = 224, dtype: str = "fp16") -> Graph:
    """ViT-Base with 16x16 patches: a patch-embedding conv, 12 pre-LN encoder layers over
    ``(image/16)^2 + 1`` tokens (197 at 224, the class token included) and the classification head.

    Counted MACs: the patch embedding conv (768 x 3 x 16 x 16 per patch), per layer the six linear
    layers (``12 * 768^2 * tokens``) and both attention matmuls (Q K^T and P V,
    ``2 * tokens^2 * 768``), and ``classifier`` (768 -> 1000 on the class token): 17.56 GMACs at 224.

    Op names are HuggingFace's without the ``vit.`` prefix: ``embeddings.patch_embeddings.projection``,
    ``encoder.layer.0.layernorm_before``, ``encoder.layer.0.attention.attention.query``,
    ``encoder.layer.0.attention.output.dense``, ``encoder.layer.0.intermediate.dense``,
    ``encoder.layer.0.output.dense``, ``layernorm``, ``classifier``. Added names:
    ``embeddings.patch_embeddings.flatten`` (patches to tokens), ``embeddings.cls_token`` (concatenates
    the learned class token), ``embeddings.position_embeddings`` (adds the position table),
    ``...attention.attention.matmul_qk``/``.softmax``/``.matmul_pv``, ``...attention.residual``,
    ``...output.residual`` and ``select_cls_token`` (the class token fed to the head)."""
    require(image >= PATCH and image % PATCH == 0, "image", f"expected a multiple of {PATCH} pixels, got {image}")
    b = new_builder("vit-b16", batch=batch, dtype=dtype)
    x = b.input("pixel_values", c=3, h=image, w=image)
    x = b.conv("embeddings.patch_embeddings.projection", x, HIDDEN, kernel=PATCH, stride=PATCH, pad=0, bias=True)
    n, _, rows, cols = x.shape
    patches = rows * cols
    x = b.reshape("embeddings.patch_embeddings.flatten", x, shape=(n, HIDDEN, patches, 1), what="flatten")
    x = b.reshape("embeddings.cls_token", x, shape=(n, HIDDEN, patches + 1, 1), what="concat", weight_elems=HIDDEN)
    x = b.eltwise("embeddings.position_embeddings", x, fn="add", weight_elems=(patches + 1) * HIDDEN)
    for layer in range(LAYERS):
        x = _layer(b, f"encoder.layer.{layer}", x)
    x = b.norm("layernorm", x, norm="layer")
    x = b.reshape("select_cls_token", x, shape=(n, HIDDEN, 1, 1), what="slice")
    b.linear("classifier", x, CLASSES)
    return b.build()
