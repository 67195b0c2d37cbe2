"""VGG-16 as in torchvision (configuration D, no batch norm)."""

from __future__ import annotations

from ..graph import Graph
from ..registry import register
from ._common import new_builder, require

__all__ = ["vgg16"]

_CONFIG_D = (64, 64, "M", 128, 128, "M", 256, 256, 256, "M", 512, 512, 512, "M", 512, 512, 512, "M")


@register("vgg16", description="VGG-16 (torchvision, configuration D), ImageNet classifier", batch=1, image=224,
          dtype="fp16")
def vgg16(batch: int = 1, image: int = 224, dtype: str = "fp16") -> Graph:
    """torchvision ``vgg16``: 13 convolutions and 3 fully connected layers, 15.47 GMACs per
    224x224 image (convs 15.35 G and classifier 0.12 G; 138.4 M parameters).

    Op names are torchvision's (``features.0`` conv, ``features.1`` ReLU, ``features.4`` max
    pool, ..., ``avgpool``, ``classifier.0``/``.3``/``.6`` linear, ``classifier.1``/``.4`` ReLU).
    Dropout is the identity at inference and is left out; ``flatten`` is an op. The adaptive 7x7
    average pool is modelled for images whose feature map (``image / 32``) is a multiple of 7 (224,
    448, ...); at 224 it is a 1x1 window that copies its input, as in torchvision."""
    require(image % 32 == 0 and (image // 32) % 7 == 0, "image",
            f"expected a multiple of 224 (the adaptive 7x7 pool needs a feature map of 7k x 7k), got {image}")
    b = new_builder("vgg16", batch=batch, dtype=dtype)
    x = b.input("input", c=3, h=image, w=image)
    index = 0
    for item in _CONFIG_D:
        if item == "M":
            x = b.pool(f"features.{index}", x, kernel=2, stride=2, mode="max")
            index += 1
        else:
            x = b.conv(f"features.{index}", x, int(item), kernel=3, stride=1, pad=1, bias=True)
            x = b.eltwise(f"features.{index + 1}", x, fn="relu")
            index += 2
    window = x.h // 7
    x = b.pool("avgpool", x, kernel=window, stride=window, mode="avg")
    x = b.flatten("flatten", x)
    x = b.linear("classifier.0", x, 4096)
    x = b.eltwise("classifier.1", x, fn="relu")
    x = b.linear("classifier.3", x, 4096)
    x = b.eltwise("classifier.4", x, fn="relu")
    b.linear("classifier.6", x, 1000)
    return b.build()
