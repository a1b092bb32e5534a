"""tvm schedules on layers and models we did not tune for: depthwise / grouped convolutions, ReLU6,
ragged token counts, and whole user-style exports (a MobileNet-style CNN, dynamo-exported BERT / ViT)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import tvm
from tvm import relax

from aotforge.targets.tvm.pipeline import compile_relax
from tools import user_models

#: Kernels whose names say they do the model's arithmetic: none may be left a plain loop nest.
HEAVY = ("conv2d", "matmul", "dense", "softmax", "layer_norm", "gelu")


def _target() -> Any:
    import platform

    mcpu = "x86-64-v3" if platform.machine() in ("x86_64", "AMD64") else "generic"
    return tvm.target.Target({"kind": "llvm", "mcpu": mcpu, "num-cores": 2})


def _run_torch_on_tvm(model: torch.nn.Module, *inputs: torch.Tensor) -> tuple[np.ndarray, np.ndarray, dict]:
    """(tvm output, torch output, pipeline report) for ``model`` imported through torch.export."""
    from tvm.relax.frontend.torch import from_exported_program

    with torch.no_grad():
        expected = model(*inputs)
    mod = from_exported_program(torch.export.export(model, inputs), keep_params_as_input=False)
    executable, report = compile_relax(mod, _target(), fast_math=True)
    result = relax.VirtualMachine(executable, tvm.cpu())["main"](*(tvm.runtime.tensor(t.numpy()) for t in inputs))
    got = (result if hasattr(result, "numpy") else result[0]).numpy()
    return got, expected.numpy(), report


def _rel_l2(got: np.ndarray, expected: np.ndarray) -> float:
    return float(np.linalg.norm(got - expected) / np.linalg.norm(expected))


class _Conv(torch.nn.Module):
    """The convolution under test + ReLU6, then a 1x1 convolution + ReLU6 (MobileNet's pattern)."""

    def __init__(self, cin: int, cout: int, kernel: int, stride: int, groups: int) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(cin, cout, kernel, stride, kernel // 2, groups=groups)
        self.pointwise = torch.nn.Conv2d(cout, 16, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.nn.functional.relu6(self.conv(x) * 4.0)
        return torch.nn.functional.relu6(self.pointwise(y) * 4.0)


@pytest.mark.parametrize(
    ("cin", "cout", "kernel", "stride", "groups", "size"),
    [
        (32, 32, 3, 1, 32, 14),  # depthwise
        (32, 32, 3, 2, 32, 15),  # depthwise, stride 2, odd size
        (16, 32, 3, 1, 16, 12),  # depthwise with a channel multiplier of 2
        (64, 64, 5, 2, 64, 9),  # depthwise 5x5, stride 2
        (32, 64, 3, 1, 4, 10),  # grouped (ResNeXt-style)
        (24, 48, 1, 1, 3, 8),  # grouped 1x1 (ShuffleNet-style)
    ],
)
def test_depthwise_and_grouped_convs_are_scheduled_and_exact(
    cin: int, cout: int, kernel: int, stride: int, groups: int, size: int
) -> None:
    torch.manual_seed(0)
    model, x = _Conv(cin, cout, kernel, stride, groups).eval(), torch.randn(1, cin, size, size)
    got, expected, report = _run_torch_on_tvm(model, x)
    assert got.shape == expected.shape
    assert _rel_l2(got, expected) < 1e-5
    schedules = report["schedules"]
    assert report["conv_layout"] == "NHWC"
    assert schedules["unscheduled_funcs"] == []
    # Each ReLU6 rides in its convolution's kernel (no NCHW transposes around it): the two
    # convolutions and the input / output layout changes are all the kernels there are.
    assert schedules["scheduled_by_rule"]["TiledMatmul"] == 2
    assert sum(schedules["scheduled_by_rule"].values()) == 4, schedules
    assert schedules["clip"]["rewritten"] == {"relax.clip": 2}


def test_hardtanh_bounds_keep_numerics() -> None:
    """relax.clip with non-ReLU6 bounds becomes maximum / minimum with the same bounds."""
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 16, 3, padding=1), torch.nn.Hardtanh(-0.5, 0.25)).eval()
    torch.manual_seed(0)
    got, expected, report = _run_torch_on_tvm(model, torch.randn(1, 3, 8, 8))
    np.testing.assert_allclose(got, expected, atol=1e-6)
    assert got.min() >= -0.5 and got.max() <= 0.25
    assert report["schedules"]["scheduled_by_rule"]["TiledMatmul"] == 1


def _build_export(name: str, tmp_path: Path, dims: list[str]) -> Any:
    """``aotforge.build`` of the user-style ONNX export of ``name`` for tvm (validated against ORT)."""
    from aotforge.compiler.api import build

    path = user_models.export_onnx(name, tmp_path / f"{name}.onnx")
    ranges = {"input_ids": (0, 1000)} if name == "tiny_bert" else {}
    return build(str(path), target="tvm", out=tmp_path / "out", bench=False, dynamic=dims, input_ranges=ranges)


@pytest.mark.slow  # 20-40 s each: an export, ORT validation and a whole tvm build
@pytest.mark.parametrize(
    ("name", "dims", "rules"),
    [
        ("mobilenet", ["batch=1:1:1"], {"TiledMatmul": 15}),
        ("tiny_bert", ["batch=1:1:1", "seq=1:24:24"], {"TiledMatmul": 4, "RowReduction": 2}),
        ("vit", ["batch=1:1:1"], {"TiledMatmul": 5, "RowReduction": 2}),
    ],
)
def test_user_exports_build_on_tvm_with_every_heavy_kernel_scheduled(
    name: str, dims: list[str], rules: dict[str, int], tmp_path: Path
) -> None:
    """torch.onnx.export(dynamo=True) exports with dynamic axes: the HF attention / GELU patterns,
    ReLU6 and depthwise convolutions all reach a schedule rule."""
    result = _build_export(name, tmp_path, dims)
    pipeline = result.manifest.target.info["pipeline"]
    schedules = pipeline["schedules"]
    heavy_left = [f for f in schedules["unscheduled_funcs"] if any(h in f for h in HEAVY)]
    assert heavy_left == [], schedules
    for rule, least in rules.items():
        assert schedules["scheduled_by_rule"][rule] >= least, schedules
    if name == "mobilenet":
        assert pipeline["conv_layout"] == "NHWC"
        # Every ReLU6 fused into its convolution: the convolutions, the head, the pooling and
        # the input layout change are all the kernels there are.
        assert sum(schedules["scheduled_by_rule"].values()) <= 18, schedules
