"""A MobileNet-style CNN as a user writes one: depthwise-separable blocks with BatchNorm and ReLU6.

Not from ``examples/``: MobileNetV1's layout (a strided 3x3 stem, then depthwise 3x3 + pointwise
1x1 pairs, each followed by BatchNorm and ReLU6), an inverted-residual block with a skip Add,
global average pooling and a linear classifier. Weights and BatchNorm statistics are seeded and
non-trivial (running means / variances away from 0 / 1), so folding BatchNorm changes the weights.
"""

from __future__ import annotations

import numpy as np

#: (output channels, stride) of each depthwise-separable block after the 32-channel stem.
_BLOCKS = ((64, 1), (128, 2), (128, 1), (256, 2), (256, 1), (512, 2), (512, 1), (1024, 2))


def mobilenet(classes: int = 10, width: float = 0.5, size: int = 160, seed: int = 0):  # type: ignore[no-untyped-def]
    """The CNN in eval mode (an ``nn.Module`` taking ``image`` [batch, 3, size, size])."""
    import torch
    from torch import nn

    def conv_bn(cin: int, cout: int, kernel: int, stride: int, groups: int = 1) -> list[nn.Module]:
        conv = nn.Conv2d(cin, cout, kernel, stride, kernel // 2, groups=groups, bias=False)
        return [conv, nn.BatchNorm2d(cout), nn.ReLU6(inplace=True)]

    class InvertedResidual(nn.Module):
        """MobileNetV2's block: expand 1x1, depthwise 3x3, project 1x1 (no activation), plus the input."""

        def __init__(self, channels: int, expand: int = 4) -> None:
            super().__init__()
            hidden = channels * expand
            self.body = nn.Sequential(
                *conv_bn(channels, hidden, 1, 1),
                *conv_bn(hidden, hidden, 3, 1, groups=hidden),
                nn.Conv2d(hidden, channels, 1, bias=False),
                nn.BatchNorm2d(channels),
            )

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x + self.body(x)

    class MobileNet(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            c = int(32 * width)
            layers: list[nn.Module] = conv_bn(3, c, 3, 2)
            for i, (out, stride) in enumerate(_BLOCKS):
                out = int(out * width)
                layers += conv_bn(c, c, 3, stride, groups=c) + conv_bn(c, out, 1, 1)
                c = out
                if i == 2:
                    layers.append(InvertedResidual(c))
            self.features = nn.Sequential(*layers)
            self.classifier = nn.Linear(c, classes)

        def forward(self, image: torch.Tensor) -> torch.Tensor:
            return self.classifier(self.features(image).mean(dim=(2, 3)))

    torch.manual_seed(seed)
    model = MobileNet()
    for module in model.modules():
        if isinstance(module, nn.Conv2d):  # He init keeps the signal alive through 20 layers
            nn.init.kaiming_normal_(module.weight, mode="fan_in", nonlinearity="relu")
        elif isinstance(module, nn.BatchNorm2d):
            module.running_mean.uniform_(-0.2, 0.2)
            module.running_var.uniform_(0.5, 2.0)
            module.weight.data.uniform_(0.5, 1.5)
            module.bias.data.uniform_(-0.2, 0.2)
    # As training leaves it: a head that tells the classes of the data apart (each class's mean pooled
    # feature, centred: nearest class mean); a random head picks one class for every input.
    data, labels = _images_and_labels(16 * classes, seed + 1_000, size, classes)
    with torch.no_grad():
        pooled = model.features(torch.from_numpy(data[:, 0])).mean(dim=(2, 3))
        centre = pooled.mean(0)
        means = torch.stack([pooled[torch.from_numpy(labels == k)].mean(0) - centre for k in range(classes)])
        weight = means / means.norm(dim=1, keepdim=True) * (4.0 / (pooled - centre).std())
        model.classifier.weight.copy_(weight)
        model.classifier.bias.copy_(-weight @ centre)
    return model


def images(count: int, seed: int, size: int = 160, classes: int = 10) -> np.ndarray:
    """A stack of ``count`` seeded inputs [count, 1, 3, size, size] (a calibration / evaluation set)."""
    return _images_and_labels(count, seed, size, classes)[0]


def _images_and_labels(count: int, seed: int, size: int, classes: int) -> tuple[np.ndarray, np.ndarray]:
    """Images of ``classes`` kinds, and their kinds: a class's 8x8 template (fixed), varied, upsampled.

    Each image is its class template plus its own coarse variation, under a per-image colour gain
    and offset, plus pixel noise: classes a classifier can tell apart, as a trained one's data is.
    """
    templates = np.random.default_rng(12345).standard_normal((classes, 3, 8, 8))
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, classes, count)
    coarse = (templates[labels] + 0.2 * rng.standard_normal((count, 3, 8, 8)))[:, None]
    smooth = np.repeat(np.repeat(coarse, -(-size // 8), axis=3), -(-size // 8), axis=4)[..., :size, :size]
    gain = rng.uniform(0.9, 1.1, (count, 1, 3, 1, 1))
    offset = rng.normal(0.0, 0.05, (count, 1, 3, 1, 1))
    return (gain * smooth + offset + 0.1 * rng.standard_normal(smooth.shape)).astype(np.float32), labels
