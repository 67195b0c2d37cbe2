"""MobileNetV2 as in torchvision (width multiplier 1.0)."""

from __future__ import annotations

from ..builder import GraphBuilder, T
from ..graph import Graph
from ..registry import register
from ._common import new_builder, require

__all__ = ["mobilenetv2"]

# (expansion t, output channels c, repeats n, stride of the first repeat s)
_SETTINGS = ((1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1), (6, 160, 3, 2),
             (6, 320, 1, 1))


def _conv_bn_relu6(b: GraphBuilder, name: str, x: T, out_channels: int, kernel: int, stride: int,
                   groups: int = 1) -> T:
    """torchvision ``Conv2dNormActivation``: ``{name}.0`` conv, ``{name}.1`` BN, ``{name}.2`` ReLU6."""
    x = b.conv(f"{name}.0", x, out_channels, kernel=kernel, stride=stride, pad=(kernel - 1) // 2, groups=groups)
    x = b.norm(f"{name}.1", x, norm="batch")
    return b.eltwise(f"{name}.2", x, fn="relu6")


def _inverted_residual(b: GraphBuilder, name: str, x: T, out_channels: int, stride: int, expand: int) -> T:
    hidden = x.c * expand
    y = x
    layer = 0
    if expand != 1:
        y = _conv_bn_relu6(b, f"{name}.conv.{layer}", y, hidden, kernel=1, stride=1)
        layer += 1
    y = _conv_bn_relu6(b, f"{name}.conv.{layer}", y, hidden, kernel=3, stride=stride, groups=hidden)
    y = b.conv(f"{name}.conv.{layer + 1}", y, out_channels, kernel=1, stride=1, pad=0)
    y = b.norm(f"{name}.conv.{layer + 2}", y, norm="batch")
    if stride == 1 and x.c == out_channels:
        y = b.eltwise(f"{name}.residual", x, y, fn="add")
    return y


@register("mobilenetv2", description="MobileNetV2 (torchvision, width 1.0), ImageNet classifier", batch=1,
          image=224, dtype="fp16")
def mobilenetv2(batch: int = 1, image: int = 224, dtype: str = "fp16") -> Graph:
    """torchvision ``mobilenet_v2``: 52 convolutions (17 of them depthwise 3x3) and one fully
    connected layer, 0.301 GMACs per 224x224 image (convs and ``classifier.1``; 3.50 M
    parameters).

    Op names are torchvision's: ``features.0.0`` (conv), ``.1`` (BN), ``.2`` (ReLU6);
    ``features.k.conv.0.0`` (expansion conv), ``features.k.conv.1.0`` (depthwise conv),
    ``features.k.conv.2`` (projection conv), ``features.k.conv.3`` (BN); ``features.18.0``;
    ``classifier.1``. Residual additions are ``features.k.residual``; the functional global average
    pool and flatten are ``avgpool`` and ``flatten``; dropout (identity at inference) is left out."""
    require(image >= 32, "image", f"expected an image size of at least 32 pixels, got {image}")
    b = new_builder("mobilenetv2", batch=batch, dtype=dtype)
    x = b.input("input", c=3, h=image, w=image)
    x = _conv_bn_relu6(b, "features.0", x, 32, kernel=3, stride=2)
    index = 1
    for expand, channels, repeats, stride in _SETTINGS:
        for i in range(repeats):
            x = _inverted_residual(b, f"features.{index}", x, channels, stride if i == 0 else 1, expand)
            index += 1
    x = _conv_bn_relu6(b, f"features.{index}", x, 1280, kernel=1, stride=1)
    x = b.global_pool("avgpool", x, mode="avg")
    x = b.flatten("flatten", x)
    b.linear("classifier.1", x, 1000)
    return b.build()
