"""The tvm integer kernels (VNNI dense and conv, int8 depthwise) are exact against integer references."""

from __future__ import annotations

import numpy as np
import pytest
import tvm

from aotforge.targets.tvm.kernels import vnni_dense
from tests.int8_graphs import host_target, needs_vnni


@needs_vnni
@pytest.mark.parametrize(("m", "k", "n"), [(8, 64, 48), (13, 20, 32), (1, 4, 16), (24, 128, 96)])
def test_vnni_dense_is_exact(m: int, k: int, n: int) -> None:
    rng = np.random.default_rng(m * k + n)
    a = rng.integers(0, 256, (m, k), dtype=np.uint8)
    w = rng.integers(-128, 128, (k, n), dtype=np.int8)
    za = np.array(rng.integers(0, 256), dtype=np.uint8)
    colsum = w.astype(np.int32).sum(axis=0, dtype=np.int32)
    lib = tvm.compile(tvm.IRModule({"main": vnni_dense.dense_u8s8(m, k, n)}), target=host_target())
    args = [tvm.runtime.tensor(x) for x in (a, vnni_dense.pack_weight(w), za, colsum, np.zeros((m, n), np.int32))]
    lib["main"](*args)
    expected = (a.astype(np.int64) - int(za)) @ w.astype(np.int64)
    np.testing.assert_array_equal(args[-1].numpy(), expected)


def test_shapes_the_kernel_cannot_take_say_why() -> None:
    assert vnni_dense.supports(128, 384, 1536) == ""
    assert "K=6" in vnni_dense.supports(4, 6, 16)
    assert "N=10" in vnni_dense.supports(4, 8, 10)


@needs_vnni
@pytest.mark.parametrize(("c", "o", "k", "stride", "pad"), [(32, 32, 3, 1, 1), (3, 16, 7, 2, 3), (16, 32, 1, 2, 0)])
def test_vnni_conv2d_is_exact(c: int, o: int, k: int, stride: int, pad: int) -> None:
    import torch

    from aotforge.targets.tvm.kernels import vnni_conv

    rng = np.random.default_rng(c + o + k)
    h = w = 10
    x = rng.integers(0, 256, (1, c, h, w), dtype=np.uint8)
    weight = rng.integers(-128, 128, (o, c, k, k), dtype=np.int8)
    za = np.uint8(rng.integers(0, 256))
    channels = -(-c // 4) * 4
    padded = np.full((1, h + 2 * pad, w + 2 * pad, channels), za, np.uint8)
    padded[:, pad : pad + h, pad : pad + w, :c] = x.transpose(0, 2, 3, 1)
    out_hw = ((h + 2 * pad - k) // stride + 1,) * 2
    func = vnni_conv.conv2d_u8s8(1, *padded.shape[1:3], channels, o, k, k, (stride, stride), out_hw)
    lib = tvm.compile(tvm.IRModule({"main": func}), target=host_target())
    colsum = weight.astype(np.int32).sum(axis=(1, 2, 3), dtype=np.int32)
    out = np.zeros((1, *out_hw, o), np.int32)
    args = [tvm.runtime.tensor(v) for v in (padded, vnni_conv.pack_weight(weight, channels), np.array(za), colsum, out)]
    lib["main"](*args)
    centered = torch.tensor(padded[..., :c].transpose(0, 3, 1, 2).astype(np.float64) - float(za))
    expected = torch.nn.functional.conv2d(centered, torch.tensor(weight.astype(np.float64)), stride=stride)
    np.testing.assert_array_equal(args[-1].numpy(), expected.numpy().transpose(0, 2, 3, 1).astype(np.int64))


@needs_vnni
@pytest.mark.parametrize(
    ("c", "size", "k", "stride", "pad"), [(16, 10, 3, 1, 1), (32, 9, 3, 2, 1), (48, 7, 5, 1, 2), (64, 8, 3, 2, 0)]
)
def test_int8_depthwise_is_exact(c: int, size: int, k: int, stride: int, pad: int) -> None:
    import torch

    from aotforge.targets.tvm.kernels import int8_depthwise

    rng = np.random.default_rng(c + size + k)
    x = rng.integers(0, 256, (1, size, size, c), dtype=np.uint8)
    weight = rng.integers(-128, 128, (c, 1, k, k), dtype=np.int8)
    za = np.uint8(rng.integers(0, 256))
    padded = np.pad(x, ((0, 0), (pad, pad), (pad, pad), (0, 0)), constant_values=za)
    out_hw = ((size + 2 * pad - k) // stride + 1,) * 2
    func = int8_depthwise.depthwise_u8s8(1, *padded.shape[1:3], c, k, k, (stride, stride), out_hw)
    lib = tvm.compile(tvm.IRModule({"main": func}), target=host_target())
    colsum = weight.astype(np.int32).sum(axis=(1, 2, 3), dtype=np.int32)
    packed = int8_depthwise.pack_weight(weight)
    args = [tvm.runtime.tensor(v) for v in (padded, packed, np.array(za), colsum, np.zeros((1, *out_hw, c), np.int32))]
    lib["main"](*args)
    centered = torch.tensor(padded.transpose(0, 3, 1, 2).astype(np.float64) - float(za))
    expected = torch.nn.functional.conv2d(centered, torch.tensor(weight.astype(np.float64)), stride=stride, groups=c)
    np.testing.assert_array_equal(args[-1].numpy(), expected.numpy().transpose(0, 2, 3, 1).astype(np.int64))


def test_vnni_and_depthwise_tiles_under_1_kib_use_no_workspace() -> None:
    """Accumulator tiles under 1 KiB are stack arrays and the activation word is no buffer: no
    TVMBackendAllocWorkspace / FreeWorkspace pair per tile (MobileNet-style int8: ~15% of a call).
    Compiled only, for a VNNI CPU, so it runs on any host."""
    from aotforge.targets.tvm.kernels import int8_depthwise, vnni_conv

    target = tvm.target.Target({"kind": "llvm", "mcpu": "cascadelake", "mtriple": "x86_64-linux-gnu"})
    kernels = {
        "conv 1x1, 6 x 32 tile": vnni_conv.conv2d_u8s8(1, 12, 12, 128, 256, 1, 1, (1, 1), (12, 12)),
        "dense 8 x 16": vnni_dense.dense_u8s8(8, 64, 16),
        "depthwise 3x3": int8_depthwise.depthwise_u8s8(1, 14, 14, 64, 3, 3, (1, 1), (12, 12)),
    }
    for name, func in kernels.items():
        ir = tvm.tirx.build(tvm.IRModule({"main": func.with_attr("global_symbol", "main")}), target=target)
        assert "load ptr, ptr @__TVMBackendAllocWorkspace" not in ir.inspect_source("ll"), name
