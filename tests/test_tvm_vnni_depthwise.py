"""The VNNI depthwise kernel (``kernels.vnni_depthwise``) is exact against torch's convolution, in int32
and through its requantizing write-back, for channel counts whose runs of 64 bytes span pixels."""

from __future__ import annotations

import numpy as np
import pytest
import tvm

from aotforge.targets.tvm.kernels import requantize, vnni_depthwise
from tests.int8_graphs import host_target, needs_vnni


def _exact(padded: np.ndarray, weight: np.ndarray, za: int, stride: int) -> np.ndarray:
    """int64 NHWC depthwise convolution of the zero-point-centred padded input."""
    import torch

    centered = torch.tensor(padded.transpose(0, 3, 1, 2).astype(np.float64) - float(za))
    out = torch.nn.functional.conv2d(
        centered, torch.tensor(weight.astype(np.float64)), stride=stride, groups=weight.shape[0]
    )
    return out.numpy().transpose(0, 2, 3, 1).astype(np.int64)


def _run(c: int, size: int, k: int, stride: int, out_dtype: str) -> tuple[np.ndarray, np.ndarray]:
    """The kernel's output on a seeded input and what it must equal."""
    rng = np.random.default_rng(c + size + k + stride)
    pad = k // 2
    padded = rng.integers(0, 256, (2, size + 2 * pad, size + 2 * pad, c), dtype=np.uint8)
    weight = rng.integers(-128, 128, (c, 1, k, k), dtype=np.int8)
    za = int(rng.integers(0, 256))
    out_hw = ((size + 2 * pad - k) // stride + 1,) * 2
    assert vnni_depthwise.supports(c, stride, out_hw[1]) == ""
    lanes = vnni_depthwise.lane_channels(c, out_hw[1])
    colsum = weight.astype(np.int32).sum(axis=(1, 2, 3), dtype=np.int32)[lanes]
    arrays = [padded, vnni_depthwise.pack_weight(weight, out_hw[1]), np.array(za, np.uint8), colsum]
    exact = _exact(padded, weight, za, stride)
    expected = exact
    if out_dtype != "int32":
        shift = rng.uniform(-20, 20, c) + (0 if out_dtype == "int8" else 128)
        rows = requantize.table(rng.uniform(5e-3, 2e-2, c), shift, np.full(c, -100.0), np.full(c, 230.0), out_dtype)
        arrays.append(np.ascontiguousarray(rows[:, lanes]))
        expected = requantize.reference(exact, rows, out_dtype)
    func = vnni_depthwise.depthwise_u8s8(*padded.shape, k, k, (stride, stride), out_hw, out_dtype)
    lib = tvm.compile(tvm.IRModule({"main": func}), target=host_target())
    args = [tvm.runtime.tensor(v) for v in (*arrays, np.zeros((2, *out_hw, c), out_dtype))]
    lib["main"](*args)
    return args[-1].numpy(), expected


@needs_vnni
@pytest.mark.parametrize(
    ("c", "size", "k", "stride", "out_dtype"),
    [
        (16, 8, 3, 1, "int32"),  # 4 pixels per run
        (64, 7, 3, 2, "int32"),  # strided: one pixel's channels per run
        (96, 6, 3, 1, "uint8"),  # the channels repeat every 3 runs
        (48, 4, 5, 1, "int8"),  # 5x5, every 3 runs, signed output
        (128, 6, 3, 2, "uint8"),
    ],
)
def test_vnni_depthwise_is_exact(c: int, size: int, k: int, stride: int, out_dtype: str) -> None:
    got, expected = _run(c, size, k, stride, out_dtype)
    assert got.dtype == np.dtype(out_dtype)
    np.testing.assert_array_equal(got, expected)
    if out_dtype != "int32":
        assert len(np.unique(got)) > 20  # the bounds clip some values, not all


def test_shapes_the_kernel_cannot_take_say_why() -> None:
    assert vnni_depthwise.supports(32, 1, 24) == ""
    assert "multiple of 16" in vnni_depthwise.supports(24, 1, 8)
    assert "stride 2 with 32 channels" in vnni_depthwise.supports(32, 2, 24)
    assert "channel periods" in vnni_depthwise.supports(16, 1, 7)


def test_lane_channels_follow_the_weight_layout() -> None:
    """Position ``4i + k`` of phase ``p``'s run is lane ``i`` of accumulator ``k``: the packed weight
    holds that position's channel's tap there, and ``lane_channels`` names the same channel."""
    c = 48
    weight = np.arange(c, dtype=np.int8).reshape(c, 1, 1, 1)
    packed = vnni_depthwise.pack_weight(weight, 4)[0, 0]  # [phase, k, 64]
    lanes = vnni_depthwise.lane_channels(c, 4).reshape(-1, 4, 16)
    for phase in range(lanes.shape[0]):
        for k in range(4):
            np.testing.assert_array_equal(packed[phase, k, k::4], lanes[phase, k])
            assert not packed[phase, k].reshape(16, 4)[:, [q for q in range(4) if q != k]].any()


def test_kernels_keep_noalias_so_the_module_keeps_its_compute_functions() -> None:
    """One PrimFunc without ``tirx.noalias`` and TVM's LLVM codegen builds no noalias compute
    function for any kernel of the module (the MobileNet-style CNN's 1x1 convolutions: 2.3x slower).
    Compiled only, for a VNNI CPU, so it runs on any host."""
    from aotforge.targets.tvm.kernels import nhwc_stem, vnni_conv

    kernels = {
        "conv": vnni_conv.conv2d_u8s8(1, 8, 8, 64, 64, 1, 1, (1, 1), (8, 8), "uint8"),
        "depthwise": vnni_depthwise.depthwise_u8s8(1, 10, 10, 64, 3, 3, (1, 1), (8, 8), "uint8"),
        "stem": nhwc_stem.to_nhwc4((1, 3, 16, 16), (1, 1, 1, 1), quantize=True),
    }
    assert all(bool(func.attrs["tirx.noalias"]) for func in kernels.values())
    target = tvm.target.Target({"kind": "llvm", "mcpu": "cascadelake", "mtriple": "x86_64-linux-gnu"})
    mod = tvm.IRModule({name: f.with_attr("global_symbol", name) for name, f in kernels.items()})
    assert tvm.tirx.build(mod, target=target).inspect_source("ll").count("_compute_(") > 0
