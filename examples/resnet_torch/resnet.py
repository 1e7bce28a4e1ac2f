"""ResNet-18 (He et al., "Deep Residual Learning for Image Recognition", 2015) in PyTorch, with
torchvision's module layout and ``state_dict`` names (``torchvision.models.resnet18``):
``conv1``, ``bn1``, ``layer1.0.conv1`` ... ``layer4.1.bn2``, ``layer2.0.downsample.0/1``, ``fc``.

Defined here rather than imported from torchvision because no torchvision wheel that this
project's environment can install imports beside the torch 2.13.0 CPU build: PyPI's
torchvision 0.28.0 (the release for torch 2.13) is a CUDA build whose ``_C.so`` links
``libtorch_cuda.so`` (``import torchvision`` fails: "operator torchvision::nms does not
exist"), and the CPU wheels live on download.pytorch.org (docs/bundles.md, PyTorch). A
torchvision ``resnet18`` checkpoint loads into :func:`resnet18` with ``load_state_dict``.
"""

from __future__ import annotations

import torch
from torch import nn


class BasicBlock(nn.Module):
    """Two 3x3 convolutions with batch norm and a residual connection (torchvision's)."""

    expansion = 1

    def __init__(self, inplanes: int, planes: int, stride: int = 1) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(inplanes, planes, 3, stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = nn.Conv2d(planes, planes, 3, 1, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.downsample: nn.Module | None = None
        if stride != 1 or inplanes != planes:
            self.downsample = nn.Sequential(
                nn.Conv2d(inplanes, planes, 1, stride, bias=False), nn.BatchNorm2d(planes)
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return self.relu(out + identity)


class ResNet(nn.Module):
    """Stem, four stages of :class:`BasicBlock`, global average pool, linear classifier.

    Input f32 ``[n, 3, h, w]`` (NCHW, 224x224 for ImageNet); output f32 ``[n, num_classes]``
    logits.
    """

    def __init__(self, layers: tuple[int, int, int, int], num_classes: int = 1000) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 64, 7, 2, padding=3, bias=False)
        self.bn1 = nn.BatchNorm2d(64)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(3, 2, padding=1)
        widths = (64, 128, 256, 512)
        inplanes = 64
        for i, (planes, blocks) in enumerate(zip(widths, layers, strict=True)):
            stride = 1 if i == 0 else 2
            stage = [BasicBlock(inplanes, planes, stride)]
            stage += [BasicBlock(planes, planes) for _ in range(blocks - 1)]
            setattr(self, f"layer{i + 1}", nn.Sequential(*stage))
            inplanes = planes
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.fc = nn.Linear(512, num_classes)
        for m in self.modules():  # torchvision's initialization
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
            elif isinstance(m, nn.BatchNorm2d):
                nn.init.constant_(m.weight, 1)
                nn.init.constant_(m.bias, 0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(torch.flatten(self.avgpool(x), 1))


def resnet18(num_classes: int = 1000) -> ResNet:
    """ResNet-18: two :class:`BasicBlock` per stage, 11.7 M parameters (torchvision's)."""
    return ResNet((2, 2, 2, 2), num_classes)
