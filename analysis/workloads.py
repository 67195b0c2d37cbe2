"""Workloads for the trace benchmarks and figures: the zoo's ResNet-50 when it is registered,
else the same network built here layer by layer (torchvision ResNet-50 v1.5: 53 convolutions,
each followed by batch norm, ReLUs, 16 residual additions, max and average pooling, one FC)."""

from __future__ import annotations

from marssim.workload.builder import GraphBuilder
from marssim.workload.graph import Graph


def resnet50(batch: int = 8) -> Graph:
    """ResNet-50 at ``batch`` (the zoo's if available)."""
    try:
        from marssim.workload import load_workload

        return load_workload(f"resnet50:batch={batch}")
    except Exception:  # zoo not available in this checkout
        return build_resnet50(batch)


def build_resnet50(batch: int = 8) -> Graph:
    """ResNet-50 v1.5 (stride in the 3x3 convolution of each bottleneck) at 224x224."""
    b = GraphBuilder("resnet50", batch=batch, spec=f"resnet50:batch={batch}")
    x = b.input("image", c=3, h=224, w=224)
    x = b.conv("conv1", x, out_channels=64, kernel=7, stride=2, pad=3)
    x = b.norm("bn1", x)
    x = b.eltwise("relu1", x, fn="relu")
    x = b.pool("maxpool", x, kernel=3, stride=2, pad=1)
    for stage, (width, blocks, stride) in enumerate([(64, 3, 1), (128, 4, 2), (256, 6, 2), (512, 3, 2)], start=1):
        for i in range(blocks):
            p = f"layer{stage}.{i}"
            s = stride if i == 0 else 1
            y = b.conv(f"{p}.conv1", x, out_channels=width, kernel=1)
            y = b.eltwise(f"{p}.relu1", b.norm(f"{p}.bn1", y), fn="relu")
            y = b.conv(f"{p}.conv2", y, out_channels=width, kernel=3, stride=s, pad=1)
            y = b.eltwise(f"{p}.relu2", b.norm(f"{p}.bn2", y), fn="relu")
            y = b.norm(f"{p}.bn3", b.conv(f"{p}.conv3", y, out_channels=4 * width, kernel=1))
            if i == 0:
                x = b.norm(f"{p}.downsample.bn", b.conv(f"{p}.downsample.conv", x, out_channels=4 * width,
                                                          kernel=1, stride=s))
            x = b.eltwise(f"{p}.relu3", b.eltwise(f"{p}.add", y, x, fn="add"), fn="relu")
    x = b.global_pool("avgpool", x)
    x = b.flatten("flatten", x)
    x = b.linear("fc", x, 1000)
    return b.build()
