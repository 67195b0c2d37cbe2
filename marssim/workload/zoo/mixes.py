"""Multi-model workloads: several models run at once, as in MARS's heterogeneous experiments.

Each is built with :func:`~marssim.workload.merge_graphs`: op names become ``model/op`` (e.g.
``resnet50/layer1.0.conv1``) and every op carries its model in ``Op.model``, so a mapping can
assign ``model:resnet50`` to a set of accelerators. The models share no tensors; their MACs add up.
"""

from __future__ import annotations

from ..graph import Graph, merge_graphs
from ..registry import register
from .bert import bert_base
from .gpt2 import gpt2
from .mobilenet import mobilenetv2
from .resnet import resnet50
from .vgg import vgg16
from .vit import vit_b16

__all__ = ["mix_vision", "mix_nlp_vision", "mix_transformers"]


@register("mix-vision", description="resnet50 + mobilenetv2 + vgg16 at once (heterogeneous CNNs)",
          multi_model=True, batch=1, image=224, dtype="fp16")
def mix_vision(batch: int = 1, image: int = 224, dtype: str = "fp16") -> Graph:
    """ResNet-50, MobileNetV2 and VGG-16, each at ``batch`` images of ``image`` pixels:
    4.089 + 0.301 + 15.47 = 19.86 GMACs at batch 1, 224."""
    parts = (resnet50(batch=batch, image=image, dtype=dtype), mobilenetv2(batch=batch, image=image, dtype=dtype),
             vgg16(batch=batch, image=image, dtype=dtype))
    return merge_graphs("mix-vision", parts)


@register("mix-nlp-vision", description="bert-base + resnet50 at once (a language and a vision model)",
          multi_model=True, batch=1, seq=128, image=224, dtype="fp16")
def mix_nlp_vision(batch: int = 1, seq: int = 128, image: int = 224, dtype: str = "fp16") -> Graph:
    """BERT-base (``seq`` tokens) and ResNet-50 (``image`` pixels), each at ``batch`` samples:
    11.17 + 4.089 = 15.26 GMACs at batch 1, seq 128, 224."""
    parts = (bert_base(batch=batch, seq=seq, dtype=dtype), resnet50(batch=batch, image=image, dtype=dtype))
    return merge_graphs("mix-nlp-vision", parts)


@register("mix-transformers", description="bert-base + vit-b16 + gpt2 at once (three Transformers)",
          multi_model=True, batch=1, seq=128, image=224, dtype="fp16")
def mix_transformers(batch: int = 1, seq: int = 128, image: int = 224, dtype: str = "fp16") -> Graph:
    """BERT-base and GPT-2 small over ``seq`` tokens and ViT-B/16 on ``image`` pixels, each at
    ``batch`` samples: 11.17 + 17.56 + 11.17 = 39.91 GMACs at batch 1, seq 128, 224."""
    parts = (bert_base(batch=batch, seq=seq, dtype=dtype), vit_b16(batch=batch, image=image, dtype=dtype),
             gpt2(batch=batch, seq=seq, dtype=dtype))
    return merge_graphs("mix-transformers", parts)
