"""A small ResNet-style CNN with random weights: the default model of ``make compile``.

Follows aotforge's model-file convention: ``get_model()``, ``get_example_inputs()`` and,
optionally, ``DYNAMIC_DIMS`` naming the dims ``--dynamic`` may bind.
"""

from __future__ import annotations

import torch
from torch import nn

DYNAMIC_DIMS = {"image": {0: "batch"}}
OUTPUT_NAMES = ["logits"]


class Block(nn.Module):
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


class MiniResNet(nn.Module):
    def __init__(self, widths: tuple[int, ...] = (16, 32, 64), classes: int = 10) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, widths[0], 3, 1, 1, bias=False), nn.BatchNorm2d(widths[0]), nn.ReLU())
        blocks, cin = [], widths[0]
        for i, w in enumerate(widths):
            blocks.append(Block(cin, w, 1 if i == 0 else 2))
            cin = w
        self.blocks = nn.Sequential(*blocks)
        self.head = nn.Linear(cin, classes)

    def forward(self, image: torch.Tensor) -> torch.Tensor:
        y = self.blocks(self.stem(image))
        return self.head(torch.flatten(nn.functional.adaptive_avg_pool2d(y, 1), 1))


def get_model() -> nn.Module:
    torch.manual_seed(0)
    model = MiniResNet()
    # Non-trivial BatchNorm statistics, so folding them into the convs is actually exercised.
    for m in model.modules():
        if isinstance(m, nn.BatchNorm2d):
            m.running_mean.uniform_(-0.1, 0.1)
            m.running_var.uniform_(0.5, 1.5)
    return model.eval()


def get_example_inputs() -> dict[str, torch.Tensor]:
    return {"image": torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(0))}
