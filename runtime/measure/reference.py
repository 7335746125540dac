"""Plain-torch copies of the architectures whose GPU profiles are derived from
published figures (``datasets/profiles/derived/``), as profiler factories
(``thrifty profile thrifty.runtime.measure.reference:resnet50``), so that a
profile measured on a GPU can be set beside the derived profile of that GPU
model by model (``benchmarks/gpu_check.sh``).

Each factory builds the torchvision architecture of the same name layer for
layer, with torchvision's module names (``layer4.2.conv3``, ``features.0``,
``classifier.6``), the parameter totals that
``datasets/scripts/derive_profiles.py`` checks against the published counts,
and its inputs: 3x224x224 images, 1000 classes, FP32. torchvision itself is
not needed (it is not a dependency of thrifty, and its wheel must match the
installed torch build exactly).

`make_batch(batch)` draws, from a seeded generator, which of a few fixed
random images (and their fixed labels) make up the batch: a batch's content
costs one gather, not a fresh draw of 150,528 normal samples per image, so
that the largest-batch search and the sweep's large batches spend their time
on the GPU and not on drawing inputs with one CPU thread. The task is
learnable (each image has one label). Weights are drawn from ``seed`` with
torch's default initialisation, leaving torch's global random state as it was.

This module imports torch at the top: import it only from code that needs torch.
"""

from __future__ import annotations

from collections.abc import Callable

from thrifty.core.optional import require

torch = require("torch", "torch")
from torch import Tensor, nn  # noqa: E402 - after `require` has said how to install torch

from thrifty.runtime.measure.zoo import Workload, _seeded_module  # noqa: E402

__all__ = ["resnet18", "resnet50", "alexnet", "vgg16", "ImageBatches", "FACTORIES", "IMAGE_SIZE", "IMAGE_CLASSES"]

IMAGE_SIZE = 224
IMAGE_CLASSES = 1000
DISTINCT_IMAGES = 8  # the fixed images a batch is drawn from


class ImageBatches:
    """A seeded stream of batches of 3x`size`x`size` images drawn from
    `distinct` fixed random images, each with a fixed label in ``[0, classes)``."""

    def __init__(self, seed: int, size: int = IMAGE_SIZE, classes: int = IMAGE_CLASSES,
                 distinct: int = DISTINCT_IMAGES):
        fixed = torch.Generator().manual_seed(seed)
        self._images = torch.randn(distinct, 3, size, size, generator=fixed)
        self._labels = torch.randint(0, classes, (distinct,), generator=fixed)
        self._generator = torch.Generator().manual_seed(seed + 1)

    def __call__(self, batch: int) -> tuple[Tensor, Tensor]:
        if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
            raise ValueError(f"batch is {batch!r}, but must be a positive integer")
        picks = torch.randint(0, len(self._labels), (batch,), generator=self._generator)
        return self._images[picks], self._labels[picks]


def _workload(seed: int, build: Callable[[], nn.Module]) -> Workload:
    return Workload(_seeded_module(seed, build), ImageBatches(seed + 1), nn.CrossEntropyLoss())


# --- ResNet (torchvision's, v1.5: the stride of a bottleneck is on its 3x3 convolution) ---------


def _conv3x3(c_in: int, c_out: int, stride: int = 1) -> nn.Conv2d:
    return nn.Conv2d(c_in, c_out, 3, stride=stride, padding=1, bias=False)


def _conv1x1(c_in: int, c_out: int, stride: int = 1) -> nn.Conv2d:
    return nn.Conv2d(c_in, c_out, 1, stride=stride, bias=False)


class BasicBlock(nn.Module):
    expansion = 1

    def __init__(self, c_in: int, planes: int, stride: int, downsample: nn.Module | None):
        super().__init__()
        self.conv1 = _conv3x3(c_in, planes, stride)
        self.bn1 = nn.BatchNorm2d(planes)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = _conv3x3(planes, planes)
        self.bn2 = nn.BatchNorm2d(planes)
        self.downsample = downsample

    def forward(self, x: Tensor) -> Tensor:
        identity = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return self.relu(out + identity)


class Bottleneck(nn.Module):
    expansion = 4

    def __init__(self, c_in: int, planes: int, stride: int, downsample: nn.Module | None):
        super().__init__()
        self.conv1 = _conv1x1(c_in, planes)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = _conv3x3(planes, planes, stride)
        self.bn2 = nn.BatchNorm2d(planes)
        self.conv3 = _conv1x1(planes, planes * self.expansion)
        self.bn3 = nn.BatchNorm2d(planes * self.expansion)
        self.relu = nn.ReLU(inplace=True)
        self.downsample = downsample

    def forward(self, x: Tensor) -> Tensor:
        identity = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        return self.relu(out + identity)


class ResNet(nn.Module):
    """torchvision.models.ResNet: a 7x7 stem, four stages of blocks, global
    average pooling and a linear classifier."""

    def __init__(self, block: type[BasicBlock] | type[Bottleneck], depths: tuple[int, int, int, int],
                 classes: int = IMAGE_CLASSES):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 64, 7, stride=2, padding=3, bias=False)
        self.bn1 = nn.BatchNorm2d(64)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(3, stride=2, padding=1)
        c_in = 64
        stages = []
        for i, (planes, depth) in enumerate(zip((64, 128, 256, 512), depths)):
            stride = 1 if i == 0 else 2
            downsample = None
            if stride != 1 or c_in != planes * block.expansion:
                downsample = nn.Sequential(_conv1x1(c_in, planes * block.expansion, stride),
                                           nn.BatchNorm2d(planes * block.expansion))
            blocks: list[nn.Module] = [block(c_in, planes, stride, downsample)]
            c_in = planes * block.expansion
            blocks += [block(c_in, planes, 1, None) for _ in range(1, depth)]
            stages.append(nn.Sequential(*blocks))
        self.layer1, self.layer2, self.layer3, self.layer4 = stages
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.fc = nn.Linear(c_in, classes)

    def forward(self, x: Tensor) -> Tensor:
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(torch.flatten(self.avgpool(x), 1))


def resnet18(seed: int = 0) -> Workload:
    """ResNet-18 (11,689,512 parameters) on 3x224x224 images, 1000 classes."""
    return _workload(seed, lambda: ResNet(BasicBlock, (2, 2, 2, 2)))


def resnet50(seed: int = 0) -> Workload:
    """ResNet-50 v1.5 (25,557,032 parameters) on 3x224x224 images, 1000 classes."""
    return _workload(seed, lambda: ResNet(Bottleneck, (3, 4, 6, 3)))


# --- AlexNet and VGG-16 (torchvision's) ------------------------------------------------------


class AlexNet(nn.Module):
    """torchvision.models.AlexNet: five convolutions, adaptive pooling to 6x6,
    three linear layers with dropout."""

    def __init__(self, classes: int = IMAGE_CLASSES):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 64, 11, stride=4, padding=2), nn.ReLU(inplace=True), nn.MaxPool2d(3, stride=2),
            nn.Conv2d(64, 192, 5, padding=2), nn.ReLU(inplace=True), nn.MaxPool2d(3, stride=2),
            nn.Conv2d(192, 384, 3, padding=1), nn.ReLU(inplace=True),
            nn.Conv2d(384, 256, 3, padding=1), nn.ReLU(inplace=True),
            nn.Conv2d(256, 256, 3, padding=1), nn.ReLU(inplace=True), nn.MaxPool2d(3, stride=2),
        )
        self.avgpool = nn.AdaptiveAvgPool2d((6, 6))
        self.classifier = nn.Sequential(
            nn.Dropout(0.5), nn.Linear(256 * 6 * 6, 4096), nn.ReLU(inplace=True),
            nn.Dropout(0.5), nn.Linear(4096, 4096), nn.ReLU(inplace=True),
            nn.Linear(4096, classes),
        )

    def forward(self, x: Tensor) -> Tensor:
        return self.classifier(torch.flatten(self.avgpool(self.features(x)), 1))


VGG16_LAYERS = (64, 64, "M", 128, 128, "M", 256, 256, 256, "M", 512, 512, 512, "M", 512, 512, 512, "M")


class VGG(nn.Module):
    """torchvision.models.VGG without batch norm: 3x3 convolutions and
    max-pooling as `layers` says, adaptive pooling to 7x7, three linear layers."""

    def __init__(self, layers: tuple[int | str, ...], classes: int = IMAGE_CLASSES):
        super().__init__()
        features: list[nn.Module] = []
        c_in = 3
        for width in layers:
            if width == "M":
                features.append(nn.MaxPool2d(2, stride=2))
            else:
                assert isinstance(width, int)
                features += [nn.Conv2d(c_in, width, 3, padding=1), nn.ReLU(inplace=True)]
                c_in = width
        self.features = nn.Sequential(*features)
        self.avgpool = nn.AdaptiveAvgPool2d((7, 7))
        self.classifier = nn.Sequential(
            nn.Linear(512 * 7 * 7, 4096), nn.ReLU(inplace=True), nn.Dropout(0.5),
            nn.Linear(4096, 4096), nn.ReLU(inplace=True), nn.Dropout(0.5),
            nn.Linear(4096, classes),
        )

    def forward(self, x: Tensor) -> Tensor:
        return self.classifier(torch.flatten(self.avgpool(self.features(x)), 1))


def alexnet(seed: int = 0) -> Workload:
    """AlexNet (61,100,840 parameters) on 3x224x224 images, 1000 classes."""
    return _workload(seed, AlexNet)


def vgg16(seed: int = 0) -> Workload:
    """VGG-16 (138,357,544 parameters) on 3x224x224 images, 1000 classes."""
    return _workload(seed, lambda: VGG(VGG16_LAYERS))


FACTORIES: dict[str, Callable[..., Workload]] = {
    "resnet18": resnet18,
    "resnet50": resnet50,
    "alexnet": alexnet,
    "vgg16": vgg16,
}
"""The reference models by profile name (the names of the derived profiles)."""
