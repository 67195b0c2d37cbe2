"""ResNet-50 as in torchvision (v1.5: the stride of a down-sampling bottleneck is in its 3x3 conv)."""

from __future__ import annotations

from ..builder import GraphBuilder, T
from ..graph import Graph
from ..registry import register
from ._common import new_builder, require

__all__ = ["resnet50"]

# (blocks, bottleneck width, stride of the first block) of layer1..layer4
_STAGES = ((3, 64, 1), (4, 128, 2), (6, 256, 2), (3, 512, 2))
_EXPANSION = 4


def _bottleneck(b: GraphBuilder, name: str, x: T, width: int, stride: int) -> T:
    out_channels = width * _EXPANSION
    y = b.conv(f"{name}.conv1", x, width, kernel=1, stride=1, pad=0)
    y = b.norm(f"{name}.bn1", y, norm="batch")
    y = b.eltwise(f"{name}.relu1", y, fn="relu")
    y = b.conv(f"{name}.conv2", y, width, kernel=3, stride=stride, pad=1)
    y = b.norm(f"{name}.bn2", y, norm="batch")
    y = b.eltwise(f"{name}.relu2", y, fn="relu")
    y = b.conv(f"{name}.conv3", y, out_channels, kernel=1, stride=1, pad=0)
    y = b.norm(f"{name}.bn3", y, norm="batch")
    identity = x
    if stride != 1 or x.c != out_channels:
        identity = b.conv(f"{name}.downsample.0", x, out_channels, kernel=1, stride=stride, pad=0)
        identity = b.norm(f"{name}.downsample.1", identity, norm="batch")
    y = b.eltwise(f"{name}.residual", y, identity, fn="add")
    return b.eltwise(f"{name}.relu3", y, fn="relu")


@register("resnet50", description="ResNet-50 v1.5 (torchvision), ImageNet classifier", batch=1, image=224,
          dtype="fp16")
def resnet50(batch: int = 1, image: int = 224, dtype: str = "fp16") -> Graph:
    """torchvision ``resnet50``: 53 convolutions and one fully connected layer, 4.089 GMACs per
    224x224 image (convs and ``fc``; 25.56 M parameters).

    Op names are torchvision's module names (``conv1``, ``layer1.0.conv1``,
    ``layer1.0.downsample.0``, ``fc``). The bottleneck's ReLU module is called three times; its
    calls are ``relu1``..``relu3`` and the residual addition is ``layerX.Y.residual``. Batch norms
    (``bn*``, ``downsample.1``), ReLUs, the max pool, the global average pool (``avgpool``) and
    ``flatten`` are ops with their bytes. Inputs of any size >= 32 px work (the global pool
    adapts)."""
    require(image >= 32, "image", f"expected an image size of at least 32 pixels, got {image}")
    b = new_builder("resnet50", batch=batch, dtype=dtype)
    x = b.input("input", c=3, h=image, w=image)
    x = b.conv("conv1", x, 64, kernel=7, stride=2, pad=3)
    x = b.norm("bn1", x, norm="batch")
    x = b.eltwise("relu", x, fn="relu")
    x = b.pool("maxpool", x, kernel=3, stride=2, pad=1, mode="max")
    for stage, (blocks, width, stride) in enumerate(_STAGES, start=1):
        for block in range(blocks):
            x = _bottleneck(b, f"layer{stage}.{block}", x, width, stride if block == 0 else 1)
    x = b.global_pool("avgpool", x, mode="avg")
    x = b.flatten("flatten", x)
    b.linear("fc", x, 1000, bias=True)
    return b.build()
