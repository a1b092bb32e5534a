"""A ResNet-18-style CNN (widths 32-256, 224x224, ~3.1 M parameters) with random weights.

The CNN figure of issue 6: four stages of two basic blocks each, stride-2 downsampling with
1x1 projection shortcuts, a 7x7 stride-2 stem and 3x3 max pooling, BatchNorm present (the
exporter folds it into the convolutions). Follows aotforge's model-file convention.
"""

from __future__ import annotations

import torch
from torch import nn

OUTPUT_NAMES = ["logits"]
WIDTHS = (32, 64, 128, 256)


class Block(nn.Module):
    """Basic residual block: two 3x3 convs, a 1x1 projection when the shape changes."""

    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.skip = nn.Sequential()
        if stride != 1 or cin != cout:
            self.skip = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(self.bn1(self.conv1(x)))
        return torch.relu(self.bn2(self.conv2(y)) + self.skip(x))


class ResNet18Style(nn.Module):
    def __init__(self, widths: tuple[int, ...] = WIDTHS, classes: int = 1000) -> None:
        super().__init__()
        self.stem = nn.Sequential(
            nn.Conv2d(3, widths[0], 7, 2, 3, bias=False),
            nn.BatchNorm2d(widths[0]),
            nn.ReLU(),
            nn.MaxPool2d(3, 2, 1),
        )
        layers, cin = [], widths[0]
        for i, w in enumerate(widths):
            layers += [Block(cin, w, 1 if i == 0 else 2), Block(w, w, 1)]
            cin = w
        self.layers = nn.Sequential(*layers)
        self.head = nn.Linear(cin, classes)

    def forward(self, image: torch.Tensor) -> torch.Tensor:
        y = self.layers(self.stem(image))
        return self.head(torch.flatten(nn.functional.adaptive_avg_pool2d(y, 1), 1))


def get_model() -> nn.Module:
    torch.manual_seed(0)
    model = ResNet18Style()
    for m in model.modules():  # non-trivial BatchNorm statistics, so folding is exercised
        if isinstance(m, nn.BatchNorm2d):
            m.running_mean.uniform_(-0.1, 0.1)
            m.running_var.uniform_(0.5, 1.5)
    return model.eval()


def get_example_inputs() -> dict[str, torch.Tensor]:
    return {"image": torch.randn(1, 3, 224, 224, generator=torch.Generator().manual_seed(0))}
